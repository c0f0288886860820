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

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::retry::RetryPolicy;
use super::settings::Credential;
use super::token::TokenProvider;

pub use super::app_settings::ConnectionSettingError;
pub use super::settings::{
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
    fn clones_share_one_http_client_but_separate_parses_do_not() {
        let a = StorageAccount::parse("UseDevelopmentStorage=true").unwrap();
        let b = a.clone().with_retry_policy(RetryPolicy::none());
        assert!(a.shares_http_client_with(&b));
        assert!(!a.shares_http_client_with(&StorageAccount::new(ConnectionSettings::development())));
        assert_eq!(b.retry_policy().max_attempts, 1);
    }
}
