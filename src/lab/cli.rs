//! The lab's commands, flattened into `tablescan`'s own (see `crate::cli`): `list`, `host`,
//! `demo`, `bench` and `simulate`. Each runs on a multi-threaded runtime of its own.

use clap::Subcommand;

/// The development commands (only in a `lab` build).
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Scan a table in-process, depth-first, and print its rows in (PartitionKey, RowKey) order.
    List(list::ListArgs),
    /// Run a staged function app locally without Core Tools (a development and test stand-in for
    /// the Azure Functions host).
    Host(super::host::HostArgs),
    /// The main job end to end on a local default: seed, copy with a prefix scan through the local
    /// host, show progress, verify, compare with a serial scan.
    Demo(super::demo::DemoArgs),
    /// Measure speed and storage cost of every scan variant through the local host (not a test).
    Bench(super::bench::BenchArgs),
    /// Simulate a scan of millions of rows on the Consumption and Flex Consumption plans in virtual time (figures are simulated).
    Simulate(super::simulate::SimulateArgs),
}

impl LabCommand {
    /// Runs the command; `Err` is the message `tablescan` prints.
    pub fn run(self) -> Result<(), String> {
        match self {
            LabCommand::List(args) => runtime().block_on(list::run_list(args)),
            LabCommand::Host(args) => runtime()
                .block_on(super::host::run_host(args))
                .map_err(|e| e.to_string()),
            LabCommand::Demo(args) => runtime().block_on(super::demo::run_demo(args)),
            LabCommand::Bench(args) => runtime().block_on(super::bench::run_bench(args)),
            LabCommand::Simulate(args) => super::simulate::run_simulate(args),
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// `tablescan list`: a developer command (the handler never lists a table serially).
mod list {
    use std::io::Write;
    use std::sync::Arc;
    use std::time::Instant;

    use clap::{Args, ValueEnum};

    use crate::scan::{list, ScanError, ScanParameters, Strategy};
    use crate::storage::connection::StorageAccount;
    use crate::storage::request_counts::RequestCounters;

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
    fn connection_string(flag: Option<String>) -> String {
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
