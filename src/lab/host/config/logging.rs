//! host.json `logging.logLevel`: the minimum level per log category, as the host filters what
//! reaches its loggers (and so Application Insights). See `docs/custom-handler-protocol.md` §11.
//!
//! Invariant: one rule decides each category, chosen the way .NET's logging picks a filter rule
//! (`LoggerRuleSelector`): among the rules whose category matches (a case-insensitive prefix,
//! or prefix and suffix around a single `*`), the longest category wins, a later rule wins a
//! tie, and `default` (no category) applies when none matches; without `default` the level is
//! `Information`, the documented default.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::json::{read_section, Unknown};
use super::ConfigError;

/// .NET's `LogLevel`, in order: a message is kept when its level is at least the minimum.
/// Read from host.json by name, in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub enum LogLevel {
    Trace,
    Debug,
    Information,
    Warning,
    Error,
    Critical,
    /// As a minimum: nothing is logged.
    None,
}

impl LogLevel {
    const ALL: [(LogLevel, &'static str); 7] = [
        (LogLevel::Trace, "Trace"),
        (LogLevel::Debug, "Debug"),
        (LogLevel::Information, "Information"),
        (LogLevel::Warning, "Warning"),
        (LogLevel::Error, "Error"),
        (LogLevel::Critical, "Critical"),
        (LogLevel::None, "None"),
    ];

    /// Parses a level name, case-insensitively (as the host's configuration binding does).
    pub fn parse(name: &str) -> Option<LogLevel> {
        Self::ALL
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name.trim()))
            .map(|(l, _)| *l)
    }

    pub fn name(self) -> &'static str {
        Self::ALL[self as usize].1
    }
}

impl TryFrom<String> for LogLevel {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        LogLevel::parse(&name).ok_or_else(|| {
            format!("{name:?} is not a log level (Trace, Debug, Information, Warning, Error, Critical or None)")
        })
    }
}

/// One `logLevel` entry: `None` category is `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    category: Option<String>,
    level: LogLevel,
}

/// The category filter of host.json `logging.logLevel`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogFilter {
    rules: Vec<Rule>,
}

impl LogFilter {
    /// A filter from `(category, level)` pairs in file order; `"default"` is the fallback rule.
    pub fn new<'a>(entries: impl IntoIterator<Item = (&'a str, LogLevel)>) -> Self {
        LogFilter {
            rules: entries
                .into_iter()
                .map(|(category, level)| Rule {
                    category: (!category.eq_ignore_ascii_case("default"))
                        .then(|| category.to_string()),
                    level,
                })
                .collect(),
        }
    }

    /// The minimum level of `category`.
    pub fn min_level(&self, category: &str) -> LogLevel {
        let mut best: Option<&Rule> = None;
        for rule in &self.rules {
            let Some(name) = &rule.category else {
                if best.map_or(true, |b| b.category.is_none()) {
                    best = Some(rule);
                }
                continue;
            };
            if !matches(name, category) {
                continue;
            }
            let longer_or_equal = match best.and_then(|b| b.category.as_ref()) {
                Some(current) => name.len() >= current.len(),
                None => true,
            };
            if longer_or_equal {
                best = Some(rule);
            }
        }
        best.map_or(LogLevel::Information, |r| r.level)
    }

    /// Whether a message of `level` in `category` is kept.
    pub fn enabled(&self, category: &str, level: LogLevel) -> bool {
        let min = self.min_level(category);
        min != LogLevel::None && level >= min
    }
}

/// Whether rule category `rule` selects `category`: a case-insensitive prefix, or, with one
/// `*`, the part before it as a prefix and the part after it as a suffix.
fn matches(rule: &str, category: &str) -> bool {
    let (prefix, suffix) = rule.split_once('*').unwrap_or((rule, ""));
    let c = category.as_bytes();
    c.len() >= prefix.len() + suffix.len()
        && c[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
        && c[c.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

/// host.json `logging` as written; what this host does not use is ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoggingJson {
    /// Category (or `default`) to level; a map keeps its keys in sorted order.
    log_level: Option<BTreeMap<String, LogLevel>>,
}

/// `logging` of host.json `f` (absent: everything at `Information` and above).
pub(super) fn parse_logging(logging: Option<Value>, f: &Path) -> Result<LogFilter, ConfigError> {
    let Some(logging) = logging else {
        return Ok(LogFilter::default());
    };
    let logging: LoggingJson = read_section(logging, f, "logging", Unknown::Ignore)?;
    let levels = logging.log_level.unwrap_or_default();
    if let Some(category) = levels.keys().find(|c| c.matches('*').count() > 1) {
        return Err(ConfigError::new(
            f,
            format!("logging.logLevel.{category}"),
            "only one wildcard character is allowed in a category name",
        ));
    }
    Ok(LogFilter::new(levels.iter().map(|(c, l)| (c.as_str(), *l))))
}

#[cfg(test)]
mod tests {
    use super::super::host_json::HostFile;
    use super::*;
    use LogLevel::*;

    fn filter(entries: &[(&str, LogLevel)]) -> LogFilter {
        LogFilter::new(entries.iter().copied())
    }

    #[test]
    fn the_longest_matching_category_wins() {
        let f = filter(&[
            ("default", Warning),
            ("Function", Warning),
            ("Function.TableCopy.User", Information),
            ("Host.Results", Information),
        ]);
        assert_eq!(f.min_level("Function.TableCopy.User"), Information);
        assert_eq!(f.min_level("function.tablecopy.user"), Information);
        assert_eq!(f.min_level("Function.TableCopy"), Warning);
        assert_eq!(f.min_level("Function.PrefixScan.User"), Warning);
        assert_eq!(f.min_level("Host.Results"), Information);
        assert_eq!(f.min_level("Host.Function.Console"), Warning);
        // A plain prefix, not a dotted segment: "Function" also selects "FunctionX".
        assert_eq!(f.min_level("FunctionX"), Warning);
        assert!(f.enabled("Function.TableCopy", Error));
        assert!(!f.enabled("Function.TableCopy", Information));
    }

    #[test]
    fn defaults_wildcards_ties_and_none() {
        assert_eq!(LogFilter::default().min_level("Anything"), Information);
        let f = filter(&[("Function.*.User", Error), ("Function", Trace)]);
        assert_eq!(f.min_level("Function.A.User"), Error);
        assert_eq!(f.min_level("Function.A"), Trace);
        assert_eq!(f.min_level("Host.X"), Information);
        // A later rule of the same length wins.
        let f = filter(&[("Host", Error), ("host", Debug), ("Default", None)]);
        assert_eq!(f.min_level("Host.Startup"), Debug);
        assert!(!f.enabled("Other", Critical));
        assert!(!filter(&[("X", None)]).enabled("X", Critical));
    }

    #[test]
    fn parses_and_rejects() {
        let f = Path::new("host.json");
        let parse = |v: Value| {
            let host: HostFile = read_section(v, f, "", Unknown::Ignore).unwrap();
            parse_logging(host.logging, f)
        };
        let ok = parse(serde_json::json!({"Logging": {"LogLevel": {"default": "warning", "Function.X.User": "Information"}}})).unwrap();
        assert_eq!(ok.min_level("Function.X.User"), Information);
        assert_eq!(ok.min_level("Host"), Warning);
        assert_eq!(parse(serde_json::json!({})).unwrap(), LogFilter::default());
        let e = parse(serde_json::json!({"logging": {"logLevel": {"Host": "Loud"}}})).unwrap_err();
        assert_eq!(e.field, "logging.logLevel.Host");
        let e =
            parse(serde_json::json!({"logging": {"logLevel": {"a*b*c": "Error"}}})).unwrap_err();
        assert!(e.message.contains("one wildcard"), "{e}");
        let e = parse(serde_json::json!({"logging": {"logLevel": []}})).unwrap_err();
        assert_eq!(e.field, "logging.logLevel");
    }
}
