//! The `tablescan` command: the custom handler itself plus developer commands.

use std::process::ExitCode;

fn main() -> ExitCode {
    tablescan::cli::main()
}
