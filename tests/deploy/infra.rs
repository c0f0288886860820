//! The Flex Consumption template (`infra/main.bicep` with `infra/main.parameters.json`) held
//! against the app.
//!
//! No Bicep compiler is published to a package registry this project can reach (the Bicep CLI
//! ships as GitHub release binaries and a NuGet tool), so the template is parsed with the
//! tree-sitter Bicep grammar (crates.io `tree-sitter-bicep`): a syntax error fails the test, and
//! every check below reads the syntax tree (which resource, which property), not the text. Values
//! are resolved as far as the template alone decides them: literals, parameters (the parameters
//! file, else their defaults), variables and `<resource>.name`.
//!
//! The app side comes from the code: the settings the handler requires
//! (`config::required_settings`), its configuration as it would start with the template's settings
//! (`Config::from_lookup`), the queue-name tokens of the function.json files it stages, host.json.
//!
//! Not checked here (Azure checks them at deployment, and nothing was deployed): property names
//! and API versions against the resource providers' schemas, and whether the values work.

use std::collections::BTreeMap;

use serde_json::Value as Json;
use tablescan::app::catalog::{Trigger, FUNCTIONS, PREFIX_SCAN_QUEUE_SETTING};
use tablescan::app::config::{required_settings, Config, STORAGE_SETTING};
use tablescan::deploy::stage::function_json;

#[path = "bicep/mod.rs"]
mod bicep;
use bicep::{is, parse, str, Template, V};

const TEMPLATE: &str = include_str!("../../infra/main.bicep");
const PARAMETERS: &str = include_str!("../../infra/main.parameters.json");
const HOST_JSON: &str = include_str!("../../host.json");
const SAMPLE_SETTINGS: &str = include_str!("../../local.settings.sample.json");

/// Built-in role ids (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles):
/// what the app's identity needs on its own account and on Application Insights.
const ROLES: [(&str, &str, &str); 4] = [
    (
        "storage",
        "Storage Blob Data Owner",
        "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    ),
    (
        "storage",
        "Storage Queue Data Contributor",
        "974c5e8b-45b9-4653-ba55-5f855dd0fb88",
    ),
    (
        "storage",
        "Storage Table Data Contributor",
        "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3",
    ),
    (
        "insights",
        "Monitoring Metrics Publisher",
        "3913510d-42f4-4e42-8a64-420c390055eb",
    ),
];

/// Settings that configure the deployment path or the worker on other plans and must not be set
/// on Flex Consumption, or (`AzureWebJobsStorage`) would be a connection string with a key.
/// https://learn.microsoft.com/azure/azure-functions/functions-app-settings#flex-consumption-plan-deprecations
const NOT_ON_FLEX: [&str; 6] = [
    "FUNCTIONS_WORKER_RUNTIME",
    "FUNCTIONS_EXTENSION_VERSION",
    "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING",
    "WEBSITE_CONTENTSHARE",
    STORAGE_SETTING,
];

/// Words that would mean a key, a SAS or a keyed connection string (case-insensitive).
const KEY_WORDS: [&str; 5] = [
    "accountkey",
    "listkeys",
    "sharedaccesssignature",
    "storageaccountconnectionstring",
    "sig=",
];

/// What is wrong, as sentences.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn check(&mut self, ok: bool, problem: &str) {
        if !ok {
            self.0.push(problem.to_string());
        }
    }
}

/// Everything wrong with the template and its parameters file; empty when it holds.
fn problems(src: &str, parameters: &str) -> Vec<String> {
    let template = match parse(src, parameters) {
        Ok(t) => t,
        Err(e) => return vec![e],
    };
    let mut p = Problems::default();
    type Check = fn(&Template, &mut Problems) -> Result<(), String>;
    let checks: [Check; 6] = [
        check_parameters,
        check_storage_and_plan,
        check_function_app,
        check_insights,
        check_settings,
        check_roles,
    ];
    for check in checks {
        if let Err(e) = check(&template, &mut p) {
            p.0.push(e);
        }
    }
    let lower = format!("{src}\n{parameters}").to_ascii_lowercase();
    for word in KEY_WORDS {
        let problem = format!("the template names a key, SAS or keyed connection string: {word:?}");
        p.check(!lower.contains(word), &problem);
    }
    p.0
}

/// Every value in the parameters file is declared and within the declaration's decorators.
fn check_parameters(t: &Template, p: &mut Problems) -> Result<(), String> {
    for (name, given) in &t.given {
        let Some(param) = t.params.get(name) else {
            p.check(
                false,
                &format!("parameters file sets {name}, which main.bicep does not declare"),
            );
            continue;
        };
        for (decorator, args) in &param.decorators {
            let ok = match (decorator.as_str(), args.first(), given) {
                ("allowed", Some(V::Array(allowed)), v) => allowed.contains(v),
                ("minValue", Some(V::Num(min)), V::Num(n)) => n >= min,
                ("maxValue", Some(V::Num(max)), V::Num(n)) => n <= max,
                ("minLength", Some(V::Num(min)), V::Str(s)) => s.len() as i64 >= *min,
                ("maxLength", Some(V::Num(max)), V::Str(s)) => s.len() as i64 <= *max,
                _ => true,
            };
            p.check(
                ok,
                &format!("parameter {name} = {given:?} breaks @{decorator}{args:?}"),
            );
        }
    }
    Ok(())
}

/// Storage account: keys off, TLS 1.2, no public blobs; plan: Flex Consumption on Linux.
fn check_storage_and_plan(t: &Template, p: &mut Problems) -> Result<(), String> {
    let (_, account) = t.one("Microsoft.Storage/storageAccounts")?;
    let prop = |k: &str| account.path(&format!("properties.{k}"));
    p.check(
        is(prop("allowSharedKeyAccess"), V::Bool(false)),
        "storage account: allowSharedKeyAccess must be false",
    );
    p.check(
        is(prop("allowBlobPublicAccess"), V::Bool(false)),
        "storage account: allowBlobPublicAccess must be false",
    );
    p.check(
        is(prop("minimumTlsVersion"), str("TLS1_2")),
        "storage account: minimumTlsVersion must be TLS1_2",
    );
    let (_, plan) = t.one("Microsoft.Web/serverfarms")?;
    let flex = is(plan.path("sku.name"), str("FC1"))
        && is(plan.path("sku.tier"), str("FlexConsumption"))
        && is(plan.path("properties.reserved"), V::Bool(true));
    p.check(
        flex,
        "plan: must be FC1 / FlexConsumption, reserved (Linux)",
    );
    Ok(())
}

/// The function app: Linux on the plan, system-assigned identity, runtime `custom` 1.0 (host.json
/// runs a custom handler), scale within the platform's limits, and its deployment container on
/// the account, read with the identity.
fn check_function_app(t: &Template, p: &mut Problems) -> Result<(), String> {
    let (plan, _) = t.one("Microsoft.Web/serverfarms")?;
    let (storage, _) = t.one("Microsoft.Storage/storageAccounts")?;
    let (_, site) = t.one("Microsoft.Web/sites")?;
    p.check(
        is(site.path("kind"), str("functionapp,linux")),
        "function app: kind must be functionapp,linux",
    );
    p.check(
        is(site.path("identity.type"), str("SystemAssigned")),
        "function app: needs the system-assigned identity",
    );
    let farm = V::Expr(format!("{plan}.id"));
    p.check(
        is(site.path("properties.serverFarmId"), farm),
        "function app: serverFarmId must be the Flex plan",
    );
    let config = site
        .path("properties.functionAppConfig")
        .ok_or("function app: no functionAppConfig")?;
    let host: Json = serde_json::from_str(HOST_JSON).unwrap();
    let custom = host.get("customHandler").is_some()
        && is(config.path("runtime.name"), str("custom"))
        && is(config.path("runtime.version"), str("1.0"));
    p.check(
        custom,
        "function app: runtime must be custom 1.0 (host.json runs a custom handler)",
    );
    let scale = |k: &str| {
        config
            .path(&format!("scaleAndConcurrency.{k}"))
            .and_then(|v| t.resolve(v))
    };
    let memory = scale("instanceMemoryMB");
    p.check(
        matches!(memory, Some(V::Num(512 | 2048 | 4096))),
        &format!("function app: instanceMemoryMB must be 512, 2048 or 4096, is {memory:?}"),
    );
    // Flex's stack data for `custom` on FC1: the lowest maximum instance count is 40, the
    // highest 1,000 (infra/README.md, "Sources"). A lower value fails the deployment.
    let max = scale("maximumInstanceCount");
    p.check(
        matches!(max, Some(V::Num(40..=1000))),
        &format!("function app: maximumInstanceCount must be 40 to 1000, is {max:?}"),
    );
    let bound = |name: &str| {
        t.params
            .get("maximumInstanceCount")
            .and_then(|param| param.decorators.iter().find(|(d, _)| d == name))
            .and_then(|(_, args)| match args.first() {
                Some(V::Num(n)) => Some(*n),
                _ => None,
            })
    };
    p.check(
        bound("minValue").is_some_and(|n| n >= 40) && bound("maxValue").is_some_and(|n| n <= 1000),
        "parameter maximumInstanceCount: needs @minValue of at least 40 and @maxValue of at most 1000",
    );

    let deployment = config
        .path("deployment.storage")
        .ok_or("function app: no deployment storage")?;
    let (container, body) = t.one("Microsoft.Storage/storageAccounts/blobServices/containers")?;
    let service = body.path("parent").map(V::text).unwrap_or_default();
    let parent = t
        .resources
        .get(&service)
        .and_then(|r| r.body.path("parent"));
    let container_name = body.path("name").and_then(|v| t.resolve(v));
    let url = deployment.path("value").map(V::text).unwrap_or_default();
    let url_var = url
        .rsplit("${")
        .next()
        .unwrap_or_default()
        .trim_end_matches("}'");
    let points_there = parent == Some(&V::Expr(storage.into()))
        && url.starts_with(&format!("'${{{storage}.properties.primaryEndpoints.blob}}"))
        && t.resolve(&V::Expr(url_var.into())) == container_name
        && is(deployment.path("type"), str("blobContainer"));
    p.check(
        points_there,
        &format!(
            "function app: deployment storage must be the blob container {container} of {storage}"
        ),
    );
    p.check(
        is(
            deployment.path("authentication.type"),
            str("SystemAssignedIdentity"),
        ),
        "function app: deployment storage must use the system-assigned identity",
    );
    Ok(())
}

/// Workspace-based Application Insights that takes only Entra ID-authenticated telemetry.
fn check_insights(t: &Template, p: &mut Problems) -> Result<(), String> {
    let (workspace, _) = t.one("Microsoft.OperationalInsights/workspaces")?;
    let (_, insights) = t.one("Microsoft.Insights/components")?;
    let linked = V::Expr(format!("{workspace}.id"));
    p.check(
        is(insights.path("properties.WorkspaceResourceId"), linked),
        "Application Insights must be workspace-based",
    );
    p.check(
        is(insights.path("properties.DisableLocalAuth"), V::Bool(true)),
        "Application Insights: DisableLocalAuth (Entra ID ingestion only)",
    );
    Ok(())
}

/// The function app's settings: (name, raw value) in order, and the variables concatenated to
/// them that the template computes from parameters (not evaluated here).
/// (name, raw value) of each literal setting, and the names of the variables computed from
/// parameters.
type Settings = (Vec<(String, V)>, Vec<String>);

fn settings(t: &Template) -> Result<Settings, String> {
    let (_, site) = t.one("Microsoft.Web/sites")?;
    let list = site
        .path("properties.siteConfig.appSettings")
        .ok_or("function app: no appSettings")?;
    let (first, rest) = match list {
        V::Array(_) => (list.clone(), vec![]),
        V::Expr(text) => {
            let inner = text
                .strip_prefix("concat(")
                .and_then(|s| s.strip_suffix(')'));
            let names: Vec<String> = inner
                .ok_or("appSettings: expected an array or concat(variables)")?
                .split(',')
                .map(|s| s.trim().to_string())
                .collect();
            let first = t
                .vars
                .get(&names[0])
                .ok_or("appSettings: unknown variable")?;
            (first.clone(), names[1..].to_vec())
        }
        other => return Err(format!("appSettings: {other:?}")),
    };
    let V::Array(items) = first else {
        return Err("appSettings: not an array".into());
    };
    let pairs = items.iter().map(|item| {
        let name = item
            .path("name")
            .and_then(|v| t.resolve(v))
            .map(|v| v.text());
        let value = item.path("value").cloned().unwrap_or(V::Null);
        Ok((name.ok_or("a setting without a literal name")?, value))
    });
    Ok((pairs.collect::<Result<_, String>>()?, rest))
}

/// The settings hold what the handler and the host need, nothing they do not read, and the
/// handler starts with them.
fn check_settings(t: &Template, p: &mut Problems) -> Result<(), String> {
    let (pairs, computed) = settings(t)?;
    let (storage, _) = t.one("Microsoft.Storage/storageAccounts")?;
    let (insights, _) = t.one("Microsoft.Insights/components")?;
    let raw: BTreeMap<&str, &V> = pairs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    // Values known only at deployment (an account name, a connection string): placeholders.
    let resolved: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                t.resolve(v).map_or("placeholder0".into(), |v| v.text()),
            )
        })
        .collect();

    let sample: Json = serde_json::from_str(SAMPLE_SETTINGS).unwrap();
    let known = sample["Values"].as_object().unwrap();
    for name in raw.keys() {
        let read = known.contains_key(*name)
            || name.starts_with(&format!("{STORAGE_SETTING}__"))
            || name.starts_with("APPLICATIONINSIGHTS_");
        p.check(read, &format!("setting {name} is read by nothing"));
        p.check(
            !NOT_ON_FLEX.contains(name),
            &format!("setting {name} must not be set on Flex Consumption"),
        );
    }
    let own_account = raw.get(&*format!("{STORAGE_SETTING}__accountName"))
        == Some(&&V::Expr(format!("{storage}.name")));
    p.check(
        own_account,
        &format!("{STORAGE_SETTING}__accountName must be the template's account ({storage}.name)"),
    );
    for name in required_settings() {
        let set = resolved.contains_key(name)
            || resolved.contains_key(&format!("{name}__accountName"))
            || ["tableServiceUri", "queueServiceUri"]
                .iter()
                .all(|k| resolved.contains_key(&format!("{name}__{k}")));
        p.check(set, &format!("required setting {name} is not set"));
    }
    let config = Config::from_lookup(|k| resolved.get(k).cloned())
        .map_err(|e| format!("the handler would not start: {e}"))?;
    let host: Json = serde_json::from_str(HOST_JSON).unwrap();
    let dequeue = host["extensions"]["queues"]["maxDequeueCount"].as_u64();
    p.check(
        dequeue == Some(config.max_dequeue_count),
        &format!(
            "TABLESCAN_MAX_DEQUEUE_COUNT {} differs from host.json maxDequeueCount {dequeue:?}",
            config.max_dequeue_count
        ),
    );
    check_queue_tokens(&resolved, &config, p);
    let telemetry = V::Expr(format!("{insights}.properties.ConnectionString"));
    p.check(
        raw.get("APPLICATIONINSIGHTS_CONNECTION_STRING") == Some(&&telemetry),
        "APPLICATIONINSIGHTS_CONNECTION_STRING must be the template's Application Insights",
    );
    p.check(
        resolved.get("APPLICATIONINSIGHTS_AUTHENTICATION_STRING").map(String::as_str) == Some("Authorization=AAD"),
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING must be Authorization=AAD (system-assigned identity)",
    );
    let connections: String = computed
        .iter()
        .filter_map(|v| t.vars.get(v))
        .map(V::text)
        .collect();
    p.check(
        connections.contains("'TABLESCAN_CONNECTIONS'") && connections.contains("__accountName'"),
        "scan connections: TABLESCAN_CONNECTIONS and <NAME>__accountName settings missing",
    );
    Ok(())
}

/// Every `%NAME%` a queue function's function.json names is set, and the queue the host reads is
/// the one the handler writes (the catalog's setting and suffix, read by `Config`).
fn check_queue_tokens(settings: &BTreeMap<String, String>, config: &Config, p: &mut Problems) {
    for function in FUNCTIONS {
        let Trigger::Queue {
            queue_setting,
            suffix,
        } = function.trigger
        else {
            continue;
        };
        let json: Json = serde_json::from_str(function_json(function.name).unwrap()).unwrap();
        let bound = json["bindings"][0]["queueName"]
            .as_str()
            .unwrap_or_default();
        let mut queue = bound.to_string();
        for token in bound.split('%').skip(1).step_by(2) {
            match settings.get(token) {
                Some(v) => queue = queue.replace(&format!("%{token}%"), v),
                None => p.check(false, &format!("{}: %{token}% is not set", function.name)),
            }
        }
        let handler = match queue_setting {
            PREFIX_SCAN_QUEUE_SETTING => &config.prefix_scan_queue,
            _ => &config.table_copy_queue,
        };
        p.check(
            queue == format!("{handler}{suffix}"),
            &format!(
                "{}: the host reads queue {queue:?}, the handler writes {handler:?}{suffix}",
                function.name
            ),
        );
    }
}

/// The app's identity holds the data roles on its account and Monitoring Metrics Publisher on
/// Application Insights.
fn check_roles(t: &Template, p: &mut Problems) -> Result<(), String> {
    let (site, _) = t.one("Microsoft.Web/sites")?;
    let storage = t.one("Microsoft.Storage/storageAccounts")?.0;
    let insights = t.one("Microsoft.Insights/components")?.0;
    let app = V::Expr(format!("{site}.identity.principalId"));
    let mut granted = Vec::new();
    for r in t
        .resources
        .values()
        .filter(|r| r.kind == "Microsoft.Authorization/roleAssignments")
    {
        let role = r
            .body
            .path("properties.roleDefinitionId")
            .map(V::text)
            .unwrap_or_default();
        let id = role
            .strip_prefix("subscriptionResourceId('Microsoft.Authorization/roleDefinitions', ")
            .and_then(|s| s.strip_suffix(')'))
            .and_then(|s| t.resolve(&V::Expr(s.into())));
        let to_app = r.body.path("properties.principalId") == Some(&app)
            && is(
                r.body.path("properties.principalType"),
                str("ServicePrincipal"),
            );
        match id {
            Some(id) if to_app => granted.push((r.body.path("scope").map(V::text), id.text())),
            Some(_) => {}
            None => p.check(
                false,
                &format!("role assignment with an unreadable role: {role}"),
            ),
        }
    }
    for (scope, role, id) in ROLES {
        let symbol = if scope == "storage" {
            storage
        } else {
            insights
        };
        let held = granted.contains(&(Some(symbol.to_string()), id.to_string()));
        p.check(
            held,
            &format!("the app's identity lacks {role} ({id}) on {symbol}"),
        );
    }
    Ok(())
}

#[test]
fn the_template_holds_against_the_app() {
    assert_eq!(problems(TEMPLATE, PARAMETERS), Vec::<String>::new());
}

#[test]
fn required_settings_name_the_storage_connection_and_every_function_json_token() {
    let required = required_settings();
    assert_eq!(required[0], STORAGE_SETTING);
    let mut tokens = Vec::new();
    for function in FUNCTIONS {
        let text = function_json(function.name).unwrap();
        tokens.extend(text.split('%').skip(1).step_by(2).map(str::to_string));
    }
    assert!(!tokens.is_empty());
    for token in &tokens {
        assert!(
            required.contains(&token.as_str()),
            "{token} is not in required_settings()"
        );
    }
    assert_eq!(
        required.len(),
        1 + tokens
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
}

/// The checks are not vacuous: each mutation of the template is caught, with the right reason.
#[test]
fn broken_templates_are_caught() {
    let mutations = [
        (
            "allowSharedKeyAccess: false",
            "allowSharedKeyAccess: true",
            "allowSharedKeyAccess must be false",
        ),
        (
            "name: 'TABLESCAN_TABLECOPY_QUEUE'",
            "name: 'TABLESCAN_TABLE_COPY_QUEUE'",
            "%TABLESCAN_TABLECOPY_QUEUE% is not set",
        ),
        (
            "roleDefinitions', roleIds.storageTableDataContributor)",
            "roleDefinitions', roleIds.storageBlobDataOwner)",
            "lacks Storage Table Data Contributor",
        ),
        (
            "name: 'custom'",
            "name: 'node'",
            "runtime must be custom 1.0",
        ),
        (
            "value: '5'",
            "value: '6'",
            "differs from host.json maxDequeueCount",
        ),
        (
            "value: 'Authorization=AAD'",
            "value: storage.listKeys().keys[0].value",
            "\"listkeys\"",
        ),
        (
            "type: 'SystemAssignedIdentity'",
            "type: 'StorageAccountConnectionString'",
            "must use the system-assigned identity",
        ),
        (
            "name: 'AzureWebJobsStorage__accountName'",
            "name: 'AzureWebJobsStorage'",
            "must not be set on Flex Consumption",
        ),
        (
            "value: prefixScanQueue",
            "value: 'Bad_Queue'",
            "the handler would not start",
        ),
        (
            "DisableLocalAuth: true",
            "DisableLocalAuth: false",
            "DisableLocalAuth",
        ),
        (
            "@minValue(40)\n@maxValue(1000)\nparam maximumInstanceCount",
            "@minValue(1)\n@maxValue(1000)\nparam maximumInstanceCount",
            "needs @minValue of at least 40",
        ),
        (
            "tier: 'FlexConsumption'",
            "tier: 'Dynamic'",
            "FC1 / FlexConsumption",
        ),
        (
            "  }\n}\n\n// Flex Consumption plan",
            "  }\n\n// Flex Consumption plan",
            "syntax error",
        ),
    ];
    for (from, to, reason) in mutations {
        assert_eq!(
            TEMPLATE.matches(from).count(),
            1,
            "mutation target {from:?} is not unique"
        );
        let found = problems(&TEMPLATE.replacen(from, to, 1), PARAMETERS);
        assert!(
            found.iter().any(|p| p.contains(reason)),
            "{from:?} -> {to:?}: expected {reason:?}, got {found:?}"
        );
    }
    for (from, to, reason) in [
        ("\"value\": 2048", "\"value\": 1024", "breaks @allowed"),
        ("\"value\": 40", "\"value\": 20", "breaks @minValue"),
    ] {
        let bad_parameters = PARAMETERS.replacen(from, to, 1);
        assert_ne!(bad_parameters, PARAMETERS);
        let found = problems(TEMPLATE, &bad_parameters);
        assert!(found.iter().any(|p| p.contains(reason)), "{to}: {found:?}");
    }
}
