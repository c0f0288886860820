//! `tablescan handler`: the custom-handler process the Functions host starts.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::storage::blob::BlobRequestCounters;
use crate::storage::connection::StorageAccount;
use crate::storage::request_counts::RequestCounters;
use crate::storage::stores::AzureStores;

use super::config::Config;
use super::drivers;
use super::server;
use super::state::AppState;

/// Diagnostics at `WARN` and above go to stderr, the rest to stdout: the host logs a custom
/// handler's stdout at Information and its stderr at Error, or at Warning when the line says
/// "warn" — which a `WARN` line does (docs/custom-handler-protocol.md §11). What operators
/// query is written by [`super::observe`], whatever `RUST_LOG` says. No level of `RUST_LOG` lets
/// a credential through: every line is scrubbed and the request-dumping targets are capped
/// ([`crate::redact::log_subscriber`]).
pub fn init_logging() {
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let writer = std::io::stderr
        .with_max_level(tracing::Level::WARN)
        .or_else(std::io::stdout);
    let _ = crate::redact::log_subscriber(writer, "info").try_init();
}

/// Reads the app settings, connects to storage and serves until SIGTERM / Ctrl-C.
pub async fn serve_from_env() -> Result<(), String> {
    init_logging();
    let config = Config::from_env().map_err(|e| e.to_string())?;
    let listener = TcpListener::bind(("127.0.0.1", config.port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", config.port))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%address, ?config, "tablescan handler listening");
    let state = azure_state(config);
    server::run(listener, state, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

/// The app on the storage accounts of `config`'s connections, with every driver: what the
/// handler serves, and what `tablescan run` runs in-process.
pub fn azure_state(config: Config) -> Arc<AppState<AzureStores>> {
    let counters = Arc::new(RequestCounters::new());
    let blob_counters = Arc::new(BlobRequestCounters::new());
    let mut tables = BTreeMap::new();
    let mut queues = BTreeMap::new();
    let mut blobs = BTreeMap::new();
    for (name, settings) in &config.connections {
        let account = StorageAccount::new(settings.clone());
        tables.insert(name.clone(), account.table_store(counters.clone()));
        queues.insert(name.clone(), account.queue_store(counters.clone()));
        // A connection without a blob endpoint fails only if a scan uses its blobs.
        let store = account.blob_store(blob_counters.clone());
        blobs.insert(name.clone(), store);
    }
    AppState::<AzureStores>::with_connections(config, tables, queues, blobs, drivers::registry())
}

/// Resolves on Ctrl-C or SIGTERM (what the host sends when it stops or restarts the handler).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
