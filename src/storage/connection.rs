//! A storage account ready to talk to: parsed `ConnectionSettings`, one pooled HTTP client and
//! the retry policy, from which each adapter builds its own client (`table_store`, `queue_store`,
//! `blob_store` and the signed data path are defined by the adapters, which import this module, never the
//! other way round).
//!
//! Invariants:
//! - Every client made from one account (and its clones) shares one pooled HTTP client: the
//!   SDK's default client disables connection pooling, which halves point-read throughput.
//! - Use one account (and its clones) from one tokio runtime: a pooled connection is driven by a
//!   task on the runtime that opened it and fails ("dispatch task is gone") once that runtime is
//!   dropped.
//! - `Debug` and `Display` show the account, endpoints and kind of credential, never a secret.
//! - Two connections reach the same account exactly when their endpoints' [`AccountIdentity`]
//!   values are equal: compared by the account an endpoint addresses, never by its text (a host
//!   alias such as `localhost` for `127.0.0.1` must not make one account look like two).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use azure_core::Url;

use super::connection_string::Credential;
use super::retry_policy::RetryPolicy;
use super::token::TokenProvider;

pub use super::app_settings::ConnectionSettingError;
pub use super::connection_string::{
    ConnectionSettings, ConnectionStringError, DEVELOPMENT_ACCOUNT, DEVELOPMENT_ACCOUNT_KEY,
};

/// A storage account: its settings, one shared HTTP client and the retry policy.
/// Cloning is cheap and shares the HTTP client's connection pool.
#[derive(Clone)]
pub struct StorageAccount {
    settings: ConnectionSettings,
    /// The pooled client, for the signed data path and (as the same `Arc`) the SDK's transport.
    http: Arc<reqwest::Client>,
    retry: RetryPolicy,
    /// Keyless connections: the one token provider both paths share (and its cache).
    tokens: Option<Arc<TokenProvider>>,
}

impl StorageAccount {
    /// Parses a connection string: `UseDevelopmentStorage=true`, explicit `TableEndpoint`/
    /// `QueueEndpoint` with a key or SAS, or `AccountName`/`AccountKey` with derived endpoints.
    pub fn parse(connection_string: &str) -> Result<Self, ConnectionStringError> {
        ConnectionSettings::parse(connection_string).map(Self::new)
    }

    /// An account over parsed settings, with a new pooled HTTP client and the default retry policy.
    pub fn new(settings: ConnectionSettings) -> Self {
        let http = Arc::new(shared_http_client());
        let tokens = match &settings.credential {
            Credential::Token { connection, source } => {
                Some(Arc::new(TokenProvider::new(connection, source, &http)))
            }
            _ => None,
        };
        StorageAccount {
            settings,
            http,
            retry: RetryPolicy::default(),
            tokens,
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
        &self.settings.account_name
    }

    /// The table service base URL, without a trailing slash (path-style for Azurite).
    pub fn table_endpoint(&self) -> &str {
        &self.settings.table_endpoint
    }

    /// The queue service base URL, without a trailing slash.
    pub fn queue_endpoint(&self) -> &str {
        &self.settings.queue_endpoint
    }

    /// The blob service base URL, without a trailing slash; or, when the connection gives none,
    /// the message naming the setting to add.
    pub fn blob_endpoint(&self) -> Result<&str, &str> {
        self.settings.blob_endpoint()
    }

    /// `"key"`, `"sas"` or `"token"`: how requests are authorized (for diagnostics; never the secret).
    pub fn auth_kind(&self) -> &'static str {
        self.settings.credential.kind()
    }

    pub(crate) fn settings(&self) -> &ConnectionSettings {
        &self.settings
    }

    /// The same account with `provider` as its token provider (tests: a fake token source).
    #[cfg(test)]
    pub(crate) fn with_token_provider(mut self, provider: Arc<TokenProvider>) -> Self {
        self.tokens = Some(provider);
        self
    }

    /// The token provider of a keyless connection.
    pub(crate) fn tokens(&self) -> Option<&Arc<TokenProvider>> {
        self.tokens.as_ref()
    }

    /// The account's pooled HTTP client.
    pub(crate) fn http(&self) -> &Arc<reqwest::Client> {
        &self.http
    }

    /// Whether two accounts share one HTTP client (and so one connection pool).
    #[cfg(test)]
    fn shares_http_client_with(&self, other: &StorageAccount) -> bool {
        Arc::ptr_eq(&self.http, &other.http)
    }
}

impl fmt::Debug for StorageAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageAccount")
            .field("account_name", &self.settings.account_name)
            .field("credential", &self.settings.credential)
            .field("table_endpoint", &self.settings.table_endpoint)
            .field("queue_endpoint", &self.settings.queue_endpoint)
            .field("blob_endpoint", &self.blob_endpoint().ok())
            .field("development", &self.settings.development)
            .field("retry", &self.retry)
            .finish()
    }
}

impl fmt::Display for StorageAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "account {} (tables {}, queues {}, ",
            self.account_name(),
            self.table_endpoint(),
            self.queue_endpoint(),
        )?;
        if let Ok(blobs) = self.blob_endpoint() {
            write!(f, "blobs {blobs}, ")?;
        }
        write!(f, "{} auth)", self.auth_kind())
    }
}

/// The service family an endpoint belongs to. Azure Storage and Azure Cosmos DB name their
/// accounts in separate namespaces, so an account of one is never an account of the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Azure Storage (or an emulator of it, such as Azurite).
    Storage,
    /// Azure Cosmos DB for Table (`<account>.table.cosmos.azure.com` and its other clouds'
    /// and private-link forms). It serves the Table API but does not return rows in key order.
    CosmosTable,
}

/// The account a service endpoint addresses: what "the same account" means when connections
/// are compared. Holds no secret (endpoints carry none).
///
/// - Azure-style endpoints (`https://acct.table.core.windows.net`, private-link, sovereign-cloud
///   and DNS-zone forms, custom suffixes): the account is the host's first label; the rest of
///   the host, the scheme and the port do not matter. A Storage account's `-secondary` (read
///   access geo-redundant) host is the same account.
/// - Emulator or IP-style endpoints (`http://127.0.0.1:10002/devstoreaccount1`: an IP or
///   `localhost` host, or any host with the account in the path): the account is the first path
///   segment, at the listener host and port; every loopback form of the host (`localhost`,
///   `127.0.0.1`, `[::1]`, …) is one listener.
///
/// A CNAME of a custom domain onto an account cannot be seen without DNS: such an alias is
/// compared by its own first label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccountIdentity {
    pub service: Service,
    /// The account name, lowercased (account names are case-insensitive).
    pub account: String,
    /// Emulator or IP-style endpoints: the host (`localhost` for every loopback form) and port.
    pub listener: Option<(String, u16)>,
}

impl AccountIdentity {
    /// The account `endpoint` (a service base URL) addresses.
    pub fn of_endpoint(endpoint: &str) -> Result<AccountIdentity, String> {
        let url = Url::parse(endpoint).map_err(|e| format!("the endpoint is not a URL ({e})"))?;
        let host = url
            .host_str()
            .ok_or("the endpoint has no host")?
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let first_segment = url
            .path_segments()
            .and_then(|mut s| s.next())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let ip = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok();
        let loopback = ip.map_or(
            host == "localhost" || host.ends_with(".localhost"),
            is_local,
        );
        if ip.is_some() || loopback || !first_segment.is_empty() {
            let port = url.port_or_known_default().unwrap_or_default();
            let listener = if loopback { "localhost".into() } else { host };
            return Ok(AccountIdentity {
                service: Service::Storage,
                account: first_segment,
                listener: Some((listener, port)),
            });
        }
        let labels: Vec<&str> = host.split('.').collect();
        let cosmos = labels[1..]
            .windows(2)
            .any(|w| w[0] == "table" && matches!(w[1], "cosmos" | "cosmosdb"));
        let account = match cosmos {
            true => labels[0],
            // Storage account names are letters and digits only: a hyphen is the host's.
            false => labels[0].trim_end_matches("-secondary"),
        };
        Ok(AccountIdentity {
            service: if cosmos {
                Service::CosmosTable
            } else {
                Service::Storage
            },
            account: account.to_string(),
            listener: None,
        })
    }
}

/// Whether connecting to `ip` reaches this machine (loopback, or the unspecified address).
fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| is_local(IpAddr::V4(v4)))
        }
    }
}

impl fmt::Display for AccountIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let service = match self.service {
            Service::Storage => "storage",
            Service::CosmosTable => "Cosmos DB for Table",
        };
        write!(f, "{service} account {:?}", self.account)?;
        match &self.listener {
            Some((host, port)) => write!(f, " at {host}:{port}"),
            None => Ok(()),
        }
    }
}

/// One pooled reqwest client for a whole account (the SDK's default disables pooling).
///
/// TLS trust: the web PKI roots, the OS store, and every certificate in `SSL_CERT_FILE` (PEM) as
/// an extra root — how a private endpoint's CA or an HTTPS Azurite's self-signed certificate is
/// trusted. Certificate checks are never skipped.
fn shared_http_client() -> reqwest::Client {
    let mut builder = reqwest::Client::builder();
    for certificate in extra_roots() {
        builder = builder.add_root_certificate(certificate);
    }
    builder
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .build()
        .expect("the reqwest client configuration is static and valid")
}

/// The certificates in `SSL_CERT_FILE`, if set and readable (a bad file is logged and skipped:
/// the connection then fails with the TLS error that names the untrusted certificate).
fn extra_roots() -> Vec<reqwest::Certificate> {
    let Some(path) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) else {
        return Vec::new();
    };
    match std::fs::read(&path).map(|pem| reqwest::Certificate::from_pem_bundle(&pem)) {
        Ok(Ok(certificates)) => certificates,
        Ok(Err(e)) => {
            tracing::warn!(path = ?path, "SSL_CERT_FILE holds no usable PEM certificates: {e}");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(path = ?path, "cannot read SSL_CERT_FILE: {e}");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1ieXRlcw==";

    #[test]
    fn accessors_show_the_settings() {
        let account = StorageAccount::parse(
            "TableEndpoint=https://acct9.table.core.windows.net/;QueueEndpoint=https://acct9.queue.core.windows.net/;\
             SharedAccessSignature=sv=1&sig=abc",
        )
        .unwrap();
        assert_eq!(account.account_name(), "acct9");
        assert_eq!(
            account.table_endpoint(),
            "https://acct9.table.core.windows.net"
        );
        assert_eq!(
            account.queue_endpoint(),
            "https://acct9.queue.core.windows.net"
        );
        assert_eq!(account.auth_kind(), "sas");
        assert!(account.blob_endpoint().is_err());
        assert!(!account.to_string().contains("blobs"), "{account}");
        let dev = StorageAccount::parse("UseDevelopmentStorage=true").unwrap();
        assert_eq!(dev.settings(), &ConnectionSettings::development());
        assert_eq!(dev.auth_kind(), "key");
        assert_eq!(
            dev.blob_endpoint(),
            Ok("http://127.0.0.1:10000/devstoreaccount1")
        );
        assert_eq!(
            dev.to_string(),
            "account devstoreaccount1 (tables http://127.0.0.1:10002/devstoreaccount1, queues \
             http://127.0.0.1:10001/devstoreaccount1, blobs http://127.0.0.1:10000/devstoreaccount1, \
             key auth)"
        );
        let e = StorageAccount::parse(&format!("AccountKey={KEY}")).unwrap_err();
        assert!(e.to_string().contains("AccountName is missing"), "{e}");
    }

    #[test]
    fn secrets_never_appear_in_debug_or_display() {
        let sig = "c2VjcmV0c2lnbmF0dXJl";
        let with_key =
            StorageAccount::parse(&format!("AccountName=acct;AccountKey={KEY}")).unwrap();
        let with_sas = StorageAccount::parse(&format!(
            "TableEndpoint=https://acct.table.core.windows.net;QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=sv=1&sig={sig}"
        ))
        .unwrap();
        let dev = StorageAccount::parse("UseDevelopmentStorage=true").unwrap();
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
        assert!(format!("{with_sas:?}").contains("credential: sas (redacted)"));
    }

    #[test]
    fn account_identity_is_the_account_not_the_endpoint_text() {
        let id = |e: &str| AccountIdentity::of_endpoint(e).unwrap();
        let azurite = id("http://127.0.0.1:10002/devstoreaccount1");
        for alias in [
            "http://localhost:10002/devstoreaccount1",
            "http://LOCALHOST.:10002/DevStoreAccount1/",
            "http://[::1]:10002/devstoreaccount1",
            "https://127.0.0.2:10002/devstoreaccount1",
            "http://[::ffff:127.0.0.1]:10002/devstoreaccount1",
            "http://0.0.0.0:10002/devstoreaccount1",
        ] {
            assert_eq!(id(alias), azurite, "{alias}");
        }
        for other in [
            "http://127.0.0.1:10012/devstoreaccount1",
            "http://127.0.0.1:10002/otheraccount",
            "http://10.1.2.3:10002/devstoreaccount1",
            "http://azurite:10002/devstoreaccount1",
        ] {
            assert_ne!(id(other), azurite, "{other}");
        }
        assert_eq!(
            id("http://azurite:10002/devstoreaccount1"),
            id("http://AZURITE:10002/devstoreaccount1/")
        );
        let prod = id("https://prod.table.core.windows.net");
        assert_eq!(prod.account, "prod");
        assert_eq!(prod.service, Service::Storage);
        for alias in [
            "https://PROD.table.core.windows.net:443/",
            "http://prod.table.core.windows.net",
            "https://prod.privatelink.table.core.windows.net",
            "https://prod-secondary.table.core.windows.net",
            "https://prod.z21.table.storage.azure.net",
            "https://prod.table.core.chinacloudapi.cn",
            "https://prod.table.storage.contoso.example",
        ] {
            assert_eq!(id(alias), prod, "{alias}");
        }
        assert_ne!(id("https://prod2.table.core.windows.net"), prod);
        for cosmos in [
            "https://prod.table.cosmos.azure.com",
            "https://prod.table.cosmos.azure.com:443/",
            "https://prod.table.cosmosdb.azure.com",
            "https://prod.privatelink.table.cosmos.azure.com",
            "https://prod.table.cosmos.azure.cn",
            "https://prod.table.cosmos.azure.us",
        ] {
            let c = id(cosmos);
            assert_eq!(c.service, Service::CosmosTable, "{cosmos}");
            assert_eq!(c.account, "prod", "{cosmos}");
            assert_ne!(c, prod, "{cosmos}");
        }
        // Cosmos account names may hold hyphens: nothing is cut.
        assert_eq!(
            id("https://a-secondary.table.cosmos.azure.com").account,
            "a-secondary"
        );
        assert_eq!(
            azurite.to_string(),
            "storage account \"devstoreaccount1\" at localhost:10002"
        );
        assert!(AccountIdentity::of_endpoint("not a url").is_err());
    }

    #[test]
    fn clones_share_one_http_client_but_separate_parses_do_not() {
        let a = StorageAccount::parse("UseDevelopmentStorage=true").unwrap();
        let b = a.clone().with_retry_policy(RetryPolicy::none());
        assert!(a.shares_http_client_with(&b));
        assert!(!a.shares_http_client_with(&StorageAccount::new(ConnectionSettings::development())));
        assert_eq!(b.retry_policy().max_attempts, 1);
    }
}
