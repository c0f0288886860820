//! Command-line entry point. Each command lives with the layer it drives.
//!
//! The shipped build (`--no-default-features`) has what runs in Azure and what deploys it:
//! `handler`, `stage` and `package`; and the user's tools `run` (a scan in this process, no
//! deployment) and `scan` (a client of a deployed app).
//! The `lab` feature (on by default) adds the development commands: `list`, `host`, `demo`,
//! `bench` and `simulate`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `--version`: says whether the development tools are built in.
const VERSION: &str = if crate::deploy::stage::LAB_BUILD {
    concat!(env!("CARGO_PKG_VERSION"), " (lab: with development tools)")
} else {
    env!("CARGO_PKG_VERSION")
};

/// tablescan: parallel scans of Azure Table Storage on Azure Functions.
#[derive(Debug, Parser)]
#[command(name = "tablescan", version = VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the custom handler (what the Functions host starts; reads app settings from the environment).
    Handler,
    /// Assemble a runnable function app folder: host.json, one folder per function, the handler.
    Stage(crate::deploy::stage::StageArgs),
    /// Write the deployable zip: the staged app without local settings, the handler executable.
    Package(crate::deploy::package::PackageArgs),
    /// Run a scan in this process, no deployment: the app's engine on the account of
    /// AzureWebJobsStorage (or --connection). Resumable (--resume). docs/cli.md.
    Run(Box<crate::run::RunArgs>),
    /// Drive a deployed app's scans: start, status, watch, cancel, list. docs/cli.md.
    Scan(Box<crate::run::client::ScanArgs>),
    // The development commands (`list`, `host`, `demo`, `bench`, `simulate`), only with `lab`.
    #[cfg(feature = "lab")]
    #[command(flatten)]
    Lab(Box<crate::lab::cli::LabCommand>),
}

/// The app setting that gives the handler more than one worker thread.
pub const HANDLER_THREADS_SETTING: &str = "TABLESCAN_HANDLER_THREADS";

/// The handler's worker threads from `TABLESCAN_HANDLER_THREADS` (unset: 1).
fn handler_threads(value: Option<&str>) -> Result<usize, String> {
    match value.map(str::trim) {
        None => Ok(1),
        Some(v) => match v.parse::<usize>() {
            Ok(n @ 1..=64) => Ok(n),
            _ => Err(format!(
                "{HANDLER_THREADS_SETTING} must be a whole number from 1 to 64, not {v:?}"
            )),
        },
    }
}

/// The handler's runtime: one thread unless `TABLESCAN_HANDLER_THREADS` asks for more. The
/// handler waits on storage almost all the time, and an instance of the plans it runs on has one
/// core (Consumption, Flex at 2,048 MB) that it shares with the Functions host. On one thread it
/// spent 10–20 % less CPU per storage request than on tokio's work-stealing pool of two, at the
/// same speed (`tablescan bench`, docs/bench.md "One thread for the handler").
fn handler_runtime() -> Result<tokio::runtime::Runtime, String> {
    let value = std::env::var(HANDLER_THREADS_SETTING).ok();
    let mut builder = match handler_threads(value.as_deref())? {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    builder.enable_all().build().map_err(|e| e.to_string())
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        // Their own exit codes: 0 completed, 1 failed, 2 invalid, 130 interrupted.
        Command::Run(args) => return crate::run::run(*args),
        Command::Scan(args) => return crate::run::client::run(*args),
        Command::Handler => match handler_runtime() {
            Ok(runtime) => runtime.block_on(crate::app::handler::serve_from_env()),
            Err(e) => Err(e),
        },
        Command::Stage(args) => crate::deploy::stage::run_stage(args)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Command::Package(args) => crate::deploy::package::run_package(args)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        #[cfg(feature = "lab")]
        Command::Lab(command) => command.run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_threads_default_to_one_and_refuse_nonsense() {
        assert_eq!(handler_threads(None), Ok(1));
        assert_eq!(handler_threads(Some(" 4 ")), Ok(4));
        for bad in ["0", "65", "two", "-1", ""] {
            let e = handler_threads(Some(bad)).unwrap_err();
            assert!(e.contains("TABLESCAN_HANDLER_THREADS"), "{e}");
        }
    }
}
