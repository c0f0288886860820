//! Starting a private Azurite (the storage emulator) for tests, the demo and the benchmark.
//!
//! Azurite is pinned in `<project>/azurite/package-lock.json` and installed with `npm ci` on
//! first use. Each instance listens on free ports (`--*Port 0`, read back from its output), keeps
//! data in memory, and runs in its own temporary working directory.
//!
//! No orphan may outlive the process that started it, even if that process is killed or the
//! instance lives in a `static` (statics are never dropped): Azurite runs under a small `sh`
//! watchdog that holds the read end of a pipe whose write end only we hold, and kills Azurite
//! when that pipe closes, which the OS does whenever we exit. Child processes are plain
//! `std::process` children, independent of any tokio runtime, so one instance can serve many
//! `#[tokio::test]`s, each with its own runtime.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::storage::connection::{StorageAccount, DEVELOPMENT_ACCOUNT, DEVELOPMENT_ACCOUNT_KEY};

/// Environment variable overriding the directory holding Azurite's `package.json`.
pub const AZURITE_DIR_ENV: &str = "TABLESCAN_AZURITE_DIR";

/// How long Azurite may take to report all three services listening.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs Azurite, then kills it when our stdin (its watchdog's pipe) closes or Azurite exits.
const WATCHDOG: &str = r#"
exec 3<&0
"$@" </dev/null 3<&- &
child=$!
( while read -r _ <&3; do :; done; kill -TERM "$child" 2>/dev/null ) </dev/null >/dev/null 2>&1 &
exec 3<&-
wait "$child"
"#;

/// Why Azurite could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot start Azurite: {0}")]
pub struct AzuriteError(pub String);

/// How to run Azurite beyond the defaults (plain http, Shared Key/SAS only).
#[derive(Debug, Clone, Default)]
pub struct AzuriteOptions {
    /// Serve https with this PEM certificate and key (`--cert`, `--key`).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Accept OAuth bearer tokens (`--oauth basic`: issuer, audience and lifetime are checked,
    /// not the signature). Requires `tls`.
    pub oauth: bool,
}

/// A running Azurite. Dropping it stops the process and removes its working directory.
pub struct Azurite {
    /// `http` or `https`.
    scheme: &'static str,
    watchdog: Mutex<Option<Child>>,
    /// Closing this makes the watchdog kill Azurite.
    lifeline: Mutex<Option<ChildStdin>>,
    blob_port: u16,
    queue_port: u16,
    table_port: u16,
    workdir: PathBuf,
    output: Arc<Mutex<OutputTail>>,
}

impl std::fmt::Debug for Azurite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Azurite")
            .field("blob_port", &self.blob_port)
            .field("queue_port", &self.queue_port)
            .field("table_port", &self.table_port)
            .field("workdir", &self.workdir)
            .finish()
    }
}

/// The last lines Azurite printed, for error messages.
#[derive(Default)]
struct OutputTail(Vec<String>);

impl OutputTail {
    fn push(&mut self, line: String) {
        if self.0.len() == 40 {
            self.0.remove(0);
        }
        self.0.push(line);
    }

    fn text(&self) -> String {
        self.0.join("\n")
    }
}

impl Azurite {
    /// Starts a new private instance (installing Azurite first if needed) without blocking the runtime.
    pub async fn start() -> Result<Azurite, AzuriteError> {
        tokio::task::spawn_blocking(Self::start_blocking)
            .await
            .map_err(|e| AzuriteError(format!("start task failed: {e}")))?
    }

    /// Starts a new private instance, blocking until it listens (or fails, or times out).
    pub fn start_blocking() -> Result<Azurite, AzuriteError> {
        Self::start_with_blocking(&AzuriteOptions::default())
    }

    /// [`Azurite::start`] with options (https, OAuth).
    pub async fn start_with(options: AzuriteOptions) -> Result<Azurite, AzuriteError> {
        tokio::task::spawn_blocking(move || Self::start_with_blocking(&options))
            .await
            .map_err(|e| AzuriteError(format!("start task failed: {e}")))?
    }

    /// [`Azurite::start_blocking`] with options (https, OAuth).
    pub fn start_with_blocking(options: &AzuriteOptions) -> Result<Azurite, AzuriteError> {
        if options.oauth && options.tls.is_none() {
            return Err(AzuriteError(
                "OAuth needs https: give a certificate and key".into(),
            ));
        }
        let mut extra: Vec<std::ffi::OsString> = Vec::new();
        if let Some((cert, key)) = &options.tls {
            extra.extend(["--cert".into(), cert.into(), "--key".into(), key.into()]);
        }
        if options.oauth {
            extra.extend(["--oauth".into(), "basic".into()]);
        }
        let bin = ensure_installed()?;
        let workdir = fresh_workdir()?;
        let spawned = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("azurite-watchdog")
            .arg(&bin)
            .args([
                "--silent",
                "--skipApiVersionCheck",
                "--inMemoryPersistence",
                "--disableProductStyleUrl",
                "--blobPort",
                "0",
                "--queuePort",
                "0",
                "--tablePort",
                "0",
            ])
            .args(&extra)
            .current_dir(&workdir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&workdir);
                return Err(AzuriteError(format!(
                    "cannot run sh to launch {}: {e}",
                    bin.display()
                )));
            }
        };
        let lifeline = child.stdin.take();
        let output = Arc::new(Mutex::new(OutputTail::default()));
        let (ports_tx, ports_rx) = mpsc::channel::<(String, u16)>();
        if let Some(stdout) = child.stdout.take() {
            drain(stdout, output.clone(), Some(ports_tx));
        }
        if let Some(stderr) = child.stderr.take() {
            drain(stderr, output.clone(), None);
        }
        let azurite = Azurite {
            scheme: if options.tls.is_some() {
                "https"
            } else {
                "http"
            },
            watchdog: Mutex::new(Some(child)),
            lifeline: Mutex::new(lifeline),
            blob_port: 0,
            queue_port: 0,
            table_port: 0,
            workdir,
            output,
        };
        azurite.await_ports(ports_rx)
    }

    fn await_ports(
        mut self,
        ports: mpsc::Receiver<(String, u16)>,
    ) -> Result<Azurite, AzuriteError> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while self.blob_port == 0 || self.queue_port == 0 || self.table_port == 0 {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match ports.recv_timeout(remaining) {
                Ok((service, port)) => match service.as_str() {
                    "Blob" => self.blob_port = port,
                    "Queue" => self.queue_port = port,
                    "Table" => self.table_port = port,
                    _ => {}
                },
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(AzuriteError(format!(
                        "no listening ports reported within {STARTUP_TIMEOUT:?}; output:\n{}",
                        self.output_text()
                    )));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed: Azurite exited. Give stderr a moment to be drained.
                    std::thread::sleep(Duration::from_millis(200));
                    return Err(AzuriteError(format!(
                        "Azurite exited during startup; output:\n{}",
                        self.output_text()
                    )));
                }
            }
        }
        Ok(self)
    }

    /// One Azurite shared by the whole process, started on first use. Meant for tests: panics
    /// with the reason if Azurite cannot be started.
    pub fn shared() -> &'static Azurite {
        static SHARED: OnceLock<Result<Azurite, AzuriteError>> = OnceLock::new();
        match SHARED.get_or_init(Azurite::start_blocking) {
            Ok(azurite) => azurite,
            Err(e) => panic!("{e}"),
        }
    }

    pub fn blob_port(&self) -> u16 {
        self.blob_port
    }

    pub fn queue_port(&self) -> u16 {
        self.queue_port
    }

    pub fn table_port(&self) -> u16 {
        self.table_port
    }

    pub fn table_endpoint(&self) -> String {
        format!(
            "{}://127.0.0.1:{}/{DEVELOPMENT_ACCOUNT}",
            self.scheme, self.table_port
        )
    }

    pub fn queue_endpoint(&self) -> String {
        format!(
            "{}://127.0.0.1:{}/{DEVELOPMENT_ACCOUNT}",
            self.scheme, self.queue_port
        )
    }

    pub fn blob_endpoint(&self) -> String {
        format!(
            "{}://127.0.0.1:{}/{DEVELOPMENT_ACCOUNT}",
            self.scheme, self.blob_port
        )
    }

    /// An explicit-endpoints connection string for the well-known development account
    /// (the same form `AzureWebJobsStorage` takes).
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol={};AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_ACCOUNT_KEY};\
             BlobEndpoint={};QueueEndpoint={};TableEndpoint={};",
            self.scheme,
            self.blob_endpoint(),
            self.queue_endpoint(),
            self.table_endpoint()
        )
    }

    /// The account for this instance (a fresh HTTP client each call; clone it to share one).
    pub fn account(&self) -> StorageAccount {
        StorageAccount::parse(&self.connection_string()).expect("our own connection string parses")
    }

    /// Whether the watchdog (and so Azurite) is still running.
    pub fn is_running(&self) -> bool {
        match self.watchdog.lock().unwrap().as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The last lines Azurite printed.
    pub fn output_text(&self) -> String {
        self.output.lock().unwrap().text()
    }

    /// Stops Azurite and waits for it (up to a few seconds, then kills it).
    pub fn stop(&self) {
        // Closing the lifeline makes the watchdog SIGTERM Azurite; the watchdog then exits.
        drop(self.lifeline.lock().unwrap().take());
        let Some(mut child) = self.watchdog.lock().unwrap().take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// Reads a child's output line by line until EOF (so its pipe never fills), keeping the tail and
/// reporting "service is successfully listening at http://host:port" lines.
fn drain(
    stream: impl Read + Send + 'static,
    tail: Arc<Mutex<OutputTail>>,
    ports: Option<mpsc::Sender<(String, u16)>>,
) {
    std::thread::Builder::new()
        .name("azurite-output".into())
        .spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if let Some(tx) = &ports {
                    if let Some(found) = parse_listening_line(&line) {
                        let _ = tx.send(found);
                    }
                }
                tail.lock().unwrap().push(line);
            }
        })
        .expect("spawning a thread");
}

/// `Azurite Table service is successfully listening at http://127.0.0.1:43287` → `("Table", 43287)`.
fn parse_listening_line(line: &str) -> Option<(String, u16)> {
    let rest = line.trim().strip_prefix("Azurite ")?;
    let (service, rest) = rest.split_once(" service is successfully listening at ")?;
    let port = rest
        .trim()
        .rsplit(':')
        .next()?
        .trim_end_matches('/')
        .parse()
        .ok()?;
    Some((service.to_string(), port))
}

/// The directory holding Azurite's `package.json`: `$TABLESCAN_AZURITE_DIR`, else `<project>/azurite`.
pub fn install_dir() -> PathBuf {
    match std::env::var_os(AZURITE_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("azurite"),
    }
}

/// Returns the Azurite executable, running `npm ci` first if it is not installed yet.
pub fn ensure_installed() -> Result<PathBuf, AzuriteError> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = install_dir();
    let bin = dir.join("node_modules").join(".bin").join("azurite");
    require_tool("node", "Node.js (`node`) is required to run Azurite")?;
    if bin.exists() {
        return Ok(bin);
    }
    if !dir.join("package.json").exists() {
        return Err(AzuriteError(format!(
            "{} has no package.json (set {AZURITE_DIR_ENV} to Azurite's directory)",
            dir.display()
        )));
    }
    require_tool("npm", "npm is required to install Azurite")?;
    let output = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| AzuriteError(format!("cannot run npm ci in {}: {e}", dir.display())))?;
    if !output.status.success() || !bin.exists() {
        return Err(AzuriteError(format!(
            "`npm ci` in {} failed ({}):\n{}{}",
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(bin)
}

fn require_tool(tool: &str, why: &str) -> Result<(), AzuriteError> {
    match Command::new(tool)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(AzuriteError(format!(
            "{why}, but `{tool} --version` failed ({status})"
        ))),
        Err(e) => Err(AzuriteError(format!(
            "{why}, but `{tool}` cannot be run: {e}"
        ))),
    }
}

fn fresh_workdir() -> Result<PathBuf, AzuriteError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "tablescan-azurite-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| AzuriteError(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines_give_ports() {
        assert_eq!(
            parse_listening_line(
                "Azurite Table service is successfully listening at http://127.0.0.1:43287"
            ),
            Some(("Table".into(), 43287))
        );
        assert_eq!(
            parse_listening_line(
                "Azurite Queue service is successfully listening at http://0.0.0.0:10001\r"
            ),
            Some(("Queue".into(), 10001))
        );
        assert_eq!(
            parse_listening_line("Azurite Blob service is starting at http://127.0.0.1:0"),
            None
        );
        assert_eq!(parse_listening_line("something else"), None);
    }
}
