//! Keyless test pieces (tests/scans/keyless/app_service.rs, tests/scans/keyless/credentials.rs): Azurite over
//! https in OAuth mode, a self-signed certificate trusted through `SSL_CERT_FILE`, JWTs Azurite
//! accepts, and fakes of every place tokens come from, in this process:
//! - one fake identity server (its own thread and runtime, so it outlives each test's runtime)
//!   serving the App Service identity endpoint (`/msi/{key}/token`), IMDS
//!   (`/metadata/identity/oauth2/token`) and Entra ID's token endpoint
//!   (`/{tenant}/oauth2/v2.0/token`, behind an https front: tablescan sends client secrets and
//!   federated tokens only over https), each request answered for the
//!   [`endpoints::Identity`] registered under its key (App Service key, and client id for a
//!   user-assigned identity; IMDS's user-assigned id; tenant). Azurite accepts each token a
//!   little longer than the answer says ([`endpoints::IN_FLIGHT_GRACE`]);
//! - a fake `az` on `PATH` ([`FakeAz`]).
//!
//! The process-wide settings (`SSL_CERT_FILE`, `AZURE_AUTHORITY_HOST`,
//! `AZURE_POD_IDENTITY_AUTHORITY_HOST`, `PATH`) are set once by [`keyless_environment`], before
//! any client is built: every test calls it (through [`oauth_azurite`]) first.

pub mod endpoints;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use base64::Engine;
use serde_json::json;
use tablescan::lab::azurite::{Azurite, AzuriteOptions};
use tablescan::storage::connection::{ConnectionSettings, StorageAccount};
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::TableStore;
use tablescan::storage::{BatchOperation, Entity, MessageEncoding, Query as TableQuery};

use endpoints::fakes;

/// The App Service identity header the fake expects (a secret on a real platform).
pub const IDENTITY_HEADER: &str = "aWRlbnRpdHktaGVhZGVyLXNlY3JldA";
/// The scope every storage token is asked for (v2 endpoints), and the resource (v1: identity).
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";
pub const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
/// What a federated client assertion's type must be.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// The test process's temporary files: certificate, TLS front script, fake `az`.
struct Files {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    az: PathBuf,
}

fn files() -> &'static Files {
    static FILES: OnceLock<Files> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed_certificate(dir.path());
        let az = dir.path().join("az");
        std::fs::create_dir_all(az.join("bin")).unwrap();
        Files {
            cert,
            key,
            az,
            _dir: dir,
        }
    })
}

/// Sets the process-wide settings the keyless tests rely on, once, before any client reads them.
pub fn keyless_environment() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let files = files();
        let fakes = fakes();
        FakeAz::write_script(&files.az);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![files.az.join("bin")];
        paths.extend(std::env::split_paths(&path));
        std::env::set_var("PATH", std::env::join_paths(paths).unwrap());
        std::env::set_var("SSL_CERT_FILE", &files.cert);
        std::env::set_var("AZURE_AUTHORITY_HOST", &fakes.authority_host);
        std::env::set_var("AZURE_POD_IDENTITY_AUTHORITY_HOST", &fakes.http);
    });
}

/// Azurite over https with OAuth (`--oauth basic`), its certificate trusted through
/// `SSL_CERT_FILE`.
pub fn oauth_azurite() -> &'static Azurite {
    static AZURITE: OnceLock<Azurite> = OnceLock::new();
    keyless_environment();
    AZURITE.get_or_init(|| {
        let files = files();
        Azurite::start_with_blocking(&AzuriteOptions {
            tls: Some((files.cert.clone(), files.key.clone())),
            oauth: true,
        })
        .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A self-signed end-entity certificate for 127.0.0.1/localhost (not a CA: rustls refuses a CA
/// certificate as a server's).
fn self_signed_certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let config = dir.join("openssl.cnf");
    std::fs::write(
        &config,
        "[req]\ndistinguished_name=dn\nx509_extensions=ext\nprompt=no\n[dn]\nCN=127.0.0.1\n\
         [ext]\nbasicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let output = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .arg("-config")
        .arg(&config)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is installed");
    assert!(
        output.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (cert, key)
}

/// The unix time `lifetime` seconds from now, rounded up: a token given that expiry never
/// expires sooner than its lifetime says (JWT times are whole seconds).
pub fn expiry_in(lifetime: i64) -> i64 {
    let now = time::OffsetDateTime::now_utc();
    let up = i64::from(now.nanosecond() > 0);
    now.unix_timestamp() + up + lifetime
}

/// A token Azurite's `--oauth basic` accepts until `exp` (unix seconds): a JWT for `audience`
/// from an Entra issuer (the signature is not checked).
pub fn storage_jwt(audience: &str, exp: i64) -> String {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    format!(
        "{}.{}.{}",
        b64(json!({"alg": "RS256", "typ": "JWT"})),
        b64(json!({
            "aud": audience,
            "iss": "https://sts.windows.net/ab1f708d-50f6-404c-a006-d71b2ac7a606/",
            "iat": now - 60, "nbf": now - 60, "exp": exp,
            "oid": "11059fcc-5514-4800-b5f8-49808b9cfab6",
            // Unique, so that a test can look for each issued token in logs.
            "uti": format!("{:x}", rand::random::<u64>()),
        })),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"not-checked")
    )
}

/// Azurite's answer to a table listing authorized by the bearer `token` alone: its status and
/// body (200 while Azurite accepts the token; 403 `AuthenticationFailed` once it has expired).
pub async fn azurite_answer(token: &str) -> (u16, String) {
    let azurite = oauth_azurite();
    let cert = std::fs::read(&files().cert).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&cert).unwrap())
        .build()
        .unwrap();
    let date = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc2822)
        .unwrap()
        .replace("+0000", "GMT");
    let response = client
        .get(format!("{}/Tables", azurite.table_endpoint()))
        .bearer_auth(token)
        .header("x-ms-version", "2019-02-02")
        .header("x-ms-date", date)
        .header("accept", "application/json;odata=nometadata")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Polls `check` every 50 ms until it returns `Ok`; after `bound` (a hang bound), panics saying
/// what it waited for and what `check` saw last (its `Err`).
pub async fn wait_until<T, F, Fut>(what: &str, bound: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = std::time::Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        if start.elapsed() > bound {
            panic!("gave up after {bound:?} waiting for {what}; last saw: {last}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The fake `az` on `PATH` (one per test process: only one test may use it). It records its
/// arguments, then prints what [`FakeAz::answer`] wrote, or fails as [`FakeAz::fail`] says.
pub struct FakeAz {
    dir: PathBuf,
}

impl FakeAz {
    fn write_script(dir: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let d = dir.display();
        let script = format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{d}/calls'\n\
             if [ -f '{d}/stderr' ]; then cat '{d}/stderr' >&2; exit 1; fi\ncat '{d}/stdout'\n"
        );
        let path = dir.join("bin").join("az");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    pub fn get() -> FakeAz {
        keyless_environment();
        FakeAz {
            dir: files().az.clone(),
        }
    }

    /// From now on, print what `az account get-access-token --output json` prints for `token`.
    pub fn answer(&self, token: &str, expires_on: i64) {
        let _ = std::fs::remove_file(self.dir.join("stderr"));
        let json = json!({
            "accessToken": token,
            "expiresOn": "2026-11-22 05:00:00.000000",
            "expires_on": expires_on,
            "subscription": "6c3b1a3e-0000-4000-8000-00000000000a",
            "tenant": "ab1f708d-50f6-404c-a006-d71b2ac7a606",
            "tokenType": "Bearer"
        });
        std::fs::write(self.dir.join("stdout"), format!("{json:#}\n")).unwrap();
    }

    /// From now on, print `stderr` and exit 1 (as `az` does when nobody is logged in).
    pub fn fail(&self, stderr: &str) {
        std::fs::write(self.dir.join("stderr"), stderr).unwrap();
    }

    /// The argument lists `az` was called with, one per call.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// The identity-based connection `name` on the OAuth Azurite: its service URIs plus `pairs`
/// (`__credential` and its companions, `IDENTITY_*`, `AZURE_FEDERATED_TOKEN_FILE`). No key.
pub fn identity_settings(name: &str, pairs: &[(&str, &str)]) -> ConnectionSettings {
    let azurite = oauth_azurite();
    let mut settings: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    settings.insert(format!("{name}__tableServiceUri"), azurite.table_endpoint());
    settings.insert(format!("{name}__queueServiceUri"), azurite.queue_endpoint());
    settings.insert(format!("{name}__blobServiceUri"), azurite.blob_endpoint());
    ConnectionSettings::from_app_settings(name, |k| settings.get(k).cloned())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A federated token file `name` holding `token`, in a new folder that lives as long as the
/// returned `TempDir`.
pub fn token_file(name: &str, token: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, token).unwrap();
    (dir, file)
}

/// App settings of the identity-based connection `name` on the OAuth Azurite: its table and queue
/// service URIs (and its blob service URI when `blobs`), and `credential`: its other settings by
/// suffix (`("credential", "clientsecret")` is `<name>__credential`).
pub fn identity_app_settings(
    name: &str,
    blobs: bool,
    credential: &[(&str, &str)],
) -> Vec<(String, String)> {
    let azurite = oauth_azurite();
    let mut uris = vec![
        ("tableServiceUri", azurite.table_endpoint()),
        ("queueServiceUri", azurite.queue_endpoint()),
    ];
    if blobs {
        uris.push(("blobServiceUri", azurite.blob_endpoint()));
    }
    uris.into_iter()
        .chain(credential.iter().map(|(k, v)| (*k, v.to_string())))
        .map(|(suffix, value)| (format!("{name}__{suffix}"), value))
        .collect()
}

/// The app storage `AzureWebJobsStorage` as identity-based settings ([`identity_app_settings`]).
/// The staged local.settings.json says `UseDevelopmentStorage=true`: emptied (empty is unset), or
/// start-up refuses the two forms together.
pub fn identity_app_storage(blobs: bool, credential: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut settings = vec![("AzureWebJobsStorage".to_string(), String::new())];
    settings.extend(identity_app_settings(
        "AzureWebJobsStorage",
        blobs,
        credential,
    ));
    settings
}

/// The app storage through the App Service identity endpoint `url` (managed identity).
pub fn app_service_storage(url: &str, blobs: bool) -> Vec<(String, String)> {
    let mut settings = identity_app_storage(blobs, &[("credential", "managedidentity")]);
    settings.push(("IDENTITY_ENDPOINT".into(), url.into()));
    settings.push(("IDENTITY_HEADER".into(), IDENTITY_HEADER.into()));
    settings
}

/// `settings` borrowed, as `TestApp::start_on` takes them.
pub fn borrowed(settings: &[(String, String)]) -> Vec<(&str, &str)> {
    settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The connection `name` through the App Service identity endpoint `url`.
pub fn app_service_settings(name: &str, url: &str) -> ConnectionSettings {
    identity_settings(
        name,
        &[
            (&format!("{name}__credential"), "managedidentity"),
            ("IDENTITY_ENDPOINT", url),
            ("IDENTITY_HEADER", IDENTITY_HEADER),
        ],
    )
}

pub fn entity(pk: &str, rk: &str, n: i64) -> Entity {
    let mut e = Entity::new(pk, rk);
    e.properties = json!({"N": n, "Name": format!("row {rk}")})
        .as_object()
        .cloned()
        .unwrap()
        .into();
    e
}

/// A table and queue round trip on `account`, every kind of request: table admin (SDK path),
/// batches, a query and a point read (signed path), queue create, put and get (SDK path).
pub async fn round_trip(account: &StorageAccount) {
    let counters = Arc::new(RequestCounters::new());
    let tables = account.table_store(counters.clone());
    let table = super::unique_name("keyless");
    assert!(tables.create_table(&table).await.unwrap());
    let rows: Vec<_> = (0..5).map(|i| entity("p1", &format!("r{i}"), i)).collect();
    let ops: Vec<_> = rows.iter().cloned().map(BatchOperation::Upsert).collect();
    tables.submit_batch(&table, "p1", &ops).await.unwrap();
    let only = [BatchOperation::Upsert(entity("p2", "only", 9))];
    tables.submit_batch(&table, "p2", &only).await.unwrap();
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

    let queues = account.queue_store(counters);
    let hello = MessageEncoding::Base64.encode(b"hello");
    let (_, got) = super::queue_round_trip(&queues, "keyless", &hello).await;
    assert_eq!(got.len(), 1);
    assert!(tables.delete_table(&table).await.unwrap());
}
