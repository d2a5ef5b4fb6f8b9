use std::process::ExitCode;

use clap::Parser;
use outbox_lab::cmd::{self, Cli};

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
            return ExitCode::from(cmd::exit::USAGE);
        }
    };
    match runtime.block_on(cmd::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("outbox-lab: error: {}", cmd::one_line(&error));
            ExitCode::from(cmd::exit_status(&error))
        }
    }
}
