//! Entra ID tokens for `https://storage.azure.com/`: one cached, single-flight [`TokenProvider`]
//! per keyless connection, shared by the signed data path and the SDK clients (as their
//! `TokenCredential`).
//!
//! Where tokens come from ([`TokenSource`], read by `app_settings`; fetched by [`fetch`]):
//! - managed identity: our own small client of the platform's identity endpoint (App Service/
//!   Functions `IDENTITY_ENDPOINT` + `IDENTITY_HEADER`, else IMDS). `azure_identity` 0.21 is not
//!   used here because its App Service credential cannot ask for a user-assigned identity (it
//!   hard-codes the system-assigned one), reads the endpoint and header from the process
//!   environment rather than our parsed settings, and folds 5xx/gateway answers into one
//!   `Credential` error kind, so transient failures cannot be told from permanent ones to retry;
//! - client secret, workload identity (the federated token file re-read at every fetch, as the
//!   platform rotates it) and the Azure CLI: `azure_identity` 0.21's credentials, over our HTTP
//!   client, which classifies their endpoint's answers.
//!
//! Invariants:
//! - At most one fetch per provider is in flight; callers meanwhile wait for its result.
//! - A token is refreshed `REFRESH_MARGIN` before it expires (half its lifetime if shorter); a
//!   failed refresh while the old token is still valid keeps using it and tries again later.
//! - Transient failures (connection errors, timeouts, 408/429/5xx from a token endpoint, also
//!   404/410 from the identity endpoint) are retried with backoff ([`crate::retry`]); the error
//!   that surfaces names the connection, and a permanent one also the settings to check.
//! - No token, client secret, federated token or identity header ever appears in `Debug`, logs
//!   or errors.

use std::fmt;
use std::sync::RwLock;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::auth::{AccessToken, Secret, TokenCredential};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::token_source::TokenSource;
use crate::retry::{retry, Backoff, FullJitter};

mod fetch;

/// The audience of every storage token (AAD v1 resource) and its v2 scope.
pub(crate) const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
pub(crate) const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";
/// Refresh this long before expiry (managed identity tokens live for hours; others ~1 hour).
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// After a failed refresh with a still-valid token, wait this long before trying again.
const RETRY_REFRESH_AFTER: Duration = Duration::from_secs(30);
/// Identity endpoint patience: 0.5 s doubling to 8 s, 6 attempts, within a minute.
const FETCH_BACKOFF: Backoff = Backoff::new(6, Duration::from_millis(500), Duration::from_secs(8))
    .with_deadline(Duration::from_secs(60));

/// A token as fetched: the bearer value and when it expires (wall clock).
pub(crate) struct Fetched {
    pub token: Secret,
    pub expires_on: OffsetDateTime,
}

impl fmt::Debug for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fetched(token redacted, expires {})", self.expires_on)
    }
}

/// A failed fetch: whether another attempt may succeed, and what happened (never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct FetchError {
    pub transient: bool,
    pub message: String,
}

impl FetchError {
    fn transient(message: impl Into<String>) -> Self {
        FetchError {
            transient: true,
            message: message.into(),
        }
    }
    fn permanent(message: impl Into<String>) -> Self {
        FetchError {
            transient: false,
            message: message.into(),
        }
    }
}

/// One way to fetch a storage token (no caching, no retry: the provider's).
#[async_trait]
pub(crate) trait TokenFetch: Send + Sync + 'static {
    async fn fetch(&self) -> Result<Fetched, FetchError>;
}

/// No token for a connection: which connection, whether retrying later may help, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no storage token for connection {connection} ({credential}): {message}")]
pub(crate) struct TokenError {
    pub connection: String,
    pub credential: &'static str,
    pub transient: bool,
    pub message: String,
}

struct Cached {
    token: Secret,
    expires_on: OffsetDateTime,
    /// When to fetch a new one, and when this one stops being usable (tokio's clock).
    refresh_at: Instant,
    expires_at: Instant,
}

/// A connection's tokens: cached, refreshed before expiry, one fetch at a time.
pub(crate) struct TokenProvider {
    connection: String,
    credential: &'static str,
    /// What to check when the source refuses (the settings that make it), for permanent errors.
    hint: String,
    fetch: Box<dyn TokenFetch>,
    backoff: Backoff,
    cached: RwLock<Option<Cached>>,
    /// Held by the one caller fetching; others wait on it, then read the cache.
    refresh: tokio::sync::Mutex<()>,
}

impl fmt::Debug for TokenProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TokenProvider({}, {}, token redacted)",
            self.connection, self.credential
        )
    }
}

impl TokenProvider {
    /// The provider for `source` (connection `connection`), fetching over `http`.
    pub(crate) fn new(connection: &str, source: &TokenSource, http: &reqwest::Client) -> Self {
        let source = fetch::source(connection, source, http);
        let mut provider =
            Self::with_fetch(connection, source.credential, source.fetch, FETCH_BACKOFF);
        provider.hint = source.hint;
        provider
    }

    pub(crate) fn with_fetch(
        connection: &str,
        credential: &'static str,
        fetch: Box<dyn TokenFetch>,
        backoff: Backoff,
    ) -> Self {
        TokenProvider {
            connection: connection.to_string(),
            credential,
            hint: String::new(),
            fetch,
            backoff,
            cached: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    /// A valid token: the cached one, or a new one fetched by exactly one caller at a time.
    pub(crate) async fn token(&self) -> Result<(Secret, OffsetDateTime), TokenError> {
        if let Some(token) = self.current() {
            return Ok(token);
        }
        let _refreshing = self.refresh.lock().await;
        // Whoever held the lock before may have refreshed it.
        if let Some(token) = self.current() {
            return Ok(token);
        }
        let result = retry(
            &self.backoff,
            FullJitter,
            || self.fetch.fetch(),
            |e: &FetchError| e.transient,
        )
        .await;
        match result {
            Ok(fetched) => {
                let now = Instant::now();
                let lifetime: Duration = (fetched.expires_on - OffsetDateTime::now_utc())
                    .try_into()
                    .unwrap_or(Duration::ZERO);
                let margin = REFRESH_MARGIN.min(lifetime / 2);
                let token = (fetched.token.clone(), fetched.expires_on);
                *self.cached.write().expect("not poisoned") = Some(Cached {
                    token: fetched.token,
                    expires_on: fetched.expires_on,
                    refresh_at: now + (lifetime - margin),
                    expires_at: now + lifetime,
                });
                Ok(token)
            }
            Err(failure) => {
                let attempts = failure.attempts;
                let error = failure.into_error();
                // Still valid: keep using it, and try again a little later.
                let mut cached = self.cached.write().expect("not poisoned");
                if let Some(c) = cached.as_mut() {
                    if Instant::now() < c.expires_at {
                        c.refresh_at = Instant::now() + RETRY_REFRESH_AFTER;
                        tracing::warn!(
                            connection = %self.connection,
                            credential = self.credential,
                            "storage token refresh failed, using the current token until it expires: {}",
                            error.message
                        );
                        return Ok((c.token.clone(), c.expires_on));
                    }
                }
                let mut message = error.message;
                if error.transient && attempts > 1 {
                    message.push_str(&format!(" (gave up after {attempts} attempts)"));
                } else if !error.transient && !self.hint.is_empty() {
                    message.push_str("; ");
                    message.push_str(&self.hint);
                }
                Err(TokenError {
                    connection: self.connection.clone(),
                    credential: self.credential,
                    transient: error.transient,
                    message,
                })
            }
        }
    }

    /// The cached token if it needs no refresh yet.
    fn current(&self) -> Option<(Secret, OffsetDateTime)> {
        let cached = self.cached.read().expect("not poisoned");
        let c = cached.as_ref()?;
        (Instant::now() < c.refresh_at).then(|| (c.token.clone(), c.expires_on))
    }

    fn clear(&self) {
        *self.cached.write().expect("not poisoned") = None;
    }
}

/// The SDK clients (table admin, queues) ask the same provider.
#[async_trait]
impl TokenCredential for TokenProvider {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core::Result<AccessToken> {
        // Every client of a storage account asks for the storage scope; the provider has one.
        // Transient failures as I/O, so the SDK adapters classify them as transient too (see
        // `azure::map_sdk_error`); permanent ones as credential errors (rejected).
        let (token, expires_on) = self.token().await.map_err(|e| {
            let kind = if e.transient {
                azure_core::error::ErrorKind::Io
            } else {
                azure_core::error::ErrorKind::Credential
            };
            azure_core::Error::message(kind, e.to_string())
        })?;
        Ok(AccessToken::new(token, expires_on))
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.clear();
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A fake token source: fetch `n` hands out `prefix` (n = 0) or `prefix-n`, living `lifetime`
    /// seconds, after `delay` — unless the script's next entry is an error.
    struct FakeFetch {
        prefix: String,
        lifetime: i64,
        delay: Duration,
        script: Mutex<VecDeque<Option<FetchError>>>,
        fetches: Arc<AtomicUsize>,
    }

    #[async_trait]
    impl TokenFetch for FakeFetch {
        async fn fetch(&self) -> Result<Fetched, FetchError> {
            let n = self.fetches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if let Some(Some(e)) = self.script.lock().unwrap().pop_front() {
                return Err(e);
            }
            Ok(Fetched {
                token: Secret::new(if n == 0 {
                    self.prefix.clone()
                } else {
                    format!("{}-{n}", self.prefix)
                }),
                expires_on: OffsetDateTime::now_utc() + time::Duration::seconds(self.lifetime),
            })
        }
    }

    fn fake(
        prefix: &str,
        lifetime: i64,
        delay: Duration,
        script: Vec<Option<FetchError>>,
    ) -> (Arc<TokenProvider>, Arc<AtomicUsize>) {
        let fetches = Arc::new(AtomicUsize::new(0));
        let fetch = FakeFetch {
            prefix: prefix.to_string(),
            lifetime,
            delay,
            script: Mutex::new(script.into()),
            fetches: fetches.clone(),
        };
        let provider =
            TokenProvider::with_fetch("Src", "managedidentity", Box::new(fetch), FETCH_BACKOFF);
        (Arc::new(provider), fetches)
    }

    /// A provider over a fake source handing out `token` (then `token-1`, …), and its fetch count.
    pub(crate) fn fake_provider(
        token: &str,
        lifetime: i64,
    ) -> (Arc<TokenProvider>, Arc<AtomicUsize>) {
        fake(token, lifetime, Duration::ZERO, Vec::new())
    }

    async fn secret(provider: &TokenProvider) -> String {
        provider.token().await.unwrap().0.secret().to_string()
    }

    #[tokio::test(start_paused = true)]
    async fn one_fetch_serves_every_concurrent_caller() {
        let (provider, fetches) = fake("tok", 3600, Duration::from_secs(2), Vec::new());
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let p = provider.clone();
                tokio::spawn(async move { secret(&p).await })
            })
            .collect();
        for c in callers {
            assert_eq!(c.await.unwrap(), "tok");
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert_eq!(secret(&provider).await, "tok");
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn refreshed_before_expiry_not_after() {
        let (provider, fetches) = fake("tok", 3600, Duration::ZERO, Vec::new());
        assert_eq!(secret(&provider).await, "tok");
        // Until 5 minutes before expiry: the cached token.
        tokio::time::advance(Duration::from_secs(3600 - 300 - 2)).await;
        assert_eq!(secret(&provider).await, "tok");
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(secret(&provider).await, "tok-1");
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        // A short-lived token is refreshed at half its life.
        let (short, fetches) = fake("s", 60, Duration::ZERO, Vec::new());
        secret(&short).await;
        tokio::time::advance(Duration::from_secs(28)).await;
        assert_eq!(secret(&short).await, "s");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(secret(&short).await, "s-1");
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_permanent_ones_name_the_connection() {
        let (provider, fetches) = fake(
            "tok",
            3600,
            Duration::ZERO,
            vec![
                Some(FetchError::transient("503")),
                Some(FetchError::transient("connection refused")),
            ],
        );
        assert_eq!(secret(&provider).await, "tok-2");
        assert_eq!(fetches.load(Ordering::SeqCst), 3);

        let (provider, fetches) = fake(
            "tok",
            3600,
            Duration::ZERO,
            vec![Some(FetchError::permanent(
                "the identity endpoint answered 400 invalid_resource",
            ))],
        );
        let error = provider.token().await.unwrap_err();
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert!(!error.transient);
        assert_eq!(
            error.to_string(),
            "no storage token for connection Src (managedidentity): the identity endpoint answered 400 invalid_resource"
        );

        // Transient for ever: gives up after the backoff's attempts, still transient.
        let always = (0..10)
            .map(|_| Some(FetchError::transient("503")))
            .collect();
        let (provider, fetches) = fake("tok", 3600, Duration::ZERO, always);
        let error = provider.token().await.unwrap_err();
        assert!(error.transient);
        assert_eq!(fetches.load(Ordering::SeqCst), 6);

        // The SDK path sees the same verdict: transient as I/O, permanent as a credential error.
        let always = (0..6).map(|_| Some(FetchError::transient("503"))).collect();
        let (provider, _) = fake("tok", 3600, Duration::ZERO, always);
        let sdk = provider.get_token(&[STORAGE_SCOPE]).await.unwrap_err();
        assert!(
            matches!(sdk.kind(), azure_core::error::ErrorKind::Io),
            "{sdk}"
        );
        let (provider, _) = fake(
            "tok",
            3600,
            Duration::ZERO,
            vec![Some(FetchError::permanent("403"))],
        );
        let sdk = provider.get_token(&[STORAGE_SCOPE]).await.unwrap_err();
        assert!(
            matches!(sdk.kind(), azure_core::error::ErrorKind::Credential),
            "{sdk}"
        );
        assert!(sdk.to_string().contains("connection Src"), "{sdk}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_keeps_the_valid_token_and_tries_later() {
        let (provider, fetches) = fake(
            "tok",
            3600,
            Duration::ZERO,
            vec![None, Some(FetchError::permanent("down"))],
        );
        assert_eq!(secret(&provider).await, "tok");
        tokio::time::advance(Duration::from_secs(3400)).await;
        assert_eq!(secret(&provider).await, "tok", "still valid: kept");
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        // Not asked again at once…
        assert_eq!(secret(&provider).await, "tok");
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        // …but after a while.
        tokio::time::advance(RETRY_REFRESH_AFTER).await;
        assert_eq!(secret(&provider).await, "tok-2");
    }

    #[test]
    fn a_provider_prints_no_token() {
        let (provider, _) = fake_provider("eyJ0eXAi", 3600);
        assert!(!format!("{provider:?}").contains("eyJ0eXAi"));
    }
}
