//! Storage connection strings parsed into plain data: [`ConnectionSettings`].
//!
//! The 0.21 crates parse connection strings but build no client from them, and reject
//! `UseDevelopmentStorage=true`; this module covers the three forms tablescan meets:
//! - `UseDevelopmentStorage=true` (Azurite's default ports, path-style URLs);
//! - explicit `TableEndpoint=`/`QueueEndpoint=` with `AccountName`+`AccountKey` or `SharedAccessSignature`;
//! - `DefaultEndpointsProtocol`/`AccountName`/`AccountKey`/`EndpointSuffix` (public-cloud style URLs).
//!
//! The blob endpoint (`BlobEndpoint=`, else derived from `AccountName` like the others) is
//! optional: tables and queues work without it, and only using Blob Storage fails, with a message
//! naming what to add ([`ConnectionSettings::blob_endpoint`]).
//!
//! Invariants:
//! - Parsing is pure: no HTTP client, no SDK type, no I/O. Clients are built from the result by
//!   [`super::connection::StorageAccount`] and the adapters.
//! - What parses is usable: endpoints are absolute http(s) URLs with a host, no query and no
//!   trailing slash; an account key is valid base64; a SAS token parses as a query string exactly
//!   as `azure_storage`'s `StorageCredentials::sas_token` parses it (which must then accept it).
//! - Secrets never leave in text: [`Credential`]'s `Debug` names only its kind, and errors name the
//!   offending key, never a value that might be a secret.

use std::fmt;

use azure_core::Url;
use base64::Engine;

use super::token_source::TokenSource;

/// Azurite's well-known account.
pub const DEVELOPMENT_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known (public) account key.
pub const DEVELOPMENT_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Azurite's default table endpoint (path-style: the account is the first path segment).
const DEVELOPMENT_TABLE_ENDPOINT: &str = "http://127.0.0.1:10002/devstoreaccount1";
/// Azurite's default queue endpoint.
const DEVELOPMENT_QUEUE_ENDPOINT: &str = "http://127.0.0.1:10001/devstoreaccount1";
/// Azurite's default blob endpoint.
const DEVELOPMENT_BLOB_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// A connection string that cannot be used. The message names the offending key, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storage connection string: {0}")]
pub struct ConnectionStringError(pub String);

fn err(message: impl Into<String>) -> ConnectionStringError {
    ConnectionStringError(message.into())
}

/// How requests are authorized: the secret as the connection string gave it. Never printed.
/// [`super::auth`] is the one place that turns it into request authorization; a new kind of
/// credential (a bearer token) is one more variant here and one more arm there.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// Shared Key signing with the base64 account key.
    Key(String),
    /// A SAS token (query string without the leading `?`).
    Sas(String),
    /// Entra ID bearer tokens for `https://storage.azure.com/` (an identity-based connection,
    /// read from app settings by [`super::app_settings`]).
    Token {
        /// The app setting name (errors name the connection).
        connection: String,
        source: TokenSource,
    },
}

impl Credential {
    /// `"key"` or `"sas"` (for diagnostics; never the secret).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Credential::Key(_) => "key",
            Credential::Sas(_) => "sas",
            Credential::Token { .. } => "token",
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Token { source, .. } => write!(f, "token {source:?}"),
            _ => write!(f, "{} (redacted)", self.kind()),
        }
    }
}

/// What a connection says (a connection string, or the identity-based app settings): the
/// account, its service endpoints and its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSettings {
    pub(crate) account_name: String,
    /// The table service base URL, without a trailing slash (path-style for Azurite).
    pub(crate) table_endpoint: String,
    /// The queue service base URL, without a trailing slash.
    pub(crate) queue_endpoint: String,
    /// The blob service base URL, without a trailing slash; or, when the connection names none,
    /// the message saying which setting to add (given only when Blob Storage is used).
    pub(crate) blob_endpoint: Result<String, String>,
    pub(crate) credential: Credential,
    /// Whether this came from `UseDevelopmentStorage=true`.
    pub(crate) development: bool,
}

impl ConnectionSettings {
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
                if !is_query_string(sas) {
                    return Err(err("SharedAccessSignature is not a valid query string"));
                }
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
        let blob_endpoint = match endpoint("BlobEndpoint", "blob") {
            Ok(blob) => Ok(blob),
            Err(_) if get("BlobEndpoint").is_none() => Err(
                "the storage connection string gives no BlobEndpoint (nor an AccountName to derive \
                 it from): add BlobEndpoint=<blob service URL> to use Blob Storage"
                    .to_string(),
            ),
            Err(e) => return Err(e),
        };
        let account_name = match account_name {
            Some(name) => name,
            None => account_from_endpoint(&table_endpoint).ok_or_else(|| {
                err("missing AccountName and it cannot be inferred from TableEndpoint")
            })?,
        };
        Ok(ConnectionSettings {
            account_name,
            table_endpoint,
            queue_endpoint,
            blob_endpoint,
            credential,
            development: false,
        })
    }

    /// `UseDevelopmentStorage=true`: Azurite on its default ports with the well-known account.
    pub(crate) fn development() -> Self {
        ConnectionSettings {
            account_name: DEVELOPMENT_ACCOUNT.into(),
            table_endpoint: DEVELOPMENT_TABLE_ENDPOINT.into(),
            queue_endpoint: DEVELOPMENT_QUEUE_ENDPOINT.into(),
            blob_endpoint: Ok(DEVELOPMENT_BLOB_ENDPOINT.into()),
            credential: Credential::Key(DEVELOPMENT_ACCOUNT_KEY.into()),
            development: true,
        }
    }

    /// The blob service base URL (no trailing slash), or the message naming the setting to add
    /// when this connection gives none.
    pub fn blob_endpoint(&self) -> Result<&str, &str> {
        self.blob_endpoint.as_deref().map_err(String::as_str)
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

/// Whether a SAS token (without its `?`) parses as a query string, the way `azure_storage`'s
/// `StorageCredentials::sas_token` parses it: as `?token` relative to an https base.
fn is_query_string(sas: &str) -> bool {
    let base = Url::parse("https://blob.core.windows.net").expect("a static, valid URL");
    Url::options()
        .base_url(Some(&base))
        .parse(&format!("?{sas}"))
        .is_ok()
}

pub(super) fn normalize_endpoint(key: &str, value: &str) -> Result<String, ConnectionStringError> {
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
pub(super) fn account_from_endpoint(endpoint: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1ieXRlcw==";

    fn parse(s: &str) -> ConnectionSettings {
        ConnectionSettings::parse(s).unwrap()
    }

    #[test]
    fn development_storage_uses_azurite_defaults() {
        let settings = parse("UseDevelopmentStorage=true");
        assert_eq!(settings, ConnectionSettings::development());
        assert_eq!(settings.account_name, "devstoreaccount1");
        assert_eq!(
            settings.table_endpoint,
            "http://127.0.0.1:10002/devstoreaccount1"
        );
        assert_eq!(
            settings.queue_endpoint,
            "http://127.0.0.1:10001/devstoreaccount1"
        );
        assert_eq!(
            settings.blob_endpoint(),
            Ok("http://127.0.0.1:10000/devstoreaccount1")
        );
        assert!(settings.development);
        assert_eq!(
            settings.credential,
            Credential::Key(DEVELOPMENT_ACCOUNT_KEY.into())
        );
        assert!(parse("usedevelopmentstorage=TRUE;").development);
        let e = ConnectionSettings::parse("UseDevelopmentStorage=false").unwrap_err();
        assert!(e.to_string().contains("UseDevelopmentStorage"), "{e}");
    }

    #[test]
    fn account_key_form_derives_public_endpoints() {
        let settings = parse(&format!("DefaultEndpointsProtocol=https;AccountName=myacct;AccountKey={KEY};EndpointSuffix=core.windows.net"));
        assert_eq!(settings.account_name, "myacct");
        assert_eq!(
            settings.table_endpoint,
            "https://myacct.table.core.windows.net"
        );
        assert_eq!(
            settings.queue_endpoint,
            "https://myacct.queue.core.windows.net"
        );
        assert_eq!(
            settings.blob_endpoint(),
            Ok("https://myacct.blob.core.windows.net")
        );
        assert_eq!(settings.credential, Credential::Key(KEY.into()));
        assert!(!settings.development);

        let china = parse(&format!("AccountName=a1;AccountKey={KEY};EndpointSuffix=core.chinacloudapi.cn;DefaultEndpointsProtocol=http"));
        assert_eq!(
            china.table_endpoint,
            "http://a1.table.core.chinacloudapi.cn"
        );
        assert_eq!(
            china.blob_endpoint(),
            Ok("http://a1.blob.core.chinacloudapi.cn")
        );
    }

    #[test]
    fn explicit_endpoints_win_and_lose_trailing_slashes() {
        let settings = parse(&format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};\
             BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;TableEndpoint=http://127.0.0.1:4321/devstoreaccount1/;\
             QueueEndpoint=http://127.0.0.1:4320/devstoreaccount1;"
        ));
        assert_eq!(
            settings.table_endpoint,
            "http://127.0.0.1:4321/devstoreaccount1"
        );
        assert_eq!(
            settings.queue_endpoint,
            "http://127.0.0.1:4320/devstoreaccount1"
        );
        assert_eq!(
            settings.blob_endpoint(),
            Ok("http://127.0.0.1:1/devstoreaccount1")
        );
    }

    #[test]
    fn sas_form_infers_the_account_name() {
        let settings = parse(
            "TableEndpoint=https://acct9.table.core.windows.net/;QueueEndpoint=https://acct9.queue.core.windows.net/;\
             SharedAccessSignature=sv=2022-11-02&ss=tq&srt=sco&sp=rwdlacu&se=2030-01-01T00:00:00Z&sig=c2lnbmF0dXJl",
        );
        assert_eq!(settings.account_name, "acct9");
        assert_eq!(settings.credential.kind(), "sas");
        // No BlobEndpoint and no AccountName: fine for tables and queues, and using blobs says
        // what to add.
        let missing = settings.blob_endpoint().unwrap_err();
        assert!(
            missing.contains("no BlobEndpoint") && missing.contains("add BlobEndpoint="),
            "{missing}"
        );
        let with_blobs = parse(
            "TableEndpoint=https://acct9.table.core.windows.net;QueueEndpoint=https://acct9.queue.core.windows.net;\
             BlobEndpoint=https://acct9.blob.core.windows.net/;SharedAccessSignature=sv=1&sig=abc",
        );
        assert_eq!(
            with_blobs.blob_endpoint(),
            Ok("https://acct9.blob.core.windows.net")
        );
        let path_style = parse("TableEndpoint=http://127.0.0.1:9/devstoreaccount1;QueueEndpoint=http://127.0.0.1:8/devstoreaccount1;SharedAccessSignature=?sv=1&sig=abc");
        assert_eq!(path_style.account_name, "devstoreaccount1");
        assert_eq!(
            path_style.credential,
            Credential::Sas("sv=1&sig=abc".into())
        );
    }

    /// The parser's check of a SAS token is the SDK's: what parses here, the SDK accepts.
    #[test]
    fn a_sas_token_that_parses_is_one_the_sdk_accepts() {
        for sas in [
            "sv=1&sig=abc",
            "??sv=1",
            "a b&c=%zz&é=\u{1}",
            "sig=a%2Bb%3D&se=2030-01-01T00:00:00Z",
            "&&=&",
        ] {
            assert_eq!(
                is_query_string(sas.trim_start_matches('?')),
                azure_storage::StorageCredentials::sas_token(sas.trim_start_matches('?')).is_ok(),
                "{sas:?}"
            );
        }
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
                &format!("AccountName=a;AccountKey={KEY};BlobEndpoint=ftp://h/a"),
                "BlobEndpoint must be an http(s) URL",
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
            let e = ConnectionSettings::parse(input).unwrap_err().to_string();
            assert!(
                e.contains(expected),
                "{input:?}: {e:?} should mention {expected:?}"
            );
        }
    }

    #[test]
    fn secrets_never_appear_in_debug_or_errors() {
        let sig = "c2VjcmV0c2lnbmF0dXJl";
        let with_key = parse(&format!("AccountName=acct;AccountKey={KEY}"));
        let with_sas = parse(&format!(
            "TableEndpoint=https://acct.table.core.windows.net;QueueEndpoint=https://acct.queue.core.windows.net;SharedAccessSignature=sv=1&sig={sig}"
        ));
        for text in [
            format!("{with_key:?}"),
            format!("{with_sas:?}"),
            format!("{:?}", ConnectionSettings::development()),
        ] {
            assert!(
                !text.contains(KEY)
                    && !text.contains(sig)
                    && !text.contains(DEVELOPMENT_ACCOUNT_KEY),
                "{text}"
            );
            assert!(text.contains("(redacted)"), "{text}");
        }
        // A key pasted without `AccountKey=` must not be echoed whole.
        let e = ConnectionSettings::parse(&format!("AccountName=a;{KEY}"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains(KEY), "{e}");
    }
}
