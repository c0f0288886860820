//! Every keyless credential but the App Service identity endpoint (tests/scans/keyless/app_service.rs), end
//! to end against Azurite in OAuth mode, with fakes of their token sources in this process
//! (`support::identity`): a service principal's client secret and workload identity's federated
//! token against a fake Entra ID token endpoint (https, at `AZURE_AUTHORITY_HOST`), the Azure
//! CLI as a fake `az` on `PATH`, and IMDS at `AZURE_POD_IDENTITY_AUTHORITY_HOST`. Also: transient
//! failures of each token endpoint are retried, permanent ones fail at once naming the
//! connection and the settings to check, and no secret or token reaches an error, a `Debug`
//! print, a scan record or the handler's logs.
//!
//! One test binary of its own: it sets `SSL_CERT_FILE`, `AZURE_AUTHORITY_HOST`,
//! `AZURE_POD_IDENTITY_AUTHORITY_HOST` and `PATH` for the whole process.

use crate::support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use support::identity::endpoints::{fakes, Identity};
use support::identity::{
    borrowed, entity, expiry_in, identity_app_settings, identity_app_storage, identity_settings,
    round_trip, storage_jwt, token_file, wait_until, FakeAz, JWT_BEARER, STORAGE_RESOURCE,
    STORAGE_SCOPE,
};
use tablescan::storage::connection::{ConnectionSettings, StorageAccount};
use tablescan::storage::request_counts::RequestCounters;
use tablescan::storage::retry_policy::RetryPolicy;
use tablescan::storage::TableStore;
use tablescan::storage::{Query as TableQuery, QueueStore, StorageError, StorageErrorKind};

const CLIENT_ID: &str = "0c5a3a1e-1111-4000-8000-00000000c11e";
/// A client secret as Entra ID makes them, and one it does not accept.
const SECRET: &str = "Q8v7Q~client.secret-0123456789abcdefGHIJ";
const WRONG_SECRET: &str = "Zz9Q~stale.secret-9876543210zyxwvuTSRQ";
/// Federated tokens (what the platform writes into the token file), before and after rotation.
const FEDERATED: &str = "eyJhbGciOiJSUzI1NiJ9.federated-token-one.c2lnbmF0dXJl";
const ROTATED: &str = "eyJhbGciOiJSUzI1NiJ9.federated-token-two.c2lnbmF0dXJl";

/// Settings of a service principal connection `name` in `tenant` presenting `secret`.
fn client_secret(name: &str, tenant: &str, secret: &str) -> ConnectionSettings {
    identity_settings(
        name,
        &[
            (&format!("{name}__tenantId"), tenant),
            (&format!("{name}__clientId"), CLIENT_ID),
            (&format!("{name}__clientSecret"), secret),
        ],
    )
}

/// Settings of a workload identity connection `name` in `tenant` with the token file `file`.
fn workload_identity(name: &str, tenant: &str, file: &std::path::Path) -> ConnectionSettings {
    identity_settings(
        name,
        &[
            (&format!("{name}__credential"), "workloadidentity"),
            (&format!("{name}__tenantId"), tenant),
            (&format!("{name}__clientId"), CLIENT_ID),
            ("AZURE_FEDERATED_TOKEN_FILE", file.to_str().unwrap()),
        ],
    )
}

/// Settings of an IMDS managed identity connection `name` (`extra`: which user-assigned one).
fn imds(name: &str, extra: &[(&str, &str)]) -> ConnectionSettings {
    let mut pairs = vec![(format!("{name}__credential"), "managedidentity".to_string())];
    pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    identity_settings(name, &pairs)
}

/// One table query and one queue creation on `settings`, with no storage retries: their errors.
async fn first_requests_fail(settings: ConnectionSettings) -> (StorageError, StorageError) {
    let account = StorageAccount::new(settings).with_retry_policy(RetryPolicy::none());
    let counters = Arc::new(RequestCounters::new());
    let table = account
        .table_store(counters.clone())
        .query_page("Anything", &TableQuery::default())
        .await
        .unwrap_err();
    let queue = account
        .queue_store(counters)
        .create_queue("anything")
        .await
        .unwrap_err();
    (table, queue)
}

/// Panics if `text` holds any of `secrets`.
fn assert_no_secret(text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!secret.is_empty());
        assert!(!text.contains(secret), "a secret leaked: {text}");
    }
}

#[tokio::test]
async fn a_service_principal_round_trips_tables_and_queues() {
    let identity = Identity::accepting(SECRET);
    let tenant = fakes().tenant(&identity);
    // No `__credential`: a client secret makes it `clientsecret`, as for the Functions host.
    let account = StorageAccount::new(client_secret("Sp", &tenant, SECRET));
    round_trip(&account).await;
    assert_eq!(identity.issued(), 1, "one token for every request");
    let seen = identity.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, format!("/{tenant}/oauth2/v2.0/token"));
    assert_eq!(
        seen[0].headers["content-type"],
        "application/x-www-form-urlencoded"
    );
    let form = &seen[0].form;
    assert_eq!(form["grant_type"], "client_credentials");
    assert_eq!(form["scope"], STORAGE_SCOPE);
    assert_eq!(form["client_id"], CLIENT_ID);
    assert_eq!(form["client_secret"], SECRET);
}

/// The federated token is read from the file at each fetch: after the platform rotates it, the
/// provider's next refresh presents the new one, and storage accepts the token it gets.
#[tokio::test]
async fn workload_identity_presents_the_federated_token_from_its_file() {
    let (_dir, file) = token_file("azure-identity-token", &format!("{FEDERATED}\n"));
    let identity = Identity::accepting(FEDERATED);
    let tenant = fakes().tenant(&identity);
    let account = StorageAccount::new(workload_identity("Wi", &tenant, &file));
    round_trip(&account).await;
    assert_eq!(identity.issued(), 1);
    let form = &identity.seen()[0].form;
    assert_eq!(form["grant_type"], "client_credentials");
    assert_eq!(form["scope"], STORAGE_SCOPE);
    assert_eq!(form["client_id"], CLIENT_ID);
    assert_eq!(form["client_assertion_type"], JWT_BEARER);
    assert_eq!(form["client_assertion"], FEDERATED);
    assert!(!form.contains_key("client_secret"));

    // Rotation under one provider, whose tokens are due for refresh within a second: any
    // assertion is accepted while the file changes (a refresh in between is not refused), then
    // only the new one.
    identity.lifetime.store(1, Ordering::SeqCst);
    let account = StorageAccount::new(workload_identity("Wi", &tenant, &file));
    let tables = account.table_store(Arc::new(RequestCounters::new()));
    let table = support::unique_name("rotation");
    assert!(tables.create_table(&table).await.unwrap());
    let before = identity.requests();
    *identity.credential.lock().unwrap() = None;
    std::fs::write(&file, ROTATED).unwrap();
    let presented =
        |request: &support::identity::endpoints::Seen| request.form["client_assertion"].clone();
    wait_until(
        "a token asked for with the rotated federated token",
        LONG,
        || async {
            // Each query asks the provider for its token: it refreshes when it is due.
            tables
                .query_page(&table, &TableQuery::default())
                .await
                .unwrap();
            let seen = identity.seen();
            match seen[before..].last().map(presented) {
                Some(assertion) if assertion == ROTATED => Ok(()),
                last => Err(format!(
                    "{} requests since the rotation, the last presenting {last:?}",
                    seen.len() - before
                )),
            }
        },
    )
    .await;
    *identity.credential.lock().unwrap() = Some(ROTATED.to_string());
    round_trip(&account).await;
    let seen = identity.seen();
    let first_rotated = seen.iter().position(|r| presented(r) == ROTATED).unwrap();
    for request in &seen[first_rotated..] {
        assert_eq!(
            presented(request),
            ROTATED,
            "the file is read at each fetch"
        );
    }
    assert!(tables.delete_table(&table).await.unwrap());
}

/// A hang bound for a wait of a second or two.
const LONG: std::time::Duration = std::time::Duration::from_secs(60);

/// `az account get-access-token` (a fake `az` on `PATH` printing what the real one prints), and
/// a CLI nobody is logged in to: one call, no retry, an error saying what to do.
#[tokio::test]
async fn the_azure_cli_login_round_trips_and_a_missing_login_fails_at_once() {
    let az = FakeAz::get();
    let exp = expiry_in(3600);
    let token = storage_jwt("https://storage.azure.com", exp);
    az.answer(&token, exp);
    let account = StorageAccount::new(azure_cli("Cli"));
    round_trip(&account).await;
    assert_eq!(
        az.calls(),
        ["account get-access-token --output json --scope https://storage.azure.com/.default"]
    );

    az.fail("ERROR: Please run 'az login' to setup account.\n");
    let (table, queue) = first_requests_fail(azure_cli("Dev")).await;
    for error in [&table, &queue] {
        assert_eq!(error.kind, StorageErrorKind::Rejected, "{error}");
        let text = error.to_string();
        assert!(text.contains("connection Dev (azurecli)"), "{text}");
        assert!(text.contains("Please run 'az login'"), "{text}");
        assert!(text.contains("sign in with `az login`"), "{text}");
        assert_no_secret(&text, &[&token]);
    }
    assert_eq!(
        az.calls().len(),
        3,
        "one call per failed request, none retried"
    );
}

/// Settings of an Azure CLI connection `name`.
fn azure_cli(name: &str) -> ConnectionSettings {
    identity_settings(name, &[(&format!("{name}__credential"), "azurecli")])
}

/// IMDS (where no `IDENTITY_ENDPOINT` is set) at the override the Azure SDKs honour: the
/// `Metadata: true` header, api-version 2018-02-01, the storage resource, and a user-assigned
/// identity by `client_id` or `msi_res_id`.
#[tokio::test]
async fn imds_managed_identities_system_and_user_assigned() {
    const RESOURCE_ID: &str = "/subscriptions/5c0c1d3e/resourceGroups/rg/providers/\
                               Microsoft.ManagedIdentity/userAssignedIdentities/scanner";
    let (system, by_client, by_resource) = (
        Identity::default(),
        Identity::default(),
        Identity::default(),
    );
    fakes().imds(None, &system);
    fakes().imds(Some(CLIENT_ID), &by_client);
    fakes().imds(Some(RESOURCE_ID), &by_resource);

    round_trip(&StorageAccount::new(imds(
        "Mi",
        &[("Mi__clientId", CLIENT_ID)],
    )))
    .await;
    round_trip(&StorageAccount::new(imds("Sys", &[]))).await;
    round_trip(&StorageAccount::new(imds(
        "Res",
        &[("Res__managedIdentityResourceId", RESOURCE_ID)],
    )))
    .await;
    for (identity, parameter) in [
        (&by_client, Some(("client_id", CLIENT_ID))),
        (&system, None),
        (&by_resource, Some(("msi_res_id", RESOURCE_ID))),
    ] {
        assert_eq!(identity.issued(), 1);
        let seen = &identity.seen()[0];
        assert_eq!(seen.path, "/metadata/identity/oauth2/token");
        assert_eq!(seen.headers["metadata"], "true");
        assert_eq!(seen.query["api-version"], "2018-02-01");
        assert_eq!(seen.query["resource"], STORAGE_RESOURCE);
        let ids: Vec<_> = ["client_id", "msi_res_id", "mi_res_id", "object_id"]
            .into_iter()
            .filter(|k| seen.query.contains_key(*k))
            .collect();
        match parameter {
            Some((key, value)) => {
                assert_eq!(ids, [key]);
                assert_eq!(seen.query[key], value);
            }
            None => assert!(ids.is_empty(), "{ids:?}"),
        }
    }
}

/// Each token endpoint busy for two answers (429, 503, 500): the provider waits it out and the
/// storage request goes through with the token issued on the third.
#[tokio::test]
async fn transient_token_endpoint_failures_are_retried_for_each_credential() {
    let (_dir, file) = token_file("token", FEDERATED);
    let busy = |status: u16, identity: Identity| {
        identity.unavailable_for.store(2, Ordering::SeqCst);
        identity.busy_status.store(status, Ordering::SeqCst);
        identity
    };
    let sp = busy(429, Identity::accepting(SECRET));
    let wi = busy(503, Identity::accepting(FEDERATED));
    let mi = busy(500, Identity::default());
    const MI_CLIENT: &str = "0c5a3a1e-2222-4000-8000-0000000000b5";
    fakes().imds(Some(MI_CLIENT), &mi);
    let accounts = [
        (client_secret("Sp", &fakes().tenant(&sp), SECRET), &sp),
        (workload_identity("Wi", &fakes().tenant(&wi), &file), &wi),
        (imds("Mi", &[("Mi__clientId", MI_CLIENT)]), &mi),
    ];
    for (settings, identity) in accounts {
        // No storage retries: the provider's own carry the request.
        let account = StorageAccount::new(settings).with_retry_policy(RetryPolicy::none());
        let tables = account.table_store(Arc::new(RequestCounters::new()));
        let table = support::unique_name("busy");
        assert!(tables.create_table(&table).await.unwrap());
        assert_eq!((identity.requests(), identity.issued()), (3, 1));
        assert!(tables.delete_table(&table).await.unwrap());
    }
}

/// Entra ID busy for good: the provider gives up after its attempts, the error is transient (a
/// later delivery may succeed) and names the connection.
#[tokio::test]
async fn a_token_endpoint_that_stays_busy_fails_transient_naming_the_connection() {
    let identity = Identity::accepting(SECRET);
    identity.unavailable_for.store(usize::MAX, Ordering::SeqCst);
    let tenant = fakes().tenant(&identity);
    let started = std::time::Instant::now();
    let (table, _) = first_requests_fail(client_secret("Busy", &tenant, SECRET)).await;
    assert_eq!(table.kind, StorageErrorKind::Transient, "{table}");
    let text = table.to_string();
    assert!(
        text.contains("no storage token for connection Busy (clientsecret)"),
        "{text}"
    );
    assert!(
        text.contains("answered 503 temporarily_unavailable"),
        "{text}"
    );
    assert!(text.contains("gave up after 6 attempts"), "{text}");
    assert_no_secret(&text, &[SECRET]);
    eprintln!("gave up after {:?}: {text}", started.elapsed());
    assert_eq!(
        identity.requests(),
        12,
        "6 attempts for each of two requests"
    );
}

/// A refused credential (wrong secret, unknown tenant, no federated credential for the token,
/// no such user-assigned identity, an unreadable token file) fails at the first answer, on
/// both request paths, naming the connection, the service's reason and the settings to check.
#[tokio::test]
async fn refused_credentials_fail_at_once_naming_the_connection_and_settings() {
    let (dir, file) = token_file("token", FEDERATED);
    let sp = Identity::accepting(SECRET);
    let wi = Identity::accepting(ROTATED);
    let unknown_tenant = uuid::Uuid::new_v4().to_string();
    let cases = [
        (
            client_secret("Sp", &fakes().tenant(&sp), WRONG_SECRET),
            Some(&sp),
            vec![
                "connection Sp (clientsecret)",
                "answered 401 invalid_client AADSTS7000215: Invalid client secret provided.",
                "check Sp__tenantId, Sp__clientId and Sp__clientSecret",
            ],
        ),
        (
            client_secret("Lost", &unknown_tenant, SECRET),
            None,
            vec![
                "connection Lost (clientsecret)",
                "answered 400 invalid_request AADSTS90002: Tenant not found.",
                "check Lost__tenantId",
            ],
        ),
        (
            workload_identity("Wi", &fakes().tenant(&wi), &file),
            Some(&wi),
            vec![
                "connection Wi (workloadidentity)",
                "answered 401 invalid_client AADSTS700213",
                "check Wi__tenantId (or AZURE_TENANT_ID), Wi__clientId (or AZURE_CLIENT_ID), \
                 the file in AZURE_FEDERATED_TOKEN_FILE",
            ],
        ),
        (
            workload_identity("Gone", &fakes().tenant(&wi), &dir.path().join("missing")),
            None,
            vec![
                "connection Gone (workloadidentity)",
                "cannot read the federated token file",
            ],
        ),
        (
            imds(
                "Mi",
                &[("Mi__clientId", "0c5a3a1e-3333-4000-8000-00000000dead")],
            ),
            None,
            vec![
                "connection Mi (managedidentity)",
                "answered 400 invalid_request Identity not found",
                "check Mi__clientId",
            ],
        ),
    ];
    for (settings, identity, expected) in cases {
        let (table, queue) = first_requests_fail(settings).await;
        for error in [&table, &queue] {
            assert_eq!(error.kind, StorageErrorKind::Rejected, "{error}");
            let text = format!("{error} {error:?}");
            for part in &expected {
                assert!(text.contains(part), "{text}\nshould say: {part}");
            }
            assert!(
                !text.contains("Trace ID"),
                "one line of description: {text}"
            );
            assert_no_secret(&text, &[SECRET, WRONG_SECRET, FEDERATED]);
        }
        if let Some(identity) = identity {
            assert_eq!(identity.issued(), 0);
        }
    }
    assert_eq!(sp.requests(), 2, "one per failed request: no retry");
    assert_eq!(wi.requests(), 2, "one per failed request: no retry");
}

/// No secret in `Debug` or `Display` of the settings and accounts of every credential.
#[tokio::test]
async fn settings_and_accounts_print_no_secret() {
    let (_dir, file) = token_file("token", FEDERATED);
    let tenant = uuid::Uuid::new_v4().to_string();
    for settings in [
        client_secret("Sp", &tenant, SECRET),
        workload_identity("Wi", &tenant, &file),
    ] {
        let account = StorageAccount::new(settings.clone());
        let text = format!("{settings:?} {account:?} {account}");
        assert_no_secret(&text, &[SECRET, FEDERATED]);
        assert!(text.contains("redacted") || text.contains("file"), "{text}");
    }
}

/// A handler whose start-up settings are wrong (a client secret but no tenant) exits with an
/// error naming the setting, and prints the secret nowhere.
#[test]
fn a_failed_handler_start_names_the_setting_and_prints_no_secret() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tablescan"))
        .arg("handler")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "trace")
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", "0")
        .env("AzureWebJobsStorage__accountName", "prodaccount1")
        .env("AzureWebJobsStorage__clientId", CLIENT_ID)
        .env("AzureWebJobsStorage__clientSecret", SECRET)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("AzureWebJobsStorage__tenantId"), "{text}");
    assert_no_secret(&text, &[SECRET]);
}

/// A copy scan through the local host whose app storage is a service principal, source a
/// workload identity and destination a service principal Entra ID refuses: the scan fails with
/// an error naming the destination's connection and settings, and no client secret, federated
/// token or issued token appears in the API's answers, the scan record or any log line of the
/// host and the handler (logging at `trace`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_destination_fails_the_scan_and_nothing_secret_is_logged() {
    use support::e2e::{seed, TestApp};
    let (_dir, file) = token_file("token", FEDERATED);
    let app = Identity::accepting(SECRET);
    let src = Identity::accepting(FEDERATED);
    let dst = Identity::accepting(SECRET);
    let (app_tenant, src_tenant, dst_tenant) = (
        fakes().tenant(&app),
        fakes().tenant(&src),
        fakes().tenant(&dst),
    );
    let file_path = file.to_str().unwrap();
    let app_credential = [
        ("tenantId", app_tenant.as_str()),
        ("clientId", CLIENT_ID),
        ("clientSecret", SECRET),
    ];
    let storage = identity_app_storage(false, &app_credential);
    let src_credential = [
        ("credential", "workloadidentity"),
        ("tenantId", src_tenant.as_str()),
        ("clientId", CLIENT_ID),
    ];
    let dst_credential = [
        ("credential", "clientsecret"),
        ("tenantId", dst_tenant.as_str()),
        ("clientId", CLIENT_ID),
        ("clientSecret", WRONG_SECRET),
    ];
    let mut connections = identity_app_settings("Src", false, &src_credential);
    connections.extend(identity_app_settings("Dst", false, &dst_credential));
    for (key, value) in [
        ("TABLESCAN_CONNECTIONS", "Src,Dst"),
        ("AZURE_FEDERATED_TOKEN_FILE", file_path),
        ("RUST_LOG", "trace"),
    ] {
        connections.push((key.into(), value.into()));
    }
    let seeder = StorageAccount::new(workload_identity("Src", &src_tenant, &file))
        .table_store(Arc::new(RequestCounters::new()));
    let test_app = TestApp::start_on(1, &borrowed(&storage), seeder, &borrowed(&connections)).await;
    let source = support::unique_name("SecretSource");
    let entities: Vec<_> = (0..30)
        .map(|i| entity("p", &format!("r{i:02}"), i))
        .collect();
    seed(&test_app.store, &source, entities).await;

    let (status, reply, _) = test_app
        .post_scan(&json!({"driver": "copy", "sourceTable": source, "destinationTable": "SecretDestination",
                           "sourceConnection": "Src", "destinationConnection": "Dst"}))
        .await;
    let mut answers = vec![reply.to_string()];
    if status == 202 {
        let id = reply["id"].as_str().unwrap().to_string();
        let end = test_app
            .wait_for_end(&id, std::time::Duration::from_secs(120))
            .await;
        assert_eq!(end["state"], "failed", "{end}");
        answers.push(end.to_string());
    }
    let answers = answers.join("\n");
    eprintln!("POST {status}; answers: {answers}");
    assert!(
        answers.contains("connection Dst (clientsecret)"),
        "{answers}"
    );
    assert!(answers.contains("Dst__clientSecret"), "{answers}");
    assert!(
        app.issued() >= 1 && src.issued() >= 1,
        "the app and the source got tokens"
    );
    assert_eq!(dst.issued(), 0);

    let logs = test_app.host().log_lines().join("\n");
    // The handler's debug lines are there, the token requests' among them.
    assert!(
        logs.contains("DEBUG") && logs.contains("oauth2/v2.0/token"),
        "{logs}"
    );
    let tokens: Vec<String> = [&app, &src, &dst].iter().flat_map(|i| i.tokens()).collect();
    let mut secrets: Vec<&str> = vec![SECRET, WRONG_SECRET, FEDERATED];
    secrets.extend(tokens.iter().map(String::as_str));
    assert_no_secret(&answers, &secrets);
    assert_no_secret(&logs, &secrets);
    test_app.shutdown().await;
}
