//! Command-line entry point. Each command lives with the layer it drives.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// tablescan: parallel scans of Azure Table Storage on Azure Functions.
#[derive(Debug, Parser)]
#[command(name = "tablescan", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {}
}
