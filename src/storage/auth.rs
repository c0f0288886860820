//! The one place a [`Credential`] becomes request authorization, for both ways requests go out:
//! the SDK pipeline (table admin operations, queues) and the signed data path ([`super::signed`]).
//!
//! Invariants:
//! - Both paths authorize from the same parsed [`Credential`], and the signed path signs exactly as
//!   `azure_storage`'s Table SharedKey policy does (pinned by a test), so either path may send any
//!   request.
//! - Secrets are never printed: [`Authorization`]'s `Debug` names only its kind.
//! - A keyless connection's bearer tokens come from the account's one [`TokenProvider`] on both
//!   paths (the SDK asks it as its `TokenCredential`), so they share one cache and one refresh.
//! - A kind of credential is one variant of [`Credential`] and one arm in each of
//!   [`sdk_credentials`], [`Authorization::new`], [`Authorization::authorize`] and
//!   [`token_connection`]; nothing else in `storage` matches on credentials (but `connection`,
//!   which builds the token provider).
//! - A keyless connection's RBAC 403 names the connection and the data role it lacks
//!   ([`with_role_hint`]).

use std::sync::Arc;

use azure_core::auth::{Secret, TokenCredential};
use azure_storage::clients::ServiceType;
use azure_storage::StorageCredentials;
use hmac::{Hmac, Mac};
use reqwest::Method;
use sha2::Sha256;

use super::connection::StorageAccount;
use super::connection_string::Credential;
use super::token::{TokenError, TokenProvider};
use super::StorageError;

/// The SDK's credentials for an account.
pub(crate) fn sdk_credentials(account: &StorageAccount) -> StorageCredentials {
    let settings = account.settings();
    match &settings.credential {
        Credential::Key(key) => {
            StorageCredentials::access_key(settings.account_name.clone(), Secret::new(key.clone()))
        }
        Credential::Sas(sas) => StorageCredentials::sas_token(sas).expect("validated when parsed"),
        Credential::Token { .. } => {
            let provider: Arc<dyn TokenCredential> = account
                .tokens()
                .expect("a keyless account has its token provider")
                .clone();
            StorageCredentials::token_credential(provider)
        }
    }
}

/// The connection name of a keyless account (whose 403s may be missing role assignments).
pub(crate) fn token_connection(account: &StorageAccount) -> Option<String> {
    match &account.settings().credential {
        Credential::Token { connection, .. } => Some(connection.clone()),
        Credential::Key(_) | Credential::Sas(_) => None,
    }
}

/// A keyless connection's 403 that says the identity lacks a data role
/// (`AuthorizationPermissionMismatch`, or `AuthorizationFailure`, which network rules also give)
/// gains the connection and the role it needs on the account; other errors pass unchanged.
/// Both request paths' errors come here (through `azure::Service::attempts`). Azurite cannot
/// produce these (its OAuth mode checks no role), so only the unit test below covers it.
pub(crate) fn with_role_hint(
    mut error: StorageError,
    connection: &str,
    service: ServiceType,
) -> StorageError {
    let code = error.code.as_deref().unwrap_or("");
    if error.status != Some(403)
        || !matches!(
            code,
            "AuthorizationPermissionMismatch" | "AuthorizationFailure"
        )
    {
        return error;
    }
    let role = match service {
        ServiceType::Queue => "Storage Queue Data Contributor",
        _ => "Storage Table Data Contributor",
    };
    error.message.push_str(&format!(
        " (connection {connection} uses an Entra ID token: its identity needs the {role} role on the storage account"
    ));
    if code == "AuthorizationFailure" {
        error
            .message
            .push_str(", and the account's network rules must let this app in");
    }
    error.message.push(')');
    error
}

/// How a signed-path request is authorized, ready to apply to each request. Never printed.
#[derive(Clone)]
pub(crate) enum Authorization {
    /// Table SharedKey with the account name and the keyed MAC, ready to clone per request.
    SharedKey { account: String, mac: Hmac<Sha256> },
    /// A SAS token appended to every query string (without the leading `?`).
    Sas(String),
    /// `Authorization: Bearer <token>` from the account's token provider.
    Bearer(Arc<TokenProvider>),
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Authorization::SharedKey { .. } => "SharedKey (redacted)",
            Authorization::Sas(_) => "SAS (redacted)",
            Authorization::Bearer(_) => "Bearer (redacted)",
        })
    }
}

/// What a table request's authorization covers.
pub(crate) struct TableRequestToSign<'a> {
    pub method: &'a Method,
    pub content_type: &'a str,
    /// The `x-ms-date` value sent.
    pub date: &'a str,
    /// The service base URL's path (`""` or `/devstoreaccount1`) …
    pub base_path: &'a str,
    /// … and the percent-encoded path below it, as sent (no query).
    pub path: &'a str,
}

impl Authorization {
    /// The signed path's authorization for an account (the key was validated when parsed).
    pub(crate) fn new(account: &StorageAccount) -> Self {
        let settings = account.settings();
        match &settings.credential {
            Credential::Key(key) => {
                Self::shared_key(&settings.account_name, key).expect("validated when parsed")
            }
            Credential::Sas(sas) => Authorization::Sas(sas.clone()),
            Credential::Token { .. } => Authorization::Bearer(
                account
                    .tokens()
                    .expect("a keyless account has its token provider")
                    .clone(),
            ),
        }
    }

    /// SharedKey from the base64 account key; `None` if it is not valid base64.
    fn shared_key(account: &str, base64_key: &str) -> Option<Self> {
        use base64::Engine;
        let key = base64::engine::general_purpose::STANDARD
            .decode(base64_key)
            .ok()?;
        // HMAC takes a key of any length.
        let mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
        Some(Authorization::SharedKey {
            account: account.to_string(),
            mac,
        })
    }

    /// Authorizes one table request whose URL so far is `url` (`has_query`: whether it already
    /// carries a query string): returns the `Authorization` header value to send, or extends the
    /// URL's query with the SAS and returns `None`. Only a bearer token can fail (no token).
    pub(crate) async fn authorize(
        &self,
        request: &TableRequestToSign<'_>,
        url: &mut String,
        has_query: bool,
    ) -> Result<Option<String>, TokenError> {
        Ok(match self {
            Authorization::SharedKey { account, mac } => {
                let path = format!("{}/{}", request.base_path, request.path);
                Some(table_shared_key(
                    account,
                    mac,
                    request.method,
                    request.content_type,
                    request.date,
                    &path,
                ))
            }
            Authorization::Sas(sas) => {
                url.push(if has_query { '&' } else { '?' });
                url.push_str(sas);
                None
            }
            Authorization::Bearer(tokens) => {
                let (token, _) = tokens.token().await?;
                Some(format!("Bearer {}", token.secret()))
            }
        })
    }
}

/// The Table service's SharedKey `Authorization` value:
/// `VERB\nContent-MD5\nContent-Type\nx-ms-date\n/account/path` (path as sent, no query).
fn table_shared_key(
    account: &str,
    mac: &Hmac<Sha256>,
    method: &Method,
    content_type: &str,
    date: &str,
    path: &str,
) -> String {
    use base64::Engine;
    let string_to_sign = format!("{}\n\n{content_type}\n{date}\n/{account}{path}", method);
    let mut mac = mac.clone();
    mac.update(string_to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!("SharedKey {account}:{signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RBAC 403s are what a real account answers to a token whose identity lacks the data role;
    /// Azurite's OAuth mode checks no roles, so the mapping is tested here only.
    #[test]
    fn rbac_403s_name_the_connection_and_the_role_it_needs() {
        use crate::storage::StorageErrorKind;
        let forbidden = |code: &str| {
            StorageError::from_status(
                403,
                Some(code.into()),
                "query on table T failed: This request is not authorized to perform this operation using this permission.",
            )
        };
        let table = with_role_hint(
            forbidden("AuthorizationPermissionMismatch"),
            "Src",
            ServiceType::Table,
        );
        assert_eq!(table.kind, StorageErrorKind::Rejected);
        assert_eq!(
            table.to_string(),
            "query on table T failed: This request is not authorized to perform this operation \
             using this permission. (connection Src uses an Entra ID token: its identity needs the \
             Storage Table Data Contributor role on the storage account) \
             (HTTP 403, AuthorizationPermissionMismatch)"
        );
        let queue = with_role_hint(
            forbidden("AuthorizationPermissionMismatch"),
            "AzureWebJobsStorage",
            ServiceType::Queue,
        );
        assert!(
            queue.message.contains(
                "connection AzureWebJobsStorage uses an Entra ID token: its identity needs the Storage Queue Data Contributor role"
            ),
            "{queue}"
        );
        let failure = with_role_hint(forbidden("AuthorizationFailure"), "Dst", ServiceType::Table);
        assert!(
            failure.message.contains("connection Dst")
                && failure.message.contains("Storage Table Data Contributor")
                && failure.message.contains("network rules"),
            "{failure}"
        );
        // Anything else passes unchanged: another 403 code, another status.
        for error in [
            forbidden("AuthenticationFailed"),
            StorageError::from_status(404, Some("TableNotFound".into()), "query failed"),
        ] {
            let before = error.to_string();
            assert_eq!(
                with_role_hint(error, "Src", ServiceType::Table).to_string(),
                before
            );
        }
    }

    /// The signature the SDK's policy computes for the same request (Azurite's well-known key),
    /// pinned so both paths keep signing identically.
    use crate::storage::connection_string::ConnectionSettings;

    #[tokio::test]
    async fn shared_key_matches_the_sdk_string_to_sign() {
        let key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
        let authorization =
            Authorization::new(&StorageAccount::new(ConnectionSettings::development()));
        let mut url = String::from("http://127.0.0.1:10002/devstoreaccount1/Table()");
        let value = authorization
            .authorize(
                &TableRequestToSign {
                    method: &Method::GET,
                    content_type: "",
                    date: "Sun, 22 Nov 2026 05:00:00 GMT",
                    base_path: "/devstoreaccount1",
                    path: "Table()",
                },
                &mut url,
                false,
            )
            .await
            .unwrap();
        // Expected value computed independently: HMAC-SHA256 over
        // "GET\n\n\nSun, 22 Nov 2026 05:00:00 GMT\n/devstoreaccount1/devstoreaccount1/Table()".
        let sdk = azure_core::hmac::hmac_sha256(
            "GET\n\n\nSun, 22 Nov 2026 05:00:00 GMT\n/devstoreaccount1/devstoreaccount1/Table()",
            &Secret::new(key.to_string()),
        )
        .unwrap();
        assert_eq!(value, Some(format!("SharedKey devstoreaccount1:{sdk}")));
        assert_eq!(url, "http://127.0.0.1:10002/devstoreaccount1/Table()");
    }

    #[tokio::test]
    async fn a_sas_extends_the_query_and_sends_no_header() {
        let mut settings = ConnectionSettings::development();
        settings.credential = Credential::Sas("sv=1&sig=abc".into());
        let account = StorageAccount::new(settings);
        let authorization = Authorization::new(&account);
        let request = TableRequestToSign {
            method: &Method::GET,
            content_type: "",
            date: "",
            base_path: "",
            path: "t()",
        };
        let mut url = String::from("https://a.table.core.windows.net/t()");
        assert_eq!(
            authorization.authorize(&request, &mut url, false).await,
            Ok(None)
        );
        assert_eq!(url, "https://a.table.core.windows.net/t()?sv=1&sig=abc");
        let mut url = String::from("https://a.table.core.windows.net/t()?$top=1");
        assert_eq!(
            authorization.authorize(&request, &mut url, true).await,
            Ok(None)
        );
        assert_eq!(
            url,
            "https://a.table.core.windows.net/t()?$top=1&sv=1&sig=abc"
        );
        assert_eq!(format!("{authorization:?}"), "SAS (redacted)");
        let _ = sdk_credentials(&account);
    }

    /// A keyless account: `Authorization: Bearer` on the signed path from the account's provider,
    /// the URL untouched, and the SDK asks the same provider (one cache for both paths).
    #[tokio::test]
    async fn a_token_credential_sends_a_bearer_header_from_the_shared_provider() {
        use crate::storage::token_source::{
            ManagedIdentityEndpoint, ManagedIdentityId, TokenSource,
        };
        let mut settings = ConnectionSettings::development();
        settings.credential = Credential::Token {
            connection: "Src".into(),
            source: TokenSource::ManagedIdentity {
                endpoint: ManagedIdentityEndpoint::Imds,
                id: ManagedIdentityId::System,
            },
        };
        let (provider, fetches) = crate::storage::token::tests::fake_provider("tok-123", 3600);
        let account = StorageAccount::new(settings).with_token_provider(provider.clone());
        let authorization = Authorization::new(&account);
        let request = TableRequestToSign {
            method: &Method::GET,
            content_type: "",
            date: "",
            base_path: "",
            path: "t()",
        };
        let mut url = String::from("https://a.table.core.windows.net/t()");
        assert_eq!(
            authorization.authorize(&request, &mut url, false).await,
            Ok(Some("Bearer tok-123".into()))
        );
        assert_eq!(url, "https://a.table.core.windows.net/t()");
        assert_eq!(format!("{authorization:?}"), "Bearer (redacted)");
        let sdk_token = provider
            .get_token(&[crate::storage::token::STORAGE_SCOPE])
            .await
            .unwrap();
        assert_eq!(sdk_token.token.secret(), "tok-123");
        let _ = sdk_credentials(&account);
        assert_eq!(fetches.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(!format!("{account:?} {account}").contains("tok-123"));
    }
}
