//! Unit tests of [`super`]: request paths, bodies and answers of the Table REST client, without a service.

use super::*;

#[test]
fn entity_paths_double_and_encode_quotes() {
    assert_eq!(
        entity_path("t1", "it's", "a b"),
        "t1(PartitionKey='it%27%27s',RowKey='a%20b')"
    );
    assert_eq!(
        entity_path("t1", "", "\u{FFFF}"),
        "t1(PartitionKey='',RowKey='%EF%BF%BF')"
    );
}

#[test]
fn line_separators_are_escaped_and_nothing_else_changes() {
    let mut json = "{\"a\":\"x\u{2028}y\u{2029}\u{1F600}\\\\\"}"
        .as_bytes()
        .to_vec();
    escape_line_separators(&mut json);
    assert_eq!(
        String::from_utf8(json).unwrap(),
        "{\"a\":\"x\\u2028y\\u2029\u{1F600}\\\\\"}"
    );
    let mut plain = b"{\"a\":1.5}".to_vec();
    escape_line_separators(&mut plain);
    assert_eq!(plain, b"{\"a\":1.5}");
}

#[test]
fn select_always_has_the_keys_once() {
    assert_eq!(select_list(&None), None);
    assert_eq!(
        select_list(&Some(vec![])).as_deref(),
        Some("PartitionKey,RowKey")
    );
    assert_eq!(
        select_list(&Some(vec!["A".into(), "RowKey".into()])).as_deref(),
        Some("PartitionKey,RowKey,A")
    );
}

#[test]
fn batch_body_has_one_part_per_operation_with_if_match() {
    let mut e = Entity::new("p'k", "r1");
    e.properties.insert("N", serde_json::json!(1));
    let ops = vec![
        BatchOperation::Insert(e.clone()),
        BatchOperation::Replace {
            entity: Entity::new("p'k", "r2"),
            etag: Some("W/\"x\"".into()),
        },
        BatchOperation::Delete {
            row_key: "r3".into(),
            etag: None,
        },
    ];
    let body = build_batch_body("http://h/acct", "tbl", "p'k", &ops).unwrap();
    let text = std::str::from_utf8(&body.bytes).unwrap();
    let boundary = body
        .content_type
        .strip_prefix("multipart/mixed; boundary=")
        .unwrap();
    assert!(text.starts_with(&format!("--{boundary}\r\n")));
    assert!(text.contains("POST http://h/acct/tbl HTTP/1.1\r\n"));
    assert!(
        text.contains("PUT http://h/acct/tbl(PartitionKey='p%27%27k',RowKey='r2') HTTP/1.1\r\n")
    );
    assert!(text.contains("If-Match: W/\"x\"\r\n"));
    assert!(
        text.contains("DELETE http://h/acct/tbl(PartitionKey='p%27%27k',RowKey='r3') HTTP/1.1\r\n")
    );
    assert!(text.contains("If-Match: *\r\n"));
    assert_eq!(text.matches("Content-Transfer-Encoding: binary").count(), 3);
    assert!(text.ends_with(&format!("--{boundary}--\r\n")));
}

const FAILED: &str = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n\
    --changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
    HTTP/1.1 409 Conflict\r\nContent-ID: 2\r\nContent-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n\r\n\
    {\"odata.error\":{\"code\":\"EntityAlreadyExists\",\"message\":{\"lang\":\"en-US\",\"value\":\"1:The specified entity already exists.\\nRequestId:abc\\nTime:2024\"}}}\r\n\
    --changesetresponse_2--\r\n--batchresponse_1--\r\n";

#[test]
fn failed_transaction_reports_code_and_index() {
    let parts = parse_batch_response(FAILED);
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].status, 409);
    let err = batch_outcome(3, &parts).unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Conflict);
    assert_eq!(err.code.as_deref(), Some("EntityAlreadyExists"));
    assert_eq!(err.failed_operation, Some(1));
    assert_eq!(
        err.message,
        "entity group transaction failed: The specified entity already exists."
    );
}

#[test]
fn successful_transaction_needs_every_operation_answered() {
    let ok = "--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n\
        --changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
        HTTP/1.1 204 No Content\r\nETag: W/\"a\"\r\n\r\n\r\n\
        --changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n\r\n\
        HTTP/1.1 204 No Content\r\nETag: W/\"b\"\r\n\r\n\r\n\
        --changesetresponse_2--\r\n--batchresponse_1--\r\n";
    let parts = parse_batch_response(ok);
    assert_eq!(
        parts.iter().map(|p| p.status).collect::<Vec<_>>(),
        vec![204, 204]
    );
    assert!(batch_outcome(2, &parts).is_ok());
    let err = batch_outcome(3, &parts).unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::InvalidResponse);
}

#[test]
fn operation_index_prefix_parsing() {
    assert_eq!(
        split_operation_index("99:One of the request inputs is not valid."),
        (Some(99), "One of the request inputs is not valid.".into())
    );
    assert_eq!(
        split_operation_index("Time:2024"),
        (None, "Time:2024".into())
    );
    assert_eq!(split_operation_index("no index"), (None, "no index".into()));
}
