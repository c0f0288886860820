//! Binding the loaded app to storage and routes, once at start: `%AppSetting%` queue names are
//! resolved, each queue binding gets its store, each HTTP trigger its route. Instances share the
//! result.
//!
//! Invariants: one store per connection setting, shared by every binding and instance that names
//! it; `connect` is called only for connections a queue binding uses, in binding order (outputs
//! before the trigger, functions in folder order), so the first error reported is deterministic;
//! connection strings never appear in errors unredacted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::config::{
    resolve_queue_name, AppConfig, AppSettings, ConfigError, FunctionConfig, HttpMode, OutputKind,
    QueueTriggerConfig, TriggerConfig,
};
use super::http::{sort_routes, HttpRoute};
use super::outputs::{OutputTarget, QueueTarget, ResolvedOutput};
use super::queue::poison_queue_name;
use super::route::RouteTemplate;
use super::HostError;
use crate::storage::connection::ConnectionSettings;
use crate::storage::QueueStore;

/// A queue-triggered function with its queues resolved: what each instance's listener needs.
pub(super) struct QueueFunction<S> {
    pub function: String,
    pub binding: String,
    pub binary: bool,
    pub source: Arc<QueueTarget<S>>,
    /// `None` when `<queue>-poison` is not a valid queue name.
    pub poison: Option<Arc<QueueTarget<S>>>,
    pub outputs: Arc<Vec<ResolvedOutput<S>>>,
}

/// Every trigger of the app, resolved.
pub(super) struct Triggers<S> {
    pub queues: Vec<QueueFunction<S>>,
    /// Sorted by [`sort_routes`].
    pub routes: Vec<HttpRoute<S>>,
}

/// Resolves every function's trigger and outputs; `connect` turns a connection (a connection
/// string or the identity-based `<NAME>__*` settings, read as the handler reads them) into a
/// queue store.
pub(super) fn resolve_triggers<S, F>(
    app: &AppConfig,
    settings: &AppSettings,
    connect: F,
) -> Result<Triggers<S>, HostError>
where
    S: QueueStore,
    F: Fn(&ConnectionSettings) -> Result<S, String>,
{
    let mut stores = Stores {
        settings,
        connect,
        stores: HashMap::new(),
    };
    let mut triggers = Triggers {
        queues: Vec::new(),
        routes: Vec::new(),
    };
    for function in &app.functions {
        let outputs = Arc::new(resolve_outputs(function, settings, &mut stores)?);
        match &function.trigger {
            TriggerConfig::Queue(q) => triggers.queues.push(resolve_queue_trigger(
                function,
                q,
                outputs,
                settings,
                &mut stores,
            )?),
            // Timers need no store or route (`timer::resolve_timers`).
            TriggerConfig::Timer(_) => {}
            TriggerConfig::Http(h) => {
                let template = RouteTemplate::parse(h.route.as_deref().unwrap_or(&function.name))
                    .map_err(|e| ConfigError::new(&function.file, "route", e))?;
                triggers.routes.push(HttpRoute {
                    function: Arc::new(function.clone()),
                    binding: h.name.clone(),
                    template,
                    methods: h.methods.clone(),
                    mode: if function.http_in_out_only {
                        app.http_mode
                    } else {
                        HttpMode::Payload
                    },
                    outputs,
                });
            }
        }
    }
    sort_routes(&mut triggers.routes);
    Ok(triggers)
}

fn resolve_outputs<S, F>(
    function: &FunctionConfig,
    settings: &AppSettings,
    stores: &mut Stores<'_, S, F>,
) -> Result<Vec<ResolvedOutput<S>>, HostError>
where
    S: QueueStore,
    F: Fn(&ConnectionSettings) -> Result<S, String>,
{
    let mut outputs = Vec::new();
    for o in &function.outputs {
        let target = match &o.kind {
            OutputKind::Http => OutputTarget::Http,
            OutputKind::Queue {
                queue_name,
                connection,
            } => {
                let queue = resolve_queue(function, &o.name, queue_name, settings)?;
                OutputTarget::Queue(Arc::new(QueueTarget::new(
                    stores.get(connection, &function.file)?,
                    queue,
                )))
            }
        };
        outputs.push(ResolvedOutput {
            name: o.name.clone(),
            binary: o.binary,
            target,
        });
    }
    Ok(outputs)
}

fn resolve_queue_trigger<S, F>(
    function: &FunctionConfig,
    q: &QueueTriggerConfig,
    outputs: Arc<Vec<ResolvedOutput<S>>>,
    settings: &AppSettings,
    stores: &mut Stores<'_, S, F>,
) -> Result<QueueFunction<S>, HostError>
where
    S: QueueStore,
    F: Fn(&ConnectionSettings) -> Result<S, String>,
{
    let queue = resolve_queue(function, &q.name, &q.queue_name, settings)?;
    let store = stores.get(&q.connection, &function.file)?;
    let poison = poison_queue_name(&queue).map(|p| Arc::new(QueueTarget::new(store.clone(), p)));
    Ok(QueueFunction {
        function: function.name.clone(),
        binding: q.name.clone(),
        binary: q.binary,
        source: Arc::new(QueueTarget::new(store, queue)),
        poison,
        outputs,
    })
}

/// A binding's queue name with its `%AppSetting%` tokens resolved.
fn resolve_queue(
    function: &FunctionConfig,
    binding: &str,
    raw: &str,
    settings: &AppSettings,
) -> Result<String, HostError> {
    resolve_queue_name(raw, settings).map_err(|e| {
        HostError::Config(ConfigError::new(
            &function.file,
            format!("bindings({binding}).queueName"),
            e,
        ))
    })
}

/// One store per connection setting, created on first use.
struct Stores<'a, S, F> {
    settings: &'a AppSettings,
    connect: F,
    stores: HashMap<String, Arc<S>>,
}

impl<S, F> Stores<'_, S, F>
where
    S: QueueStore,
    F: Fn(&ConnectionSettings) -> Result<S, String>,
{
    /// The store of app setting `connection`, named by a binding in `file`.
    fn get(&mut self, connection: &str, file: &Path) -> Result<Arc<S>, HostError> {
        if let Some(s) = self.stores.get(connection) {
            return Ok(s.clone());
        }
        let lookup = |key: &str| self.settings.get(key).map(str::to_string);
        // As the Functions host does: `<connection>`, else `AzureWebJobs<connection>`, in either
        // form (connection string or identity-based `__*` settings).
        let not_set = |e: &crate::storage::connection::ConnectionSettingError, name: &str| {
            e.setting == name && e.message.starts_with("is not set")
        };
        let prefixed = format!("AzureWebJobs{connection}");
        let read = match ConnectionSettings::from_app_settings(connection, lookup) {
            Err(e) if not_set(&e, connection) => {
                match ConnectionSettings::from_app_settings(&prefixed, lookup) {
                    Err(e) if not_set(&e, &prefixed) => None,
                    other => Some(other),
                }
            }
            other => Some(other),
        };
        let conn = read
            .ok_or_else(|| {
                HostError::Settings(format!(
                    "{}: the app setting {connection:?} named by a queue binding's `connection` is not set \
                     (set it, or its identity-based {connection}__* settings, in the environment or in \
                     local.settings.json Values)",
                    file.display()
                ))
            })?
            // The errors name the setting and never carry a secret.
            .map_err(|e| HostError::Settings(format!("the connection {connection:?} is not usable: {e}")))?;
        let store = (self.connect)(&conn).map_err(|e| {
            HostError::Settings(format!("the connection {connection:?} is not usable: {e}"))
        })?;
        let store = Arc::new(store);
        self.stores.insert(connection.to_string(), store.clone());
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::BTreeMap;

    use super::*;
    use crate::lab::host::config::load_app;
    use crate::lab::memory::MemoryQueueStore;

    const HOST: &str =
        r#"{"version":"2.0","customHandler":{"description":{"defaultExecutablePath":"h"}}}"#;

    fn app(functions: &[(&str, &str)]) -> AppConfig {
        let dir = std::env::temp_dir().join(format!("tablescan-resolve-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("host.json"), HOST).unwrap();
        for (name, json) in functions {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(dir.join(name).join("function.json"), json).unwrap();
        }
        load_app(&dir).unwrap()
    }

    fn settings(pairs: &[(&str, &str)]) -> AppSettings {
        AppSettings::from_map(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        )
    }

    const WORK: &str = r#"{"bindings":[{"name":"msg","type":"queueTrigger","direction":"in","queueName":"%Q%"},
        {"name":"next","type":"queue","direction":"out","queueName":"%Q%-next"}]}"#;

    #[test]
    fn one_store_per_connection_and_sorted_routes() {
        let app = app(&[
            ("Work", WORK),
            (
                "All",
                r#"{"bindings":[{"name":"req","type":"httpTrigger","direction":"in","route":"{*rest}"}]}"#,
            ),
            (
                "Get",
                r#"{"bindings":[{"name":"req","type":"httpTrigger","direction":"in","route":"scans/{id}"}]}"#,
            ),
        ]);
        let calls = Cell::new(0);
        let connect = |_: &ConnectionSettings| {
            calls.set(calls.get() + 1);
            Ok(MemoryQueueStore::new())
        };
        let s = settings(&[
            ("Q", "Jobs"),
            ("AzureWebJobsStorage", "UseDevelopmentStorage=true"),
        ]);
        let t = resolve_triggers(&app, &s, connect).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(calls.get(), 1);
        assert_eq!(t.queues.len(), 1);
        let q = &t.queues[0];
        assert_eq!(
            (q.function.as_str(), q.source.queue.as_str()),
            ("Work", "jobs")
        );
        assert_eq!(q.poison.as_ref().unwrap().queue, "jobs-poison");
        let OutputTarget::Queue(next) = &q.outputs[0].target else {
            panic!()
        };
        assert_eq!(next.queue, "jobs-next");
        let routes: Vec<_> = t.routes.iter().map(|r| r.function.name.as_str()).collect();
        assert_eq!(routes, ["Get", "All"]);
    }

    #[test]
    fn errors_name_the_setting_and_hide_secrets() {
        let app = app(&[("Work", WORK)]);
        let never = |_: &ConnectionSettings| -> Result<MemoryQueueStore, String> {
            panic!("not connected")
        };
        let err = resolve_triggers(&app, &settings(&[]), never).err().unwrap();
        let HostError::Config(e) = err else {
            panic!("{err}")
        };
        assert_eq!(e.field, "bindings(next).queueName");

        let err = resolve_triggers(&app, &settings(&[("Q", "jobs")]), never)
            .err()
            .unwrap();
        assert!(
            matches!(&err, HostError::Settings(m) if m.contains("\"AzureWebJobsStorage\"") && m.contains("function.json")),
            "{err}"
        );

        let conn = "AccountName=a;AccountKey=c2VjcmV0";
        let s = settings(&[("Q", "jobs"), ("AzureWebJobsStorage", conn)]);
        let err = resolve_triggers(
            &app,
            &s,
            |c: &ConnectionSettings| -> Result<MemoryQueueStore, String> {
                Err(format!("bad {c:?}"))
            },
        )
        .err()
        .unwrap();
        let text = err.to_string();
        assert!(
            text.contains("key (redacted)") && !text.contains("c2VjcmV0"),
            "{text}"
        );

        // The identity-based form, read as the handler reads it.
        let s = settings(&[("Q", "jobs"), ("AzureWebJobsStorage__accountName", "acct1")]);
        let seen = std::cell::RefCell::new(Vec::new());
        resolve_triggers(&app, &s, |c: &ConnectionSettings| {
            seen.borrow_mut().push(c.table_endpoint.clone());
            Ok(MemoryQueueStore::new())
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*seen.borrow(), ["https://acct1.table.core.windows.net"]);
        let s = settings(&[
            ("Q", "jobs"),
            ("AzureWebJobsStorage__accountName", "acct1"),
            ("AzureWebJobsStorage__credential", "password"),
        ]);
        let err = resolve_triggers(&app, &s, never).err().unwrap().to_string();
        assert!(
            err.contains("app setting AzureWebJobsStorage__credential"),
            "{err}"
        );
    }
}
