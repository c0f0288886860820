//! Keyless storage with real parts: Azurite over https (a self-signed certificate made with
//! `openssl`, trusted through `SSL_CERT_FILE`) in OAuth mode (`--oauth basic`), and a fake App
//! Service identity endpoint in this process issuing tokens Azurite accepts
//! (`support::identity`). The connection is the identity-based app settings only: no account key
//! anywhere. The other credentials are in tests/scans/keyless/credentials.rs.
//!
//! One test binary of its own: it sets `SSL_CERT_FILE` (and the fakes' hosts) for the whole
//! process.

use crate::support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use support::identity::endpoints::{fakes, Identity};
use support::identity::{
    app_service_settings, app_service_storage, azurite_answer, borrowed, entity,
    identity_app_settings, round_trip, wait_until, IDENTITY_HEADER,
};
use tablescan::storage::azure_table::AzureTableStore;
use tablescan::storage::connection::StorageAccount;
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::QueueStore;
use tablescan::storage::{BatchOperation, Query as TableQuery, StorageErrorKind, TableStore};

#[tokio::test]
async fn a_table_and_queue_round_trip_with_bearer_tokens_and_no_key() {
    let identity = Identity::default();
    let url = fakes().app_service(&identity);
    let account = StorageAccount::new(app_service_settings("AzureWebJobsStorage", &url));
    assert_eq!(account.auth_kind(), "token");
    round_trip(&account).await;
    // One token served every request of both paths.
    assert_eq!(identity.issued(), 1);
}

#[tokio::test]
async fn without_a_token_nothing_is_sent_and_the_error_names_the_connection() {
    let identity = Identity::default();
    identity.status.store(403, Ordering::SeqCst);
    let tables = app_service_tables(&identity, "Src");
    let error = first_query_error(&tables).await;
    assert_eq!(error.kind, StorageErrorKind::Rejected, "{error}");
    let text = error.to_string();
    assert!(text.contains("connection Src (managedidentity)"), "{text}");
    assert!(text.contains("answered 403"), "{text}");
    assert!(!text.contains(IDENTITY_HEADER), "{text}");
    assert_eq!(identity.issued(), 0);
}

/// Azurite really checks the token: one for another audience is refused, and the error carries
/// neither the token nor the identity header.
#[tokio::test]
async fn azurite_refuses_a_token_for_another_audience() {
    let identity = Identity::default();
    identity.wrong_audience.store(true, Ordering::SeqCst);
    refused_by_azurite(&identity, "Dst", "Refused").await;
}

/// Azurite really checks a token's lifetime: one whose `exp` has passed is refused, though the
/// answer said it lives an hour (so the provider hands it out). The short-lived tokens test
/// relies on it.
#[tokio::test]
async fn azurite_refuses_an_expired_token() {
    let identity = Identity::default();
    identity.expired.store(true, Ordering::SeqCst);
    refused_by_azurite(&identity, "Src", "Expired").await;
    let (status, body) = azurite_answer(&identity.tokens()[0]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("expired"), "{body}");
}

/// A table creation and a query on connection `connection` through an App Service endpoint
/// issuing `identity`'s tokens: both refused by Azurite (403 `AuthenticationFailed`), with one
/// token, and neither error carrying the token or the identity header.
async fn refused_by_azurite(identity: &Identity, connection: &str, table: &str) {
    let url = fakes().app_service(identity);
    let account = StorageAccount::new(app_service_settings(connection, &url));
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    let error = tables.create_table(table).await.unwrap_err();
    let query_error = tables
        .query_page(table, &TableQuery::default())
        .await
        .unwrap_err();
    assert_eq!(identity.issued(), 1);
    for e in [&error, &query_error] {
        assert_eq!(e.status, Some(403), "{e}");
        assert_eq!(e.code.as_deref(), Some("AuthenticationFailed"), "{e}");
        let text = format!("{e} {e:?}");
        assert!(
            !text.contains(IDENTITY_HEADER) && !text.contains("eyJ"),
            "{text}"
        );
    }
}

/// The app under the local host, its storage (Blob Storage too when `blobs`) and the store that
/// seeds and checks tables reached through the App Service identity endpoint `url`: no key.
async fn app_through(url: &str, blobs: bool) -> support::e2e::TestApp {
    let storage = app_service_storage(url, blobs);
    let store = StorageAccount::new(app_service_settings("Seed", url))
        .table_store(Arc::new(RequestCounters::new()));
    support::e2e::TestApp::start_on(1, &borrowed(&storage), store, &[]).await
}

/// A whole copy scan through the local host (`tablescan host`'s `Host`) and the real handler
/// binary, with only identity-based settings for the app's storage: the host's queue listeners,
/// the handler's tables and queues all authorize with bearer tokens from the fake identity
/// endpoint. No account key is in any setting or in the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_scan_through_the_host_with_identity_settings_only() {
    use support::e2e::{rows, seed};
    let identity = Identity::default();
    let url = fakes().app_service(&identity);
    for (key, _) in std::env::vars() {
        assert!(
            !key.starts_with("AzureWebJobsStorage"),
            "{key} is in the environment"
        );
    }
    let app = app_through(&url, true).await;
    let source = support::unique_name("KeylessSource");
    let destination = support::unique_name("KeylessDestination");
    let entities: Vec<_> = (0..120)
        .map(|i| entity(&format!("p{}", i % 7), &format!("r{i:03}"), i))
        .collect();
    seed(&app.store, &source, entities.clone()).await;

    let copy = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 25});
    let (id, end) = app
        .scan_until_end(&copy, std::time::Duration::from_secs(120))
        .await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(end["rowsWritten"], 120, "{end}");
    let copied = rows(&app.store, &destination).await;
    assert_eq!(copied.len(), 120);

    // A backup to Blob Storage and its restore, with the same bearer tokens.
    let container = support::unique_name("keyless");
    let export = json!({"driver": "export", "sourceTable": source, "takeCount": 40, "destinationContainer": container});
    completes_writing(&app, &export, 120).await;
    let restored = support::unique_name("KeylessRestored");
    let import =
        json!({"driver": "import", "sourceContainer": container, "destinationTable": restored});
    completes_writing(&app, &import, 120).await;
    assert_eq!(
        rows(&app.store, &restored).await,
        rows(&app.store, &source).await
    );
    assert!(
        identity.issued() >= 2,
        "the host, the handler and the test each ask"
    );
    // The scan's record (as the API returns it) carries connection names, never credentials.
    let (_, record) = app.get(&format!("/api/scans/{id}")).await;
    let record = record.to_string();
    assert!(
        !record.contains(IDENTITY_HEADER) && !record.contains("eyJ"),
        "{record}"
    );
    let logs = app.host().log_lines().join("\n");
    assert!(
        !logs.contains(IDENTITY_HEADER) && !logs.contains("eyJ"),
        "{logs}"
    );
    app.shutdown().await;
}

/// Starts a scan and waits for it to complete having written `rows` rows.
async fn completes_writing(app: &support::e2e::TestApp, body: &serde_json::Value, rows: i64) {
    let (status, reply, _) = app.post_scan(body).await;
    assert_eq!(status, 202, "{reply}");
    let id = reply["id"].as_str().unwrap();
    let end = app
        .wait_for_end(id, std::time::Duration::from_secs(120))
        .await;
    assert_eq!(
        (&end["state"], &end["rowsWritten"]),
        (&json!("completed"), &json!(rows)),
        "{end}"
    );
}

/// Tokens whose answers say they live 1 second (`expires_in`): every process's provider
/// refreshes them at half that, so copy scans through the local host run across token expiries,
/// and every copy is exact. The handler's data connection `Data` is a user-assigned identity of
/// its own (only the handler asks for it): copies run until the handler has been issued three
/// `Data` tokens mid-copy and the app storage (the host and the handler) two. Then, once Azurite
/// refuses every token issued so far (their `exp` passed), one more copy still completes: no
/// process kept an old token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_scan_outlives_many_short_lived_tokens() {
    use support::e2e::seed;
    const DATA_CLIENT: &str = "0c5a3a1e-4444-4000-8000-00000000da7a";
    let (app_identity, data) = (Identity::default(), Identity::default());
    for identity in [&app_identity, &data] {
        identity.lifetime.store(1, Ordering::SeqCst);
    }
    let url = fakes().app_service_users(&app_identity, &[(DATA_CLIENT, &data)]);
    let storage = app_service_storage(&url, false);
    let mut settings = identity_app_settings(
        "Data",
        false,
        &[("credential", "managedidentity"), ("clientId", DATA_CLIENT)],
    );
    settings.push(("TABLESCAN_CONNECTIONS".into(), "Data".into()));
    let store = StorageAccount::new(app_service_settings("Seed", &url))
        .table_store(Arc::new(RequestCounters::new()));
    let app =
        support::e2e::TestApp::start_on(1, &borrowed(&storage), store, &borrowed(&settings)).await;
    let source = support::unique_name("ShortTokenSource");
    let mut entities: Vec<_> = (0..ROWS)
        .map(|i| entity(&format!("p{}", i % 11), &format!("r{i:04}"), i))
        .collect();
    seed(&app.store, &source, entities.clone()).await;
    entities.sort_by(|a, b| {
        tablescan::storage::compare_keys(&a.partition_key, &b.partition_key)
            .then(tablescan::storage::compare_keys(&a.row_key, &b.row_key))
    });

    // Copies (each exact) until the refreshes were seen, whatever the machine's speed.
    let (mut copies, mut data_during, mut app_during) = (0, 0, 0);
    let started = std::time::Instant::now();
    while data_during < 3 || app_during < 2 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(300),
            "gave up waiting for 3 Data tokens and 2 app storage tokens issued during copies: \
             {copies} copies saw {data_during} and {app_during}"
        );
        let before = (data.issued(), app_identity.issued());
        copies_exactly(&app, &source, &entities).await;
        data_during += data.issued() - before.0;
        app_during += app_identity.issued() - before.1;
        copies += 1;
    }
    eprintln!("{copies} copies: {data_during} Data tokens, {app_during} app storage tokens");

    // Every token issued so far expired (for Azurite: the JWT's own `exp`), then one more copy.
    let last = [&data, &app_identity].map(|i| i.tokens().last().cloned().unwrap());
    for token in &last {
        wait_until("Azurite to refuse the last token issued", LONG, || async {
            match azurite_answer(token).await {
                (403, body) if body.contains("expired") => Ok(()),
                (status, body) => Err(format!("{status} {body}")),
            }
        })
        .await;
    }
    let before = data.issued();
    copies_exactly(&app, &source, &entities).await;
    assert!(
        data.issued() > before,
        "the handler fetched a new Data token"
    );
    app.shutdown().await;
}

/// Rows in the short-lived tokens test's source: a copy of them takes a few token lifetimes.
const ROWS: i64 = 600;
/// A hang bound for a wait of a few seconds.
const LONG: std::time::Duration = std::time::Duration::from_secs(60);

/// A copy scan of `source` (holding `entities`, in key order) from and to connection `Data`, into
/// a new table: it completes, and the new table holds exactly the source's rows.
async fn copies_exactly(
    app: &support::e2e::TestApp,
    source: &str,
    entities: &[tablescan::storage::Entity],
) {
    let destination = support::unique_name("ShortTokenDestination");
    let copy = json!({"driver": "copy", "sourceTable": source, "destinationTable": destination,
                      "sourceConnection": "Data", "destinationConnection": "Data", "takeCount": 5});
    let (_, end) = app
        .scan_until_end(&copy, std::time::Duration::from_secs(120))
        .await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(end["rowsWritten"], entities.len(), "{end}");
    let copied = support::e2e::rows(&app.store, &destination).await;
    assert_eq!(copied.len(), entities.len());
    for (got, want) in copied.iter().zip(entities) {
        assert_eq!(
            (&got.partition_key, &got.row_key, &got.properties),
            (&want.partition_key, &want.row_key, &want.properties)
        );
    }
}

/// The identity endpoint is down (503) for its first requests, then recovers: the provider's
/// retries carry the store's first request through, end to end.
#[tokio::test]
async fn an_identity_endpoint_down_for_a_while_is_waited_for() {
    let identity = Identity::default();
    identity.unavailable_for.store(3, Ordering::SeqCst);
    let tables = app_service_tables(&identity, "Src");
    let table = format!("recovers{}", std::process::id());
    assert!(tables.create_table(&table).await.unwrap());
    tables
        .submit_batch(&table, "p", &[BatchOperation::Upsert(entity("p", "r", 1))])
        .await
        .unwrap();
    let page = tables
        .query_page(&table, &TableQuery::default())
        .await
        .unwrap();
    assert_eq!(page.entities.len(), 1);
    assert_eq!(identity.requests(), 4, "3 refused, 1 issued");
    assert_eq!(identity.issued(), 1);
    assert!(tables.delete_table(&table).await.unwrap());
}

/// An identity endpoint that stays down (503), or refuses connections: the store's request fails
/// as transient (a later delivery may succeed) with an error naming the connection, and the
/// storage request is never sent.
#[tokio::test]
async fn an_identity_endpoint_that_stays_down_fails_naming_the_connection() {
    let identity = Identity::default();
    identity.unavailable_for.store(usize::MAX, Ordering::SeqCst);
    let url = fakes().app_service(&identity);
    // No storage retries on top of the provider's own, to keep the test short.
    let down = StorageAccount::new(app_service_settings("Dst", &url))
        .with_retry_policy(tablescan::storage::retry_policy::RetryPolicy::none());
    // Nothing listens on port 9 (discard): connections are refused.
    let refused = StorageAccount::new(app_service_settings("Src", "http://127.0.0.1:9/msi/token"))
        .with_retry_policy(tablescan::storage::retry_policy::RetryPolicy::none());
    for (account, connection, cause) in [
        (&down, "Dst", "answered 503"),
        (&refused, "Src", "127.0.0.1:9"),
    ] {
        let tables = account.table_store(Arc::new(RequestCounters::new()));
        let started = std::time::Instant::now();
        let error = first_query_error(&tables).await;
        assert_eq!(error.kind, StorageErrorKind::Transient, "{error}");
        let text = error.to_string();
        assert!(
            text.contains(&format!(
                "no storage token for connection {connection} (managedidentity)"
            )),
            "{text}"
        );
        assert!(text.contains(cause), "{text}");
        assert!(!text.contains(IDENTITY_HEADER), "{text}");
        // The SDK path (queues) says the same.
        let queues = account.queue_store(Arc::new(RequestCounters::new()));
        let error = queues.create_queue("anything").await.unwrap_err();
        assert_eq!(error.kind, StorageErrorKind::Transient, "{error}");
        assert!(
            error
                .to_string()
                .contains(&format!("connection {connection}")),
            "{error}"
        );
        eprintln!(
            "{connection}: gave up after {:?}: {text}",
            started.elapsed()
        );
    }
    assert_eq!(identity.issued(), 0);
    assert_eq!(
        identity.requests(),
        12,
        "6 attempts for each of Dst's two requests"
    );
}

/// The table store of connection `name` through a fake App Service identity endpoint serving
/// `identity`.
fn app_service_tables(identity: &Identity, name: &str) -> AzureTableStore {
    let url = fakes().app_service(identity);
    StorageAccount::new(app_service_settings(name, &url))
        .table_store(Arc::new(RequestCounters::new()))
}

/// The error of a first query through `tables` (that must fail).
async fn first_query_error(tables: &AzureTableStore) -> tablescan::storage::StorageError {
    tables
        .query_page("Anything", &TableQuery::default())
        .await
        .unwrap_err()
}
