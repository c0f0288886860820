//! Queue trigger listener (§7): one per queue function per instance. The listener itself
//! (polling with randomized exponential backoff, at most `batchSize + newBatchThreshold`
//! invocations in flight, visibility renewal, and settlement: delete, release, or poison, as the
//! Storage Queues extension does) is the shipped one, [`crate::run::listen`], which
//! `tablescan run` uses too. This module is what the local host delivers through it: the
//! payload-mode invocation of the handler process over HTTP, its queue outputs, its log lines
//! and its statistics.
//!
//! Invariants:
//! - deliveries are taken only while the handler is up (messages received for a handler that is
//!   (re)starting would sit invisible): a recycled instance's listener waits for its fresh
//!   handler, one that gave up for good stops polling;
//! - only a successful answer's `Logs` are logged under the function's user category, and only
//!   then are its outputs written.

use std::sync::Arc;
use std::time::Duration;

use super::config::{LogLevel, QueuesOptions};
use super::invoke::Invoker;
use super::log::{user_category, HostLog};
use super::outputs::{effective_outputs, write_queue_outputs, QueueTarget, ResolvedOutput};
use super::payload::{queue_payload, QueueItem, SysData};
use super::stats::InvocationStats;
pub use crate::run::listen::{settlement, Backoff, Settlement, MIN_POLLING_INTERVAL};
use crate::run::listen::{Deliver, Level, Listener, Settings};
use crate::storage::{QueueStore, ReceivedMessage};

/// Visibility timeout of received messages (fixed in the extension), renewed at half-life.
pub const RECEIVE_VISIBILITY: Duration = Duration::from_secs(600);

/// The listener of one queue function on one instance.
pub type QueueListener<S> = Listener<S, HostDelivery<S>>;

/// How the local host delivers one queue function's messages: to its handler process.
pub struct HostDelivery<S> {
    pub function: String,
    /// The queue its messages come from (for its log lines).
    pub queue: String,
    pub binding: String,
    pub binary: bool,
    pub outputs: Arc<Vec<ResolvedOutput<S>>>,
    pub invoker: Arc<Invoker>,
    pub log: HostLog,
    pub label: String,
    pub message_encoding: crate::storage::MessageEncoding,
    /// Where each invocation's duration is recorded.
    pub stats: Arc<InvocationStats>,
}

/// What one queue function's listener on one instance is made of.
pub struct ListenerSpec<S> {
    pub source: Arc<QueueTarget<S>>,
    pub poison: Option<Arc<QueueTarget<S>>>,
    pub options: QueuesOptions,
    pub new_batch_threshold: u32,
    pub receive_visibility: Duration,
    pub delivery: HostDelivery<S>,
}

/// The listener of `spec`: the host abandons what is still running at shutdown, and its
/// messages reappear after the receive visibility, as on Azure.
pub fn listener<S: QueueStore>(spec: ListenerSpec<S>) -> Arc<QueueListener<S>> {
    let options = spec.options;
    Arc::new(Listener {
        tag: format!("{} [{}]", spec.delivery.label, spec.delivery.function),
        source: spec.source,
        poison: spec.poison,
        settings: Settings {
            batch_size: options.batch_size.min(32),
            new_batch_threshold: spec.new_batch_threshold,
            max_polling_interval: options.max_polling_interval,
            visibility_timeout: options.visibility_timeout,
            max_dequeue_count: options.max_dequeue_count,
            message_encoding: options.message_encoding,
            receive_visibility: spec.receive_visibility,
            release_abandoned: false,
        },
        slots: None,
        deliver: spec.delivery,
    })
}

impl<S: QueueStore> Deliver for HostDelivery<S> {
    /// The handler is up: a handler the host gave up on takes no work until its instance is
    /// recycled.
    async fn ready(&self) -> Result<(), String> {
        loop {
            match self.invoker.worker.ready().await {
                Ok(_) => return Ok(()),
                Err(why) if !self.invoker.worker.recycled().await => return Err(why),
                Err(_) => {}
            }
        }
    }

    async fn deliver(&self, message: &ReceivedMessage, bytes: Vec<u8>) -> Result<(), String> {
        let item = QueueItem::from_bytes(bytes, self.binary);
        let invocation_id = uuid::Uuid::new_v4().to_string();
        let tag = format!("{} [{}] [{invocation_id}]", self.label, self.function);
        let sys = SysData::now(&self.function);
        let body = queue_payload(&self.binding, &item, message, &sys);
        self.log.info(format!(
            "{tag} Executing '{}' (queue {}, message {}, DequeueCount {})",
            self.function, self.queue, message.id, message.dequeue_count
        ));
        let started = std::time::Instant::now();
        let outcome = self.invoke(&invocation_id, body, &tag).await;
        self.stats
            .record(&self.function, started.elapsed(), outcome.is_ok());
        let elapsed = started.elapsed().as_millis();
        match &outcome {
            Ok(()) => self.log.info(format!(
                "{tag} Executed '{}' (Succeeded, {elapsed} ms)",
                self.function
            )),
            Err(why) => self.log.error(format!(
                "{tag} Executed '{}' (Failed, {elapsed} ms): {why}",
                self.function
            )),
        }
        outcome
    }

    fn log(&self, level: Level, line: String) {
        match level {
            Level::Info => self.log.info(line),
            Level::Warn => self.log.warn(line),
            Level::Error => self.log.error(line),
        }
    }
}

impl<S: QueueStore> HostDelivery<S> {
    /// Invokes the function and writes its queue outputs.
    async fn invoke(&self, invocation_id: &str, body: String, tag: &str) -> Result<(), String> {
        let result = self
            .invoker
            .invoke_payload(&self.function, invocation_id, body)
            .await
            .map_err(|e| e.to_string())?;
        // Only a successful answer's Logs are read (§4.1), under the function's user category.
        let category = user_category(&self.function);
        for line in &result.logs {
            self.log
                .category(LogLevel::Information, &category, tag, line);
        }
        let values = effective_outputs(&self.outputs, &result);
        write_queue_outputs(&self.outputs, &values, self.message_encoding)
            .await
            .map(|_| ())
    }
}

/// `<queue>-poison`, unless the queue is itself a poison queue or the name would be invalid.
pub fn poison_queue_name(queue: &str) -> Option<String> {
    if queue.ends_with("-poison") {
        return None;
    }
    let name = format!("{queue}-poison");
    super::config::validate_queue_name(&name).ok().map(|_| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poison_names() {
        assert_eq!(
            poison_queue_name("orders").as_deref(),
            Some("orders-poison")
        );
        assert_eq!(poison_queue_name("orders-poison"), None);
        assert_eq!(poison_queue_name(&"a".repeat(60)), None);
    }
}
