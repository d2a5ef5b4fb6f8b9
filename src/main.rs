use std::process::ExitCode;

use clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
use clap::Parser;
use outbox_lab::cmd::{self, Cli};
use outbox_lab::error::{self, exit};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version (stdout, status 0), and the help shown for a bare `outbox-lab`.
        Err(e) if !e.use_stderr() || e.kind() == DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            outbox_lab::errln!("outbox-lab: error: {}", error::clap_one_line(&e));
            return ExitCode::from(exit::USAGE);
        }
    };
    let mut builder = if cli.wants_single_thread() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            outbox_lab::errln!("outbox-lab: error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    match runtime.block_on(cmd::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            let status = error::exit_status(&error);
            // A reader that stopped early (`| head`) is no failure: nothing to say.
            if status != exit::OK {
                outbox_lab::errln!("outbox-lab: error: {}", error::one_line(&error));
            }
            ExitCode::from(status)
        }
    }
}
