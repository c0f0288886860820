//! One host instance: a handler process and one queue listener per queue function, as on one
//! scaled-out machine.
//!
//! Invariant: an instance stops once (listeners drain first, then the handler stops); the HTTP
//! front stops routing to it before that starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::config::{AppConfig, AppSettings};
use super::http::FrontInstance;
use super::invoke::Invoker;
use super::log::HostLog;
use super::queue::{listener, HostDelivery, ListenerSpec};
use super::resolve::QueueFunction;
use super::stats::InvocationStats;
use super::worker::{Worker, WorkerSpec, WorkerStatus};
use crate::storage::QueueStore;

pub(super) struct InstanceHandle {
    pub worker: Arc<Worker>,
    pub front: Arc<FrontInstance>,
    pub stop: watch::Sender<bool>,
    pub listeners: tokio::sync::Mutex<Vec<JoinHandle<()>>>,
    pub stopped: AtomicBool,
}

/// What every instance shares.
pub(super) struct Shared<'a, S> {
    pub app: &'a Arc<AppConfig>,
    pub settings: &'a Arc<AppSettings>,
    pub queues: &'a [QueueFunction<S>],
    pub new_batch_threshold: u32,
    pub stats: &'a Arc<InvocationStats>,
    pub log: &'a HostLog,
    pub drain_timeout: Duration,
    pub recycle_delay: Duration,
    pub receive_visibility: Duration,
}

/// Starts instance `index`: its handler and its queue listeners.
pub(super) fn start_instance<S: QueueStore>(
    index: usize,
    shared: &Shared<'_, S>,
) -> InstanceHandle {
    let label = format!("[i{index}]");
    let worker = Worker::start(WorkerSpec {
        app: shared.app.clone(),
        settings: shared.settings.clone(),
        label: label.clone(),
        log: shared.log.clone(),
        recycle_delay: shared.recycle_delay,
    });
    let invoker = Arc::new(Invoker::new(
        worker.clone(),
        shared.app.function_timeout,
        shared.log.clone(),
        label.clone(),
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let listeners = shared
        .queues
        .iter()
        .map(|q| {
            let listener = listener(ListenerSpec {
                source: q.source.clone(),
                poison: q.poison.clone(),
                options: shared.app.queues.clone(),
                new_batch_threshold: shared.new_batch_threshold,
                receive_visibility: shared.receive_visibility,
                delivery: HostDelivery {
                    function: q.function.clone(),
                    queue: q.source.queue.clone(),
                    binding: q.binding.clone(),
                    binary: q.binary,
                    outputs: q.outputs.clone(),
                    invoker: invoker.clone(),
                    log: shared.log.clone(),
                    label: label.clone(),
                    message_encoding: shared.app.queues.message_encoding,
                    stats: shared.stats.clone(),
                },
            });
            tokio::spawn(listener.run(stop_rx.clone(), shared.drain_timeout))
        })
        .collect();
    InstanceHandle {
        worker,
        front: Arc::new(FrontInstance {
            invoker,
            stopped: AtomicBool::new(false),
        }),
        stop: stop_tx,
        listeners: tokio::sync::Mutex::new(listeners),
        stopped: AtomicBool::new(false),
    }
}

/// Stops polling, waits for the listeners to drain, stops the handler. Idempotent.
pub(super) async fn stop_instance(instance: &InstanceHandle, log: &HostLog, index: usize) {
    if instance.stopped.swap(true, Ordering::SeqCst) {
        return;
    }
    instance.front.stopped.store(true, Ordering::SeqCst);
    let _ = instance.stop.send(true);
    let listeners: Vec<_> = std::mem::take(&mut *instance.listeners.lock().await);
    for l in listeners {
        let _ = l.await;
    }
    instance.worker.stop().await;
    if !matches!(instance.worker.state().status, WorkerStatus::Failed(_)) {
        log.info(format!("[i{index}] instance stopped"));
    }
}
