//! `tablescan demo`: the main job end to end on a local default — storage (Azurite unless
//! `AzureWebJobsStorage` is set), a realistic source table, the staged function app under the
//! local Functions host, a prefix-scan copy started over HTTP exactly as a user would, live
//! progress, verification, and the same for a serial scan, side by side; then a backup of the
//! source to Blob Storage and its restore into a new table, verified the same way ([`backup`]).

mod backup;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use futures::stream::{self, StreamExt, TryStreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::app::functions::table_copy::batches;
use crate::lab::azurite::Azurite;
use crate::lab::dataset::{self, RowsPerKey};
use crate::lab::host::{Host, HostConfig, RunningHost};
use crate::scan::{list, ScanParameters, Strategy};
use crate::storage::azure_table::AzureTableStore;
use crate::storage::connection::StorageAccount;
use crate::storage::request_counts::RequestCounters;
use crate::storage::{StorageError, TableStore};

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Rows in the source table.
    #[arg(long, default_value_t = 50_000)]
    pub rows: u64,
    /// Seed of the dataset generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Average rows per partition key.
    #[arg(long, default_value_t = 3.0)]
    pub rows_per_key: f64,
    /// Local host instances (handler processes) consuming the queues.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// Skip the serial comparison run.
    #[arg(long)]
    pub no_serial: bool,
    /// Skip the backup (export to Blob Storage) and restore (import into a new table).
    #[arg(long)]
    pub no_backup: bool,
    /// Port of the local Functions host (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// Storage for a run: the user's account, or a private Azurite stopped on drop.
pub struct Storage {
    pub connection_string: String,
    pub account: StorageAccount,
    azurite: Option<Azurite>,
}

impl Storage {
    /// The Azurite this run started, if it did not use `AzureWebJobsStorage`.
    pub fn azurite(&self) -> Option<&Azurite> {
        self.azurite.as_ref()
    }

    pub async fn open() -> Result<Storage, String> {
        match std::env::var("AzureWebJobsStorage")
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            Some(cs) => {
                let account =
                    StorageAccount::parse(&cs).map_err(|e| format!("AzureWebJobsStorage: {e}"))?;
                eprintln!(
                    "storage: account {} from AzureWebJobsStorage",
                    account.account_name()
                );
                Ok(Storage {
                    connection_string: cs,
                    account,
                    azurite: None,
                })
            }
            None => {
                eprintln!("storage: starting Azurite (installing it from npm on first use)...");
                let azurite = Azurite::start()
                    .await
                    .map_err(|e| format!("cannot start Azurite: {e}"))?;
                let cs = azurite.connection_string();
                let account = StorageAccount::parse(&cs).map_err(|e| e.to_string())?;
                eprintln!(
                    "storage: Azurite tables {} queues {} blobs {}",
                    azurite.table_endpoint(),
                    azurite.queue_endpoint(),
                    azurite.blob_endpoint()
                );
                Ok(Storage {
                    connection_string: cs,
                    account,
                    azurite: Some(azurite),
                })
            }
        }
    }
}

/// Writes the dataset into `table` (created if needed) with concurrent same-partition batches.
pub async fn seed(
    store: &AzureTableStore,
    table: &str,
    rows: u64,
    seed: u64,
    per_key: RowsPerKey,
) -> Result<(), StorageError> {
    store.create_table(table).await?;
    let groups: Vec<_> = dataset::entities(rows, seed, per_key)
        .flat_map(batches)
        .collect();
    stream::iter(groups)
        .map(|(pk, ops)| async move { store.submit_batch(table, &pk, &ops).await })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Row count and a checksum of every row's keys and typed properties, in key order.
pub async fn fingerprint(store: &AzureTableStore, table: &str) -> Result<(u64, String), String> {
    let print = table_fingerprint(store, table).await?;
    Ok((print.rows, print.checksum))
}

/// What the demo verifies a table by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub rows: u64,
    /// The first 8 bytes, in hex, of the SHA-256 of every row's JSON (keys and typed
    /// properties) and a line feed, in key order.
    pub checksum: String,
    /// The size of those JSON lines: about the table's size as an export holds it uncompressed.
    pub json_bytes: u64,
}

/// [`fingerprint`], with the rows' size as JSON text.
pub async fn table_fingerprint(
    store: &AzureTableStore,
    table: &str,
) -> Result<Fingerprint, String> {
    let mut hasher = Sha256::new();
    let mut rows = 0u64;
    let mut json_bytes = 0u64;
    list(
        store,
        table,
        &ScanParameters::default(),
        Strategy::Serial,
        |segment| {
            for entity in segment {
                rows += 1;
                let line = serde_json::to_string(&entity.wire()).unwrap_or_default();
                json_bytes += line.len() as u64 + 1;
                hasher.update(line.as_bytes());
                hasher.update(b"\n");
            }
            Ok(())
        },
    )
    .await
    .map_err(|e| format!("reading {table}: {e}"))?;
    let digest = hasher.finalize();
    Ok(Fingerprint {
        rows,
        checksum: digest.iter().take(8).map(|b| format!("{b:02x}")).collect(),
        json_bytes,
    })
}

/// The result of one scan through the local host.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub label: String,
    pub status: Value,
    pub wall: Duration,
}

/// Starts a scan with an HTTP POST, as a user would with curl, and shows progress until it ends.
pub async fn run_scan(
    client: &reqwest::Client,
    base: &str,
    label: &str,
    body: Value,
    total_rows: u64,
    quiet: bool,
) -> Result<RunSummary, String> {
    let started = Instant::now();
    let location = post_scan(client, base, &body).await?;
    let fetch = |location: String| async move {
        client
            .get(format!("{base}{location}"))
            .send()
            .await
            .map_err(|e| format!("GET {location}: {e}"))?
            .json::<Value>()
            .await
            .map_err(|e| format!("GET {location}: {e}"))
    };
    let last = watch_scan(
        label,
        total_rows,
        quiet,
        Duration::from_millis(500),
        started,
        || fetch(location.clone()),
        |_, _| {},
    )
    .await?;
    Ok(RunSummary {
        label: label.to_string(),
        status: last,
        wall: started.elapsed(),
    })
}

/// `POST /api/scans`; returns the scan's `Location` (`/api/scans/{id}`).
pub async fn post_scan(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
) -> Result<String, String> {
    let response = client
        .post(format!("{base}/api/scans"))
        .json(body)
        .send()
        .await
        .map_err(|e| format!("POST /api/scans: {e}"))?;
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let reply: Value = response
        .json()
        .await
        .map_err(|e| format!("POST /api/scans reply: {e}"))?;
    if status.as_u16() != 202 {
        return Err(format!("POST /api/scans answered {status}: {reply}"));
    }
    location.ok_or_else(|| "POST /api/scans answered without a Location header".to_string())
}

/// Polls a scan's status every `interval` with `fetch` until it leaves `running`; `observe` sees
/// every status with the time since `started`. Returns the final status of a completed scan.
pub async fn watch_scan<F, Fut>(
    label: &str,
    total_rows: u64,
    quiet: bool,
    interval: Duration,
    started: Instant,
    mut fetch: F,
    mut observe: impl FnMut(Duration, &Value),
) -> Result<Value, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Value, String>>,
{
    let last = loop {
        tokio::time::sleep(interval).await;
        let last = fetch().await?;
        observe(started.elapsed(), &last);
        if !quiet {
            draw_progress(label, &last, total_rows, started.elapsed());
        }
        match last["state"].as_str() {
            Some("running") => {}
            Some("completed") => break last,
            other => {
                if !quiet {
                    eprintln!();
                }
                return Err(format!(
                    "{label} scan ended {:?}: {}",
                    other.unwrap_or("?"),
                    last["error"]
                ));
            }
        }
    };
    if !quiet {
        eprintln!();
    }
    Ok(last)
}

fn draw_progress(label: &str, status: &Value, total: u64, elapsed: Duration) {
    let done = status["rowsWritten"].as_i64().unwrap_or(0) as u64;
    let fraction = if total == 0 {
        1.0
    } else {
        (done as f64 / total as f64).min(1.0)
    };
    let width = 30;
    let filled = (fraction * width as f64).round() as usize;
    let rate = done as f64 / elapsed.as_secs_f64().max(0.001);
    eprint!(
        "\r{label:>7} [{}{}] {:>5.1}% {done}/{total} rows, {rate:>7.0} rows/s, {} pending, {:>5.1} s   ",
        "#".repeat(filled),
        "-".repeat(width - filled),
        fraction * 100.0,
        status["pendingWorkItems"],
        elapsed.as_secs_f64()
    );
}

/// Stages the function app into a temporary folder and starts the local host on it.
pub async fn start_app(
    storage: &Storage,
    instances: usize,
    port: u16,
    settings: &[(&str, String)],
) -> Result<(tempfile::TempDir, RunningHost), String> {
    let binary = std::env::current_exe().map_err(|e| e.to_string())?;
    start_app_with(
        &binary,
        &storage.connection_string,
        instances,
        port,
        settings,
    )
    .await
}

/// [`start_app`] with an explicit handler binary (tests run from a test executable) and the
/// connection string the app gets as `AzureWebJobsStorage` (e.g. a counting proxy's).
pub async fn start_app_with(
    binary: &std::path::Path,
    connection_string: &str,
    instances: usize,
    port: u16,
    settings: &[(&str, String)],
) -> Result<(tempfile::TempDir, RunningHost), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    crate::deploy::stage::stage(dir.path(), binary).map_err(|e| e.to_string())?;
    let mut config = HostConfig::new(dir.path());
    config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    config.instances = instances;
    config
        .settings
        .insert("AzureWebJobsStorage".into(), connection_string.to_string());
    for (k, v) in settings {
        config.settings.insert(k.to_string(), v.clone());
    }
    let host = Host::start(config, |connection| {
        Ok(StorageAccount::new(connection.clone()).queue_store(Arc::new(RequestCounters::new())))
    })
    .await
    .map_err(|e| format!("cannot start the local Functions host: {e}"))?;
    host.wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| format!("the handler did not become ready: {e}"))?;
    Ok((dir, host))
}

/// What the demo's steps share once the app runs.
struct Session<'a> {
    client: reqwest::Client,
    /// The local host's base URL, `http://127.0.0.1:port`.
    base: String,
    account: &'a StorageAccount,
    store: &'a AzureTableStore,
    /// Makes this run's table names unique.
    suffix: String,
    source: String,
    source_print: Fingerprint,
}

/// Prints the request as the curl command a user would type.
fn announce(base: &str, body: &Value) {
    eprintln!("\n$ curl -X POST {base}/api/scans -H 'Content-Type: application/json' -d '{body}'");
}

/// What the demo ran through the app.
struct Outcome {
    copies: Vec<RunSummary>,
    /// `Err`: why there was no backup.
    backup: Result<backup::Backup, String>,
}

pub async fn run_demo(args: DemoArgs) -> Result<(), String> {
    let storage = Storage::open().await?;
    let counters = Arc::new(RequestCounters::new());
    let store = storage.account.table_store(counters);
    let suffix = format!("{:06x}", rand::random::<u32>() & 0xffffff);
    let source = format!("DemoSource{suffix}");
    let per_key = RowsPerKey {
        mean: args.rows_per_key,
    };

    let t = Instant::now();
    eprintln!("seeding {} rows into {source} ...", args.rows);
    seed(&store, &source, args.rows, args.seed, per_key)
        .await
        .map_err(|e| format!("seeding {source}: {e}"))?;
    eprintln!("seeded in {:.1} s", t.elapsed().as_secs_f64());
    let source_print = table_fingerprint(&store, &source).await?;

    let (_dir, host) = start_app(&storage, args.instances, args.port, &[]).await?;
    let session = Session {
        client: reqwest::Client::new(),
        base: format!("http://{}", host.http_addr()),
        account: &storage.account,
        store: &store,
        suffix,
        source,
        source_print,
    };
    let outcome = run_steps(&session, &args).await;
    host.shutdown().await;
    print_summary(&session, &outcome?);
    Ok(())
}

/// The copies, each verified, then the backup and its verified restore.
async fn run_steps(session: &Session<'_>, args: &DemoArgs) -> Result<Outcome, String> {
    let variants: &[(&str, &str)] = if args.no_serial {
        &[("prefix", "Prefix")]
    } else {
        &[("prefix", "Prefix"), ("serial", "Serial")]
    };
    let mut copies = Vec::new();
    for (strategy, name) in variants {
        copies.push(run_copy(session, strategy, name).await?);
    }
    let backup = match (args.no_backup, session.account.blob_endpoint()) {
        (true, _) => Err("--no-backup".to_string()),
        (false, Err(missing)) => {
            eprintln!("\nbackup: skipped, the storage connection has no blob endpoint: {missing}");
            Err(format!("no blob endpoint ({missing})"))
        }
        (false, Ok(_)) => Ok(backup::backup_and_restore(session).await?),
    };
    Ok(Outcome { copies, backup })
}

/// One copy of the source with `strategy` into `Demo<name><suffix>`, verified.
async fn run_copy(session: &Session<'_>, strategy: &str, name: &str) -> Result<RunSummary, String> {
    let source = &session.source;
    let destination = format!("Demo{name}{}", session.suffix);
    let body = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "strategy": strategy});
    announce(&session.base, &body);
    let expected = &session.source_print;
    let run = run_scan(
        &session.client,
        &session.base,
        strategy,
        body,
        expected.rows,
        false,
    )
    .await?;
    let copied = table_fingerprint(session.store, &destination).await?;
    if (copied.rows, &copied.checksum) != (expected.rows, &expected.checksum) {
        return Err(format!(
            "{strategy} copy mismatch: source {} rows #{}, {destination} {} rows #{}",
            expected.rows, expected.checksum, copied.rows, copied.checksum
        ));
    }
    eprintln!(
        "verified: {destination} has {} rows, checksum {} = source",
        copied.rows, copied.checksum
    );
    Ok(run)
}

fn print_summary(session: &Session<'_>, outcome: &Outcome) {
    println!(
        "\n{:<8} {:>9} {:>9} {:>10} {:>14} {:>10}",
        "scan", "rows", "wall s", "rows/s", "requests/1k", "messages"
    );
    let backup_runs = outcome.backup.iter().flat_map(|b| [&b.export, &b.import]);
    for run in outcome.copies.iter().chain(backup_runs) {
        let s = &run.status;
        let rows = s["rowsWritten"].as_i64().unwrap_or(0);
        let secs = run.wall.as_secs_f64();
        let per_k = s["storageRequests"].as_f64().unwrap_or(0.0) * 1000.0 / (rows.max(1) as f64);
        println!(
            "{:<8} {:>9} {:>9.1} {:>10.0} {:>14.1} {:>10}",
            run.label,
            rows,
            secs,
            rows as f64 / secs,
            per_k,
            s["messagesProcessed"].as_i64().unwrap_or(0)
        );
    }
    let print = &session.source_print;
    println!(
        "\nEvery copy verified: {} rows, checksum {}.",
        print.rows, print.checksum
    );
    match &outcome.backup {
        Ok(b) => println!(
            "Backup {} ({} part{}, {} gzip) restored into {} and verified: {} rows, checksum {}.",
            b.manifest_path,
            b.manifest.parts.len(),
            backup::plural(b.manifest.parts.len()),
            backup::mib(b.compressed_bytes()),
            b.restored_table,
            print.rows,
            print.checksum
        ),
        Err(why) => println!("No backup and restore: {why}."),
    }
    println!("Note: these are Azurite's rates, not Azure's: Azurite evaluates every filter by scanning the whole table and writes table rows slowly (the export reads the same table but writes blobs, so its rate shows the reads alone).");
}
