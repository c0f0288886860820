//! The storage proxy against Azurite: counts by kind and table, and injects Azure's faults.

use crate::support;

use std::sync::Arc;

use tablescan::lab::proxy::{FaultPolicy, StorageProxy};
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::{RequestCounters, RequestKind};
use tablescan::storage::retry_policy::RetryPolicy;
use tablescan::storage::{
    BatchOperation, Entity, Query, QueueStore, StorageErrorKind, StorageResult, TableStore,
};

async fn proxy(faults: FaultPolicy) -> StorageProxy {
    let azurite = support::azurite();
    let table = format!("127.0.0.1:{}", azurite.table_port())
        .parse()
        .unwrap();
    let queue = format!("127.0.0.1:{}", azurite.queue_port())
        .parse()
        .unwrap();
    StorageProxy::start(table, queue, faults, 42).await.unwrap()
}

#[tokio::test]
async fn counts_requests_by_kind_and_resource() {
    let proxy = proxy(FaultPolicy::none()).await;
    let account = StorageAccount::parse(&proxy.connection_string()).unwrap();
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    let queues = account.queue_store(Arc::new(RequestCounters::new()));
    let table = support::unique_name("Proxied");
    tables.create_table(&table).await.unwrap();
    upsert_one(&tables, &table).await.unwrap();
    let page = tables.query_page(&table, &Query::default()).await.unwrap();
    assert_eq!(page.entities.len(), 1);
    assert!(tables.get_entity(&table, "p", "r").await.unwrap().is_some());
    let (queue, got) = support::queue_round_trip(&queues, "proxied", "aGVsbG8=").await;
    queues
        .delete_message(&queue, &got[0].id, &got[0].pop_receipt)
        .await
        .unwrap();

    let counts = proxy.counts();
    let of = |kind: &str, name: &str| {
        counts
            .get(&(kind.to_string(), name.to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(of("batch", &table), 1, "{counts:?}");
    assert_eq!(of("query", &table), 1, "{counts:?}");
    assert_eq!(of("point_read", &table), 1, "{counts:?}");
    assert_eq!(of("queue_put", &queue), 1, "{counts:?}");
    assert_eq!(of("queue_get", &queue), 1, "{counts:?}");
    assert_eq!(of("queue_delete", &queue), 1, "{counts:?}");
    assert_eq!(proxy.faults_injected(), 0);
}

#[tokio::test]
async fn injects_server_busy_with_azure_bodies_and_resets() {
    let proxy = proxy(FaultPolicy {
        server_busy: 1.0,
        kinds: vec![RequestKind::Query],
        ..FaultPolicy::default()
    })
    .await;
    let account = fast_retries(&proxy);
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    let table = support::unique_name("Busy");
    tables.create_table(&table).await.unwrap();
    let err = tables
        .query_page(&table, &Query::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Transient);
    assert_eq!(err.status, Some(503));
    assert_eq!(err.code.as_deref(), Some("ServerBusy"), "{err}");
    assert_eq!(
        proxy.count_of(RequestKind::Query),
        3,
        "every attempt went through the proxy"
    );
    assert_eq!(proxy.faults_injected(), 3);

    // A reset after the write reached storage: the client retries and must cope.
    proxy.set_faults(FaultPolicy {
        reset_after: 1.0,
        kinds: vec![RequestKind::Batch],
        ..FaultPolicy::default()
    });
    let err = upsert_one(&tables, &table).await.unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Transient, "{err}");
    proxy.set_faults(FaultPolicy::none());
    assert!(
        tables.get_entity(&table, "p", "r").await.unwrap().is_some(),
        "the write took effect although the client saw a reset"
    );
}

#[tokio::test]
async fn duplicates_puts_and_applies_per_kind_policies() {
    let proxy = proxy(FaultPolicy {
        duplicate_puts: 1.0,
        extra_copies: 2,
        server_busy: 1.0,
        kinds: vec![RequestKind::QueuePut],
        // The per-kind policy replaces this one for puts: duplicates, but no ServerBusy.
        per_kind: vec![(
            RequestKind::QueuePut,
            FaultPolicy {
                duplicate_puts: 1.0,
                extra_copies: 2,
                ..FaultPolicy::default()
            },
        )],
        ..FaultPolicy::default()
    })
    .await;
    let account = StorageAccount::parse(&proxy.connection_string()).unwrap();
    let queues = account.queue_store(Arc::new(RequestCounters::new()));
    let queue = support::unique_name("dup");
    queues.create_queue(&queue).await.unwrap();
    let mut copies = 0;
    for i in 0..10 {
        queues
            .put_message(&queue, &format!("bWVzc2FnZQ{i}"), std::time::Duration::ZERO)
            .await
            .expect("puts are not faulted by the per-kind policy");
    }
    let got = queues
        .get_messages(&queue, 32, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    copies += got.len() as u64;
    assert_eq!(
        copies,
        10 + proxy.duplicates_put(),
        "every extra copy is a real message"
    );
    assert!(
        (10..=20).contains(&proxy.duplicates_put()),
        "one or two extra copies per put: {}",
        proxy.duplicates_put()
    );
    for i in 0..10 {
        let text = format!("bWVzc2FnZQ{i}");
        let n = got.iter().filter(|m| m.text == text).count();
        assert!((2..=3).contains(&n), "{text}: {n} copies");
    }
}

/// Started with the blob service too, the proxy counts blob requests by kind and container as
/// the blob store counts them, faults only the blob kinds a policy names, and leaves tables alone.
#[tokio::test]
async fn fronts_blobs_counting_and_faulting_them() {
    use bytes::Bytes;
    use tablescan::storage::blob::{BlobRequestCounters, BlobRequestKind, BlobStore, BlobWrite};

    let azurite = support::azurite();
    let address = |port: u16| format!("127.0.0.1:{port}").parse().unwrap();
    let proxy = StorageProxy::start_with_blob(
        address(azurite.table_port()),
        address(azurite.queue_port()),
        address(azurite.blob_port()),
        FaultPolicy {
            server_busy: 1.0,
            blob_kinds: vec![BlobRequestKind::Write],
            ..FaultPolicy::default()
        },
        42,
    )
    .await
    .unwrap();
    let account = fast_retries(&proxy);
    let counters = Arc::new(BlobRequestCounters::new());
    let blobs = account.blob_store(counters.clone()).unwrap();
    let container = support::unique_name("proxied");
    let write = BlobWrite::new("text/plain");
    let body = Bytes::from_static(b"hello");
    blobs.create_container(&container).await.unwrap();
    let err = blobs
        .upload(&container, "a/b.txt", body.clone(), &write)
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Transient, "{err}");
    assert_eq!(err.code.as_deref(), Some("ServerBusy"), "{err}");
    // Tables are not faulted by a policy that names only blob kinds.
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    tables
        .create_table(&support::unique_name("Spared"))
        .await
        .unwrap();

    proxy.set_faults(FaultPolicy::none());
    blobs
        .upload(&container, "a/b.txt", body.clone(), &write)
        .await
        .unwrap();
    let downloaded = blobs.download(&container, "a/b.txt", 100).await.unwrap();
    assert_eq!(downloaded.bytes, body);
    let page = blobs.list(&container, "a/", 10, None).await.unwrap();
    assert_eq!(page.blobs.len(), 1);

    let store = counters.snapshot();
    let counts = proxy.counts();
    for (kind, name, sent) in [
        (BlobRequestKind::Write, "blob_write", store.write),
        (BlobRequestKind::Read, "blob_read", store.read),
        (BlobRequestKind::List, "blob_list", store.list),
        (BlobRequestKind::Admin, "blob_admin", store.admin),
    ] {
        assert_eq!(proxy.count_of_blob(kind), sent, "{name}: {counts:?}");
        assert_eq!(
            counts.get(&(name.to_string(), container.clone())).copied(),
            Some(sent),
            "{name} by container: {counts:?}"
        );
    }
    assert_eq!(store.write, 4, "3 faulted attempts and 1 upload: {store:?}");
    assert_eq!(
        proxy.faults_by_kind().into_iter().collect::<Vec<_>>(),
        vec![("blob_write", 3)]
    );
}

/// Upserts the row ("p", "r") into `table` in a batch of one.
async fn upsert_one(tables: &AzureTableStore, table: &str) -> StorageResult<()> {
    tables
        .submit_batch(table, "p", &[BatchOperation::Upsert(Entity::new("p", "r"))])
        .await
}

/// An account through `proxy` whose requests are tried 3 times, 1 to 5 ms apart.
fn fast_retries(proxy: &StorageProxy) -> StorageAccount {
    StorageAccount::parse(&proxy.connection_string())
        .unwrap()
        .with_retry_policy(RetryPolicy {
            max_attempts: 3,
            base_delay: std::time::Duration::from_millis(1),
            max_delay: std::time::Duration::from_millis(5),
        })
}
