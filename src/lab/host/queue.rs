//! Queue trigger listener (§7): one per queue function per instance. Polls with randomized
//! exponential backoff, keeps at most `batchSize + newBatchThreshold` invocations in flight,
//! and settles each message (delete, release, or poison) as the Storage Queues extension does.
//!
//! Invariants:
//! - a new batch is fetched only while at most `newBatchThreshold` invocations are in flight, so
//!   never more than `batchSize + newBatchThreshold` run at once;
//! - a failed delivery is settled by [`settlement`] alone: released for `visibilityTimeout`,
//!   moved to the poison queue on its last allowed delivery, or, with no poison queue possible,
//!   left invisible for the rest of its receive visibility (never retried in a fast loop);
//! - every delay here (polling backoff, visibility renewal, drain) runs on tokio's clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{watch, Notify};
use tokio::task::{JoinHandle, JoinSet};

use super::config::LogLevel;
use super::config::QueuesOptions;
use super::invoke::Invoker;
use super::log::{user_category, HostLog};
use super::outputs::{effective_outputs, write_queue_outputs, QueueTarget, ResolvedOutput};
use super::payload::{queue_payload, QueueItem, SysData};
use super::stats::InvocationStats;
use crate::storage::{QueueStore, ReceivedMessage};

/// Visibility timeout of received messages (fixed in the extension), renewed at half-life.
pub const RECEIVE_VISIBILITY: Duration = Duration::from_secs(600);
/// Minimum polling interval of the backoff.
pub const MIN_POLLING_INTERVAL: Duration = Duration::from_millis(100);

/// `RandomizedExponentialBackoffStrategy`: grows from the minimum to the maximum with ±20% jitter
/// while queues are empty, resets when messages are found.
pub struct Backoff {
    min: Duration,
    max: Duration,
    exponent: u32,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            exponent: 0,
        }
    }

    pub fn reset(&mut self) {
        self.exponent = 0;
    }

    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(rand::thread_rng().gen_range(0.8..1.2))
    }

    /// The next delay with the jitter factor given (0.8 to 1.2 in [`Backoff::next_delay`]):
    /// `min + min * (2^n - 1) * jitter`, capped at `max`, `n` counting empty polls since a reset.
    pub fn next_delay_with(&mut self, jitter: f64) -> Duration {
        self.exponent = (self.exponent + 1).min(30);
        let delta = self.min.as_secs_f64() * ((1u64 << self.exponent) - 1) as f64;
        let secs = (self.min.as_secs_f64() + delta * jitter).min(self.max.as_secs_f64());
        Duration::from_secs_f64(secs)
    }
}

/// What becomes of a message whose invocation failed (see the invariants at the top).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Visible again after this long (`visibilityTimeout`), for another delivery.
    Release(Duration),
    /// Moved to the poison queue: its last allowed delivery failed.
    Poison,
    /// Left as it is: no poison queue is possible, so it stays invisible until its receive
    /// visibility ends, then comes back.
    KeepInvisible,
}

/// How a failed delivery with `dequeue_count` is settled.
pub fn settlement(
    dequeue_count: u64,
    max_dequeue_count: u64,
    has_poison_queue: bool,
    visibility_timeout: Duration,
) -> Settlement {
    if !has_poison_queue {
        Settlement::KeepInvisible
    } else if dequeue_count >= max_dequeue_count {
        Settlement::Poison
    } else {
        Settlement::Release(visibility_timeout)
    }
}

pub struct QueueListener<S> {
    pub function: String,
    pub binding: String,
    pub binary: bool,
    pub source: Arc<QueueTarget<S>>,
    /// `None` when no poison queue is possible (name ends with `-poison` or would be too long).
    pub poison: Option<Arc<QueueTarget<S>>>,
    pub outputs: Arc<Vec<ResolvedOutput<S>>>,
    pub options: QueuesOptions,
    pub new_batch_threshold: u32,
    pub invoker: Arc<Invoker>,
    pub log: HostLog,
    pub label: String,
    /// Where each invocation's duration is recorded.
    pub stats: Arc<InvocationStats>,
    /// How long a received message stays invisible ([`RECEIVE_VISIBILITY`] but in tests).
    pub receive_visibility: Duration,
}

/// Counts invocations in flight and wakes the poller when one finishes.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    changed: Notify,
}

impl<S: QueueStore> QueueListener<S> {
    /// Polls until `stop` turns true, then waits up to `drain` for invocations in flight.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>, drain: Duration) {
        let in_flight = Arc::new(InFlight::default());
        let mut tasks = JoinSet::new();
        let mut backoff = Backoff::new(MIN_POLLING_INTERVAL, self.options.max_polling_interval);
        let mut failing = false;
        let queue = &self.source.queue;
        self.log.info(format!(
            "{} [{}] listening on queue {queue}",
            self.label, self.function
        ));
        'poll: loop {
            // `WaitForNewBatchThreshold`: fetch again only when in-flight work is down to the threshold.
            loop {
                if *stop.borrow() {
                    break 'poll;
                }
                let notified = in_flight.changed.notified();
                if in_flight.count.load(Ordering::SeqCst) <= self.new_batch_threshold as usize {
                    break;
                }
                tokio::select! {
                    _ = notified => {}
                    r = stop.changed() => if r.is_err() { break 'poll },
                }
            }
            while tasks.try_join_next().is_some() {}
            // Poll only while the handler is up: messages received for a handler that is
            // (re)starting would sit invisible, and a handler the host gave up on takes no work.
            tokio::select! {
                ready = self.invoker.worker.ready() => {
                    if let Err(why) = ready {
                        // An instance that gave up is recycled: poll again once it is back.
                        if self.invoker.worker.recycled().await {
                            continue 'poll;
                        }
                        self.log.warn(format!("{} [{}] stopped polling {queue}: {why}", self.label, self.function));
                        break 'poll;
                    }
                }
                r = stop.changed() => if r.is_err() { break 'poll } else { continue 'poll },
            }
            let batch = self.options.batch_size.min(32) as u8;
            let delay = match self
                .source
                .store
                .get_messages(queue, batch, self.receive_visibility)
                .await
            {
                Ok(messages) if !messages.is_empty() => {
                    failing = false;
                    backoff.reset();
                    self.spawn_invocations(messages, &in_flight, &mut tasks);
                    continue;
                }
                Ok(_) => {
                    failing = false;
                    backoff.next_delay()
                }
                Err(e) => {
                    // A missing queue is polled like an empty one; say so once per streak.
                    if !failing {
                        let level = if e.is_not_found() {
                            "does not exist (yet)"
                        } else {
                            "cannot be read"
                        };
                        self.log.warn(format!(
                            "{} [{}] queue {queue} {level}: {e}",
                            self.label, self.function
                        ));
                        failing = true;
                    }
                    backoff.next_delay()
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                r = stop.changed() => if r.is_err() { break 'poll },
            }
        }
        self.drain(tasks, &in_flight, drain).await;
    }

    /// One task per received message, counted in flight until it settles.
    fn spawn_invocations(
        self: &Arc<Self>,
        messages: Vec<ReceivedMessage>,
        in_flight: &Arc<InFlight>,
        tasks: &mut JoinSet<()>,
    ) {
        for message in messages {
            in_flight.count.fetch_add(1, Ordering::SeqCst);
            let this = self.clone();
            let in_flight = in_flight.clone();
            tasks.spawn(async move {
                this.process(message).await;
                in_flight.count.fetch_sub(1, Ordering::SeqCst);
                in_flight.changed.notify_waiters();
            });
        }
    }

    /// After polling stopped: waits up to `drain` for the invocations in flight, then abandons
    /// the rest (their messages reappear after the visibility timeout).
    async fn drain(&self, mut tasks: JoinSet<()>, in_flight: &InFlight, drain: Duration) {
        let pending = in_flight.count.load(Ordering::SeqCst);
        if pending > 0 {
            self.log.info(format!(
                "{} [{}] stopped polling; waiting up to {drain:?} for {pending} invocation(s) in flight",
                self.label, self.function
            ));
        }
        let drained =
            tokio::time::timeout(drain, async { while tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            self.log.warn(format!(
                "{} [{}] {} invocation(s) still running at shutdown were abandoned; their messages reappear after the visibility timeout",
                self.label,
                self.function,
                in_flight.count.load(Ordering::SeqCst)
            ));
            tasks.abort_all();
        }
    }

    /// One delivery: admit it, invoke the function with the visibility renewed meanwhile, then
    /// delete the message or settle the failure.
    async fn process(&self, message: ReceivedMessage) {
        let Some(bytes) = self.admit(&message).await else {
            return;
        };
        let item = QueueItem::from_bytes(bytes, self.binary);
        let invocation_id = uuid::Uuid::new_v4().to_string();
        let tag = format!("{} [{}] [{invocation_id}]", self.label, self.function);
        let sys = SysData::now(&self.function);
        let body = queue_payload(&self.binding, &item, &message, &sys);

        let pop_receipt = Arc::new(Mutex::new(message.pop_receipt.clone()));
        let renewal = self.renew_visibility(&message.id, pop_receipt.clone());
        self.log.info(format!(
            "{tag} Executing '{}' (queue {}, message {}, DequeueCount {})",
            self.function, self.source.queue, message.id, message.dequeue_count
        ));
        let started = std::time::Instant::now();
        let outcome = self.invoke(&invocation_id, body, &tag).await;
        renewal.abort();
        let receipt = pop_receipt.lock().unwrap().clone();
        self.stats
            .record(&self.function, started.elapsed(), outcome.is_ok());
        let elapsed = started.elapsed().as_millis();
        match outcome {
            Ok(()) => {
                self.log.info(format!(
                    "{tag} Executed '{}' (Succeeded, {elapsed} ms)",
                    self.function
                ));
                self.delete(&message, &receipt, &tag).await;
            }
            Err(why) => {
                self.log.error(format!(
                    "{tag} Executed '{}' (Failed, {elapsed} ms): {why}",
                    self.function
                ));
                self.settle_failure(&message, &receipt, &tag).await;
            }
        }
    }

    /// The message's bytes, or `None` after moving it to the poison queue without invoking:
    /// its dequeue count is already over the limit, or it cannot be decoded.
    async fn admit(&self, message: &ReceivedMessage) -> Option<Vec<u8>> {
        let max = self.options.max_dequeue_count;
        let tag = format!(
            "{} [{}] [message {}]",
            self.label, self.function, message.id
        );
        if message.dequeue_count > max {
            self.log.warn(format!(
                "{tag} DequeueCount {} exceeds MaxDequeueCount {max}; moving it to the poison queue without invoking",
                message.dequeue_count
            ));
            self.move_to_poison(message, &message.pop_receipt, &tag)
                .await;
            return None;
        }
        match self.options.message_encoding.decode(&message.text) {
            Ok(b) => Some(b),
            Err(e) => {
                self.log.error(format!(
                    "{tag} Message decoding has failed! Check MessageEncoding settings. ({e})"
                ));
                self.move_to_poison(message, &message.pop_receipt, &tag)
                    .await;
                None
            }
        }
    }

    /// Renews the receive visibility at half-life until aborted, keeping `pop_receipt` current.
    fn renew_visibility(&self, id: &str, pop_receipt: Arc<Mutex<String>>) -> JoinHandle<()> {
        let visibility = self.receive_visibility;
        let store = self.source.store.clone();
        let queue = self.source.queue.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(visibility / 2).await;
                let current = pop_receipt.lock().unwrap().clone();
                if let Ok(new) = store
                    .update_message(&queue, &id, &current, visibility, None)
                    .await
                {
                    *pop_receipt.lock().unwrap() = new;
                }
            }
        })
    }

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
        write_queue_outputs(&self.outputs, &values, self.options.message_encoding)
            .await
            .map(|_| ())
    }

    async fn delete(&self, message: &ReceivedMessage, receipt: &str, tag: &str) {
        if let Err(e) = self
            .source
            .store
            .delete_message(&self.source.queue, &message.id, receipt)
            .await
        {
            // Another instance may own the message by now; delivery is at-least-once.
            self.log.warn(format!(
                "{tag} could not delete message {}: {e}",
                message.id
            ));
        }
    }

    async fn settle_failure(&self, message: &ReceivedMessage, receipt: &str, tag: &str) {
        let max = self.options.max_dequeue_count;
        match settlement(
            message.dequeue_count,
            max,
            self.poison.is_some(),
            self.options.visibility_timeout,
        ) {
            Settlement::KeepInvisible => self.log.warn(format!(
                "{tag} no poison queue for {}: message {} stays invisible until its receive visibility ends ({:?} after it was received)",
                self.source.queue, message.id, self.receive_visibility
            )),
            Settlement::Poison => {
                self.log.warn(format!(
                    "{tag} Message has reached MaxDequeueCount of {max}. Moving message to queue '{}'.",
                    self.poison
                        .as_ref()
                        .map(|p| p.queue.as_str())
                        .unwrap_or_default()
                ));
                self.move_to_poison(message, receipt, tag).await;
            }
            Settlement::Release(visibility) => {
                if let Err(e) = self
                    .source
                    .store
                    .update_message(&self.source.queue, &message.id, receipt, visibility, None)
                    .await
                {
                    self.log.warn(format!(
                        "{tag} could not release message {}: {e}",
                        message.id
                    ));
                }
            }
        }
    }

    /// Copies the stored message text to the poison queue, then deletes the original.
    async fn move_to_poison(&self, message: &ReceivedMessage, receipt: &str, tag: &str) {
        let Some(poison) = &self.poison else { return };
        if let Err(e) = poison.put(&message.text).await {
            self.log.error(format!(
                "{tag} could not move message {} to {}: {e}",
                message.id, poison.queue
            ));
            return;
        }
        if let Err(e) = self
            .source
            .store
            .delete_message(&self.source.queue, &message.id, receipt)
            .await
        {
            self.log.warn(format!(
                "{tag} moved message {} to {} but could not delete it: {e}",
                message.id, poison.queue
            ));
        }
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
    fn backoff_doubles_from_the_minimum_with_its_jitter_up_to_the_maximum() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), Duration::from_secs(2));
        let delays: Vec<Duration> = (0..6).map(|_| b.next_delay_with(1.0)).collect();
        assert_eq!(
            delays,
            [ms(200), ms(400), ms(800), ms(1600), ms(2000), ms(2000)]
        );
        b.reset();
        // min + min * (2^1 - 1) * jitter
        assert_eq!(b.next_delay_with(0.8), ms(180));
        assert_eq!(b.next_delay_with(1.2), ms(460));
    }

    #[test]
    fn failed_deliveries_are_released_poisoned_on_the_last_or_kept_without_poison_queue() {
        let ten = Duration::from_secs(10);
        assert_eq!(settlement(1, 5, true, ten), Settlement::Release(ten));
        assert_eq!(
            settlement(4, 5, true, Duration::ZERO),
            Settlement::Release(Duration::ZERO)
        );
        assert_eq!(settlement(5, 5, true, ten), Settlement::Poison);
        assert_eq!(settlement(7, 5, true, ten), Settlement::Poison);
        // A poison queue's own messages: never released at visibilityTimeout (0 would retry in a
        // fast loop), never poisoned.
        assert_eq!(
            settlement(1, 5, false, Duration::ZERO),
            Settlement::KeepInvisible
        );
        assert_eq!(settlement(5, 5, false, ten), Settlement::KeepInvisible);
    }

    #[test]
    fn backoff_grows_to_max_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let first = b.next_delay();
        assert!(
            first >= Duration::from_millis(170) && first <= Duration::from_millis(230),
            "{first:?}"
        );
        let mut last = first;
        for _ in 0..10 {
            last = b.next_delay();
        }
        assert_eq!(last, Duration::from_secs(2));
        b.reset();
        assert!(b.next_delay() < Duration::from_millis(300));
    }

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
