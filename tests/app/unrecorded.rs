//! A root message delivered before its scan's record exists. The starter queues the root and
//! then writes the record; under storage faults one start took 11 s, while the host delivered
//! the root five times in two. Before, the last delivery dropped the message ("does not
//! exist"), and the scan stayed `running` for ever with no root (`faults::
//! storage_faults_through_the_proxy` hung so once). Now a message whose scan may still be
//! recorded is put back on its live queue, delayed, on its last delivery and from the poison
//! queue; one whose id cannot be a start in progress (too old, or in the future) is dropped.
//! On a manual clock: the delay is the clock's, and the queue holds the message until it is due.

use crate::support;

use std::time::Duration;

use axum::http::StatusCode;
use time::OffsetDateTime;

use support::router::{call, queue_payload, InProcessApp};
use tablescan::app::messages::{encode, StepMessage};
use tablescan::clock::Clock;
use tablescan::scan::Step;
use tablescan::storage::{MessageEncoding, QueueStore};

/// The root step's message of scan `id`, as the host hands it to the function.
fn root(id: &str) -> String {
    let message = StepMessage {
        scan_id: id.to_string(),
        step: Step::Start,
        shard: None,
    };
    let text = encode(&message).unwrap();
    String::from_utf8(MessageEncoding::Base64.decode(&text).unwrap()).unwrap()
}

/// A scan id as a start at `at` makes it (inverted milliseconds, then a random part).
fn id_at(at: OffsetDateTime) -> String {
    let millis = (at.unix_timestamp_nanos() / 1_000_000) as u64;
    format!("{:013}-0badcafe", 9_999_999_999_999u64 - millis)
}

/// Delivers `text` to `function` as delivery `count` of 5 (the default `maxDequeueCount`).
async fn deliver(t: &InProcessApp, function: &str, text: &str, count: u64) -> (StatusCode, String) {
    let payload = queue_payload(function, text, count, "m-1");
    let (status, reply) = call(&t.state, "POST", &format!("/{function}"), Some(payload)).await;
    (status, reply.to_string())
}

#[tokio::test]
async fn a_root_whose_scan_is_not_recorded_yet_is_put_back_on_its_last_delivery() {
    let start = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let t = InProcessApp::start(&[]).on_clock(Clock::manual(start));
    // The starter made the queue before it put the root.
    t.queues.create_queue(&t.prefix_queue).await.unwrap();
    let text = root(&id_at(start - Duration::from_secs(11)));

    let (status, reply) = deliver(&t, "PrefixScan", &text, 1).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(reply.contains("is not recorded yet"), "{reply}");
    assert!(t.host_queues.held().is_empty());

    let (status, reply) = deliver(&t, "PrefixScan", &text, 5).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(reply.contains("put back"), "{reply}");
    let held = t.host_queues.held();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].queue.as_str(), held[0].due, held[0].decoded()),
        (
            t.prefix_queue.as_str(),
            start + Duration::from_secs(10),
            text.clone()
        )
    );

    // From the poison queue (the put back failed on the last delivery): the same.
    let (status, reply) = deliver(&t, "PrefixScanPoison", &text, 1).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(reply.contains("put back"), "{reply}");
    assert_eq!(t.host_queues.held().len(), 2);
}

#[tokio::test]
async fn a_root_whose_scan_can_no_longer_be_recorded_is_dropped() {
    let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let t = InProcessApp::start(&[]).on_clock(Clock::manual(now));
    let old = root(&id_at(now - Duration::from_secs(16 * 60)));
    let future = root(&id_at(now + Duration::from_secs(6 * 60)));
    for (text, count) in [(&old, 1), (&old, 5), (&future, 5)] {
        let (status, reply) = deliver(&t, "PrefixScan", text, count).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert!(reply.contains("dropping the message"), "{reply}");
    }
    for text in [&old, &future] {
        let (status, reply) = deliver(&t, "PrefixScanPoison", text, 1).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert!(reply.contains("which does not exist"), "{reply}");
    }
    assert!(t.host_queues.held().is_empty(), "nothing put back");
}
