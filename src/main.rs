use std::process::ExitCode;

use clap::Parser;
use outbox_lab::cli::{self, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut builder = if cli.wants_single_thread() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("outbox-lab: error: cannot start the async runtime: {e}");
            return ExitCode::from(cli::exit::USAGE);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("outbox-lab: error: {}", cli::one_line(&error));
            ExitCode::from(cli::exit_status(&error))
        }
    }
}
