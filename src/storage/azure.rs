//! What the Azure table and queue adapters share: the SDK's client options and pipeline over the
//! account's pooled client, counting and retrying each attempt, and turning SDK errors into
//! [`StorageError`]s without leaking secrets.
//!
//! Invariants:
//! - SDK clients send through the account's one pooled HTTP client, with the SDK's own retry off:
//!   every attempt goes through [`Service::attempts`], which counts it and retries only transient
//!   failures under the account's policy.
//! - Error responses reach the SDK's error type with the service's error code and message, whether
//!   the service put them in a header or only in the body ([`ErrorDetailsTransport`]).
//! - No text made here carries a credential ([`crate::redact::scrub`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use azure_core::error::ErrorKind;
use azure_core::headers::{Headers, ERROR_CODE};
use azure_core::{
    BytesStream, ClientOptions, CollectedResponse, Context, HttpClient, Method, Pipeline, Policy,
    PolicyResult, Request, Response, RetryOptions, TransportOptions, Url,
};
use azure_storage::clients::ServiceType;
use bytes::Bytes;

use crate::redact::{error_chain, scrub};

use super::auth::{sdk_credentials, token_connection, with_role_hint};
use super::connection::StorageAccount;
use super::request_counts::{RequestCounters, RequestKind};
use super::retry_policy::{retry, RetryPolicy};
use super::{StorageError, StorageErrorKind, StorageResult};

/// SDK client options for an account: its shared pooled client, and no SDK retries (we retry and
/// count).
pub(crate) fn client_options(account: &StorageAccount) -> ClientOptions {
    let client: Arc<dyn HttpClient> = account.http().clone();
    let transport = Arc::new(ErrorDetailsTransport { client });
    ClientOptions::default()
        .retry(RetryOptions::none())
        .transport(TransportOptions::new_custom_policy(transport))
}

/// The per-service plumbing both adapters use.
#[derive(Clone)]
pub(crate) struct Service {
    pipeline: Pipeline,
    service_type: ServiceType,
    /// Service base URL without a trailing slash.
    pub(crate) base: String,
    counters: Arc<RequestCounters>,
    retry: RetryPolicy,
    /// A keyless account's connection name: its RBAC 403s name the role it needs.
    token_connection: Option<String>,
}

impl Service {
    pub(crate) fn new(
        account: &StorageAccount,
        service_type: ServiceType,
        base: &str,
        counters: Arc<RequestCounters>,
    ) -> Self {
        Service {
            pipeline: azure_storage::clients::new_pipeline_from_options(
                client_options(account),
                sdk_credentials(account),
            ),
            service_type,
            base: base.to_string(),
            counters,
            retry: account.retry_policy(),
            token_connection: token_connection(account),
        }
    }

    /// Runs `op` under the retry policy, counting every attempt as one request of `kind`.
    pub(crate) async fn attempts<T, F, Fut>(&self, kind: RequestKind, mut op: F) -> StorageResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StorageResult<T>>,
    {
        retry(&self.retry, || {
            self.counters.record(kind);
            op()
        })
        .await
        .map_err(|error| match &self.token_connection {
            Some(connection) => with_role_hint(error, connection, self.service_type),
            None => error,
        })
    }

    /// Sends one request we built ourselves through the signing pipeline and collects the body.
    /// Non-2xx statuses come back as `Err` (the SDK's no-retry policy does that).
    pub(crate) async fn send_raw(
        &self,
        method: Method,
        url: Url,
        headers: Headers,
        body: Option<Bytes>,
    ) -> azure_core::Result<CollectedResponse> {
        let mut request =
            azure_storage::clients::finalize_request(url, method, headers, body.map(Into::into))?;
        let mut context = Context::new();
        context.insert(self.service_type);
        let response = self.pipeline.send(&context, &mut request).await?;
        CollectedResponse::from_response(response).await
    }

    /// `base` + `/` + an already percent-encoded path.
    pub(crate) fn url(&self, encoded_path: &str) -> StorageResult<Url> {
        Url::parse(&format!("{}/{}", self.base, encoded_path))
            .map_err(|e| StorageError::invalid_input(format!("cannot build a request URL: {e}")))
    }
}

/// The pipeline's last policy: sends with our pooled client and, for error responses, lifts the
/// Table service's `{"odata.error":{"code","message":{"value"}}}` body into the form the SDK's error
/// type reads (`x-ms-error-code` header, `{"error":{"code","message"}}` body). Without this, crate
/// operations lose the error code whenever the service puts it only in the body (Azurite does for
/// 400s) and every table error message.
#[derive(Debug)]
struct ErrorDetailsTransport {
    client: Arc<dyn HttpClient>,
}

impl Policy for ErrorDetailsTransport {
    // `Policy` is an `async_trait`; this is its desugared form.
    fn send<'a, 'b, 'c, 'd, 't>(
        &'a self,
        _ctx: &'b Context,
        request: &'c mut Request,
        _next: &'d [Arc<dyn Policy>],
    ) -> Pin<Box<dyn Future<Output = PolicyResult> + Send + 't>>
    where
        'a: 't,
        'b: 't,
        'c: 't,
        'd: 't,
        Self: 't,
    {
        Box::pin(async move {
            let response = self.client.execute_request(request).await?;
            if response.status().is_success() {
                return Ok(response);
            }
            let (status, mut headers, body) = response.deconstruct();
            let mut bytes = body.collect().await?;
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
                if let Some(error) = value.get("odata.error") {
                    let code = error
                        .get("code")
                        .and_then(|c| c.as_str())
                        .map(str::to_string);
                    let message = error
                        .get("message")
                        .and_then(|m| m.get("value").or(Some(m)))
                        .and_then(|m| m.as_str())
                        .map(str::to_string);
                    if let (Some(code), None) = (&code, headers.get_optional_str(&ERROR_CODE)) {
                        headers.insert(ERROR_CODE, code.clone());
                    }
                    let normalized =
                        serde_json::json!({"error": {"code": code, "message": message}});
                    bytes = serde_json::to_vec(&normalized).unwrap_or_default().into();
                    headers.insert("content-type", "application/json");
                }
            }
            Ok(Response::new(
                status,
                headers,
                Box::pin(BytesStream::new(bytes)),
            ))
        })
    }
}

/// Maps an SDK error: HTTP statuses with the service's error code, I/O (timeouts, resets,
/// refused connections) as transient, anything else as an unusable response.
pub(crate) fn map_sdk_error(operation: &str, error: azure_core::Error) -> StorageError {
    match error.kind() {
        ErrorKind::HttpResponse { status, error_code } => {
            let status = u16::from(*status);
            let detail = error
                .as_http_error()
                .and_then(|h| h.error_message())
                .map(first_line);
            let message = match detail {
                Some(detail) => format!("{operation} failed: {detail}"),
                None => format!("{operation} failed"),
            };
            StorageError::from_status(status, error_code.clone(), scrub(&message))
        }
        ErrorKind::Io => StorageError::new(
            StorageErrorKind::Transient,
            scrub(&format!("{operation} failed: {}", error_chain(&error))),
        ),
        // The SDK's bearer policy wraps every token failure as a credential error; the provider's
        // transient ones (I/O inside) stay transient, so a later attempt may succeed.
        ErrorKind::Credential if wraps_io(&error) => StorageError::new(
            StorageErrorKind::Transient,
            scrub(&format!(
                "{operation}: credential error: {}",
                error_chain(&error)
            )),
        ),
        ErrorKind::Credential => StorageError::new(
            StorageErrorKind::Rejected,
            scrub(&format!(
                "{operation}: credential error: {}",
                error_chain(&error)
            )),
        ),
        _ => {
            StorageError::invalid_response(scrub(&format!("{operation}: {}", error_chain(&error))))
        }
    }
}

/// Whether an SDK error wraps an I/O error (a transient token failure: see
/// `token::TokenProvider`'s `TokenCredential`).
fn wraps_io(error: &azure_core::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(inner) = cause.downcast_ref::<azure_core::Error>() {
            if matches!(inner.kind(), ErrorKind::Io) {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for key literals in URLs.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths' errors pass through `attempts`: a keyless account's RBAC 403 gains its
    /// connection and role there (the mapping itself: `auth`'s test), a keyed account's does not.
    #[tokio::test]
    async fn attempts_add_the_role_hint_for_keyless_accounts_only() {
        use crate::storage::connection_string::{ConnectionSettings, Credential};
        use crate::storage::token_source::{
            ManagedIdentityEndpoint, ManagedIdentityId, TokenSource,
        };
        let mut settings = ConnectionSettings::development();
        settings.credential = Credential::Token {
            connection: "Dst".into(),
            source: TokenSource::ManagedIdentity {
                endpoint: ManagedIdentityEndpoint::Imds,
                id: ManagedIdentityId::System,
            },
        };
        let (provider, _) = crate::storage::token::tests::fake_provider("tok", 3600);
        let keyless = StorageAccount::new(settings).with_token_provider(provider);
        let keyed = StorageAccount::new(ConnectionSettings::development());
        for (account, service_type, hint) in [
            (
                &keyless,
                ServiceType::Queue,
                Some("Storage Queue Data Contributor"),
            ),
            (
                &keyless,
                ServiceType::Table,
                Some("Storage Table Data Contributor"),
            ),
            (&keyed, ServiceType::Table, None),
        ] {
            let service = Service::new(
                account,
                service_type,
                "https://a.example",
                Arc::new(RequestCounters::new()),
            );
            let error = service
                .attempts(RequestKind::Query, || async {
                    Err::<(), _>(StorageError::from_status(
                        403,
                        Some("AuthorizationPermissionMismatch".into()),
                        "op failed",
                    ))
                })
                .await
                .unwrap_err();
            match hint {
                Some(role) => assert!(
                    error.message.contains("connection Dst") && error.message.contains(role),
                    "{error}"
                ),
                None => assert!(!error.message.contains("connection"), "{error}"),
            }
        }
    }

    /// As the SDK's bearer policy wraps what `TokenProvider::get_token` returns.
    #[test]
    fn token_failures_wrapped_by_the_sdk_keep_their_verdict() {
        use azure_core::error::ResultExt;
        let wrapped = |kind: ErrorKind| {
            Err::<(), _>(azure_core::Error::message(
                kind,
                "no storage token for connection Src",
            ))
            .context(ErrorKind::Credential, "failed to get bearer token")
            .unwrap_err()
        };
        let transient = map_sdk_error("create queue q", wrapped(ErrorKind::Io));
        assert_eq!(transient.kind, StorageErrorKind::Transient, "{transient}");
        assert!(transient.message.contains("connection Src"), "{transient}");
        let permanent = map_sdk_error("create queue q", wrapped(ErrorKind::Credential));
        assert_eq!(permanent.kind, StorageErrorKind::Rejected, "{permanent}");
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved() {
        assert_eq!(percent_encode("a'b c"), "a%27b%20c");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode("\u{FFFF}"), "%EF%BF%BF");
        assert_eq!(percent_encode("Az09-._~"), "Az09-._~");
        assert_eq!(percent_encode("%+/(),="), "%25%2B%2F%28%29%2C%3D");
    }
}
