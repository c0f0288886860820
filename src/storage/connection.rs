//! Storage connection strings parsed into a typed [`StorageAccount`], and the clients built from it.
//!
//! The 0.21 crates parse connection strings but build no client from them, and reject
//! `UseDevelopmentStorage=true`; this module covers the three forms tablescan meets:
//! - `UseDevelopmentStorage=true` (Azurite's default ports, path-style URLs);
//! - explicit `TableEndpoint=`/`QueueEndpoint=` with `AccountName`+`AccountKey` or `SharedAccessSignature`;
//! - `DefaultEndpointsProtocol`/`AccountName`/`AccountKey`/`EndpointSuffix` (public-cloud style URLs).
//!
//! Every client made from one account shares one pooled HTTP client: the SDK's default client
//! disables connection pooling, which halves point-read throughput.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::Secret;
use azure_core::{ClientOptions, HttpClient, RetryOptions, TransportOptions, Url};
use azure_storage::StorageCredentials;
use base64::Engine;

use super::azure::ErrorDetailsTransport;
use super::azure_queue::AzureQueueStore;
use super::azure_table::AzureTableStore;
use super::counters::RequestCounters;
use super::retry::RetryPolicy;
use super::signed::{Authorization, SignedTableClient};

/// Azurite's well-known account.
pub const DEVELOPMENT_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known (public) account key.
pub const DEVELOPMENT_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Azurite's default table endpoint (path-style: the account is the first path segment).
pub const DEVELOPMENT_TABLE_ENDPOINT: &str = "http://127.0.0.1:10002/devstoreaccount1";
/// Azurite's default queue endpoint.
pub const DEVELOPMENT_QUEUE_ENDPOINT: &str = "http://127.0.0.1:10001/devstoreaccount1";

/// A connection string that cannot be used. The message names the offending key, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage connection string: {0}")]
pub struct ConnectionStringError(pub String);

fn err(message: impl Into<String>) -> ConnectionStringError {
    ConnectionStringError(message.into())
}

/// How requests are authorized. Never printed.
#[derive(Clone, PartialEq, Eq)]
enum Credential {
    /// Shared Key signing with the base64 account key.
    Key(String),
    /// A SAS token (query string without the leading `?`).
    Sas(String),
}

/// A storage account: endpoints, credentials, one shared HTTP client and the retry policy.
/// Cloning is cheap and shares the HTTP client's connection pool. Use one account (and its
/// clones) from one tokio runtime: a pooled connection is driven by a task on the runtime that
/// opened it and fails ("dispatch task is gone") once that runtime is dropped.
#[derive(Clone)]
pub struct StorageAccount {
    account_name: String,
    credential: Credential,
    table_endpoint: String,
    queue_endpoint: String,
    development: bool,
    /// The pooled client, for the signed data path ...
    http: reqwest::Client,
    /// ... and the same client (same pool) as the SDK's transport.
    sdk_http: Arc<dyn HttpClient>,
    retry: RetryPolicy,
}

impl StorageAccount {
    /// Parses a connection string (see the module docs for the accepted forms).
    pub fn parse(connection_string: &str) -> Result<Self, ConnectionStringError> {
        let pairs = split_pairs(connection_string)?;
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };

        if let Some(value) = get("UseDevelopmentStorage") {
            if !value.eq_ignore_ascii_case("true") {
                return Err(err(format!(
                    "UseDevelopmentStorage must be `true`, got `{value}`"
                )));
            }
            if get("DevelopmentStorageProxyUri").is_some() {
                return Err(err("DevelopmentStorageProxyUri is not supported; use explicit TableEndpoint/QueueEndpoint"));
            }
            return Ok(Self::development());
        }

        let account_name = get("AccountName").map(str::to_string);
        let credential = match (get("AccountKey"), get("SharedAccessSignature")) {
            (Some(key), _) => {
                let name = account_name
                    .as_deref()
                    .ok_or_else(|| err("AccountKey is given but AccountName is missing"))?;
                if name.is_empty() {
                    return Err(err("AccountName is empty"));
                }
                base64::engine::general_purpose::STANDARD
                    .decode(key)
                    .map_err(|_| err("AccountKey is not valid base64"))?;
                Credential::Key(key.to_string())
            }
            (None, Some(sas)) => {
                let sas = sas.trim_start_matches('?');
                if sas.is_empty() {
                    return Err(err("SharedAccessSignature is empty"));
                }
                StorageCredentials::sas_token(sas)
                    .map_err(|_| err("SharedAccessSignature is not a valid query string"))?;
                Credential::Sas(sas.to_string())
            }
            (None, None) => return Err(err("missing AccountKey or SharedAccessSignature")),
        };

        let protocol = get("DefaultEndpointsProtocol").unwrap_or("https");
        if !matches!(protocol, "http" | "https") {
            return Err(err(format!(
                "DefaultEndpointsProtocol must be http or https, got `{protocol}`"
            )));
        }
        let suffix = get("EndpointSuffix").unwrap_or("core.windows.net");
        let derived = |service: &str| {
            account_name
                .as_deref()
                .map(|name| format!("{protocol}://{name}.{service}.{suffix}"))
        };
        let endpoint = |key: &str, service: &str| -> Result<String, ConnectionStringError> {
            match get(key) {
                Some(explicit) => normalize_endpoint(key, explicit),
                None => derived(service).ok_or_else(|| {
                    err(format!("missing {key} (or AccountName to derive it from DefaultEndpointsProtocol/EndpointSuffix)"))
                }),
            }
        };
        let table_endpoint = endpoint("TableEndpoint", "table")?;
        let queue_endpoint = endpoint("QueueEndpoint", "queue")?;
        let account_name = match account_name {
            Some(name) => name,
            None => account_from_endpoint(&table_endpoint).ok_or_else(|| {
                err("missing AccountName and it cannot be inferred from TableEndpoint")
            })?,
        };
        let http = shared_http_client();
        Ok(StorageAccount {
            account_name,
            credential,
            table_endpoint,
            queue_endpoint,
            development: false,
            http: http.clone(),
            sdk_http: Arc::new(http),
            retry: RetryPolicy::default(),
        })
    }

    /// Reads and parses the connection string in environment variable `var_name`.
    pub fn from_env(var_name: &str) -> Result<Self, ConnectionStringError> {
        match std::env::var(var_name) {
            Ok(value) => Self::parse(&value).map_err(|e| err(format!("in ${var_name}: {}", e.0))),
            Err(std::env::VarError::NotPresent) => {
                Err(err(format!("environment variable {var_name} is not set")))
            }
            Err(std::env::VarError::NotUnicode(_)) => Err(err(format!(
                "environment variable {var_name} is not valid UTF-8"
            ))),
        }
    }

    /// `UseDevelopmentStorage=true`: Azurite on its default ports with the well-known account.
    pub fn development() -> Self {
        let http = shared_http_client();
        StorageAccount {
            account_name: DEVELOPMENT_ACCOUNT.into(),
            credential: Credential::Key(DEVELOPMENT_ACCOUNT_KEY.into()),
            table_endpoint: DEVELOPMENT_TABLE_ENDPOINT.into(),
            queue_endpoint: DEVELOPMENT_QUEUE_ENDPOINT.into(),
            development: true,
            http: http.clone(),
            sdk_http: Arc::new(http),
            retry: RetryPolicy::default(),
        }
    }

    /// Replaces the retry policy used by stores built from this account afterwards.
    pub fn with_retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        self.retry
    }

    pub fn account_name(&self) -> &str {
        &self.account_name
    }

    /// The table service base URL, without a trailing slash (path-style for Azurite).
    pub fn table_endpoint(&self) -> &str {
        &self.table_endpoint
    }

    /// The queue service base URL, without a trailing slash.
    pub fn queue_endpoint(&self) -> &str {
        &self.queue_endpoint
    }

    /// Whether this came from `UseDevelopmentStorage=true`.
    pub fn is_development_storage(&self) -> bool {
        self.development
    }

    /// `"key"` or `"sas"`: how requests are authorized (for diagnostics; never the secret).
    pub fn auth_kind(&self) -> &'static str {
        match self.credential {
            Credential::Key(_) => "key",
            Credential::Sas(_) => "sas",
        }
    }

    /// A table store over this account, counting requests in `counters`.
    pub fn table_store(&self, counters: Arc<RequestCounters>) -> AzureTableStore {
        AzureTableStore::new(self, counters)
    }

    /// A queue store over this account, counting requests in `counters`.
    pub fn queue_store(&self, counters: Arc<RequestCounters>) -> AzureQueueStore {
        AzureQueueStore::new(self, counters)
    }

    /// SDK credentials for this account.
    pub(crate) fn credentials(&self) -> StorageCredentials {
        match &self.credential {
            Credential::Key(key) => {
                StorageCredentials::access_key(self.account_name.clone(), Secret::new(key.clone()))
            }
            Credential::Sas(sas) => {
                StorageCredentials::sas_token(sas).expect("validated when parsed")
            }
        }
    }

    /// SDK client options: our shared pooled client, and no SDK retries (we retry and count).
    pub(crate) fn client_options(&self) -> ClientOptions {
        let transport = Arc::new(ErrorDetailsTransport {
            client: self.sdk_http.clone(),
        });
        ClientOptions::default()
            .retry(RetryOptions::none())
            .transport(TransportOptions::new_custom_policy(transport))
    }

    /// The table endpoint as a signed client for the lean data path (shares the pool).
    pub(crate) fn signed_table_client(&self) -> SignedTableClient {
        let authorization = match &self.credential {
            Credential::Key(key) => {
                Authorization::shared_key(&self.account_name, key).expect("validated when parsed")
            }
            Credential::Sas(sas) => Authorization::Sas(sas.clone()),
        };
        SignedTableClient::new(self.http.clone(), &self.table_endpoint, authorization)
    }

    /// Whether two accounts share one HTTP client (and so one connection pool).
    pub fn shares_http_client_with(&self, other: &StorageAccount) -> bool {
        Arc::ptr_eq(&self.sdk_http, &other.sdk_http)
    }
}

impl fmt::Debug for StorageAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageAccount")
            .field("account_name", &self.account_name)
            .field(
                "credential",
                &format_args!("{} (redacted)", self.auth_kind()),
            )
            .field("table_endpoint", &self.table_endpoint)
            .field("queue_endpoint", &self.queue_endpoint)
            .field("development", &self.development)
            .field("retry", &self.retry)
            .finish()
    }
}

impl fmt::Display for StorageAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "account {} (tables {}, queues {}, {} auth)",
            self.account_name,
            self.table_endpoint,
            self.queue_endpoint,
            self.auth_kind()
        )
    }
}

/// Splits `Key=Value;Key=Value` (values may contain `=`; empty segments are ignored).
fn split_pairs(s: &str) -> Result<Vec<(String, String)>, ConnectionStringError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for segment in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = segment.split_once('=').ok_or_else(|| {
            err(format!(
                "segment `{}` is not Key=Value",
                redact_segment(segment)
            ))
        })?;
        let key = key.trim();
        if key.is_empty() {
            return Err(err("a segment has an empty key"));
        }
        if pairs.iter().any(|(k, _)| k.eq_ignore_ascii_case(key)) {
            return Err(err(format!("{key} is given twice")));
        }
        pairs.push((key.to_string(), value.trim().to_string()));
    }
    if pairs.is_empty() {
        return Err(err("it is empty"));
    }
    Ok(pairs)
}

/// A malformed segment might be a secret pasted without its key: show only its start.
fn redact_segment(segment: &str) -> String {
    let prefix: String = segment.chars().take(4).collect();
    if segment.chars().count() > 4 {
        format!("{prefix}…")
    } else {
        prefix
    }
}

fn normalize_endpoint(key: &str, value: &str) -> Result<String, ConnectionStringError> {
    let url = Url::parse(value).map_err(|e| err(format!("{key} is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(err(format!("{key} must be an http(s) URL with a host")));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(err(format!(
            "{key} must not carry a query; put a SAS in SharedAccessSignature"
        )));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// The account name from an endpoint: the first path segment for path-style (IP/localhost)
/// URLs, else the first DNS label.
fn account_from_endpoint(endpoint: &str) -> Option<String> {
    let url = Url::parse(endpoint).ok()?;
    let host = url.host_str()?;
    let path_style =
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[');
    let name = if path_style {
        url.path_segments()?.next()?.to_string()
    } else {
        host.split('.').next()?.to_string()
    };
    (!name.is_empty()).then_some(name)
}

/// One pooled reqwest client for a whole account (the SDK's default disables pooling).
fn shared_http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .build()
        .expect("the reqwest client configuration is static and valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1ieXRlcw==";

    #[test]
    fn development_storage_uses_azurite_defaults() {
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
        assert!(account.is_development_storage());
        assert_eq!(account.auth_kind(), "key");
        assert!(StorageAccount::parse("usedevelopmentstorage=TRUE;")
            .unwrap()
            .is_development_storage());
        let e = StorageAccount::parse("UseDevelopmentStorage=false").unwrap_err();
        assert!(e.to_string().contains("UseDevelopmentStorage"), "{e}");
    }

    #[test]
    fn account_key_form_derives_public_endpoints() {
        let account =
            StorageAccount::parse(&format!("DefaultEndpointsProtocol=https;AccountName=myacct;AccountKey={KEY};EndpointSuffix=core.windows.net"))
                .unwrap();
        assert_eq!(account.account_name(), "myacct");
        assert_eq!(
            account.table_endpoint(),
            "https://myacct.table.core.windows.net"
        );
        assert_eq!(
            account.queue_endpoint(),
            "https://myacct.queue.core.windows.net"
        );
        assert!(!account.is_development_storage());

        let china = StorageAccount::parse(&format!("AccountName=a1;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn;DefaultEndpointsProtocol=http")).unwrap();
        assert_eq!(
            china.table_endpoint(),
            "http://a1.table.core.chinacloudapi.cn"
        );
    }

    #[test]
    fn explicit_endpoints_win_and_lose_trailing_slashes() {
        let s = format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};\
             BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;TableEndpoint=http://127.0.0.1:4321/devstoreaccount1/;\
             QueueEndpoint=http://127.0.0.1:4320/devstoreaccount1;"
        );
        let account = StorageAccount::parse(&s).unwrap();
        assert_eq!(
            account.table_endpoint(),
            "http://127.0.0.1:4321/devstoreaccount1"
        );
        assert_eq!(
            account.queue_endpoint(),
            "http://127.0.0.1:4320/devstoreaccount1"
        );
    }

    #[test]
    fn sas_form_infers_the_account_name() {
        let s = "TableEndpoint=https://acct9.table.core.windows.net/;QueueEndpoint=https://acct9.queue.core.windows.net/;\
                 SharedAccessSignature=sv=2022-11-02&ss=tq&srt=sco&sp=rwdlacu&se=2030-01-01T00:00:00Z&sig=c2lnbmF0dXJl";
        let account = StorageAccount::parse(s).unwrap();
        assert_eq!(account.account_name(), "acct9");
        assert_eq!(account.auth_kind(), "sas");
        let path_style = "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;QueueEndpoint=http://127.0.0.1:8/devstoreaccount1;SharedAccessSignature=?sv=1&sig=abc";
        assert_eq!(
            StorageAccount::parse(path_style).unwrap().account_name(),
            "devstoreaccount1"
        );
    }

    #[test]
    fn errors_name_the_missing_or_bad_key() {
        let cases = [
            ("", "empty"),
            ("AccountName=a", "AccountKey or SharedAccessSignature"),
            (
                &format!("AccountKey={KEY}") as &str,
                "AccountName is missing",
            ),
            (
                "AccountName=a;AccountKey=not*base64",
                "AccountKey is not valid base64",
            ),
            (
                &format!("AccountName=a;AccountKey={KEY};DefaultEndpointsProtocol=ftp"),
                "DefaultEndpointsProtocol",
            ),
            (
                &format!("AccountName=a;AccountKey={KEY};TableEndpoint=not a url"),
                "TableEndpoint is not a URL",
            ),
            (
                &format!("AccountName=a;AccountKey={KEY};TableEndpoint=http://h/?sv=1"),
                "TableEndpoint must not carry a query",
            ),
            (
                "TableEndpoint=http://127.0.0.1:1/x;SharedAccessSignature=sv=1&sig=a",
                "missing QueueEndpoint",
            ),
            ("garbage", "not Key=Value"),
            (
                &format!("AccountName=a;AccountName=b;AccountKey={KEY}"),
                "AccountName is given twice",
            ),
        ];
        for (input, expected) in cases {
            let e = StorageAccount::parse(input).unwrap_err().to_string();
            assert!(
                e.contains(expected),
                "{input:?}: {e:?} should mention {expected:?}"
            );
        }
    }

    #[test]
    fn secrets_never_appear_in_debug_display_or_errors() {
        let sig = "c2VjcmV0c2lnbmF0dXJl";
        let with_key =
            StorageAccount::parse(&format!("AccountName=acct;AccountKey={KEY}")).unwrap();
        let with_sas = StorageAccount::parse(&format!(
            "TableEndpoint=https://acct.table.core.windows.net;QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=sv=1&sig={sig}"
        ))
        .unwrap();
        let dev = StorageAccount::development();
        for text in [
            format!("{with_key:?}"),
            format!("{with_key}"),
            format!("{with_sas:?}"),
            format!("{with_sas}"),
            format!("{dev:?} {dev}"),
        ] {
            assert!(
                !text.contains(KEY)
                    && !text.contains(sig)
                    && !text.contains(DEVELOPMENT_ACCOUNT_KEY),
                "{text}"
            );
            assert!(
                text.contains("acct") || text.contains("devstoreaccount1"),
                "{text}"
            );
        }
        // A key pasted without `AccountKey=` must not be echoed whole.
        let e = StorageAccount::parse(&format!("AccountName=a;{KEY}"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains(KEY), "{e}");
    }

    #[test]
    fn from_env_names_the_variable() {
        let e = StorageAccount::from_env("TABLESCAN_TEST_SURELY_UNSET_VARIABLE").unwrap_err();
        assert!(e
            .to_string()
            .contains("TABLESCAN_TEST_SURELY_UNSET_VARIABLE"));
    }

    #[test]
    fn clones_share_one_http_client_but_separate_parses_do_not() {
        let a = StorageAccount::development();
        let b = a.clone().with_retry_policy(RetryPolicy::none());
        assert!(a.shares_http_client_with(&b));
        assert!(!a.shares_http_client_with(&StorageAccount::development()));
        assert_eq!(b.retry_policy().max_attempts, 1);
    }
}
