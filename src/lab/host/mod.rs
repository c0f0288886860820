//! `tablescan host`: a local stand-in for the Azure Functions host (v4) running a staged custom
//! handler app. A development and test tool, not a production host.
//!
//! It knows nothing about scans: it reads `host.json` and `*/function.json`, launches
//! `customHandler.description.defaultExecutablePath`, and talks the custom-handler protocol
//! (see `docs/custom-handler-protocol.md` §1-§7, §10; the § numbers in this module tree are that page's):
//! - HTTP triggers on `127.0.0.1:{port}/{routePrefix}/{route}`, proxied, forwarded or wrapped in
//!   a payload;
//! - queue triggers through [`QueueStore`], with the Storage Queues extension's polling, batching,
//!   retry and poison rules;
//! - timer triggers on their NCRONTAB schedule, on every instance ([`timer`], §12);
//! - handler supervision: readiness, restarts, function timeouts;
//! - logging as the host does it for a custom handler (§11): `Logs` of successful invocations,
//!   the handler's stdout and stderr, each under the host's category and level, filtered by
//!   host.json `logging.logLevel`.
//!
//! Local choices where the real host depends on the environment:
//! - `maxPollingInterval` defaults to 2 s (Core Tools' development value; Azure uses 1 min);
//! - `newBatchThreshold` defaults to `batchSize / 2`, the Consumption-plan value (the host
//!   multiplies by the core count on other plans; set `WEBSITE_SKU` to a non-`Dynamic` value to get that);
//! - `functionTimeout` follows the Consumption plan: default 5 min, 1 s to 10 min;
//! - `authLevel` is not enforced (like Core Tools, all local requests are accepted);
//! - the local host's own diagnostic lines (`Executing`/`Executed`, settlements, restarts) are
//!   always shown, whatever host.json's `logging.logLevel` says; a proxied response is buffered,
//!   not streamed;
//! - bindings other than httpTrigger/http/queueTrigger/queue/timerTrigger, retry policies and a fixed
//!   `customHandler.port` are rejected with a clear error.

pub mod config;
pub mod http;
mod instance;
pub mod invoke;
pub mod log;
pub mod outputs;
pub mod payload;
pub mod queue;
mod resolve;
pub mod route;
pub mod stats;
pub mod timer;
pub mod timespan;
pub mod worker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::config::{load_app, read_local_settings, AppConfig, AppSettings, ConfigError, HttpMode};
use self::http::Front;
use self::instance::{start_instance, stop_instance, InstanceHandle, Shared};
use self::log::HostLog;
use self::resolve::{resolve_triggers, QueueFunction};
use self::stats::{FunctionStats, InvocationStats};
use crate::storage::connection::{ConnectionSettings, StorageAccount};
use crate::storage::request_counts::RequestCounters;
use crate::storage::QueueStore;

/// `tablescan host` command-line arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct HostArgs {
    /// The staged function app folder (host.json, <Function>/function.json, the handler).
    #[arg(long, value_name = "DIR")]
    pub app_dir: PathBuf,
    /// Port of the HTTP front (HTTP triggers at http://127.0.0.1:PORT/api/...).
    #[arg(long, default_value_t = 7071)]
    pub port: u16,
    /// Number of independent host instances (each with its own handler and queue listeners).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub instances: u16,
    /// local.settings.json to read app settings from [default: <app-dir>/local.settings.json if present].
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
}

#[derive(Debug)]
pub enum HostError {
    /// host.json, function.json or local.settings.json is invalid.
    Config(ConfigError),
    /// An app setting the app needs is missing or invalid.
    Settings(String),
    /// Binding the HTTP port and similar.
    Io(String),
    /// A handler failed too often; the host gave up.
    HandlerFailed(String),
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Config(e) => write!(f, "invalid function app: {e}"),
            HostError::Settings(e) => write!(f, "app settings: {e}"),
            HostError::Io(e) => f.write_str(e),
            HostError::HandlerFailed(e) => write!(f, "handler failed: {e}"),
        }
    }
}

impl std::error::Error for HostError {}

impl From<ConfigError> for HostError {
    fn from(e: ConfigError) -> Self {
        HostError::Config(e)
    }
}

/// Programmatic host configuration (tests, demo).
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub app_dir: PathBuf,
    /// HTTP front address; port 0 picks a free one.
    pub listen: SocketAddr,
    pub instances: usize,
    /// local.settings.json; `None` = `<app_dir>/local.settings.json` if it exists.
    pub settings_file: Option<PathBuf>,
    /// Whether to inherit the process environment as app settings (the real host does).
    pub inherit_env: bool,
    /// Extra app settings, winning over everything else (tests use them instead of the
    /// process-wide environment).
    pub settings: BTreeMap<String, String>,
    /// How long shutdown waits for invocations in flight.
    pub drain_timeout: Duration,
    /// Keep log lines in memory for [`RunningHost::log_lines`].
    pub capture_logs: bool,
    /// How long an instance whose handler failed too often stays down before it is recycled
    /// ([`worker::RECYCLE_DELAY`]).
    pub recycle_delay: Duration,
    /// How long a received message stays invisible ([`queue::RECEIVE_VISIBILITY`], fixed at 10
    /// minutes in the extension), renewed at half-life while its invocation runs. Tests shorten
    /// it to see, within their bound, the platform bring back a message no one settled (an
    /// invocation abandoned at shutdown, or failed on a queue without a poison queue).
    pub receive_visibility: Duration,
}

impl HostConfig {
    pub fn new(app_dir: impl Into<PathBuf>) -> Self {
        HostConfig {
            app_dir: app_dir.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7071)),
            instances: 1,
            settings_file: None,
            inherit_env: true,
            settings: BTreeMap::new(),
            drain_timeout: Duration::from_secs(30),
            capture_logs: false,
            recycle_delay: worker::RECYCLE_DELAY,
            receive_visibility: queue::RECEIVE_VISIBILITY,
        }
    }
}

/// A started host. Dropping it without [`RunningHost::shutdown`] kills the handlers (kill on drop)
/// but skips the drain.
pub struct RunningHost {
    addr: SocketAddr,
    instances: Vec<Arc<InstanceHandle>>,
    server: Option<JoinHandle<()>>,
    server_stop: watch::Sender<bool>,
    drain: Duration,
    log: HostLog,
    app: Arc<AppConfig>,
    stats: Arc<InvocationStats>,
}

pub struct Host;

impl Host {
    /// Loads the app, starts one handler and one set of queue listeners per instance and the
    /// HTTP front. `connect` turns a storage connection string into a queue store; it is only
    /// called for connections that queue bindings use.
    pub async fn start<S, F>(config: HostConfig, connect: F) -> Result<RunningHost, HostError>
    where
        S: QueueStore,
        F: Fn(&ConnectionSettings) -> Result<S, String>,
    {
        let app = Arc::new(load_app(&config.app_dir)?);
        let log = HostLog::new(config.capture_logs, app.logging.clone());
        let settings = Arc::new(load_settings(&config, &app)?);
        let triggers = resolve_triggers(&app, &settings, connect)?;
        let (timers, timer_errors) = timer::resolve_timers(&app, &settings);
        let (listener, addr) = bind_http(config.listen).await?;
        let stats = Arc::new(InvocationStats::default());
        let shared = Shared {
            app: &app,
            settings: &settings,
            queues: &triggers.queues,
            new_batch_threshold: app
                .queues
                .effective_new_batch_threshold(settings.get("WEBSITE_SKU")),
            stats: &stats,
            log: &log,
            drain_timeout: config.drain_timeout,
            recycle_delay: config.recycle_delay,
            receive_visibility: config.receive_visibility,
        };
        let instances: Vec<_> = (0..config.instances.max(1))
            .map(|i| Arc::new(start_instance(i, &shared)))
            .collect();
        let front = Arc::new(Front {
            route_prefix: app.route_prefix.clone(),
            routes: triggers.routes,
            instances: instances.iter().map(|i| i.front.clone()).collect(),
            next: AtomicUsize::new(0),
            encoding: app.queues.message_encoding,
            log: log.clone(),
        });
        log_triggers(&log, addr, &front, &triggers.queues);
        for e in timer_errors {
            log.error(format!("a function is in error and will not run: {e}"));
        }
        start_timers(&log, &instances, timers);
        let (server, server_stop) = serve_http(listener, front.router());
        Ok(RunningHost {
            addr,
            instances,
            server: Some(server),
            server_stop,
            drain: config.drain_timeout,
            log,
            app,
            stats,
        })
    }
}

/// Starts every timer function on every instance (see [`timer`] for why every one).
fn start_timers(
    log: &HostLog,
    instances: &[Arc<InstanceHandle>],
    timers: Vec<timer::TimerFunction>,
) {
    for t in timers.into_iter().map(Arc::new) {
        log.info(format!("{}: timerTrigger {:?}", t.function, t.schedule));
        for (i, instance) in instances.iter().enumerate() {
            tokio::spawn(timer::run_timer(
                t.clone(),
                instance.front.invoker.clone(),
                log.clone(),
                format!("[i{i}]"),
                instance.stop.subscribe(),
            ));
        }
    }
}

/// Binds the HTTP front's address (port 0 picks a free port).
async fn bind_http(listen: SocketAddr) -> Result<(TcpListener, SocketAddr), HostError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| HostError::Io(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| HostError::Io(e.to_string()))?;
    Ok((listener, addr))
}

/// Serves the HTTP front until the returned sender sends `true`.
fn serve_http(
    listener: TcpListener,
    router: axum::Router,
) -> (JoinHandle<()>, watch::Sender<bool>) {
    let (server_stop, mut server_stop_rx) = watch::channel(false);
    let server = tokio::spawn(async move {
        let shutdown = async move {
            let _ = server_stop_rx.wait_for(|s| *s).await;
        };
        // The caller's address is the proxy's `X-Forwarded-For` (§5.2).
        let service = router.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, service)
            .with_graceful_shutdown(shutdown)
            .await;
    });
    (server, server_stop)
}

/// One line per trigger: HTTP routes with their URL and mode, then queue triggers.
fn log_triggers<S>(log: &HostLog, addr: SocketAddr, front: &Front<S>, queues: &[QueueFunction<S>]) {
    let prefix = if front.route_prefix.is_empty() {
        String::new()
    } else {
        format!("/{}", front.route_prefix)
    };
    for r in &front.routes {
        let methods = r
            .methods
            .as_ref()
            .map(|m| m.join(","))
            .unwrap_or_else(|| "all methods".into());
        let route = r.function.trigger_route();
        log.info(format!(
            "{}: [{methods}] http://{addr}{prefix}/{route} ({})",
            r.function.name,
            match r.mode {
                HttpMode::Forward => "forwarded",
                HttpMode::Proxy => "proxied",
                HttpMode::Payload => "payload",
            }
        ));
    }
    for q in queues {
        log.info(format!(
            "{}: queueTrigger on {}",
            q.function, q.source.queue
        ));
    }
}

impl Host {
    /// [`Host::start`] with Azure Storage (or Azurite) queues from the connection strings in app settings.
    pub async fn start_azure(config: HostConfig) -> Result<RunningHost, HostError> {
        let counters = Arc::new(RequestCounters::new());
        Host::start(config, move |connection| {
            Ok(StorageAccount::new(connection.clone()).queue_store(counters.clone()))
        })
        .await
    }
}

/// `tablescan host`: runs the app until Ctrl-C / SIGTERM (or until a handler fails too often).
pub async fn run_host(args: HostArgs) -> Result<(), HostError> {
    // The CLI may already have a subscriber; otherwise show the host's log at info level, the
    // handler's forwarded lines among it, scrubbed of credentials (src/redact.rs).
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = crate::redact::log_subscriber(std::io::stdout, "info").try_init();
    let mut config = HostConfig::new(&args.app_dir);
    config.listen = SocketAddr::from(([127, 0, 0, 1], args.port));
    config.instances = usize::from(args.instances);
    config.settings_file = args.settings;
    let host = Host::start_azure(config).await?;
    tracing::info!(
        target: "tablescan::lab::host",
        "host running with {} instance(s) on http://{} (a local development host); Ctrl-C to stop",
        host.instance_count(),
        host.http_addr()
    );
    // An instance whose handler fails too often is recycled (worker.rs), as the platform
    // does; the process and the other instances keep running until stopped.
    shutdown_signal().await;
    host.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn load_settings(config: &HostConfig, app: &AppConfig) -> Result<AppSettings, HostError> {
    let file = match &config.settings_file {
        Some(f) => Some(f.clone()),
        None => Some(app.root.join("local.settings.json")).filter(|f| f.is_file()),
    };
    let local = match file {
        Some(f) => read_local_settings(&f)?,
        None => BTreeMap::new(),
    };
    let env: Vec<(String, String)> = if config.inherit_env {
        std::env::vars().collect()
    } else {
        Vec::new()
    };
    let mut settings = AppSettings::new(env, local);
    for (k, v) in &config.settings {
        settings.set(k.clone(), v.clone());
    }
    Ok(settings)
}

impl RunningHost {
    /// The HTTP front's address.
    pub fn http_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn app(&self) -> &AppConfig {
        &self.app
    }

    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// Current handler process id per instance (`None` while it is (re)starting or stopped).
    pub fn handler_pids(&self) -> Vec<Option<u32>> {
        self.instances.iter().map(|i| i.worker.pid()).collect()
    }

    /// Handler generation per instance: it increments on every (re)start.
    pub fn handler_generations(&self) -> Vec<u64> {
        self.instances
            .iter()
            .map(|i| i.worker.state().generation)
            .collect()
    }

    /// Waits until every running instance's handler answered readiness.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), HostError> {
        let all = async {
            for i in &self.instances {
                if !i.stopped.load(Ordering::SeqCst) {
                    i.worker.ready().await.map_err(HostError::HandlerFailed)?;
                }
            }
            Ok(())
        };
        tokio::time::timeout(timeout, all).await.map_err(|_| {
            HostError::HandlerFailed(format!("handlers not ready within {timeout:?}"))
        })?
    }

    /// Stops one instance: its listeners stop polling and drain, then its handler is stopped.
    /// The others keep running (scale-in).
    pub async fn stop_instance(&self, index: usize) {
        let Some(instance) = self.instances.get(index) else {
            return;
        };
        stop_instance(instance, &self.log, index).await;
    }

    /// Resolves when a handler has failed too often (the host gave up on its instance, which is
    /// recycled after the recycle delay).
    pub async fn failed(&self) -> HostError {
        let waits = self.instances.iter().map(|i| Box::pin(i.worker.failed()));
        let (why, _, _) = futures::future::select_all(waits).await;
        HostError::HandlerFailed(why)
    }

    /// Queue-triggered invocations so far, by function (all instances together).
    pub fn invocation_stats(&self) -> BTreeMap<String, FunctionStats> {
        self.stats.snapshot()
    }

    /// Log lines kept when [`HostConfig::capture_logs`] is on.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lines()
    }

    /// The host's log, to read its lines (see [`RunningHost::log_lines`]) while or after
    /// [`RunningHost::shutdown`] runs.
    pub fn log(&self) -> HostLog {
        self.log.clone()
    }

    /// Stops polling, waits (bounded) for invocations in flight, stops the handlers.
    pub async fn shutdown(mut self) {
        self.log
            .info("shutting down: no new work is taken; waiting for invocations in flight");
        let _ = self.server_stop.send(true);
        let stops = self
            .instances
            .iter()
            .enumerate()
            .map(|(i, inst)| stop_instance(inst, &self.log, i));
        futures::future::join_all(stops).await;
        if let Some(server) = self.server.take() {
            // HTTP requests in flight finished or failed when the handlers stopped.
            if tokio::time::timeout(self.drain, server).await.is_err() {
                self.log.warn("HTTP front did not stop in time");
            }
        }
        self.log.info("host stopped");
    }
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        let _ = self.server_stop.send(true);
        for i in &self.instances {
            let _ = i.stop.send(true);
        }
    }
}

/// A queue store that cannot exist: for apps with HTTP triggers only, where no storage
/// connection is needed (`Host::start::<NoStorage, _>(config, |_| Err(..))`).
pub enum NoStorage {}

impl QueueStore for NoStorage {
    async fn create_queue(&self, _: &str) -> crate::storage::StorageResult<()> {
        match *self {}
    }
    async fn delete_queue(&self, _: &str) -> crate::storage::StorageResult<bool> {
        match *self {}
    }
    async fn put_message(
        &self,
        _: &str,
        _: &str,
        _: Duration,
    ) -> crate::storage::StorageResult<()> {
        match *self {}
    }
    async fn put_message_never_expiring(
        &self,
        _: &str,
        _: &str,
    ) -> crate::storage::StorageResult<()> {
        match *self {}
    }
    async fn get_messages(
        &self,
        _: &str,
        _: u8,
        _: Duration,
    ) -> crate::storage::StorageResult<Vec<crate::storage::ReceivedMessage>> {
        match *self {}
    }
    async fn delete_message(&self, _: &str, _: &str, _: &str) -> crate::storage::StorageResult<()> {
        match *self {}
    }
    async fn update_message(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: Duration,
        _: Option<&str>,
    ) -> crate::storage::StorageResult<String> {
        match *self {}
    }
    async fn approximate_count(&self, _: &str) -> crate::storage::StorageResult<u64> {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::HostArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        host: HostArgs,
    }

    #[test]
    fn host_args_defaults_and_limits() {
        let cli = Cli::try_parse_from(["t", "--app-dir", "staged"]).unwrap();
        assert_eq!(cli.host.app_dir, std::path::PathBuf::from("staged"));
        assert_eq!(
            (cli.host.port, cli.host.instances, cli.host.settings),
            (7071, 1, None)
        );
        let cli = Cli::try_parse_from([
            "t",
            "--app-dir",
            "a",
            "--port",
            "0",
            "--instances",
            "3",
            "--settings",
            "s.json",
        ])
        .unwrap();
        assert_eq!((cli.host.port, cli.host.instances), (0, 3));
        assert!(Cli::try_parse_from(["t", "--app-dir", "a", "--instances", "0"]).is_err());
        assert!(Cli::try_parse_from(["t"]).is_err());
    }
}
