//! App settings, parsed once from the environment into a typed struct.
//!
//! Every setting the handler reads is here, with its default; README.md documents each one and
//! `local.settings.sample.json` lists them all.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::app::catalog::{
    Trigger, CLEANUP_SUFFIX, FUNCTIONS, PREFIX_SCAN_QUEUE_SETTING, TABLE_COPY_QUEUE_SETTING,
};
use crate::app::tracking::retention::{self, Retention};
use crate::scan::StepBudget;
use crate::storage::connection::{AccountIdentity, ConnectionSettings, Service};

/// The app setting holding the function app's own storage connection string (queues, bookkeeping,
/// and the default account for source and destination tables).
pub const STORAGE_SETTING: &str = "AzureWebJobsStorage";

/// The app settings a deployment must set, by name: the app's own storage connection
/// ([`STORAGE_SETTING`], a connection string or its identity-based `<NAME>__*` form; the handler
/// does not start without it), then every setting a queue or timer function names as a `%…%` token in its
/// function.json (the Functions host has no defaults for those: it does not load the function
/// while one is unset). Every other setting has a default ([`Config::from_lookup`]).
pub fn required_settings() -> Vec<&'static str> {
    let mut names = vec![STORAGE_SETTING];
    for function in FUNCTIONS {
        let setting = match function.trigger {
            Trigger::Queue { queue_setting, .. } => queue_setting,
            Trigger::Timer { schedule_setting } => schedule_setting,
            Trigger::Http { .. } => continue,
        };
        if !names.contains(&setting) {
            names.push(setting);
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
    /// The account each connection's table endpoint addresses, by app-setting name (see
    /// [`AccountIdentity`]). Two settings with equal identities reach the same tables, whatever
    /// the endpoints' text (`localhost` and `127.0.0.1`, a private-link host). Not secret.
    pub table_accounts: BTreeMap<String, AccountIdentity>,
    /// Likewise for blob endpoints, for the connections that give one.
    pub blob_accounts: BTreeMap<String, AccountIdentity>,
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
    /// How long one execution of a paced driver's work (the enqueue driver's puts) starts new
    /// work before it hands the rows it did not reach to a work item of their own
    /// (`TABLESCAN_HAND_OFF_SECONDS`, default 60, 1..=300; `job::Worked`): a step's puts at its
    /// share of a scan's rate would otherwise outlast the invocation (docs/enqueue.md).
    pub hand_off_after: Duration,
    /// How long an ended scan keeps its work rows (`TABLESCAN_WORK_RETENTION`, default `1d`)
    /// and its record (`TABLESCAN_SCAN_RETENTION`, default `30d`), counted from its end.
    pub retention: Retention,
    /// Queue of retention cleanups: the scan step queue's name plus `-cleanup`.
    pub cleanup_queue: String,
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
            .field("table_accounts", &self.table_accounts)
            .field("blob_accounts", &self.blob_accounts)
            .field("max_dequeue_count", &self.max_dequeue_count)
            .field("counter_shards", &self.counter_shards)
            .field("copy_concurrency", &self.copy_concurrency)
            .field("step_budget", &self.step_budget)
            .field("hand_off_after", &self.hand_off_after)
            .field("retention", &self.retention)
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

/// The account a connection string's table endpoint addresses (see [`table_account_of`]). The
/// error never contains the connection string.
pub fn table_account(connection_string: &str) -> Result<AccountIdentity, String> {
    let settings = ConnectionSettings::parse(connection_string).map_err(|e| e.to_string())?;
    table_account_of(&settings)
}

/// The account a connection's table endpoint addresses, whatever the connection's form
/// (connection string or identity-based) and however its endpoint is spelled:
/// `UseDevelopmentStorage=true` and an explicit endpoint naming the same Azurite account by
/// `localhost` resolve alike, as do `__accountName=prod` and `AccountName=prod;AccountKey=…`.
pub fn table_account_of(settings: &ConnectionSettings) -> Result<AccountIdentity, String> {
    AccountIdentity::of_endpoint(&settings.table_endpoint)
        .map_err(|e| format!("the table endpoint: {e}"))
}

/// The retention periods: each a period `parse_period` reads, 1 s to 3,650 days, and a scan's
/// record kept at least as long as its work rows.
fn retention_settings(get: &dyn Fn(&str) -> Option<String>) -> Result<Retention, ConfigError> {
    let period = |name: &str, default: &str| {
        let text = get(name).unwrap_or_else(|| default.to_string());
        // A whole number and a unit, nothing else (no spaces, no sign).
        let number = text.get(..text.len().saturating_sub(1)).unwrap_or_default();
        if !digits(number) {
            return Err(err(
                name,
                format!("{text:?} is not a period like 90s, 15m, 36h or 30d"),
            ));
        }
        let period = retention::parse_period(&text).map_err(|m| err(name, m))?;
        match period.as_secs() {
            1..=315_360_000 => Ok(period),
            _ => Err(err(name, format!("{text:?} is not from 1s to 3650d"))),
        }
    };
    let work = period("TABLESCAN_WORK_RETENTION", "1d")?;
    let scan = period("TABLESCAN_SCAN_RETENTION", "30d")?;
    if scan < work {
        return Err(err(
            "TABLESCAN_SCAN_RETENTION",
            "must be at least TABLESCAN_WORK_RETENTION: a scan's record outlives its work rows",
        ));
    }
    if work < retention::SAFE_WORK_RETENTION {
        tracing::warn!(
            "app setting TABLESCAN_WORK_RETENTION is below 15m: an invocation that began before a scan ended may still run when its work rows are deleted (see docs/retention.md)"
        );
    }
    Ok(Retention { work, scan })
}

/// Whether `text` is a whole number as a setting may write it: ASCII digits only, at least one
/// (no spaces, no sign).
fn digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// The app's own storage connection and every one named in `TABLESCAN_CONNECTIONS`.
fn connections(
    lookup: &impl Fn(&str) -> Option<String>,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, ConnectionSettings>, ConfigError> {
    let connection = |name: &str| {
        ConnectionSettings::from_app_settings(name, lookup).map_err(|e| ConfigError {
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
    Ok(connections)
}

/// An account identity by connection name.
type AccountsByConnection = BTreeMap<String, AccountIdentity>;

/// The table and the blob account of every connection, by connection name (a connection
/// without Blob Storage has no blob account).
fn accounts(
    connections: &BTreeMap<String, ConnectionSettings>,
) -> Result<(AccountsByConnection, AccountsByConnection), ConfigError> {
    let table_accounts = connections
        .iter()
        .map(|(name, settings)| {
            Ok((
                name.clone(),
                table_account_of(settings).map_err(|m| err(name, m))?,
            ))
        })
        .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
    let blob_accounts = connections
        .iter()
        .filter_map(|(name, settings)| Some((name, settings.blob_endpoint().ok()?)))
        .map(|(name, endpoint)| {
            let account = AccountIdentity::of_endpoint(endpoint)
                .map_err(|m| err(name, format!("the blob endpoint: {m}")))?;
            Ok((name.clone(), account))
        })
        .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
    Ok((table_accounts, blob_accounts))
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        // A value is taken as written: an empty one means the default (a setting cannot always
        // be deleted where it is set), any other is checked as it is, so that spaces around a
        // value are refused, naming the setting, instead of being read as another value.
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let number = |name: &str, default: u64, min: u64, max: u64| -> Result<u64, ConfigError> {
            match get(name) {
                None => Ok(default),
                Some(v) => match digits(&v).then(|| v.parse::<u64>()) {
                    Some(Ok(n)) if (min..=max).contains(&n) => Ok(n),
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
        let connections = connections(&lookup, &get)?;
        let (table_accounts, blob_accounts) = accounts(&connections)?;
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
        let prefix_scan_queue = queue(PREFIX_SCAN_QUEUE_SETTING, "tablescan-prefixscan")?;
        let cleanup_queue = format!("{prefix_scan_queue}{CLEANUP_SUFFIX}");
        crate::app::validate::queue_name(&cleanup_queue).map_err(|m| {
            err(
                PREFIX_SCAN_QUEUE_SETTING,
                format!("with {CLEANUP_SUFFIX}: {m}"),
            )
        })?;
        Ok(Config {
            port,
            prefix_scan_queue,
            cleanup_queue,
            retention: retention_settings(&get)?,
            table_copy_queue: queue(TABLE_COPY_QUEUE_SETTING, "tablescan-tablecopy")?,
            scans_table: table("TABLESCAN_SCANS_TABLE", "TablescanScans")?,
            work_table: table("TABLESCAN_WORK_TABLE", "TablescanWork")?,
            connections,
            table_accounts,
            blob_accounts,
            max_dequeue_count: number("TABLESCAN_MAX_DEQUEUE_COUNT", 5, 1, 1000)?,
            counter_shards: number("TABLESCAN_COUNTER_SHARDS", 16, 1, 64)? as u32,
            copy_concurrency: number("TABLESCAN_COPY_CONCURRENCY", 8, 1, 64)? as usize,
            step_budget: StepBudget::default(),
            hand_off_after: Duration::from_secs(number("TABLESCAN_HAND_OFF_SECONDS", 60, 1, 300)?),
            test_fail_prefix: get("TABLESCAN_TEST_FAIL_PREFIX"),
        })
    }

    /// Whether `table` is named as one of the app's bookkeeping tables (table names are
    /// case-insensitive). Refused as a source or destination on every connection, whatever
    /// account it reaches: an alias of the app's own account that is not recognised as one
    /// (a custom domain's CNAME) must not reach them either.
    pub fn is_bookkeeping_table(&self, _connection: &str, table: &str) -> bool {
        [&self.scans_table, &self.work_table]
            .iter()
            .any(|t| t.eq_ignore_ascii_case(table))
    }

    /// Whether two (connection, table) pairs name the same table: the same account (see
    /// [`AccountIdentity`]) and the same name up to case.
    pub fn same_table(&self, a: (&str, &str), b: (&str, &str)) -> bool {
        let (ia, ib) = (self.table_accounts.get(a.0), self.table_accounts.get(b.0));
        ia.is_some() && ia == ib && a.1.eq_ignore_ascii_case(b.1)
    }

    /// Whether two connections' blob endpoints address the same account (`false` when either
    /// gives no blob endpoint). For drivers that must tell a container on one account from the
    /// same-named container on another.
    pub fn same_blob_account(&self, a: &str, b: &str) -> bool {
        let (ia, ib) = (self.blob_accounts.get(a), self.blob_accounts.get(b));
        ia.is_some() && ia == ib
    }

    /// Whether `connection`'s table endpoint is an Azure Cosmos DB for Table account, which
    /// does not return rows in key order.
    pub fn is_cosmos_table(&self, connection: &str) -> bool {
        self.table_accounts
            .get(connection)
            .is_some_and(|a| a.service == Service::CosmosTable)
    }
}

/// A configuration with only `AzureWebJobsStorage` set (to the local emulator): for unit tests.
#[cfg(test)]
pub fn emulator_only() -> Config {
    Config::from_lookup(|name| {
        (name == STORAGE_SETTING).then(|| "UseDevelopmentStorage=true".to_string())
    })
    .expect("a valid configuration")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::storage::connection::DEVELOPMENT_ACCOUNT_KEY as KEY;

    #[test]
    fn identities_resolve_accounts_not_setting_names() {
        let dev = table_account("UseDevelopmentStorage=true").unwrap();
        assert_eq!(
            dev.to_string(),
            "storage account \"devstoreaccount1\" at localhost:10002"
        );
        let explicit = format!(
            "AccountName=devstoreaccount1;AccountKey={KEY};TableEndpoint=HTTP://127.0.0.1:10002/DevStoreAccount1/;QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1"
        );
        assert_eq!(table_account(&explicit).unwrap(), dev);
        let by_localhost = format!(
            "AccountName=devstoreaccount1;AccountKey={KEY};TableEndpoint=http://localhost:10002/devstoreaccount1;QueueEndpoint=http://localhost:10001/devstoreaccount1;BlobEndpoint=http://[::1]:10000/devstoreaccount1"
        );
        assert_eq!(table_account(&by_localhost).unwrap(), dev);
        let derived = format!("DefaultEndpointsProtocol=https;AccountName=Prod;AccountKey={KEY}");
        let explicit_443 = format!(
            "AccountName=prod;AccountKey={KEY};TableEndpoint=https://prod.privatelink.table.core.windows.net:443;QueueEndpoint=https://prod.queue.core.windows.net"
        );
        assert_eq!(table_account(&derived).unwrap().account, "prod");
        assert_eq!(
            table_account(&explicit_443).unwrap(),
            table_account(&derived).unwrap()
        );
        let error = table_account(&format!(
            "AccountName=x;AccountKey={KEY};TableEndpoint=nope"
        ))
        .unwrap_err();
        assert!(!error.contains(KEY), "{error}");

        let settings: BTreeMap<&str, String> = [
            (
                "AzureWebJobsStorage",
                "UseDevelopmentStorage=true".to_string(),
            ),
            ("TABLESCAN_CONNECTIONS", "Alias, Other, Local".to_string()),
            ("Alias", explicit),
            ("Other", derived),
            ("Local", by_localhost),
        ]
        .into_iter()
        .collect();
        let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
        assert!(config.is_bookkeeping_table("Alias", "tablescanscans"));
        assert!(config.is_bookkeeping_table(STORAGE_SETTING, "TABLESCANWORK"));
        // Refused by name on every connection, whatever account it reaches.
        assert!(config.is_bookkeeping_table("Other", "TablescanScans"));
        assert!(config.is_bookkeeping_table("Local", "tablescanwork"));
        assert!(!config.is_bookkeeping_table(STORAGE_SETTING, "Packages"));
        assert!(config.same_table((STORAGE_SETTING, "Packages"), ("Alias", "packages")));
        assert!(config.same_table((STORAGE_SETTING, "Packages"), ("Local", "PACKAGES")));
        assert!(!config.same_table((STORAGE_SETTING, "Packages"), ("Other", "Packages")));
        assert!(config.same_blob_account(STORAGE_SETTING, "Local"));
        assert!(!config.same_blob_account(STORAGE_SETTING, "Other"));
        assert!(
            !config.same_blob_account(STORAGE_SETTING, "Alias"),
            "Alias gives no blob endpoint"
        );
        assert!(!config.is_cosmos_table("Other"));
        assert!(!format!("{config:?}").contains(KEY));
    }

    /// An empty setting means its default; any other value is read as written, so spaces or a
    /// sign around a period, a number or a name make it invalid, named (issue 38: `" 1d"` was
    /// taken as `1d`).
    #[test]
    fn values_are_taken_as_written_and_an_empty_one_means_the_default() {
        let with = |name: &str, value: &str| {
            Config::from_lookup(|k| match k {
                STORAGE_SETTING => Some("UseDevelopmentStorage=true".to_string()),
                k if k == name => Some(value.to_string()),
                _ => None,
            })
        };
        let defaults = emulator_only();
        for name in [
            "TABLESCAN_WORK_RETENTION",
            "TABLESCAN_SCAN_RETENTION",
            "TABLESCAN_HAND_OFF_SECONDS",
            "TABLESCAN_MAX_DEQUEUE_COUNT",
            "TABLESCAN_PREFIXSCAN_QUEUE",
            "TABLESCAN_SCANS_TABLE",
        ] {
            let empty = with(name, "").unwrap_or_else(|e| panic!("{name} empty: {e}"));
            assert_eq!(format!("{empty:?}"), format!("{defaults:?}"), "{name}");
        }
        for (name, good, bad) in [
            (
                "TABLESCAN_WORK_RETENTION",
                "1d",
                &[" 1d", "1d ", "\t1d", "+1d", "1 d", " "][..],
            ),
            (
                "TABLESCAN_SCAN_RETENTION",
                "30d",
                &[" 30d", "30d\n", "-30d", "d"],
            ),
            (
                "TABLESCAN_HAND_OFF_SECONDS",
                "60",
                &[" 60", "60 ", "+60", "6 0"],
            ),
            ("TABLESCAN_MAX_DEQUEUE_COUNT", "5", &[" 5", "+5", "5\n"]),
            ("TABLESCAN_COUNTER_SHARDS", "16", &["16 ", " "]),
            (
                "TABLESCAN_PREFIXSCAN_QUEUE",
                "tablescan-prefixscan",
                &[" tablescan-prefixscan"],
            ),
            ("TABLESCAN_WORK_TABLE", "TablescanWork", &["TablescanWork "]),
        ] {
            assert!(with(name, good).is_ok(), "{name}={good:?}");
            for value in bad {
                match with(name, value) {
                    Err(e) => assert_eq!(e.name, name, "{value:?}: {e}"),
                    Ok(_) => panic!("{name}={value:?} accepted"),
                }
            }
        }
    }

    #[test]
    fn cosmos_table_endpoints_are_recognised() {
        let settings: BTreeMap<&str, String> = [
            (
                "AzureWebJobsStorage",
                "UseDevelopmentStorage=true".to_string(),
            ),
            ("TABLESCAN_CONNECTIONS", "Cosmos,Legacy".to_string()),
            (
                "Cosmos",
                format!("DefaultEndpointsProtocol=https;AccountName=prod;AccountKey={KEY};TableEndpoint=https://prod.table.cosmos.azure.com:443/;"),
            ),
            (
                "Legacy__tableServiceUri",
                "https://prod.table.cosmosdb.azure.com".to_string(),
            ),
            (
                "Legacy__queueServiceUri",
                "https://prod.queue.core.windows.net".to_string(),
            ),
        ]
        .into_iter()
        .collect();
        let config = Config::from_lookup(|k| settings.get(k).cloned()).unwrap();
        assert!(config.is_cosmos_table("Cosmos"));
        assert!(config.is_cosmos_table("Legacy"));
        assert!(!config.is_cosmos_table(STORAGE_SETTING));
        assert!(!config.is_cosmos_table("Unknown"));
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
        assert_eq!(config.table_accounts[STORAGE_SETTING].account, "prod");
        assert!(config.same_table((STORAGE_SETTING, "T"), ("Keyed", "t")));
        assert!(config.is_bookkeeping_table("Keyed", "TablescanScans"));
        assert!(!config.same_table((STORAGE_SETTING, "T"), ("Local", "T")));
        assert_eq!(
            config.table_accounts["Local"].to_string(),
            "storage account \"devstoreaccount1\" at localhost:10102"
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
