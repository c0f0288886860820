//! An independent oracle for table contents: a tiny Table REST client written here, in the test,
//! that shares nothing with tablescan's storage code. It signs its own requests (Table
//! SharedKey), writes entities from JSON text the test built itself, and reads entities back as
//! text: every property value is the service's JSON text, sliced with `serde_json`'s `RawValue`
//! and never parsed into a number. Doubles are compared by their bits, parsed with Rust's
//! correctly rounded `str::parse::<f64>`.
//!
//! Checking a copy by reading both tables through tablescan's own entity parser cannot notice a
//! parser that changes values (it changes both sides alike); this client can.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::{Method, StatusCode};
use serde_json::value::RawValue;
use sha2::Sha256;
use tablescan::storage::connection::{DEVELOPMENT_ACCOUNT, DEVELOPMENT_ACCOUNT_KEY};

const VERSION: &str = "2022-11-02";
const JSON: &str = "application/json";
const NO_METADATA: &str = "application/json;odata=nometadata";
const FULL_METADATA: &str = "application/json;odata=fullmetadata";

/// A request the service refused (or that never got an answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawError {
    /// HTTP status; 0 when there was no response.
    pub status: u16,
    /// The response body (the `odata.error` JSON) or the transport error.
    pub body: String,
}

impl RawError {
    /// The `odata.error.code`, if the body has one.
    pub fn code(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        v["odata.error"]["code"].as_str().map(str::to_string)
    }
}

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body: String = self.body.chars().take(300).collect();
        write!(f, "HTTP {}: {body}", self.status)
    }
}

/// How [`no_answer`] starts a request that found no connection (so was never sent).
const NO_CONNECTION: &str = "no connection: ";

/// A request that got no (whole) answer: status 0, and the transport error with its causes
/// (reqwest's own text is only "error sending request").
fn no_answer(e: reqwest::Error) -> RawError {
    let mut body = if e.is_connect() { NO_CONNECTION } else { "" }.to_string();
    body.push_str(&e.to_string());
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let _ = write!(body, ": {cause}");
        source = cause.source();
    }
    RawError { status: 0, body }
}

/// Whether a request that failed with `e` on its `attempt`-th resend (0: the first sending) is
/// sent again: only one that got no answer, at most 3 times, and only when a second sending
/// cannot change the outcome: a read (`GET`), or a request refused before it was sent (no
/// connection). Under load a pooled connection that Azurite closes as it is reused fails a
/// request with "error sending request"; a write is never resent, since this oracle must not
/// turn one insert into an insert and a 409.
fn resend(method: &Method, e: &RawError, attempt: u32) -> bool {
    let unsent = e.body.starts_with(NO_CONNECTION);
    e.status == 0 && attempt < 3 && (method == Method::GET || unsent)
}

/// Runs `once` until it succeeds or fails in a way [`resend`] does not send again (50, 100,
/// 200 ms apart).
async fn resending<T, F: std::future::Future<Output = Result<T, RawError>>>(
    method: &Method,
    mut once: impl FnMut() -> F,
) -> Result<T, RawError> {
    let mut attempt = 0;
    loop {
        match once().await {
            Err(e) if resend(method, &e, attempt) => attempt += 1,
            other => return other,
        }
        tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
    }
}

/// One entity as the service wrote it: key and property texts, read-only metadata dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntity {
    /// The JSON text of `PartitionKey` (a JSON string literal, quotes included).
    pub partition_key_text: String,
    /// The JSON text of `RowKey`.
    pub row_key_text: String,
    /// Property name (annotations such as `Name@odata.type` included) → JSON text of its value.
    pub properties: BTreeMap<String, String>,
}

impl RawEntity {
    /// The decoded partition key (lone surrogates, which a Rust string cannot hold, become U+FFFD).
    pub fn partition_key(&self) -> String {
        decode_string_lossy(&self.partition_key_text)
    }

    /// The decoded row key (lossy like [`RawEntity::partition_key`]).
    pub fn row_key(&self) -> String {
        decode_string_lossy(&self.row_key_text)
    }

    /// The identity of the row: both key texts.
    pub fn key(&self) -> (&str, &str) {
        (&self.partition_key_text, &self.row_key_text)
    }

    /// The JSON text of a property.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// A property's `@odata.type` annotation, decoded (`None` when unannotated).
    pub fn annotation(&self, name: &str) -> Option<String> {
        self.text(&format!("{name}@odata.type"))
            .map(decode_string_lossy)
    }

    /// A Double property's bits: a JSON number parsed by std, or `"NaN"`/`"Infinity"`/
    /// `"-Infinity"` annotated `Edm.Double`. `None` if the property is not a double.
    pub fn double_bits(&self, name: &str) -> Option<u64> {
        double_bits(self.text(name)?, self.annotation(name).as_deref())
    }
}

/// The bits of a Double from its JSON text: std's correctly rounded parse of a number, or one of
/// the three special strings when annotated `Edm.Double`.
pub fn double_bits(text: &str, annotation: Option<&str>) -> Option<u64> {
    if text.starts_with('"') {
        if annotation != Some("Edm.Double") {
            return None;
        }
        return match text {
            "\"NaN\"" => Some(f64::NAN.to_bits()),
            "\"Infinity\"" => Some(f64::INFINITY.to_bits()),
            "\"-Infinity\"" => Some(f64::NEG_INFINITY.to_bits()),
            _ => None,
        };
    }
    let is_number = text.starts_with(|c: char| c == '-' || c.is_ascii_digit());
    if !is_number {
        return None;
    }
    // An unannotated integer literal is an Int32, not a Double.
    let fractional = text.contains(['.', 'e', 'E']);
    if !fractional && annotation != Some("Edm.Double") {
        return None;
    }
    text.parse::<f64>().ok().map(f64::to_bits)
}

/// The JSON text of a double the way a writer must send it: Rust's shortest round-tripping
/// text (`{:?}`, always with a `.` or an exponent) and `Edm.Double`, or a special string.
/// Every NaN (any payload, either sign) is `"NaN"`.
pub fn double_text(value: f64) -> String {
    if value.is_nan() {
        "\"NaN\"".to_string()
    } else if value == f64::INFINITY {
        "\"Infinity\"".to_string()
    } else if value == f64::NEG_INFINITY {
        "\"-Infinity\"".to_string()
    } else {
        let text = format!("{value:?}");
        debug_assert_eq!(text.parse::<f64>().unwrap().to_bits(), value.to_bits());
        text
    }
}

/// A JSON string literal for `s` (quotes included).
pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a str serializes")
}

/// Decodes a JSON string literal; unpaired surrogate escapes become U+FFFD.
pub fn decode_string_lossy(text: &str) -> String {
    if let Ok(s) = serde_json::from_str::<String>(text) {
        return s;
    }
    // serde_json refuses lone surrogates: decode the escapes by hand into UTF-16.
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    let mut units: Vec<u16> = Vec::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u16; 2];
            units.extend_from_slice(c.encode_utf16(&mut buf));
            continue;
        }
        match chars.next() {
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                units.push(u16::from_str_radix(&hex, 16).unwrap_or(0xFFFD));
            }
            Some('n') => units.push(u16::from(b'\n')),
            Some('r') => units.push(u16::from(b'\r')),
            Some('t') => units.push(u16::from(b'\t')),
            Some('b') => units.push(0x08),
            Some('f') => units.push(0x0C),
            Some(other) => units.push(other as u16),
            None => {}
        }
    }
    String::from_utf16_lossy(&units)
}

/// A Table service client on the shared Azurite's development account.
#[derive(Clone)]
pub struct RawClient {
    http: reqwest::Client,
    /// `http://127.0.0.1:port/devstoreaccount1`
    base: String,
    /// The base's path (`/devstoreaccount1`), which the canonical resource includes.
    base_path: String,
    account: String,
    key: Vec<u8>,
}

impl RawClient {
    /// A client for the shared test Azurite (its own HTTP connection pool).
    pub fn azurite() -> RawClient {
        RawClient::new(
            &super::azurite().table_endpoint(),
            DEVELOPMENT_ACCOUNT,
            DEVELOPMENT_ACCOUNT_KEY,
        )
    }

    pub fn new(endpoint: &str, account: &str, base64_key: &str) -> RawClient {
        let base = endpoint.trim_end_matches('/').to_string();
        let base_path = reqwest::Url::parse(&base)
            .expect("endpoint URL")
            .path()
            .trim_end_matches('/')
            .to_string();
        RawClient {
            // Idle connections are dropped well before Azurite's keep-alive (Node's 5 s) closes
            // them: reusing one the server is closing fails the request ("error sending request",
            // seen under load); a read that fails so is sent again ([`resend`]).
            http: reqwest::Client::builder()
                .pool_idle_timeout(std::time::Duration::from_secs(2))
                .build()
                .expect("an HTTP client"),
            base,
            base_path,
            account: account.to_string(),
            key: base64::engine::general_purpose::STANDARD
                .decode(base64_key)
                .expect("account key is base64"),
        }
    }

    /// `SharedKey account:base64(HMAC-SHA256(key, "VERB\n\nContent-Type\nx-ms-date\n/account/path"))`.
    fn authorization(&self, method: &Method, content_type: &str, date: &str, path: &str) -> String {
        let string_to_sign = format!(
            "{method}\n\n{content_type}\n{date}\n/{}{}/{path}",
            self.account, self.base_path
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        mac.update(string_to_sign.as_bytes());
        let signature =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        format!("SharedKey {}:{signature}", self.account)
    }

    /// Sends one signed request; returns the headers and body of a 2xx answer. A request that
    /// got no answer is sent again when that cannot change what it does ([`resend`]).
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        accept: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(reqwest::header::HeaderMap, String), RawError> {
        resending(&method, || {
            self.send_once(method.clone(), (path, query), accept, body.clone())
        })
        .await
    }

    async fn send_once(
        &self,
        method: Method,
        (path, query): (&str, &[(&str, &str)]),
        accept: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(reqwest::header::HeaderMap, String), RawError> {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let content_type = if body.is_some() { JSON } else { "" };
        let mut request = self
            .http
            .request(method.clone(), format!("{}/{path}", self.base))
            .query(query)
            .header(
                "authorization",
                self.authorization(&method, content_type, &date, path),
            )
            .header("x-ms-date", &date)
            .header("x-ms-version", VERSION)
            .header("dataserviceversion", "3.0")
            .header("maxdataserviceversion", "3.0;NetFx")
            .header("accept", accept);
        if let Some(body) = body {
            request = request
                .header("content-type", content_type)
                .header("prefer", "return-no-content")
                .body(body);
        }
        let response = request.send().await.map_err(no_answer)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(no_answer)?;
        let body = String::from_utf8(body.to_vec()).map_err(|e| RawError {
            status: status.as_u16(),
            body: format!("response is not UTF-8: {e}"),
        })?;
        if status.is_success() {
            Ok((headers, body))
        } else {
            Err(RawError {
                status: status.as_u16(),
                body,
            })
        }
    }

    /// Creates a table (`Ok(false)` if it already existed).
    pub async fn create_table(&self, table: &str) -> Result<bool, RawError> {
        let body = format!("{{\"TableName\":{}}}", json_string(table));
        match self
            .send(
                Method::POST,
                "Tables",
                &[],
                NO_METADATA,
                Some(body.into_bytes()),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status == StatusCode::CONFLICT.as_u16() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Inserts one entity from the JSON object text the caller built (sent byte for byte).
    pub async fn insert(&self, table: &str, entity_json: &str) -> Result<(), RawError> {
        self.send(
            Method::POST,
            table,
            &[],
            NO_METADATA,
            Some(entity_json.as_bytes().to_vec()),
        )
        .await
        .map(|_| ())
    }

    /// Every entity of a table in the service's order, following continuation headers.
    pub async fn read_all(&self, table: &str) -> Result<Vec<RawEntity>, RawError> {
        let path = format!("{table}()");
        let mut all = Vec::new();
        let mut next: Option<(String, Option<String>)> = None;
        loop {
            let mut query: Vec<(&str, &str)> = Vec::new();
            if let Some((pk, rk)) = &next {
                query.push(("NextPartitionKey", pk));
                if let Some(rk) = rk {
                    query.push(("NextRowKey", rk));
                }
            }
            let (headers, body) = self
                .send(Method::GET, &path, &query, FULL_METADATA, None)
                .await?;
            all.extend(parse_page(&body).map_err(|e| RawError {
                status: 200,
                body: e,
            })?);
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            match header("x-ms-continuation-NextPartitionKey") {
                Some(pk) => next = Some((pk, header("x-ms-continuation-NextRowKey"))),
                None => return Ok(all),
            }
        }
    }

    /// One entity by its keys (`Ok(None)` when there is no such row).
    pub async fn get_entity(
        &self,
        table: &str,
        partition_key: &str,
        row_key: &str,
    ) -> Result<Option<RawEntity>, RawError> {
        let path = format!(
            "{}(PartitionKey='{}',RowKey='{}')",
            percent_encode(table),
            percent_encode(&partition_key.replace('\'', "''")),
            percent_encode(&row_key.replace('\'', "''"))
        );
        match self
            .send(Method::GET, &path, &[], FULL_METADATA, None)
            .await
        {
            Ok((_, body)) => {
                let page = format!("{{\"value\":[{body}]}}");
                Ok(parse_page(&page)
                    .map_err(|e| RawError {
                        status: 200,
                        body: e,
                    })?
                    .pop())
            }
            Err(e) if e.status == StatusCode::NOT_FOUND.as_u16() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces (or inserts) one entity with the JSON object text the caller built, without a
    /// condition (`PUT` with no `If-Match`): the row gets a new ETag.
    pub async fn replace(
        &self,
        table: &str,
        (partition_key, row_key): (&str, &str),
        entity_json: &str,
    ) -> Result<(), RawError> {
        let path = format!(
            "{}(PartitionKey='{}',RowKey='{}')",
            percent_encode(table),
            percent_encode(&partition_key.replace('\'', "''")),
            percent_encode(&row_key.replace('\'', "''"))
        );
        let body = Some(entity_json.as_bytes().to_vec());
        self.send(Method::PUT, &path, &[], NO_METADATA, body)
            .await
            .map(|_| ())
    }

    /// [`RawClient::read_all`], panicking with the table's name on error.
    pub async fn rows(&self, table: &str) -> Vec<RawEntity> {
        self.read_all(table)
            .await
            .unwrap_or_else(|e| panic!("raw read of {table}: {e}"))
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// An integer property's value: an Int64 string or an Int32 number (`None` otherwise).
pub fn integer(text: Option<&str>) -> Option<i64> {
    let text = text?;
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(inner) => inner.parse().ok(),
        None => text.parse().ok(),
    }
}

/// Parses one query response page into raw entities: `{"odata.metadata":..,"value":[{..},..]}`.
pub fn parse_page(body: &str) -> Result<Vec<RawEntity>, String> {
    #[derive(serde::Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        value: Vec<BTreeMap<String, &'a RawValue>>,
    }
    let page: Page<'_> = serde_json::from_str(body).map_err(|e| {
        // Show where the text stops being JSON (by line and column of a one-line body).
        let at = body.lines().nth(e.line().saturating_sub(1)).unwrap_or(body);
        let bytes = at.as_bytes();
        let end = e.column().saturating_sub(1).min(bytes.len());
        let before = String::from_utf8_lossy(&bytes[end.saturating_sub(80)..end]);
        let after = String::from_utf8_lossy(&bytes[end..(end + 20).min(bytes.len())]);
        format!("query page is not JSON: {e}, at …{before}⟨here⟩{after}…")
    })?;
    page.value
        .into_iter()
        .map(|mut object| {
            let mut key = |name: &str| {
                object
                    .remove(name)
                    .map(|v| v.get().to_string())
                    .filter(|t| t.starts_with('"'))
                    .ok_or_else(|| format!("entity without a string {name}"))
            };
            let partition_key_text = key("PartitionKey")?;
            let row_key_text = key("RowKey")?;
            let properties = object
                .into_iter()
                .filter(|(name, _)| {
                    !name.starts_with("odata.")
                        && name != "Timestamp"
                        && name != "Timestamp@odata.type"
                })
                .map(|(name, value)| (name, value.get().to_string()))
                .collect();
            Ok(RawEntity {
                partition_key_text,
                row_key_text,
                properties,
            })
        })
        .collect()
}

/// Every difference between two tables read raw: rows missing or extra, properties missing or
/// extra, and property texts that differ (with the double bits when both parse as doubles).
/// Empty when the destination is the source byte for byte (row order included).
pub fn diff(source: &[RawEntity], destination: &[RawEntity]) -> Vec<String> {
    let mut problems = Vec::new();
    let by_key: BTreeMap<(&str, &str), &RawEntity> =
        destination.iter().map(|e| (e.key(), e)).collect();
    let source_keys: BTreeMap<(&str, &str), &RawEntity> =
        source.iter().map(|e| (e.key(), e)).collect();
    for row in source {
        let (pk, rk) = row.key();
        match by_key.get(&row.key()) {
            None => problems.push(format!("row ({pk}, {rk}) missing")),
            Some(got) => problems.extend(
                diff_entity(row, got)
                    .into_iter()
                    .map(|p| format!("row ({}, {}): {p}", short(pk), short(rk))),
            ),
        }
    }
    for row in destination {
        if !source_keys.contains_key(&row.key()) {
            let (pk, rk) = row.key();
            problems.push(format!(
                "row ({}, {}) not in the source",
                short(pk),
                short(rk)
            ));
        }
    }
    if problems.is_empty() {
        let order = |rows: &[RawEntity]| -> Vec<(String, String)> {
            rows.iter()
                .map(|e| (e.partition_key_text.clone(), e.row_key_text.clone()))
                .collect()
        };
        if order(source) != order(destination) {
            problems.push("same rows, different key order".to_string());
        }
    }
    problems
}

/// The property differences of one row (`expected` → `got`).
pub fn diff_entity(expected: &RawEntity, got: &RawEntity) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, want) in &expected.properties {
        match got.properties.get(name) {
            None => problems.push(format!("{name} missing (source {})", short(want))),
            Some(have) if have != want => {
                let mut p = format!("{name} is {} (source {})", short(have), short(want));
                let bits = (expected.double_bits(name), got.double_bits(name));
                if let (Some(w), Some(h)) = bits {
                    let _ = write!(
                        p,
                        " — double bits {h:#018x} vs {w:#018x}{}",
                        if h == w {
                            " (same value, other text)"
                        } else {
                            ""
                        }
                    );
                }
                problems.push(p);
            }
            Some(_) => {}
        }
    }
    for (name, have) in &got.properties {
        if !expected.properties.contains_key(name) {
            problems.push(format!("{name} = {} added", short(have)));
        }
    }
    problems
}

/// Doubles written as JSON text that need all 17 significant digits (a parser that is not
/// correctly rounded changes them in the last bit), and a whole double that must stay a Double.
pub const HARD_DOUBLES: [&str; 4] = [
    "0.46464804158416084",
    "-1.5e-300",
    "6.0380076462132985e+97",
    "3.0",
];

/// At most 80 characters of a text, for messages.
pub fn short(text: &str) -> String {
    if text.chars().count() <= 80 {
        text.to_string()
    } else {
        let head: String = text.chars().take(60).collect();
        format!("{head}…({} chars)", text.chars().count())
    }
}

/// Creates `table` and inserts one row per `(partition key, row key)` with typed properties
/// (`N` Int64, `D` double, `S` string) as JSON text the test writes itself; the rows as read back.
pub async fn seed_keys(client: &RawClient, table: &str, keys: &[(&str, &str)]) -> Vec<RawEntity> {
    client.create_table(table).await.expect("create table");
    for (i, (pk, rk)) in keys.iter().enumerate() {
        let body = format!(
            r#"{{"PartitionKey":{},"RowKey":{},"N":"{i}","N@odata.type":"Edm.Int64","D":{i}.5,"S":"row {i}"}}"#,
            json_string(pk),
            json_string(rk)
        );
        client.insert(table, &body).await.expect("raw insert");
    }
    let rows = client.rows(table).await;
    assert_eq!(rows.len(), keys.len(), "seeded {table}");
    rows
}

/// One queue message as the Queue service returned it: the text exactly as stored (base64 or
/// not, as it was put) and the times as the service wrote them (RFC 1123).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMessage {
    pub id: String,
    pub text: String,
    pub insertion_time: String,
    pub expiration_time: String,
    pub dequeue_count: u64,
}

/// A Queue service client on the shared Azurite's development account, as independent of
/// tablescan as [`RawClient`]: it signs its own requests (Queue SharedKey) and reads the XML
/// answers with a few lines of its own (hand-written: the answer is a flat list of
/// `<QueueMessage>` elements, and the oracle must share no parser with the code it checks).
#[derive(Clone)]
pub struct RawQueueClient {
    table: RawClient,
}

impl RawQueueClient {
    /// A client for the shared test Azurite's queues.
    pub fn azurite() -> RawQueueClient {
        RawQueueClient {
            table: RawClient::new(
                &super::azurite().queue_endpoint(),
                DEVELOPMENT_ACCOUNT,
                DEVELOPMENT_ACCOUNT_KEY,
            ),
        }
    }

    /// `SharedKey account:base64(HMAC-SHA256(key, "VERB\n" + 11 empty standard headers +
    /// canonical x-ms- headers + "/account/path" + "\nname:value" per query parameter, sorted))`.
    /// Never resent: a receive that got no answer may still have hidden its messages.
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<String, RawError> {
        let c = &self.table;
        let date = httpdate::fmt_http_date(SystemTime::now());
        let mut sorted: Vec<(String, &str)> = query
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), *v))
            .collect();
        sorted.sort();
        let mut string_to_sign = format!(
            "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{VERSION}\n/{}{}/{path}",
            c.account, c.base_path
        );
        for (k, v) in &sorted {
            let _ = write!(string_to_sign, "\n{k}:{v}");
        }
        let mut mac = Hmac::<Sha256>::new_from_slice(&c.key).expect("HMAC takes any key");
        mac.update(string_to_sign.as_bytes());
        let signature =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let response = c
            .http
            .get(format!("{}/{path}", c.base))
            .query(query)
            .header(
                "authorization",
                format!("SharedKey {}:{signature}", c.account),
            )
            .header("x-ms-date", &date)
            .header("x-ms-version", VERSION)
            .send()
            .await
            .map_err(no_answer)?;
        let status = response.status().as_u16();
        let body = response.text().await.map_err(no_answer)?;
        match status {
            200..=299 => Ok(body),
            _ => Err(RawError { status, body }),
        }
    }

    /// [`RawQueueClient::get`] for a request that changes nothing (a peek, a metadata read):
    /// sent again when it got no answer ([`resend`]).
    async fn read(&self, path: &str, query: &[(&str, &str)]) -> Result<String, RawError> {
        resending(&Method::GET, || self.get(path, query)).await
    }

    /// Receives up to 32 messages, hiding them for `visibility_secs`.
    pub async fn receive(
        &self,
        queue: &str,
        visibility_secs: u32,
    ) -> Result<Vec<RawMessage>, RawError> {
        let visibility = visibility_secs.to_string();
        let query = [
            ("numofmessages", "32"),
            ("visibilitytimeout", visibility.as_str()),
        ];
        let body = self.get(&format!("{queue}/messages"), &query).await?;
        Ok(parse_messages(&body))
    }

    /// Peeks at up to 32 messages (their visibility unchanged).
    pub async fn peek(&self, queue: &str) -> Result<Vec<RawMessage>, RawError> {
        let query = [("numofmessages", "32"), ("peekonly", "true")];
        let body = self.read(&format!("{queue}/messages"), &query).await?;
        Ok(parse_messages(&body))
    }

    /// Every message of the queue: receives (hiding each for 10 minutes) until a receive comes
    /// back empty, at most `bound` messages.
    pub async fn receive_all(&self, queue: &str, bound: usize) -> Vec<RawMessage> {
        let mut all = Vec::new();
        while all.len() < bound {
            let got = self
                .receive(queue, 600)
                .await
                .unwrap_or_else(|e| panic!("raw receive from {queue}: {e}"));
            if got.is_empty() {
                break;
            }
            all.extend(got);
        }
        all
    }

    /// Whether the queue exists (a metadata read).
    pub async fn exists(&self, queue: &str) -> bool {
        match self.read(queue, &[("comp", "metadata")]).await {
            Ok(_) => true,
            Err(e) if e.status == 404 => false,
            Err(e) => panic!("raw metadata of {queue}: {e}"),
        }
    }
}

/// The `<QueueMessage>` elements of a Get/Peek Messages answer.
fn parse_messages(xml: &str) -> Vec<RawMessage> {
    let element = |within: &str, name: &str| -> String {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        within
            .split_once(&open)
            .and_then(|(_, rest)| rest.split_once(&close))
            .map(|(inner, _)| xml_unescape(inner))
            .unwrap_or_default()
    };
    xml.split("<QueueMessage>")
        .skip(1)
        .map(|m| RawMessage {
            id: element(m, "MessageId"),
            text: element(m, "MessageText"),
            insertion_time: element(m, "InsertionTime"),
            expiration_time: element(m, "ExpirationTime"),
            dequeue_count: element(m, "DequeueCount").parse().unwrap_or(0),
        })
        .collect()
}

/// XML character data: the five entity references and numeric character references.
fn xml_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find(';') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let entity = &rest[at + 1..at + end];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => out.push(c),
            None => out.push_str(&rest[at..=at + end]),
        }
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}
