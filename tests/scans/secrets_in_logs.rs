//! No credential in any log line, run the way an operator would: `RUST_LOG=trace` for everything
//! (not only tablescan's targets), a copy scan through the local host on Azurite (over https, in
//! OAuth mode) for each kind of credential the app's storage can have: an account key, a SAS, and
//! bearer tokens from a service principal's client secret, workload identity's federated token
//! and the App Service identity endpoint (with its identity header). Checked over both outputs:
//! - the handler's stdout and stderr, as the host forwards them (what reaches Application
//!   Insights: the local host keeps each line as the handler wrote it);
//! - the local host's own log (its queue polling uses the same storage clients), written by the
//!   subscriber `tablescan host` installs, captured from this process.
//!
//! A process of its own: it sets `RUST_LOG=trace` for the whole process and installs the global
//! log subscriber, which would slow every other test of the binary and capture their logs. So the
//! cases are `#[ignore]`d and gated by `TABLESCAN_SECRETS_IN_LOGS`; the one test that `cargo test`
//! runs, [`in_a_process_of_its_own`], runs them in a child process of this test binary.

use crate::support;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tracing_subscriber::util::SubscriberInitExt;

use serde_json::json;
use support::e2e::{seed, TestApp};
use support::identity::endpoints::{fakes, Identity};
use support::identity::{entity, oauth_azurite, token_file, IDENTITY_HEADER};
use tablescan::storage::connection::{StorageAccount, DEVELOPMENT_ACCOUNT_KEY};
use tablescan::storage::request_counts::RequestCounters;

const CLIENT_ID: &str = "0c5a3a1e-1111-4000-8000-00000000c11e";
/// A client secret as Entra ID makes them.
const SECRET: &str = "Q8v7Q~client.secret-0123456789abcdefGHIJ";
/// A federated token (what the platform writes into the token file).
const FEDERATED: &str = "eyJhbGciOiJSUzI1NiJ9.federated-token-of-logs.c2lnbmF0dXJl";

/// The variable that tells a child process of the test binary to run the cases.
const ISOLATED: &str = "TABLESCAN_SECRETS_IN_LOGS";

/// Runs every case of this file in a child process of this test binary (see the module's doc),
/// its output forwarded; fails if any case failed.
#[test]
fn in_a_process_of_its_own() {
    // The cases' names as libtest knows them: their path below the test crate's root.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([&format!("{module}::case_"), "--ignored", "--nocapture"])
        .env(ISOLATED, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // A summary line per case; the logs themselves are large.
    for line in text.lines().filter(|l| l.starts_with("test ")) {
        eprintln!("secrets_in_logs (child): {line}");
    }
    assert!(output.status.success(), "a case failed:\n{text}");
    assert!(
        text.contains("test result: ok. 5 passed"),
        "not every case ran:\n{text}"
    );
}

/// Whether this process is the child that runs the cases (else a case returns at once: run with
/// `--ignored` beside other tests, it would set `RUST_LOG` for them all).
fn isolated() -> bool {
    let yes = std::env::var_os(ISOLATED).is_some();
    if !yes {
        eprintln!("runs only in its own process: see in_a_process_of_its_own");
    }
    yes
}

/// Everything the host's subscriber in this process wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// The local host's log in this process, at `RUST_LOG=trace`, through the subscriber
/// `tablescan host` installs (set up once, before any test's host starts).
fn host_output() -> &'static Captured {
    static OUTPUT: OnceLock<Captured> = OnceLock::new();
    OUTPUT.get_or_init(|| {
        std::env::set_var("RUST_LOG", "trace");
        let captured = Captured::default();
        let _ = tablescan::redact::log_subscriber(captured.clone(), "info").try_init();
        captured
    })
}

/// Starts the app whose storage is `storage`, copies a small table, and returns the handler's
/// forwarded output and the host's own log (everything logged in this process so far).
async fn copy_scan_logs(storage: &[(&str, &str)]) -> (String, String) {
    let output = host_output();
    let seeder = key_account().table_store(Arc::new(RequestCounters::new()));
    let app = TestApp::start_on(1, storage, seeder, &[("RUST_LOG", "trace")]).await;
    let source = support::unique_name("LogSource");
    let rows: Vec<_> = (0..12)
        .map(|i| entity(&format!("p{}", i % 3), &format!("r{i:02}"), i))
        .collect();
    seed(&app.store, &source, rows).await;
    let destination = support::unique_name("LogDestination");
    let (_, end) = app
        .scan_until_end(
            &json!({"driver": "copy", "sourceTable": source, "destinationTable": destination}),
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(end["state"], "completed", "{end}");
    assert_eq!(end["rowsWritten"], 12, "{end}");
    let handler = app.host().log_lines().join("\n");
    app.shutdown().await;
    let host = String::from_utf8_lossy(&output.0.lock().unwrap()).into_owned();
    // `trace` reached both processes: storage requests were logged, not filtered out.
    assert!(
        handler.contains("TRACE") && handler.contains("tablescan"),
        "{handler}"
    );
    assert!(host.contains("TRACE"), "the host logged nothing at trace");
    (handler, host)
}

/// The account key account on the OAuth Azurite (to seed tables).
fn key_account() -> StorageAccount {
    StorageAccount::parse(&oauth_azurite().connection_string()).unwrap()
}

/// Panics, quoting the line, if any output holds any secret, or a SharedKey signature.
fn assert_no_secret(outputs: &[&str], secrets: &[&str]) {
    for output in outputs {
        for secret in secrets {
            assert!(secret.len() >= 8, "not a real secret: {secret:?}");
            if let Some(line) = output.lines().find(|l| l.contains(secret)) {
                panic!("a secret leaked ({secret}) in: {line}");
            }
        }
        for scheme in [
            "SharedKey devstoreaccount1:",
            "SharedKeyLite devstoreaccount1:",
        ] {
            for (at, _) in output.match_indices(scheme) {
                assert!(
                    output[at + scheme.len()..].starts_with("***"),
                    "a SharedKey signature leaked in: {}",
                    output[at..].lines().next().unwrap_or("")
                );
            }
        }
    }
}

/// The token texts to look for: each whole, and each of its dot-separated pieces but the
/// header (which every token of the fake shares and which holds nothing secret).
fn token_pieces(tokens: &[String]) -> Vec<String> {
    let mut pieces = Vec::new();
    for token in tokens {
        pieces.push(token.clone());
        pieces.extend(token.split('.').skip(1).map(str::to_string));
    }
    pieces
}

/// The identity-based app storage on the OAuth Azurite with `pairs` added.
fn identity_storage(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let azurite = oauth_azurite();
    let mut settings = vec![
        // The staged local.settings.json says `UseDevelopmentStorage=true`: emptied.
        ("AzureWebJobsStorage".to_string(), String::new()),
        (
            "AzureWebJobsStorage__tableServiceUri".into(),
            azurite.table_endpoint(),
        ),
        (
            "AzureWebJobsStorage__queueServiceUri".into(),
            azurite.queue_endpoint(),
        ),
        (
            "AzureWebJobsStorage__blobServiceUri".into(),
            azurite.blob_endpoint(),
        ),
    ];
    settings.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    settings
}

/// A copy scan on the keyless app storage `settings` whose tokens `identity` issues: neither
/// output holds any of those tokens (or their pieces) nor any of `secrets`.
async fn scan_logs_no_token(settings: &[(String, String)], identity: &Identity, secrets: &[&str]) {
    let pairs: Vec<(&str, &str)> = settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (handler, host) = copy_scan_logs(&pairs).await;
    assert!(
        identity.issued() >= 2,
        "the host and the handler got tokens"
    );
    let tokens = token_pieces(&identity.tokens());
    let mut all: Vec<&str> = tokens.iter().map(String::as_str).collect();
    all.extend_from_slice(secrets);
    assert_no_secret(&[&handler, &host], &all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by in_a_process_of_its_own"]
async fn case_an_account_key_connection_string_is_never_logged() {
    if !isolated() {
        return;
    }
    let connection = oauth_azurite().connection_string();
    let (handler, host) = copy_scan_logs(&[("AzureWebJobsStorage", &connection)]).await;
    assert_no_secret(&[&handler, &host], &[DEVELOPMENT_ACCOUNT_KEY, &connection]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by in_a_process_of_its_own"]
async fn case_a_sas_connection_string_is_never_logged() {
    if !isolated() {
        return;
    }
    let azurite = oauth_azurite();
    // For blobs, queues and tables, with every permission: what an operator would paste into a
    // connection string.
    let (sas, sig) = support::account_sas("bqt");
    let connection = format!(
        "BlobEndpoint={};QueueEndpoint={};TableEndpoint={};SharedAccessSignature={sas}",
        azurite.blob_endpoint(),
        azurite.queue_endpoint(),
        azurite.table_endpoint()
    );
    let (handler, host) = copy_scan_logs(&[("AzureWebJobsStorage", &connection)]).await;
    let encoded = sas.rsplit("sig=").next().unwrap().to_string();
    assert_no_secret(
        &[&handler, &host],
        &[&sig, &encoded, &sas, &connection, DEVELOPMENT_ACCOUNT_KEY],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by in_a_process_of_its_own"]
async fn case_a_client_secret_and_its_tokens_are_never_logged() {
    if !isolated() {
        return;
    }
    let identity = Identity::accepting(SECRET);
    let tenant = fakes().tenant(&identity);
    let settings = identity_storage(&[
        ("AzureWebJobsStorage__tenantId", &tenant),
        ("AzureWebJobsStorage__clientId", CLIENT_ID),
        ("AzureWebJobsStorage__clientSecret", SECRET),
    ]);
    scan_logs_no_token(&settings, &identity, &[SECRET]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by in_a_process_of_its_own"]
async fn case_a_federated_token_and_its_tokens_are_never_logged() {
    if !isolated() {
        return;
    }
    let (_dir, file) = token_file("azure-identity-token", FEDERATED);
    let identity = Identity::accepting(FEDERATED);
    let tenant = fakes().tenant(&identity);
    let settings = identity_storage(&[
        ("AzureWebJobsStorage__credential", "workloadidentity"),
        ("AzureWebJobsStorage__tenantId", &tenant),
        ("AzureWebJobsStorage__clientId", CLIENT_ID),
        ("AZURE_FEDERATED_TOKEN_FILE", file.to_str().unwrap()),
    ]);
    let federated = token_pieces(&[FEDERATED.to_string()]);
    let federated: Vec<&str> = federated.iter().map(String::as_str).collect();
    scan_logs_no_token(&settings, &identity, &federated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by in_a_process_of_its_own"]
async fn case_an_identity_header_and_its_tokens_are_never_logged() {
    if !isolated() {
        return;
    }
    let identity = Identity::default();
    let url = fakes().app_service(&identity);
    let settings = identity_storage(&[
        ("AzureWebJobsStorage__credential", "managedidentity"),
        ("IDENTITY_ENDPOINT", &url),
        ("IDENTITY_HEADER", IDENTITY_HEADER),
    ]);
    scan_logs_no_token(&settings, &identity, &[IDENTITY_HEADER]).await;
}
