//! The Azure storage adapters against a real Azurite: one test per gap of the 0.21 crates that the
//! adapters cover (connection strings, quotes in keys, failed transactions, batch limits, typed
//! properties, pagination, queue messages, request counting, retries), plus the scan engine over
//! adversarial keys. Tables stay small: Azurite scans a whole table for every filter.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::{account, azurite, new_table, queue_store, table_store, unique_name};
use tablescan::lab::azurite::Azurite;
use tablescan::scan::{list, ScanParameters, Strategy};
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::{RequestCounters, RequestCounts};
use tablescan::storage::retry_policy::RetryPolicy;
use tablescan::storage::{
    compare_keys, BatchOperation, CompareOp, Continuation, Entity, Filter, MessageEncoding, Query,
    QueueStore, StorageErrorKind, TableStore, MAX_BATCH_BYTES, MAX_ENTITY_BYTES, MAX_MESSAGE_TEXT,
};

fn entity(pk: &str, rk: &str, properties: Value) -> Entity {
    let mut e = Entity::new(pk, rk);
    e.properties = properties.as_object().cloned().unwrap_or_default().into();
    e
}

fn keys(entities: &[Entity]) -> Vec<(String, String)> {
    entities
        .iter()
        .map(|e| (e.partition_key.clone(), e.row_key.clone()))
        .collect()
}

fn sorted_keys(mut keys: Vec<(String, String)>) -> Vec<(String, String)> {
    keys.sort_by(|a, b| compare_keys(&a.0, &b.0).then(compare_keys(&a.1, &b.1)));
    keys
}

/// Upserts rows in one transaction per partition.
async fn load<T: TableStore>(store: &T, table: &str, rows: &[Entity]) {
    let mut by_pk: BTreeMap<&str, Vec<BatchOperation>> = BTreeMap::new();
    for e in rows {
        by_pk
            .entry(&e.partition_key)
            .or_default()
            .push(BatchOperation::Upsert(e.clone()));
    }
    for (pk, ops) in by_pk {
        for chunk in ops.chunks(100) {
            store
                .submit_batch(table, pk, chunk)
                .await
                .unwrap_or_else(|e| panic!("loading partition {pk:?}: {e}"));
        }
    }
}

/// Every row of a table via plain paging.
async fn read_all<T: TableStore>(store: &T, table: &str, top: u32) -> Vec<Entity> {
    let mut query = Query {
        top: Some(top),
        ..Query::default()
    };
    let mut rows = Vec::new();
    loop {
        let page = store.query_page(table, &query).await.expect("query");
        rows.extend(page.entities);
        match page.continuation {
            Some(c) => query.continuation = Some(c),
            None => return rows,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connection strings

#[test]
fn development_storage_connection_string_points_at_azurite_defaults() {
    let account = StorageAccount::parse("UseDevelopmentStorage=true").unwrap();
    assert_eq!(account.account_name(), "devstoreaccount1");
    assert_eq!(
        account.table_endpoint(),
        "http://127.0.0.1:10002/devstoreaccount1"
    );
    assert_eq!(
        account.queue_endpoint(),
        "http://127.0.0.1:10001/devstoreaccount1"
    );
    let store = account.table_store(Arc::new(RequestCounters::new()));
    assert_eq!(store.endpoint(), "http://127.0.0.1:10002/devstoreaccount1");
}

#[tokio::test]
async fn explicit_endpoint_connection_string_works_against_azurite() {
    let connection_string = azurite().connection_string();
    assert!(connection_string.contains(&format!(
        "TableEndpoint=http://127.0.0.1:{}/devstoreaccount1",
        azurite().table_port()
    )));
    let account = StorageAccount::parse(&connection_string).unwrap();
    assert!(
        !format!("{account:?}{account}").contains("Eby8vdM02x"),
        "the key must be redacted"
    );
    let counters = Arc::new(RequestCounters::new());
    let tables = account.table_store(counters.clone());
    let table = new_table(&tables, "conn").await;
    tables
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Insert(entity("p", "r", json!({"V": "x"})))],
        )
        .await
        .unwrap();
    let (read, _) = tables
        .get_entity(&table, "p", "r")
        .await
        .unwrap()
        .expect("row exists");
    assert_eq!(read.properties.get_value("V").unwrap(), "x");

    let queues = account.queue_store(counters.clone());
    let queue = unique_name("conn");
    queues.create_queue(&queue).await.unwrap();
    queues
        .put_message(&queue, "aGk=", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(queues.approximate_count(&queue).await.unwrap(), 1);
    assert!(queues.delete_queue(&queue).await.unwrap());
    assert!(tables.delete_table(&table).await.unwrap());
}

#[tokio::test]
async fn sas_connection_string_works_against_azurite() {
    let (key_store, _) = table_store();
    let table = new_table(&key_store, "sas").await;
    // For the table service with service, container and object access (the crate's SAS builder
    // takes only one resource type, and Azurite requires "container" for queries).
    let (sas, _) = support::account_sas("t");
    let connection_string = format!(
        "TableEndpoint={};QueueEndpoint={};SharedAccessSignature={sas}",
        azurite().table_endpoint(),
        azurite().queue_endpoint()
    );
    let account = StorageAccount::parse(&connection_string).unwrap();
    assert_eq!(account.auth_kind(), "sas");
    assert_eq!(account.account_name(), "devstoreaccount1");
    let sig = sas.split('&').find(|p| p.starts_with("sig=")).unwrap();
    assert!(!format!("{account:?} {account}").contains(sig));

    let store = account.table_store(Arc::new(RequestCounters::new()));
    store
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Upsert(entity("p", "it's", json!({"N": 1})))],
        )
        .await
        .unwrap();
    assert!(store
        .get_entity(&table, "p", "it's")
        .await
        .unwrap()
        .is_some());
    let page = store.query_page(&table, &Query::default()).await.unwrap();
    assert_eq!(
        keys(&page.entities),
        vec![("p".to_string(), "it's".to_string())]
    );
    key_store.delete_table(&table).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Quotes and other special characters in keys

#[tokio::test]
async fn quotes_in_keys_work_in_filters_point_reads_and_batches() {
    let (store, _) = table_store();
    let table = new_table(&store, "quotes").await;
    let tricky = [
        "O'Brien",
        "'",
        "''",
        "a''b",
        "'quoted'",
        "it's a \"test\"",
        "100% +1 & (x)=y, z",
        "é'日本\u{1F600}\u{FFFF}",
    ];
    for pk in tricky {
        let ops: Vec<_> = tricky
            .iter()
            .map(|rk| BatchOperation::Insert(entity(pk, rk, json!({"PK": pk, "RK": rk}))))
            .collect();
        store
            .submit_batch(&table, pk, &ops)
            .await
            .unwrap_or_else(|e| panic!("insert into {pk:?}: {e}"));
    }
    for pk in tricky {
        // Filter: exactly this partition, nothing else (an unescaped quote would end the literal).
        let page = store
            .query_page(
                &table,
                &Query {
                    filter: Some(Filter::pk(CompareOp::Eq, pk)),
                    ..Query::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("filter on {pk:?}: {e}"));
        assert!(page.continuation.is_none());
        let expected = sorted_keys(
            tricky
                .iter()
                .map(|rk| (pk.to_string(), rk.to_string()))
                .collect(),
        );
        assert_eq!(keys(&page.entities), expected, "partition {pk:?}");
        for rk in tricky {
            let (e, etag) = store
                .get_entity(&table, pk, rk)
                .await
                .unwrap_or_else(|e| panic!("point read {pk:?}/{rk:?}: {e}"))
                .unwrap_or_else(|| panic!("{pk:?}/{rk:?} not found"));
            assert_eq!((e.partition_key.as_str(), e.row_key.as_str()), (pk, rk));
            assert_eq!(e.properties.get_value("RK").unwrap(), rk);
            assert!(!etag.is_empty());
        }
    }
    // Row-key filters and conditional batch operations on quoted keys.
    let page = store
        .query_page(
            &table,
            &Query {
                filter: Some(Filter::and(vec![
                    Filter::pk(CompareOp::Eq, "O'Brien"),
                    Filter::rk(CompareOp::Gt, "'quoted'"),
                ])),
                ..Query::default()
            },
        )
        .await
        .unwrap();
    let expected: Vec<_> = sorted_keys(
        tricky
            .iter()
            .map(|rk| ("O'Brien".to_string(), rk.to_string()))
            .collect(),
    )
    .into_iter()
    .filter(|(_, rk)| compare_keys(rk, "'quoted'").is_gt())
    .collect();
    assert_eq!(keys(&page.entities), expected);

    let (_, etag) = store
        .get_entity(&table, "O'Brien", "it's a \"test\"")
        .await
        .unwrap()
        .unwrap();
    store
        .submit_batch(
            &table,
            "O'Brien",
            &[
                BatchOperation::Replace {
                    entity: entity("O'Brien", "it's a \"test\"", json!({"New": true})),
                    etag: Some(etag),
                },
                BatchOperation::Merge {
                    entity: entity("O'Brien", "''", json!({"Merged": 1})),
                    etag: None,
                },
                BatchOperation::Delete {
                    row_key: "'".into(),
                    etag: None,
                },
            ],
        )
        .await
        .unwrap();
    let (replaced, _) = store
        .get_entity(&table, "O'Brien", "it's a \"test\"")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        replaced.properties,
        json!({"New": true}).as_object().unwrap().clone().into()
    );
    let (merged, _) = store
        .get_entity(&table, "O'Brien", "''")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(merged.properties.get_value("Merged").unwrap(), 1);
    assert_eq!(merged.properties.get_value("RK").unwrap(), "''");
    assert!(store
        .get_entity(&table, "O'Brien", "'")
        .await
        .unwrap()
        .is_none());
    // A key that only differs by the quote must not be confused with it.
    assert!(store
        .get_entity(&table, "OBrien", "'")
        .await
        .unwrap()
        .is_none());
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn point_reads_distinguish_missing_entities_from_missing_tables() {
    let (store, _) = table_store();
    let table = new_table(&store, "missing").await;
    assert_eq!(
        store.get_entity(&table, "nope", "nope").await.unwrap(),
        None
    );
    let err = store
        .get_entity(&unique_name("absent"), "p", "r")
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.status, err.code.as_deref()),
        (StorageErrorKind::NotFound, Some(404), Some("TableNotFound"))
    );
    let err = store
        .query_page(&unique_name("absent"), &Query::default())
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.code.as_deref()),
        (StorageErrorKind::NotFound, Some("TableNotFound"))
    );
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn create_and_delete_table_are_idempotent() {
    let (store, _) = table_store();
    let table = unique_name("idem");
    assert!(store.create_table(&table).await.unwrap());
    assert!(!store.create_table(&table).await.unwrap());
    assert!(store.delete_table(&table).await.unwrap());
    assert!(!store.delete_table(&table).await.unwrap());
    let err = store.create_table("1-not-a-valid-name").await.unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Rejected, "{err}");
    assert_eq!(err.status, Some(400));
    assert!(
        err.code.is_some(),
        "the service's error code is kept: {err:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Entity group transactions

/// A transaction reports each written row's new ETag, the one a point read then returns, so a
/// caller can update the row again under If-Match without reading it back.
#[tokio::test]
async fn transactions_report_the_new_etag_of_each_written_row() {
    let (store, _) = table_store();
    let table = new_table(&store, "etags").await;
    store
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Upsert(entity("p", "gone", json!({})))],
        )
        .await
        .unwrap();
    let (_, old) = store
        .get_entity(&table, "p", "gone")
        .await
        .unwrap()
        .unwrap();
    let etags = store
        .submit_batch_with_etags(
            &table,
            "p",
            &[
                BatchOperation::Insert(entity("p", "a", json!({"N": 1}))),
                BatchOperation::Upsert(entity("p", "it's", json!({"N": 2}))),
                BatchOperation::Delete {
                    row_key: "gone".into(),
                    etag: Some(old),
                },
            ],
        )
        .await
        .unwrap();
    assert_eq!(etags.len(), 3);
    assert_eq!(etags[2], None, "a delete has no new ETag");
    for (i, rk) in [(0, "a"), (1, "it's")] {
        let (_, current) = store.get_entity(&table, "p", rk).await.unwrap().unwrap();
        assert_eq!(etags[i].as_deref(), Some(current.as_str()), "{rk}");
    }
    // And the reported ETag is accepted as the If-Match of the next update.
    let merged = store
        .submit_batch_with_etags(
            &table,
            "p",
            &[BatchOperation::Merge {
                entity: entity("p", "a", json!({"M": 3})),
                etag: etags[0].clone(),
            }],
        )
        .await
        .unwrap();
    let (row, current) = store.get_entity(&table, "p", "a").await.unwrap().unwrap();
    assert_eq!(merged[0].as_deref(), Some(current.as_str()));
    assert_eq!(row.properties.get_value("N").unwrap(), json!(1));
    assert_eq!(row.properties.get_value("M").unwrap(), json!(3));
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn failed_transaction_is_an_error_with_kind_code_and_index() {
    let (store, counters) = table_store();
    let table = new_table(&store, "txfail").await;
    store
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Insert(entity(
                "p",
                "existing",
                json!({"V": 1}),
            ))],
        )
        .await
        .unwrap();

    // Insert of an existing row at index 2: the whole transaction fails and nothing is applied.
    let before = counters.snapshot();
    let err = store
        .submit_batch(
            &table,
            "p",
            &[
                BatchOperation::Insert(entity("p", "new1", json!({}))),
                BatchOperation::Upsert(entity("p", "new2", json!({}))),
                BatchOperation::Insert(entity("p", "existing", json!({"V": 2}))),
                BatchOperation::Insert(entity("p", "new3", json!({}))),
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Conflict, "{err}");
    assert_eq!(err.status, Some(409));
    assert_eq!(err.code.as_deref(), Some("EntityAlreadyExists"));
    assert_eq!(err.failed_operation, Some(2));
    assert_eq!(
        counters.snapshot().since(&before).batch,
        1,
        "409 is not retried"
    );
    assert_eq!(
        keys(&read_all(&store, &table, 1000).await),
        vec![("p".to_string(), "existing".to_string())],
        "atomic"
    );
    let (existing, etag) = store
        .get_entity(&table, "p", "existing")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(existing.properties.get_value("V").unwrap(), 1);

    // If-Match with a stale ETag: 412 at its index.
    store
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Merge {
                entity: entity("p", "existing", json!({"V": 3})),
                etag: Some(etag.clone()),
            }],
        )
        .await
        .unwrap();
    let err = store
        .submit_batch(
            &table,
            "p",
            &[
                BatchOperation::Upsert(entity("p", "other", json!({}))),
                BatchOperation::Replace {
                    entity: entity("p", "existing", json!({"V": 4})),
                    etag: Some(etag),
                },
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.status, err.failed_operation),
        (StorageErrorKind::PreconditionFailed, Some(412), Some(1)),
        "{err}"
    );
    assert_eq!(err.code.as_deref(), Some("UpdateConditionNotSatisfied"));

    // Operations on a missing entity: 404 at its index.
    for op in [
        BatchOperation::Delete {
            row_key: "ghost".into(),
            etag: None,
        },
        BatchOperation::Replace {
            entity: entity("p", "ghost", json!({})),
            etag: None,
        },
        BatchOperation::Merge {
            entity: entity("p", "ghost", json!({})),
            etag: None,
        },
    ] {
        let err = store
            .submit_batch(
                &table,
                "p",
                &[
                    BatchOperation::Upsert(entity("p", "x", json!({}))),
                    op.clone(),
                ],
            )
            .await
            .unwrap_err();
        assert_eq!(
            (err.kind, err.failed_operation),
            (StorageErrorKind::NotFound, Some(1)),
            "{op:?}: {err}"
        );
        assert_eq!(err.code.as_deref(), Some("ResourceNotFound"));
    }
    assert!(
        store.get_entity(&table, "p", "x").await.unwrap().is_none(),
        "failed transactions apply nothing"
    );

    // A transaction on a missing table.
    let err = store
        .submit_batch(
            &unique_name("absent"),
            "p",
            &[BatchOperation::Upsert(entity("p", "r", json!({})))],
        )
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.code.as_deref()),
        (StorageErrorKind::NotFound, Some("TableNotFound"))
    );
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn batch_limits_are_enforced_before_sending() {
    let (store, counters) = table_store();
    let table = new_table(&store, "limits").await;
    let before = counters.snapshot();
    let rows = |n: usize| {
        (0..n)
            .map(|i| BatchOperation::Upsert(entity("p", &format!("r{i:03}"), json!({}))))
            .collect::<Vec<_>>()
    };

    let too_many = rows(101);
    let mixed = vec![
        BatchOperation::Upsert(entity("p", "a", json!({}))),
        BatchOperation::Upsert(entity("q", "b", json!({}))),
    ];
    let duplicate = vec![
        BatchOperation::Upsert(entity("p", "a", json!({}))),
        BatchOperation::Delete {
            row_key: "a".into(),
            etag: None,
        },
    ];
    // Two 60,000-byte strings (30,000 UTF-16 units each, under the 64 KiB property limit).
    let big = "x".repeat(30_000);
    let too_big: Vec<_> = (0..80)
        .map(|i| {
            BatchOperation::Upsert(entity(
                "p",
                &format!("r{i}"),
                json!({"Big": big, "Big2": big}),
            ))
        })
        .collect();
    let wide_property = vec![BatchOperation::Upsert(entity(
        "p",
        "w",
        json!({"Big": "\u{1F600}".repeat(16_385)}),
    ))];
    assert!(
        too_big
            .iter()
            .map(|op| op.entity().unwrap().wire_size())
            .sum::<usize>()
            > MAX_BATCH_BYTES
    );
    for (name, ops, needle) in [
        ("101 operations", too_many, "1 to 100"),
        ("empty", Vec::new(), "1 to 100"),
        ("mixed partition keys", mixed, "mixes partition keys"),
        ("duplicate RowKey", duplicate, "twice"),
        ("over 4 MiB", too_big, "4 MiB"),
        ("a string over 64 KiB as UTF-16", wide_property, "64 KiB"),
    ] {
        let err = store.submit_batch(&table, "p", &ops).await.unwrap_err();
        assert_eq!(err.kind, StorageErrorKind::InvalidInput, "{name}: {err}");
        assert!(err.message.contains(needle), "{name}: {err}");
    }
    assert_eq!(
        counters.snapshot().since(&before),
        RequestCounts::default(),
        "nothing was sent"
    );
    // Azurite itself would have accepted the mixed-partition transaction; 100 operations pass.
    store.submit_batch(&table, "p", &rows(100)).await.unwrap();
    assert_eq!(read_all(&store, &table, 1000).await.len(), 100);
    store.delete_table(&table).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Typed properties

#[tokio::test]
async fn typed_properties_round_trip_through_upsert_query_and_point_read() {
    let (store, _) = table_store();
    let table = new_table(&store, "typed").await;
    let sent = json!({
        "Str": "text with 'quotes' and é",
        "EmptyStr": "",
        "I32": 42,
        "NegI32": -7,
        "I64": "9223372036854775807", "I64@odata.type": "Edm.Int64",
        "Dbl": 2.5,
        "WholeDbl": 3.0, "WholeDbl@odata.type": "Edm.Double",
        "BigDbl": 1e20, "BigDbl@odata.type": "Edm.Double",
        "Bool": true,
        "When": "2024-02-29T12:34:56.1234567Z", "When@odata.type": "Edm.DateTime",
        "Bin": "AAEC/w==", "Bin@odata.type": "Edm.Binary",
        "Id": "c9da6455-213d-42c9-9a79-3e9149a57833", "Id@odata.type": "Edm.Guid",
    });
    let original = entity("p", "r", sent);
    store
        .submit_batch(&table, "p", &[BatchOperation::Upsert(original.clone())])
        .await
        .unwrap();

    let (point, etag) = store.get_entity(&table, "p", "r").await.unwrap().unwrap();
    assert!(etag.starts_with("W/\""), "{etag}");
    let queried = store
        .query_page(&table, &Query::default())
        .await
        .unwrap()
        .entities;
    assert_eq!(queried.len(), 1);
    assert_eq!(queried[0], point, "query and point read agree");
    let selected = store
        .query_page(
            &table,
            &Query {
                select: Some(vec!["I64".into(), "Dbl".into()]),
                ..Query::default()
            },
        )
        .await
        .unwrap()
        .entities;
    assert_eq!(
        serde_json::to_value(&selected[0].properties).unwrap(),
        json!({"I64": "9223372036854775807", "I64@odata.type": "Edm.Int64", "Dbl": 2.5, "Dbl@odata.type": "Edm.Double"}),
        "$select keeps annotations of selected columns"
    );

    let expected_annotations = [
        ("I64", "Edm.Int64"),
        ("When", "Edm.DateTime"),
        ("Bin", "Edm.Binary"),
        ("Id", "Edm.Guid"),
    ];
    for (name, edm) in expected_annotations {
        assert_eq!(
            point
                .properties
                .get_value(&format!("{name}@odata.type"))
                .unwrap(),
            edm,
            "{name}"
        );
        assert_eq!(
            point.properties.get_value(name).unwrap(),
            original.properties.get_value(name).unwrap(),
            "{name}"
        );
    }
    for name in ["Str", "EmptyStr", "I32", "NegI32", "Bool"] {
        assert_eq!(
            point.properties.get_value(name).unwrap(),
            original.properties.get_value(name).unwrap(),
            "{name}"
        );
        assert!(
            !point.properties.contains_key(&format!("{name}@odata.type")),
            "{name} needs no annotation"
        );
    }
    // The service does not annotate Edm.Double in responses, even when the request did; whole
    // doubles come back as `3.0`. The adapter annotates every fractional number as Edm.Double, so
    // the type survives a copy (unannotated, `3.0` would be stored as Int32).
    for name in ["Dbl", "WholeDbl", "BigDbl"] {
        assert!(
            point.properties.get_value(name).unwrap().is_f64(),
            "{name} stays a JSON float: {:?}",
            point.properties.get_value(name).unwrap()
        );
        assert_eq!(
            point.properties.get_value(name).unwrap().as_f64(),
            original.properties.get_value(name).unwrap().as_f64()
        );
        assert_eq!(
            point
                .properties
                .get_value(&format!("{name}@odata.type"))
                .unwrap(),
            "Edm.Double",
            "{name}"
        );
    }
    assert!(!point
        .properties
        .keys()
        .any(|k| k.starts_with("odata.") || k.starts_with("Timestamp")));

    // Copy the entity as read into another row: reading the copy gives exactly the same entity.
    let mut copy = point.clone();
    copy.row_key = "copy".into();
    store
        .submit_batch(&table, "p", &[BatchOperation::Insert(copy.clone())])
        .await
        .unwrap();
    let (copy_read, _) = store
        .get_entity(&table, "p", "copy")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(copy_read, copy);
    assert!(
        copy_read.properties.get_value("I32").unwrap().is_i64(),
        "Int32 stays an integer"
    );

    // Without the annotation the same `3.0` is stored as an Int32 (this is what the adapter's
    // annotation prevents).
    let bare = entity("p", "bare", json!({"WholeDbl": 3.0}));
    store
        .submit_batch(&table, "p", &[BatchOperation::Insert(bare)])
        .await
        .unwrap();
    let (bare_read, _) = store
        .get_entity(&table, "p", "bare")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::to_value(&bare_read.properties).unwrap(),
        json!({"WholeDbl": 3})
    );
    store.delete_table(&table).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Pagination

#[tokio::test]
async fn pagination_with_continuations_loses_and_duplicates_nothing() {
    let (store, counters) = table_store();
    let table = new_table(&store, "pages").await;
    let mut rows = Vec::new();
    for pk in ["", "a", "b\u{FFFF}", "c'"] {
        for i in 0..7 {
            rows.push(entity(pk, &format!("r{i}"), json!({"I": i})));
        }
    }
    load(&store, &table, &rows).await;
    let expected = sorted_keys(keys(&rows));

    for top in [1, 3, 4, 7, 1000] {
        let before = counters.snapshot();
        let mut query = Query {
            top: Some(top),
            select: Some(vec!["I".into()]),
            ..Query::default()
        };
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let page = store.query_page(&table, &query).await.unwrap();
            pages += 1;
            assert!(page.entities.len() <= top as usize);
            seen.extend(keys(&page.entities));
            match page.continuation {
                Some(c) => query.continuation = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, expected, "top {top}");
        assert_eq!(
            counters.snapshot().since(&before).query,
            pages,
            "one request per page"
        );
        assert_eq!(
            pages,
            (expected.len() as u64).div_ceil(top as u64).max(1),
            "Azurite sends full pages"
        );
    }

    // With a filter spanning partitions.
    let filter = Filter::and(vec![
        Filter::pk(CompareOp::Gt, ""),
        Filter::pk(CompareOp::Lt, "c"),
    ]);
    let mut query = Query {
        filter: Some(filter.clone()),
        top: Some(2),
        ..Query::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = store.query_page(&table, &query).await.unwrap();
        seen.extend(keys(&page.entities));
        match page.continuation {
            Some(c) => query.continuation = Some(c),
            None => break,
        }
    }
    let filtered: Vec<_> = expected
        .iter()
        .filter(|(pk, rk)| filter.matches(pk, rk))
        .cloned()
        .collect();
    assert_eq!(seen, filtered);
    store.delete_table(&table).await.unwrap();
}

/// Azure may send `NextPartitionKey` without `NextRowKey` (Azurite issue #1554 reports Azurite
/// mishandling that). Azurite 3.37 never sends such a token (it always sends both, each the
/// base64 of the key), but it does accept one and resumes at the start of that partition.
#[tokio::test]
async fn continuation_without_next_row_key_resumes_at_the_partition_start() {
    let (store, _) = table_store();
    let table = new_table(&store, "nrk").await;
    let rows: Vec<_> = ["a", "b", "c"]
        .iter()
        .flat_map(|pk| (0..3).map(move |i| entity(pk, &format!("r{i}"), json!({}))))
        .collect();
    load(&store, &table, &rows).await;

    // Page so that the token points at the first row of partition "b".
    let page = store
        .query_page(
            &table,
            &Query {
                top: Some(3),
                ..Query::default()
            },
        )
        .await
        .unwrap();
    let token = page.continuation.expect("more rows");
    assert!(
        token.next_row_key.is_some(),
        "Azurite always sends NextRowKey"
    );
    use base64::Engine;
    let decode = |s: &str| {
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
    };
    assert_eq!(
        decode(&token.next_partition_key),
        "b",
        "Azurite's token is base64 of the next PartitionKey"
    );
    assert_eq!(decode(token.next_row_key.as_deref().unwrap()), "r0");

    let resumed = store
        .query_page(
            &table,
            &Query {
                continuation: Some(Continuation {
                    next_row_key: None,
                    ..token.clone()
                }),
                ..Query::default()
            },
        )
        .await
        .unwrap();
    let expected: Vec<_> = sorted_keys(keys(&rows))
        .into_iter()
        .filter(|(pk, _)| pk.as_str() >= "b")
        .collect();
    assert_eq!(keys(&resumed.entities), expected);
    assert!(resumed.continuation.is_none());
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn top_out_of_range_is_rejected_before_sending() {
    let (store, counters) = table_store();
    for top in [0, 1001] {
        let err = store
            .query_page(
                "whatever",
                &Query {
                    top: Some(top),
                    ..Query::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind, StorageErrorKind::InvalidInput);
    }
    assert_eq!(counters.snapshot().query, 0);
}

// ---------------------------------------------------------------------------------------------
// Queues

#[tokio::test]
async fn queue_messages_round_trip_with_base64_text() {
    let (queues, counters) = queue_store();
    let queue = unique_name("msgs");
    queues.create_queue(&queue).await.unwrap();
    queues.create_queue(&queue).await.unwrap(); // idempotent

    let payloads: Vec<Vec<u8>> = vec![
        b"{\"step\":1}".to_vec(),
        "ünïcödé <xml> & 'quotes'".as_bytes().to_vec(),
        vec![0, 1, 2, 255],
    ];
    for p in &payloads {
        queues
            .put_message(&queue, &MessageEncoding::Base64.encode(p), Duration::ZERO)
            .await
            .unwrap();
    }
    // A delayed message stays invisible.
    queues
        .put_message(
            &queue,
            &MessageEncoding::Base64.encode(b"later"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(queues.approximate_count(&queue).await.unwrap(), 4);

    let received = queues
        .get_messages(&queue, 32, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(received.len(), 3, "the delayed message is not visible");
    let mut decoded: Vec<Vec<u8>> = received
        .iter()
        .map(|m| MessageEncoding::Base64.decode(&m.text).unwrap())
        .collect();
    decoded.sort();
    let mut expected = payloads.clone();
    expected.sort();
    assert_eq!(decoded, expected);
    for m in &received {
        assert_eq!(m.dequeue_count, 1);
        assert!(m.next_visible_time > m.insertion_time);
        assert!(m.expiration_time > m.next_visible_time);
        assert!(!m.id.is_empty() && !m.pop_receipt.is_empty());
    }
    assert!(
        queues
            .get_messages(&queue, 32, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "hidden while leased"
    );

    // Update: visibility only (text kept), then visibility and text; each gives a new pop receipt.
    let first = &received[0];
    let receipt = queues
        .update_message(&queue, &first.id, &first.pop_receipt, Duration::ZERO, None)
        .await
        .unwrap();
    assert_ne!(receipt, first.pop_receipt);
    let again = queues
        .get_messages(&queue, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (
            again[0].id.as_str(),
            again[0].text.as_str(),
            again[0].dequeue_count
        ),
        (first.id.as_str(), first.text.as_str(), 2)
    );
    let new_text = MessageEncoding::Base64.encode(b"rewritten");
    let receipt = queues
        .update_message(
            &queue,
            &again[0].id,
            &again[0].pop_receipt,
            Duration::ZERO,
            Some(&new_text),
        )
        .await
        .unwrap();
    let rewritten = queues
        .get_messages(&queue, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(rewritten[0].text, new_text);
    assert_eq!(rewritten[0].dequeue_count, 3);
    // The old pop receipt no longer works.
    let err = queues
        .delete_message(&queue, &again[0].id, &receipt)
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.status, err.code.as_deref()),
        (
            StorageErrorKind::Rejected,
            Some(400),
            Some("PopReceiptMismatch")
        )
    );

    for m in received.iter().skip(1).chain(rewritten.iter()) {
        queues
            .delete_message(&queue, &m.id, &m.pop_receipt)
            .await
            .unwrap();
    }
    assert_eq!(
        queues.approximate_count(&queue).await.unwrap(),
        1,
        "only the delayed message is left"
    );

    let c = counters.snapshot();
    assert_eq!((c.queue_put, c.queue_update, c.queue_delete), (4, 2, 4));
    assert!(queues.delete_queue(&queue).await.unwrap());
    assert!(!queues.delete_queue(&queue).await.unwrap());
}

#[tokio::test]
async fn queue_limits_and_missing_queues() {
    let (queues, counters) = queue_store();
    let queue = unique_name("limits");
    queues.create_queue(&queue).await.unwrap();
    let before = counters.snapshot();
    let err = queues
        .put_message(&queue, &"a".repeat(MAX_MESSAGE_TEXT + 1), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::InvalidInput);
    assert!(err.message.contains("64 KiB"), "{err}");
    for max in [0, 33] {
        assert_eq!(
            queues
                .get_messages(&queue, max, Duration::from_secs(1))
                .await
                .unwrap_err()
                .kind,
            StorageErrorKind::InvalidInput
        );
    }
    assert_eq!(
        counters.snapshot().since(&before),
        RequestCounts::default(),
        "nothing was sent"
    );
    // Exactly 64 KiB of base64 text is accepted.
    queues
        .put_message(&queue, &"A".repeat(MAX_MESSAGE_TEXT), Duration::ZERO)
        .await
        .unwrap();
    let got = queues
        .get_messages(&queue, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got[0].text.len(), MAX_MESSAGE_TEXT);

    let missing = unique_name("absent");
    let err = queues
        .put_message(&missing, "eA==", Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.code.as_deref()),
        (StorageErrorKind::NotFound, Some("QueueNotFound"))
    );
    assert!(queues.delete_queue(&queue).await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Request counting and retries

#[tokio::test]
async fn every_request_is_counted_by_kind() {
    let counters = Arc::new(RequestCounters::new());
    let account = account();
    let tables = account.table_store(counters.clone());
    let queues = account.queue_store(counters.clone());
    let (table, queue) = (unique_name("count"), unique_name("count"));

    tables.create_table(&table).await.unwrap();
    tables
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Upsert(entity("p", "r", json!({})))],
        )
        .await
        .unwrap();
    tables.get_entity(&table, "p", "r").await.unwrap();
    tables.get_entity(&table, "p", "missing").await.unwrap();
    tables.query_page(&table, &Query::default()).await.unwrap();
    queues.create_queue(&queue).await.unwrap();
    queues
        .put_message(&queue, "eA==", Duration::ZERO)
        .await
        .unwrap();
    let m = queues
        .get_messages(&queue, 1, Duration::from_secs(5))
        .await
        .unwrap()
        .remove(0);
    let receipt = queues
        .update_message(&queue, &m.id, &m.pop_receipt, Duration::from_secs(5), None)
        .await
        .unwrap();
    queues
        .delete_message(&queue, &m.id, &receipt)
        .await
        .unwrap();
    queues.approximate_count(&queue).await.unwrap();
    queues.delete_queue(&queue).await.unwrap();
    tables.delete_table(&table).await.unwrap();

    assert_eq!(
        counters.snapshot(),
        RequestCounts {
            query: 1,
            batch: 1,
            point_read: 2,
            table_admin: 2,
            queue_put: 1,
            queue_get: 1,
            queue_delete: 1,
            queue_update: 1,
            queue_admin: 3,
        }
    );
}

#[tokio::test]
async fn client_errors_are_not_retried_and_keep_the_service_code() {
    let (store, counters) = table_store();
    // The default policy allows 8 attempts; a 404 must use exactly one.
    assert_eq!(account().retry_policy().max_attempts, 8);
    let err = store
        .query_page(&unique_name("absent"), &Query::default())
        .await
        .unwrap_err();
    assert_eq!(
        (err.kind, err.status, err.code.as_deref()),
        (StorageErrorKind::NotFound, Some(404), Some("TableNotFound"))
    );
    let err = store
        .query_page("bad-name!", &Query::default())
        .await
        .unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert_eq!(counters.snapshot().query, 2, "one request each");
    let (queues, counters) = queue_store();
    let err = queues
        .delete_message(&unique_name("absent"), "id", "receipt")
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::NotFound);
    assert_eq!(counters.snapshot().queue_delete, 1);
}

#[tokio::test]
async fn connection_failures_are_transient_retried_and_every_attempt_counted() {
    // A port nothing listens on: every attempt is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let account = StorageAccount::parse(&format!(
        "AccountName=devstoreaccount1;AccountKey={};TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1",
        tablescan::storage::connection::DEVELOPMENT_ACCOUNT_KEY
    ))
    .unwrap()
    .with_retry_policy(RetryPolicy { max_attempts: 3, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(20) });
    let counters = Arc::new(RequestCounters::new());
    let err = account
        .table_store(counters.clone())
        .get_entity("t", "p", "r")
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::Transient, "{err}");
    assert!(err.message.contains("after 3 attempts"), "{err}");
    let err = account
        .queue_store(counters.clone())
        .put_message("q", "eA==", Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.is_transient());
    let c = counters.snapshot();
    assert_eq!((c.point_read, c.queue_put), (3, 3));
}

// ---------------------------------------------------------------------------------------------
// Azurite itself

#[tokio::test]
async fn a_private_azurite_stops_when_dropped() {
    let azurite = Azurite::start().await.unwrap();
    let port = azurite.table_port();
    assert!(azurite.is_running());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let store = azurite
        .account()
        .table_store(Arc::new(RequestCounters::new()));
    assert!(
        store.create_table("private").await.unwrap(),
        "a fresh instance has no tables"
    );
    drop(azurite);
    wait_until_closed(port, "Azurite still listens after its drop");
}

/// Waits until nothing listens on `port`. Only a hang bound (60 s): the stop usually takes under
/// a second, a loaded machine longer.
fn wait_until_closed(port: u16, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: port {port} still open after 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// The scan engine on Azurite with adversarial keys

fn adversarial_rows() -> Vec<Entity> {
    let partition_keys = [
        "",
        "a",
        "a'",
        "a''b",
        "'",
        "ab",
        "a\u{FFFF}",
        "a\u{FFFF}\u{FFFF}",
        "a\u{FFFF}b",
        "\u{FFFF}",
        "\u{FFFF}\u{FFFF}",
        "\u{1F600}",
        "a\u{1F600}",
        "\u{10000}",
        "\u{E000}",
        "a\u{E000}",
        "\u{D7FF}",
        "é",
        "日本",
        "a b",
        "a+b",
        "a%b",
        "~",
    ];
    let row_keys = ["", "'", "\u{FFFF}", "\u{1F600}", "x"];
    partition_keys
        .iter()
        .enumerate()
        .flat_map(|(i, pk)| {
            row_keys
                .iter()
                .take(1 + i % row_keys.len())
                .map(move |rk| entity(pk, rk, json!({"N": i})))
        })
        .collect()
}

#[tokio::test]
async fn azurite_orders_keys_by_utf16_code_units() {
    let (store, _) = table_store();
    let table = new_table(&store, "order").await;
    let rows = adversarial_rows();
    load(&store, &table, &rows).await;
    let read = keys(&read_all(&store, &table, 7).await);
    let expected = sorted_keys(keys(&rows));
    assert_eq!(
        read, expected,
        "Azurite's order is (PK, RK) in UTF-16 code-unit order"
    );
    // And it differs from Rust's str order, which would put U+FFFF before supplementary characters.
    let mut str_order = expected.clone();
    str_order.sort();
    assert_ne!(read, str_order);

    // Range filters compare by UTF-16 code units too, including U+FFFF and surrogate pairs.
    for (op, bound) in [
        (CompareOp::Gt, "a\u{FFFF}"),
        (CompareOp::Ge, "\u{1F600}"),
        (CompareOp::Lt, "\u{E000}"),
        (CompareOp::Gt, "a"),
    ] {
        let filter = Filter::pk(op, bound);
        let page = store
            .query_page(
                &table,
                &Query {
                    filter: Some(filter.clone()),
                    ..Query::default()
                },
            )
            .await
            .unwrap();
        let want: Vec<_> = expected
            .iter()
            .filter(|(pk, rk)| filter.matches(pk, rk))
            .cloned()
            .collect();
        assert_eq!(keys(&page.entities), want, "{filter}");
    }
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn scan_engine_is_exact_on_azurite_with_adversarial_keys() {
    let (store, counters) = table_store();
    let table = new_table(&store, "scan").await;
    let rows = adversarial_rows();
    load(&store, &table, &rows).await;
    let all = sorted_keys(keys(&rows));

    let cases: Vec<(ScanParameters, Strategy)> = [
        ("", None, None, 1, true),
        ("", None, None, 3, false),
        ("a", None, None, 2, true),
        ("a\u{FFFF}", None, None, 1, true),
        ("\u{FFFF}", None, None, 2, false),
        ("'", None, None, 1, true),
        ("", Some("a"), Some("\u{FFFF}"), 2, true),
        ("a", Some("a'"), Some("a\u{FFFF}b"), 1, false),
    ]
    .into_iter()
    .flat_map(|(prefix, lower, upper, take, expand)| {
        let params = ScanParameters {
            prefix: prefix.to_string(),
            lower: lower.map(str::to_string),
            upper: upper.map(str::to_string),
            take,
            expand_partition_keys: expand,
            ..ScanParameters::default()
        };
        [
            (params.clone(), Strategy::Prefix),
            (params, Strategy::Serial),
        ]
    })
    .collect();

    for (params, strategy) in cases {
        let before = counters.snapshot();
        let mut got = Vec::new();
        let queries = list(&store, &table, &params, strategy, |rows| {
            got.extend(keys(&rows));
            Ok(())
        })
        .await
        .unwrap_or_else(|e| panic!("{strategy:?} {params:?}: {e}"));
        let expected: Vec<_> = all
            .iter()
            .filter(|(pk, _)| params.contains_partition_key(pk))
            .cloned()
            .collect();
        assert_eq!(got, expected, "{strategy:?} {params:?}");
        assert_eq!(counters.snapshot().since(&before).query, queries as u64);
    }
    store.delete_table(&table).await.unwrap();
}

#[tokio::test]
async fn empty_partition_key_rows_page_with_an_empty_next_partition_key() {
    let (store, _) = table_store();
    let table = new_table(&store, "emptypk").await;
    let rows: Vec<_> = (0..5)
        .map(|i| entity("", &format!("r{i}"), json!({})))
        .collect();
    load(&store, &table, &rows).await;
    let page = store
        .query_page(
            &table,
            &Query {
                top: Some(2),
                ..Query::default()
            },
        )
        .await
        .unwrap();
    let token = page.continuation.expect("more rows");
    assert_eq!(
        token.next_partition_key, "",
        "base64 of the empty key is empty, and the header is still sent"
    );
    assert_eq!(keys(&read_all(&store, &table, 2).await), keys(&rows));
    store.delete_table(&table).await.unwrap();
}

/// Azurite quirk (not Azure's behaviour): inside an entity group transaction Azurite takes the
/// PartitionKey of PUT/MERGE/DELETE operations from the URL with a greedy pattern up to the
/// *last* `',`, so a RowKey containing `',` puts the row under a garbled PartitionKey. Insert
/// (POST, keys from the body) and point reads are right. This pins the behaviour so a fixed
/// Azurite is noticed; test data for Azurite must avoid `',` in RowKeys written by upsert.
#[tokio::test]
async fn azurite_batch_misparses_row_keys_containing_quote_comma() {
    let (store, _) = table_store();
    let table = new_table(&store, "quirk").await;
    store
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Upsert(entity("p", "r',s", json!({})))],
        )
        .await
        .unwrap();
    assert_eq!(
        keys(&read_all(&store, &table, 1000).await),
        vec![("p',RowKey='r'".to_string(), "r',s".to_string())]
    );
    assert!(store
        .get_entity(&table, "p", "r',s")
        .await
        .unwrap()
        .is_none());
    // Insert takes the keys from the body and gets them right.
    store
        .submit_batch(
            &table,
            "p",
            &[BatchOperation::Insert(entity("p", "r',s", json!({})))],
        )
        .await
        .unwrap();
    assert!(store
        .get_entity(&table, "p", "r',s")
        .await
        .unwrap()
        .is_some());
    // A `',` in the PartitionKey alone is fine (the greedy match ends at the right place).
    store
        .submit_batch(
            &table,
            "x',y",
            &[BatchOperation::Upsert(entity("x',y", "r", json!({})))],
        )
        .await
        .unwrap();
    assert!(store
        .get_entity(&table, "x',y", "r")
        .await
        .unwrap()
        .is_some());
    store.delete_table(&table).await.unwrap();
}

/// Not a test by itself: the child half of `azurite_dies_with_its_killed_owner`, run in a
/// separate process that starts Azurite, reports its port and waits to be killed.
#[test]
#[ignore = "helper process for azurite_dies_with_its_killed_owner"]
fn orphan_owner_helper() {
    if std::env::var_os("TABLESCAN_ORPHAN_HELPER").is_none() {
        return;
    }
    let azurite = Azurite::start_blocking().unwrap();
    println!("TABLE_PORT={}", azurite.table_port());
    std::thread::sleep(Duration::from_secs(120));
}

/// SIGKILL the process owning an Azurite (so no destructor runs): Azurite must still go away.
#[test]
fn azurite_dies_with_its_killed_owner() {
    use std::io::BufRead;
    // The helper's name as libtest knows it: its path below the test crate's root.
    let helper = match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::orphan_owner_helper"),
        None => "orphan_owner_helper".to_string(),
    };
    let mut owner = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &helper,
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("TABLESCAN_ORPHAN_HELPER", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(owner.stdout.take().unwrap());
    let port: u16 = stdout
        .lines()
        .map_while(Result::ok)
        // libtest prints "test orphan_owner_helper ... " before the helper's own output.
        .find_map(|line| {
            line.split_once("TABLE_PORT=")
                .map(|(_, p)| p.trim().parse().unwrap())
        })
        .expect("the helper reports Azurite's port");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "Azurite is up"
    );
    owner.kill().unwrap();
    owner.wait().unwrap();
    wait_until_closed(port, "Azurite outlived its killed owner");
}

/// Records are sized the way the service counts them: an entity exactly at the 1 MiB limit with
/// strings exactly at 64 KiB of UTF-16 is stored; one byte over is refused before anything is
/// sent, naming the limit.
#[tokio::test]
async fn entities_at_the_service_limits_are_stored_and_over_them_refused() {
    let (store, counters) = table_store();
    let table = new_table(&store, "atlimit").await;
    // 32,768 UTF-16 units = 64 KiB, half of them as surrogate pairs.
    let full = format!("{}{}", "\u{1F600}".repeat(8_192), "y".repeat(16_384));
    assert_eq!(full.encode_utf16().count() * 2, 64 * 1024);
    let mut e = Entity::new("p", "limit");
    for i in 0..15 {
        e.properties.insert(format!("S{i:02}"), json!(full));
    }
    // Pad with one more string so the entity is exactly 1 MiB as the service counts it.
    let pad_name = "Pad";
    let without_pad = e.service_size() + 8 + 2 * pad_name.len() + 4;
    let pad_units = (MAX_ENTITY_BYTES - without_pad) / 2;
    e.properties.insert(pad_name, json!("z".repeat(pad_units)));
    assert_eq!(e.service_size(), MAX_ENTITY_BYTES);
    store
        .submit_batch(&table, "p", &[BatchOperation::Upsert(e.clone())])
        .await
        .expect("an entity exactly at the limits is stored");
    let (read, _) = store
        .get_entity(&table, "p", "limit")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, e);

    let before = counters.snapshot();
    let mut over = e.clone();
    over.row_key = "limi2".into(); // as long as "limit": only the pad grows
    over.properties
        .insert(pad_name, json!("z".repeat(pad_units + 1)));
    let err = store
        .submit_batch(&table, "p", &[BatchOperation::Upsert(over)])
        .await
        .unwrap_err();
    assert_eq!(err.kind, StorageErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("1 MiB"), "{err}");
    assert_eq!(counters.snapshot().since(&before), RequestCounts::default());
    store.delete_table(&table).await.unwrap();
}
