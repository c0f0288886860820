//! Command-line entry point. Each command lives with the layer it drives.
//!
//! The shipped build (`--no-default-features`) has what runs in Azure and what deploys it:
//! `handler`, `stage` and `package`.
//! The `lab` feature (on by default) adds the development commands: `list`, `host`, `demo`,
//! `bench` and `simulate`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `--version`: says whether the development tools are built in.
const VERSION: &str = if crate::app::stage::LAB_BUILD {
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
    Stage(crate::app::stage::StageArgs),
    /// Write the deployable zip: the staged app without local settings, the handler executable.
    Package(crate::app::package::PackageArgs),
    /// Scan a table in-process, depth-first, and print its rows in (PartitionKey, RowKey) order.
    #[cfg(feature = "lab")]
    List(list::ListArgs),
    /// Run a staged function app locally without Core Tools (a development and test stand-in for
    /// the Azure Functions host).
    #[cfg(feature = "lab")]
    Host(crate::host::HostArgs),
    /// The main job end to end on a local default: seed, copy with a prefix scan through the local
    /// host, show progress, verify, compare with a serial scan.
    #[cfg(feature = "lab")]
    Demo(crate::demo::DemoArgs),
    /// Measure speed and storage cost of every scan variant through the local host (not a test).
    #[cfg(feature = "lab")]
    Bench(crate::bench::BenchArgs),
    /// Simulate a scan of millions of rows on the Consumption and Flex Consumption plans in virtual time (figures are simulated).
    #[cfg(feature = "lab")]
    Simulate(crate::simulate::SimulateArgs),
}

#[cfg(feature = "lab")]
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
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
        Command::Handler => match handler_runtime() {
            Ok(runtime) => runtime.block_on(crate::app::handler::serve_from_env()),
            Err(e) => Err(e),
        },
        Command::Stage(args) => crate::app::stage::run_stage(args)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Command::Package(args) => crate::app::package::run_package(args)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        #[cfg(feature = "lab")]
        Command::List(args) => runtime().block_on(list::run_list(args)),
        #[cfg(feature = "lab")]
        Command::Host(args) => runtime()
            .block_on(crate::host::run_host(args))
            .map_err(|e| e.to_string()),
        #[cfg(feature = "lab")]
        Command::Demo(args) => runtime().block_on(crate::demo::run_demo(args)),
        #[cfg(feature = "lab")]
        Command::Bench(args) => runtime().block_on(crate::bench::run_bench(args)),
        #[cfg(feature = "lab")]
        Command::Simulate(args) => crate::simulate::run_simulate(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "lab")]
pub use list::connection_string;

/// `tablescan list`: a developer command (the handler never lists a table serially).
#[cfg(feature = "lab")]
mod list {
    use std::io::Write;
    use std::sync::Arc;
    use std::time::Instant;

    use clap::{Args, ValueEnum};

    use crate::scan::{list, ScanError, ScanParameters, Strategy};
    use crate::storage::connection::StorageAccount;
    use crate::storage::counters::RequestCounters;

    #[derive(Debug, Clone, Copy, ValueEnum)]
    enum Format {
        /// `PartitionKey<TAB>RowKey` per line.
        Tsv,
        /// One JSON object per line with every typed property (`Name@odata.type` annotations).
        Jsonl,
    }

    #[derive(Debug, Clone, Copy, ValueEnum)]
    enum StrategyArg {
        Prefix,
        Serial,
    }

    #[derive(Debug, Args)]
    pub struct ListArgs {
        /// Table to scan.
        #[arg(long)]
        table: String,
        /// Only partition keys starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Exclusive lower partition-key bound.
        #[arg(long)]
        lower: Option<String>,
        /// Exclusive upper partition-key bound.
        #[arg(long)]
        upper: Option<String>,
        /// Page size, 1..=1000.
        #[arg(long, default_value_t = 1000)]
        take: u32,
        /// Columns to read besides PartitionKey and RowKey (comma-separated).
        #[arg(long, value_delimiter = ',')]
        select: Option<Vec<String>>,
        /// Read the rest of a discovered partition inline instead of as its own step.
        #[arg(long)]
        no_expand: bool,
        #[arg(long, value_enum, default_value = "prefix")]
        strategy: StrategyArg,
        #[arg(long, value_enum, default_value = "tsv")]
        format: Format,
        /// Storage connection string; default: $AzureWebJobsStorage, else UseDevelopmentStorage=true.
        #[arg(long, env = "TABLESCAN_CONNECTION_STRING", hide_env_values = true)]
        connection_string: Option<String>,
    }

    /// The connection string for developer commands: flag, else `AzureWebJobsStorage`, else Azurite.
    pub fn connection_string(flag: Option<String>) -> String {
        flag.or_else(|| std::env::var("AzureWebJobsStorage").ok())
            .unwrap_or_else(|| "UseDevelopmentStorage=true".to_string())
    }

    pub async fn run_list(args: ListArgs) -> Result<(), String> {
        let params = ScanParameters {
            prefix: args.prefix,
            lower: args.lower,
            upper: args.upper,
            take: args.take,
            select: args.select,
            expand_partition_keys: !args.no_expand,
            ..ScanParameters::default()
        };
        params
            .validate()
            .map_err(|e| flag_error(e.field, &e.message))?;
        let strategy = match args.strategy {
            StrategyArg::Prefix => Strategy::Prefix,
            StrategyArg::Serial => Strategy::Serial,
        };
        let account = StorageAccount::parse(&connection_string(args.connection_string))
            .map_err(|e| e.to_string())?;
        let counters = Arc::new(RequestCounters::new());
        let store = account.table_store(counters.clone());
        let started = Instant::now();
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let mut rows = 0u64;
        let format = args.format;
        let result = list(&store, &args.table, &params, strategy, |segment| {
            for entity in segment {
                rows += 1;
                let line = match format {
                    Format::Tsv => format!("{}\t{}", entity.partition_key, entity.row_key),
                    Format::Jsonl => serde_json::to_string(&entity.wire()).unwrap_or_default(),
                };
                writeln!(out, "{line}")
                    .map_err(|e| ScanError::InvalidStep(format!("cannot write output: {e}")))?;
            }
            Ok(())
        })
        .await;
        out.flush().map_err(|e| e.to_string())?;
        match result {
            Err(ScanError::Storage(e)) if e.is_not_found() => {
                Err(format!("table {} does not exist ({e})", args.table))
            }
            Err(e) => Err(e.to_string()),
            Ok(queries) => {
                eprintln!(
                    "{rows} rows, {queries} queries, {:.2} s ({} account)",
                    started.elapsed().as_secs_f64(),
                    account.account_name()
                );
                Ok(())
            }
        }
    }

    /// The `list` flag that sets a scan parameter `ScanParameters::validate` names; `None` for
    /// parameters `list` has no flag for (they keep their defaults, which validate).
    fn cli_flag(field: &str) -> Option<&'static str> {
        Some(match field {
            "takeCount" => "take",
            "partitionKeyPrefix" => "prefix",
            "partitionKeyLowerBound" => "lower",
            "partitionKeyUpperBound" => "upper",
            "select" => "select",
            _ => return None,
        })
    }

    /// A parameter error as the `list` command says it: naming its flag when it has one.
    fn flag_error(field: &str, message: &str) -> String {
        match cli_flag(field) {
            Some(flag) => format!("--{flag}: {message}"),
            None => format!("{field} (no flag; its default is used): {message}"),
        }
    }

    #[cfg(test)]
    mod tests {
        use clap::{Args, Command};

        use super::{cli_flag, ListArgs};

        /// Every scan parameter `ScanParameters::validate` can name maps to a flag `list`
        /// really has (or to none, for those it has no flag for).
        #[test]
        fn parameter_errors_name_flags_that_exist() {
            let command = ListArgs::augment_args(Command::new("list"));
            let flags: Vec<&str> = command
                .get_arguments()
                .filter_map(|a| a.get_long())
                .collect();
            for field in [
                "takeCount",
                "partitionKeyPrefix",
                "partitionKeyLowerBound",
                "partitionKeyUpperBound",
                "select",
            ] {
                let flag = cli_flag(field).unwrap_or_else(|| panic!("{field} has a flag"));
                assert!(
                    flags.contains(&flag),
                    "--{flag} ({field}) is not a flag of list: {flags:?}"
                );
            }
            for field in [
                "segmentsPerFirstPrefix",
                "segmentsPerSubsequentPrefix",
                "nonsense",
            ] {
                assert_eq!(cli_flag(field), None, "{field}");
            }
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
