//! `tablescan run <driver>`: a scan with the app's own engine in this process, no deployment
//! (the app's functions called in-process, [`local`], through the one queue listener,
//! [`listen`]); and `tablescan scan start|status|watch|cancel|list`: a client of a deployed app
//! ([`client`]). Both take the scan's flags ([`flags`]), show progress alike ([`progress`]),
//! and end with the same exit codes ([`Exit`]). docs/cli.md is their manual.
//!
//! Invariants:
//! - a request is checked by the API's own code (the router's `POST /api/scans` in-process, or
//!   the app's): nothing is written for a refused one, and its field is named as a flag;
//! - the scan id is on stderr as soon as the scan is recorded, with the command that resumes it;
//! - a run ends only on the scan's recorded end (exit 0 or 1) or on an interruption (130), never
//!   while the scan is running otherwise; an interrupted run leaves the scan `running` with its
//!   work on the queues, so `--resume` (here or on any machine) goes on with it;
//! - watching reads one status per `--status-interval` (one point read and one query), and
//!   nothing else.

pub mod api;
pub mod client;
pub mod flags;
pub mod listen;
pub mod local;
pub mod progress;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use api::{Api, Local, Refusal};
use flags::ScanFlags;
use progress::Progress;

/// Deliveries at once, by default (see [`RunArgs::concurrency`]).
pub const DEFAULT_CONCURRENCY: u64 = 16;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The scan completed (or the command did what it was asked).
    Completed,
    /// The scan failed or was cancelled, or the command could not do its work.
    Failed,
    /// The request was refused: nothing was written.
    Invalid,
    /// Interrupted (SIGINT or SIGTERM): the scan goes on where it is resumed or watched.
    Interrupted,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(match exit {
            Exit::Completed => 0,
            Exit::Failed => 1,
            Exit::Invalid => 2,
            Exit::Interrupted => 130,
        })
    }
}

/// How progress is shown and the final status given.
#[derive(Debug, Clone, Args)]
pub struct DisplayArgs {
    /// Print the final status on stdout, as `GET /api/scans/{id}` returns it.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr (the scan id, errors and the end are still said).
    #[arg(long)]
    pub quiet: bool,
    /// Seconds between two status reads (each is one point read and one query).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub status_interval: u64,
}

/// `tablescan run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The driver: copy, count, delete, enqueue, export, import or index (docs/api.md).
    #[arg(required_unless_present = "resume")]
    pub driver: Option<String>,
    #[command(flatten)]
    pub flags: ScanFlags,
    /// Go on with a scan that was interrupted or killed (or join one another process runs).
    #[arg(long, value_name = "SCAN_ID", conflicts_with = "driver")]
    pub resume: Option<String>,
    /// Deliveries (scan steps and work items) this process runs at once. Each holds at most
    /// about 2,000 rows and sends its requests one or a few at a time, so 16 keep a link of
    /// tens of milliseconds busy within tens of MiB of memory, far below an account's limits.
    #[arg(long, default_value_t = DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub concurrency: u64,
    /// The environment variable holding the storage account's connection string (or its
    /// keyless `NAME__accountName` settings), instead of AzureWebJobsStorage.
    #[arg(long, value_name = "NAME")]
    pub connection: Option<String>,
    /// Seconds a message this process takes stays hidden from other processes (renewed while
    /// it works): a killed run's work is taken up again after this long.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(2..=600))]
    pub receive_visibility: u64,
    #[command(flatten)]
    pub display: DisplayArgs,
}

/// How long an interrupted or ended run waits for its deliveries in flight before it abandons
/// them (their messages are released at once).
const DRAIN: Duration = Duration::from_secs(30);

/// `tablescan run`: runs the command and says how it ended.
pub fn run(args: RunArgs) -> ExitCode {
    init_logging();
    crate::app::observe::drop_stdout_lines();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(Refusal::failed(e.to_string())),
    };
    match runtime.block_on(run_scan(args)) {
        Ok(exit) => exit.into(),
        Err(refusal) => fail(refusal),
    }
}

/// Diagnostics of the app (warnings and errors) on stderr, scrubbed of credentials.
pub fn init_logging() {
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = crate::redact::log_subscriber(std::io::stderr, "warn").try_init();
}

/// Says what went wrong and returns its exit code.
pub fn fail(refusal: Refusal) -> ExitCode {
    eprintln!("error: {}", refusal.message);
    refusal.exit.into()
}

async fn run_scan(args: RunArgs) -> Result<Exit, Refusal> {
    let config = local::config(args.connection.as_deref()).map_err(Refusal::invalid)?;
    let state = crate::app::handler::azure_state(config.clone());
    let queues = Arc::new(state.queues.clone());
    let app = Arc::new(Local::new(state));
    let id = match &args.resume {
        Some(id) => {
            if args.flags.body("")?.len() > 1 {
                return Err(Refusal::invalid(
                    "--resume takes no scan flags: the scan's request is recorded with it",
                ));
            }
            let status = api::status(&*app, id).await.map_err(|r| match r.exit {
                Exit::Invalid => Refusal::invalid(format!("--resume: {}", r.message)),
                _ => r,
            })?;
            if status["state"] != "running" {
                return Ok(ended(&status, &args.display, &Progress::new(true)));
            }
            id.clone()
        }
        None => {
            let driver = args.driver.as_deref().unwrap_or_default();
            let status = api::start(&*app, args.flags.body(driver)?).await?;
            status["id"].as_str().unwrap_or_default().to_string()
        }
    };
    let again = match &args.connection {
        Some(c) => format!("tablescan run --resume {id} --connection {c}"),
        None => format!("tablescan run --resume {id}"),
    };
    eprintln!("tablescan: scan {id} is recorded; if this run stops, go on with: {again}");
    let options = local::ListenOptions {
        concurrency: args.concurrency as usize,
        receive_visibility: Duration::from_secs(args.receive_visibility),
        drain: DRAIN,
        quiet: args.display.quiet,
    };
    let listeners = local::listen(app.clone(), &config, queues, options);
    let mut progress = Progress::new(args.display.quiet);
    let interval = Duration::from_secs(args.display.status_interval);
    let watched = watch(&*app, &id, &mut progress, interval).await;
    listeners.stop();
    match watched {
        Watched::Ended(status) => {
            settle(listeners, &progress).await;
            Ok(ended(&status, &args.display, &progress))
        }
        Watched::Interrupted(last) => {
            progress.finish();
            progress.say(&format!(
                "tablescan: interrupted; letting the deliveries in flight finish (up to {}s; Ctrl-C again abandons them)",
                DRAIN.as_secs()
            ));
            settle(listeners, &progress).await;
            if let (Some(last), true) = (last, args.display.json) {
                println!("{last}");
            }
            eprintln!("tablescan: scan {id} is still running; go on with: {again}");
            Ok(Exit::Interrupted)
        }
        Watched::Lost(refusal) => {
            settle(listeners, &progress).await;
            Err(refusal)
        }
    }
}

/// Waits for the listeners to drain; a second interruption abandons their deliveries at once
/// (the messages are released, so another run takes them up without waiting).
async fn settle(listeners: local::Listeners, progress: &Progress) {
    let second = async {
        let _ = tokio::signal::ctrl_c().await;
        progress.say("tablescan: abandoning the deliveries in flight; their messages are released");
    };
    listeners.finish(second).await;
}

/// How watching a scan ended.
pub enum Watched {
    /// The scan ended: its final status.
    Ended(Value),
    /// SIGINT or SIGTERM: the last status read, if any.
    Interrupted(Option<Value>),
    /// Its status could not be read (several times in a row).
    Lost(Refusal),
}

/// Status reads in a row that may fail (storage or network trouble) before watching gives up.
const READ_FAILURES: u32 = 5;

/// Reads the scan's status every `interval`, showing it, until it ends or the process is
/// interrupted.
pub async fn watch<A: Api>(
    api: &A,
    id: &str,
    progress: &mut Progress,
    interval: Duration,
) -> Watched {
    let interrupted = crate::app::handler::shutdown_signal();
    tokio::pin!(interrupted);
    let (mut last, mut failures) = (None, 0);
    loop {
        match api::status(api, id).await {
            Ok(status) => {
                failures = 0;
                if status["state"] != "running" {
                    progress.finish();
                    return Watched::Ended(status);
                }
                progress.update(&status);
                last = Some(status);
            }
            Err(refusal) if refusal.exit == Exit::Invalid => return Watched::Lost(refusal),
            Err(refusal) => {
                failures += 1;
                if failures >= READ_FAILURES {
                    return Watched::Lost(refusal);
                }
                progress.say(&format!(
                    "tablescan: reading the status failed (will retry): {}",
                    refusal.message
                ));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = &mut interrupted => return Watched::Interrupted(last),
        }
    }
}

/// Says how a scan ended (and prints its status with `--json`): its exit code.
pub fn ended(status: &Value, display: &DisplayArgs, progress: &Progress) -> Exit {
    if display.json {
        println!("{status}");
    }
    progress.say(&format!("tablescan: {}", progress::summary(status)));
    match status["state"].as_str() {
        Some("completed") => Exit::Completed,
        Some("running") => Exit::Completed,
        other => {
            let error = status["error"].as_str().unwrap_or("no error recorded");
            eprintln!(
                "error: scan {} {}: {error}",
                status["id"].as_str().unwrap_or("?"),
                other.unwrap_or("ended")
            );
            Exit::Failed
        }
    }
}

impl From<flags::FlagError> for Refusal {
    fn from(e: flags::FlagError) -> Refusal {
        Refusal::invalid(e.0)
    }
}
