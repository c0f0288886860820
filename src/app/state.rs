//! Shared handler state: configuration and storage clients, generic over the storage traits so
//! in-process tests can use any implementation.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;

use crate::storage::blob::{
    BlobListPage, BlobProperties, BlobStore, BlobWrite, BlockListing, Downloaded,
};
use crate::storage::stores::Stores;
use crate::storage::{
    BatchOperation, Entity, Page, Query, QueueStore, ReceivedMessage, StorageError, StorageResult,
    TableStore,
};

use crate::clock::Clock;

use super::config::{Config, STORAGE_SETTING};
use super::job::context::ScanContext;
use super::job::error::WorkError;
use super::job::registry::Drivers;
use super::pace::adaptive::{Pacings, TableRows};
use super::pace::lease::TableSchedule;
use super::pace::{Meter, Pacer, Pacers};
use super::tracking::{ScanState, Tracker};

/// How long a work item trusts a cached `running` state. Cancellation and failure are noticed
/// within this time; ended states never change and are kept.
const RUNNING_STATE_TTL: Duration = Duration::from_secs(2);
/// Bound on remembered scans (the map is cleared when it grows past this).
const MAX_CACHED_SCANS: usize = 10_000;

/// Recently read scan states and contexts. Every work item checks that its scan is still
/// running and reads what to do from the scan's recorded context; the scan record is a single
/// partition, so reading it for every item would cost a request per item and cap a big scan at
/// that partition's throughput.
#[derive(Default)]
pub struct ScanStateCache {
    entries: Mutex<HashMap<String, (ScanState, Instant)>>,
    /// Contexts never change once recorded: kept without expiry.
    contexts: Mutex<HashMap<String, Arc<ScanContext>>>,
}

impl ScanStateCache {
    /// The cached state if it can still be trusted.
    pub fn get(&self, scan_id: &str) -> Option<ScanState> {
        let entries = self.entries.lock().unwrap();
        let (state, seen) = entries.get(scan_id)?;
        (*state != ScanState::Running || seen.elapsed() < RUNNING_STATE_TTL).then_some(*state)
    }

    /// Records `state` as read now. An ended state is kept: a `running` read that began before
    /// the end was recorded here (a cancel this instance answered, a failure it recorded) does
    /// not hide it, since ended states never change.
    pub fn put(&self, scan_id: &str, state: ScanState) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= MAX_CACHED_SCANS {
            entries.clear();
        }
        let ended = |(s, _): &(ScanState, Instant)| *s != ScanState::Running;
        if state == ScanState::Running && entries.get(scan_id).is_some_and(ended) {
            return;
        }
        entries.insert(scan_id.to_string(), (state, Instant::now()));
    }

    /// The scan's recorded context, if read before.
    pub fn context(&self, scan_id: &str) -> Option<Arc<ScanContext>> {
        self.contexts.lock().unwrap().get(scan_id).cloned()
    }

    pub fn put_context(&self, context: Arc<ScanContext>) {
        let mut contexts = self.contexts.lock().unwrap();
        if contexts.len() >= MAX_CACHED_SCANS {
            contexts.clear();
        }
        contexts.insert(context.scan_id.clone(), context);
    }
}

/// Everything a request handler needs.
pub struct AppState<S: Stores> {
    pub config: Config,
    /// Table stores by connection (app-setting name); always holds `AzureWebJobsStorage`.
    pub tables: BTreeMap<String, S::Table>,
    /// Queues of the function app's own storage account (its work queues).
    pub queues: S::Queue,
    /// Queue stores by connection, for drivers that write to a queue on another connection
    /// ([`AppState::queue_store`]); the app's own account is always there.
    pub connection_queues: BTreeMap<String, S::Queue>,
    /// Blob stores by connection (export, import, indexes); a connection without a blob endpoint
    /// holds the error naming the setting to add, returned when blobs are used.
    pub blobs: BTreeMap<String, Result<S::Blob, StorageError>>,
    pub scan_states: ScanStateCache,
    /// The drivers scans can name (`drivers::registry`).
    pub drivers: Drivers<AppState<S>>,
    /// Per-app state of drivers (e.g. clients they reuse across invocations), one value per
    /// type: see [`AppState::driver_state`].
    driver_states: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// Pacers of the rate-limited scans this instance works on.
    pacers: Pacers,
    /// Adaptive pacing per scan and account (`pace::adaptive`), unless switched off.
    pub pacings: Option<Pacings>,
    /// Where the app's time of day comes from (`crate::clock`): every time it stores or decides
    /// on reads this clock, never the system's directly.
    pub clock: Clock,
}

impl<S: Stores> AppState<S> {
    /// The app with its own account's queues only and no blob stores, on the system's clock.
    pub fn new(
        config: Config,
        tables: BTreeMap<String, S::Table>,
        queues: S::Queue,
        drivers: Drivers<AppState<S>>,
    ) -> Arc<Self> {
        let connection_queues = [(STORAGE_SETTING.to_string(), queues.clone())].into();
        Self::with_connections(config, tables, connection_queues, BTreeMap::new(), drivers)
    }

    /// The app with stores by connection: tables, queues and blobs (a connection without a
    /// blob endpoint holds the error naming the setting to add, returned when blobs are used),
    /// on the system's clock. `tables` and `queues` must hold the app's own account.
    pub fn with_connections(
        config: Config,
        tables: BTreeMap<String, S::Table>,
        queues: BTreeMap<String, S::Queue>,
        blobs: BTreeMap<String, Result<S::Blob, StorageError>>,
        drivers: Drivers<AppState<S>>,
    ) -> Arc<Self> {
        assert!(
            tables.contains_key(STORAGE_SETTING) && queues.contains_key(STORAGE_SETTING),
            "the app's own storage account is required"
        );
        Arc::new(AppState {
            config,
            tables,
            queues: queues[STORAGE_SETTING].clone(),
            connection_queues: queues,
            blobs,
            scan_states: ScanStateCache::default(),
            drivers,
            driver_states: Mutex::default(),
            pacers: Pacers::default(),
            pacings: Some(Pacings::default()),
            clock: Clock::system(),
        })
    }

    /// This app on `clock` instead of the system's (a test's manual clock, the simulator's
    /// virtual one). For a state just made: panics if anything else holds it already.
    pub fn on_clock(mut self: Arc<Self>, clock: Clock) -> Arc<Self> {
        Arc::get_mut(&mut self)
            .expect("the clock is given to a state just made")
            .clock = clock;
        self
    }

    /// The table store of `connection`, counting requests into `requests`.
    pub fn counted_table(
        &self,
        connection: &str,
        requests: &Arc<Meter>,
    ) -> Result<Counted<S::Table>, WorkError> {
        let store = self.tables.get(connection).ok_or_else(|| {
            WorkError::Failed(format!(
                "connection {connection} is not configured on this app"
            ))
        })?;
        Ok(Counted::new(store.clone(), requests.clone()).on_connection(connection))
    }

    /// The bookkeeping store, counting requests into `requests` and spending the tokens
    /// taken ahead first ([`Counted::prepaid`]).
    pub fn prepaid_bookkeeping(&self, requests: &Arc<Meter>) -> Counted<S::Table> {
        Counted::prepaid(self.bookkeeping().clone(), requests.clone())
    }

    /// The queue store of `connection` (e.g. a driver's target queue on another account),
    /// counting requests into `requests`.
    pub fn queue_store(
        &self,
        connection: &str,
        requests: &Arc<Meter>,
    ) -> StorageResult<Counted<S::Queue>> {
        match self.connection_queues.get(connection) {
            Some(store) => {
                Ok(Counted::new(store.clone(), requests.clone()).on_connection(connection))
            }
            None => Err(StorageError::invalid_input(format!(
                "connection {connection} has no queue store configured on this app"
            ))),
        }
    }

    /// The app's one value of type `V`, made by `make` on first use: lets a driver keep what it
    /// reuses across invocations (clients of another service, caches) in its own module.
    pub fn driver_state<V: Send + Sync + 'static>(&self, make: impl FnOnce() -> V) -> Arc<V> {
        let mut states = self.driver_states.lock().unwrap();
        let state = states
            .entry(TypeId::of::<V>())
            .or_insert_with(|| Arc::new(make()));
        state.clone().downcast().expect("keyed by its type")
    }

    /// The blob store of `connection`, counting requests into `requests`; an error naming the
    /// setting to add if the connection has no blob endpoint.
    pub fn blob_store(
        &self,
        connection: &str,
        requests: &Arc<Meter>,
    ) -> StorageResult<Counted<S::Blob>> {
        match self.blobs.get(connection) {
            Some(Ok(store)) => {
                Ok(Counted::new(store.clone(), requests.clone()).on_connection(connection))
            }
            Some(Err(e)) => Err(e.clone()),
            None => Err(StorageError::invalid_input(format!(
                "connection {connection} has no blob store configured on this app"
            ))),
        }
    }

    /// The pacer of `scan`'s requests if it has a rate limit (`maxRequestsPerSecond`), shared
    /// by the scan's work items on this instance; `None` for a scan without one.
    pub fn pacer_for(&self, scan: &ScanContext) -> Option<Arc<Pacer>> {
        let limit = scan.max_requests_per_second?;
        Some(self.pacers.get_or_make(&scan.scan_id, limit, || {
            Box::new(TableSchedule::new(
                self.bookkeeping().clone(),
                self.config.work_table.clone(),
                scan.scan_id.clone(),
            ))
        }))
    }

    /// Paces `requests` of `scan` adaptively per account (`pace::adaptive`), unless this app
    /// has adaptive pacing switched off ([`AppState::without_adaptive_pacing`]).
    pub fn adapt(&self, scan: &ScanContext, requests: &Meter) {
        let Some(pacings) = &self.pacings else {
            return;
        };
        let pacing = pacings.get_or_make(&scan.scan_id, || {
            Arc::new(TableRows {
                store: self.bookkeeping().clone(),
                table: self.config.work_table.clone(),
                scan_id: scan.scan_id.clone(),
            })
        });
        requests.adapt_by(pacing);
    }

    /// This app without adaptive pacing (the simulator's runs of the earlier behaviour). For a
    /// state just made: panics if anything else holds it already.
    pub fn without_adaptive_pacing(mut self: Arc<Self>) -> Arc<Self> {
        Arc::get_mut(&mut self)
            .expect("switched off on a state just made")
            .pacings = None;
        self
    }

    /// The store holding the bookkeeping tables.
    pub fn bookkeeping(&self) -> &S::Table {
        &self.tables[STORAGE_SETTING]
    }

    /// Bookkeeping through `store` (usually a counting wrapper of [`AppState::bookkeeping`]),
    /// on the app's clock.
    pub fn tracker_on<'a, T: TableStore>(&'a self, store: &'a T) -> Tracker<'a, T> {
        Tracker::new(store, &self.config.scans_table, &self.config.work_table)
            .with_end_hook(self)
            .with_clock(&self.clock)
    }
}

/// Wraps a store and counts the requests made through it (one per logical call; the adapter's
/// own retries are not visible here), so each work item can report its storage requests; a
/// rate-limited scan's requests wait for their token here (`pace`), or, through a
/// [`Counted::prepaid`] store, spend the tokens the work item took ahead.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    count: Arc<Meter>,
    wait: bool,
    /// The connection whose account the requests go to (adaptive pacing is per account).
    connection: Arc<str>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, count: Arc<Meter>) -> Self {
        Counted {
            inner,
            count,
            wait: true,
            connection: Arc::from(STORAGE_SETTING),
        }
    }

    /// The store of `connection` (the app's own account by default).
    pub fn on_connection(mut self, connection: &str) -> Self {
        self.connection = Arc::from(connection);
        self
    }

    /// A store whose requests spend the tokens the work item took ahead (`Meter::prepay`)
    /// before waiting for new ones: for a work item's commit, whose optimistic read-and-write
    /// of a counter shard must not be stretched by token waits, or instances contend on the
    /// shard (pace module, invariant 1).
    pub fn prepaid(inner: S, count: Arc<Meter>) -> Self {
        Counted {
            inner,
            count,
            wait: false,
            connection: Arc::from(STORAGE_SETTING),
        }
    }

    /// Counts the request about to be sent (waiting for its token if the scan is paced and
    /// no token was taken ahead for it).
    async fn tick(&self) -> StorageResult<()> {
        match self.wait {
            true => self.count.tick().await,
            false => self.count.tick_prepaid().await,
        }
    }
}

impl<S: TableStore> TableStore for Counted<S> {
    async fn query_page(&self, table: &str, query: &Query) -> StorageResult<Page> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.query_page(table, query))
            .await
    }
    async fn submit_batch_with_etags(
        &self,
        table: &str,
        pk: &str,
        operations: &[BatchOperation],
    ) -> StorageResult<Vec<Option<String>>> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.submit_batch_with_etags(table, pk, operations),
            )
            .await
    }
    async fn get_entity(
        &self,
        table: &str,
        pk: &str,
        rk: &str,
    ) -> StorageResult<Option<(Entity, String)>> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.get_entity(table, pk, rk))
            .await
    }
    async fn create_table(&self, table: &str) -> StorageResult<bool> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.create_table(table))
            .await
    }
    async fn delete_table(&self, table: &str) -> StorageResult<bool> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.delete_table(table))
            .await
    }
}

impl<S: QueueStore> QueueStore for Counted<S> {
    async fn create_queue(&self, queue: &str) -> StorageResult<()> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.create_queue(queue))
            .await
    }
    async fn delete_queue(&self, queue: &str) -> StorageResult<bool> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.delete_queue(queue))
            .await
    }
    async fn put_message(&self, queue: &str, text: &str, delay: Duration) -> StorageResult<()> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.put_message(queue, text, delay))
            .await
    }
    async fn put_message_never_expiring(&self, queue: &str, text: &str) -> StorageResult<()> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.put_message_never_expiring(queue, text),
            )
            .await
    }
    async fn get_messages(
        &self,
        queue: &str,
        max: u8,
        visibility: Duration,
    ) -> StorageResult<Vec<ReceivedMessage>> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.get_messages(queue, max, visibility),
            )
            .await
    }
    async fn delete_message(&self, queue: &str, id: &str, pop_receipt: &str) -> StorageResult<()> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.delete_message(queue, id, pop_receipt),
            )
            .await
    }
    async fn update_message(
        &self,
        queue: &str,
        id: &str,
        pop: &str,
        visibility: Duration,
        text: Option<&str>,
    ) -> StorageResult<String> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.update_message(queue, id, pop, visibility, text),
            )
            .await
    }
    async fn approximate_count(&self, queue: &str) -> StorageResult<u64> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.approximate_count(queue))
            .await
    }
}

impl<S: BlobStore> BlobStore for Counted<S> {
    async fn create_container(&self, container: &str) -> StorageResult<bool> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.create_container(container))
            .await
    }
    async fn upload(
        &self,
        container: &str,
        name: &str,
        body: Bytes,
        write: &BlobWrite,
    ) -> StorageResult<String> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.upload(container, name, body, write),
            )
            .await
    }
    async fn put_block(
        &self,
        container: &str,
        name: &str,
        id: &str,
        body: Bytes,
    ) -> StorageResult<()> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.put_block(container, name, id, body),
            )
            .await
    }
    async fn commit_blocks(
        &self,
        container: &str,
        name: &str,
        ids: &[String],
        write: &BlobWrite,
    ) -> StorageResult<String> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.commit_blocks(container, name, ids, write),
            )
            .await
    }
    async fn block_list(&self, container: &str, name: &str) -> StorageResult<BlockListing> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.block_list(container, name))
            .await
    }
    async fn download(&self, container: &str, name: &str, max: u64) -> StorageResult<Downloaded> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.download(container, name, max))
            .await
    }
    async fn download_range(&self, c: &str, name: &str, at: u64, len: u64) -> StorageResult<Bytes> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.download_range(c, name, at, len),
            )
            .await
    }
    async fn properties(
        &self,
        container: &str,
        name: &str,
    ) -> StorageResult<Option<BlobProperties>> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.properties(container, name))
            .await
    }
    async fn list(
        &self,
        container: &str,
        prefix: &str,
        max: u32,
        marker: Option<&str>,
    ) -> StorageResult<BlobListPage> {
        self.tick().await?;
        self.count
            .send(
                &self.connection,
                self.inner.list(container, prefix, max, marker),
            )
            .await
    }
    async fn delete(&self, container: &str, name: &str) -> StorageResult<bool> {
        self.tick().await?;
        self.count
            .send(&self.connection, self.inner.delete(container, name))
            .await
    }
}

#[cfg(all(test, feature = "lab"))]
mod tests {
    use super::*;
    use crate::lab::memory::{MemoryQueueStore, MemoryStores, MemoryTableStore};
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_driver_state_is_made_once_per_type() {
        let config = Config::from_lookup(|name| {
            (name == STORAGE_SETTING).then(|| "UseDevelopmentStorage=true".to_string())
        })
        .unwrap();
        let tables = [(STORAGE_SETTING.to_string(), MemoryTableStore::default())].into();
        let state = AppState::<MemoryStores>::new(
            config,
            tables,
            MemoryQueueStore::default(),
            Drivers::new(Vec::new()),
        );
        let made = AtomicU64::new(0);
        let make = || {
            made.fetch_add(1, Ordering::Relaxed);
            String::from("clients")
        };
        assert_eq!(*state.driver_state(make), "clients");
        assert_eq!(*state.driver_state(make), "clients");
        assert_eq!(*state.driver_state(|| 7u32), 7);
        assert_eq!(made.load(Ordering::Relaxed), 1);
    }
}
