//! An in-memory queue store for unit tests and the simulator. Visibility uses `tokio::time`, so
//! it follows paused or virtual time. Never a stand-in for Azurite in integration tests.
//!
//! Indexed: messages by id, and ids by the time they become visible, so every operation is
//! O(log n) (the simulator queues millions of messages). Visible messages are delivered in the
//! order they became visible, first put first among equals.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::storage::request_counts::{RequestCounters, RequestKind};
use crate::storage::{
    QueueStore, ReceivedMessage, StorageError, StorageErrorKind, StorageResult, MAX_MESSAGE_TEXT,
};

struct Message {
    text: Arc<str>,
    dequeue_count: u64,
    /// Bumped by every receive and update; the pop receipt is this number.
    pop: u64,
    visible_at: Instant,
    inserted: time::OffsetDateTime,
    /// Put with `messagettl=-1`: reported as expiring at the service's "never" (9999-12-31).
    never_expires: bool,
}

#[derive(Default)]
struct Queue {
    messages: HashMap<u64, Message>,
    /// (visible at, id): ids in the order they become visible (FIFO among equals).
    by_visibility: BTreeSet<(Instant, u64)>,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, Queue>,
    next_id: u64,
}

/// The in-memory queue store. Cloning shares the same queues.
#[derive(Clone)]
pub struct MemoryQueueStore {
    state: Arc<Mutex<State>>,
    counters: Arc<RequestCounters>,
    /// Whether each request yields to the scheduler first (see [`MemoryQueueStore::new`]).
    yields: bool,
}

impl Default for MemoryQueueStore {
    fn default() -> Self {
        Self::new()
    }
}

fn missing(queue: &str) -> StorageError {
    StorageError::from_status(
        404,
        Some("QueueNotFound".into()),
        format!("queue {queue} not found"),
    )
}

fn gone(id: &str) -> StorageError {
    StorageError::new(
        StorageErrorKind::NotFound,
        format!("message {id} with that pop receipt not found"),
    )
}

/// Message ids are `m<number>`; pop receipts are numbers.
fn parse(id: &str, pop_receipt: &str) -> Option<(u64, u64)> {
    Some((
        id.strip_prefix('m')?.parse().ok()?,
        pop_receipt.parse().ok()?,
    ))
}

fn to_offset(at: Instant) -> time::OffsetDateTime {
    let now = Instant::now();
    let now_wall = time::OffsetDateTime::now_utc();
    if at >= now {
        now_wall + (at - now)
    } else {
        now_wall - (now - at)
    }
}

impl MemoryQueueStore {
    /// A store whose requests yield to the scheduler like real I/O would, so concurrent callers
    /// interleave between requests (what in-process tests want).
    pub fn new() -> Self {
        MemoryQueueStore {
            state: Arc::default(),
            counters: Arc::new(RequestCounters::new()),
            yields: true,
        }
    }

    /// A store whose requests never yield: for callers that model latency themselves (the
    /// simulator sleeps around every request).
    pub fn without_yields() -> Self {
        MemoryQueueStore {
            yields: false,
            ..Self::new()
        }
    }

    pub fn counters(&self) -> &Arc<RequestCounters> {
        &self.counters
    }

    /// Messages in a queue, visible or not (not counted as a request).
    pub fn len(&self, queue: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .queues
            .get(queue)
            .map_or(0, |q| q.messages.len())
    }

    /// Messages visible now, up to `max` (not counted as a request).
    pub fn visible(&self, queue: &str, max: usize) -> usize {
        let now = Instant::now();
        let state = self.state.lock().unwrap();
        state.queues.get(queue).map_or(0, |q| {
            q.by_visibility
                .iter()
                .take(max)
                .take_while(|(at, _)| *at <= now)
                .count()
        })
    }

    /// Whether every queue is empty.
    pub fn is_empty(&self) -> bool {
        self.state
            .lock()
            .unwrap()
            .queues
            .values()
            .all(|q| q.messages.is_empty())
    }

    /// Counts a request, after yielding like real I/O would when this store yields.
    async fn request(&self, kind: RequestKind) {
        if self.yields {
            tokio::task::yield_now().await;
        }
        self.counters.record(kind);
    }

    /// Puts a message (see [`QueueStore::put_message`]); `never_expires`: `messagettl=-1`.
    async fn put(
        &self,
        queue: &str,
        text: &str,
        visibility_delay: Duration,
        never_expires: bool,
    ) -> StorageResult<()> {
        self.request(RequestKind::QueuePut).await;
        if text.len() > MAX_MESSAGE_TEXT {
            return Err(StorageError::invalid_input(format!(
                "message text is {} bytes, over 64 KiB",
                text.len()
            )));
        }
        let mut state = self.state.lock().unwrap();
        state.next_id += 1;
        let id = state.next_id;
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let visible_at = Instant::now() + visibility_delay;
        let message = Message {
            text: text.into(),
            dequeue_count: 0,
            pop: 0,
            visible_at,
            inserted: time::OffsetDateTime::now_utc(),
            never_expires,
        };
        q.by_visibility.insert((visible_at, id));
        q.messages.insert(id, message);
        Ok(())
    }
}

impl QueueStore for MemoryQueueStore {
    async fn create_queue(&self, queue: &str) -> StorageResult<()> {
        self.request(RequestKind::QueueAdmin).await;
        self.state
            .lock()
            .unwrap()
            .queues
            .entry(queue.to_string())
            .or_default();
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        self.request(RequestKind::QueueAdmin).await;
        Ok(self.state.lock().unwrap().queues.remove(queue).is_some())
    }

    async fn put_message(
        &self,
        queue: &str,
        text: &str,
        visibility_delay: Duration,
    ) -> StorageResult<()> {
        self.put(queue, text, visibility_delay, false).await
    }

    async fn put_message_never_expiring(&self, queue: &str, text: &str) -> StorageResult<()> {
        self.put(queue, text, Duration::ZERO, true).await
    }

    async fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility_timeout: Duration,
    ) -> StorageResult<Vec<ReceivedMessage>> {
        self.request(RequestKind::QueueGet).await;
        let mut state = self.state.lock().unwrap();
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let now = Instant::now();
        // Pick first, then hide: with a zero visibility timeout a message would otherwise be
        // picked again at once.
        let due: Vec<(Instant, u64)> = q
            .by_visibility
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(max.clamp(1, 32) as usize)
            .copied()
            .collect();
        let mut out = Vec::with_capacity(due.len());
        for (at, id) in due {
            q.by_visibility.remove(&(at, id));
            let m = q.messages.get_mut(&id).expect("indexed messages exist");
            m.dequeue_count += 1;
            m.pop += 1;
            m.visible_at = now + visibility_timeout;
            q.by_visibility.insert((m.visible_at, id));
            out.push(ReceivedMessage {
                id: format!("m{id}"),
                pop_receipt: m.pop.to_string(),
                dequeue_count: m.dequeue_count,
                text: m.text.to_string(),
                insertion_time: m.inserted,
                expiration_time: match m.never_expires {
                    true => time::macros::datetime!(9999-12-31 23:59:59.999 UTC),
                    false => m.inserted + time::Duration::days(7),
                },
                next_visible_time: to_offset(m.visible_at),
            });
        }
        Ok(out)
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.request(RequestKind::QueueDelete).await;
        let mut state = self.state.lock().unwrap();
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let (n, pop) = parse(id, pop_receipt).ok_or_else(|| gone(id))?;
        match q.messages.get(&n) {
            Some(m) if m.pop == pop => {
                q.by_visibility.remove(&(m.visible_at, n));
                q.messages.remove(&n);
                Ok(())
            }
            _ => Err(gone(id)),
        }
    }

    async fn update_message(
        &self,
        queue: &str,
        id: &str,
        pop_receipt: &str,
        visibility_timeout: Duration,
        text: Option<&str>,
    ) -> StorageResult<String> {
        self.request(RequestKind::QueueUpdate).await;
        let mut state = self.state.lock().unwrap();
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let (n, pop) = parse(id, pop_receipt).ok_or_else(|| gone(id))?;
        let m = q
            .messages
            .get_mut(&n)
            .filter(|m| m.pop == pop)
            .ok_or_else(|| gone(id))?;
        q.by_visibility.remove(&(m.visible_at, n));
        m.visible_at = Instant::now() + visibility_timeout;
        m.pop += 1;
        q.by_visibility.insert((m.visible_at, n));
        if let Some(t) = text {
            m.text = t.into();
        }
        Ok(m.pop.to_string())
    }

    async fn approximate_count(&self, queue: &str) -> StorageResult<u64> {
        self.request(RequestKind::QueueAdmin).await;
        Ok(self.len(queue) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn visibility_redelivery_and_receipts() {
        for q in [MemoryQueueStore::new(), MemoryQueueStore::without_yields()] {
            q.create_queue("q").await.unwrap();
            for t in ["a", "b", "c"] {
                q.put_message("q", t, Duration::ZERO).await.unwrap();
            }
            let got = q
                .get_messages("q", 2, Duration::from_secs(30))
                .await
                .unwrap();
            assert_eq!(
                got.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
                ["a", "b"]
            );
            assert_eq!(q.visible("q", 32), 1);
            q.delete_message("q", &got[0].id, &got[0].pop_receipt)
                .await
                .unwrap();
            assert!(q
                .delete_message("q", &got[0].id, &got[0].pop_receipt)
                .await
                .is_err());
            tokio::time::advance(Duration::from_secs(31)).await;
            let again = q
                .get_messages("q", 32, Duration::from_secs(30))
                .await
                .unwrap();
            let texts: Vec<_> = again
                .iter()
                .map(|m| (m.text.as_str(), m.dequeue_count))
                .collect();
            // In the order they became visible: c at once, b after its visibility lapsed.
            assert_eq!(texts, [("c", 1), ("b", 2)]);
            // A stale receipt (from before redelivery) no longer deletes the message.
            assert!(q
                .delete_message("q", &got[1].id, &got[1].pop_receipt)
                .await
                .is_err());
            // An update hands out a new receipt and makes the old one stale.
            let receipt = q
                .update_message(
                    "q",
                    &again[1].id,
                    &again[1].pop_receipt,
                    Duration::ZERO,
                    Some("B"),
                )
                .await
                .unwrap();
            assert!(q
                .delete_message("q", &again[1].id, &again[1].pop_receipt)
                .await
                .is_err());
            let b = q
                .get_messages("q", 1, Duration::from_secs(30))
                .await
                .unwrap();
            assert_eq!((b[0].text.as_str(), b[0].dequeue_count), ("B", 3));
            assert_ne!(b[0].pop_receipt, receipt);
            assert_eq!(q.len("q"), 2);
            // A zero visibility timeout hands out each visible message once per receive.
            tokio::time::advance(Duration::from_secs(31)).await;
            let all = q.get_messages("q", 32, Duration::ZERO).await.unwrap();
            assert_eq!(all.len(), 2);
            assert!(q.put_message("nope", "x", Duration::ZERO).await.is_err());
            assert!(q
                .put_message("q", &"x".repeat(MAX_MESSAGE_TEXT + 1), Duration::ZERO)
                .await
                .is_err());
        }
    }
}
