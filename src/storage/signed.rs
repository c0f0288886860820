//! Signed requests sent straight over the account's pooled HTTP client: the lean path for the
//! table data operations (queries, point reads, entity group transactions), which a copy makes
//! hundreds of times per 1,000 rows.
//!
//! The SDK pipeline costs about a third of the handler's CPU per request (six boxed policies,
//! header maps rebuilt at every step, the response re-collected); this path builds one request,
//! signs it exactly as `azure_storage`'s Table SharedKey policy does, and reads the body once.
//! Admin operations and the queue adapter stay on the SDK.
//!
//! Invariants:
//! - The client is built from a [`StorageAccount`] and shares its pooled HTTP client; it is
//!   authorized through [`super::auth`], like the SDK path (SharedKey, SAS or a bearer token), and
//!   sends the SDK's service version (2022-11-02, which accepts OAuth bearer tokens).
//! - One call is one attempt: retrying and counting are the adapter's.
//! - Every failure is a [`StorageError`] classified by status, with SAS signatures redacted from
//!   its text; a 2xx is returned with its body read whole.

use std::time::SystemTime;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};

use super::auth::{Authorization, TableRequestToSign};
use super::connection::StorageAccount;
use super::token::TokenError;
use super::{StorageError, StorageErrorKind, StorageResult};
use crate::redact::error_chain;
use crate::redact::scrub;

/// The service version the SDK sends; requests of both paths agree.
const SERVICE_VERSION: &str = "2022-11-02";

/// One table service request, built by the adapter.
pub(crate) struct TableRequest<'a> {
    pub method: Method,
    /// Percent-encoded path below the service base, e.g. `Table()` or `$batch`.
    pub path: &'a str,
    /// Percent-encoded query string without `?` (may be empty).
    pub query: &'a str,
    pub content_type: &'a str,
    pub accept: &'a str,
    pub body: Option<Bytes>,
}

/// A 2xx response with its body read.
pub(crate) struct TableResponse {
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// The table service endpoint with its client and authorization.
#[derive(Clone)]
pub(crate) struct SignedTableClient {
    http: reqwest::Client,
    /// Service base URL without a trailing slash (`https://acct.table.core.windows.net`,
    /// `http://127.0.0.1:10002/devstoreaccount1`).
    base: String,
    /// The base's path (`""` or `/devstoreaccount1`), which the signature covers.
    base_path: String,
    authorization: Authorization,
}

impl SignedTableClient {
    /// The account's table endpoint, over the account's pooled client.
    pub(crate) fn new(account: &StorageAccount) -> Self {
        let base = account.table_endpoint().trim_end_matches('/').to_string();
        let base_path = reqwest::Url::parse(&base)
            .map(|u| u.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        SignedTableClient {
            http: reqwest::Client::clone(account.http()),
            base,
            base_path,
            authorization: Authorization::new(account),
        }
    }

    /// Sends one attempt. Non-2xx answers become [`StorageError`]s carrying the service's error
    /// code and first message line; connection failures and timeouts are transient.
    pub(crate) async fn send(
        &self,
        request: TableRequest<'_>,
        operation: impl Fn() -> String,
    ) -> StorageResult<TableResponse> {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let mut url =
            String::with_capacity(self.base.len() + request.path.len() + request.query.len() + 2);
        url.push_str(&self.base);
        url.push('/');
        url.push_str(request.path);
        if !request.query.is_empty() {
            url.push('?');
            url.push_str(request.query);
        }
        let authorization = self
            .authorization
            .authorize(
                &TableRequestToSign {
                    method: &request.method,
                    content_type: request.content_type,
                    date: &date,
                    base_path: &self.base_path,
                    path: request.path,
                },
                &mut url,
                !request.query.is_empty(),
            )
            .await
            .map_err(|e| token_error(&operation, e))?;
        let mut builder = self.http.request(request.method.clone(), &url);
        if let Some(value) = authorization {
            // Marked sensitive: never shown by reqwest/hyper debug output.
            let mut value = HeaderValue::try_from(value).map_err(|_| {
                StorageError::invalid_input(format!(
                    "{} failed: the authorization is not a valid header value",
                    operation()
                ))
            })?;
            value.set_sensitive(true);
            builder = builder.header("authorization", value);
        }
        builder = builder
            .header("x-ms-date", &date)
            .header("x-ms-version", SERVICE_VERSION)
            .header("accept", request.accept)
            .header("dataserviceversion", "3.0")
            .header("maxdataserviceversion", "3.0;NetFx");
        if !request.content_type.is_empty() {
            builder = builder.header("content-type", request.content_type);
        }
        builder = match request.body {
            Some(body) => builder.body(body),
            None => builder.header("content-length", HeaderValue::from_static("0")),
        };
        let response = builder
            .send()
            .await
            .map_err(|e| transport_error(&operation, &e))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|e| transport_error(&operation, &e))?;
        if status.is_success() {
            return Ok(TableResponse { headers, body });
        }
        Err(error_response(status, &headers, &body, &operation()))
    }
}

/// No token for the request: transient if the identity endpoint may yet answer, else rejected
/// (no retry of the storage request can fix a credential that does not work).
fn token_error(operation: &impl Fn() -> String, error: TokenError) -> StorageError {
    let kind = if error.transient {
        StorageErrorKind::Transient
    } else {
        StorageErrorKind::Rejected
    };
    StorageError::new(kind, format!("{} failed: {error}", operation()))
}

/// A request that never got a whole answer: refused, reset, timed out — worth a retry — or one
/// that could not be built.
fn transport_error(operation: &impl Fn() -> String, error: &reqwest::Error) -> StorageError {
    let text = format!("{} failed: {}", operation(), error_chain(error));
    if error.is_builder() {
        // The request could not even be built (an invalid header value): retrying cannot help.
        return StorageError::invalid_input(scrub(&text));
    }
    // reqwest quotes the URL, which carries the SAS signature when one is used.
    StorageError::new(StorageErrorKind::Transient, scrub(&text))
}

/// The service's `{"odata.error":{"code","message":{"value"}}}` (or `x-ms-error-code`) as a
/// [`StorageError`] classified by status.
fn error_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    operation: &str,
) -> StorageError {
    let (mut code, message) = match odata_error_json(body) {
        Some((code, message)) => (
            code,
            message.lines().next().unwrap_or("").trim().to_string(),
        ),
        None => (None, String::new()),
    };
    if code.is_none() {
        code = headers
            .get("x-ms-error-code")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
    }
    let text = match message.as_str() {
        "" => format!(
            "{operation} failed: {}",
            status.canonical_reason().unwrap_or("error")
        ),
        detail => format!("{operation} failed: {detail}"),
    };
    StorageError::from_status(status.as_u16(), code, scrub(&text))
}

/// `(code, message)` from the service's `{"odata.error":{"code":..,"message":{"value":..}}}` (or
/// `{"error":{..}}`); `None` when the body is not JSON. A missing message is empty.
pub(crate) fn odata_error_json(body: &[u8]) -> Option<(Option<String>, String)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("odata.error").or_else(|| value.get("error"));
    let code = error
        .and_then(|e| e.get("code"))
        .and_then(|c| c.as_str())
        .map(str::to_string);
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.get("value").or(Some(m)))
        .and_then(|m| m.as_str())
        .unwrap_or("")
        .to_string();
    Some((code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_give_code_and_first_message_line() {
        let body = br#"{"odata.error":{"code":"EntityTooLarge","message":{"lang":"en-US","value":"The entity is too large.\nRequestId:1"}}}"#;
        let error = error_response(
            StatusCode::BAD_REQUEST,
            &HeaderMap::new(),
            body,
            "entity group transaction on table T",
        );
        assert_eq!(error.status, Some(400));
        assert_eq!(error.code.as_deref(), Some("EntityTooLarge"));
        assert_eq!(
            error.message,
            "entity group transaction on table T failed: The entity is too large."
        );
        assert_eq!(error.kind, StorageErrorKind::Rejected);

        let mut headers = HeaderMap::new();
        headers.insert("x-ms-error-code", HeaderValue::from_static("ServerBusy"));
        let error = error_response(StatusCode::SERVICE_UNAVAILABLE, &headers, b"", "query");
        assert_eq!(error.code.as_deref(), Some("ServerBusy"));
        assert!(error.is_transient());
    }
}
