//! Unit tests of [`super`]: app settings to a connection, and every error naming its setting.

use std::collections::HashMap;

use super::*;
use crate::storage::connection_string::DEVELOPMENT_ACCOUNT_KEY;

const SECRET: &str = "c2VjcmV0LWNsaWVudC1zZWNyZXQ";
const HEADER: &str = "aWRlbnRpdHktaGVhZGVyLXNlY3JldA";

fn read(name: &str, pairs: &[(&str, &str)]) -> Result<ConnectionSettings, ConnectionSettingError> {
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

/// A connection with the clientsecret credential (its secret is [`SECRET`]).
fn service_principal() -> ConnectionSettings {
    read(
        "C",
        &[
            ("C__accountName", "acct"),
            ("C__tenantId", "t1"),
            ("C__clientId", "c1"),
            ("C__clientSecret", SECRET),
        ],
    )
    .unwrap()
}

#[test]
fn other_credentials() {
    let sp = service_principal();
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
    assert_errors_name_the_setting(&[
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
    ]);
}

#[test]
fn credential_errors_name_the_setting() {
    assert_errors_name_the_setting(&[
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
    ]);
}

/// Settings, the setting an error must name, and a piece of its message.
type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);

/// Each case is an error that names its setting, mentions its message and no secret.
fn assert_errors_name_the_setting(cases: &[Case]) {
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
    let sp = service_principal();
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
