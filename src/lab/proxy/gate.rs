//! Holding requests at a known point, so that a test can pause a scan where it wants it: "no
//! write reaches the destination until the kills are done", "no message is received until the
//! faults are armed". A test arms a [`Hold`] (which requests: kinds, and tables, queues or
//! containers); every request it matches waits in the proxy, counted ([`Held`]), until the hold
//! is replaced by one that does not match it, or released. Nothing is failed or changed: a held
//! request is forwarded as it came once let through.
//!
//! Invariants:
//! 1. A request is held while the hold in force matches it. It is checked again on every change
//!    of the hold, so replacing a hold with another lets through, at once, what the new one does
//!    not match and keeps what it still matches (one step: no request slips through between).
//! 2. `Held::now` counts the requests waiting. A waiting request whose client went away (the
//!    connection closed: a killed handler's) is dropped by the server, and no longer counted.
//! 3. `Held::total` counts every request that was ever held, once, since the proxy started.
//!
//! A queue can also be hidden: its receives are answered "no message" at once, without reaching
//! storage, so its messages wait untouched (not received, not made invisible) while the host
//! keeps polling, and can stop, as over an empty queue. (A held receive would keep its poller
//! waiting, and a host's shutdown with it.)

use std::sync::Mutex;

use tokio::sync::watch;

use super::classify::Kind;
use crate::storage::blob::BlobRequestKind;
use crate::storage::request_counts::RequestKind;

/// Which requests to hold: those of one of `kinds` or `blob_kinds` (both empty: every kind, as
/// in a [`super::FaultPolicy`]) addressed to one of `resources` (tables, queues or containers;
/// empty: any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hold {
    pub kinds: Vec<RequestKind>,
    pub blob_kinds: Vec<BlobRequestKind>,
    pub resources: Vec<String>,
}

impl Hold {
    /// Entity group transactions (every write the copy, delete and import drivers make) to
    /// `table`.
    pub fn writes_to(table: &str) -> Hold {
        Hold {
            kinds: vec![RequestKind::Batch],
            resources: vec![table.to_string()],
            ..Hold::default()
        }
    }

    /// Receives from `queue`: no delivery of its messages starts.
    pub fn receives_from(queue: &str) -> Hold {
        Hold {
            kinds: vec![RequestKind::QueueGet],
            resources: vec![queue.to_string()],
            ..Hold::default()
        }
    }

    /// Blob writes to `container` (the export's parts and manifest, the index's files).
    pub fn blob_writes_to(container: &str) -> Hold {
        Hold {
            blob_kinds: vec![BlobRequestKind::Write],
            resources: vec![container.to_string()],
            ..Hold::default()
        }
    }

    pub(super) fn matches(&self, kind: Kind, resource: &str) -> bool {
        let kind_matches = match kind {
            _ if self.kinds.is_empty() && self.blob_kinds.is_empty() => true,
            Kind::Storage(k) => self.kinds.contains(&k),
            Kind::Blob(k) => self.blob_kinds.contains(&k),
        };
        kind_matches && (self.resources.is_empty() || self.resources.iter().any(|r| r == resource))
    }
}

/// Requests held: waiting now, and ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub now: u64,
    pub total: u64,
}

/// The hold in force and the count of what it held.
pub(super) struct Gate {
    hold: watch::Sender<Option<Hold>>,
    held: watch::Sender<Held>,
    /// Queues whose receives find no message.
    hidden: Mutex<Vec<String>>,
}

/// One request counted in `Held::now` until dropped (let through, or abandoned by its client).
struct Waiting<'a>(&'a watch::Sender<Held>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|h| h.now -= 1);
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            hold: watch::channel(None).0,
            held: watch::channel(Held::default()).0,
            hidden: Mutex::default(),
        }
    }
}

impl Gate {
    pub(super) fn set(&self, hold: Option<Hold>) {
        self.hold.send_replace(hold);
    }

    pub(super) fn held(&self) -> watch::Receiver<Held> {
        self.held.subscribe()
    }

    pub(super) fn hide(&self, queues: &[&str]) {
        *self.hidden.lock().unwrap() = queues.iter().map(|q| q.to_string()).collect();
    }

    /// Whether the request is a receive from a hidden queue.
    pub(super) fn hides(&self, kind: Kind, resource: &str) -> bool {
        kind == Kind::Storage(RequestKind::QueueGet)
            && self.hidden.lock().unwrap().iter().any(|q| q == resource)
    }

    /// Returns once the hold in force does not match the request (at once if none does).
    pub(super) async fn pass(&self, kind: Kind, resource: &str) {
        let holds = |h: &Option<Hold>| h.as_ref().is_some_and(|h| h.matches(kind, resource));
        let mut hold = self.hold.subscribe();
        if !holds(&hold.borrow_and_update()) {
            return;
        }
        self.held.send_modify(|h| {
            h.now += 1;
            h.total += 1;
        });
        let _waiting = Waiting(&self.held);
        // The sender lives as long as the proxy, which outlives its requests.
        let _ = hold.wait_for(|h| !holds(h)).await;
    }
}
