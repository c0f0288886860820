//! `tablescan host` timer triggers against the test handler: the payload on the wire is the
//! timer extension's `TimerInfo` as the Functions host hands it to a custom handler
//! (docs/custom-handler-protocol.md §12), `runOnStartup` fires once at start, every instance
//! fires, and a schedule whose `%setting%` does not resolve puts only that function in error.
//!
//! Proven by events (the handler's request records, the host's log); `LONG` only catches a hang.

use std::time::Duration;

use crate::support::host::*;
use serde_json::{json, Value};
use tablescan::lab::host::Host;

const LONG: Duration = Duration::from_secs(60);

fn timer(schedule: &str, extra: Value) -> Value {
    let mut binding =
        json!({ "name": "tick", "type": "timerTrigger", "direction": "in", "schedule": schedule });
    if let (Value::Object(b), Value::Object(x)) = (&mut binding, extra) {
        b.extend(x);
    }
    json!({ "bindings": [binding] })
}

/// The handler's payload-mode requests to `path`, parsed.
fn requests_to(app: &App, path: &str) -> Vec<(Value, Value)> {
    app.requests()
        .into_iter()
        .filter(|r| r["path"] == path)
        .map(|r| {
            let body = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
            (r, body)
        })
        .collect()
}

async fn wait_requests(app: &App, path: &str, n: usize) -> Vec<(Value, Value)> {
    wait_for(&format!("{n} timer invocation(s) of {path}"), LONG, || {
        let seen = requests_to(app, path);
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

#[tokio::test]
async fn timer_payload_on_the_wire_matches_the_timer_extension() {
    let app = App::new(json!({}), json!({}))
        .function("Tick", timer("%TICK_SCHEDULE%", json!({})))
        // Every second: more than once a minute, so the extension turns the monitor off and
        // ScheduleStatus is null.
        .setting("TICK_SCHEDULE", "*/1 * * * * *");
    let host = Host::start_azure(app.config(1)).await.expect("host starts");
    let seen = wait_requests(&app, "/Tick", 2).await;
    host.shutdown().await;
    for (request, envelope) in &seen {
        assert_eq!(request["method"], "POST");
        assert_host_headers(request, "Azure-Functions-Host/4.0.0.0");
        assert_eq!(
            envelope["Data"],
            json!({"tick": {"Schedule": {"AdjustForDST": true}, "ScheduleStatus": null, "IsPastDue": false}})
        );
        // The TimerTrigger binding data is left out (its key ends with "trigger"): sys only.
        let metadata: Vec<_> = envelope["Metadata"].as_object().unwrap().keys().collect();
        assert_eq!(metadata, ["sys"]);
        assert_eq!(envelope["Metadata"]["sys"]["MethodName"], "Tick");
    }
    // Two occurrences, two different invocations.
    assert_ne!(
        seen[0].1["Metadata"]["sys"]["RandGuid"],
        seen[1].1["Metadata"]["sys"]["RandGuid"]
    );
}

#[tokio::test]
async fn run_on_startup_fires_once_with_the_schedule_status_and_every_instance_fires() {
    // Once a year: only runOnStartup fires within the test; with the monitor on, the status is
    // an object (Last: DateTime.MinValue, Next: the coming occurrence).
    let app = App::new(json!({}), json!({})).function(
        "Yearly",
        timer("0 0 0 1 1 *", json!({"runOnStartup": true})),
    );
    let host = Host::start_azure(app.config(2)).await.expect("host starts");
    let seen = wait_requests(&app, "/Yearly", 2).await;
    host.shutdown().await;
    assert_eq!(seen.len(), 2, "one startup invocation per instance");
    let pids: std::collections::BTreeSet<_> =
        seen.iter().map(|(r, _)| r["pid"].to_string()).collect();
    assert_eq!(pids.len(), 2, "each instance's handler was invoked");
    let info = &seen[0].1["Data"]["tick"];
    assert_eq!(info["IsPastDue"], false);
    assert_eq!(info["ScheduleStatus"]["Last"], "0001-01-01T00:00:00+00:00");
    let next = info["ScheduleStatus"]["Next"].as_str().unwrap();
    assert!(next.ends_with("-01-01T00:00:00+00:00"), "{next}");
}

#[tokio::test]
async fn an_unresolved_schedule_puts_only_its_function_in_error() {
    let app = App::new(json!({}), json!({}))
        .function("Tick", timer("%MISSING_SCHEDULE%", json!({})))
        .function("Echo", http_function("echo", json!(["get"])));
    let host = app
        .start_http()
        .await
        .expect("the other functions still run");
    let line = wait_log(&host.log(), "is in error", LONG).await;
    assert!(
        line.contains("MISSING_SCHEDULE") && line.contains("Tick"),
        "{line}"
    );
    let answer = http_client()
        .get(format!("http://{}/api/echo", host.http_addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    host.shutdown().await;
    assert!(requests_to(&app, "/Tick").is_empty());
}
