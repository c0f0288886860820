//! Unit tests of the proxy's request classification and fault selection.

use super::classify::*;
use super::*;
use std::sync::atomic::AtomicU64;

#[test]
fn classifies_storage_requests() {
    let get = hyper::Method::GET;
    assert_eq!(
        classify_storage(
            Service::Table,
            &get,
            "/devstoreaccount1/Source()",
            "$filter=x",
            b""
        ),
        (RequestKind::Query, "Source".into())
    );
    assert_eq!(
        classify_storage(
            Service::Table,
            &get,
            "/devstoreaccount1/Source(PartitionKey='a',RowKey='b')",
            "",
            b""
        ),
        (RequestKind::PointRead, "Source".into())
    );
    let batch = b"--changeset\r\nPUT http://127.0.0.1:1/devstoreaccount1/Dest(PartitionKey='a',RowKey='b') HTTP/1.1\r\n";
    assert_eq!(
        classify_storage(
            Service::Table,
            &hyper::Method::POST,
            "/devstoreaccount1/$batch",
            "",
            batch
        ),
        (RequestKind::Batch, "Dest".into())
    );
    assert_eq!(
        classify_storage(
            Service::Table,
            &hyper::Method::POST,
            "/devstoreaccount1/Tables",
            "",
            b""
        ),
        (RequestKind::TableAdmin, "".into())
    );
    assert_eq!(
        classify_storage(
            Service::Queue,
            &hyper::Method::POST,
            "/devstoreaccount1/q1/messages",
            "",
            b""
        ),
        (RequestKind::QueuePut, "q1".into())
    );
    assert_eq!(
        classify_storage(
            Service::Queue,
            &get,
            "/devstoreaccount1/q1/messages",
            "numofmessages=32",
            b""
        ),
        (RequestKind::QueueGet, "q1".into())
    );
    assert_eq!(
        classify_storage(
            Service::Queue,
            &hyper::Method::DELETE,
            "/devstoreaccount1/q1/messages/id1",
            "popreceipt=x",
            b""
        ),
        (RequestKind::QueueDelete, "q1".into())
    );
    assert_eq!(
        classify_storage(
            Service::Queue,
            &hyper::Method::PUT,
            "/devstoreaccount1/q1/messages/id1",
            "",
            b""
        ),
        (RequestKind::QueueUpdate, "q1".into())
    );
    assert_eq!(
        classify_storage(
            Service::Queue,
            &get,
            "/devstoreaccount1/q1",
            "comp=metadata",
            b""
        ),
        (RequestKind::QueueAdmin, "q1".into())
    );
}

#[test]
fn classifies_blob_requests_as_the_blob_store_counts_them() {
    let (get, put, head) = (hyper::Method::GET, hyper::Method::PUT, hyper::Method::HEAD);
    let blob = |method: &hyper::Method, path: &str, query: &str| {
        classify(Service::Blob, method, path, query, b"")
    };
    let c = "backups".to_string();
    let write = (Kind::Blob(BlobRequestKind::Write), c.clone());
    let read = (Kind::Blob(BlobRequestKind::Read), c.clone());
    // Create Container; List Blobs.
    assert_eq!(
        blob(&put, "/devstoreaccount1/backups", "restype=container"),
        (Kind::Blob(BlobRequestKind::Admin), c.clone())
    );
    assert_eq!(
        blob(
            &get,
            "/devstoreaccount1/backups",
            "restype=container&comp=list&prefix=parts%2F&maxresults=5000"
        ),
        (Kind::Blob(BlobRequestKind::List), c.clone())
    );
    // Put Blob, Put Block, Put Block List (names with folders).
    let part = "/devstoreaccount1/backups/x/parts/s-1/c-2.jsonl.gz";
    assert_eq!(blob(&put, part, ""), write);
    assert_eq!(blob(&put, part, "comp=block&blockid=AAAA"), write);
    assert_eq!(blob(&put, part, "comp=blocklist"), write);
    // Delete Blob: a kind of its own, as the blob store counts it.
    assert_eq!(
        blob(&hyper::Method::DELETE, "/devstoreaccount1/backups/a", ""),
        (Kind::Blob(BlobRequestKind::Delete), c.clone())
    );
    // Get Blob, Get Blob Properties, Get Block List.
    assert_eq!(blob(&get, part, ""), read);
    assert_eq!(
        blob(&head, "/devstoreaccount1/backups/manifest.json", ""),
        read
    );
    assert_eq!(blob(&get, part, "comp=blocklist&blocklisttype=all"), read);
    // Table and queue requests keep their kinds.
    assert_eq!(
        classify(Service::Table, &get, "/devstoreaccount1/T()", "", b""),
        (Kind::Storage(RequestKind::Query), "T".into())
    );
    assert_eq!(any_kind_name(read.0), "blob_read");
}

#[test]
fn policies_select_blob_kinds_apart_from_table_and_queue_kinds() {
    let blob_write = Kind::Blob(BlobRequestKind::Write);
    let query = Kind::Storage(RequestKind::Query);
    // No kinds named: every request, blobs included.
    let all = FaultPolicy::default();
    assert!(all.applies_to(blob_write) && all.applies_to(query));
    // Only table/queue kinds named: no blob request (as before blobs were proxied).
    let puts = FaultPolicy {
        kinds: vec![RequestKind::QueuePut],
        ..FaultPolicy::default()
    };
    assert!(!puts.applies_to(blob_write) && !puts.applies_to(query));
    assert!(puts.applies_to(Kind::Storage(RequestKind::QueuePut)));
    // Only blob kinds named: no table or queue request.
    let writes = FaultPolicy {
        blob_kinds: vec![BlobRequestKind::Write],
        ..FaultPolicy::default()
    };
    assert!(writes.applies_to(blob_write) && !writes.applies_to(query));
    assert!(!writes.applies_to(Kind::Blob(BlobRequestKind::Read)));
    // `per_kind` overrides table/queue kinds only.
    let spared = FaultPolicy {
        server_busy: 1.0,
        per_kind: vec![(RequestKind::Query, FaultPolicy::none())],
        ..FaultPolicy::default()
    };
    assert_eq!(spared.for_kind(query).server_busy, 0.0);
    assert_eq!(spared.for_kind(blob_write).server_busy, 1.0);
}

/// A stand-in for Azurite that answers every request 200 with an empty body, and counts them.
async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let count = seen.clone();
    let app = axum::Router::new().fallback(move || {
        count.fetch_add(1, Ordering::SeqCst);
        async { "" }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

/// The raw bytes of an entity group transaction writing to `table` through the proxy.
fn batch_request(table: &str) -> String {
    let body = format!(
        "--changeset\r\nPUT http://127.0.0.1:1/devstoreaccount1/{table}(PartitionKey='a',RowKey='b') HTTP/1.1\r\n"
    );
    format!(
        "POST /devstoreaccount1/$batch HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Sends `request` on a connection of its own; the status line of the answer.
async fn send_raw(addr: SocketAddr, request: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 1024];
    let n = stream.read(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Waits (bounded: a hang, not a duration, is what fails) until the proxy's held count
/// satisfies `until`.
async fn held_until(proxy: &StorageProxy, what: &str, until: impl FnMut(&Held) -> bool) -> Held {
    tokio::time::timeout(Duration::from_secs(30), proxy.wait_held(until))
        .await
        .unwrap_or_else(|_| panic!("held requests never {what}: {:?}", proxy.held()))
}

#[tokio::test]
async fn a_hold_keeps_what_it_matches_until_replaced_or_released() {
    let (up, _) = upstream().await;
    let proxy = StorageProxy::start(up, up, FaultPolicy::none(), 1)
        .await
        .unwrap();
    let table = proxy.table_addr;
    proxy.hold(Hold::writes_to("Dest"));
    let held = tokio::spawn(send_raw(table, batch_request("Dest")));
    held_until(&proxy, "reached 1 waiting", |h| h.now == 1).await;
    // Other tables' writes, and reads of the held table, go through meanwhile.
    assert!(send_raw(table, batch_request("Other"))
        .await
        .contains("200"));
    let query = "GET /devstoreaccount1/Dest() HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";
    assert!(send_raw(table, query.to_string()).await.contains("200"));
    assert!(!held.is_finished());
    assert_eq!(proxy.held(), Held { now: 1, total: 1 });
    assert_eq!(
        proxy.count_of(RequestKind::Batch),
        2,
        "counted when it came"
    );

    // A hold that does not match it lets it through, forwarded as it came.
    proxy.hold(Hold::receives_from("q"));
    assert!(held.await.unwrap().contains("200"));
    assert_eq!(proxy.held(), Held { now: 0, total: 1 });

    // A held request whose client went away (a killed handler's) is no longer counted.
    proxy.hold(Hold::writes_to("Dest"));
    let abandoned = tokio::spawn(send_raw(table, batch_request("Dest")));
    held_until(&proxy, "reached 2 in all", |h| h.total == 2).await;
    abandoned.abort();
    held_until(&proxy, "dropped the abandoned one", |h| h.now == 0).await;

    // Released: nothing is held any more.
    proxy.release();
    assert!(send_raw(table, batch_request("Dest")).await.contains("200"));
    assert_eq!(proxy.held(), Held { now: 0, total: 2 });
}

#[test]
fn holds_select_kinds_and_resources() {
    let batch = Kind::Storage(RequestKind::Batch);
    let get = Kind::Storage(RequestKind::QueueGet);
    let blob_write = Kind::Blob(BlobRequestKind::Write);
    let writes = Hold::writes_to("Dest");
    assert!(writes.matches(batch, "Dest"));
    assert!(!writes.matches(batch, "Source") && !writes.matches(get, "Dest"));
    assert!(!writes.matches(blob_write, "Dest"));
    assert!(Hold::receives_from("q").matches(get, "q"));
    let blobs = Hold::blob_writes_to("c");
    assert!(blobs.matches(blob_write, "c") && !blobs.matches(batch, "c"));
    // No kinds and no resources: everything.
    assert!(Hold::default().matches(blob_write, "x") && Hold::default().matches(get, "y"));
}

/// A hidden queue's receives find no message, answered by the proxy (the store parses the
/// answer as an empty receive; storage sees nothing), until it is shown again.
#[tokio::test]
async fn a_hidden_queue_is_received_from_as_an_empty_one() {
    use crate::storage::connection::StorageAccount;
    use crate::storage::request_counts::RequestCounters;
    use crate::storage::QueueStore;

    let (up, seen) = upstream().await;
    let proxy = StorageProxy::start(up, up, FaultPolicy::none(), 1)
        .await
        .unwrap();
    let queues = StorageAccount::parse(&proxy.connection_string())
        .unwrap()
        .queue_store(Arc::new(RequestCounters::new()));
    proxy.hide_messages(&["work"]);
    let got = queues
        .get_messages("work", 32, Duration::from_secs(30))
        .await
        .expect("an empty receive");
    assert!(got.is_empty());
    assert_eq!(seen.load(Ordering::SeqCst), 0, "storage saw nothing");
    assert_eq!(
        proxy.count_of(RequestKind::QueueGet),
        1,
        "counted as a receive"
    );
    // Other queues, and the same one once shown, reach storage.
    let _ = queues
        .get_messages("other", 1, Duration::from_secs(30))
        .await;
    proxy.hide_messages(&[]);
    let _ = queues
        .get_messages("work", 1, Duration::from_secs(30))
        .await;
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}
