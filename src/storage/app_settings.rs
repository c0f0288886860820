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
            return from_connection_string(name, &connection_string, identity_keys.first());
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
        let by_account = account.is_some();
        let (account_name, table_endpoint, queue_endpoint) =
            identity_endpoints(name, account, table, queue, identity_keys.first())?;
        let blob_endpoint = blob_endpoint(name, &account_name, blob, by_account)?;
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

/// The connection string in the setting `name`; `identity_key` is the first identity-based
/// setting also set, if any (both forms at once is an error).
fn from_connection_string(
    name: &str,
    connection_string: &str,
    identity_key: Option<&String>,
) -> Result<ConnectionSettings, ConnectionSettingError> {
    if let Some(first) = identity_key {
        return Err(err(
            name,
            format!(
                "holds a connection string and {first} is also set; use one form: the \
                 connection string, or the identity-based {name}__* settings"
            ),
        ));
    }
    let mut settings = ConnectionSettings::parse(connection_string)
        .map_err(|ConnectionStringError(m)| err(name, format!("storage connection string: {m}")))?;
    if let Err(missing) = &mut settings.blob_endpoint {
        *missing = format!("app setting {name}: {missing}");
    }
    Ok(settings)
}

/// The account name and the table and queue endpoints of an identity-based connection: from
/// `<name>__accountName`, or from `<name>__tableServiceUri` + `<name>__queueServiceUri`.
fn identity_endpoints(
    name: &str,
    account: Option<String>,
    table: Option<String>,
    queue: Option<String>,
    identity_key: Option<&String>,
) -> Result<(String, String, String), ConnectionSettingError> {
    let key = |suffix: &str| format!("{name}__{suffix}");
    match (account, table, queue) {
        (None, None, None) => {
            let detail = match identity_key {
                Some(k) => format!(" ({k} is set, but says nothing about which account)"),
                None => String::new(),
            };
            Err(err(
                name,
                format!(
                    "is not set: give a storage connection string, or the identity-based \
                     {} or {} + {}{detail}",
                    key(ACCOUNT_NAME),
                    key(TABLE_SERVICE_URI),
                    key(QUEUE_SERVICE_URI)
                ),
            ))
        }
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => Err(err(
            key(ACCOUNT_NAME),
            format!(
                "give either {} or the service URIs ({}, {}), not both",
                key(ACCOUNT_NAME),
                key(TABLE_SERVICE_URI),
                key(QUEUE_SERVICE_URI)
            ),
        )),
        (Some(account), None, None) => account_endpoints(&key(ACCOUNT_NAME), account),
        (None, table, queue) => service_uri_endpoints(
            &key(TABLE_SERVICE_URI),
            &key(QUEUE_SERVICE_URI),
            table,
            queue,
        ),
    }
}

/// The public-cloud endpoints of the account named in `setting` (`<name>__accountName`).
fn account_endpoints(
    setting: &str,
    account: String,
) -> Result<(String, String, String), ConnectionSettingError> {
    if !(3..=24).contains(&account.len())
        || !account
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(err(
            setting,
            format!(
                "`{account}` is not a storage account name (3 to 24 lowercase letters and digits)"
            ),
        ));
    }
    let table = format!("https://{account}.table.core.windows.net");
    let queue = format!("https://{account}.queue.core.windows.net");
    Ok((account, table, queue))
}

/// The account and endpoints from the table and queue service URIs (both required).
fn service_uri_endpoints(
    table_key: &str,
    queue_key: &str,
    table: Option<String>,
    queue: Option<String>,
) -> Result<(String, String, String), ConnectionSettingError> {
    let table = table.ok_or_else(|| err(table_key, format!("is required with {queue_key}")))?;
    let queue = queue.ok_or_else(|| err(queue_key, format!("is required with {table_key}")))?;
    let table = service_uri(table_key, &table)?;
    let queue = service_uri(queue_key, &queue)?;
    let account = account_from_endpoint(&table).ok_or_else(|| {
        err(
            table_key,
            "names no storage account (neither in its host nor its path)",
        )
    })?;
    Ok((account, table, queue))
}

/// The blob endpoint of an identity-based connection: `<name>__blobServiceUri`, the account's
/// public-cloud endpoint when the connection names an account (`by_account`), or else the error
/// a blob operation will report (a connection without Blob Storage is still usable).
fn blob_endpoint(
    name: &str,
    account_name: &str,
    blob: Option<String>,
    by_account: bool,
) -> Result<Result<String, String>, ConnectionSettingError> {
    let key = |suffix: &str| format!("{name}__{suffix}");
    Ok(match blob {
        Some(blob) => Ok(service_uri(&key(BLOB_SERVICE_URI), &blob)?),
        None if by_account => Ok(format!("https://{account_name}.blob.core.windows.net")),
        None => Err(format!(
            "app setting {}: is not set, and connection {name} needs it to use Blob Storage \
             (it gives {} and {} only)",
            key(BLOB_SERVICE_URI),
            key(TABLE_SERVICE_URI),
            key(QUEUE_SERVICE_URI)
        )),
    })
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

/// The companions of `<name>__credential`, each read once; `get` reads any other setting.
struct CredentialSettings<'a, G> {
    name: &'a str,
    get: &'a G,
    client_id: Option<String>,
    client_secret: Option<String>,
    tenant_id: Option<String>,
    resource_id: Option<String>,
}

impl<G: Fn(&str) -> Option<String>> CredentialSettings<'_, G> {
    fn key(&self, suffix: &str) -> String {
        format!("{}__{suffix}", self.name)
    }

    /// `suffix` is set, but the `kind` credential does not use it.
    fn unexpected(&self, suffix: &str, kind: &str) -> ConnectionSettingError {
        err(
            self.key(suffix),
            format!(
                "is not used with the {kind} credential; remove it or change {}",
                self.key(CREDENTIAL)
            ),
        )
    }

    fn managed_identity(&self) -> Result<TokenSource, ConnectionSettingError> {
        if self.client_secret.is_some() {
            return Err(self.unexpected(CLIENT_SECRET, "managedidentity"));
        }
        if self.tenant_id.is_some() {
            return Err(self.unexpected(TENANT_ID, "managedidentity"));
        }
        let id = match (&self.client_id, &self.resource_id) {
            (Some(_), Some(_)) => {
                return Err(err(
                    self.key(RESOURCE_ID),
                    format!(
                        "give {} or {}, not both",
                        self.key(CLIENT_ID),
                        self.key(RESOURCE_ID)
                    ),
                ))
            }
            (Some(id), None) => ManagedIdentityId::ClientId(id.clone()),
            (None, Some(id)) => ManagedIdentityId::ResourceId(id.clone()),
            (None, None) => ManagedIdentityId::System,
        };
        let endpoint = managed_identity_endpoint(self.name, self.get)?;
        Ok(TokenSource::ManagedIdentity { endpoint, id })
    }

    fn client_secret(&self) -> Result<TokenSource, ConnectionSettingError> {
        if self.resource_id.is_some() {
            return Err(self.unexpected(RESOURCE_ID, "clientsecret"));
        }
        let why = "for the clientsecret credential";
        Ok(TokenSource::ClientSecret {
            tenant_id: required(self.tenant_id.clone(), self.key(TENANT_ID), why)?,
            client_id: required(self.client_id.clone(), self.key(CLIENT_ID), why)?,
            client_secret: required(self.client_secret.clone(), self.key(CLIENT_SECRET), why)?,
        })
    }

    fn workload_identity(&self) -> Result<TokenSource, ConnectionSettingError> {
        if self.client_secret.is_some() {
            return Err(self.unexpected(CLIENT_SECRET, "workloadidentity"));
        }
        if self.resource_id.is_some() {
            return Err(self.unexpected(RESOURCE_ID, "workloadidentity"));
        }
        let why = "for the workloadidentity credential";
        let get = self.get;
        let tenant_id = self.tenant_id.clone().or_else(|| get(AZURE_TENANT_ID));
        let client_id = self.client_id.clone().or_else(|| get(AZURE_CLIENT_ID));
        Ok(TokenSource::WorkloadIdentity {
            tenant_id: required(
                tenant_id,
                self.key(TENANT_ID),
                &format!("(or {AZURE_TENANT_ID}) {why}"),
            )?,
            client_id: required(
                client_id,
                self.key(CLIENT_ID),
                &format!("(or {AZURE_CLIENT_ID}) {why}"),
            )?,
            token_file: required(
                get(AZURE_FEDERATED_TOKEN_FILE),
                AZURE_FEDERATED_TOKEN_FILE.to_string(),
                &format!("{why} of connection {}", self.name),
            )?,
        })
    }

    fn azure_cli(&self) -> Result<TokenSource, ConnectionSettingError> {
        for (value, setting) in [
            (&self.client_id, CLIENT_ID),
            (&self.client_secret, CLIENT_SECRET),
            (&self.tenant_id, TENANT_ID),
            (&self.resource_id, RESOURCE_ID),
        ] {
            if value.is_some() {
                return Err(self.unexpected(setting, "azurecli"));
            }
        }
        Ok(TokenSource::AzureCli)
    }
}

/// `value`, or an error saying `setting` is required (`why`).
fn required(
    value: Option<String>,
    setting: String,
    why: &str,
) -> Result<String, ConnectionSettingError> {
    value.ok_or_else(|| err(setting, format!("is required {why}")))
}

/// The connection's [`TokenSource`] from `<name>__credential` and its companions.
fn token_source(
    name: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<TokenSource, ConnectionSettingError> {
    let key = |suffix: &str| format!("{name}__{suffix}");
    let settings = CredentialSettings {
        name,
        get,
        client_id: get(&key(CLIENT_ID)),
        client_secret: get(&key(CLIENT_SECRET)),
        tenant_id: get(&key(TENANT_ID)),
        resource_id: get(&key(RESOURCE_ID)),
    };
    let kind = match get(&key(CREDENTIAL)) {
        Some(value) => value.to_ascii_lowercase(),
        None if settings.client_secret.is_some() => "clientsecret".into(),
        None if get(AZURE_FEDERATED_TOKEN_FILE).is_some() => "workloadidentity".into(),
        None => "managedidentity".into(),
    };
    match kind.as_str() {
        "managedidentity" => settings.managed_identity(),
        "clientsecret" => settings.client_secret(),
        "workloadidentity" => settings.workload_identity(),
        "azurecli" => settings.azure_cli(),
        other => Err(err(
            key(CREDENTIAL),
            format!(
                "`{other}` is not a credential tablescan knows; use managedidentity, clientsecret, \
                 workloadidentity or azurecli"
            ),
        )),
    }
}

/// Where the managed identity's tokens come from: the App Service/Functions endpoint when
/// `IDENTITY_ENDPOINT` is set (with its header), IMDS otherwise.
fn managed_identity_endpoint(
    name: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<ManagedIdentityEndpoint, ConnectionSettingError> {
    match (get(IDENTITY_ENDPOINT), get(IDENTITY_HEADER)) {
        (Some(endpoint), Some(header)) => {
            let url = Url::parse(&endpoint)
                .map_err(|e| err(IDENTITY_ENDPOINT, format!("is not a URL ({e})")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(err(IDENTITY_ENDPOINT, "must be an http(s) URL with a host"));
            }
            Ok(ManagedIdentityEndpoint::AppService { endpoint, header })
        }
        (Some(_), None) => Err(err(
            IDENTITY_HEADER,
            format!(
                "is required with {IDENTITY_ENDPOINT} (the managed identity of connection {name})"
            ),
        )),
        (None, _) => Ok(ManagedIdentityEndpoint::Imds),
    }
}

#[cfg(test)]
#[path = "app_settings_tests.rs"]
mod tests;
