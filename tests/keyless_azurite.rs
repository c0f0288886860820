//! Keyless storage with real parts: Azurite over https (a self-signed certificate made here with
//! `openssl`, trusted through `SSL_CERT_FILE`) in OAuth mode (`--oauth basic`), and a fake App
//! Service identity endpoint in this process issuing tokens Azurite accepts. The connection is
//! the identity-based app settings only: no account key anywhere.
//!
//! One test binary of its own: it sets `SSL_CERT_FILE` for the whole process.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI64, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use serde_json::json;
use tablescan::azurite::{Azurite, AzuriteOptions};
use tablescan::storage::connection::{ConnectionSettings, StorageAccount};
use tablescan::storage::counters::RequestCounters;
use tablescan::storage::{
    BatchOperation, Entity, MessageEncoding, Query as TableQuery, QueueStore, StorageErrorKind,
    TableStore,
};

const IDENTITY_HEADER: &str = "aWRlbnRpdHktaGVhZGVyLXNlY3JldA";

/// Azurite over https with OAuth, its certificate trusted through `SSL_CERT_FILE`.
fn azurite() -> &'static Azurite {
    static AZURITE: OnceLock<(tempfile::TempDir, Azurite)> = OnceLock::new();
    let (_, azurite) = AZURITE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed_certificate(dir.path());
        // Before any client is built: every client reads it when made.
        std::env::set_var("SSL_CERT_FILE", &cert);
        let azurite = Azurite::start_with_blocking(&AzuriteOptions {
            tls: Some((cert, key)),
            oauth: true,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        (dir, azurite)
    });
    azurite
}

/// A self-signed end-entity certificate for 127.0.0.1/localhost (not a CA: rustls refuses a CA
/// certificate as a server's).
fn self_signed_certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let config = dir.join("openssl.cnf");
    std::fs::write(
        &config,
        "[req]\ndistinguished_name=dn\nx509_extensions=ext\nprompt=no\n[dn]\nCN=127.0.0.1\n\
         [ext]\nbasicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-config"])
        .arg(&config)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is installed");
    assert!(
        status.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    (cert, key)
}

/// The fake identity endpoint's state: tokens issued, and the status to answer with.
#[derive(Clone, Default)]
struct Identity {
    issued: Arc<AtomicUsize>,
    status: Arc<AtomicU16>,
    /// Issue tokens for another audience (which Azurite must refuse).
    wrong_audience: Arc<std::sync::atomic::AtomicBool>,
    /// Token lifetime in seconds, answered as `expires_in` (0: an hour, answered as
    /// `expires_on`, as the App Service endpoint does).
    lifetime: Arc<AtomicI64>,
    /// Answer 503 to this many requests (counting down) before issuing tokens again.
    unavailable_for: Arc<AtomicUsize>,
    /// Every request, answered or not.
    requests: Arc<AtomicUsize>,
}

/// A token Azurite's `--oauth basic` accepts: a JWT for the storage audience from an Entra
/// issuer, within its lifetime (the signature is not checked).
fn storage_jwt(audience: &str, lifetime: i64) -> (String, i64) {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let exp = now + lifetime;
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let token = format!(
        "{}.{}.{}",
        b64(json!({"alg": "RS256", "typ": "JWT"})),
        b64(json!({
            "aud": audience,
            "iss": "https://sts.windows.net/ab1f708d-50f6-404c-a006-d71b2ac7a606/",
            "iat": now - 60, "nbf": now - 60, "exp": exp,
            "oid": "11059fcc-5514-4800-b5f8-49808b9cfab6",
        })),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"not-checked")
    );
    (token, exp)
}

async fn token_endpoint(
    State(identity): State<Identity>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    identity.requests.fetch_add(1, Ordering::SeqCst);
    if identity
        .unavailable_for
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"temporarily_unavailable"}"#.into(),
        );
    }
    let status = identity.status.load(Ordering::SeqCst);
    if status != 0 {
        return (
            StatusCode::from_u16(status).unwrap(),
            r#"{"error":"unavailable"}"#.into(),
        );
    }
    if headers.get("x-identity-header").map(|v| v.as_bytes()) != Some(IDENTITY_HEADER.as_bytes())
        || query.get("resource").map(String::as_str) != Some("https://storage.azure.com/")
        || query.get("api-version").map(String::as_str) != Some("2019-08-01")
    {
        return (
            StatusCode::BAD_REQUEST,
            r#"{"error":"invalid_request"}"#.into(),
        );
    }
    identity.issued.fetch_add(1, Ordering::SeqCst);
    let audience = if identity.wrong_audience.load(Ordering::SeqCst) {
        "https://vault.azure.net"
    } else {
        "https://storage.azure.com"
    };
    let lifetime = identity.lifetime.load(Ordering::SeqCst);
    if lifetime > 0 {
        let (token, _) = storage_jwt(audience, lifetime);
        return (
            StatusCode::OK,
            json!({"access_token": token, "expires_in": lifetime.to_string(),
                   "resource": "https://storage.azure.com/", "token_type": "Bearer"})
            .to_string(),
        );
    }
    let (token, exp) = storage_jwt(audience, 3600);
    (
        StatusCode::OK,
        json!({"access_token": token, "expires_on": exp.to_string(),
               "resource": "https://storage.azure.com/", "token_type": "Bearer"})
        .to_string(),
    )
}

/// Starts the fake App Service identity endpoint; returns its URL.
async fn identity_endpoint(identity: Identity) -> String {
    let app = axum::Router::new()
        .route("/msi/token", axum::routing::get(token_endpoint))
        .with_state(identity);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/msi/token")
}

/// The identity-based connection `name` for this Azurite (no key, no connection string).
fn keyless_settings(name: &str, identity_url: &str) -> ConnectionSettings {
    let azurite = azurite();
    let settings: HashMap<String, String> = [
        (format!("{name}__tableServiceUri"), azurite.table_endpoint()),
        (format!("{name}__queueServiceUri"), azurite.queue_endpoint()),
        (format!("{name}__credential"), "managedidentity".into()),
        ("IDENTITY_ENDPOINT".into(), identity_url.to_string()),
        ("IDENTITY_HEADER".into(), IDENTITY_HEADER.into()),
    ]
    .into_iter()
    .collect();
    ConnectionSettings::from_app_settings(name, |k| settings.get(k).cloned()).unwrap()
}

fn entity(pk: &str, rk: &str, n: i64) -> Entity {
    let mut e = Entity::new(pk, rk);
    e.properties = json!({"N": n, "Name": format!("row {rk}")})
        .as_object()
        .cloned()
        .unwrap()
        .into();
    e
}

#[tokio::test]
async fn a_table_and_queue_round_trip_with_bearer_tokens_and_no_key() {
    let identity = Identity::default();
    let url = identity_endpoint(identity.clone()).await;
    let account = StorageAccount::new(keyless_settings("AzureWebJobsStorage", &url));
    assert_eq!(account.auth_kind(), "token");
    let counters = Arc::new(RequestCounters::new());
    let tables = account.table_store(counters.clone());
    let table = format!("keyless{}", std::process::id());

    // Admin (SDK path), batch, query and point read (signed path): all bearer.
    assert!(tables.create_table(&table).await.unwrap());
    let rows: Vec<_> = (0..5).map(|i| entity("p1", &format!("r{i}"), i)).collect();
    let ops: Vec<_> = rows.iter().cloned().map(BatchOperation::Upsert).collect();
    tables.submit_batch(&table, "p1", &ops).await.unwrap();
    tables
        .submit_batch(
            &table,
            "p2",
            &[BatchOperation::Upsert(entity("p2", "only", 9))],
        )
        .await
        .unwrap();
    let page = tables
        .query_page(&table, &TableQuery::default())
        .await
        .unwrap();
    assert_eq!(page.entities.len(), 6);
    assert_eq!(page.entities[0].partition_key, "p1");
    let (read, _etag) = tables
        .get_entity(&table, "p2", "only")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.properties.get_str("Name").as_deref(), Some("row only"));

    // Queues (SDK path) with the same provider.
    let queues = account.queue_store(counters);
    let queue = format!("keyless-{}", std::process::id());
    queues.create_queue(&queue).await.unwrap();
    queues
        .put_message(
            &queue,
            &MessageEncoding::Base64.encode(b"hello"),
            std::time::Duration::ZERO,
        )
        .await
        .unwrap();
    let got = queues
        .get_messages(&queue, 1, std::time::Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert!(tables.delete_table(&table).await.unwrap());

    // One token served every request of both paths.
    assert_eq!(identity.issued.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn without_a_token_nothing_is_sent_and_the_error_names_the_connection() {
    let identity = Identity::default();
    identity.status.store(403, Ordering::SeqCst);
    let url = identity_endpoint(identity.clone()).await;
    let account = StorageAccount::new(keyless_settings("Src", &url));
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    let error = tables
        .query_page("Anything", &TableQuery::default())
        .await
        .unwrap_err();
    assert_eq!(error.kind, StorageErrorKind::Rejected, "{error}");
    let text = error.to_string();
    assert!(text.contains("connection Src (managedidentity)"), "{text}");
    assert!(text.contains("answered 403"), "{text}");
    assert!(!text.contains(IDENTITY_HEADER), "{text}");
    assert_eq!(identity.issued.load(Ordering::SeqCst), 0);
}

/// Azurite really checks the token: one for another audience is refused, and the error carries
/// neither the token nor the identity header.
#[tokio::test]
async fn azurite_refuses_a_token_for_another_audience() {
    let identity = Identity::default();
    identity.wrong_audience.store(true, Ordering::SeqCst);
    let url = identity_endpoint(identity.clone()).await;
    let account = StorageAccount::new(keyless_settings("Dst", &url));
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    let error = tables.create_table("Refused").await.unwrap_err();
    let query_error = tables
        .query_page("Refused", &TableQuery::default())
        .await
        .unwrap_err();
    assert_eq!(identity.issued.load(Ordering::SeqCst), 1);
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

/// A whole copy scan through the local host (`tablescan host`'s `Host`) and the real handler
/// binary, with only identity-based settings for the app's storage: the host's queue listeners,
/// the handler's tables and queues all authorize with bearer tokens from the fake identity
/// endpoint. No account key is in any setting or in the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_scan_through_the_host_with_identity_settings_only() {
    use support::e2e::{rows, seed, TestApp};
    let identity = Identity::default();
    let url = identity_endpoint(identity.clone()).await;
    let azurite = azurite();
    for (key, _) in std::env::vars() {
        assert!(
            !key.starts_with("AzureWebJobsStorage"),
            "{key} is in the environment"
        );
    }
    let table_uri = azurite.table_endpoint();
    let queue_uri = azurite.queue_endpoint();
    let storage = [
        // The staged local.settings.json says `UseDevelopmentStorage=true`: emptied (empty is
        // unset), or start-up refuses the two forms together.
        ("AzureWebJobsStorage", ""),
        ("AzureWebJobsStorage__tableServiceUri", table_uri.as_str()),
        ("AzureWebJobsStorage__queueServiceUri", queue_uri.as_str()),
        ("AzureWebJobsStorage__credential", "managedidentity"),
        ("IDENTITY_ENDPOINT", url.as_str()),
        ("IDENTITY_HEADER", IDENTITY_HEADER),
    ];
    // Seeding and checking use a keyless account too.
    let store = StorageAccount::new(keyless_settings("Seed", &url))
        .table_store(Arc::new(RequestCounters::new()));
    let app = TestApp::start_on(1, &storage, store, &[]).await;
    let source = support::unique_name("KeylessSource");
    let destination = support::unique_name("KeylessDestination");
    let entities: Vec<_> = (0..120)
        .map(|i| entity(&format!("p{}", i % 7), &format!("r{i:03}"), i))
        .collect();
    seed(&app.store, &source, entities.clone()).await;

    let (status, reply, _) = app
        .post_scan(&json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 25}))
        .await;
    assert_eq!(status, 202, "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    let end = app
        .wait_for_end(&id, std::time::Duration::from_secs(120))
        .await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(end["rowsWritten"], 120, "{end}");
    let copied = rows(&app.store, &destination).await;
    assert_eq!(copied.len(), 120);
    assert!(
        identity.issued.load(Ordering::SeqCst) >= 2,
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

/// Tokens that live 2 seconds (`expires_in`): every process's provider refreshes at half the
/// lifetime, so a copy scan through the local host runs across many token expiries — and the
/// tokens Azurite checks carry that short `exp`. The copy is still exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_scan_outlives_many_short_lived_tokens() {
    use support::e2e::{rows, seed, TestApp};
    const LIFETIME: i64 = 2;
    let identity = Identity::default();
    identity.lifetime.store(LIFETIME, Ordering::SeqCst);
    let url = identity_endpoint(identity.clone()).await;
    let azurite = azurite();
    let table_uri = azurite.table_endpoint();
    let queue_uri = azurite.queue_endpoint();
    let storage = [
        ("AzureWebJobsStorage", ""),
        ("AzureWebJobsStorage__tableServiceUri", table_uri.as_str()),
        ("AzureWebJobsStorage__queueServiceUri", queue_uri.as_str()),
        ("AzureWebJobsStorage__credential", "managedidentity"),
        ("IDENTITY_ENDPOINT", url.as_str()),
        ("IDENTITY_HEADER", IDENTITY_HEADER),
    ];
    let store = StorageAccount::new(keyless_settings("Seed", &url))
        .table_store(Arc::new(RequestCounters::new()));
    let app = TestApp::start_on(1, &storage, store, &[]).await;
    let source = support::unique_name("ShortTokenSource");
    let destination = support::unique_name("ShortTokenDestination");
    let mut entities: Vec<_> = (0..600)
        .map(|i| entity(&format!("p{}", i % 11), &format!("r{i:03}"), i))
        .collect();
    seed(&app.store, &source, entities.clone()).await;

    let before = identity.issued.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    let (status, reply, _) = app
        .post_scan(&json!({"driver": "copy", "sourceTable": source, "destinationTable": destination, "takeCount": 5}))
        .await;
    assert_eq!(status, 202, "{reply}");
    let id = reply["id"].as_str().unwrap().to_string();
    let end = app
        .wait_for_end(&id, std::time::Duration::from_secs(180))
        .await;
    let elapsed = started.elapsed();
    let during = identity.issued.load(Ordering::SeqCst) - before;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(end["rowsWritten"], 600, "{end}");
    // Exactly the source's rows, every property, in key order.
    entities.sort_by(|a, b| {
        tablescan::storage::compare_keys(&a.partition_key, &b.partition_key)
            .then(tablescan::storage::compare_keys(&a.row_key, &b.row_key))
    });
    let copied = rows(&app.store, &destination).await;
    assert_eq!(copied.len(), entities.len());
    for (got, want) in copied.iter().zip(&entities) {
        assert_eq!(
            (&got.partition_key, &got.row_key, &got.properties),
            (&want.partition_key, &want.row_key, &want.properties)
        );
    }
    // The scan outlived several token lifetimes, and tokens were fetched again during it.
    eprintln!("scan took {elapsed:?}; {during} tokens issued during it");
    assert!(
        elapsed > std::time::Duration::from_secs(LIFETIME as u64),
        "the scan ended within one token lifetime ({elapsed:?}): not a test of expiry"
    );
    assert!(during >= 3, "{during} tokens issued during {elapsed:?}");
    app.shutdown().await;
}

/// The identity endpoint is down (503) for its first requests, then recovers: the provider's
/// retries carry the store's first request through, end to end.
#[tokio::test]
async fn an_identity_endpoint_down_for_a_while_is_waited_for() {
    let identity = Identity::default();
    identity.unavailable_for.store(3, Ordering::SeqCst);
    let url = identity_endpoint(identity.clone()).await;
    let account = StorageAccount::new(keyless_settings("Src", &url));
    let tables = account.table_store(Arc::new(RequestCounters::new()));
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
    assert_eq!(
        identity.requests.load(Ordering::SeqCst),
        4,
        "3 refused, 1 issued"
    );
    assert_eq!(identity.issued.load(Ordering::SeqCst), 1);
    assert!(tables.delete_table(&table).await.unwrap());
}

/// An identity endpoint that stays down (503), or refuses connections: the store's request fails
/// as transient (a later delivery may succeed) with an error naming the connection, and the
/// storage request is never sent.
#[tokio::test]
async fn an_identity_endpoint_that_stays_down_fails_naming_the_connection() {
    let identity = Identity::default();
    identity.unavailable_for.store(usize::MAX, Ordering::SeqCst);
    let url = identity_endpoint(identity.clone()).await;
    // No storage retries on top of the provider's own, to keep the test short.
    let down = StorageAccount::new(keyless_settings("Dst", &url))
        .with_retry_policy(tablescan::storage::retry::RetryPolicy::none());
    // Nothing listens on port 9 (discard): connections are refused.
    let refused = StorageAccount::new(keyless_settings("Src", "http://127.0.0.1:9/msi/token"))
        .with_retry_policy(tablescan::storage::retry::RetryPolicy::none());
    for (account, connection, cause) in [
        (&down, "Dst", "answered 503"),
        (&refused, "Src", "127.0.0.1:9"),
    ] {
        let tables = account.table_store(Arc::new(RequestCounters::new()));
        let started = std::time::Instant::now();
        let error = tables
            .query_page("Anything", &TableQuery::default())
            .await
            .unwrap_err();
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
    assert_eq!(identity.issued.load(Ordering::SeqCst), 0);
    assert_eq!(
        identity.requests.load(Ordering::SeqCst),
        12,
        "6 attempts for each of Dst's two requests"
    );
}
