//! The one place that hides credentials in text: every log line the handler and the local host
//! write ([`log_subscriber`]), and every error message that may quote a request ([`scrub`]).
//!
//! Invariants:
//! - [`scrub`] masks, whatever the text around it, the value of every credential it recognises:
//!   `Authorization` and identity-header values in any printed form (`name: value`, `"name":
//!   "value"`, `name=value`, the Debug of a header map, pretty-printed or not), bearer tokens,
//!   SharedKey signatures, SAS `sig=`, `AccountKey=`, `SharedAccessSignature=`, client secrets and
//!   assertions, `*_token`/`*Token` fields, `*secret*`- and `password`-named fields, and any
//!   JWT-shaped token. A masked value reads `***`; what names it (the header, the scheme, the
//!   account) is kept so that a line still says what was sent.
//! - A mask never ends inside a credential: values end at a delimiter no credential contains
//!   (whitespace, quotes, `&`, `;`, `,`, brackets), a closing quote, or the end of the line.
//! - Everything the subscriber formats goes through [`scrub`] before it reaches its writer: fmt
//!   formats each event into one buffer and writes it once, and [`Scrubbing`] scrubs that buffer
//!   whole (so a value printed on the line after its name is still found).
//! - Whatever `RUST_LOG` says, the targets in [`CAPPED_TARGETS`] log at `INFO` at most: their
//!   debug and trace events print whole requests. The scrubber remains the guarantee; the cap
//!   keeps the dumps (and their cost) out.
//!
//! Hand-written patterns over `regex`: no crate we found masks credentials in free text.

use std::borrow::Cow;
use std::io::Write;
use std::sync::LazyLock;

use regex::Regex;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

/// What a masked value reads.
pub const MASK: &str = "***";

/// Targets whose `DEBUG`/`TRACE` events dump requests or credential exchanges, capped at
/// `INFO` by [`log_subscriber`] whatever `RUST_LOG` says:
/// - `azure_core`: the transport policy prints every request (`{request:#?}`) at DEBUG, and its
///   `Headers` Debug shows the `Authorization` value (it hides every other header); its HTTP
///   client prints each URL (a SAS's `sig` in the query) at DEBUG; the retry policy prints the
///   request at TRACE;
/// - `azure_storage` (and the table, queue and blob crates): the authorization policy and the
///   XML parser print at TRACE; `azure_identity`: the Azure CLI's arguments at TRACE;
/// - `reqwest`, `hyper`, `h2`: connection-level dumps (`log` records today, which our subscriber
///   does not collect; capped in case a bridge is ever added).
pub const CAPPED_TARGETS: [&str; 10] = [
    "azure_core",
    "azure_storage",
    "azure_data_tables",
    "azure_storage_queues",
    "azure_storage_blobs",
    "azure_svc_blobstorage",
    "azure_identity",
    "reqwest",
    "hyper",
    "h2",
];

/// The handler's and the local host's subscriber: `RUST_LOG` (else `default_filter`), the
/// [`CAPPED_TARGETS`] at `INFO` at most, no ANSI colours (escape codes would split what the
/// scrubber reads), each event scrubbed before it reaches `writer`.
pub fn log_subscriber<W>(writer: W, default_filter: &str) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    subscriber(filter, writer)
}

/// [`log_subscriber`] with the user's `filter` given.
fn subscriber<W>(filter: EnvFilter, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Scrubbing(writer))
        .with_ansi(false)
        .with_target(false)
        .finish()
        .with(capped_targets())
}

/// Every target at any level, but the [`CAPPED_TARGETS`] at `INFO` at most. A filter of its own,
/// so no `RUST_LOG` directive (however specific its target) can lift the cap. Targets match as
/// prefixes, so `hyper` would take `hyper_util` too: its connection pool's events (addresses,
/// never headers) stay at any level.
fn capped_targets() -> Targets {
    CAPPED_TARGETS
        .iter()
        .fold(
            Targets::new().with_default(LevelFilter::TRACE),
            |t, name| t.with_target(*name, LevelFilter::INFO),
        )
        .with_target("hyper_util", LevelFilter::TRACE)
}

/// A [`MakeWriter`] whose writers hold what they are given and write it scrubbed, at once, when
/// flushed or dropped (fmt writes each event whole, then drops the writer).
#[derive(Debug, Clone)]
pub struct Scrubbing<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Scrubbing<M> {
    type Writer = ScrubbingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbingWriter::new(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        ScrubbingWriter::new(self.0.make_writer_for(meta))
    }
}

/// See [`Scrubbing`].
pub struct ScrubbingWriter<W: Write> {
    inner: W,
    held: Vec<u8>,
}

impl<W: Write> ScrubbingWriter<W> {
    fn new(inner: W) -> Self {
        ScrubbingWriter {
            inner,
            held: Vec::new(),
        }
    }

    fn write_held(&mut self) -> std::io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.held);
        let result = self.inner.write_all(scrub(&text).as_bytes());
        self.held.clear();
        result
    }
}

impl<W: Write> Write for ScrubbingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.held.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.write_held()?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for ScrubbingWriter<W> {
    fn drop(&mut self) {
        // Losing a log line must not fail (or panic) anything.
        let _ = self.write_held();
    }
}

/// A name whose value is a credential, its separator (quotes, `)` of a Debug `HeaderName(..)`,
/// `:` or `=`, a wrapper such as `HeaderValue(`, `Some(`, `b`), and the value's opening quote.
static KEYED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)(?P<key>[a-z0-9_.\-]*(?:authorization|identity[_-]?header|secret|password|passwd|access_?token|refresh_?token|id_?token|sas_?token|federated_?token|assertion|account_?key|sharedaccesssignature))(?P<sep>(?:\\?["'])?\s*,?\s*\)?\s*[:=]\s*(?:[a-z]+\(\s*){0,2}b?)(?P<quote>\\?["'])?"#,
    )
    .expect("valid pattern")
});
/// `Bearer <token>`.
static BEARER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)bearer\s+(?P<value>[A-Za-z0-9\-._~+/%]+=*)").expect("valid pattern")
});
/// `SharedKey <account>:<signature>` and `SharedKeyLite`.
static SHARED_KEY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)sharedkey(?:lite)?\s+[^\s:"'<>]*:(?P<value>[A-Za-z0-9+/=%]+)"#)
        .expect("valid pattern")
});
/// A SAS signature in a query (also percent-encoded, as in a URL quoted inside another).
static SAS_SIG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)sig(?:=|%3D)(?P<value>[^&\s"'<>;,)\]}]+)"#).expect("valid pattern")
});
/// Anything shaped like a JWT (base64 of a JSON object, a dot, more base64).
static JWT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?P<value>eyJ[A-Za-z0-9_\-+/=]+\.[A-Za-z0-9_\-+/=]+(?:\.[A-Za-z0-9_\-+/=]*)?)")
        .expect("valid pattern")
});

/// `text` with every credential it holds masked (see the module's invariants).
pub fn scrub(text: &str) -> String {
    let mut out = mask_keyed(text);
    for (pattern, keep) in [
        (&*BEARER, bearer_is_prose as fn(&str) -> bool),
        (&*SHARED_KEY, never),
        (&*SAS_SIG, never),
        (&*JWT, never),
    ] {
        if let Cow::Owned(masked) = mask_group(pattern, &out, keep) {
            out = masked;
        }
    }
    out
}

fn never(_: &str) -> bool {
    false
}

/// Whether what follows "bearer" is a word of prose ("bearer token"), not a token: tokens are
/// long, or hold digits or punctuation.
fn bearer_is_prose(value: &str) -> bool {
    value.len() < 16 && value.chars().all(|c| c.is_ascii_alphabetic()) && !value.starts_with("eyJ")
}

/// Masks the `value` group of every match of `pattern` (unless `keep` says it is not a secret).
fn mask_group<'t>(pattern: &Regex, text: &'t str, keep: fn(&str) -> bool) -> Cow<'t, str> {
    let mut out = String::new();
    let mut copied = 0;
    for caps in pattern.captures_iter(text) {
        let value = caps.name("value").expect("every pattern has a value group");
        if is_placeholder(value.as_str()) || keep(value.as_str()) {
            continue;
        }
        out.push_str(&text[copied..value.start()]);
        out.push_str(MASK);
        copied = value.end();
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

/// Masks the value after each [`KEYED`] name.
fn mask_keyed(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(caps) = KEYED.captures_at(text, from) {
        let key = caps["key"].to_ascii_lowercase();
        let start = caps.get(0).expect("group 0").end();
        let quote = caps.name("quote").map(|q| q.as_str());
        let header = key.ends_with("authorization") || key.ends_with("header");
        let end = match quote {
            Some(q) => closing_quote(text, start, q),
            None if header => line_end(text, start),
            None if key.ends_with("sharedaccesssignature") => {
                value_end(text, start, |c| c == ';' || is_delimiter(c) && c != ',')
            }
            None => value_end(text, start, |c| c == '&' || c == ';' || is_delimiter(c)),
        };
        out.push_str(&text[from..start]);
        let value = &text[start..end];
        if is_placeholder(value) {
            out.push_str(value);
        } else {
            if header {
                out.push_str(scheme(value));
            }
            out.push_str(MASK);
        }
        // A match is never empty (its name has letters): `from` moves forward every turn.
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// A value that holds nothing (`None`, `null`, empty, already masked by someone).
fn is_placeholder(value: &str) -> bool {
    let v = value.trim_matches(|c| matches!(c, '<' | '>' | '[' | ']'));
    v.is_empty()
        || [MASK, "none", "null", "redacted", "true", "false"]
            .iter()
            .any(|p| v.eq_ignore_ascii_case(p))
}

/// Characters no credential holds, which end an unquoted value.
fn is_delimiter(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '<' | '>' | ')' | ']' | '}' | '\\')
}

fn value_end(text: &str, start: usize, ends: impl Fn(char) -> bool) -> usize {
    text[start..].find(ends).map_or(text.len(), |i| start + i)
}

fn line_end(text: &str, start: usize) -> usize {
    value_end(text, start, |c| c == '\n' || c == '\r')
}

/// Where the value opened by `quote` (`"`, `'`, or an escaped `\"`) ends: before its closing
/// quote (not one escaped by a backslash), else at the end of the line.
fn closing_quote(text: &str, start: usize, quote: &str) -> usize {
    let rest = &text[start..];
    let line = line_end(text, start) - start;
    let found = if quote.len() == 2 {
        rest.find(quote)
    } else {
        let q = quote.as_bytes()[0];
        let bytes = rest.as_bytes();
        (0..bytes.len()).find(|&i| bytes[i] == q && (i == 0 || bytes[i - 1] != b'\\'))
    };
    start + found.unwrap_or(line).min(line)
}

/// The authentication scheme an `Authorization` value starts with (`Bearer `), kept unmasked.
fn scheme(value: &str) -> &str {
    let word = value
        .find(|c: char| !(c.is_ascii_alphabetic() || c == '-'))
        .unwrap_or(0);
    if word > 0 && value[word..].starts_with(' ') && !value[word..].trim_start().is_empty() {
        &value[..word + 1]
    } else {
        ""
    }
}

/// `error: source: source ...`: an error and its causes (each cause once), for I/O errors whose
/// cause is in the chain. Not scrubbed: callers pass it through [`scrub`] before it goes out.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TOKEN: &str = "eyJ0eXAiOiJKV1QifQ.eyJ1dGkiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlLWJ5dGVz";

    #[track_caller]
    fn hides(text: &str, secret: &str) -> String {
        let out = scrub(text);
        assert!(!out.contains(secret), "{secret} survives in {out:?}");
        out
    }

    #[test]
    fn authorization_values_in_every_printed_form() {
        let opaque = "0paque-t0ken_value";
        let out = hides(&format!("authorization: Bearer {opaque}\nhost: a"), opaque);
        assert_eq!(out, "authorization: Bearer ***\nhost: a");
        let out = hides(
            &format!(r#"{{"authorization": "Bearer {opaque}", "host": "a"}}"#),
            opaque,
        );
        assert_eq!(out, r#"{"authorization": "Bearer ***", "host": "a"}"#);
        let out = hides(
            &format!(r#"HeaderName("Authorization"): HeaderValue("Bearer {opaque}")"#),
            opaque,
        );
        assert_eq!(
            out,
            r#"HeaderName("Authorization"): HeaderValue("Bearer ***")"#
        );
        // azure_core's `{request:#?}`: the name and the value on lines of their own.
        let pretty = "HeaderName(\n    \"authorization\",\n): HeaderValue(\n    \"SharedKey devstoreaccount1:c2ln+/0=\",\n),";
        let out = hides(pretty, "c2ln+/0=");
        assert!(out.contains("\"SharedKey ***\""), "{out}");
        hides(
            &format!(r#"{{"authorization": b"Bearer {opaque}"}}"#),
            opaque,
        );
        hides(&format!("authorization=Bearer {opaque} other=1"), opaque);
        hides(&format!("Proxy-Authorization: Basic {opaque}"), opaque);
        hides(&format!(r#"\"authorization\":\"Bearer {opaque}\""#), opaque);
        assert_eq!(
            scrub("AuthorizationFailure: not authorized"),
            "AuthorizationFailure: not authorized"
        );
    }

    #[test]
    fn schemes_signatures_and_query_secrets() {
        assert_eq!(
            scrub(&format!("sent Bearer {TOKEN} ok")),
            "sent Bearer *** ok"
        );
        assert_eq!(
            scrub("failed to get bearer token: no storage token"),
            "failed to get bearer token: no storage token"
        );
        assert_eq!(scrub("Bearer (redacted)"), "Bearer (redacted)");
        assert_eq!(
            scrub("SharedKey devstoreaccount1:Z9+DzYh/LuJUo= and SharedKeyLite acct:abc%2B="),
            "SharedKey devstoreaccount1:*** and SharedKeyLite acct:***"
        );
        let url = "error sending request for url (https://a.table.core.windows.net/t()?sv=1&SIG=abc%2Bdef&se=2)";
        assert_eq!(
            scrub(url),
            "error sending request for url (https://a.table.core.windows.net/t()?sv=1&SIG=***&se=2)"
        );
        assert_eq!(
            scrub("next=https%3A%2F%2Fa%3Fsig%3Dabc%2B"),
            "next=https%3A%2F%2Fa%3Fsig%3D***"
        );
        assert_eq!(scrub("no secrets"), "no secrets");
        assert_eq!(scrub("sig=x"), "sig=***");
    }

    #[test]
    fn connection_strings_forms_and_json_fields() {
        let cs = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=Eby8vdM02x/K1SZFsTw==;EndpointSuffix=core.windows.net";
        assert_eq!(
            scrub(cs),
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=***;EndpointSuffix=core.windows.net"
        );
        assert_eq!(
            scrub("TableEndpoint=https://t;SharedAccessSignature=sv=1&ss=t&sig=abc%3D;X=1"),
            "TableEndpoint=https://t;SharedAccessSignature=***;X=1"
        );
        assert_eq!(
            scrub("grant_type=client_credentials&client_secret=Q8v7Q~s.e-c&client_assertion_type=urn:x&client_assertion=abc.def"),
            "grant_type=client_credentials&client_secret=***&client_assertion_type=urn:x&client_assertion=***"
        );
        assert_eq!(
            scrub(
                r#"{"token_type":"Bearer","access_token":"opaque123","refresh_token": "r3fresh","expires_in":3599}"#
            ),
            r#"{"token_type":"Bearer","access_token":"***","refresh_token": "***","expires_in":3599}"#
        );
        assert_eq!(
            scrub(r#"{"accessToken": "opaque123"}"#),
            r#"{"accessToken": "***"}"#
        );
        assert_eq!(
            scrub("x-identity-header: aWRlbnRpdHk\nmetadata: true"),
            "x-identity-header: ***\nmetadata: true"
        );
        assert_eq!(
            scrub(r#"{"X-IDENTITY-HEADER": "aWRlbnRpdHk"}"#),
            r#"{"X-IDENTITY-HEADER": "***"}"#
        );
        assert_eq!(scrub("IDENTITY_HEADER=aWRlbnRpdHk"), "IDENTITY_HEADER=***");
        assert_eq!(
            scrub("Sp__clientSecret=abc Dst__clientSecret: \"def\""),
            "Sp__clientSecret=*** Dst__clientSecret: \"***\""
        );
        assert_eq!(
            scrub("client_secret: Secret(<REDACTED>)"),
            "client_secret: Secret(<REDACTED>)"
        );
        assert_eq!(
            scrub("password: None, username: \"\""),
            "password: None, username: \"\""
        );
        assert_eq!(
            scrub("check Sp__tenantId, Sp__clientId and Sp__clientSecret; Invalid client secret provided."),
            "check Sp__tenantId, Sp__clientId and Sp__clientSecret; Invalid client secret provided."
        );
    }

    #[test]
    fn jwt_shaped_tokens_anywhere() {
        assert_eq!(scrub(&format!("token={TOKEN}&x")), "token=***&x");
        assert_eq!(scrub(&format!("a{TOKEN}b")), "a***");
        // Base64 JSON without a dot (a queue message) is not a token.
        assert_eq!(scrub("eyJzY2FuIjoiMSJ9"), "eyJzY2FuIjoiMSJ9");
    }

    #[test]
    fn the_writer_scrubs_each_event_whole() {
        let mut sink = Vec::new();
        {
            let mut writer = ScrubbingWriter::new(&mut sink);
            writer.write_all(b"authorization: Bea").unwrap();
            writer
                .write_all(format!("rer {TOKEN}\n").as_bytes())
                .unwrap();
        }
        assert_eq!(
            String::from_utf8(sink).unwrap(),
            "authorization: Bearer ***\n"
        );
    }

    /// Captures what a subscriber writes.
    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Sink {
        type Writer = Sink;
        fn make_writer(&'a self) -> Sink {
            self.clone()
        }
    }

    /// `RUST_LOG=trace` naming the request-dumping target itself: its dump is still not written,
    /// the connection pool's trace is, and a request printed by any other target (the SDK's own
    /// `Headers` Debug, pretty, which shows only the `Authorization` value) is written scrubbed.
    #[test]
    fn the_subscriber_caps_the_dumps_and_scrubs_every_event() {
        let sink = Sink::default();
        let filter = EnvFilter::new("trace,azure_core::policies::transport=trace");
        let mut headers = azure_core::headers::Headers::new();
        headers.insert("authorization", format!("Bearer {TOKEN}"));
        headers.insert("x-ms-date", "Thu, 26 Nov 2026 17:00:00 GMT");
        tracing::subscriber::with_default(subscriber(filter, sink.clone()), || {
            tracing::debug!(target: "azure_core::policies::transport", "dump {headers:?}");
            tracing::trace!(target: "hyper_util::client::legacy::pool", "checkout");
            tracing::warn!(target: "tablescan::anything", "request {headers:#?}");
        });
        let out = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        assert!(
            !out.contains("dump") && out.contains("TRACE checkout"),
            "{out}"
        );
        assert!(
            out.contains("WARN request") && out.contains("\"Bearer ***\""),
            "{out}"
        );
        assert!(!out.contains(TOKEN) && !out.contains("eyJ"), "{out}");
    }

    /// A secret (the shapes real ones have) in one of the forms it is printed in.
    fn secret_in_a_form() -> impl Strategy<Value = (String, String)> {
        let b64 = "[A-Za-z0-9+/]{40,88}={0,2}";
        let b64url = "[A-Za-z0-9_-]{20,60}";
        let pct = "([A-Za-z0-9]|%2B|%2F){30,60}%3D";
        let forms: Vec<(&str, &str)> = vec![
            ("authorization: Bearer {}", b64url),
            ("\"authorization\": \"Bearer {}\"", b64url),
            ("HeaderName(\n  \"authorization\",\n): HeaderValue(\n  \"SharedKey devstoreaccount1:{}\",\n)", b64),
            ("Authorization: b\"Bearer {}\"", b64url),
            (" Bearer {}", b64url),
            ("SharedKey acct:{}", b64),
            ("SharedKeyLite acct:{}", b64),
            ("?sv=2020-08-04&sig={}&se=1", pct),
            ("AccountKey={};", b64),
            ("SharedAccessSignature=sv=1&sig={}", pct),
            ("client_secret={}&", b64url),
            ("client_assertion={}&", b64url),
            ("\"access_token\":\"{}\"", b64url),
            ("\"refresh_token\": \"{}\"", b64url),
            ("x-identity-header: {}", b64url),
            ("\"X-IDENTITY-HEADER\": \"{}\"", b64url),
            ("clientSecret = '{}'", b64url),
            ("eyJhbGciOiJIUzI1NiJ9.{}.c2ln", b64url),
        ];
        prop::sample::select(forms).prop_flat_map(|(form, shape)| {
            shape.prop_map(move |secret| (form.replace("{}", &secret), secret))
        })
    }

    proptest! {
        #[test]
        fn a_secret_never_survives_whatever_surrounds_it(
            before in "(\\PC|\n){0,40}",
            (form, secret) in secret_in_a_form(),
            after in "(\\PC|\n){0,40}",
        ) {
            let text = format!("{before}{form}{after}");
            let out = scrub(&text);
            prop_assert!(!out.contains(&secret), "{secret} survives in {out:?}");
        }

        #[test]
        fn text_without_secrets_is_left_alone(text in "[a-z ,.:0-9]{0,80}") {
            prop_assert_eq!(scrub(&text), text);
        }
    }
}
