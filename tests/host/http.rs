//! `tablescan host` with HTTP triggers, against the test handler (real processes, real sockets):
//! forwarding, payload and proxying modes, readiness, configuration errors. Handler supervision
//! is in `tests/host/supervision.rs`, queue behaviour in `tests/host/queue.rs`.
//!
//! Each test proves its behaviour by the events that make it (log lines, the handler's records),
//! never by how long it took. `LONG` only catches a hang.

use std::time::Duration;

use crate::support::host::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_passes_method_path_query_headers_and_body() {
    let app = App::new(json!({}), json!({ "enableForwardingHttpRequest": true }))
        .function("Echo", http_function("items/{id}", json!(["post", "get"])));
    let host = app.start_http().await.unwrap();
    let base = format!("http://{}", host.http_addr());
    let client = http_client();

    let response = client
        .post(format!("{base}/api/items/42?b=2&a=x%20y&a=z"))
        .header("X-Custom", "custom value")
        .header("User-Agent", "tester/1")
        .header("X-Test-Status", "418")
        .header("Content-Type", "text/plain")
        .body("hello body")
        .send()
        .await
        .unwrap();
    // Non-2xx is not a failure in forwarding mode: the handler's answer comes back as is.
    assert_eq!(response.status().as_u16(), 418);
    assert_eq!(response.headers()["x-test-echo"], "1");
    let echo: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/api/items/42");
    // Query rebuilt from the parsed dictionary: repeated keys joined with ',' and re-encoded.
    assert_eq!(echo["query"], "b=2&a=x%20y%2Cz");
    assert_eq!(echo["body"], "hello body");
    assert_eq!(header(&echo, "x-custom"), Some("custom value"));
    assert_eq!(header(&echo, "content-type"), Some("text/plain"));
    assert_eq!(header(&echo, "content-length"), Some("10"));
    assert_eq!(
        header(&echo, "host"),
        Some(host.http_addr().to_string().as_str())
    );
    assert_host_headers(&echo, "tester/1 Azure-Functions-Host/4.0.0.0");

    let response = client
        .get(format!("{base}/api/items/7"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let echo: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["body"], "");
    assert_eq!(echo["query"], Value::Null);

    // Method not in function.json, unknown route, missing prefix.
    assert_eq!(
        client
            .delete(format!("{base}/api/items/7"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        405
    );
    assert_eq!(
        client
            .get(format!("{base}/api/nothing"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        client
            .get(format!("{base}/items/7"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_mode_wraps_the_request_and_builds_the_response_from_res() {
    let app = App::new(
        json!({ "extensions": { "http": { "routePrefix": "v1" } } }),
        json!({}),
    )
    .function("MakeThing", http_function("things/{kind}", json!(["post"])));
    let host = app.start_http().await.unwrap();
    let base = format!("http://{}", host.http_addr());
    let commands = json!({
        "outputs": { "res": { "statusCode": "201", "headers": { "Location": "/v1/things/x/1" }, "body": "made" } },
        "logs": ["made a thing"]
    });
    let response = http_client()
        .post(format!("{base}/v1/things/gadget?color=red"))
        .header("Content-Type", "application/json")
        .body(commands.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(response.headers()["location"], "/v1/things/x/1");
    assert_eq!(response.text().await.unwrap(), "made");

    let requests = app.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let r = &requests[0];
    assert_eq!(r["method"], "POST");
    assert_eq!(r["path"], "/MakeThing");
    assert_eq!(
        header(r, "content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(header(r, "transfer-encoding"), Some("chunked"));
    assert_eq!(header(r, "content-length"), None);
    assert_eq!(
        header(r, "user-agent"),
        Some("Azure-Functions-Host/4.0.0.0")
    );
    assert_eq!(header(r, "x-azure-functions-hostversion"), Some("4.0.0.0"));
    assert!(header(r, "x-azure-functions-invocationid").is_some());
    let envelope: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
    let req = &envelope["Data"]["req"];
    assert_eq!(req["Method"], "POST");
    assert_eq!(
        req["Url"],
        format!("http://{}/v1/things/gadget?color=red", host.http_addr())
    );
    assert_eq!(req["Query"], json!({ "color": "red" }));
    assert_eq!(req["Params"], json!({ "kind": "gadget" }));
    assert_eq!(req["Body"], commands.to_string());
    assert_eq!(req["Headers"]["Content-Type"], json!(["application/json"]));
    assert_eq!(
        req["Identities"][0]["AuthenticationType"],
        "WebJobsAuthLevel"
    );
    let meta = &envelope["Metadata"];
    assert_eq!(meta["Headers"]["Content-Type"], "application/json");
    assert_eq!(meta["kind"], "\"gadget\"");
    assert_eq!(meta["sys"]["MethodName"], "MakeThing");
    assert!(has_log(&host, "made a thing"), "{:?}", host.log_lines());

    // A failing handler (non-2xx in payload mode) gives the caller a 500.
    let response = http_client()
        .post(format!("{base}/v1/things/gadget"))
        .header("Content-Type", "application/json")
        .body(json!({ "status": 400 }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 500);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_handler_that_listens_late_and_passes_worker_settings() {
    let app = App::new(
        json!({}),
        json!({ "enableForwardingHttpRequest": true,
                "description": { "arguments": ["--port", "%FUNCTIONS_CUSTOMHANDLER_PORT%", "%NOT_SET_ANYWHERE%x"] } }),
    )
    .function("Echo", http_function("echo", json!(["get"])));
    let listen = app.gate("listen");
    let app = app.setting("TEST_HANDLER_LISTEN_WHEN", &listen);
    std::fs::write(
        app.dir.join("local.settings.json"),
        r#"{"IsEncrypted":false,"Values":{"TEST_FROM_LOCAL":"yes"}}"#,
    )
    .unwrap();
    let host = app.start_http().await.unwrap();
    // Sent while the handler cannot listen (its gate is closed): the host holds it until readiness.
    let url = format!("http://{}/api/echo", host.http_addr());
    let request = tokio::spawn(async move { http_client().get(url).send().await.unwrap() });
    wait_log(&host.log(), "Executing 'Echo' (GET /api/echo)", LONG).await;
    assert!(app.records("listening").is_empty());
    assert!(!request.is_finished(), "held, not answered");
    open(&listen);
    let response = request.await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    // The host took the request before the handler was ready, and forwarded it once it was.
    assert_order(&host.log_lines(), "Executing 'Echo'", "ready after");
    let events: Vec<Value> = app
        .handler_records()
        .iter()
        .map(|r| r["event"].clone())
        .collect();
    assert_eq!(events, ["start", "listening", "request"]);

    let start = app
        .handler_records()
        .into_iter()
        .find(|r| r["event"] == "start")
        .unwrap();
    let env = &start["env"];
    let port = env["FUNCTIONS_CUSTOMHANDLER_PORT"].as_str().unwrap();
    assert_eq!(start["args"], json!(["--port", port, "x"]));
    assert_eq!(env["FUNCTIONS_HTTPWORKER_PORT"], port);
    let worker_id = env["FUNCTIONS_CUSTOMHANDLER_WORKER_ID"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(worker_id).is_ok());
    assert_eq!(env["FUNCTIONS_HTTPWORKER_ID"], worker_id);
    let root = std::fs::canonicalize(&app.dir)
        .unwrap()
        .display()
        .to_string();
    assert_eq!(env["FUNCTIONS_APP_ROOT_PATH"], root);
    assert_eq!(start["cwd"], root);
    assert_eq!(env["TEST_FROM_LOCAL"], "yes");
    host.shutdown().await;
}

#[tokio::test]
async fn bad_configuration_is_refused_with_file_and_field() {
    let app = App::new(json!({}), json!({})).function(
        "Bad",
        json!({ "bindings": [{ "name": "req", "type": "httpTrigger", "direction": "in", "methods": ["yell"] }] }),
    );
    let error = app.start_http().await.err().expect("refused").to_string();
    assert!(
        error.contains("Bad/function.json") && error.contains("bindings[0].methods[0]"),
        "{error}"
    );

    let app = App::new(json!({}), json!({})).function(
        "Q",
        json!({ "bindings": [{ "name": "m", "type": "queueTrigger", "direction": "in", "queueName": "%QUEUE_SETTING%" }] }),
    );
    let error = app.start_http().await.err().expect("refused").to_string();
    assert!(
        error.contains("QUEUE_SETTING") && error.contains("Q/function.json"),
        "{error}"
    );
}

/// Proxying mode (`enableProxyingHttpRequest`, which wins over forwarding): the original path and
/// query untouched, the body even when chunked, `Host` replaced by the handler's address with the
/// caller's in `X-Forwarded-Host`, `X-Forwarded-For`/`-Proto` set, `X-Forwarded-Prefix` removed,
/// the invocation id in both invocation headers, `User-Agent` left alone, any status an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxying_passes_the_request_as_it_came() {
    let app = App::new(
        json!({}),
        json!({ "enableProxyingHttpRequest": true, "enableForwardingHttpRequest": true }),
    )
    .function("Echo", http_function("items/{id}", json!(["post"])));
    let host = app.start_http().await.unwrap();
    assert!(
        has_log(&host, "Echo: [POST]") && has_log(&host, "(proxied)"),
        "{:?}",
        host.log_lines()
    );
    let public = host.http_addr().to_string();
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("hello "), Ok("body")];
    let response = http_client()
        .post(format!("http://{public}/api/items/42?b=2&a=x%20y&a=z"))
        .header("User-Agent", "tester/1")
        .header("X-Test-Status", "418")
        .header("X-Forwarded-Prefix", "/spoofed")
        .header("X-Forwarded-Host", "spoofed.example")
        .header("X-Azure-Functions-InvocationId", "spoofed")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 418);
    let echo: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["path"], "/api/items/42");
    assert_eq!(echo["query"], "b=2&a=x%20y&a=z");
    assert_eq!(echo["body"], "hello body", "a chunked body is proxied");
    let handler_host = header(&echo, "host").unwrap();
    assert!(
        handler_host.starts_with("127.0.0.1:") && handler_host != public,
        "{handler_host}"
    );
    assert_eq!(header(&echo, "x-forwarded-host"), Some(public.as_str()));
    assert_eq!(header(&echo, "x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(header(&echo, "x-forwarded-proto"), Some("http"));
    assert_eq!(header(&echo, "x-forwarded-prefix"), None);
    let id = assert_host_headers(&echo, "tester/1");
    assert_eq!(header(&echo, "x-ms-invocation-id"), Some(id));
    host.shutdown().await;
}
