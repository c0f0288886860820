//! An indexed in-memory queue for the simulator: the same semantics as `MemoryQueueStore`
//! (visibility in `tokio::time`, dequeue counts, pop receipts) but O(log n) per operation, since
//! the reference design queues millions of messages and a linear scan per delete dominated the
//! simulator's run time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::storage::{
    QueueStore, ReceivedMessage, StorageError, StorageErrorKind, StorageResult, MAX_MESSAGE_TEXT,
};

struct Message {
    text: Arc<str>,
    dequeue_count: u64,
    pop: u64,
    visible_at: Instant,
}

#[derive(Default)]
struct Queue {
    messages: HashMap<u64, Message>,
    /// (visible at, id): ids in the order they become visible (FIFO among equals).
    by_visibility: BTreeMap<(Instant, u64), ()>,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, Queue>,
    next: u64,
}

/// The simulator's queue service. Cloning shares the queues.
#[derive(Clone, Default)]
pub struct SimQueues {
    state: Arc<Mutex<State>>,
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

fn parse(id: &str, pop: &str) -> Option<(u64, u64)> {
    Some((id.parse().ok()?, pop.parse().ok()?))
}

impl SimQueues {
    /// Messages in a queue, visible or not.
    pub fn len(&self, queue: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .queues
            .get(queue)
            .map_or(0, |q| q.messages.len())
    }

    /// Messages visible now (at most `max`).
    pub fn visible(&self, queue: &str, max: usize) -> usize {
        let now = Instant::now();
        let state = self.state.lock().unwrap();
        state.queues.get(queue).map_or(0, |q| {
            q.by_visibility
                .keys()
                .take(max)
                .take_while(|(at, _)| *at <= now)
                .count()
        })
    }

    pub fn is_empty(&self) -> bool {
        self.state
            .lock()
            .unwrap()
            .queues
            .values()
            .all(|q| q.messages.is_empty())
    }
}

impl QueueStore for SimQueues {
    async fn create_queue(&self, queue: &str) -> StorageResult<()> {
        self.state
            .lock()
            .unwrap()
            .queues
            .entry(queue.to_string())
            .or_default();
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        Ok(self.state.lock().unwrap().queues.remove(queue).is_some())
    }

    async fn put_message(
        &self,
        queue: &str,
        text: &str,
        visibility_delay: Duration,
    ) -> StorageResult<()> {
        if text.len() > MAX_MESSAGE_TEXT {
            return Err(StorageError::invalid_input(format!(
                "message text is {} bytes, over 64 KiB",
                text.len()
            )));
        }
        let mut state = self.state.lock().unwrap();
        state.next += 1;
        let id = state.next;
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let visible_at = Instant::now() + visibility_delay;
        q.by_visibility.insert((visible_at, id), ());
        q.messages.insert(
            id,
            Message {
                text: text.into(),
                dequeue_count: 0,
                pop: 0,
                visible_at,
            },
        );
        Ok(())
    }

    async fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility_timeout: Duration,
    ) -> StorageResult<Vec<ReceivedMessage>> {
        let mut state = self.state.lock().unwrap();
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let now = Instant::now();
        let due: Vec<(Instant, u64)> = q
            .by_visibility
            .keys()
            .take_while(|(at, _)| *at <= now)
            .take(max.clamp(1, 32) as usize)
            .copied()
            .collect();
        let wall = time::OffsetDateTime::UNIX_EPOCH;
        let mut out = Vec::with_capacity(due.len());
        for key in due {
            q.by_visibility.remove(&key);
            let m = q.messages.get_mut(&key.1).expect("indexed messages exist");
            m.dequeue_count += 1;
            m.pop += 1;
            m.visible_at = now + visibility_timeout;
            q.by_visibility.insert((m.visible_at, key.1), ());
            out.push(ReceivedMessage {
                id: key.1.to_string(),
                pop_receipt: m.pop.to_string(),
                dequeue_count: m.dequeue_count,
                text: m.text.to_string(),
                insertion_time: wall,
                expiration_time: wall,
                next_visible_time: wall,
            });
        }
        Ok(out)
    }

    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StorageResult<()> {
        let mut state = self.state.lock().unwrap();
        let q = state.queues.get_mut(queue).ok_or_else(|| missing(queue))?;
        let (n, pop) = parse(id, pop_receipt).ok_or_else(|| gone(id))?;
        match q.messages.get(&n) {
            Some(m) if m.pop == pop => {
                let at = m.visible_at;
                q.messages.remove(&n);
                q.by_visibility.remove(&(at, n));
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
        q.by_visibility.insert((m.visible_at, n), ());
        if let Some(t) = text {
            m.text = t.into();
        }
        Ok(m.pop.to_string())
    }

    async fn approximate_count(&self, queue: &str) -> StorageResult<u64> {
        Ok(self.len(queue) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn visibility_redelivery_and_receipts() {
        let q = SimQueues::default();
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
        assert_eq!(texts, [("c", 1), ("b", 2)]);
        // A stale receipt (from before redelivery) no longer deletes the message.
        assert!(q
            .delete_message("q", &got[1].id, &got[1].pop_receipt)
            .await
            .is_err());
        assert_eq!(q.len("q"), 2);
    }
}
