//! `tablescan host` queue triggers against real Azurite and the test handler: payload on the
//! wire, retries and poison, decode failures, timeouts, concurrency, several instances, shutdown.
//!
//! Each test proves its behaviour by events (the handler's records, the host's log, messages in
//! queues), never by how long something took. Invocations that must stay in flight hold on a gate
//! the test opens (`{"hold": gate}`); the host's delays (function timeout, polling backoff,
//! settlement) are unit-tested in `src/lab/host/`. `LONG` only catches a hang.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::host::*;
use serde_json::{json, Value};
use tablescan::lab::host::{Host, RunningHost};
use tablescan::storage::azure_queue::AzureQueueStore;
use tablescan::storage::{MessageEncoding, QueueStore};

const LONG: Duration = Duration::from_secs(90);

/// A queue-triggered function `Work` reading the queue named by app setting `WORK_QUEUE`.
fn queue_app(queues: Value, host_extra: Value) -> (App, String) {
    let queue = support::unique_name("hostq");
    let mut extensions = json!({ "maxPollingInterval": "00:00:00.200" });
    if let (Value::Object(e), Value::Object(q)) = (&mut extensions, queues) {
        e.extend(q);
    }
    let mut host = json!({ "extensions": { "queues": extensions } });
    if let (Value::Object(h), Value::Object(x)) = (&mut host, host_extra) {
        h.extend(x);
    }
    let app = App::new(host, json!({}))
        .function(
            "Work",
            json!({ "bindings": [{ "name": "item", "type": "queueTrigger", "direction": "in", "queueName": "%WORK_QUEUE%" }] }),
        )
        // Upper case on purpose: the host lower-cases resolved queue names.
        .setting("WORK_QUEUE", &queue.to_ascii_uppercase())
        .setting("AzureWebJobsStorage", &support::azurite().connection_string());
    (app, queue)
}

async fn start(app: &App, instances: usize) -> RunningHost {
    Host::start_azure(app.config(instances))
        .await
        .expect("host starts")
}

fn store() -> AzureQueueStore {
    support::queue_store().0
}

async fn put_json(store: &AzureQueueStore, queue: &str, message: &Value) {
    store.create_queue(queue).await.unwrap();
    let text = MessageEncoding::Base64.encode(message.to_string().as_bytes());
    store
        .put_message(queue, &text, Duration::ZERO)
        .await
        .unwrap();
}

/// Handler requests for the `Work` function, with their decoded envelope.
fn invocations(app: &App) -> Vec<(Value, Value)> {
    app.requests()
        .into_iter()
        .filter(|r| r["path"] == "/Work")
        .map(|r| {
            let envelope: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
            (r, envelope)
        })
        .collect()
}

/// The trigger value after undoing the host's double encoding.
fn item(envelope: &Value) -> Value {
    let once: String = serde_json::from_str(envelope["Data"]["item"].as_str().unwrap()).unwrap();
    serde_json::from_str(&once).unwrap()
}

async fn count(store: &AzureQueueStore, queue: &str) -> u64 {
    store.approximate_count(queue).await.unwrap_or(0)
}

/// Texts currently in a queue (received with a short visibility so they reappear).
async fn texts(store: &AzureQueueStore, queue: &str) -> Vec<String> {
    match store.get_messages(queue, 32, Duration::from_secs(1)).await {
        Ok(ms) => ms.into_iter().map(|m| m.text).collect(),
        Err(_) => Vec::new(),
    }
}

/// Waits until `queue` holds `n` messages (visible or not).
async fn wait_count(store: &AzureQueueStore, queue: &str, n: u64) {
    wait_for(&format!("{n} message(s) in {queue}"), LONG, || async {
        let seen = count(store, queue).await;
        if seen == n {
            Ok(())
        } else {
            Err(format!("{seen} message(s)"))
        }
    })
    .await;
}

async fn wait_queue_empty(store: &AzureQueueStore, queue: &str) {
    wait_count(store, queue, 0).await;
}

/// Waits until the handler(s) recorded `n` invocations of `Work`; them, in order.
async fn wait_invocations(app: &App, n: usize) -> Vec<(Value, Value)> {
    wait_for(&format!("{n} invocation(s)"), LONG, || {
        let seen = invocations(app);
        async move {
            if seen.len() >= n {
                Ok(seen)
            } else {
                Err(seen)
            }
        }
    })
    .await
}

fn parse_time(text: &Value) -> time::OffsetDateTime {
    let text = text.as_str().unwrap();
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn is_iso_seconds(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 25
        && s.ends_with("+00:00")
        && b[4] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && s[..19].bytes().filter(u8::is_ascii_digit).count() == 14
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_payload_on_the_wire_matches_the_host_format() {
    let (app, queue) = queue_app(json!({}), json!({}));
    let store = store();
    let message = json!({ "orderId": 42, "sku": "A-1" });
    // Compact JSON text exactly as in the example of docs/custom-handler-protocol.md §3.3.
    store.create_queue(&queue).await.unwrap();
    let raw = r#"{"orderId":42,"sku":"A-1"}"#;
    store
        .put_message(
            &queue,
            &MessageEncoding::Base64.encode(raw.as_bytes()),
            Duration::ZERO,
        )
        .await
        .unwrap();
    let host = start(&app, 1).await;
    let (request, envelope) = wait_invocations(&app, 1).await.remove(0);
    wait_queue_empty(&store, &queue).await;
    host.shutdown().await;

    assert_eq!(request["method"], "POST");
    assert_eq!(
        header(&request, "content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(header(&request, "transfer-encoding"), Some("chunked"));
    assert_host_headers(&request, "Azure-Functions-Host/4.0.0.0");

    let meta = &envelope["Metadata"];
    let id = meta["Id"].as_str().unwrap();
    let pop = meta["PopReceipt"].as_str().unwrap();
    assert!(
        id.starts_with('"') && id.ends_with('"') && id.len() > 2,
        "{id}"
    );
    assert!(
        pop.starts_with('"') && pop.ends_with('"') && pop.len() > 2,
        "{pop}"
    );
    for key in ["ExpirationTime", "InsertionTime", "NextVisibleTime"] {
        assert!(
            is_iso_seconds(meta[key].as_str().unwrap()),
            "{key}: {}",
            meta[key]
        );
    }
    let utc_now = meta["sys"]["UtcNow"].as_str().unwrap();
    assert!(
        utc_now.len() == 28 && utc_now.ends_with('Z') && utc_now.as_bytes()[19] == b'.',
        "{utc_now}"
    );
    assert!(uuid::Uuid::parse_str(meta["sys"]["RandGuid"].as_str().unwrap()).is_ok());
    // NextVisibleTime is the 10-minute receive visibility counted from the receive, which came
    // after the insertion and before the invocation (UtcNow); whole seconds, cut down.
    let visibility = time::Duration::seconds(600);
    let (insertion, next) = (
        parse_time(&meta["InsertionTime"]),
        parse_time(&meta["NextVisibleTime"]),
    );
    assert!(
        next > insertion + visibility - time::Duration::seconds(1),
        "{insertion} {next}"
    );
    assert!(
        next <= parse_time(&meta["sys"]["UtcNow"]) + visibility,
        "{meta}"
    );

    // Byte for byte: the layout of docs/custom-handler-protocol.md §3.3 with this message's values.
    let expected = format!(
        r#"{{"Data":{{"item":"\"{{\\\"orderId\\\":42,\\\"sku\\\":\\\"A-1\\\"}}\""}},"Metadata":{{"DequeueCount":"1","ExpirationTime":"{}","Id":{},"InsertionTime":"{}","NextVisibleTime":"{}","PopReceipt":{},"sys":{{"MethodName":"Work","UtcNow":"{}","RandGuid":"{}"}}}}}}"#,
        meta["ExpirationTime"].as_str().unwrap(),
        serde_json::to_string(id).unwrap(),
        meta["InsertionTime"].as_str().unwrap(),
        meta["NextVisibleTime"].as_str().unwrap(),
        serde_json::to_string(pop).unwrap(),
        utc_now,
        meta["sys"]["RandGuid"].as_str().unwrap(),
    );
    assert_eq!(request["body"].as_str().unwrap(), expected);
    assert_eq!(item(&envelope), message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_and_poisoned_after_five_attempts() {
    let (app, queue) = queue_app(json!({}), json!({}));
    let store = store();
    put_json(
        &store,
        &queue,
        &json!({ "name": "always-fails", "fail_until": 99 }),
    )
    .await;
    put_json(
        &store,
        &queue,
        &json!({ "name": "third-time-lucky", "fail_until": 3 }),
    )
    .await;
    let original = MessageEncoding::Base64.encode(
        json!({ "name": "always-fails", "fail_until": 99 })
            .to_string()
            .as_bytes(),
    );
    let host = start(&app, 1).await;
    let poison = format!("{queue}-poison");
    wait_count(&store, &poison, 1).await;
    wait_queue_empty(&store, &queue).await;

    let mut attempts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, envelope) in invocations(&app) {
        let name = item(&envelope)["name"].as_str().unwrap().to_string();
        attempts.entry(name).or_default().push(
            envelope["Metadata"]["DequeueCount"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(attempts["always-fails"], vec!["1", "2", "3", "4", "5"]);
    assert_eq!(attempts["third-time-lucky"], vec!["1", "2", "3"]);
    assert_eq!(texts(&store, &poison).await, vec![original]);
    assert!(has_log(
        &host,
        &format!("Message has reached MaxDequeueCount of 5. Moving message to queue '{poison}'")
    ));
    host.shutdown().await;
}

/// A queue without a poison queue of its own (a poison queue) keeps a failed message invisible
/// for the rest of its receive visibility, not the (zero) `visibilityTimeout`, so it is not
/// retried in a fast loop; then it comes back and is delivered again. The visibility is 10
/// minutes in the extension; the host here is started with 3 s. Proven by events: the host's
/// settlement line, and the second delivery invoked (UtcNow) no earlier than the first one's
/// NextVisibleTime (a release at `visibilityTimeout` would bring it back right away). The
/// settlement itself: `queue.rs`'s unit tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_poison_queue_retries_after_the_receive_visibility() {
    let (app, queue) = queue_app(json!({ "visibilityTimeout": "00:00:00" }), json!({}));
    let queue = format!("{queue}-poison");
    let app = app.setting("WORK_QUEUE", &queue);
    let store = store();
    put_json(
        &store,
        &queue,
        &json!({ "name": "fails-once", "fail_until": 2 }),
    )
    .await;
    let mut config = app.config(1);
    config.receive_visibility = Duration::from_secs(3);
    let host = Host::start_azure(config).await.expect("host starts");
    wait_invocations(&app, 2).await;
    wait_queue_empty(&store, &queue).await;
    let deliveries = invocations(&app);
    let counts: Vec<Value> = deliveries
        .iter()
        .map(|(_, e)| e["Metadata"]["DequeueCount"].clone())
        .collect();
    assert_eq!(counts, vec![json!("1"), json!("2")]);
    let (first, second) = (&deliveries[0].1["Metadata"], &deliveries[1].1["Metadata"]);
    assert!(
        has_log(&host, &format!("no poison queue for {queue}: message")),
        "{:#?}",
        host.log_lines()
    );
    assert!(
        parse_time(&second["sys"]["UtcNow"]) >= parse_time(&first["NextVisibleTime"]),
        "delivered again before its receive visibility ended: {first} {second}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_over_dequeued_messages_go_to_poison_without_invocation() {
    let (app, queue) = queue_app(json!({ "maxDequeueCount": 2 }), json!({}));
    let store = store();
    store.create_queue(&queue).await.unwrap();
    store
        .put_message(&queue, "this is not base64!", Duration::ZERO)
        .await
        .unwrap();
    // A message already received twice (DequeueCount 3 at the host's receive > maxDequeueCount 2).
    let over = MessageEncoding::Base64.encode(br#"{"name":"over"}"#);
    let over_queue = support::unique_name("hostover");
    store.create_queue(&over_queue).await.unwrap();
    store
        .put_message(&over_queue, &over, Duration::ZERO)
        .await
        .unwrap();
    for _ in 0..2 {
        let got = store
            .get_messages(&over_queue, 1, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        store
            .update_message(
                &over_queue,
                &got[0].id,
                &got[0].pop_receipt,
                Duration::ZERO,
                None,
            )
            .await
            .unwrap();
    }
    let app = app.function(
        "Over",
        json!({ "bindings": [{ "name": "item", "type": "queueTrigger", "direction": "in", "queueName": over_queue }] }),
    );
    let host = start(&app, 1).await;
    let poison = format!("{queue}-poison");
    let over_poison = format!("{over_queue}-poison");
    wait_count(&store, &poison, 1).await;
    wait_count(&store, &over_poison, 1).await;
    wait_queue_empty(&store, &queue).await;
    wait_queue_empty(&store, &over_queue).await;
    assert_eq!(
        texts(&store, &poison).await,
        vec!["this is not base64!".to_string()]
    );
    assert_eq!(texts(&store, &over_poison).await, vec![over]);
    assert!(
        app.requests().is_empty(),
        "no invocation: {:?}",
        app.requests()
    );
    assert!(has_log(
        &host,
        "Message decoding has failed! Check MessageEncoding settings."
    ));
    assert!(has_log(&host, "DequeueCount 3 exceeds MaxDequeueCount 2"));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_restarts_the_handler_and_the_message_is_retried() {
    let (app, queue) = queue_app(json!({}), json!({ "functionTimeout": "00:00:02" }));
    let store = store();
    put_json(&store, &queue, &json!({ "hang_until": 2 })).await;
    let host = start(&app, 1).await;
    wait_queue_empty(&store, &queue).await;
    // The handlers in the order they started (their start records, not a pid read later).
    let started: Vec<u64> = app
        .records("start")
        .iter()
        .map(|r| r["pid"].as_u64().unwrap())
        .collect();
    let attempts: Vec<(u64, String, String)> = invocations(&app)
        .into_iter()
        .map(|(r, e)| {
            (
                r["pid"].as_u64().unwrap(),
                e["Metadata"]["DequeueCount"].as_str().unwrap().to_string(),
                invocation_id(&r).to_string(),
            )
        })
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(started.len(), 2, "{started:?}");
    assert_eq!((attempts[0].0, attempts[0].1.as_str()), (started[0], "1"));
    // The first attempt ended by the timeout (it never answered); the retry ran on the
    // restarted handler and answered.
    let (hung, retry) = (&attempts[0].2, &attempts[1].2);
    assert!(has_log(
        &host,
        &format!("(Id: '{hung}'). A function timeout has occurred. Restarting worker process")
    ));
    assert_eq!((attempts[1].0, attempts[1].1.as_str()), (started[1], "2"));
    assert_eq!(app.done(), [retry.as_str()]);
    host.shutdown().await;
}

/// The item numbers of `deliveries`.
fn numbers(deliveries: &[(Value, Value)]) -> Vec<u64> {
    deliveries
        .iter()
        .map(|(_, e)| item(e)["n"].as_u64().unwrap())
        .collect()
}

/// Waits until handler `pid` has `n` invocations in flight; its stats.
async fn wait_in_flight(app: &App, pid: u64, n: u64) -> Value {
    wait_for(&format!("{n} invocations in flight"), LONG, || async {
        let stats = handler_stats(app, pid).await;
        if stats["in_flight"] == n {
            Ok(stats)
        } else {
            Err(stats)
        }
    })
    .await
}

/// Every invocation holds on its own gate, so the test decides when each ends: a first batch of
/// 4 is more than the threshold (2) in flight, so nothing more is fetched; once two of them end,
/// a new batch of 4 comes while the other two still run (6 = batchSize + newBatchThreshold),
/// and no more until some end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_invocations_stay_within_batch_size_plus_threshold() {
    let (app, queue) = queue_app(json!({ "batchSize": 4, "newBatchThreshold": 2 }), json!({}));
    let store = store();
    let total = 12;
    for n in 0..total {
        let hold = app.gate(&n.to_string());
        put_json(&store, &queue, &json!({ "n": n, "hold": hold })).await;
    }
    let host = start(&app, 1).await;
    let first = numbers(&wait_invocations(&app, 4).await[..4]);
    let pid = app.requests()[0]["pid"].as_u64().unwrap();
    wait_in_flight(&app, pid, 4).await;
    for n in &first[..2] {
        open(&app.gate(&n.to_string()));
    }
    wait_in_flight(&app, pid, 6).await;
    // The first batch and one more: two of the first still run (their gates are closed).
    let received = numbers(&invocations(&app));
    assert_eq!(received.len(), 8, "{received:?}");
    assert!(received.starts_with(&first), "{first:?} {received:?}");
    assert_eq!(app.done().len(), 2);
    for n in 0..total {
        open(&app.gate(&n.to_string()));
    }
    wait_queue_empty(&store, &queue).await;
    let max = handler_stats(&app, pid).await["max_in_flight"].as_u64();
    assert_eq!(
        max,
        Some(6),
        "at most batchSize + newBatchThreshold in flight"
    );
    let seen: BTreeSet<u64> = numbers(&invocations(&app)).into_iter().collect();
    assert_eq!(seen, (0..total).collect());
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_queue_and_a_killed_handler_loses_nothing() {
    let (app, queue) = queue_app(json!({ "batchSize": 2, "newBatchThreshold": 0 }), json!({}));
    let store = store();
    // Every invocation holds until the gate opens: each instance takes a batch of 2 and no more
    // while they run, so both instances have work in flight when instance 0's handler is killed.
    let gate = app.gate("all");
    let total = 30;
    for i in 0..total {
        put_json(&store, &queue, &json!({ "n": i, "hold": gate })).await;
    }
    let host = start(&app, 2).await;
    host.wait_ready(LONG).await.unwrap();
    let pids: Vec<u64> = host
        .handler_pids()
        .into_iter()
        .map(|p| u64::from(p.unwrap()))
        .collect();
    for &pid in &pids {
        wait_in_flight(&app, pid, 2).await;
    }
    let killed: Vec<u64> = invocations(&app)
        .iter()
        .filter(|(r, _)| r["pid"] == pids[0])
        .map(|(_, e)| item(e)["n"].as_u64().unwrap())
        .collect();
    kill_process(pids[0] as u32);
    wait_for("instance 0's new handler", LONG, || {
        let now = host.handler_pids();
        let fresh = now[0].filter(|p| u64::from(*p) != pids[0]);
        async move { fresh.ok_or(now) }
    })
    .await;
    open(&gate);
    wait_queue_empty(&store, &queue).await;
    assert_eq!(count(&store, &format!("{queue}-poison")).await, 0);
    // Nothing lost: every item answered, those on the killed handler by another one, later.
    let done: BTreeSet<String> = app.done().into_iter().collect();
    let answered: BTreeSet<u64> = invocations(&app)
        .iter()
        .filter(|(r, _)| done.contains(invocation_id(r)))
        .map(|(_, e)| item(e)["n"].as_u64().unwrap())
        .collect();
    assert_eq!(answered, (0..total).collect::<BTreeSet<u64>>());
    for n in &killed {
        let again = invocations(&app).into_iter().any(|(r, e)| {
            item(&e)["n"] == *n && r["pid"] != pids[0] && e["Metadata"]["DequeueCount"] == "2"
        });
        assert!(again, "item {n} (on the killed handler) delivered again");
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_outputs_are_written_and_shutdown_drains_in_flight_work() {
    let (app, queue) = queue_app(json!({}), json!({}));
    let out_queue = support::unique_name("hostout");
    let app = app
        .function(
            "Work",
            json!({ "bindings": [
                { "name": "item", "type": "queueTrigger", "direction": "in", "queueName": "%WORK_QUEUE%" },
                { "name": "out", "type": "queue", "direction": "out", "queueName": out_queue }
            ]}),
        );
    let store = store();
    // The invocation holds until the test opens its gate, which it does once shutdown is
    // waiting for it: if shutdown returns, it waited.
    let gate = app.gate("drain");
    put_json(
        &store,
        &queue,
        &json!({ "hold": gate, "outputs": { "out": ["{\"a\":1}", "plain text!"] } }),
    )
    .await;
    let host = start(&app, 1).await;
    wait_invocations(&app, 1).await;
    let log = host.log();
    let shutdown = tokio::spawn(host.shutdown());
    let waiting = "[Work] stopped polling; waiting up to";
    wait_log(&log, waiting, LONG).await;
    assert!(!shutdown.is_finished(), "shutdown waits for the invocation");
    open(&gate);
    shutdown.await.unwrap();
    let lines = log.lines();
    assert_order(&lines, waiting, "Executed 'Work' (Succeeded");
    assert_order(&lines, "Executed 'Work' (Succeeded", "host stopped");
    assert_eq!(
        count(&store, &queue).await,
        0,
        "the drained invocation completed and deleted its message"
    );
    let mut written: Vec<String> = texts(&store, &out_queue)
        .await
        .into_iter()
        .map(|t| String::from_utf8(MessageEncoding::Base64.decode(&t).unwrap()).unwrap())
        .collect();
    written.sort();
    assert_eq!(
        written,
        vec!["plain text!".to_string(), "{\"a\":1}".to_string()]
    );
}
