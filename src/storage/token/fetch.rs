//! Where a keyless connection's tokens come from: one [`TokenFetch`] per [`TokenSource`], each
//! classifying its failures as transient (retried by the provider) or permanent.
//!
//! - Managed identity: our own client of the platform's identity endpoint (see the parent
//!   module for why not `azure_identity`'s): App Service/Functions `IDENTITY_ENDPOINT` +
//!   `IDENTITY_HEADER`, else IMDS at `AZURE_POD_IDENTITY_AUTHORITY_HOST` (see [`imds_endpoint`]).
//! - Client secret, workload identity, Azure CLI: `azure_identity` 0.21's credentials. The HTTP
//!   ones go through [`EndpointClient`], which turns every non-2xx answer into a [`FetchError`]
//!   before the credential sees it (the credentials fold every failure into one `Credential`
//!   error kind, so transient could not be told from permanent), and they only talk to an https
//!   authority host ([`authority_host`]): the client secret and federated token go there.
//!
//! Invariants:
//! - No token, client secret, federated token or identity header ever appears in a
//!   [`FetchError`]: messages quote the endpoint URL (no query) and the answer's error code and
//!   first line of description, never a request or a response body.
//! - Every fetch is bounded in time ([`ENDPOINT_TIMEOUT`] per request, [`FETCH_TIMEOUT`] whole).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azure_core::auth::{Secret, TokenCredential};
use azure_core::error::ErrorKind;
use time::OffsetDateTime;

use super::{FetchError, Fetched, TokenFetch, STORAGE_RESOURCE, STORAGE_SCOPE};
use crate::redact::error_chain;
use crate::redact::scrub;
use crate::storage::token_source::{ManagedIdentityEndpoint, ManagedIdentityId, TokenSource};

/// One request to an identity or token endpoint.
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(20);
/// One whole fetch (the Azure CLI starts a process, which may take seconds).
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// IMDS's token path, below `http://169.254.169.254` or the override's host.
const IMDS_TOKEN_PATH: &str = "/metadata/identity/oauth2/token";
const IMDS_HOST: &str = "http://169.254.169.254";
/// The environment variable the Azure SDKs (MSAL, azure-identity for .NET/Python/JS) read to
/// point IMDS elsewhere (AAD Pod Identity's NMI, tests); its value is a scheme and host.
pub(crate) const IMDS_HOST_ENV: &str = "AZURE_POD_IDENTITY_AUTHORITY_HOST";
/// The environment variable `azure_identity` (and every Azure SDK) reads for the Entra ID
/// authority host of sovereign clouds.
pub(crate) const AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";
const PUBLIC_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";

/// A connection's way to fetch tokens, its credential's name, and what to check when it is
/// refused (the settings that make it).
pub(crate) struct Source {
    pub credential: &'static str,
    pub hint: String,
    pub fetch: Box<dyn TokenFetch>,
}

/// The [`Source`] of connection `connection`'s tokens, requests going out over `http`.
pub(crate) fn source(connection: &str, source: &TokenSource, http: &reqwest::Client) -> Source {
    let key = |suffix: &str| format!("{connection}__{suffix}");
    match source {
        TokenSource::ManagedIdentity { endpoint, id } => Source {
            credential: "managedidentity",
            hint: match id {
                ManagedIdentityId::System => format!(
                    "check that the app has a system-assigned managed identity, or name a \
                     user-assigned one in {} or {}",
                    key("clientId"),
                    key("managedIdentityResourceId")
                ),
                ManagedIdentityId::ClientId(_) => format!(
                    "check {}: it must name a user-assigned identity assigned to the app",
                    key("clientId")
                ),
                ManagedIdentityId::ResourceId(_) => format!(
                    "check {}: it must name a user-assigned identity assigned to the app",
                    key("managedIdentityResourceId")
                ),
            },
            fetch: Box::new(ManagedIdentityFetch::new(http, endpoint, id)),
        },
        TokenSource::ClientSecret {
            tenant_id,
            client_id,
            client_secret,
        } => Source {
            credential: "clientsecret",
            hint: format!(
                "check {}, {} and {}",
                key("tenantId"),
                key("clientId"),
                key("clientSecret")
            ),
            fetch: match authority_host() {
                Ok(authority) => Box::new(SdkFetch(Arc::new(
                    azure_identity::ClientSecretCredential::new(
                        Arc::new(EndpointClient(http.clone())),
                        authority,
                        tenant_id.clone(),
                        client_id.clone(),
                        client_secret.clone(),
                    ),
                ))),
                Err(refused) => Box::new(Refused(refused)),
            },
        },
        TokenSource::WorkloadIdentity {
            tenant_id,
            client_id,
            token_file,
        } => Source {
            credential: "workloadidentity",
            hint: format!(
                "check {} (or AZURE_TENANT_ID), {} (or AZURE_CLIENT_ID), the file in \
                 AZURE_FEDERATED_TOKEN_FILE and the app registration's federated credential",
                key("tenantId"),
                key("clientId")
            ),
            fetch: match authority_host() {
                Ok(authority) => Box::new(WorkloadIdentityFetch {
                    http: Arc::new(EndpointClient(http.clone())),
                    authority,
                    tenant_id: tenant_id.clone(),
                    client_id: client_id.clone(),
                    token_file: token_file.clone(),
                }),
                Err(refused) => Box::new(Refused(refused)),
            },
        },
        TokenSource::AzureCli => Source {
            credential: "azurecli",
            hint: "sign in with `az login` (the Azure CLI must be on PATH)".into(),
            fetch: Box::new(SdkFetch(
                Arc::new(azure_identity::AzureCliCredential::new()),
            )),
        },
    }
}

/// IMDS's token endpoint: `http://169.254.169.254`, or the host in
/// `AZURE_POD_IDENTITY_AUTHORITY_HOST` (honoured as the Azure SDKs do), then IMDS's token path.
fn imds_endpoint() -> String {
    imds_endpoint_at(std::env::var(IMDS_HOST_ENV).ok())
}

fn imds_endpoint_at(host: Option<String>) -> String {
    let host = host
        .map(|h| h.trim().trim_end_matches('/').to_string())
        .filter(|h| !h.is_empty());
    format!("{}{IMDS_TOKEN_PATH}", host.as_deref().unwrap_or(IMDS_HOST))
}

/// The Entra ID authority host: `AZURE_AUTHORITY_HOST` (sovereign clouds), else the public
/// cloud's. Only https: the client secret and the federated token are sent there.
fn authority_host() -> Result<azure_core::Url, FetchError> {
    authority_host_from(std::env::var(AUTHORITY_HOST_ENV).ok())
}

fn authority_host_from(value: Option<String>) -> Result<azure_core::Url, FetchError> {
    let value = value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty());
    let Some(value) = value else {
        return Ok(azure_core::Url::parse(PUBLIC_AUTHORITY_HOST).expect("a static URL"));
    };
    match azure_core::Url::parse(&value) {
        Ok(url) if url.scheme() == "https" && url.has_host() => Ok(url),
        _ => Err(FetchError::permanent(format!(
            "{AUTHORITY_HOST_ENV} `{value}` is not an https URL (the client secret or federated \
             token is only ever sent over https)"
        ))),
    }
}

/// A source that cannot work (its configuration was refused when it was built).
struct Refused(FetchError);

#[async_trait]
impl TokenFetch for Refused {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        Err(self.0.clone())
    }
}

/// `azure_identity`'s HTTP client: our pooled client (which trusts `SSL_CERT_FILE`), each
/// request bounded by [`ENDPOINT_TIMEOUT`], and every failure a [`FetchError`] inside the
/// `azure_core::Error` the credential wraps: a non-2xx answer (never handed to the credential,
/// so its flows neither parse nor log the body) is transient for 408, 429 and 5xx.
#[derive(Debug)]
struct EndpointClient(reqwest::Client);

#[async_trait]
impl azure_core::HttpClient for EndpointClient {
    async fn execute_request(
        &self,
        request: &azure_core::Request,
    ) -> azure_core::Result<azure_core::Response> {
        let mut url = request.url().clone();
        url.set_query(None);
        let unanswered = |why: String| {
            azure_core::Error::new(
                ErrorKind::Io,
                FetchError::transient(format!("the token endpoint {url} did not answer ({why})")),
            )
        };
        let response = tokio::time::timeout(ENDPOINT_TIMEOUT, self.0.execute_request(request))
            .await
            .map_err(|_| unanswered(format!("no answer within {ENDPOINT_TIMEOUT:?}")))?
            .map_err(|e| unanswered(scrub(&error_chain(&e))))?;
        let status = u16::from(response.status());
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let (status_code, _, body) = response.deconstruct();
        let body = body.collect().await.unwrap_or_default();
        let (code, detail) = error_detail(&body);
        let failure = FetchError {
            transient: matches!(status, 408 | 429) || status >= 500,
            message: format!("the token endpoint {url} answered {status} {detail}")
                .trim()
                .to_string(),
        };
        Err(azure_core::Error::new(
            ErrorKind::http_response(status_code, code),
            failure,
        ))
    }
}

/// An `azure_identity` credential, its errors classified for retry.
struct SdkFetch(Arc<dyn TokenCredential>);

#[async_trait]
impl TokenFetch for SdkFetch {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        // Ours is the cache: never serve the credential's own stale entry.
        let _ = self.0.clear_cache().await;
        let token = tokio::time::timeout(FETCH_TIMEOUT, self.0.get_token(&[STORAGE_SCOPE]))
            .await
            .map_err(|_| FetchError::transient(format!("no token within {FETCH_TIMEOUT:?}")))?
            .map_err(sdk_error)?;
        Ok(Fetched::expiring_on(token.token, token.expires_on))
    }
}

/// The [`EndpointClient`]'s verdict if the error carries one; else the SDK's own error (the
/// Azure CLI's: a failed `az` is permanent, it retries the network itself), secrets redacted.
fn sdk_error(error: azure_core::Error) -> FetchError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(e) = cause {
        if let Some(verdict) = e.downcast_ref::<FetchError>() {
            return verdict.clone();
        }
        cause = e.source();
    }
    FetchError {
        transient: matches!(error.kind(), ErrorKind::Io),
        message: scrub(&error_chain(&error)),
    }
}

/// Workload identity: the federated token file is re-read at every fetch (the platform rotates
/// it), then exchanged by `azure_identity`'s `WorkloadIdentityCredential`.
struct WorkloadIdentityFetch {
    http: Arc<EndpointClient>,
    authority: azure_core::Url,
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
            self.http.clone(),
            self.authority.clone(),
            self.tenant_id.clone(),
            self.client_id.clone(),
            assertion.trim().to_string(),
        );
        SdkFetch(Arc::new(credential)).fetch().await
    }
}

/// Managed identity over the platform's identity endpoint (`url`: App Service's, or IMDS's).
struct ManagedIdentityFetch {
    http: reqwest::Client,
    url: String,
    endpoint: ManagedIdentityEndpoint,
    id: ManagedIdentityId,
}

impl ManagedIdentityFetch {
    fn new(
        http: &reqwest::Client,
        endpoint: &ManagedIdentityEndpoint,
        id: &ManagedIdentityId,
    ) -> Self {
        ManagedIdentityFetch {
            http: http.clone(),
            url: match endpoint {
                ManagedIdentityEndpoint::AppService { endpoint, .. } => endpoint.clone(),
                ManagedIdentityEndpoint::Imds => imds_endpoint(),
            },
            endpoint: endpoint.clone(),
            id: id.clone(),
        }
    }
}

#[async_trait]
impl TokenFetch for ManagedIdentityFetch {
    async fn fetch(&self) -> Result<Fetched, FetchError> {
        let url = self.url.as_str();
        let (api_version, header, resource_id) = match &self.endpoint {
            ManagedIdentityEndpoint::AppService { header, .. } => (
                "2019-08-01",
                ("x-identity-header", header.as_str()),
                "mi_res_id",
            ),
            // IMDS spells the resource id parameter differently.
            ManagedIdentityEndpoint::Imds => ("2018-02-01", ("metadata", "true"), "msi_res_id"),
        };
        let mut query = vec![("api-version", api_version), ("resource", STORAGE_RESOURCE)];
        match &self.id {
            ManagedIdentityId::System => {}
            ManagedIdentityId::ClientId(id) => query.push(("client_id", id)),
            ManagedIdentityId::ResourceId(id) => query.push((resource_id, id)),
        }
        let response = self
            .http
            .get(url)
            .query(&query)
            .header(header.0, header.1)
            .timeout(ENDPOINT_TIMEOUT)
            .send()
            .await
            .map_err(|e| {
                FetchError::transient(format!(
                    "the identity endpoint {url} did not answer ({})",
                    error_chain(&e)
                ))
            })?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| {
            FetchError::transient(format!(
                "the identity endpoint {url} answer was cut short ({})",
                error_chain(&e)
            ))
        })?;
        if !(200..300).contains(&status) {
            let (_, detail) = error_detail(&body);
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

/// An error answer's code (`{"error": "code"}` or `{"error": {"code": ...}}`) and
/// `"code description"` (the description's first line: Entra ID adds trace ids below it), never
/// the body whole.
fn error_detail(body: &[u8]) -> (Option<String>, String) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return (None, String::new());
    };
    let text = |v: Option<&serde_json::Value>| {
        v.and_then(|x| x.as_str())
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let code = match value.get("error") {
        Some(serde_json::Value::Object(o)) => text(o.get("code")),
        other => text(other),
    };
    let detail = format!("{code} {}", text(value.get("error_description")))
        .trim()
        .to_string();
    ((!code.is_empty()).then_some(code), scrub(&detail))
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
    let token = Secret::new(token.to_string());
    match (number("expires_on"), number("expires_in")) {
        (Some(on), _) => Ok(Fetched::expiring_on(
            token,
            OffsetDateTime::from_unix_timestamp(on).map_err(|_| "a bad expires_on")?,
        )),
        // A negative lifetime is an expired token, which the provider refuses.
        (None, Some(seconds)) => Ok(Fetched::expiring_in(
            token,
            Duration::from_secs(seconds.max(0).unsigned_abs()),
        )),
        (None, None) => Err("no expires_on".into()),
    }
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
