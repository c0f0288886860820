//! `tablescan host` queue triggers against real Azurite and the test handler: payload on the
//! wire, retries and poison, decode failures, timeouts, concurrency, several instances, shutdown.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

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

async fn wait_queue_empty(store: &AzureQueueStore, queue: &str) {
    wait_for(&format!("queue {queue} to be empty"), LONG, || async {
        (count(store, queue).await == 0).then_some(())
    })
    .await;
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
    let (request, envelope) = wait_for("the invocation", LONG, || {
        let found = invocations(&app).into_iter().next();
        async move { found }
    })
    .await;
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
    // NextVisibleTime is the 10-minute receive visibility.
    let insertion = time::OffsetDateTime::parse(
        meta["InsertionTime"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let next = time::OffsetDateTime::parse(
        meta["NextVisibleTime"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let lead = next - insertion;
    assert!(
        lead >= time::Duration::seconds(590) && lead <= time::Duration::seconds(690),
        "{lead}"
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
    wait_for("a poison message", LONG, || async {
        (count(&store, &poison).await == 1).then_some(())
    })
    .await;
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
/// minutes in the extension; the host here is started with 3 s.
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
    let deliveries = |n: usize| {
        let app = &app;
        move || async move { (invocations(app).len() >= n).then(Instant::now) }
    };
    let first = wait_for("a first delivery", LONG, deliveries(1)).await;
    let second = wait_for("a second delivery", LONG, deliveries(2)).await;
    wait_queue_empty(&store, &queue).await;
    let counts: Vec<Value> = invocations(&app)
        .iter()
        .map(|(_, e)| e["Metadata"]["DequeueCount"].clone())
        .collect();
    assert_eq!(counts, vec![json!("1"), json!("2")]);
    // Seen by polling: the first delivery is seen late by at most the poll interval.
    let gap = second - first;
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}");
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
    wait_for("both poison messages", LONG, || async {
        (count(&store, &poison).await == 1 && count(&store, &over_poison).await == 1).then_some(())
    })
    .await;
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
    host.wait_ready(LONG).await.unwrap();
    let first_pid = host.handler_pids()[0].unwrap();
    wait_queue_empty(&store, &queue).await;
    let attempts: Vec<(u64, String)> = invocations(&app)
        .into_iter()
        .map(|(r, e)| {
            (
                r["pid"].as_u64().unwrap(),
                e["Metadata"]["DequeueCount"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0], (first_pid as u64, "1".to_string()));
    assert_ne!(
        attempts[1].0, first_pid as u64,
        "the retry ran on a restarted handler"
    );
    assert_eq!(attempts[1].1, "2");
    assert!(has_log(
        &host,
        "A function timeout has occurred. Restarting worker process"
    ));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_invocations_stay_within_batch_size_plus_threshold() {
    let (app, queue) = queue_app(json!({ "batchSize": 4, "newBatchThreshold": 2 }), json!({}));
    let store = store();
    for i in 0..24 {
        // Mixed durations so a new batch is fetched while older, longer ones still run.
        let sleep = if i % 2 == 0 { 200 } else { 1200 };
        put_json(&store, &queue, &json!({ "n": i, "sleep_ms": sleep })).await;
    }
    let host = start(&app, 1).await;
    wait_queue_empty(&store, &queue).await;
    let start_record = app
        .handler_records()
        .into_iter()
        .find(|r| r["event"] == "start")
        .unwrap();
    let port = start_record["env"]["FUNCTIONS_CUSTOMHANDLER_PORT"]
        .as_str()
        .unwrap()
        .to_string();
    let stats: Value = serde_json::from_slice(
        &http_client()
            .get(format!("http://127.0.0.1:{port}/stats"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    let max = stats["max_in_flight"].as_u64().unwrap();
    assert!(
        max <= 6,
        "at most batchSize + newBatchThreshold in flight, saw {max}"
    );
    assert!(
        max > 4,
        "a new batch starts before the previous one is done, saw {max}"
    );
    let seen: BTreeSet<u64> = invocations(&app)
        .iter()
        .map(|(_, e)| item(e)["n"].as_u64().unwrap())
        .collect();
    assert_eq!(seen.len(), 24);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_queue_and_a_killed_handler_loses_nothing() {
    let (app, queue) = queue_app(json!({ "batchSize": 2, "newBatchThreshold": 0 }), json!({}));
    let store = store();
    let total = 30;
    for i in 0..total {
        put_json(&store, &queue, &json!({ "n": i, "sleep_ms": 150 })).await;
    }
    let host = start(&app, 2).await;
    host.wait_ready(LONG).await.unwrap();
    let pids: Vec<u32> = host
        .handler_pids()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    // Both instances take work.
    wait_for("both instances to be invoked", LONG, || {
        let by_pid: BTreeSet<u64> = invocations(&app)
            .iter()
            .map(|(r, _)| r["pid"].as_u64().unwrap())
            .collect();
        let pids = pids.clone();
        async move {
            pids.iter()
                .all(|p| by_pid.contains(&(*p as u64)))
                .then_some(())
        }
    })
    .await;
    kill_process(pids[0]);
    wait_queue_empty(&store, &queue).await;
    let seen: BTreeSet<u64> = invocations(&app)
        .iter()
        .map(|(_, e)| item(e)["n"].as_u64().unwrap())
        .collect();
    assert_eq!(seen, (0..total).collect::<BTreeSet<u64>>());
    assert_eq!(count(&store, &format!("{queue}-poison")).await, 0);
    assert_ne!(
        host.handler_pids()[0],
        Some(pids[0]),
        "instance 0 got a new handler"
    );
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
    put_json(
        &store,
        &queue,
        &json!({ "sleep_ms": 1500, "outputs": { "out": ["{\"a\":1}", "plain text!"] } }),
    )
    .await;
    let host = start(&app, 1).await;
    wait_for("the invocation to start", LONG, || {
        let n = invocations(&app).len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    let started = Instant::now();
    host.shutdown().await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "shutdown waited for the invocation"
    );
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
