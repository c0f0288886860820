//! App settings, parsed once from the environment into a typed struct.
//!
//! Every setting the handler reads is here, with its default; README.md documents each one and
//! `local.settings.sample.json` lists them all.

use std::collections::BTreeMap;
use std::fmt;

use azure_core::Url;

use crate::app::catalog::{
    Trigger, FUNCTIONS, PREFIX_SCAN_QUEUE_SETTING, TABLE_COPY_QUEUE_SETTING,
};
use crate::scan::StepBudget;
use crate::storage::connection::ConnectionSettings;

/// The app setting holding the function app's own storage connection string (queues, bookkeeping,
/// and the default account for source and destination tables).
pub const STORAGE_SETTING: &str = "AzureWebJobsStorage";

/// The app settings a deployment must set, by name: the app's own storage connection
/// ([`STORAGE_SETTING`], a connection string or its identity-based `<NAME>__*` form; the handler
/// does not start without it), then every setting a queue function names as a `%…%` token in its
/// function.json (the Functions host has no defaults for those: it does not load the function
/// while one is unset). Every other setting has a default ([`Config::from_lookup`]).
pub fn required_settings() -> Vec<&'static str> {
    let mut names = vec![STORAGE_SETTING];
    for function in FUNCTIONS {
        if let Trigger::Queue { queue_setting, .. } = function.trigger {
            if !names.contains(&queue_setting) {
                names.push(queue_setting);
            }
        }
    }
    names
}

/// The handler's configuration.
#[derive(Clone)]
pub struct Config {
    /// Port the Functions host told us to listen on (`FUNCTIONS_CUSTOMHANDLER_PORT`).
    pub port: u16,
    /// Queue of prefix-scan steps (`TABLESCAN_PREFIXSCAN_QUEUE`, default `tablescan-prefixscan`).
    pub prefix_scan_queue: String,
    /// Queue of table-copy work (`TABLESCAN_TABLECOPY_QUEUE`, default `tablescan-tablecopy`).
    pub table_copy_queue: String,
    /// Table of scan records (`TABLESCAN_SCANS_TABLE`, default `TablescanScans`).
    pub scans_table: String,
    /// Table of pending-work rows and sharded counters (`TABLESCAN_WORK_TABLE`, default `TablescanWork`).
    pub work_table: String,
    /// Connections a scan request may name, by app-setting name. Always holds
    /// `AzureWebJobsStorage`; others come from `TABLESCAN_CONNECTIONS` (comma-separated names).
    /// Each is a connection string in the setting itself or the identity-based `<NAME>__*`
    /// settings (`<NAME>__accountName`, or `<NAME>__tableServiceUri` + `__queueServiceUri`, with
    /// `__credential`). They hold secrets: only their names are logged.
    pub connections: BTreeMap<String, ConnectionSettings>,
    /// The table service each connection resolves to, by app-setting name: its table endpoint,
    /// lowercased, without credentials or trailing slash (see [`table_identity`]). Two settings
    /// with equal identities reach the same tables. Not secret.
    pub table_identities: BTreeMap<String, String>,
    /// Must equal host.json `extensions.queues.maxDequeueCount` (`TABLESCAN_MAX_DEQUEUE_COUNT`,
    /// default 5): on the last attempt a failing work item is recorded as failed before the host
    /// moves its message to the poison queue.
    pub max_dequeue_count: u64,
    /// Counter shards (partitions) per scan (`TABLESCAN_COUNTER_SHARDS`, default 16, 1..=64).
    pub counter_shards: u32,
    /// Entity group transactions in flight per copy invocation (`TABLESCAN_COPY_CONCURRENCY`, default 8).
    pub copy_concurrency: usize,
    /// How much one scan step may read before continuing in a new message.
    pub step_budget: StepBudget,
    /// Test-only fault switch (`TABLESCAN_TEST_FAIL_PREFIX`): work items whose step touches a
    /// partition key with this prefix fail every attempt. Unset in production.
    pub test_fail_prefix: Option<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Connections hold account keys and client secrets: print only their names.
        f.debug_struct("Config")
            .field("port", &self.port)
            .field("prefix_scan_queue", &self.prefix_scan_queue)
            .field("table_copy_queue", &self.table_copy_queue)
            .field("scans_table", &self.scans_table)
            .field("work_table", &self.work_table)
            .field("connections", &self.connections.keys().collect::<Vec<_>>())
            .field("table_identities", &self.table_identities)
            .field("max_dequeue_count", &self.max_dequeue_count)
            .field("counter_shards", &self.counter_shards)
            .field("copy_concurrency", &self.copy_concurrency)
            .field("step_budget", &self.step_budget)
            .finish()
    }
}

/// A setting that is missing or unusable.
#[derive(Debug, thiserror::Error)]
#[error("app setting {name}: {message}")]
pub struct ConfigError {
    pub name: String,
    pub message: String,
}

fn err(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        name: name.to_string(),
        message: message.into(),
    }
}

/// The table service a connection string resolves to (see [`table_identity_of`]). The error
/// never contains the connection string.
pub fn table_identity(connection_string: &str) -> Result<String, String> {
    let settings = ConnectionSettings::parse(connection_string).map_err(|e| e.to_string())?;
    table_identity_of(&settings)
}

/// The table service a connection resolves to, whatever its form (connection string or
/// identity-based): scheme, host, port and path of its table endpoint, lowercased (storage
/// account names and DNS hosts are case-insensitive), without any credential or trailing slash.
/// `UseDevelopmentStorage=true` and an explicit endpoint naming the same Azurite account resolve
/// alike, as do `__accountName=prod` and `AccountName=prod;AccountKey=…`.
pub fn table_identity_of(settings: &ConnectionSettings) -> Result<String, String> {
    let url = Url::parse(&settings.table_endpoint)
        .map_err(|e| format!("the table endpoint is not a URL ({e})"))?;
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    Ok(format!(
        "{}://{}{port}{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.path().trim_end_matches('/')
    )
    .to_ascii_lowercase())
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let number = |name: &str, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
            match get(name) {
                None => Ok(default),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if (min..=max).contains(&n) => Ok(n),
                    _ => Err(err(
                        name,
                        format!("must be a whole number from {min} to {max}, got {v:?}"),
                    )),
                },
            }
        };
        let port = match get("FUNCTIONS_CUSTOMHANDLER_PORT") {
            None => 0,
            Some(v) => v
                .parse()
                .map_err(|_| err("FUNCTIONS_CUSTOMHANDLER_PORT", format!("not a port: {v:?}")))?,
        };
        let connection = |name: &str| {
            ConnectionSettings::from_app_settings(name, &lookup).map_err(|e| ConfigError {
                name: e.setting,
                message: e.message,
            })
        };
        let mut connections = BTreeMap::new();
        connections.insert(STORAGE_SETTING.to_string(), connection(STORAGE_SETTING)?);
        if let Some(names) = get("TABLESCAN_CONNECTIONS") {
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let settings = connection(name).map_err(|e| {
                    match e.name == name && e.message.starts_with("is not set") {
                        // Say where the name came from.
                        true => err(
                            "TABLESCAN_CONNECTIONS",
                            format!("names {name}, but app setting {name} {}", e.message),
                        ),
                        false => e,
                    }
                })?;
                connections.insert(name.to_string(), settings);
            }
        }
        let table_identities = connections
            .iter()
            .map(|(name, settings)| {
                Ok((
                    name.clone(),
                    table_identity_of(settings).map_err(|m| err(name, m))?,
                ))
            })
            .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
        let queue = |name: &str, default: &str| -> Result<String, ConfigError> {
            let value = get(name).unwrap_or_else(|| default.to_string());
            crate::app::validate::queue_name(&value).map_err(|m| err(name, m))?;
            Ok(value)
        };
        let table = |name: &str, default: &str| -> Result<String, ConfigError> {
            let value = get(name).unwrap_or_else(|| default.to_string());
            crate::app::validate::table_name(&value).map_err(|m| err(name, m))?;
            Ok(value)
        };
        Ok(Config {
            port,
            prefix_scan_queue: queue(PREFIX_SCAN_QUEUE_SETTING, "tablescan-prefixscan")?,
            table_copy_queue: queue(TABLE_COPY_QUEUE_SETTING, "tablescan-tablecopy")?,
            scans_table: table("TABLESCAN_SCANS_TABLE", "TablescanScans")?,
            work_table: table("TABLESCAN_WORK_TABLE", "TablescanWork")?,
            connections,
            table_identities,
            max_dequeue_count: number("TABLESCAN_MAX_DEQUEUE_COUNT", 5, 1, 1000)?,
            counter_shards: number("TABLESCAN_COUNTER_SHARDS", 16, 1, 64)? as u32,
            copy_concurrency: number("TABLESCAN_COPY_CONCURRENCY", 8, 1, 64)? as usize,
            step_budget: StepBudget::default(),
            test_fail_prefix: get("TABLESCAN_TEST_FAIL_PREFIX"),
        })
    }

    /// Whether `table` on `connection` is one of the app's bookkeeping tables (on the app's own
    /// account, however the connection is named; table names are case-insensitive).
    pub fn is_bookkeeping_table(&self, connection: &str, table: &str) -> bool {
        let own = self.table_identities.get(STORAGE_SETTING);
        own.is_some()
            && self.table_identities.get(connection) == own
            && [&self.scans_table, &self.work_table]
                .iter()
                .any(|t| t.eq_ignore_ascii_case(table))
    }

    /// Whether two (connection, table) pairs name the same table: same table service and the
    /// same name up to case.
    pub fn same_table(&self, a: (&str, &str), b: (&str, &str)) -> bool {
        let (ia, ib) = (
            self.table_identities.get(a.0),
            self.table_identities.get(b.0),
        );
        ia.is_some() && ia == ib && a.1.eq_ignore_ascii_case(b.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::storage::connection::DEVELOPMENT_ACCOUNT_KEY as KEY;

    #[test]
    fn identities_resolve_accounts_not_setting_names() {
        let dev = table_identity("UseDevelopmentStorage=true").unwrap();
        assert_eq!(dev, "http://127.0.0.1:10002/devstoreaccount1");
        let explicit = format!(
            "AccountName=devstoreaccount1;AccountKey={KEY};TableEndpoint=HTTP://127.0.0.1:10002/DevStoreAccount1/;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1"
        );
        assert_eq!(table_identity(&explicit).unwrap(), dev);
        let derived = format!("DefaultEndpointsProtocol=https;AccountName=Prod;AccountKey={KEY}");
        let explicit_443 = format!(
            "AccountName=prod;AccountKey={KEY};TableEndpoint=https://prod.table.core.windows.net:443;QueueEndpoint=https://prod.queue.core.windows.net"
        );
        assert_eq!(
            table_identity(&derived).unwrap(),
            "https://prod.table.core.windows.net"
        );
        assert_eq!(
            table_identity(&explicit_443).unwrap(),
            table_identity(&derived).unwrap()
        );
        let error = table_identity(&format!(
            "AccountName=x;AccountKey={KEY};TableEndpoint=nope"
        ))
        .unwrap_err();
        assert!(!error.contains(KEY), "{error}");

        let settings: BTreeMap<&str, String> = [
            (
                "AzureWebJobsStorage",
                "UseDevelopmentStorage=true".to_string(),
            ),
            ("TABLESCAN_CONNECTIONS", "Alias, Other".to_string()),
            ("Alias", explicit),
            ("Other", derived),
        ]
        .into_iter()
        .collect();
        let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
        assert!(config.is_bookkeeping_table("Alias", "tablescanscans"));
        assert!(config.is_bookkeeping_table(STORAGE_SETTING, "TABLESCANWORK"));
        assert!(!config.is_bookkeeping_table("Other", "TablescanScans"));
        assert!(!config.is_bookkeeping_table(STORAGE_SETTING, "Packages"));
        assert!(config.same_table((STORAGE_SETTING, "Packages"), ("Alias", "packages")));
        assert!(!config.same_table((STORAGE_SETTING, "Packages"), ("Other", "Packages")));
        assert!(!format!("{config:?}").contains(KEY));
    }

    #[test]
    fn identity_based_connections_resolve_to_the_same_accounts() {
        let settings: BTreeMap<&str, String> = [
            ("AzureWebJobsStorage__accountName", "prod".to_string()),
            ("TABLESCAN_CONNECTIONS", "Keyed,Local".to_string()),
            (
                "Keyed",
                format!("DefaultEndpointsProtocol=https;AccountName=PROD;AccountKey={KEY}"),
            ),
            (
                "Local__tableServiceUri",
                "https://127.0.0.1:10102/devstoreaccount1".to_string(),
            ),
            (
                "Local__queueServiceUri",
                "https://127.0.0.1:10101/devstoreaccount1".to_string(),
            ),
            ("Local__credential", "azurecli".to_string()),
        ]
        .into_iter()
        .collect();
        let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
        assert_eq!(
            config.table_identities[STORAGE_SETTING],
            "https://prod.table.core.windows.net"
        );
        assert!(config.same_table((STORAGE_SETTING, "T"), ("Keyed", "t")));
        assert!(config.is_bookkeeping_table("Keyed", "TablescanScans"));
        assert!(!config.same_table((STORAGE_SETTING, "T"), ("Local", "T")));
        assert_eq!(
            config.table_identities["Local"],
            "https://127.0.0.1:10102/devstoreaccount1"
        );
        assert!(!format!("{config:?}").contains(KEY));

        let error = |pairs: &[(&str, &str)]| {
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::from_lookup(|k| map.get(k).cloned()).unwrap_err()
        };
        let e = error(&[]);
        assert_eq!(e.name, STORAGE_SETTING);
        assert!(
            e.message.contains("AzureWebJobsStorage__accountName"),
            "{e}"
        );
        let e = error(&[
            ("AzureWebJobsStorage__accountName", "prod"),
            ("TABLESCAN_CONNECTIONS", "Missing"),
        ]);
        assert_eq!(e.name, "TABLESCAN_CONNECTIONS");
        assert!(
            e.to_string()
                .contains("names Missing, but app setting Missing is not set"),
            "{e}"
        );
        let e = error(&[
            ("AzureWebJobsStorage__accountName", "prod"),
            ("AzureWebJobsStorage__credential", "password"),
        ]);
        assert_eq!(e.name, "AzureWebJobsStorage__credential");
        let e = error(&[
            ("AzureWebJobsStorage", "UseDevelopmentStorage=true"),
            ("TABLESCAN_CONNECTIONS", "Both"),
            ("Both", "UseDevelopmentStorage=true"),
            ("Both__accountName", "prod"),
        ]);
        assert_eq!(e.name, "Both");
        assert!(e.message.contains("use one form"), "{e}");
    }
}
