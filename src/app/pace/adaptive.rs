//! Adaptive pacing per storage account, shared by every instance of a scan (issue 43,
//! docs/rate-limit.md "By default"): a scan whose requests an account refuses (`503`,
//! `500 OperationTimedOut`) slows down towards that account on every instance.
//!
//! Invariants:
//! 1. Until a refusal is seen, nothing is paced and nothing is written: an instance only reads
//!    its scan's row for the account once per [`IDLE_REFRESH_US`] while it sends there.
//! 2. The shared state is one row per scan and account (`pace-{connection}` in the scan's
//!    shard-0 partition, beside the limiter's `pace` row): the controller's [`Control`]. It is
//!    written only on a decrease (at most once per [`control::DECREASE_GAP_US`]), by a write
//!    conditional on the ETag read; a lost race adopts what won.
//! 3. A paced instance sends at most the row's current rate ([`control::rate_at`]) to the
//!    account, spaced locally (no request per token), and re-reads the row once per
//!    [`REFRESH_US`]: every instance obeys a decrease within that, not only the one refused.
//! 4. The row's own requests are counted into the meter of the request that triggered them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::control::{self, Control, Seen, DECIDE_US, IDLE_REFRESH_US, REFRESH_US};
use super::lease::pace_partition;
use super::now_us;
use crate::storage::{BatchOperation, Entity, StorageError, StorageErrorKind, TableStore};

/// The row property holding the rate per instance set at the last decrease (requests per
/// second, decimal).
pub const RATE: &str = "Rate";
/// The row property holding when (microseconds since the Unix epoch, decimal digits).
pub const RATE_AT: &str = "RateAt";
/// Requests a paced instance may send at once after a pause (its local burst), in time.
const BURST_US: f64 = 50_000.0;

/// The row key of a scan's adaptive pacing towards `connection`: characters a row key may not
/// hold are replaced by `_`.
pub fn rate_row(connection: &str) -> String {
    let clean: String = connection
        .chars()
        .map(|c| match c {
            '/' | '\\' | '#' | '?' => '_',
            c if c.is_control() => '_',
            c => c,
        })
        .collect();
    format!("pace-{clean}")
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>;

/// Where a scan's rows live (object-safe, so a pacer needs no store type).
pub trait Rows: Send + Sync {
    /// The row of `connection`: its control and ETag, `None` if there is none.
    fn read<'a>(&'a self, connection: &'a str) -> Boxed<'a, Option<(Control, String)>>;
    /// Writes it conditionally on `etag` (inserts without one).
    fn write<'a>(
        &'a self,
        connection: &'a str,
        control: Control,
        etag: Option<String>,
    ) -> Boxed<'a, ()>;
}

/// The rows of scan `scan_id` in `table` (the work table) of `store`.
pub struct TableRows<T> {
    pub store: T,
    pub table: String,
    pub scan_id: String,
}

impl<T: TableStore> TableRows<T> {
    async fn get(&self, connection: &str) -> Result<Option<(Control, String)>, StorageError> {
        let pk = pace_partition(&self.scan_id);
        let Some((entity, etag)) = self
            .store
            .get_entity(&self.table, &pk, &rate_row(connection))
            .await?
        else {
            return Ok(None);
        };
        let p = &entity.properties;
        let rate = p.get_str(RATE).and_then(|s| s.parse::<f64>().ok());
        let at = p.get_str(RATE_AT).and_then(|s| s.parse::<i64>().ok());
        match (rate, at) {
            (Some(rate), Some(at_us)) if rate.is_finite() => {
                Ok(Some((Control { rate, at_us }, etag)))
            }
            _ => Err(StorageError::invalid_response(format!(
                "the pace row of scan {} for {connection} is unreadable",
                self.scan_id
            ))),
        }
    }

    async fn put(
        &self,
        connection: &str,
        c: Control,
        etag: Option<String>,
    ) -> Result<(), StorageError> {
        let pk = pace_partition(&self.scan_id);
        let mut entity = Entity::new(pk.clone(), rate_row(connection));
        entity
            .properties
            .insert(RATE, json!(format!("{:.3}", c.rate)));
        entity
            .properties
            .insert(RATE_AT, json!(c.at_us.to_string()));
        let op = match etag {
            Some(etag) => BatchOperation::Replace {
                entity,
                etag: Some(etag),
            },
            None => BatchOperation::Insert(entity),
        };
        self.store
            .submit_batch_with_etags(&self.table, &pk, &[op])
            .await
            .map(|_| ())
    }
}

impl<T: TableStore> Rows for TableRows<T> {
    fn read<'a>(&'a self, connection: &'a str) -> Boxed<'a, Option<(Control, String)>> {
        Box::pin(self.get(connection))
    }
    fn write<'a>(&'a self, connection: &'a str, c: Control, etag: Option<String>) -> Boxed<'a, ()> {
        Box::pin(self.put(connection, c, etag))
    }
}

/// Each account's adaptive pacing of scan `scan_id` at `now_us`, for its status: `{connection:
/// {"requestsPerSecondPerInstance", "decreasedAt"}}` (empty: never paced). One query of the
/// scan's shard-0 partition, at most a page.
pub async fn rates_of<T: TableStore>(
    store: &T,
    table: &str,
    scan_id: &str,
    now_us: i64,
) -> Result<serde_json::Map<String, serde_json::Value>, StorageError> {
    use crate::storage::{CompareOp, Filter, Query};
    let pk = pace_partition(scan_id);
    let query = Query {
        filter: Some(Filter::and(vec![
            Filter::pk(CompareOp::Eq, pk.clone()),
            Filter::rk(CompareOp::Gt, "pace-"),
            Filter::rk(CompareOp::Lt, "pace."),
        ])),
        top: Some(100),
        select: None,
        continuation: None,
    };
    let page = store.query_page(table, &query).await?;
    let mut rates = serde_json::Map::new();
    for entity in page.entities {
        let p = &entity.properties;
        let rate = p.get_str(RATE).and_then(|s| s.parse::<f64>().ok());
        let at = p.get_str(RATE_AT).and_then(|s| s.parse::<i64>().ok());
        let (Some(rate), Some(at_us)) = (rate, at) else {
            continue;
        };
        let now = control::rate_at(Control { rate, at_us }, now_us);
        let name = entity.row_key.trim_start_matches("pace-").to_string();
        rates.insert(
            name,
            json!({
                "requestsPerSecondPerInstance": (now * 10.0).round() / 10.0,
                "decreasedAt": crate::app::tracking::format_time(
                    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(at_us) * 1000)
                        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
                ),
            }),
        );
    }
    Ok(rates)
}

/// This instance's view of one scan's pacing towards one account.
#[derive(Debug, Default)]
struct Local {
    control: Option<Control>,
    /// The next free send time (µs), spacing requests at the rate.
    next_free: f64,
    /// When to read the row next (µs).
    refresh_at: i64,
    /// The current 1-s window of sent requests: its start and count, and the last window's rate.
    window: (i64, u64, f64),
    /// Requests sent since the last decision.
    sent: u64,
    /// When this instance may decide next (µs).
    decide_at: i64,
}

impl Local {
    /// Counts a request sent at `now` and returns how long it waits first (µs).
    fn send(&mut self, now: i64) -> f64 {
        let (start, count, _) = self.window;
        if now - start >= 1_000_000 {
            let rate = count as f64 * 1e6 / (now - start) as f64;
            self.window = (now, 0, rate);
        }
        self.window.1 += 1;
        self.sent += 1;
        let Some(c) = self.control else { return 0.0 };
        let spacing = 1e6 / control::rate_at(c, now);
        let at = self.next_free.max(now as f64 - BURST_US);
        self.next_free = at + spacing;
        (at - now as f64).max(0.0)
    }

    /// Requests per second sent lately: the last full second's, or the current one's so far.
    fn measured(&self, now: i64) -> f64 {
        let (start, count, last) = self.window;
        let elapsed = (now - start).max(250_000) as f64 / 1e6;
        last.max(count as f64 / elapsed)
    }
}

/// One scan's pacing towards one account, on this instance; shared by its work items here.
pub struct AccountPacer {
    connection: String,
    rows: Arc<dyn Rows>,
    local: Mutex<Local>,
    /// Refusals seen and not yet acted on.
    pending: AtomicU64,
    /// Refusals seen in all (this instance).
    refused: AtomicU64,
    /// One row exchange at a time on this instance; the others go on meanwhile.
    busy: tokio::sync::Mutex<()>,
}

impl AccountPacer {
    pub fn new(connection: &str, rows: Arc<dyn Rows>) -> Self {
        AccountPacer {
            connection: connection.to_string(),
            rows,
            local: Mutex::default(),
            pending: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            busy: tokio::sync::Mutex::new(()),
        }
    }

    /// Records a refused attempt: the next request acts on it.
    pub fn refused(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals this instance saw towards the account.
    pub fn refusals(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The rate per instance now (`None`: not paced).
    pub fn rate(&self) -> Option<f64> {
        let control = self.local.lock().unwrap().control;
        control.map(|c| control::rate_at(c, now_us()))
    }

    /// Before one request to the account: acts on refusals and refreshes the row when due
    /// (returns the requests that cost), then waits for the request's time.
    pub async fn before_send(&self) -> Result<u64, StorageError> {
        let now = now_us();
        let due = {
            let local = self.local.lock().unwrap();
            let pending = self.pending.load(Ordering::Relaxed) > 0;
            (pending && local.decide_at <= now) || local.refresh_at <= now
        };
        let mut requests = 0;
        if due {
            if let Ok(_one) = self.busy.try_lock() {
                requests = self.exchange(now).await?;
            }
        }
        let wait = self.local.lock().unwrap().send(now_us());
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_micros(wait as u64)).await;
        }
        Ok(requests)
    }

    /// Reads the row, and decreases the rate if this instance saw congestion since its last
    /// decision (`control::decide`). Returns the requests sent.
    async fn exchange(&self, now: i64) -> Result<u64, StorageError> {
        let saw = {
            let mut local = self.local.lock().unwrap();
            let refused = match local.decide_at <= now {
                true => self.pending.swap(0, Ordering::Relaxed),
                false => 0,
            };
            let saw = Seen {
                sent: local.sent,
                refused,
                measured: local.measured(now),
            };
            if refused > 0 {
                local.sent = 0;
                local.decide_at = now + DECIDE_US;
            }
            saw
        };
        let cut_now = control::decide(None, now, saw).is_some();
        if !cut_now && self.local.lock().unwrap().refresh_at > now {
            return Ok(0);
        }
        let seen = self.rows.read(&self.connection).await?;
        let mut requests = 1;
        let mut control = seen.as_ref().map(|(c, _)| *c);
        if cut_now {
            if let Some(cut) = control::decide(control, now, saw) {
                requests += 1;
                match self
                    .rows
                    .write(&self.connection, cut, seen.map(|(_, e)| e))
                    .await
                {
                    Ok(()) => control = Some(cut),
                    // Another instance decided first: adopt its row.
                    Err(e) if lost(&e) => {
                        requests += 1;
                        control = self.rows.read(&self.connection).await?.map(|(c, _)| c);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let mut local = self.local.lock().unwrap();
        local.control = control;
        local.refresh_at = now
            + if control.is_some() {
                REFRESH_US
            } else {
                IDLE_REFRESH_US
            };
        Ok(requests)
    }
}

impl std::fmt::Debug for AccountPacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountPacer")
            .field("connection", &self.connection)
            .field("local", &self.local)
            .finish()
    }
}

impl std::fmt::Debug for ScanPacing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanPacing")
            .field("accounts", &self.accounts)
            .finish()
    }
}

fn lost(e: &StorageError) -> bool {
    matches!(
        e.kind,
        StorageErrorKind::PreconditionFailed | StorageErrorKind::Conflict
    )
}

/// One scan's account pacers on this instance, by connection.
pub struct ScanPacing {
    rows: Arc<dyn Rows>,
    accounts: Mutex<HashMap<String, Arc<AccountPacer>>>,
}

impl ScanPacing {
    pub fn new(rows: Arc<dyn Rows>) -> Self {
        ScanPacing {
            rows,
            accounts: Mutex::default(),
        }
    }

    /// The pacer towards `connection`'s account.
    pub fn account(&self, connection: &str) -> Arc<AccountPacer> {
        let mut accounts = self.accounts.lock().unwrap();
        if let Some(a) = accounts.get(connection) {
            return a.clone();
        }
        let pacer = Arc::new(AccountPacer::new(connection, self.rows.clone()));
        accounts.insert(connection.to_string(), pacer.clone());
        pacer
    }

    /// Each account's rate per instance now (`None`: not paced) and refusals seen here.
    pub fn rates(&self) -> Vec<(String, Option<f64>, u64)> {
        let accounts = self.accounts.lock().unwrap();
        let mut v: Vec<_> = accounts
            .iter()
            .map(|(k, a)| (k.clone(), a.rate(), a.refusals()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// This instance's scan pacings, by scan (cleared past 1,000 scans, as the limiter's pacers).
#[derive(Default)]
pub struct Pacings {
    scans: Mutex<HashMap<String, Arc<ScanPacing>>>,
}

impl Pacings {
    /// The pacing of `scan_id`, its rows made by `rows` on first use.
    pub fn get_or_make(
        &self,
        scan_id: &str,
        rows: impl FnOnce() -> Arc<dyn Rows>,
    ) -> Arc<ScanPacing> {
        let mut scans = self.scans.lock().unwrap();
        if let Some(p) = scans.get(scan_id) {
            return p.clone();
        }
        if scans.len() >= 1_000 {
            scans.clear();
        }
        let pacing = Arc::new(ScanPacing::new(rows()));
        scans.insert(scan_id.to_string(), pacing.clone());
        pacing
    }

    /// Every scan's pacing on this instance (the simulator reports them).
    pub fn all(&self) -> Vec<(String, Arc<ScanPacing>)> {
        let scans = self.scans.lock().unwrap();
        scans.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_keys_hold_no_forbidden_character() {
        assert_eq!(rate_row("AzureWebJobsStorage"), "pace-AzureWebJobsStorage");
        assert_eq!(rate_row("a/b\\c#d?e\u{1}"), "pace-a_b_c_d_e_");
    }

    #[test]
    fn an_unpaced_instance_never_waits_and_a_paced_one_spaces_its_requests() {
        let mut local = Local::default();
        for i in 0..1000 {
            assert_eq!(local.send(i), 0.0);
        }
        let now = 1_000_000;
        local.control = Some(Control {
            rate: 100.0,
            at_us: now,
        });
        // At 100/s: a burst of 50 ms (6 requests, slots from now - 50 ms to now), then one
        // every 10 ms.
        let waits: Vec<f64> = (0..8).map(|_| local.send(now)).collect();
        assert_eq!(&waits[..6], &[0.0; 6]);
        assert!(
            (waits[6] - 10_000.0).abs() < 1.0 && (waits[7] - 20_000.0).abs() < 1.0,
            "{waits:?}"
        );
    }
}
