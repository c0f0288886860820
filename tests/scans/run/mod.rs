//! `tablescan run` and `tablescan scan`, as a user runs them: the real binary spawned with its
//! flags and environment, on the shared Azurite; results read back by the test's own REST client
//! (`support::raw`), never by tablescan's parser.
//! - `exact`: a copy, an export and its restore, a delete, each exact; refused flags write nothing;
//! - `resume`: SIGINT and SIGKILL mid-scan, then `--resume`, alone and by two processes at once;
//! - `client`: `tablescan scan` against the local host;
//! - `measure`: requests, speed and memory of `run copy` (ignored: a measurement).

mod client;
mod exact;
mod measure;
mod resume;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::support;
use support::unique_name;

/// What a finished command said.
#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The `--json` status on stdout.
    pub fn status(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// One test's app names: its own queues and bookkeeping tables on the shared Azurite.
pub struct Names {
    pub prefix_queue: String,
    pub copy_queue: String,
    pub scans_table: String,
    pub work_table: String,
}

impl Names {
    pub fn new() -> Names {
        Names {
            prefix_queue: unique_name("ps"),
            copy_queue: unique_name("tc"),
            scans_table: unique_name("Scans"),
            work_table: unique_name("Work"),
        }
    }

    /// The environment of a run: the account, this test's names, 4 counter shards.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            (
                "AzureWebJobsStorage",
                support::azurite().connection_string(),
            ),
            ("TABLESCAN_PREFIXSCAN_QUEUE", self.prefix_queue.clone()),
            ("TABLESCAN_TABLECOPY_QUEUE", self.copy_queue.clone()),
            ("TABLESCAN_SCANS_TABLE", self.scans_table.clone()),
            ("TABLESCAN_WORK_TABLE", self.work_table.clone()),
            ("TABLESCAN_COUNTER_SHARDS", "4".into()),
            ("RUST_LOG", "warn".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// `tablescan <args>` with this environment (the app's settings removed from the test's own).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(support::e2e::handler_binary());
        command
            .args(args)
            .env_remove("AzureWebJobsStorage")
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs `tablescan <args>` to its end; `bound` only catches a hang.
    pub async fn output(&self, args: &[&str], bound: Duration) -> Output {
        let child = self.command(args).spawn().expect("spawn tablescan");
        let output = tokio::time::timeout(bound, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("tablescan {args:?} still running after {bound:?}"))
            .expect("tablescan output");
        Output {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// [`Names::output`] of a command line whose arguments hold no spaces.
    pub async fn line(&self, line: &str, bound: Duration) -> Output {
        let args: Vec<&str> = line.split_whitespace().collect();
        self.output(&args, bound).await
    }

    /// Starts `tablescan <args>` and hands its stderr over line by line.
    pub fn spawn(&self, args: &[&str]) -> Running {
        let mut child = self.command(args).spawn().expect("spawn tablescan");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }
}

/// A `tablescan` process running.
pub struct Running {
    pub child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    pub seen: Vec<String>,
}

impl Running {
    /// Waits for a stderr line `wanted` accepts and returns it; `bound` only catches a hang.
    pub async fn line(
        &mut self,
        what: &str,
        bound: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> String {
        let wait = async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line.clone());
                if wanted(&line) {
                    return Some(line);
                }
            }
            None
        };
        match tokio::time::timeout(bound, wait).await {
            Ok(Some(line)) => line,
            other => panic!(
                "waited for {what} ({}), last lines: {:?}",
                if other.is_err() {
                    "timed out"
                } else {
                    "stderr closed"
                },
                self.seen.iter().rev().take(5).collect::<Vec<_>>()
            ),
        }
    }

    /// The scan id the run printed as soon as it recorded the scan.
    pub async fn scan_id(&mut self) -> String {
        let line = self
            .line("the scan id", Duration::from_secs(60), |l| {
                l.contains(" is recorded")
            })
            .await;
        line.split_whitespace().nth(2).unwrap().to_string()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        let pid = self.child.id().expect("running");
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to end: its exit code and the rest of its stdout and stderr.
    pub async fn finish(mut self, bound: Duration) -> Output {
        let mut stdout = String::new();
        let mut out = self.child.stdout.take().unwrap();
        let status = tokio::time::timeout(bound, async {
            out.read_to_string(&mut stdout).await.unwrap();
            self.child.wait().await.unwrap()
        })
        .await
        .unwrap_or_else(|_| panic!("still running after {bound:?}; last lines {:?}", self.seen));
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        // The reader task may still hold the last lines: give it its end of file.
        while let Some(line) = self.lines.recv().await {
            self.seen.push(line);
        }
        Output {
            code: status.code(),
            stdout,
            stderr: self.seen.join("\n"),
        }
    }
}

/// Whether `text` holds only printable ASCII and newlines (no terminal control codes).
pub fn plain(text: &str) -> bool {
    text.bytes()
        .all(|b| b == b'\n' || (0x20..0x7f).contains(&b))
}

/// The figure `name` of a progress line (`…, 1,234 rows scanned, …`).
pub fn figure(line: &str, name: &str) -> Option<u64> {
    let at = line.find(name)?;
    let number = line[..at].trim_end().rsplit([' ', ':']).next()?;
    number.replace(',', "").parse().ok()
}
