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
//! Invariants (time is tokio's clock, so paused-time tests drive all of it; the wall clock is read
//! only where a source's wall-clock expiry is turned into tokio's, [`Fetched::expiring_on`]):
//! - At most one fetch per provider is in flight; callers meanwhile wait for its result.
//! - An expired token is never handed out: not the cached one from its `expires_at` on, and not a
//!   fetched one that had already expired when it came (an error instead).
//! - A token is refreshed from `REFRESH_MARGIN` before its expiry on (half its lifetime if
//!   shorter): the first caller at or after that point fetches a new one.
//! - A failed refresh while the old token is still valid keeps using it, and the next caller
//!   `RETRY_REFRESH_AFTER` later (or at its expiry, if sooner) tries again; once it has expired,
//!   the failure is the caller's error.
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

/// A token as fetched: the bearer value, and when it expires on both clocks.
pub(crate) struct Fetched {
    pub token: Secret,
    /// As its source said (wall clock): handed to the SDK clients with the token.
    pub expires_on: OffsetDateTime,
    /// The same moment on tokio's clock, which the cache decides by.
    pub expires_at: Instant,
}

impl Fetched {
    /// A token its source says expires at `expires_on` (wall clock), received now.
    pub(crate) fn expiring_on(token: Secret, expires_on: OffsetDateTime) -> Self {
        Self::received(token, expires_on, OffsetDateTime::now_utc(), Instant::now())
    }

    /// A token its source says lives `lifetime` from now (`expires_in`).
    pub(crate) fn expiring_in(token: Secret, lifetime: Duration) -> Self {
        Fetched {
            token,
            expires_on: OffsetDateTime::now_utc() + lifetime,
            expires_at: Instant::now() + lifetime,
        }
    }

    /// A token expiring at `expires_on`, received when the wall clock read `wall` and tokio's
    /// `now`: it has `expires_on - wall` left (none if that is negative).
    fn received(
        token: Secret,
        expires_on: OffsetDateTime,
        wall: OffsetDateTime,
        now: Instant,
    ) -> Self {
        let left = Duration::try_from(expires_on - wall).unwrap_or(Duration::ZERO);
        Fetched {
            token,
            expires_on,
            expires_at: now + left,
        }
    }
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

/// The token in use and its schedule on tokio's clock: `refresh_at <= expires_at`.
struct Cached {
    token: Secret,
    expires_on: OffsetDateTime,
    /// From then on, the next caller fetches a new token.
    refresh_at: Instant,
    /// From then on, this one is never handed out.
    expires_at: Instant,
}

impl Cached {
    /// `fetched`, received at `now`: refreshed `REFRESH_MARGIN` before its expiry (half its
    /// lifetime if shorter); an error if it has already expired.
    fn received(fetched: Fetched, now: Instant) -> Result<Self, FetchError> {
        let lifetime = fetched.expires_at.saturating_duration_since(now);
        if lifetime.is_zero() {
            return Err(FetchError::transient(format!(
                "the token source handed out a token that had already expired (at {}, by this \
                 machine's clock)",
                fetched.expires_on
            )));
        }
        Ok(Cached {
            token: fetched.token,
            expires_on: fetched.expires_on,
            refresh_at: fetched.expires_at - REFRESH_MARGIN.min(lifetime / 2),
            expires_at: fetched.expires_at,
        })
    }

    fn handed_out(&self) -> (Secret, OffsetDateTime) {
        (self.token.clone(), self.expires_on)
    }
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
        let fetch = || async { Cached::received(self.fetch.fetch().await?, Instant::now()) };
        let worth_retrying = |e: &FetchError| e.transient;
        let failure = match retry(&self.backoff, FullJitter, fetch, worth_retrying).await {
            Ok(fresh) => {
                let token = fresh.handed_out();
                *self.cached.write().expect("not poisoned") = Some(fresh);
                return Ok(token);
            }
            Err(failure) => failure,
        };
        let attempts = failure.attempts;
        let error = failure.into_error();
        if let Some(token) = self.keep_after_failure(&error) {
            return Ok(token);
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

    /// After a failed refresh: the cached token if it is still valid, to be refreshed again
    /// `RETRY_REFRESH_AFTER` from now, or when it expires if that is sooner.
    fn keep_after_failure(&self, error: &FetchError) -> Option<(Secret, OffsetDateTime)> {
        let now = Instant::now();
        let mut cached = self.cached.write().expect("not poisoned");
        let c = cached.as_mut().filter(|c| now < c.expires_at)?;
        c.refresh_at = (now + RETRY_REFRESH_AFTER).min(c.expires_at);
        tracing::warn!(
            connection = %self.connection,
            credential = self.credential,
            "storage token refresh failed, using the current token until it expires: {}",
            error.message
        );
        Some(c.handed_out())
    }

    /// The cached token if it needs no refresh yet.
    fn current(&self) -> Option<(Secret, OffsetDateTime)> {
        let cached = self.cached.read().expect("not poisoned");
        let c = cached.as_ref()?;
        (Instant::now() < c.refresh_at).then(|| c.handed_out())
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
pub(crate) mod tests;
