//! The queue listener: the one implementation of a Storage Queues trigger in this crate, used
//! by `tablescan run` (deliveries to the app's functions in-process, [`super::local`]) and by the
//! lab's local Functions host (deliveries to a handler process over HTTP, `lab/host/queue.rs`).
//! It polls one queue with randomized exponential backoff, keeps a bounded number of deliveries
//! in flight, renews each message's visibility while it is delivered, and settles each message
//! (delete, release, or poison) as the Storage Queues extension does (docs/custom-handler-protocol.md §7).
//! It depends on the queue store trait only: nothing of the app, nothing of the lab.
//!
//! Invariants:
//! - a new batch is fetched only while at most `new_batch_threshold` deliveries are in flight,
//!   so never more than `batch_size + new_batch_threshold` run at once; with `slots`, each
//!   delivery also holds one of the shared slots, and a poll asks for no more messages than it
//!   holds slots for;
//! - a message with a dequeue count above `max_dequeue_count`, or that cannot be decoded, goes to
//!   the poison queue undelivered;
//! - a failed delivery is settled by [`settlement`] alone: released for `visibility_timeout`,
//!   moved to the poison queue on its last allowed delivery, or, with no poison queue possible,
//!   left invisible for the rest of its receive visibility (never retried in a fast loop);
//! - a delivery's visibility renewal ends with the delivery, however it ends (also when its task
//!   is aborted);
//! - a delivery abandoned at the end of the drain is released at once when
//!   `release_abandoned` (visible again, as a killed delivery after its receive visibility);
//!   otherwise it reappears after its receive visibility;
//! - every delay here (polling backoff, visibility renewal, drain) runs on tokio's clock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::storage::{MessageEncoding, QueueStore, ReceivedMessage};

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

/// What becomes of a message whose delivery failed (see the invariants at the top).
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

/// A queue the listener reads, or writes to (poison moves, the host's output bindings).
pub struct QueueTarget<S> {
    pub store: Arc<S>,
    pub queue: String,
    created: AtomicBool,
}

impl<S: QueueStore> QueueTarget<S> {
    pub fn new(store: Arc<S>, queue: String) -> Self {
        QueueTarget {
            store,
            queue,
            created: AtomicBool::new(false),
        }
    }

    /// `AddMessageAndCreateIfNotExists`: the queue is created on first use.
    pub async fn put(&self, text: &str) -> Result<(), String> {
        if !self.created.load(Ordering::Relaxed) {
            self.store
                .create_queue(&self.queue)
                .await
                .map_err(|e| format!("creating queue {}: {e}", self.queue))?;
            self.created.store(true, Ordering::Relaxed);
        }
        self.store
            .put_message(&self.queue, text, Duration::ZERO)
            .await
            .map_err(|e| format!("adding a message to {}: {e}", self.queue))
    }
}

/// How bad a listener's diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// Where a listener's messages go: one queue function's work.
pub trait Deliver: Send + Sync + 'static {
    /// Resolves once deliveries may be taken (the local host: its handler is up); `Err` says
    /// why the listener stops for good.
    fn ready(&self) -> impl Future<Output = Result<(), String>> + Send;

    /// Delivers one message, its text already decoded; `Err` is a failed delivery.
    fn deliver(
        &self,
        message: &ReceivedMessage,
        bytes: Vec<u8>,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// One diagnostic line of the listener.
    fn log(&self, level: Level, line: String);
}

/// How a listener polls and settles (host.json `extensions.queues`, and the receive visibility).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Messages asked for by one poll (at most 32).
    pub batch_size: u32,
    pub new_batch_threshold: u32,
    pub max_polling_interval: Duration,
    /// How long a failed delivery's message stays invisible before its next delivery.
    pub visibility_timeout: Duration,
    pub max_dequeue_count: u64,
    pub message_encoding: MessageEncoding,
    /// How long a received message stays invisible; renewed at half-life while delivered.
    pub receive_visibility: Duration,
    /// Whether deliveries abandoned at the end of a drain are made visible again at once.
    pub release_abandoned: bool,
}

/// One queue's listener.
pub struct Listener<S, D> {
    /// Prefix of every line it logs, e.g. `[i0] [TableCopy]`.
    pub tag: String,
    pub source: Arc<QueueTarget<S>>,
    /// `None` when no poison queue is possible (name ends with `-poison` or would be too long).
    pub poison: Option<Arc<QueueTarget<S>>>,
    pub settings: Settings,
    /// Deliveries in flight across every listener that shares these slots.
    pub slots: Option<Arc<Semaphore>>,
    pub deliver: D,
}

/// Counts deliveries in flight and wakes the poller when one finishes; remembers each one's
/// current pop receipt, for releasing abandoned deliveries.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    changed: Notify,
    receipts: Mutex<HashMap<String, Arc<Mutex<String>>>>,
}

/// Aborts a delivery's visibility renewal when dropped.
struct Renewal(JoinHandle<()>);

impl Drop for Renewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<S: QueueStore, D: Deliver> Listener<S, D> {
    /// Polls until `stop` turns true, then waits up to `drain` for deliveries in flight.
    pub async fn run(self: Arc<Self>, stop: watch::Receiver<bool>, drain: Duration) {
        let (_keep, abandon) = watch::channel(false);
        self.run_until(stop, drain, abandon).await
    }

    /// [`Listener::run`], whose drain also ends as soon as `abandon` turns true.
    pub async fn run_until(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
        drain: Duration,
        abandon: watch::Receiver<bool>,
    ) {
        let in_flight = Arc::new(InFlight::default());
        let mut tasks = JoinSet::new();
        let settings = &self.settings;
        let mut backoff = Backoff::new(MIN_POLLING_INTERVAL, settings.max_polling_interval);
        let mut failing = false;
        let (tag, queue) = (&self.tag, &self.source.queue);
        self.deliver
            .log(Level::Info, format!("{tag} listening on queue {queue}"));
        'poll: loop {
            // `WaitForNewBatchThreshold`: fetch again only when in-flight work is down to the threshold.
            loop {
                if *stop.borrow() {
                    break 'poll;
                }
                let notified = in_flight.changed.notified();
                if in_flight.count.load(Ordering::SeqCst) <= settings.new_batch_threshold as usize {
                    break;
                }
                tokio::select! {
                    _ = notified => {}
                    r = stop.changed() => if r.is_err() { break 'poll },
                }
            }
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                ready = self.deliver.ready() => if let Err(why) = ready {
                    self.deliver.log(Level::Warn, format!("{tag} stopped polling {queue}: {why}"));
                    break 'poll;
                },
                r = stop.changed() => if r.is_err() { break 'poll } else { continue 'poll },
            }
            let permits = tokio::select! {
                permits = self.take_slots() => permits,
                r = stop.changed() => if r.is_err() { break 'poll } else { continue 'poll },
            };
            let batch = permits
                .as_ref()
                .map_or(settings.batch_size.min(32), |p| p.len() as u32)
                as u8;
            let delay = match self
                .source
                .store
                .get_messages(queue, batch, settings.receive_visibility)
                .await
            {
                Ok(messages) if !messages.is_empty() => {
                    failing = false;
                    backoff.reset();
                    self.spawn_deliveries(messages, permits, &in_flight, &mut tasks);
                    continue;
                }
                Ok(_) => {
                    failing = false;
                    backoff.next_delay()
                }
                Err(e) => {
                    // A missing queue is polled like an empty one; say so once per streak.
                    if !failing {
                        let what = match e.is_not_found() {
                            true => "does not exist (yet)",
                            false => "cannot be read",
                        };
                        self.deliver
                            .log(Level::Warn, format!("{tag} queue {queue} {what}: {e}"));
                        failing = true;
                    }
                    backoff.next_delay()
                }
            };
            drop(permits);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                r = stop.changed() => if r.is_err() { break 'poll },
            }
        }
        self.drain(tasks, &in_flight, drain, abandon).await;
    }

    /// Without shared slots, `None`; with them, at least one slot and as many more (up to
    /// `batch_size`) as are free at once.
    async fn take_slots(&self) -> Option<Vec<OwnedSemaphorePermit>> {
        let slots = self.slots.as_ref()?;
        let first = slots.clone().acquire_owned().await.ok()?;
        let mut permits = vec![first];
        while permits.len() < self.settings.batch_size.clamp(1, 32) as usize {
            match slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        Some(permits)
    }

    /// One task per received message, counted in flight until it settles, each holding one
    /// slot when there are slots.
    fn spawn_deliveries(
        self: &Arc<Self>,
        messages: Vec<ReceivedMessage>,
        mut permits: Option<Vec<OwnedSemaphorePermit>>,
        in_flight: &Arc<InFlight>,
        tasks: &mut JoinSet<()>,
    ) {
        for message in messages {
            let permit = permits.as_mut().and_then(Vec::pop);
            in_flight.count.fetch_add(1, Ordering::SeqCst);
            let this = self.clone();
            let in_flight = in_flight.clone();
            tasks.spawn(async move {
                this.process(message, &in_flight).await;
                drop(permit);
                in_flight.count.fetch_sub(1, Ordering::SeqCst);
                in_flight.changed.notify_waiters();
            });
        }
    }

    /// After polling stopped: waits up to `drain` for the deliveries in flight, then abandons
    /// the rest (released at once with `release_abandoned`, else they reappear after their
    /// receive visibility).
    async fn drain(
        &self,
        mut tasks: JoinSet<()>,
        in_flight: &InFlight,
        drain: Duration,
        mut abandon: watch::Receiver<bool>,
    ) {
        let tag = &self.tag;
        let pending = in_flight.count.load(Ordering::SeqCst);
        if pending > 0 {
            self.deliver.log(Level::Info, format!(
                "{tag} stopped polling; waiting up to {drain:?} for {pending} invocation(s) in flight"
            ));
        }
        let all = async { while tasks.join_next().await.is_some() {} };
        let abandoned = async {
            if abandon.wait_for(|a| *a).await.is_err() {
                // A sender dropped without abandoning: wait out the drain.
                std::future::pending::<()>().await
            }
        };
        let drained = tokio::select! {
            done = tokio::time::timeout(drain, all) => done.is_ok(),
            _ = abandoned => false,
        };
        if drained {
            return;
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let abandoned: Vec<(String, String)> =
            std::mem::take(&mut *in_flight.receipts.lock().unwrap())
                .into_iter()
                .map(|(id, receipt)| (id, receipt.lock().unwrap().clone()))
                .collect();
        if !self.settings.release_abandoned {
            self.deliver.log(Level::Warn, format!(
                "{tag} {} invocation(s) still running at shutdown were abandoned; their messages reappear after the visibility timeout",
                abandoned.len()
            ));
            return;
        }
        for (id, receipt) in &abandoned {
            let released = self
                .source
                .store
                .update_message(&self.source.queue, id, receipt, Duration::ZERO, None)
                .await;
            if let Err(e) = released {
                self.deliver.log(Level::Warn, format!(
                    "{tag} could not release abandoned message {id} (it reappears after its receive visibility): {e}"
                ));
            }
        }
        self.deliver.log(
            Level::Info,
            format!(
                "{tag} {} delivery(ies) in flight were abandoned and their messages released",
                abandoned.len()
            ),
        );
    }

    /// One delivery: admit it, deliver it with the visibility renewed meanwhile, then delete the
    /// message or settle the failure.
    async fn process(&self, message: ReceivedMessage, in_flight: &InFlight) {
        let Some(bytes) = self.admit(&message).await else {
            return;
        };
        let pop_receipt = Arc::new(Mutex::new(message.pop_receipt.clone()));
        in_flight
            .receipts
            .lock()
            .unwrap()
            .insert(message.id.clone(), pop_receipt.clone());
        let renewal = self.renew_visibility(&message.id, pop_receipt.clone());
        let outcome = self.deliver.deliver(&message, bytes).await;
        drop(renewal);
        let receipt = pop_receipt.lock().unwrap().clone();
        match outcome {
            Ok(()) => self.delete(&message, &receipt).await,
            Err(_) => self.settle_failure(&message, &receipt).await,
        }
        in_flight.receipts.lock().unwrap().remove(&message.id);
    }

    /// The message's bytes, or `None` after moving it to the poison queue undelivered: its
    /// dequeue count is already over the limit, or it cannot be decoded.
    async fn admit(&self, message: &ReceivedMessage) -> Option<Vec<u8>> {
        let max = self.settings.max_dequeue_count;
        let tag = format!("{} [message {}]", self.tag, message.id);
        if message.dequeue_count > max {
            self.deliver.log(Level::Warn, format!(
                "{tag} DequeueCount {} exceeds MaxDequeueCount {max}; moving it to the poison queue without invoking",
                message.dequeue_count
            ));
            self.move_to_poison(message, &message.pop_receipt).await;
            return None;
        }
        match self.settings.message_encoding.decode(&message.text) {
            Ok(b) => Some(b),
            Err(e) => {
                self.deliver.log(
                    Level::Error,
                    format!(
                        "{tag} Message decoding has failed! Check MessageEncoding settings. ({e})"
                    ),
                );
                self.move_to_poison(message, &message.pop_receipt).await;
                None
            }
        }
    }

    /// Renews the receive visibility at half-life until dropped, keeping `pop_receipt` current.
    fn renew_visibility(&self, id: &str, pop_receipt: Arc<Mutex<String>>) -> Renewal {
        let visibility = self.settings.receive_visibility;
        let store = self.source.store.clone();
        let queue = self.source.queue.clone();
        let id = id.to_string();
        Renewal(tokio::spawn(async move {
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
        }))
    }

    async fn delete(&self, message: &ReceivedMessage, receipt: &str) {
        let deleted = self
            .source
            .store
            .delete_message(&self.source.queue, &message.id, receipt)
            .await;
        if let Err(e) = deleted {
            // Another instance may own the message by now; delivery is at-least-once.
            let line = format!("{} could not delete message {}: {e}", self.tag, message.id);
            self.deliver.log(Level::Warn, line);
        }
    }

    async fn settle_failure(&self, message: &ReceivedMessage, receipt: &str) {
        let (tag, settings) = (&self.tag, &self.settings);
        let max = settings.max_dequeue_count;
        let poison = self.poison.as_ref().map(|p| p.queue.as_str());
        match settlement(
            message.dequeue_count,
            max,
            poison.is_some(),
            settings.visibility_timeout,
        ) {
            Settlement::KeepInvisible => self.deliver.log(Level::Warn, format!(
                "{tag} no poison queue for {}: message {} stays invisible until its receive visibility ends ({:?} after it was received)",
                self.source.queue, message.id, settings.receive_visibility
            )),
            Settlement::Poison => {
                self.deliver.log(Level::Warn, format!(
                    "{tag} Message has reached MaxDequeueCount of {max}. Moving message to queue '{}'.",
                    poison.unwrap_or_default()
                ));
                self.move_to_poison(message, receipt).await;
            }
            Settlement::Release(visibility) => {
                let released = self
                    .source
                    .store
                    .update_message(&self.source.queue, &message.id, receipt, visibility, None)
                    .await;
                if let Err(e) = released {
                    let line = format!("{tag} could not release message {}: {e}", message.id);
                    self.deliver.log(Level::Warn, line);
                }
            }
        }
    }

    /// Copies the stored message text to the poison queue, then deletes the original.
    async fn move_to_poison(&self, message: &ReceivedMessage, receipt: &str) {
        let Some(poison) = &self.poison else { return };
        let tag = &self.tag;
        if let Err(e) = poison.put(&message.text).await {
            self.deliver.log(
                Level::Error,
                format!(
                    "{tag} could not move message {} to {}: {e}",
                    message.id, poison.queue
                ),
            );
            return;
        }
        let deleted = self
            .source
            .store
            .delete_message(&self.source.queue, &message.id, receipt)
            .await;
        if let Err(e) = deleted {
            self.deliver.log(
                Level::Warn,
                format!(
                    "{tag} moved message {} to {} but could not delete it: {e}",
                    message.id, poison.queue
                ),
            );
        }
    }
}

#[cfg(test)]
#[path = "listen_tests.rs"]
mod tests;
