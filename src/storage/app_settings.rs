//! One storage connection read from app settings, in either form the Functions host accepts:
//! - a connection string in the setting `<NAME>` itself (parsed by [`super::connection_string`]), or
//! - identity-based (keyless): `<NAME>__accountName` (public-cloud endpoints, blobs included), or
//!   `<NAME>__tableServiceUri` + `<NAME>__queueServiceUri` (+ `<NAME>__blobServiceUri` where
//!   Blob Storage is used: without it, only a blob operation fails, naming that setting) for
//!   other clouds, private endpoints and local tests; `<NAME>__credential` picks how tokens are
//!   obtained ([`TokenSource`]).
//!
//! `__credential` (case-insensitive):
//! - `managedidentity`: the platform's identity endpoint — App Service/Functions
//!   (`IDENTITY_ENDPOINT` + `IDENTITY_HEADER`) when set, IMDS otherwise; `<NAME>__clientId` or
//!   `<NAME>__managedIdentityResourceId` picks a user-assigned identity;
//! - `clientsecret`: a service principal, `<NAME>__tenantId` + `__clientId` + `__clientSecret`;
//! - `workloadidentity`: a federated token file, `<NAME>__tenantId`/`__clientId` or
//!   `AZURE_TENANT_ID`/`AZURE_CLIENT_ID`, and `AZURE_FEDERATED_TOKEN_FILE`;
//! - `azurecli`: the Azure CLI's login (development only);
//! - absent: `clientsecret` when `<NAME>__clientSecret` is set (as the Functions host does),
//!   `workloadidentity` when `AZURE_FEDERATED_TOKEN_FILE` is set, else `managedidentity`. No chain
//!   is probed at run time: one connection has one credential, so its failures are its own.
//!
//! Invariants:
//! - Pure: settings come through a lookup (the environment, or a map in tests); nothing is
//!   fetched and no client is built here.
//! - Every error names the app setting to fix; none carries a secret value.
//! - Tokens are only ever sent over https: identity-based service URIs must be https.

use azure_core::Url;

pub(crate) use super::token_source::{ManagedIdentityEndpoint, ManagedIdentityId, TokenSource};

use super::connection_string::{
    account_from_endpoint, normalize_endpoint, ConnectionSettings, ConnectionStringError,
    Credential,
};

/// Identity-based settings under `<NAME>__`, in the spelling the Functions host uses.
const ACCOUNT_NAME: &str = "accountName";
const TABLE_SERVICE_URI: &str = "tableServiceUri";
const QUEUE_SERVICE_URI: &str = "queueServiceUri";
const BLOB_SERVICE_URI: &str = "blobServiceUri";
const CREDENTIAL: &str = "credential";
const CLIENT_ID: &str = "clientId";
const CLIENT_SECRET: &str = "clientSecret";
const TENANT_ID: &str = "tenantId";
const RESOURCE_ID: &str = "managedIdentityResourceId";
/// Every identity-based key: any of them set next to a connection string is "both forms".
const IDENTITY_KEYS: [&str; 9] = [
    ACCOUNT_NAME,
    TABLE_SERVICE_URI,
    QUEUE_SERVICE_URI,
    BLOB_SERVICE_URI,
    CREDENTIAL,
    CLIENT_ID,
    CLIENT_SECRET,
    TENANT_ID,
    RESOURCE_ID,
];

/// The App Service/Functions identity endpoint and its header (process environment).
pub(crate) const IDENTITY_ENDPOINT: &str = "IDENTITY_ENDPOINT";
pub(crate) const IDENTITY_HEADER: &str = "IDENTITY_HEADER";
/// Workload identity's environment (set by the AKS webhook, or by hand).
const AZURE_FEDERATED_TOKEN_FILE: &str = "AZURE_FEDERATED_TOKEN_FILE";
const AZURE_TENANT_ID: &str = "AZURE_TENANT_ID";
const AZURE_CLIENT_ID: &str = "AZURE_CLIENT_ID";

/// A connection that cannot be used: the app setting to fix and why (never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("app setting {setting}: {message}")]
pub struct ConnectionSettingError {
    pub setting: String,
    pub message: String,
}

fn err(setting: impl Into<String>, message: impl Into<String>) -> ConnectionSettingError {
    ConnectionSettingError {
        setting: setting.into(),
        message: message.into(),
    }
}

impl ConnectionSettings {
    /// The connection named `name`, from app settings read through `lookup` (values trimmed;
    /// empty counts as unset): a connection string in `name`, or the identity-based form under
    /// `name__`. Neither, both, or an unusable piece is an error naming the setting.
    pub fn from_app_settings(
        name: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConnectionSettingError> {
        let get = |key: &str| {
            lookup(key)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let key = |suffix: &str| format!("{name}__{suffix}");
        let identity_keys: Vec<String> = IDENTITY_KEYS
            .iter()
            .map(|s| key(s))
            .filter(|k| get(k).is_some())
            .collect();
        if let Some(connection_string) = get(name) {
            if let Some(first) = identity_keys.first() {
                return Err(err(
                    name,
                    format!(
                        "holds a connection string and {first} is also set; use one form: the \
                         connection string, or the identity-based {name}__* settings"
                    ),
                ));
            }
            let mut settings = ConnectionSettings::parse(&connection_string).map_err(
                |ConnectionStringError(m)| err(name, format!("storage connection string: {m}")),
            )?;
            if let Err(missing) = &mut settings.blob_endpoint {
                *missing = format!("app setting {name}: {missing}");
            }
            return Ok(settings);
        }
        let account = get(&key(ACCOUNT_NAME));
        let table = get(&key(TABLE_SERVICE_URI));
        let queue = get(&key(QUEUE_SERVICE_URI));
        let blob = get(&key(BLOB_SERVICE_URI));
        if account.is_some() && blob.is_some() {
            return Err(err(
                key(ACCOUNT_NAME),
                format!(
                    "give either {} or the service URIs ({}), not both",
                    key(ACCOUNT_NAME),
                    key(BLOB_SERVICE_URI)
                ),
            ));
        }
        let (account_name, table_endpoint, queue_endpoint) = match (account, table, queue) {
            (None, None, None) => {
                let detail = match identity_keys.first() {
                    Some(k) => format!(" ({k} is set, but says nothing about which account)"),
                    None => String::new(),
                };
                return Err(err(
                    name,
                    format!(
                        "is not set: give a storage connection string, or the identity-based \
                         {} or {} + {}{detail}",
                        key(ACCOUNT_NAME),
                        key(TABLE_SERVICE_URI),
                        key(QUEUE_SERVICE_URI)
                    ),
                ));
            }
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(err(
                    key(ACCOUNT_NAME),
                    format!(
                        "give either {} or the service URIs ({}, {}), not both",
                        key(ACCOUNT_NAME),
                        key(TABLE_SERVICE_URI),
                        key(QUEUE_SERVICE_URI)
                    ),
                ))
            }
            (Some(account), None, None) => {
                if !(3..=24).contains(&account.len())
                    || !account
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                {
                    return Err(err(
                        key(ACCOUNT_NAME),
                        format!("`{account}` is not a storage account name (3 to 24 lowercase letters and digits)"),
                    ));
                }
                (
                    account.clone(),
                    format!("https://{account}.table.core.windows.net"),
                    format!("https://{account}.queue.core.windows.net"),
                )
            }
            (None, table, queue) => {
                let table_key = key(TABLE_SERVICE_URI);
                let queue_key = key(QUEUE_SERVICE_URI);
                let table = table
                    .ok_or_else(|| err(&table_key, format!("is required with {queue_key}")))?;
                let queue = queue
                    .ok_or_else(|| err(&queue_key, format!("is required with {table_key}")))?;
                let table = service_uri(&table_key, &table)?;
                let queue = service_uri(&queue_key, &queue)?;
                let account = account_from_endpoint(&table).ok_or_else(|| {
                    err(
                        &table_key,
                        "names no storage account (neither in its host nor its path)",
                    )
                })?;
                (account, table, queue)
            }
        };
        let blob_endpoint = match blob {
            Some(blob) => Ok(service_uri(&key(BLOB_SERVICE_URI), &blob)?),
            None if get(&key(ACCOUNT_NAME)).is_some() => {
                Ok(format!("https://{account_name}.blob.core.windows.net"))
            }
            None => Err(format!(
                "app setting {}: is not set, and connection {name} needs it to use Blob Storage \
                 (it gives {} and {} only)",
                key(BLOB_SERVICE_URI),
                key(TABLE_SERVICE_URI),
                key(QUEUE_SERVICE_URI)
            )),
        };
        let source = token_source(name, &get)?;
        Ok(ConnectionSettings {
            account_name,
            table_endpoint,
            queue_endpoint,
            blob_endpoint,
            credential: Credential::Token {
                connection: name.to_string(),
                source,
            },
            development: false,
        })
    }
}

/// An identity-based service URI: an https URL with a host, normalized like a connection string's
/// endpoint.
fn service_uri(setting: &str, value: &str) -> Result<String, ConnectionSettingError> {
    let normalized =
        normalize_endpoint(setting, value).map_err(|ConnectionStringError(m)| err(setting, m))?;
    let url = Url::parse(&normalized).map_err(|e| err(setting, format!("is not a URL ({e})")))?;
    if url.scheme() != "https" {
        return Err(err(
            setting,
            "must be an https URL: tokens are never sent over plain http",
        ));
    }
    Ok(normalized)
}

/// The connection's [`TokenSource`] from `<name>__credential` and its companions.
fn token_source(
    name: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<TokenSource, ConnectionSettingError> {
    let key = |suffix: &str| format!("{name}__{suffix}");
    let client_id = get(&key(CLIENT_ID));
    let client_secret = get(&key(CLIENT_SECRET));
    let tenant_id = get(&key(TENANT_ID));
    let resource_id = get(&key(RESOURCE_ID));
    let kind = match get(&key(CREDENTIAL)) {
        Some(value) => value.to_ascii_lowercase(),
        None if client_secret.is_some() => "clientsecret".into(),
        None if get(AZURE_FEDERATED_TOKEN_FILE).is_some() => "workloadidentity".into(),
        None => "managedidentity".into(),
    };
    let unexpected = |setting: String, kind: &str| {
        err(
            setting,
            format!(
                "is not used with the {kind} credential; remove it or change {}",
                key(CREDENTIAL)
            ),
        )
    };
    let required = |value: Option<String>, setting: String, why: &str| {
        value.ok_or_else(|| err(setting, format!("is required {why}")))
    };
    match kind.as_str() {
        "managedidentity" => {
            if client_secret.is_some() {
                return Err(unexpected(key(CLIENT_SECRET), "managedidentity"));
            }
            if tenant_id.is_some() {
                return Err(unexpected(key(TENANT_ID), "managedidentity"));
            }
            let id = match (client_id, resource_id) {
                (Some(_), Some(_)) => {
                    return Err(err(
                        key(RESOURCE_ID),
                        format!("give {} or {}, not both", key(CLIENT_ID), key(RESOURCE_ID)),
                    ))
                }
                (Some(id), None) => ManagedIdentityId::ClientId(id),
                (None, Some(id)) => ManagedIdentityId::ResourceId(id),
                (None, None) => ManagedIdentityId::System,
            };
            let endpoint = match (get(IDENTITY_ENDPOINT), get(IDENTITY_HEADER)) {
                (Some(endpoint), Some(header)) => {
                    let url = Url::parse(&endpoint).map_err(|e| {
                        err(IDENTITY_ENDPOINT, format!("is not a URL ({e})"))
                    })?;
                    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                        return Err(err(IDENTITY_ENDPOINT, "must be an http(s) URL with a host"));
                    }
                    ManagedIdentityEndpoint::AppService { endpoint, header }
                }
                (Some(_), None) => {
                    return Err(err(
                        IDENTITY_HEADER,
                        format!("is required with {IDENTITY_ENDPOINT} (the managed identity of connection {name})"),
                    ))
                }
                (None, _) => ManagedIdentityEndpoint::Imds,
            };
            Ok(TokenSource::ManagedIdentity { endpoint, id })
        }
        "clientsecret" => {
            if resource_id.is_some() {
                return Err(unexpected(key(RESOURCE_ID), "clientsecret"));
            }
            let why = "for the clientsecret credential";
            Ok(TokenSource::ClientSecret {
                tenant_id: required(tenant_id, key(TENANT_ID), why)?,
                client_id: required(client_id, key(CLIENT_ID), why)?,
                client_secret: required(client_secret, key(CLIENT_SECRET), why)?,
            })
        }
        "workloadidentity" => {
            if client_secret.is_some() {
                return Err(unexpected(key(CLIENT_SECRET), "workloadidentity"));
            }
            if resource_id.is_some() {
                return Err(unexpected(key(RESOURCE_ID), "workloadidentity"));
            }
            let why = "for the workloadidentity credential";
            let tenant_id = tenant_id.or_else(|| get(AZURE_TENANT_ID));
            let client_id = client_id.or_else(|| get(AZURE_CLIENT_ID));
            Ok(TokenSource::WorkloadIdentity {
                tenant_id: required(
                    tenant_id,
                    key(TENANT_ID),
                    &format!("(or {AZURE_TENANT_ID}) {why}"),
                )?,
                client_id: required(
                    client_id,
                    key(CLIENT_ID),
                    &format!("(or {AZURE_CLIENT_ID}) {why}"),
                )?,
                token_file: required(
                    get(AZURE_FEDERATED_TOKEN_FILE),
                    AZURE_FEDERATED_TOKEN_FILE.to_string(),
                    &format!("{why} of connection {name}"),
                )?,
            })
        }
        "azurecli" => {
            for (value, setting) in [
                (&client_id, CLIENT_ID),
                (&client_secret, CLIENT_SECRET),
                (&tenant_id, TENANT_ID),
                (&resource_id, RESOURCE_ID),
            ] {
                if value.is_some() {
                    return Err(unexpected(key(setting), "azurecli"));
                }
            }
            Ok(TokenSource::AzureCli)
        }
        other => Err(err(
            key(CREDENTIAL),
            format!(
                "`{other}` is not a credential tablescan knows; use managedidentity, clientsecret, \
                 workloadidentity or azurecli"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::storage::connection_string::DEVELOPMENT_ACCOUNT_KEY;

    const SECRET: &str = "c2VjcmV0LWNsaWVudC1zZWNyZXQ";
    const HEADER: &str = "aWRlbnRpdHktaGVhZGVyLXNlY3JldA";

    fn read(
        name: &str,
        pairs: &[(&str, &str)],
    ) -> Result<ConnectionSettings, ConnectionSettingError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConnectionSettings::from_app_settings(name, |k| map.get(k).cloned())
    }

    fn token(settings: &ConnectionSettings) -> &TokenSource {
        match &settings.credential {
            Credential::Token { source, .. } => source,
            other => panic!("expected a token credential, got {other:?}"),
        }
    }

    #[test]
    fn a_connection_string_reads_as_before() {
        let settings = read("Src", &[("Src", "UseDevelopmentStorage=true")]).unwrap();
        assert_eq!(settings, ConnectionSettings::development());
        // Without a blob endpoint it is still a connection; using blobs names the app setting.
        let no_blobs = read(
            "Src",
            &[(
                "Src",
                "TableEndpoint=https://a.table.core.windows.net;\
                 QueueEndpoint=https://a.queue.core.windows.net;SharedAccessSignature=sv=1&sig=x",
            )],
        )
        .unwrap();
        let missing = no_blobs.blob_endpoint().unwrap_err();
        assert!(
            missing.starts_with("app setting Src: ") && missing.contains("add BlobEndpoint="),
            "{missing}"
        );
        let e = read("Src", &[("Src", "AccountName=a")]).unwrap_err();
        assert_eq!(e.setting, "Src");
        assert!(
            e.message.contains("AccountKey or SharedAccessSignature"),
            "{e}"
        );
    }

    #[test]
    fn account_name_gives_public_endpoints_and_managed_identity_by_default() {
        let settings = read(
            "AzureWebJobsStorage",
            &[("AzureWebJobsStorage__accountName", "prod1")],
        )
        .unwrap();
        assert_eq!(settings.account_name, "prod1");
        assert_eq!(
            settings.table_endpoint,
            "https://prod1.table.core.windows.net"
        );
        assert_eq!(
            settings.queue_endpoint,
            "https://prod1.queue.core.windows.net"
        );
        assert_eq!(
            settings.blob_endpoint(),
            Ok("https://prod1.blob.core.windows.net")
        );
        assert_eq!(settings.credential.kind(), "token");
        assert_eq!(
            token(&settings),
            &TokenSource::ManagedIdentity {
                endpoint: ManagedIdentityEndpoint::Imds,
                id: ManagedIdentityId::System
            }
        );
    }

    #[test]
    fn service_uris_for_other_clouds_and_local_tests() {
        let settings = read(
            "Dst",
            &[
                (
                    "Dst__tableServiceUri",
                    "https://127.0.0.1:10102/devstoreaccount1/",
                ),
                (
                    "Dst__queueServiceUri",
                    "https://127.0.0.1:10101/devstoreaccount1",
                ),
                (
                    "Dst__blobServiceUri",
                    "https://127.0.0.1:10100/devstoreaccount1",
                ),
                ("Dst__credential", "ManagedIdentity"),
                ("Dst__clientId", "00000000-0000-0000-0000-000000000001"),
                ("IDENTITY_ENDPOINT", "http://127.0.0.1:4141/msi/token"),
                ("IDENTITY_HEADER", HEADER),
            ],
        )
        .unwrap();
        assert_eq!(settings.account_name, "devstoreaccount1");
        assert_eq!(
            settings.table_endpoint,
            "https://127.0.0.1:10102/devstoreaccount1"
        );
        assert_eq!(
            settings.queue_endpoint,
            "https://127.0.0.1:10101/devstoreaccount1"
        );
        assert_eq!(
            settings.blob_endpoint(),
            Ok("https://127.0.0.1:10100/devstoreaccount1")
        );
        assert_eq!(
            token(&settings),
            &TokenSource::ManagedIdentity {
                endpoint: ManagedIdentityEndpoint::AppService {
                    endpoint: "http://127.0.0.1:4141/msi/token".into(),
                    header: HEADER.into()
                },
                id: ManagedIdentityId::ClientId("00000000-0000-0000-0000-000000000001".into())
            }
        );
        let gov = read(
            "G",
            &[
                (
                    "G__tableServiceUri",
                    "https://acct7.table.core.usgovcloudapi.net",
                ),
                (
                    "G__queueServiceUri",
                    "https://acct7.queue.core.usgovcloudapi.net",
                ),
                ("G__managedIdentityResourceId", "/subscriptions/s/rg/r/id"),
            ],
        )
        .unwrap();
        assert_eq!(gov.account_name, "acct7");
        // Table and queue URIs only: a connection, until blobs are used.
        let missing = gov.blob_endpoint().unwrap_err();
        assert!(
            missing.starts_with("app setting G__blobServiceUri: is not set")
                && missing.contains("connection G needs it to use Blob Storage"),
            "{missing}"
        );
        assert_eq!(
            token(&gov),
            &TokenSource::ManagedIdentity {
                endpoint: ManagedIdentityEndpoint::Imds,
                id: ManagedIdentityId::ResourceId("/subscriptions/s/rg/r/id".into())
            }
        );
    }

    #[test]
    fn other_credentials() {
        let sp = read(
            "C",
            &[
                ("C__accountName", "acct"),
                ("C__tenantId", "t1"),
                ("C__clientId", "c1"),
                ("C__clientSecret", SECRET),
            ],
        )
        .unwrap();
        assert_eq!(
            token(&sp),
            &TokenSource::ClientSecret {
                tenant_id: "t1".into(),
                client_id: "c1".into(),
                client_secret: SECRET.into()
            }
        );
        let wi = read(
            "C",
            &[
                ("C__accountName", "acct"),
                ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"),
                ("AZURE_TENANT_ID", "t2"),
                ("C__clientId", "c2"),
            ],
        )
        .unwrap();
        assert_eq!(
            token(&wi),
            &TokenSource::WorkloadIdentity {
                tenant_id: "t2".into(),
                client_id: "c2".into(),
                token_file: "/var/run/token".into()
            }
        );
        let cli = read(
            "C",
            &[("C__accountName", "acct"), ("C__credential", "AzureCLI")],
        )
        .unwrap();
        assert_eq!(token(&cli), &TokenSource::AzureCli);
    }

    #[test]
    fn start_up_errors_name_the_setting() {
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
        let cases: &[Case] = &[
            (&[], "C", "is not set"),
            (
                &[("C__credential", "managedidentity")],
                "C",
                "says nothing about which account",
            ),
            (
                &[
                    ("C", "UseDevelopmentStorage=true"),
                    ("C__accountName", "acct"),
                ],
                "C",
                "C__accountName is also set",
            ),
            (
                &[("C__accountName", "acct"), ("C__credential", "magic")],
                "C__credential",
                "`magic` is not a credential",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__tableServiceUri", "https://h/acct"),
                ],
                "C__accountName",
                "not both",
            ),
            (
                &[("C__tableServiceUri", "https://h/acct")],
                "C__queueServiceUri",
                "is required",
            ),
            (
                &[("C__queueServiceUri", "https://h/acct")],
                "C__tableServiceUri",
                "is required",
            ),
            (
                &[
                    ("C__tableServiceUri", "http://h/acct"),
                    ("C__queueServiceUri", "https://h/acct"),
                ],
                "C__tableServiceUri",
                "https",
            ),
            (
                &[
                    ("C__tableServiceUri", "https://h/a"),
                    ("C__queueServiceUri", "nope"),
                ],
                "C__queueServiceUri",
                "not a URL",
            ),
            (
                &[
                    ("C__tableServiceUri", "https://h/a"),
                    ("C__queueServiceUri", "https://h/a"),
                    ("C__blobServiceUri", "https://h/a?sv=1"),
                ],
                "C__blobServiceUri",
                "query",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__blobServiceUri", "https://acct.blob.core.windows.net"),
                ],
                "C__accountName",
                "not both",
            ),
            (
                &[
                    ("C__tableServiceUri", "https://h/a"),
                    ("C__queueServiceUri", "https://h/a"),
                    ("C__blobServiceUri", "http://h/a"),
                ],
                "C__blobServiceUri",
                "https",
            ),
            (
                &[("C__accountName", "Not_An_Account")],
                "C__accountName",
                "not a storage account name",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__credential", "clientsecret"),
                    ("C__clientId", "c"),
                ],
                "C__tenantId",
                "is required for the clientsecret credential",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__clientSecret", SECRET),
                    ("C__tenantId", "t"),
                ],
                "C__clientId",
                "is required",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__credential", "workloadidentity"),
                    ("AZURE_TENANT_ID", "t"),
                    ("AZURE_CLIENT_ID", "c"),
                ],
                "AZURE_FEDERATED_TOKEN_FILE",
                "of connection C",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__clientId", "a"),
                    ("C__managedIdentityResourceId", "b"),
                ],
                "C__managedIdentityResourceId",
                "not both",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__credential", "managedidentity"),
                    ("C__clientSecret", SECRET),
                ],
                "C__clientSecret",
                "not used with the managedidentity credential",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("C__credential", "azurecli"),
                    ("C__clientId", "c"),
                ],
                "C__clientId",
                "not used with the azurecli credential",
            ),
            (
                &[
                    ("C__accountName", "acct"),
                    ("IDENTITY_ENDPOINT", "http://127.0.0.1:1/t"),
                ],
                "IDENTITY_HEADER",
                "is required with IDENTITY_ENDPOINT",
            ),
        ];
        for (pairs, setting, message) in cases {
            let e = read("C", pairs).unwrap_err();
            assert_eq!(&e.setting, setting, "{pairs:?}: {e}");
            assert!(
                e.message.contains(message),
                "{pairs:?}: {e} should mention {message:?}"
            );
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("app setting {setting}: ")),
                "{text}"
            );
            assert!(!text.contains(SECRET), "{text}");
        }
    }

    #[test]
    fn secrets_never_appear_in_debug_or_errors() {
        let sp = read(
            "C",
            &[
                ("C__accountName", "acct"),
                ("C__tenantId", "t1"),
                ("C__clientId", "c1"),
                ("C__clientSecret", SECRET),
            ],
        )
        .unwrap();
        let mi = read(
            "C",
            &[
                ("C__accountName", "acct"),
                ("IDENTITY_ENDPOINT", "http://127.0.0.1:4141/msi/token"),
                ("IDENTITY_HEADER", HEADER),
            ],
        )
        .unwrap();
        for text in [
            format!("{sp:?}"),
            format!("{mi:?}"),
            format!("{:?}", token(&sp)),
            format!("{:?}", token(&mi)),
        ] {
            assert!(!text.contains(SECRET) && !text.contains(HEADER), "{text}");
            assert!(text.contains("redacted"), "{text}");
        }
        // A connection string next to identity settings: neither value is echoed.
        let e = read(
            "C",
            &[
                (
                    "C",
                    &format!("AccountName=a;AccountKey={DEVELOPMENT_ACCOUNT_KEY}"),
                ),
                ("C__clientSecret", SECRET),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(
            !e.contains(SECRET) && !e.contains(DEVELOPMENT_ACCOUNT_KEY),
            "{e}"
        );
    }
}
