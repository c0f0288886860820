//! The fake identity server of a test process (see the parent module): the App Service
//! identity endpoint, IMDS and Entra ID's token endpoint (behind an https front), each answering
//! for the [`Identity`] registered under the request's key.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::json;

use super::{
    expiry_in, files, storage_jwt, IDENTITY_HEADER, JWT_BEARER, STORAGE_RESOURCE, STORAGE_SCOPE,
};

/// How long past the expiry its answer gives Azurite accepts a token, in seconds. A provider
/// refreshes a short-lived token at half its lifetime, and a request signed just before that
/// may reach Azurite a moment later, longer on a loaded machine: this covers that moment (a
/// hang bound, not a race), so Azurite never refuses a token the provider rightly handed out.
/// That Azurite refuses expired tokens at all is checked with [`Identity::expired`].
pub const IN_FLIGHT_GRACE: i64 = 5;

/// One request a fake endpoint received: path, headers (lowercase names), query and form.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub query: HashMap<String, String>,
    pub form: HashMap<String, String>,
}

/// One identity behind a fake endpoint: how it answers, and what it saw and issued.
#[derive(Clone)]
pub struct Identity {
    /// Every request, answered or not.
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Every token issued.
    issued: Arc<Mutex<Vec<String>>>,
    /// Answer every request with this status (0: issue tokens), with an error body.
    pub status: Arc<AtomicU16>,
    /// Answer `busy_status` to this many requests (counting down) before answering normally.
    pub unavailable_for: Arc<AtomicUsize>,
    pub busy_status: Arc<AtomicU16>,
    /// Issue tokens for another audience (which Azurite must refuse).
    pub wrong_audience: Arc<AtomicBool>,
    /// The lifetime the answers give tokens, in seconds. App Service answers it as `expires_in`
    /// when set (else an hour as `expires_on`, as the real endpoint does). Azurite accepts each
    /// token [`IN_FLIGHT_GRACE`] longer (see [`Identity::issue`]).
    pub lifetime: Arc<AtomicI64>,
    /// Issue tokens whose `exp` has passed while the answer says they live their lifetime:
    /// the provider hands them out, Azurite must refuse them.
    pub expired: Arc<AtomicBool>,
    /// Entra ID: the client secret or client assertion the app registration accepts (any if
    /// unset); another one is answered `400 invalid_client`, as Entra ID does.
    pub credential: Arc<Mutex<Option<String>>>,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            seen: Arc::default(),
            issued: Arc::default(),
            status: Arc::default(),
            unavailable_for: Arc::default(),
            busy_status: Arc::new(AtomicU16::new(503)),
            wrong_audience: Arc::default(),
            lifetime: Arc::default(),
            expired: Arc::default(),
            credential: Arc::default(),
        }
    }
}

impl Identity {
    /// An Entra ID app registration accepting only `credential` (a client secret or assertion).
    pub fn accepting(credential: &str) -> Identity {
        let identity = Identity::default();
        *identity.credential.lock().unwrap() = Some(credential.to_string());
        identity
    }
    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    pub fn issued(&self) -> usize {
        self.issued.lock().unwrap().len()
    }
    /// Every token issued so far (to check none leaks).
    pub fn tokens(&self) -> Vec<String> {
        self.issued.lock().unwrap().clone()
    }

    /// The failure to answer now, if any: scripted outages first, then a fixed status.
    fn scripted_failure(&self) -> Option<(StatusCode, String)> {
        if self
            .unavailable_for
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let status = self.busy_status.load(Ordering::SeqCst);
            return Some((
                StatusCode::from_u16(status).unwrap(),
                r#"{"error":"temporarily_unavailable","error_description":"AADSTS50196: busy"}"#
                    .into(),
            ));
        }
        let status = self.status.load(Ordering::SeqCst);
        (status != 0).then(|| {
            (
                StatusCode::from_u16(status).unwrap(),
                r#"{"error":"unavailable"}"#.into(),
            )
        })
    }

    /// A new token, recorded as issued: its text, the expiry its answer gives (unix seconds,
    /// rounded up: never sooner than its lifetime from now) and its lifetime in seconds. Its JWT
    /// `exp`, which Azurite checks, is [`IN_FLIGHT_GRACE`] after that expiry (or past, when
    /// `expired`).
    fn issue(&self) -> (String, i64, i64) {
        let audience = if self.wrong_audience.load(Ordering::SeqCst) {
            "https://vault.azure.net"
        } else {
            "https://storage.azure.com"
        };
        let lifetime = match self.lifetime.load(Ordering::SeqCst) {
            0 => 3600,
            n => n,
        };
        let expires_on = expiry_in(lifetime);
        let exp = if self.expired.load(Ordering::SeqCst) {
            expiry_in(-30)
        } else {
            expires_on + IN_FLIGHT_GRACE
        };
        let token = storage_jwt(audience, exp);
        self.issued.lock().unwrap().push(token.clone());
        (token, expires_on, lifetime)
    }
}

/// The fake identity server: plain http (App Service, IMDS) and its https front (Entra ID).
pub struct Fakes {
    /// `http://127.0.0.1:port` (IMDS's host, App Service endpoints below it).
    pub http: String,
    /// `https://127.0.0.1:port` (the Entra ID authority host).
    pub authority_host: String,
    identities: Arc<Mutex<HashMap<String, Identity>>>,
    _front: Mutex<(Child, ChildStdin)>,
}

impl Fakes {
    fn register(&self, key: String, identity: &Identity) {
        let previous = self
            .identities
            .lock()
            .unwrap()
            .insert(key.clone(), identity.clone());
        assert!(previous.is_none(), "{key} registered twice");
    }

    /// A new App Service identity endpoint URL (`IDENTITY_ENDPOINT`) answering for `identity`.
    pub fn app_service(&self, identity: &Identity) -> String {
        self.app_service_users(identity, &[])
    }

    /// [`Fakes::app_service`] whose app also has the user-assigned identities `users` (asked for
    /// by `client_id`); another client id is answered 400, as App Service does.
    pub fn app_service_users(&self, system: &Identity, users: &[(&str, &Identity)]) -> String {
        let key = format!("msi{:x}", rand::random::<u64>());
        self.register(key.clone(), system);
        for (client_id, identity) in users {
            self.register(format!("{key}:{client_id}"), identity);
        }
        format!("{}/msi/{key}/token", self.http)
    }

    /// IMDS answers for `identity` when asked for `id` (a client id or resource id; `None`: the
    /// system-assigned identity).
    pub fn imds(&self, id: Option<&str>, identity: &Identity) {
        self.register(format!("imds:{}", id.unwrap_or("system")), identity);
    }

    /// A new Entra ID tenant (its id) whose app registration is `identity`.
    pub fn tenant(&self, identity: &Identity) -> String {
        let tenant = uuid::Uuid::new_v4().to_string();
        self.register(tenant.clone(), identity);
        tenant
    }

    fn get(&self, key: &str) -> Option<Identity> {
        self.identities.lock().unwrap().get(key).cloned()
    }
}

/// The fake identity server of this test process.
pub fn fakes() -> &'static Fakes {
    static FAKES: OnceLock<Fakes> = OnceLock::new();
    FAKES.get_or_init(|| {
        let identities: Arc<Mutex<HashMap<String, Identity>>> = Arc::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let state = identities.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let app = axum::Router::new()
                    .route("/msi/{key}/token", axum::routing::get(app_service))
                    .route("/metadata/identity/oauth2/token", axum::routing::get(imds))
                    .route("/{tenant}/oauth2/v2.0/token", axum::routing::post(entra))
                    .with_state(state)
                    // Every answer is JSON, as the real endpoints' are.
                    .layer(axum::middleware::map_response(json_content_type));
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            })
        });
        let (front, authority_host) = https_front(address.port());
        Fakes {
            http: format!("http://{address}"),
            authority_host,
            identities,
            _front: Mutex::new(front),
        }
    })
}

/// An https front (node, with the test certificate) for the fake server's port; it exits when
/// its stdin (held here) closes, so it never outlives the test process. No Rust TLS server
/// library is among our dependencies; node is (Azurite runs on it).
fn https_front(port: u16) -> ((Child, ChildStdin), String) {
    const SCRIPT: &str = r#"
const fs = require('fs'), http = require('http'), https = require('https');
const [cert, key, port] = process.argv.slice(1);
const server = https.createServer({cert: fs.readFileSync(cert), key: fs.readFileSync(key)}, (req, res) => {
  const up = http.request({host: '127.0.0.1', port, method: req.method, path: req.url, headers: req.headers},
    (answer) => { res.writeHead(answer.statusCode, answer.headers); answer.pipe(res); });
  up.on('error', () => { res.writeHead(502); res.end(); });
  req.pipe(up);
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
"#;
    let files = files();
    let mut child = Command::new("node")
        .arg("-e")
        .arg(SCRIPT)
        .arg(&files.cert)
        .arg(&files.key)
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node is installed");
    let stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let front: u16 = line
        .trim()
        .parse()
        .expect("the https front prints its port");
    ((child, stdin), format!("https://127.0.0.1:{front}"))
}

fn headers_of(headers: &HeaderMap) -> HashMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect()
}

type Answer = (StatusCode, String);

async fn json_content_type(mut response: axum::response::Response) -> axum::response::Response {
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

fn bad_request(error: &str, description: &str) -> Answer {
    (
        StatusCode::BAD_REQUEST,
        json!({"error": error, "error_description": description}).to_string(),
    )
}

/// App Service/Functions: `x-identity-header`, api-version 2019-08-01, the storage resource.
async fn app_service(
    State(identities): State<Arc<Mutex<HashMap<String, Identity>>>>,
    UrlPath(key): UrlPath<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let user = query.get("client_id");
    let registered = match user {
        Some(client_id) => format!("{key}:{client_id}"),
        None => key.clone(),
    };
    let Some(identity) = identities.lock().unwrap().get(&registered).cloned() else {
        return match user {
            Some(_) => bad_request("invalid_request", "Identity not found"),
            None => (StatusCode::NOT_FOUND, String::new()),
        };
    };
    identity.seen.lock().unwrap().push(Seen {
        path: format!("/msi/{key}/token"),
        headers: headers_of(&headers),
        query: query.clone(),
        form: HashMap::new(),
    });
    if let Some(failure) = identity.scripted_failure() {
        return failure;
    }
    if headers.get("x-identity-header").map(|v| v.as_bytes()) != Some(IDENTITY_HEADER.as_bytes())
        || query.get("resource").map(String::as_str) != Some(STORAGE_RESOURCE)
        || query.get("api-version").map(String::as_str) != Some("2019-08-01")
    {
        return bad_request("invalid_request", "bad header, resource or api-version");
    }
    let explicit = identity.lifetime.load(Ordering::SeqCst) > 0;
    let (token, exp, lifetime) = identity.issue();
    let mut answer = json!({"access_token": token, "resource": STORAGE_RESOURCE,
                            "token_type": "Bearer"});
    if explicit {
        answer["expires_in"] = lifetime.to_string().into();
    } else {
        answer["expires_on"] = exp.to_string().into();
    }
    (StatusCode::OK, answer.to_string())
}

/// IMDS: `Metadata: true`, api-version 2018-02-01, the storage resource, and `client_id` or
/// `msi_res_id` for a user-assigned identity (unknown ones: 400, as IMDS answers).
async fn imds(
    State(identities): State<Arc<Mutex<HashMap<String, Identity>>>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Answer {
    let id = query
        .get("client_id")
        .or_else(|| query.get("msi_res_id"))
        .map(String::as_str)
        .unwrap_or("system");
    let Some(identity) = identities
        .lock()
        .unwrap()
        .get(&format!("imds:{id}"))
        .cloned()
    else {
        return bad_request("invalid_request", "Identity not found");
    };
    identity.seen.lock().unwrap().push(Seen {
        path: "/metadata/identity/oauth2/token".into(),
        headers: headers_of(&headers),
        query: query.clone(),
        form: HashMap::new(),
    });
    if let Some(failure) = identity.scripted_failure() {
        return failure;
    }
    if headers.get("metadata").map(|v| v.as_bytes()) != Some(b"true")
        || query.get("resource").map(String::as_str) != Some(STORAGE_RESOURCE)
        || query.get("api-version").map(String::as_str) != Some("2018-02-01")
    {
        return bad_request("invalid_request", "bad header, resource or api-version");
    }
    let (token, exp, lifetime) = identity.issue();
    let answer = json!({"access_token": token, "client_id": "5c0c1d3e-0000-4000-8000-000000000001",
        "expires_in": lifetime.to_string(), "expires_on": exp.to_string(),
        "ext_expires_in": lifetime.to_string(), "not_before": (exp - lifetime).to_string(),
        "resource": STORAGE_RESOURCE, "token_type": "Bearer"});
    (StatusCode::OK, answer.to_string())
}

/// Entra ID's v2 token endpoint, client credentials grant: a client secret, or a federated
/// client assertion (workload identity).
async fn entra(
    State(identities): State<Arc<Mutex<HashMap<String, Identity>>>>,
    UrlPath(tenant): UrlPath<String>,
    headers: HeaderMap,
    body: String,
) -> Answer {
    let Some(identity) = identities.lock().unwrap().get(&tenant).cloned() else {
        return bad_request("invalid_request", "AADSTS90002: Tenant not found.");
    };
    let form: HashMap<String, String> = azure_core::Url::parse(&format!("http://form/?{body}"))
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    identity.seen.lock().unwrap().push(Seen {
        path: format!("/{tenant}/oauth2/v2.0/token"),
        headers: headers_of(&headers),
        query: HashMap::new(),
        form: form.clone(),
    });
    if let Some(failure) = identity.scripted_failure() {
        return failure;
    }
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    if field("grant_type") != "client_credentials" || field("client_id").is_empty() {
        return bad_request("invalid_request", "AADSTS900144: grant_type or client_id");
    }
    if field("scope") != STORAGE_SCOPE {
        return bad_request(
            "invalid_scope",
            "AADSTS70011: The provided scope is not valid.",
        );
    }
    let presented = if !field("client_secret").is_empty() {
        field("client_secret")
    } else if field("client_assertion_type") == JWT_BEARER {
        field("client_assertion")
    } else {
        return bad_request(
            "invalid_client",
            "AADSTS7000216: client_assertion or client_secret",
        );
    };
    let expected = identity.credential.lock().unwrap().clone();
    if expected.is_some_and(|e| e != presented) {
        let description = if field("client_secret").is_empty() {
            "AADSTS700213: No matching federated identity record found for presented assertion \
             subject.\r\nTrace ID: 1\r\nCorrelation ID: 2"
        } else {
            "AADSTS7000215: Invalid client secret provided.\r\nTrace ID: 1\r\nCorrelation ID: 2"
        };
        return (
            StatusCode::UNAUTHORIZED,
            json!({"error": "invalid_client", "error_description": description}).to_string(),
        );
    }
    let (token, _, lifetime) = identity.issue();
    let answer = json!({"token_type": "Bearer", "expires_in": lifetime,
                        "ext_expires_in": lifetime, "access_token": token});
    (StatusCode::OK, answer.to_string())
}
