//! The app in this process: its configuration from the environment (optionally on another
//! connection), and one listener per queue function of the catalog that delivers each message
//! to the app's router in-process, as the Functions host would over HTTP.
//!
//! Invariants:
//! - the queues, tables and settings are the app's own (`app::config::Config`), so a scan a
//!   `run` started can be finished by a deployed app on the same account, and the reverse;
//! - every listener of this process shares one pool of `concurrency` slots: never more
//!   deliveries at once;
//! - a delivery is a success only if the app answered 2xx, as under the host, so failures
//!   are retried, then poisoned, with the app's `maxDequeueCount`.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use serde_json::{json, Value};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use super::api::Local;
use super::listen::{Deliver, Level, Listener, QueueTarget, Settings};
use crate::app::catalog::{Trigger, FUNCTIONS, PREFIX_SCAN_QUEUE_SETTING};
use crate::app::config::{Config, STORAGE_SETTING};
use crate::app::observe::INVOCATION_ID_HEADER;
use crate::storage::azure_queue::AzureQueueStore;
use crate::storage::{MessageEncoding, ReceivedMessage};

/// How long a failed delivery's message waits before its next delivery: host.json's
/// `visibilityTimeout`, so a run retries as the app does.
pub const RETRY_DELAY: Duration = Duration::from_secs(30);
/// Longest wait between two polls of an empty work queue (host.json says 5 s for the app; a
/// run polls its two work queues more eagerly, so a scan's last steps are not late).
const WORK_POLLING: Duration = Duration::from_secs(1);
/// Longest wait between two polls of the poison and cleanup queues, which are rarely used.
const QUIET_POLLING: Duration = Duration::from_secs(10);

/// The app's configuration from the environment. With `connection`, the app's own account
/// (`AzureWebJobsStorage`: its queues, its bookkeeping tables, the default source and
/// destination) is the one that environment variable names, or its keyless `<NAME>__*`
/// settings; every other setting is read as the app reads it.
pub fn config(connection: Option<&str>) -> Result<Config, String> {
    let lookup = |name: &str| -> Option<String> {
        let renamed = match (connection, name.strip_prefix(STORAGE_SETTING)) {
            (Some(c), Some(rest)) if rest.is_empty() || rest.starts_with("__") => {
                format!("{c}{rest}")
            }
            _ => name.to_string(),
        };
        std::env::var(renamed).ok()
    };
    Config::from_lookup(lookup).map_err(|e| match (connection, e.name.as_str()) {
        (Some(c), STORAGE_SETTING) => format!("--connection: {c}: {}", e.message),
        (None, STORAGE_SETTING) => format!(
            "{e} (set it to the storage account's connection string, or name another variable with --connection)"
        ),
        _ => e.to_string(),
    })
}

/// Delivers one queue function's messages to the app in this process.
pub struct InProcess {
    app: Arc<Local>,
    /// The function's path (`/PrefixScan`).
    path: String,
    quiet: bool,
}

impl Deliver for InProcess {
    async fn ready(&self) -> Result<(), String> {
        Ok(())
    }

    async fn deliver(&self, message: &ReceivedMessage, bytes: Vec<u8>) -> Result<(), String> {
        let invocation = uuid::Uuid::new_v4().to_string();
        let headers = [
            ("content-type", "application/json".to_string()),
            (INVOCATION_ID_HEADER, invocation),
        ];
        let payload = payload(message, &bytes).into_bytes();
        let (status, answer) = self
            .app
            .send(Method::POST, &self.path, &headers, payload)
            .await?;
        match status {
            200..=299 => Ok(()),
            _ => Err(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&answer)
            )),
        }
    }

    fn log(&self, level: Level, line: String) {
        // The app writes its own line of every failed invocation; the listener's are about the
        // queues, shown unless the run is quiet or they are routine: the poison and cleanup
        // queues exist only once something was put on them.
        if level != Level::Info && !self.quiet && !line.contains("does not exist (yet)") {
            eprintln!("tablescan run: {line}");
        }
    }
}

/// The payload the Functions host sends a queue function (docs/custom-handler-protocol.md §3.3):
/// the message text JSON-encoded twice, its delivery count and id.
fn payload(message: &ReceivedMessage, bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let twice = |s: &str| Value::from(Value::from(s).to_string());
    json!({
        "Data": { "message": twice(&text) },
        "Metadata": {
            "DequeueCount": message.dequeue_count.to_string(),
            "Id": twice(&message.id),
        },
    })
    .to_string()
}

/// The listeners of this process: started once, stopped once.
pub struct Listeners {
    stop: watch::Sender<bool>,
    abandon: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// How the listeners of a run behave.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    pub concurrency: usize,
    pub receive_visibility: Duration,
    pub drain: Duration,
    pub quiet: bool,
}

/// Starts one listener per queue function of the catalog, all sharing `options.concurrency`
/// slots.
pub fn listen(
    app: Arc<Local>,
    config: &Config,
    queues: Arc<AzureQueueStore>,
    options: ListenOptions,
) -> Listeners {
    let (stop, stop_rx) = watch::channel(false);
    let (abandon, abandon_rx) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(options.concurrency));
    let mut tasks = Vec::new();
    for function in FUNCTIONS {
        let Trigger::Queue {
            queue_setting,
            suffix,
        } = function.trigger
        else {
            continue;
        };
        let base = match queue_setting {
            PREFIX_SCAN_QUEUE_SETTING => &config.prefix_scan_queue,
            _ => &config.table_copy_queue,
        };
        let queue = format!("{base}{suffix}");
        let poison = format!("{queue}{}", crate::app::catalog::POISON_SUFFIX);
        let poison = (!queue.ends_with(crate::app::catalog::POISON_SUFFIX)
            && crate::app::validate::queue_name(&poison).is_ok())
        .then(|| Arc::new(QueueTarget::new(queues.clone(), poison)));
        let listener = Arc::new(Listener {
            tag: format!("[{}]", function.name),
            source: Arc::new(QueueTarget::new(queues.clone(), queue)),
            poison,
            settings: Settings {
                batch_size: options.concurrency.clamp(1, 32) as u32,
                new_batch_threshold: options.concurrency as u32,
                max_polling_interval: match suffix {
                    "" => WORK_POLLING,
                    _ => QUIET_POLLING,
                },
                visibility_timeout: RETRY_DELAY,
                max_dequeue_count: config.max_dequeue_count,
                message_encoding: MessageEncoding::Base64,
                receive_visibility: options.receive_visibility,
                release_abandoned: true,
            },
            slots: Some(slots.clone()),
            deliver: InProcess {
                app: app.clone(),
                path: function.path(),
                quiet: options.quiet,
            },
        });
        let run = listener.run_until(stop_rx.clone(), options.drain, abandon_rx.clone());
        tasks.push(tokio::spawn(run));
    }
    Listeners {
        stop,
        abandon,
        tasks,
    }
}

impl Listeners {
    /// Stops taking messages; deliveries in flight go on until [`Listeners::finish`].
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops taking messages and waits for every listener to drain; once `abandon_on`
    /// resolves, the deliveries still in flight are abandoned (their messages released).
    pub async fn finish(self, abandon_on: impl std::future::Future<Output = ()>) {
        self.stop();
        let Listeners { abandon, tasks, .. } = self;
        let all = async {
            for task in tasks {
                let _ = task.await;
            }
        };
        tokio::pin!(all);
        tokio::select! {
            _ = &mut all => return,
            _ = abandon_on => { let _ = abandon.send(true); }
        }
        all.await;
    }
}
