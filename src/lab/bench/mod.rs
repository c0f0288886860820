//! `tablescan bench`: measured cost and speed of scans on this machine, side by side.
//!
//! The source table is seeded once with the demo's generator and reused by every variant. Each
//! variant runs through a fresh local Functions host whose storage traffic (handler AND host, so
//! queue polling is counted too) goes through a counting [`StorageProxy`] in front of Azurite.
//! Requests are split by kind and by the table or queue they address, so bookkeeping (the scans
//! and work tables) is told apart from data reads and writes. Progress is read directly from
//! storage, not through the proxy, so watching a scan costs it nothing.
//!
//! Modules: [`variant`] (what is compared), [`run`] (orchestration), [`sampler`] (/proc
//! sampling of the handlers), [`requests`] (request accounting), [`report`] (text tables, goals
//! and the chart, drawn by `crate::lab::chart`), [`lookups`] (lookups on the index `prefix-index`
//! built, beside filtered full scans).

mod floor;
mod lookups;
mod passes;
mod queue_check;
mod report;
mod requests;
mod run;
mod sampler;
mod upstream;
mod variant;

use std::path::PathBuf;

use clap::Args;

pub use self::floor::Floor;
pub use self::report::{render_svg, render_table, BenchReport, VariantResult};
pub use self::requests::{Minimum, Requests};
pub use self::run::measure;
pub use self::variant::Variant;

/// Printed with every result: wall times on Azurite are not Azure's.
pub const AZURITE_NOTE: &str = "Note: Azurite evaluates every $filter by scanning the whole table, so on Azurite \
prefix queries (many small filtered queries) are far slower than on Azure, where a PartitionKey range \
query reads only that range. Wall times here are honest but pessimistic for prefix variants; request \
counts, CPU and memory do not depend on this.";

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Rows in the source table.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// Seed of the dataset generator (same seed, same table).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Mean rows per partition key of the generator's skewed distribution.
    #[arg(long, default_value_t = 3.0)]
    pub rows_per_key: f64,
    /// Local host instances (handler processes) consuming the queues.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// Write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write an SVG chart of rows copied (or counted) over time to this file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Variants to run (comma-separated) [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub variants: Vec<Variant>,
    /// Give up on a variant that runs longer than this.
    #[arg(long, default_value_t = 3600)]
    pub timeout_seconds: u64,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// The handler binary to stage [default: this executable]; tests point it at the built binary.
    #[arg(skip)]
    pub handler_binary: Option<PathBuf>,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            rows: 100_000,
            seed: 1,
            rows_per_key: 3.0,
            instances: 1,
            out: None,
            svg: None,
            variants: Vec::new(),
            timeout_seconds: 3600,
            quiet: false,
            handler_binary: None,
        }
    }
}

/// Runs the benchmark, prints the table, and writes `--out` and `--svg` when given.
pub async fn run_bench(args: BenchArgs) -> Result<(), String> {
    let report = measure(&args).await?;
    println!("{}", render_table(&report));
    println!("{AZURITE_NOTE}");
    if let Some(path) = &args.out {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, render_svg(&report))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
