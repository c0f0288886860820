//! `tablescan scan start|status|watch|cancel|list`: a client of a deployed app (or of
//! `tablescan host`, `func start`), with the flags, progress display and exit codes of
//! `tablescan run`.
//!
//! Invariant: the function key comes from `--key` or `TABLESCAN_FUNCTION_KEY`, travels only in
//! the `x-functions-key` header, and is never printed.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::api::{self, Refusal, Remote};
use super::flags::ScanFlags;
use super::progress::Progress;
use super::{ended, fail, watch, DisplayArgs, Exit, Watched};

/// Where the app is.
#[derive(Debug, Clone, Args)]
pub struct AppArgs {
    /// The app's URL: https://APP.azurewebsites.net, or http://localhost:7071 locally.
    #[arg(long, value_name = "URL")]
    pub app: String,
    /// A function key of the app (default: the TABLESCAN_FUNCTION_KEY variable); none locally.
    #[arg(long, env = "TABLESCAN_FUNCTION_KEY", hide_env_values = true)]
    pub key: Option<String>,
}

/// `tablescan scan start`.
#[derive(Debug, Clone, Args)]
pub struct StartArgs {
    /// The driver: copy, count, delete, enqueue, export, import or index.
    pub driver: String,
    #[command(flatten)]
    pub flags: ScanFlags,
    #[command(flatten)]
    pub app: AppArgs,
    /// Follow the scan to its end, as `scan watch` does.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub display: DisplayArgs,
}

/// `tablescan scan`.
#[derive(Debug, Clone, Args)]
pub struct ScanArgs {
    #[command(subcommand)]
    pub command: ScanCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ScanCommand {
    /// Start a scan (its id on stdout); with --watch, follow it to its end.
    Start(Box<StartArgs>),
    /// Print a scan's status (a line, or the status document with --json).
    Status {
        id: String,
        #[command(flatten)]
        app: AppArgs,
        #[arg(long)]
        json: bool,
    },
    /// Follow a scan to its end: exit 0 completed, 1 failed or cancelled, 130 on Ctrl-C (the
    /// scan goes on in the app).
    Watch {
        id: String,
        #[command(flatten)]
        app: AppArgs,
        #[command(flatten)]
        display: DisplayArgs,
    },
    /// Cancel a running scan.
    Cancel {
        id: String,
        #[command(flatten)]
        app: AppArgs,
        #[arg(long)]
        json: bool,
    },
    /// List scans, newest first (one page).
    List {
        #[command(flatten)]
        app: AppArgs,
        /// Scans in the page (the API's `top`).
        #[arg(long)]
        top: Option<u32>,
        /// The page after this token (the last page's `continuationToken`).
        #[arg(long)]
        continuation_token: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

/// `tablescan scan`: runs the command and says how it ended.
pub fn run(args: ScanArgs) -> ExitCode {
    super::init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(Refusal::failed(e.to_string())),
    };
    match runtime.block_on(command(args.command)) {
        Ok(exit) => exit.into(),
        Err(refusal) => fail(refusal),
    }
}

async fn command(command: ScanCommand) -> Result<Exit, Refusal> {
    match command {
        ScanCommand::Start(start) => {
            let StartArgs {
                driver,
                flags,
                app,
                watch,
                display,
            } = *start;
            let remote = Remote::new(&app.app, app.key)?;
            let status = api::start(&remote, flags.body(&driver)?).await?;
            let id = status["id"].as_str().unwrap_or_default().to_string();
            println!("{id}");
            eprintln!("tablescan: scan {id} is recorded; follow it with: tablescan scan watch {id} --app {}", app.app);
            match watch {
                true => follow(&remote, &id, &display).await,
                false => Ok(Exit::Completed),
            }
        }
        ScanCommand::Status { id, app, json } => {
            let status = api::status(&Remote::new(&app.app, app.key)?, &id).await?;
            print_status(&status, json);
            Ok(Exit::Completed)
        }
        ScanCommand::Watch { id, app, display } => {
            follow(&Remote::new(&app.app, app.key)?, &id, &display).await
        }
        ScanCommand::Cancel { id, app, json } => {
            let status = api::cancel(&Remote::new(&app.app, app.key)?, &id).await?;
            print_status(&status, json);
            Ok(Exit::Completed)
        }
        ScanCommand::List {
            app,
            top,
            continuation_token,
            json,
        } => {
            let mut query = Vec::new();
            if let Some(top) = top {
                query.push(format!("top={top}"));
            }
            if let Some(token) = continuation_token {
                query.push(format!("continuationToken={}", encode_query(&token)));
            }
            let query = match query.is_empty() {
                true => String::new(),
                false => format!("?{}", query.join("&")),
            };
            let page = api::list(&Remote::new(&app.app, app.key)?, &query).await?;
            print_list(&page, json);
            Ok(Exit::Completed)
        }
    }
}

/// Watches a scan of the app to its end.
async fn follow(remote: &Remote, id: &str, display: &DisplayArgs) -> Result<Exit, Refusal> {
    let mut progress = Progress::new(display.quiet);
    let interval = Duration::from_secs(display.status_interval);
    match watch(remote, id, &mut progress, interval).await {
        Watched::Ended(status) => Ok(ended(&status, display, &progress)),
        Watched::Interrupted(_) => {
            progress.finish();
            eprintln!("tablescan: stopped watching; scan {id} goes on in the app");
            Ok(Exit::Interrupted)
        }
        Watched::Lost(refusal) => Err(refusal),
    }
}

fn print_status(status: &Value, json: bool) {
    match json {
        true => println!("{status}"),
        false => println!("{}", super::progress::summary(status)),
    }
}

fn print_list(page: &Value, json: bool) {
    if json {
        println!("{page}");
        return;
    }
    let scans = page["scans"].as_array().cloned().unwrap_or_default();
    for scan in &scans {
        println!("{}", super::progress::summary(scan));
    }
    if let Some(token) = page["continuationToken"].as_str() {
        println!("more: --continuation-token {token}");
    }
}

/// Percent-encodes a query value (tokens hold scan ids and partition keys).
fn encode_query(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
