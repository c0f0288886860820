//! Unit tests of [`super`]: the payloads the local host sends the handler.

use super::*;
use time::macros::datetime;

#[test]
fn queue_payload_matches_reference_example_byte_for_byte() {
    // docs/custom-handler-protocol.md §3.3 (a).
    let message = ReceivedMessage {
        id: "800ae4b3-bdd2-4c08-badd-f08e5a34b865".into(),
        pop_receipt: "AgAAAAMAAAAAAAAAAgtnj8x+1QE=".into(),
        dequeue_count: 1,
        text: String::new(),
        insertion_time: datetime!(2024-10-25 12:00:00.345 UTC),
        expiration_time: datetime!(2024-11-01 12:00:00 UTC),
        next_visible_time: datetime!(2024-10-25 12:10:00.999 UTC),
    };
    let sys = SysData {
        method_name: "MyQueueFunction".into(),
        utc_now: utc_now_string(datetime!(2024-10-25 12:00:00.1234567 UTC)),
        rand_guid: "24ad4c06-24ad-4e5b-8294-3da9714877e9".into(),
    };
    let body = queue_payload(
        "myQueueItem",
        &QueueItem::Text(r#"{"orderId":42,"sku":"A-1"}"#.into()),
        &message,
        &sys,
    );
    let expected = r#"{"Data":{"myQueueItem":"\"{\\\"orderId\\\":42,\\\"sku\\\":\\\"A-1\\\"}\""},"Metadata":{"DequeueCount":"1","ExpirationTime":"2024-11-01T12:00:00+00:00","Id":"\"800ae4b3-bdd2-4c08-badd-f08e5a34b865\"","InsertionTime":"2024-10-25T12:00:00+00:00","NextVisibleTime":"2024-10-25T12:10:00+00:00","PopReceipt":"\"AgAAAAMAAAAAAAAAAgtnj8x+1QE=\"","sys":{"MethodName":"MyQueueFunction","UtcNow":"2024-10-25T12:00:00.1234567Z","RandGuid":"24ad4c06-24ad-4e5b-8294-3da9714877e9"}}}"#;
    assert_eq!(body, expected);

    let binary = queue_payload("b", &QueueItem::Binary(vec![0xff, 0]), &message, &sys);
    assert!(binary.starts_with(r#"{"Data":{"b":"/wA="},"#), "{binary}");
}

#[test]
fn response_rules() {
    let ok = parse_invocation_response(
        200,
        Some("application/json; charset=utf-8"),
        br#"{"outputs":{"o":1},"LOGS":["a",2],"ReturnValue":null}"#,
    )
    .unwrap();
    assert_eq!(ok.logs, vec!["a".to_string(), "2".to_string()]);
    assert_eq!(ok.outputs["o"], 1);
    assert_eq!(
        parse_invocation_response(500, Some("application/json"), b"{}"),
        Err(ResponseProblem::Status(500))
    );
    assert!(matches!(
        parse_invocation_response(200, Some("text/plain"), b"{}"),
        Err(ResponseProblem::MediaType(_))
    ));
    assert!(matches!(
        parse_invocation_response(200, None, b"{}"),
        Err(ResponseProblem::MediaType(_))
    ));
    assert_eq!(
        parse_invocation_response(200, None, b""),
        Err(ResponseProblem::NoResult)
    );
    assert_eq!(
        parse_invocation_response(204, Some("application/json"), b""),
        Err(ResponseProblem::NoResult)
    );
    assert_eq!(
        parse_invocation_response(200, Some("text/json"), b"null"),
        Err(ResponseProblem::NoResult)
    );
    assert!(matches!(
        parse_invocation_response(200, Some("application/json"), b"[1]"),
        Err(ResponseProblem::InvalidBody(_))
    ));
    assert!(matches!(
        parse_invocation_response(200, Some("application/json"), b"{oops"),
        Err(ResponseProblem::InvalidBody(_))
    ));
}

#[test]
fn queue_outputs_follow_the_host() {
    let m = |v: Value| queue_output_messages(&v, false).unwrap();
    assert_eq!(
        m(serde_json::json!(["{\"a\":1}", "audit:42"])),
        vec![b"{\"a\":1}".to_vec(), b"audit:42".to_vec()]
    );
    assert_eq!(
        m(serde_json::json!("{\"a\":1}")),
        vec![b"{\n  \"a\": 1\n}".to_vec()]
    );
    assert_eq!(m(serde_json::json!("hello")), vec![b"hello".to_vec()]);
    assert_eq!(m(serde_json::json!("test")), vec![vec![0xb5, 0xeb, 0x2d]]);
    assert_eq!(
        m(serde_json::json!("[\"x\",\"y!\"]")),
        vec![b"x".to_vec(), b"y!".to_vec()]
    );
    assert_eq!(
        queue_output_messages(&serde_json::json!("test"), true).unwrap(),
        vec![b"test".to_vec()]
    );
}

#[test]
fn http_outputs() {
    let out = http_output(Some(
        &serde_json::json!({"statusCode":"201","headers":{"Location":"/x"},"body":"hi"}),
    ))
    .unwrap();
    assert_eq!(
        out,
        HttpOutput {
            status: 201,
            headers: vec![("Location".into(), "/x".into())],
            body: b"hi".to_vec()
        }
    );
    assert_eq!(
        http_output(Some(&serde_json::json!("{\"StatusCode\":204}")))
            .unwrap()
            .status,
        204
    );
    assert!(http_output(Some(&serde_json::json!("SomeBlah"))).is_err());
    assert_eq!(http_output(None).unwrap().status, 200);
}
