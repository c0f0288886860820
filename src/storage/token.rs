//! Entra ID tokens for `https://storage.azure.com/`: one cached, single-flight [`TokenProvider`]
//! per keyless connection, shared by the signed data path and the SDK clients (as their
//! `TokenCredential`).
//!
//! Where tokens come from ([`TokenSource`], read by `app_settings`):
//! - managed identity: our own small client of the platform's identity endpoint (App Service/
//!   Functions `IDENTITY_ENDPOINT` + `IDENTITY_HEADER`, else IMDS). `azure_identity` 0.21 is not
//!   used here because its App Service credential cannot ask for a user-assigned identity (it
//!   hard-codes the system-assigned one), reads the endpoint and header from the process
//!   environment rather than our parsed settings, and folds 5xx/gateway answers into one
//!   `Credential` error kind, so transient failures cannot be told from permanent ones to retry;
//! - client secret, workload identity (the federated token file re-read at every fetch, as the
//!   platform rotates it) and the Azure CLI: `azure_identity` 0.21's credentials.
//!
//! Invariants:
//! - At most one fetch per provider is in flight; callers meanwhile wait for its result.
//! - A token is refreshed `REFRESH_MARGIN` before it expires (half its lifetime if shorter); a
//!   failed refresh while the old token is still valid keeps using it and tries again later.
//! - Transient failures (connection errors, timeouts, 404/410/429/5xx from the identity endpoint)
//!   are retried with backoff ([`crate::retry`]); the error that surfaces names the connection.
//! - No token, client secret or identity header ever appears in `Debug`, logs or errors.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::auth::{AccessToken, Secret, TokenCredential};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::app_settings::{ManagedIdentityEndpoint, ManagedIdentityId, TokenSource};
use crate::retry::{retry, Backoff, FullJitter};

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
/// IMDS (not the App Service endpoint, which `IDENTITY_ENDPOINT` names).
const IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

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
#[derive(Debug, Clone, PartialEq, Eq)]
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
        let (credential, fetch): (&'static str, Box<dyn TokenFetch>) = match source {
            TokenSource::ManagedIdentity { endpoint, id } => (
                "managedidentity",
                Box::new(ManagedIdentityFetch {
                    http: http.clone(),
                    endpoint: endpoint.clone(),
                    id: id.clone(),
                }),
            ),
            TokenSource::ClientSecret {
                tenant_id,
                client_id,
                client_secret,
            } => (
                "clientsecret",
                Box::new(SdkFetch(Arc::new(
                    azure_identity::ClientSecretCredential::new(
                        Arc::new(http.clone()),
                        authority_host(),
                        tenant_id.clone(),
                        client_id.clone(),
                        client_secret.clone(),
                    ),
                ))),
            ),
            TokenSource::WorkloadIdentity {
                tenant_id,
                client_id,
                token_file,
            } => (
                "workloadidentity",
                Box::new(WorkloadIdentityFetch {
                    http: http.clone(),
                    tenant_id: tenant_id.clone(),
                    client_id: client_id.clone(),
                    token_file: token_file.clone(),
                }),
            ),
            TokenSource::AzureCli => (
                "azurecli",
                Box::new(SdkFetch(
                    Arc::new(azure_identity::AzureCliCredential::new()),
                )),
            ),
        };
        Self::with_fetch(connection, credential, fetch, FETCH_BACKOFF)
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
                Err(TokenError {
                    connection: self.connection.clone(),
                    credential: self.credential,
                    transient: error.transient,
                    message: error.message,
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

/// `AZURE_AUTHORITY_HOST` (sovereign clouds), else the public cloud's login endpoint.
fn authority_host() -> azure_core::Url {
    azure_identity::TokenCredentialOptions::default()
        .authority_host()
        .unwrap_or_else(|_| {
            azure_core::Url::parse("https://login.microsoftonline.com").expect("a static URL")
        })
}

/// An `azure_identity` credential, its errors classified for retry.
struct SdkFetch(Arc<dyn TokenCredential>);

#[async_trait]
impl TokenFetch for SdkFetch {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        // Ours is the cache: never serve the credential's own stale entry.
        let _ = self.0.clear_cache().await;
        let token = self
            .0
            .get_token(&[STORAGE_SCOPE])
            .await
            .map_err(sdk_error)?;
        Ok(Fetched {
            token: token.token,
            expires_on: token.expires_on,
        })
    }
}

fn sdk_error(error: azure_core::Error) -> FetchError {
    use azure_core::error::ErrorKind;
    let transient = match error.kind() {
        ErrorKind::Io => true,
        ErrorKind::HttpResponse { status, .. } => {
            let status = u16::from(*status);
            status == 408 || status == 429 || status >= 500
        }
        _ => false,
    };
    FetchError {
        transient,
        message: super::azure::redact(&error.to_string()),
    }
}

/// Workload identity: the federated token file is re-read at every fetch (the platform rotates
/// it), then exchanged by `azure_identity`'s `WorkloadIdentityCredential`.
struct WorkloadIdentityFetch {
    http: reqwest::Client,
    tenant_id: String,
    client_id: String,
    token_file: String,
}

#[async_trait]
impl TokenFetch for WorkloadIdentityFetch {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        let assertion = std::fs::read_to_string(&self.token_file).map_err(|e| {
            FetchError::permanent(format!(
                "cannot read the federated token file {} ({e})",
                self.token_file
            ))
        })?;
        let credential = azure_identity::WorkloadIdentityCredential::new(
            Arc::new(self.http.clone()),
            authority_host(),
            self.tenant_id.clone(),
            self.client_id.clone(),
            assertion.trim().to_string(),
        );
        SdkFetch(Arc::new(credential)).fetch().await
    }
}

/// Managed identity over the platform's identity endpoint (see the module docs for why not
/// `azure_identity`'s).
struct ManagedIdentityFetch {
    http: reqwest::Client,
    endpoint: ManagedIdentityEndpoint,
    id: ManagedIdentityId,
}

#[async_trait]
impl TokenFetch for ManagedIdentityFetch {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        let (url, api_version, header) = match &self.endpoint {
            ManagedIdentityEndpoint::AppService { endpoint, header } => (
                endpoint.as_str(),
                "2019-08-01",
                ("x-identity-header", header.as_str()),
            ),
            ManagedIdentityEndpoint::Imds => (IMDS_ENDPOINT, "2018-02-01", ("metadata", "true")),
        };
        let mut query = vec![("api-version", api_version), ("resource", STORAGE_RESOURCE)];
        match &self.id {
            ManagedIdentityId::System => {}
            ManagedIdentityId::ClientId(id) => query.push(("client_id", id)),
            ManagedIdentityId::ResourceId(id) => query.push(("mi_res_id", id)),
        }
        if let (ManagedIdentityEndpoint::Imds, Some(last)) = (&self.endpoint, query.last_mut()) {
            // IMDS spells the resource id parameter differently.
            if last.0 == "mi_res_id" {
                last.0 = "msi_res_id";
            }
        }
        let response = self
            .http
            .get(url)
            .query(&query)
            .header(header.0, header.1)
            .timeout(Duration::from_secs(20))
            .send()
            .await
            .map_err(|e| {
                FetchError::transient(format!(
                    "the identity endpoint {url} did not answer ({})",
                    super::azure::error_chain(&e)
                ))
            })?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| {
            FetchError::transient(format!(
                "the identity endpoint {url} answer was cut short ({})",
                super::azure::error_chain(&e)
            ))
        })?;
        if !(200..300).contains(&status) {
            // The error's code and description, never the body whole.
            let detail = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .map(|v| {
                    let field =
                        |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
                    let code = match v.get("error") {
                        Some(serde_json::Value::Object(o)) => o
                            .get("code")
                            .and_then(|x| x.as_str())
                            .unwrap_or("")
                            .to_string(),
                        _ => field("error"),
                    };
                    format!("{code} {}", field("error_description"))
                        .trim()
                        .to_string()
                })
                .unwrap_or_default();
            let transient = matches!(status, 404 | 408 | 410 | 429) || status >= 500;
            return Err(FetchError {
                transient,
                message: format!("the identity endpoint {url} answered {status} {detail}")
                    .trim()
                    .to_string(),
            });
        }
        parse_token_response(&body)
            .map_err(|m| FetchError::permanent(format!("the identity endpoint {url} answered {m}")))
    }
}

/// `{"access_token": "...", "expires_on": "1700000000" | 1700000000, ...}` (or `expires_in`).
fn parse_token_response(body: &[u8]) -> Result<Fetched, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "something that is not JSON".to_string())?;
    let token = value
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or("no access_token")?;
    let number = |key: &str| {
        value.get(key).and_then(|v| match v {
            serde_json::Value::Number(n) => n.as_i64(),
            serde_json::Value::String(s) => s.trim().parse().ok(),
            _ => None,
        })
    };
    let expires_on = match (number("expires_on"), number("expires_in")) {
        (Some(on), _) => OffsetDateTime::from_unix_timestamp(on).map_err(|_| "a bad expires_on")?,
        (None, Some(seconds)) => OffsetDateTime::now_utc() + time::Duration::seconds(seconds),
        (None, None) => return Err("no expires_on".into()),
    };
    Ok(Fetched {
        token: Secret::new(token.to_string()),
        expires_on,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

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
    fn token_responses_parse_and_errors_carry_no_token() {
        let t = parse_token_response(
            br#"{"access_token":"eyJ0eXAi","expires_on":"1900000000","resource":"https://storage.azure.com/","token_type":"Bearer"}"#,
        )
        .unwrap();
        assert_eq!(t.token.secret(), "eyJ0eXAi");
        assert_eq!(t.expires_on.unix_timestamp(), 1_900_000_000);
        let n = parse_token_response(br#"{"access_token":"a","expires_on":1900000001}"#).unwrap();
        assert_eq!(n.expires_on.unix_timestamp(), 1_900_000_001);
        let e = parse_token_response(br#"{"access_token":"eyJ0eXAi"}"#).unwrap_err();
        assert!(!e.contains("eyJ0eXAi"), "{e}");
        assert!(parse_token_response(b"<html>").is_err());
        let (provider, _) = fake_provider("eyJ0eXAi", 3600);
        assert!(!format!("{provider:?}").contains("eyJ0eXAi"));
    }

    /// Our managed-identity client against a fake App Service identity endpoint: the header and
    /// query it sends, user-assigned ids, and how answers are classified.
    #[tokio::test]
    async fn managed_identity_over_a_fake_app_service_endpoint() {
        use axum::extract::{Query, State};
        use axum::http::{HeaderMap, StatusCode};
        use std::collections::HashMap;

        type Seen = Arc<Mutex<Vec<HashMap<String, String>>>>;
        async fn token(
            State((seen, status)): State<(Seen, Arc<Mutex<u16>>)>,
            headers: HeaderMap,
            Query(query): Query<HashMap<String, String>>,
        ) -> (StatusCode, String) {
            let mut q = query.clone();
            q.insert(
                "header".into(),
                headers
                    .get("x-identity-header")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default(),
            );
            seen.lock().unwrap().push(q);
            let status = *status.lock().unwrap();
            if status != 200 {
                return (
                    StatusCode::from_u16(status).unwrap(),
                    r#"{"error":"invalid_request","error_description":"Identity not found"}"#
                        .into(),
                );
            }
            (StatusCode::OK, r#"{"access_token":"mi-token","expires_on":"1900000000","resource":"https://storage.azure.com/","token_type":"Bearer","client_id":"x"}"#.into())
        }
        let seen: Seen = Arc::default();
        let status = Arc::new(Mutex::new(200u16));
        let app = axum::Router::new()
            .route("/msi/token", axum::routing::get(token))
            .with_state((seen.clone(), status.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let fetch = |id: ManagedIdentityId| ManagedIdentityFetch {
            http: reqwest::Client::new(),
            endpoint: ManagedIdentityEndpoint::AppService {
                endpoint: format!("http://{address}/msi/token"),
                header: "hdr-secret".into(),
            },
            id,
        };
        let fetched = fetch(ManagedIdentityId::System).fetch().await.unwrap();
        assert_eq!(fetched.token.secret(), "mi-token");
        assert_eq!(fetched.expires_on.unix_timestamp(), 1_900_000_000);
        fetch(ManagedIdentityId::ClientId("cid".into()))
            .fetch()
            .await
            .unwrap();
        fetch(ManagedIdentityId::ResourceId("/sub/x".into()))
            .fetch()
            .await
            .unwrap();
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen[0]["api-version"], "2019-08-01");
            assert_eq!(seen[0]["resource"], STORAGE_RESOURCE);
            assert_eq!(seen[0]["header"], "hdr-secret");
            assert!(!seen[0].contains_key("client_id"));
            assert_eq!(seen[1]["client_id"], "cid");
            assert_eq!(seen[2]["mi_res_id"], "/sub/x");
        }
        for (code, transient) in [
            (400, false),
            (403, false),
            (404, true),
            (429, true),
            (500, true),
            (503, true),
        ] {
            *status.lock().unwrap() = code;
            let e = fetch(ManagedIdentityId::System).fetch().await.unwrap_err();
            assert_eq!(e.transient, transient, "{code}: {e:?}");
            assert!(
                e.message.contains(&format!(
                    "answered {code} invalid_request Identity not found"
                )),
                "{e:?}"
            );
            assert!(!e.message.contains("hdr-secret"), "{e:?}");
        }
        // Nobody listening: transient.
        let nobody = ManagedIdentityFetch {
            http: reqwest::Client::new(),
            endpoint: ManagedIdentityEndpoint::AppService {
                endpoint: "http://127.0.0.1:9/msi/token".into(),
                header: "hdr-secret".into(),
            },
            id: ManagedIdentityId::System,
        };
        let e = nobody.fetch().await.unwrap_err();
        assert!(e.transient && !e.message.contains("hdr-secret"), "{e:?}");
    }
}
