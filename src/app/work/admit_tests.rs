//! A rate-limited item whose instance's backlog stays past `ADMIT_BACKLOG` for `MAX_ADMIT_WAIT`
//! is deferred: its message is put again (base64, as tablescan's queues hold it), invisible
//! until about the backlog has passed, and the delivery ends well. In paused (virtual) time,
//! on the in-memory stores.

use std::time::Duration;

use axum::http::StatusCode;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::begin::{ADMIT_BACKLOG, MAX_ADMIT_WAIT};
use super::Runner;
use crate::app::config::STORAGE_SETTING;
use crate::app::drivers::tests::test_context;
use crate::app::job::{Drivers, ScanContext};
use crate::app::messages::ItemMessage;
use crate::app::pace::Meter;
use crate::app::protocol::QueueInvocation;
use crate::app::state::AppState;
use crate::lab::memory::{MemoryQueueStore, MemoryStores, MemoryTableStore};
use crate::storage::{QueueStore, TableStore};

const LIMIT: u32 = 10;

fn limited_scan() -> ScanContext {
    ScanContext {
        max_requests_per_second: Some(LIMIT),
        ..test_context("8000000000000-admit000")
    }
}

#[tokio::test(start_paused = true)]
async fn an_item_that_waits_past_the_admit_bound_is_queued_again_behind_the_backlog() {
    let config = crate::app::config::emulator_only();
    let tables = [(STORAGE_SETTING.to_string(), MemoryTableStore::default())].into();
    let queues = MemoryQueueStore::default();
    let state = AppState::<MemoryStores>::new(config, tables, queues.clone(), Drivers::new(vec![]));
    state
        .bookkeeping()
        .create_table(&state.config.work_table)
        .await
        .unwrap();
    let queue = state.config.table_copy_queue.clone();
    queues.create_queue(&queue).await.unwrap();
    let scan = limited_scan();
    // Other items on this instance take 1,500 tokens at 10/s: about 155 s of slots ahead.
    let pacer = state.pacer_for(&scan).expect("a limited scan has a pacer");
    let busy: Vec<_> = (0..1_500)
        .map(|_| {
            let meter = Meter::new();
            meter.pace_by(pacer.clone());
            tokio::spawn(async move { meter.tick().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let ahead = pacer.backlog();
    assert!(ahead > MAX_ADMIT_WAIT + ADMIT_BACKLOG, "backlog {ahead:?}");

    let invocation = QueueInvocation {
        message: r#"{"v":1}"#.into(),
        dequeue_count: 1,
        id: Some("m-1".into()),
    };
    let started = tokio::time::Instant::now();
    let requests = Meter::new();
    let reply = Runner::new(&state)
        .admit::<ItemMessage>(&scan, &requests, &invocation, "t-admit")
        .await
        .expect_err("deferred, not admitted");
    let waited = started.elapsed();

    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.logs);
    assert!(reply.logs[0].contains("queued again"), "{:?}", reply.logs);
    assert!(
        waited >= MAX_ADMIT_WAIT && waited < MAX_ADMIT_WAIT + Duration::from_secs(2),
        "waited {waited:?}"
    );
    // The copy is on the item's queue, invisible for about the backlog left (plus < 5 s).
    let left = ahead - waited;
    assert_eq!(queues.len(&queue), 1);
    assert_eq!(queues.visible(&queue, 1), 0);
    tokio::time::sleep(left - Duration::from_secs(2)).await;
    assert_eq!(
        queues.visible(&queue, 1),
        0,
        "visible before the backlog passed"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        queues.visible(&queue, 1),
        1,
        "visible once the backlog passed"
    );
    // The copy is what the queue trigger decodes: the message's text, base64 (the host hands the
    // handler the text decoded). Read with the base64 crate, not tablescan's decoder.
    let copy = queues
        .get_messages(&queue, 1, Duration::from_secs(30))
        .await
        .unwrap();
    let decoded = STANDARD.decode(&copy[0].text).expect("the copy is base64");
    assert_eq!(decoded, invocation.message.as_bytes());
    assert_eq!(queues.len(&state.config.prefix_scan_queue), 0);
    for task in busy {
        task.await.unwrap();
    }
}
