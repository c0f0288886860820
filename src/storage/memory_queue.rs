//! An in-memory queue store for unit tests and the simulator. Visibility uses `tokio::time`, so
//! it follows paused or virtual time. Never a stand-in for Azurite in integration tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::counters::{RequestCounters, RequestKind};
use super::{
    QueueStore, ReceivedMessage, StorageError, StorageErrorKind, StorageResult, MAX_MESSAGE_TEXT,
};

struct Message {
    id: String,
    pop_receipt: String,
    dequeue_count: u64,
    text: String,
    visible_at: Instant,
    inserted: time::OffsetDateTime,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, Vec<Message>>,
    next_id: u64,
}

/// The in-memory queue store. Cloning shares the same queues.
#[derive(Clone, Default)]
pub struct MemoryQueueStore {
    state: Arc<Mutex<State>>,
    counters: Arc<RequestCounters>,
}

fn missing(queue: &str) -> StorageError {
    StorageError::from_status(
        404,
        Some("QueueNotFound".into()),
        format!("queue {queue} not found"),
    )
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
    pub fn new() -> Self {
        Self::default()
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
            .map_or(0, Vec::len)
    }

    /// Whether every queue is empty.
    pub fn is_empty(&self) -> bool {
        self.state
            .lock()
            .unwrap()
            .queues
            .values()
            .all(Vec::is_empty)
    }
}

impl QueueStore for MemoryQueueStore {
    async fn create_queue(&self, queue: &str) -> StorageResult<()> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueueAdmin);
        self.state
            .lock()
            .unwrap()
            .queues
            .entry(queue.to_string())
            .or_default();
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueueAdmin);
        Ok(self.state.lock().unwrap().queues.remove(queue).is_some())
    }

    async fn put_message(
        &self,
        queue: &str,
        text: &str,
        visibility_delay: Duration,
    ) -> StorageResult<()> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueuePut);
        if text.len() > MAX_MESSAGE_TEXT {
            return Err(StorageError::invalid_input(format!(
                "message text is {} bytes, over 64 KiB",
                text.len()
            )));
        }
        let mut state = self.state.lock().unwrap();
        state.next_id += 1;
        let id = format!("m{}", state.next_id);
        let messages = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        messages.push(Message {
            id: id.clone(),
            pop_receipt: format!("{id}-0"),
            dequeue_count: 0,
            text: text.to_string(),
            visible_at: Instant::now() + visibility_delay,
            inserted: time::OffsetDateTime::now_utc(),
        });
        Ok(())
    }

    async fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility_timeout: Duration,
    ) -> StorageResult<Vec<ReceivedMessage>> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueueGet);
        let mut state = self.state.lock().unwrap();
        let messages = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let now = Instant::now();
        let mut out = Vec::new();
        for m in messages
            .iter_mut()
            .filter(|m| m.visible_at <= now)
            .take(max.clamp(1, 32) as usize)
        {
            m.dequeue_count += 1;
            m.visible_at = now + visibility_timeout;
            m.pop_receipt = format!("{}-{}", m.id, m.dequeue_count);
            out.push(ReceivedMessage {
                id: m.id.clone(),
                pop_receipt: m.pop_receipt.clone(),
                dequeue_count: m.dequeue_count,
                text: m.text.clone(),
                insertion_time: m.inserted,
                expiration_time: m.inserted + time::Duration::days(7),
                next_visible_time: to_offset(m.visible_at),
            });
        }
        Ok(out)
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StorageResult<()> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueueDelete);
        let mut state = self.state.lock().unwrap();
        let messages = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        match messages
            .iter()
            .position(|m| m.id == id && m.pop_receipt == pop_receipt)
        {
            Some(i) => {
                messages.remove(i);
                Ok(())
            }
            None => Err(StorageError::new(
                StorageErrorKind::NotFound,
                format!("message {id} with that pop receipt not found"),
            )),
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
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueueUpdate);
        let mut state = self.state.lock().unwrap();
        let messages = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let m = messages
            .iter_mut()
            .find(|m| m.id == id && m.pop_receipt == pop_receipt)
            .ok_or_else(|| {
                StorageError::new(
                    StorageErrorKind::NotFound,
                    format!("message {id} with that pop receipt not found"),
                )
            })?;
        m.visible_at = Instant::now() + visibility_timeout;
        if let Some(t) = text {
            m.text = t.to_string();
        }
        m.pop_receipt = format!("{}-{}u", m.id, m.dequeue_count);
        Ok(m.pop_receipt.clone())
    }

    async fn approximate_count(&self, queue: &str) -> StorageResult<u64> {
        // Yield like real I/O would, so concurrent callers interleave between requests.
        tokio::task::yield_now().await;
        self.counters.record(RequestKind::QueueAdmin);
        Ok(self.len(queue) as u64)
    }
}
