//! Unit tests of [`super`]: identity hosts from the environment, token answers and errors (none carrying a token), and a managed identity over a fake App Service endpoint.

use std::sync::{Arc, Mutex};

use super::*;

#[test]
fn imds_and_authority_hosts_from_the_environment() {
    let imds = "http://169.254.169.254/metadata/identity/oauth2/token";
    assert_eq!(imds_endpoint_at(None), imds);
    assert_eq!(imds_endpoint_at(Some(" ".into())), imds);
    assert_eq!(
        imds_endpoint_at(Some("http://127.0.0.1:2000/".into())),
        "http://127.0.0.1:2000/metadata/identity/oauth2/token"
    );
    assert_eq!(
        authority_host_from(None).unwrap().as_str(),
        "https://login.microsoftonline.com/"
    );
    assert_eq!(
        authority_host_from(Some("https://login.microsoftonline.us".into()))
            .unwrap()
            .as_str(),
        "https://login.microsoftonline.us/"
    );
    for refused in [
        "http://login.example",
        "login.microsoftonline.us",
        "https://",
    ] {
        let e = authority_host_from(Some(refused.into())).unwrap_err();
        assert!(!e.transient, "{e:?}");
        assert!(
            e.message.starts_with(&format!(
                "AZURE_AUTHORITY_HOST `{refused}` is not an https URL"
            )),
            "{e:?}"
        );
    }
}

#[test]
fn error_answers_give_their_code_and_first_description_line_only() {
    let entra = br#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided.\r\nTrace ID: 1\r\nCorrelation ID: 2","error_codes":[7000215]}"#;
    assert_eq!(
        error_detail(entra),
        (
            Some("invalid_client".into()),
            "invalid_client AADSTS7000215: Invalid client secret provided.".into()
        )
    );
    let nested = br#"{"error":{"code":"IdentityNotFound","message":"x"}}"#;
    assert_eq!(
        error_detail(nested),
        (Some("IdentityNotFound".into()), "IdentityNotFound".into())
    );
    assert_eq!(error_detail(b"<html>502</html>"), (None, String::new()));
}

#[test]
fn token_responses_parse_and_errors_carry_no_token() {
    let t = parse_token_response(
        br#"{"access_token":"eyJ0eXAi","expires_on":"1900000000","resource":"https://storage.azure.com/","token_type":"Bearer"}"#,
    )
    .unwrap();
    assert_eq!(t.token.secret(), "eyJ0eXAi");
    assert_eq!(t.expires_on.unix_timestamp(), 1_900_000_000);
    let n = parse_token_response(br#"{"access_token":"a","expires_on":1900000001}"#).unwrap();
    assert_eq!(n.expires_on.unix_timestamp(), 1_900_000_001);
    let e = parse_token_response(br#"{"access_token":"eyJ0eXAi"}"#).unwrap_err();
    assert!(!e.contains("eyJ0eXAi"), "{e}");
    assert!(parse_token_response(b"<html>").is_err());
}

/// Our managed-identity client against a fake App Service identity endpoint: the header and
/// query it sends, user-assigned ids, and how answers are classified.
#[tokio::test]
async fn managed_identity_over_a_fake_app_service_endpoint() {
    use axum::extract::{Query, State};
    use axum::http::{HeaderMap, StatusCode};
    use std::collections::HashMap;

    type Seen = Arc<Mutex<Vec<HashMap<String, String>>>>;
    async fn token(
        State((seen, status)): State<(Seen, Arc<Mutex<u16>>)>,
        headers: HeaderMap,
        Query(query): Query<HashMap<String, String>>,
    ) -> (StatusCode, String) {
        let mut q = query.clone();
        q.insert(
            "header".into(),
            headers
                .get("x-identity-header")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default(),
        );
        seen.lock().unwrap().push(q);
        let status = *status.lock().unwrap();
        if status != 200 {
            return (
                StatusCode::from_u16(status).unwrap(),
                r#"{"error":"invalid_request","error_description":"Identity not found"}"#.into(),
            );
        }
        (StatusCode::OK, r#"{"access_token":"mi-token","expires_on":"1900000000","resource":"https://storage.azure.com/","token_type":"Bearer","client_id":"x"}"#.into())
    }
    let seen: Seen = Arc::default();
    let status = Arc::new(Mutex::new(200u16));
    let app = axum::Router::new()
        .route("/msi/token", axum::routing::get(token))
        .with_state((seen.clone(), status.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let fetch = |id: ManagedIdentityId| {
        ManagedIdentityFetch::new(
            &reqwest::Client::new(),
            &ManagedIdentityEndpoint::AppService {
                endpoint: format!("http://{address}/msi/token"),
                header: "hdr-secret".into(),
            },
            &id,
        )
    };
    let fetched = fetch(ManagedIdentityId::System).fetch().await.unwrap();
    assert_eq!(fetched.token.secret(), "mi-token");
    assert_eq!(fetched.expires_on.unix_timestamp(), 1_900_000_000);
    fetch(ManagedIdentityId::ClientId("cid".into()))
        .fetch()
        .await
        .unwrap();
    fetch(ManagedIdentityId::ResourceId("/sub/x".into()))
        .fetch()
        .await
        .unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0]["api-version"], "2019-08-01");
        assert_eq!(seen[0]["resource"], STORAGE_RESOURCE);
        assert_eq!(seen[0]["header"], "hdr-secret");
        assert!(!seen[0].contains_key("client_id"));
        assert_eq!(seen[1]["client_id"], "cid");
        assert_eq!(seen[2]["mi_res_id"], "/sub/x");
    }
    for (code, transient) in [
        (400, false),
        (403, false),
        (404, true),
        (429, true),
        (500, true),
        (503, true),
    ] {
        *status.lock().unwrap() = code;
        let e = fetch(ManagedIdentityId::System).fetch().await.unwrap_err();
        assert_eq!(e.transient, transient, "{code}: {e:?}");
        assert!(
            e.message.contains(&format!(
                "answered {code} invalid_request Identity not found"
            )),
            "{e:?}"
        );
        assert!(!e.message.contains("hdr-secret"), "{e:?}");
    }
    // Nobody listening: transient.
    let nobody = ManagedIdentityFetch::new(
        &reqwest::Client::new(),
        &ManagedIdentityEndpoint::AppService {
            endpoint: "http://127.0.0.1:9/msi/token".into(),
            header: "hdr-secret".into(),
        },
        &ManagedIdentityId::System,
    );
    let e = nobody.fetch().await.unwrap_err();
    assert!(e.transient && !e.message.contains("hdr-secret"), "{e:?}");
}
