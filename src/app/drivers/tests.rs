//! The seam's own paths, with probe drivers that are not registered: the completion step, and
//! a driver that scans no table.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::kit::hooks::hooks;
use super::*;
use crate::app::config::Config;
use crate::app::error::ApiError;
use crate::app::job::{
    accepts, item_child, Begun, Driver, DriverName, RangeWork, ScanContext, ScanRequest, Segment,
    Setup, TableRef, WorkError, WorkOutcome, WorkSplit,
};
use crate::app::messages::{self, ChildSpec, ItemMessage};
use crate::app::state::AppState;
use crate::app::tracking::{Counters, NewWork, ScanRecord, ScanState, WorkState};
use crate::app::work::Runner;
use crate::lab::memory::MemoryTableStore;
use crate::lab::memory::{MemoryQueueStore, MemoryStores};
use crate::scan::{ScanParameters, Scanner, Strategy};
use crate::storage::stores::Stores;
use crate::storage::{Entity, TableStore};

/// A driver whose completion step fails transiently once (`MODE` 0) or for good (1), then
/// writes a marker row; it counts its runs. `SCANS`: whether it scans a table.
struct Probe<const SCANS: bool = true>;
static RUNS: AtomicU32 = AtomicU32::new(0);
static MODE: AtomicU32 = AtomicU32::new(0);

impl<const SCANS: bool> Driver for Probe<SCANS> {
    const NAME: &'static str = "probe";
    const COMPLETES: bool = true;
    const SCANS_TABLE: bool = SCANS;
    type Fields = count::NoFields;
    type Options = ();
    type Item = RangeWork;
    fn validate(_: &Self::Fields, _: &ScanRequest, _: &Config) -> Result<(), ApiError> {
        Ok(())
    }
    fn setup(_: &Self::Fields, _: &ScanRequest) -> Setup<()> {
        Setup::default()
    }
    fn segment(_: &ScanContext, _: &[Entity]) -> Segment<Self::Item> {
        Segment::default()
    }
    fn root<T: TableStore>(context: &ScanContext) -> Result<ChildSpec, WorkError> {
        if SCANS {
            return Ok(ChildSpec::Step(Scanner::<T>::root(context.strategy)));
        }
        item_child::<Self>(&RangeWork::Rows {
            pk: "manifest".into(),
            row_keys: vec!["part-0".into()],
        })
    }
    async fn run<S: Stores>(
        _: &AppState<S>,
        _: &Begun<ItemMessage>,
        _: Self::Item,
    ) -> Result<WorkOutcome, WorkError> {
        Ok(WorkOutcome::default())
    }
    async fn complete<S: Stores>(
        state: &AppState<S>,
        context: &ScanContext,
    ) -> Result<(), WorkError> {
        let run = RUNS.fetch_add(1, Ordering::SeqCst);
        match MODE.load(Ordering::SeqCst) {
            0 if run == 0 => Err(WorkError::Failed("not yet".into())),
            1 => Err(WorkError::Permanent("manifest too large".into())),
            _ => {
                let marker = Entity::new(context.scan_id.as_str(), "manifest");
                let op = crate::storage::BatchOperation::Upsert(marker);
                let store = state.bookkeeping();
                store.create_table("Marks").await?;
                store.submit_batch("Marks", &context.scan_id, &[op]).await?;
                Ok(())
            }
        }
    }
}

/// A prefix scan of table `Source` by driver `probe` (no limit, no options).
pub(crate) fn test_context(id: &str) -> ScanContext {
    ScanContext {
        scan_id: id.into(),
        shards: 2,
        driver: DriverName::new("probe"),
        strategy: Strategy::Prefix,
        source: TableRef {
            connection: crate::app::config::STORAGE_SETTING.into(),
            table: "Source".into(),
        },
        destination: None,
        params: ScanParameters::default(),
        work_split: WorkSplit::Page,
        filter: None,
        select: None,
        options: None,
        in_step: false,
        max_requests_per_second: None,
    }
}

/// A scan with one work item, finished, on a fresh app.
async fn drained_scan(id: &str) -> (Arc<AppState<MemoryStores>>, ScanContext) {
    let config = crate::app::config::emulator_only();
    let tables = [(
        crate::app::config::STORAGE_SETTING.to_string(),
        MemoryTableStore::default(),
    )]
    .into();
    let drivers = Drivers::new(vec![hooks::<Probe, MemoryStores>()]);
    let state = AppState::<MemoryStores>::new(config, tables, MemoryQueueStore::default(), drivers);
    let context = test_context(id);
    let tracker = state.tracker_on(state.bookkeeping());
    tracker.ensure_tables().await.unwrap();
    let root_id = messages::work_id(&crate::app::messages::StepMessage {
        scan_id: id.into(),
        step: crate::scan::Step::Start,
        shard: None,
    });
    let root = NewWork {
        shard: messages::shard_of(&root_id, 2),
        id: root_id,
        kind: "scan-step",
    };
    tracker.create_scan_work(id, 2, &root).await.unwrap();
    let record = ScanRecord {
        id: id.into(),
        state: ScanState::Running,
        request: serde_json::json!({}),
        context: Some(context.clone()),
        shards: 2,
        started_at: time::OffsetDateTime::now_utc(),
        completed_at: None,
        error: None,
        etag: String::new(),
    };
    tracker.insert_scan(&record).await.unwrap();
    let Some(WorkState::Pending { etag }) =
        tracker.work_state(id, root.shard, &root.id).await.unwrap()
    else {
        panic!("root registered")
    };
    tracker
        .complete(
            id,
            root.shard,
            &root.id,
            &etag,
            Counters::default(),
            None,
            None,
            None,
        )
        .await
        .unwrap();
    (state, context)
}

/// A driver that scans no table refuses the scan's fields, and its root is its own item.
#[test]
fn a_driver_without_a_table_refuses_scan_fields() {
    let config = crate::app::config::emulator_only();
    let parse = |body: serde_json::Value| {
        crate::app::job::request::parse_request(body.to_string().as_bytes(), &["count"]).unwrap()
    };
    for (field, value) in [
        ("sourceTable", serde_json::json!("Src")),
        ("partitionKeyPrefix", serde_json::json!("a")),
        ("partitionKeyUpperBound", serde_json::json!("b")),
        ("takeCount", serde_json::json!(5)),
        ("strategy", serde_json::json!("serial")),
    ] {
        let mut request = parse(serde_json::json!({"driver": "count", field: value}));
        match request.validate(accepts::<Probe<false>>(), &config) {
            Err(ApiError::InvalidField { field: f, message }) => {
                assert_eq!(f, field);
                assert!(message.contains("scans no table"), "{message}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    let mut request = parse(serde_json::json!({"driver": "count"}));
    request
        .validate(accepts::<Probe<false>>(), &config)
        .unwrap();
    assert!(
        request.validate(accepts::<Probe<true>>(), &config).is_err(),
        "sourceTable is required"
    );
    let context = test_context("1-c");
    let root = Probe::<false>::root::<MemoryTableStore>(&context).unwrap();
    assert!(matches!(root, ChildSpec::Item(_)), "{root:?}");
}

async fn recorded(state: &AppState<MemoryStores>, id: &str) -> ScanRecord {
    state
        .tracker_on(state.bookkeeping())
        .get_scan(id)
        .await
        .unwrap()
        .unwrap()
}

/// The completion step runs before the scan is recorded completed; a transient failure
/// leaves it running for the next drained check, a permanent one fails it with the reason.
#[tokio::test]
async fn the_completion_step_runs_before_the_scan_completes() {
    MODE.store(0, Ordering::SeqCst);
    let (state, scan) = drained_scan("1-a").await;
    let tracker = state.tracker_on(state.bookkeeping());
    let e = Runner::new(&state)
        .complete_if_drained(&tracker, &scan, None)
        .await;
    assert!(e.is_err_and(|e| e.is_transient()));
    assert_eq!(recorded(&state, "1-a").await.state, ScanState::Running);
    assert!(Runner::new(&state)
        .complete_if_drained(&tracker, &scan, None)
        .await
        .unwrap());
    assert_eq!(recorded(&state, "1-a").await.state, ScanState::Completed);
    assert!(state
        .bookkeeping()
        .get_entity("Marks", "1-a", "manifest")
        .await
        .unwrap()
        .is_some());
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);

    MODE.store(1, Ordering::SeqCst);
    let (state, scan) = drained_scan("2-b").await;
    let tracker = state.tracker_on(state.bookkeeping());
    assert!(Runner::new(&state)
        .complete_if_drained(&tracker, &scan, None)
        .await
        .unwrap());
    let record = recorded(&state, "2-b").await;
    assert_eq!(record.state, ScanState::Failed);
    assert!(record.error.unwrap().contains("manifest too large"));
}
