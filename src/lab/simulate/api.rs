//! tablescan's HTTP API as the simulator calls it: through the real router (`oneshot`), as a
//! client would.

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::enqueue;
use super::scenario::{Design, SplitArg};

/// One call of the API: the status and the JSON reply (`null` for an empty body).
pub async fn call(
    router: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = router
        .clone()
        .oneshot(request.body(body).expect("valid request"))
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let reply = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())?
    };
    Ok((status, reply))
}

/// The fan-out a scan runs with (`segmentsPerFirstPrefix`, `segmentsPerSubsequentPrefix`), as
/// its start's answer records it.
pub type Segments = (u32, u32);

/// Starts tablescan's scan through its real HTTP API; returns the scan id and the fan-out the
/// scan recorded.
pub async fn start_scan(router: &axum::Router, d: &Design) -> Result<(String, Segments), String> {
    let mut body = json!({
        "driver": "copy", "sourceTable": "Source", "destinationTable": "Dest",
        "strategy": d.strategy, "takeCount": d.take,
        "workSplit": match d.work_split { SplitArg::Page => "page", SplitArg::PartitionKey => "partitionKey" },
        "segmentsPerFirstPrefix": d.segments_first, "segmentsPerSubsequentPrefix": d.segments_subsequent,
    });
    let fields = body.as_object_mut().expect("an object");
    if d.enqueue.is_some() || d.index.is_some() || d.count {
        fields.remove("destinationTable");
        fields.remove("workSplit");
    }
    // An enqueue or an index build at the engine's fan-out leaves it to the driver's own
    // default (the count beside a build keeps the engine's); the report shows what the scan
    // recorded (`recorded_segments`).
    let engine = crate::scan::ScanParameters::default();
    if d.enqueue.is_some() || d.index.is_some() {
        if d.segments_first == engine.segments_per_first_prefix {
            fields.remove("segmentsPerFirstPrefix");
        }
        if d.segments_subsequent == engine.segments_per_subsequent_prefix {
            fields.remove("segmentsPerSubsequentPrefix");
        }
    }
    if let Some(e) = &d.enqueue {
        fields.insert("driver".into(), json!("enqueue"));
        fields.insert("destinationQueue".into(), json!(enqueue::DESTINATION_QUEUE));
        fields.insert("rowsPerMessage".into(), json!(e.rows_per_message));
    }
    if let Some(i) = &d.index {
        fields.insert("driver".into(), json!("index"));
        fields.insert("property".into(), json!(i.property));
        fields.insert("destinationContainer".into(), json!(i.container));
        fields.insert("destinationPrefix".into(), json!(i.prefix));
    }
    if d.count {
        fields.insert("driver".into(), json!("count"));
    }
    if let Some(limit) = d.max_requests_per_second {
        body["maxRequestsPerSecond"] = json!(limit);
    }
    let (status, reply) = call(router, "POST", "/api/scans", Some(&body)).await?;
    if !(200..300).contains(&status) {
        return Err(format!("starting the scan failed: {status} {reply}"));
    }
    let id = reply["id"].as_str().ok_or("no scan id")?.to_string();
    let recorded = |field: &str| {
        reply["parameters"][field]
            .as_u64()
            .map(|n| n as u32)
            .ok_or_else(|| format!("the started scan records no {field}"))
    };
    let segments = (
        recorded("segmentsPerFirstPrefix")?,
        recorded("segmentsPerSubsequentPrefix")?,
    );
    Ok((id, segments))
}
