//! Handler process supervision (§1.3, §1.4): launch, readiness polling, restart on exit or on
//! request (function timeout), and giving up after 3 errors in 30 minutes as the host does.
//!
//! Giving up ends this host instance, not the process: on Azure the platform then starts a fresh
//! host on that instance while the others keep working. The stand-in models that by recycling:
//! the instance stays [`WorkerStatus::Failed`] (no HTTP or queue work) for its recycle delay
//! ([`RECYCLE_DELAY`] unless configured), then starts a fresh handler with its error count
//! cleared. The platform's own delay is not published; 10 s is our choice, long enough to be
//! seen in logs and tests, short enough that a long run loses little.
//!
//! Invariants:
//! - the instance gives up when [`ERROR_THRESHOLD`] errors fall within [`ERROR_WINDOW`] of the
//!   latest one ([`ErrorCount`]); a timeout restart or a clean exit is not an error;
//! - after giving up it stays [`WorkerStatus::Failed`] for exactly its recycle delay unless stopped
//!   meanwhile ([`wait_recycle`]), and starts again with no error counted;
//! - every delay here runs on tokio's clock, so paused-time tests drive them.

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::config::{expand_argument, AppConfig, AppSettings};
use super::log::{console_line, HostLog};

/// `WorkerReadyCheckPollingIntervalMilliseconds`.
pub const READY_POLL_INTERVAL: Duration = Duration::from_millis(25);
/// `InitializationTimeout` default.
pub const INITIALIZATION_TIMEOUT: Duration = Duration::from_secs(30);
/// `ErrorEventsThreshold` within `WorkerRestartErrorIntervalThresholdInMinutes`.
pub const ERROR_THRESHOLD: usize = 3;
pub const ERROR_WINDOW: Duration = Duration::from_secs(30 * 60);
/// How long a host instance that gave up stays down before a fresh one starts (see the top).
pub const RECYCLE_DELAY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerStatus {
    Starting,
    Ready {
        port: u16,
    },
    /// Stopped on request (shutdown).
    Stopped,
    /// Gave up after too many errors; a fresh handler starts after the recycle delay.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerState {
    /// Increments on every (re)start; an invocation belongs to one generation.
    pub generation: u64,
    pub status: WorkerStatus,
    pub pid: Option<u32>,
}

enum WorkerCommand {
    Restart { generation: u64, reason: String },
    Stop,
}

/// Handle on one supervised handler process.
pub struct Worker {
    state: watch::Receiver<WorkerState>,
    commands: mpsc::UnboundedSender<WorkerCommand>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

/// What a worker needs to launch its handler.
#[derive(Clone)]
pub struct WorkerSpec {
    pub app: Arc<AppConfig>,
    pub settings: Arc<AppSettings>,
    /// Prefix for log lines, e.g. `[i0]`.
    pub label: String,
    pub log: HostLog,
    /// How long the instance stays down after giving up ([`RECYCLE_DELAY`] by default).
    pub recycle_delay: Duration,
}

impl Worker {
    pub fn start(spec: WorkerSpec) -> Arc<Worker> {
        let (state_tx, state_rx) = watch::channel(WorkerState {
            generation: 0,
            status: WorkerStatus::Starting,
            pid: None,
        });
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(supervise(spec, state_tx, cmd_rx));
        Arc::new(Worker {
            state: state_rx,
            commands: cmd_tx,
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    pub fn state(&self) -> WorkerState {
        self.state.borrow().clone()
    }

    pub fn pid(&self) -> Option<u32> {
        self.state.borrow().pid
    }

    /// Waits until the handler is ready (returns generation and port) or the worker is gone.
    pub async fn ready(&self) -> Result<(u64, u16), String> {
        let mut rx = self.state.clone();
        let state = rx
            .wait_for(|s| !matches!(s.status, WorkerStatus::Starting))
            .await
            .map_err(|_| "handler supervisor ended".to_string())?
            .clone();
        match state.status {
            WorkerStatus::Ready { port } => Ok((state.generation, port)),
            WorkerStatus::Stopped => Err("the handler is stopped".into()),
            WorkerStatus::Failed(why) => Err(why),
            WorkerStatus::Starting => unreachable!(),
        }
    }

    /// Resolves when `generation` is no longer the running handler.
    pub async fn generation_ended(&self, generation: u64) {
        let mut rx = self.state.clone();
        let _ = rx
            .wait_for(|s| {
                s.generation != generation || !matches!(s.status, WorkerStatus::Ready { .. })
            })
            .await;
    }

    /// Restarts the handler if `generation` is still the running one (function timeout). Not
    /// counted as an error, as in the host.
    pub fn restart(&self, generation: u64, reason: impl Into<String>) {
        let _ = self.commands.send(WorkerCommand::Restart {
            generation,
            reason: reason.into(),
        });
    }

    /// Stops the handler for good and waits for the process to be gone.
    pub async fn stop(&self) {
        let _ = self.commands.send(WorkerCommand::Stop);
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
    }

    /// Waits out a recycle: `true` once a worker that gave up starts a fresh handler, `false`
    /// if it is stopped (or never gave up and is not running).
    pub async fn recycled(&self) -> bool {
        let mut rx = self.state.clone();
        let back = rx
            .wait_for(|s| !matches!(s.status, WorkerStatus::Failed(_)))
            .await
            .is_ok_and(|s| {
                matches!(
                    s.status,
                    WorkerStatus::Starting | WorkerStatus::Ready { .. }
                )
            });
        back
    }

    /// Resolves once the worker gave up (too many errors) with the reason.
    pub async fn failed(&self) -> String {
        let mut rx = self.state.clone();
        let failed = rx
            .wait_for(|s| matches!(s.status, WorkerStatus::Failed(_)))
            .await
            .map(|s| s.status.clone());
        match failed {
            Ok(WorkerStatus::Failed(why)) => why,
            // Supervisor gone without failing (stopped): never resolve.
            _ => std::future::pending().await,
        }
    }
}

/// A free TCP port on 127.0.0.1, like `WorkerUtilities.GetUnusedTcpPort`.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

enum Ended {
    /// Counts towards the error threshold.
    Error(String),
    /// Restart without counting (timeout restart, clean exit).
    Restart,
    Stop,
}

/// The handler errors that count towards giving up: those within [`ERROR_WINDOW`] of the latest.
#[derive(Debug, Default)]
pub struct ErrorCount {
    times: VecDeque<Instant>,
}

impl ErrorCount {
    /// Counts an error at `now`; `true` when [`ERROR_THRESHOLD`] errors now fall within
    /// [`ERROR_WINDOW`] (the host gives up).
    pub fn too_many(&mut self, now: Instant) -> bool {
        self.times.push_back(now);
        while self
            .times
            .front()
            .is_some_and(|t| now.duration_since(*t) > ERROR_WINDOW)
        {
            self.times.pop_front();
        }
        self.times.len() >= ERROR_THRESHOLD
    }

    /// Forgets every error (a recycled instance starts afresh).
    pub fn clear(&mut self) {
        self.times.clear();
    }
}

async fn supervise(
    spec: WorkerSpec,
    state: watch::Sender<WorkerState>,
    mut commands: mpsc::UnboundedReceiver<WorkerCommand>,
) {
    let mut errors = ErrorCount::default();
    let mut generation = 0u64;
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    loop {
        generation += 1;
        state.send_replace(WorkerState {
            generation,
            status: WorkerStatus::Starting,
            pid: None,
        });
        let ended = run_once(&spec, generation, &state, &mut commands, &client).await;
        match ended {
            Ended::Stop => {
                state.send_replace(WorkerState {
                    generation,
                    status: WorkerStatus::Stopped,
                    pid: None,
                });
                return;
            }
            Ended::Restart => continue,
            Ended::Error(why) => {
                spec.log
                    .error(format!("{} handler error: {why}", spec.label));
                if errors.too_many(Instant::now()) {
                    if !give_up(&spec, generation, &state, &mut commands, &why).await {
                        return;
                    }
                    errors.clear();
                }
            }
        }
    }
}

/// Ends this host instance after too many errors: `Failed` for the recycle delay, then `true`
/// to start a fresh handler, or `false` when stopped meanwhile.
async fn give_up(
    spec: &WorkerSpec,
    generation: u64,
    state: &watch::Sender<WorkerState>,
    commands: &mut mpsc::UnboundedReceiver<WorkerCommand>,
    why: &str,
) -> bool {
    let msg = format!(
        "Exceeded http worker restart retry count ({ERROR_THRESHOLD} errors within 30 minutes); \
         last error: {why}. Shutting down this host instance"
    );
    spec.log.error(format!("{} {msg}", spec.label));
    state.send_replace(WorkerState {
        generation,
        status: WorkerStatus::Failed(msg),
        pid: None,
    });
    if !wait_recycle(spec.recycle_delay, commands).await {
        return false;
    }
    spec.log.warn(format!(
        "{} recycling the host instance: a fresh handler starts ({:?} after giving up)",
        spec.label, spec.recycle_delay
    ));
    true
}

/// Waits out the recycle delay of an instance that gave up: `true` once `delay` has passed,
/// `false` as soon as a stop comes (or the commands end). Restart requests are for the handler
/// that is gone and change nothing.
async fn wait_recycle(
    delay: Duration,
    commands: &mut mpsc::UnboundedReceiver<WorkerCommand>,
) -> bool {
    let recycle = tokio::time::sleep(delay);
    tokio::pin!(recycle);
    loop {
        tokio::select! {
            _ = &mut recycle => return true,
            cmd = commands.recv() => match cmd {
                Some(WorkerCommand::Restart { .. }) => {}
                Some(WorkerCommand::Stop) | None => return false,
            },
        }
    }
}

/// `ETXTBSY` (Linux and macOS); `ErrorKind::ExecutableFileBusy` is newer than our MSRV.
const ETXTBSY: i32 = 26;

/// [`spawn_handler`], tried again while the executable is busy (`ETXTBSY`): a handler just
/// copied into the app folder (staged) can still be open for writing in a process that another
/// thread forked meanwhile, until that process execs (a few milliseconds). At most 40 tries,
/// 25 ms apart.
async fn spawn_when_not_busy(
    spec: &WorkerSpec,
    port: u16,
    worker_id: &str,
) -> std::io::Result<Child> {
    let mut tries = 1;
    loop {
        match spawn_handler(spec, port, worker_id) {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 40 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            spawned => return spawned,
        }
    }
}

fn spawn_handler(spec: &WorkerSpec, port: u16, worker_id: &str) -> std::io::Result<Child> {
    let app = &spec.app;
    let root = app.root.to_string_lossy().into_owned();
    let worker_vars: [(&str, String); 5] = [
        ("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string()),
        ("FUNCTIONS_CUSTOMHANDLER_WORKER_ID", worker_id.to_string()),
        ("FUNCTIONS_HTTPWORKER_PORT", port.to_string()),
        ("FUNCTIONS_HTTPWORKER_ID", worker_id.to_string()),
        ("FUNCTIONS_APP_ROOT_PATH", root),
    ];
    let mut vars: HashMap<String, String> = spec
        .settings
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in &worker_vars {
        vars.insert(k.to_string(), v.clone());
    }
    let args: Vec<String> = app
        .handler
        .arguments
        .iter()
        .map(|a| expand_argument(a, &vars))
        .collect();
    let mut cmd = Command::new(&app.handler.executable);
    cmd.args(&args)
        .current_dir(&app.handler.working_directory)
        .envs(vars)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn()
}

/// Logs each line of the handler's stdout or stderr under the level and category the host uses
/// (`Host.Function.Console`; §11), through host.json's `logging.logLevel` filter.
fn forward_lines<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    reader: R,
    log: HostLog,
    prefix: String,
    worker_id: String,
    stderr: bool,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let (level, category, message) = console_line(stderr, &line, &worker_id);
            log.category(level, &category, &prefix, &message);
        }
    });
}

/// Sends the handler's stdout and stderr to the log, line by line.
fn forward_output(child: &mut Child, spec: &WorkerSpec, prefix: &str, worker_id: &str) {
    let (log, prefix, id) = (&spec.log, prefix.to_string(), worker_id.to_string());
    if let Some(out) = child.stdout.take() {
        forward_lines(out, log.clone(), prefix.clone(), id.clone(), false);
    }
    if let Some(err) = child.stderr.take() {
        forward_lines(err, log.clone(), prefix, id, true);
    }
}

/// Whether the handler on `port` answers `GET /` before the initialization timeout (counted
/// from `started`). Any HTTP answer means ready; only connection failures keep waiting.
async fn answers_get(client: &reqwest::Client, port: u16, started: Instant) -> bool {
    loop {
        let url = format!("http://127.0.0.1:{port}/");
        let remaining = INITIALIZATION_TIMEOUT.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            return false;
        }
        if client.get(&url).timeout(remaining).send().await.is_ok() {
            return true;
        }
        tokio::time::sleep(READY_POLL_INTERVAL).await;
    }
}

async fn run_once(
    spec: &WorkerSpec,
    generation: u64,
    state: &watch::Sender<WorkerState>,
    commands: &mut mpsc::UnboundedReceiver<WorkerCommand>,
    client: &reqwest::Client,
) -> Ended {
    let port = match free_port() {
        Ok(p) => p,
        Err(e) => return Ended::Error(format!("no free port: {e}")),
    };
    let worker_id = uuid::Uuid::new_v4().to_string();
    let mut child = match spawn_when_not_busy(spec, port, &worker_id).await {
        Ok(c) => c,
        Err(e) => {
            return Ended::Error(format!(
                "cannot start {}: {e}",
                spec.app.handler.executable.display()
            ));
        }
    };
    let pid = child.id();
    let prefix = format!("{} [handler pid {}]", spec.label, pid.unwrap_or(0));
    forward_output(&mut child, spec, &prefix, &worker_id);
    state.send_replace(WorkerState {
        generation,
        status: WorkerStatus::Starting,
        pid,
    });
    spec.log.info(format!(
        "{prefix} started on port {port}, waiting for it to answer GET /"
    ));

    let started = Instant::now();
    let ready = answers_get(client, port, started);
    tokio::select! {
        ok = ready => {
            if !ok {
                kill(&mut child).await;
                return Ended::Error("Initializing HttpWorker timed out (no answer to GET / within 30 s)".into());
            }
        }
        status = child.wait() => {
            return Ended::Error(format!("handler exited before it was ready ({})", describe(status)));
        }
        cmd = next_command(commands, generation) => {
            kill(&mut child).await;
            return cmd;
        }
    }
    spec.log.info(format!(
        "{prefix} ready after {} ms",
        started.elapsed().as_millis()
    ));
    state.send_replace(WorkerState {
        generation,
        status: WorkerStatus::Ready { port },
        pid,
    });
    tokio::select! {
        status = child.wait() => {
            match status {
                Ok(s) if s.success() => {
                    spec.log.warn(format!("{prefix} exited with code 0; restarting it"));
                    Ended::Restart
                }
                other => Ended::Error(format!("handler exited ({}); restarting it", describe(other))),
            }
        }
        cmd = next_command(commands, generation) => {
            kill(&mut child).await;
            cmd
        }
    }
}

/// The next command that applies to this generation (stale restart requests are ignored).
async fn next_command(
    commands: &mut mpsc::UnboundedReceiver<WorkerCommand>,
    generation: u64,
) -> Ended {
    loop {
        match commands.recv().await {
            None | Some(WorkerCommand::Stop) => return Ended::Stop,
            Some(WorkerCommand::Restart {
                generation: g,
                reason,
            }) if g == generation => {
                tracing::warn!(target: "tablescan::lab::host", "restarting handler: {reason}");
                return Ended::Restart;
            }
            Some(WorkerCommand::Restart { .. }) => continue,
        }
    }
}

async fn kill(child: &mut Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => match s.code() {
            Some(c) => format!("exit code {c}"),
            None => {
                #[cfg(unix)]
                {
                    use std::os::unix::process::ExitStatusExt;
                    if let Some(sig) = s.signal() {
                        return format!("killed by signal {sig}");
                    }
                }
                "no exit code".into()
            }
        },
        Err(e) => format!("wait failed: {e}"),
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
