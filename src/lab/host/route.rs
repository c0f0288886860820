//! HTTP trigger route templates (`scans/{id}`, `{id:int}`, `{name?}`, `{*rest}`), the subset of
//! ASP.NET Core route templates that function.json routes use.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param {
        name: String,
        optional: bool,
        constraint: Option<String>,
    },
    CatchAll(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTemplate {
    segments: Vec<Segment>,
}

impl RouteTemplate {
    pub fn parse(template: &str) -> Result<RouteTemplate, String> {
        let t = template.trim_matches('/');
        let mut segments = Vec::new();
        let parts: Vec<&str> = if t.is_empty() {
            Vec::new()
        } else {
            t.split('/').collect()
        };
        for (i, part) in parts.iter().enumerate() {
            if part.is_empty() {
                return Err(format!("route {template:?} has an empty segment"));
            }
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                if inner.contains('{') || inner.contains('}') {
                    return Err(format!("route {template:?}: bad parameter {part:?}"));
                }
                if let Some(name) = inner.strip_prefix("**").or_else(|| inner.strip_prefix('*')) {
                    if i != parts.len() - 1 {
                        return Err(format!(
                            "route {template:?}: a catch-all parameter must be last"
                        ));
                    }
                    let name = name.split(':').next().unwrap_or_default();
                    check_param_name(name, template)?;
                    segments.push(Segment::CatchAll(name.to_string()));
                    continue;
                }
                let (mut spec, optional) = match inner.strip_suffix('?') {
                    Some(s) => (s, true),
                    None => (inner, false),
                };
                if spec.contains('=') {
                    return Err(format!(
                        "route {template:?}: default values are not supported by this host"
                    ));
                }
                let mut constraint = None;
                if let Some((n, c)) = spec.split_once(':') {
                    spec = n;
                    constraint = Some(c.to_ascii_lowercase());
                }
                check_param_name(spec, template)?;
                segments.push(Segment::Param {
                    name: spec.to_string(),
                    optional,
                    constraint,
                });
            } else if part.contains('{') || part.contains('}') {
                return Err(format!(
                    "route {template:?}: parameters must fill a whole segment in this host ({part:?})"
                ));
            } else {
                segments.push(Segment::Literal(part.to_string()));
            }
        }
        // Optional parameters may only be followed by optional ones.
        let mut seen_optional = false;
        for s in &segments {
            match s {
                Segment::Param { optional: true, .. } | Segment::CatchAll(_) => {
                    seen_optional = true
                }
                _ if seen_optional => {
                    return Err(format!(
                        "route {template:?}: an optional parameter must come last"
                    ));
                }
                _ => {}
            }
        }
        Ok(RouteTemplate { segments })
    }

    /// Number of literal segments: more specific routes are tried first.
    pub fn literal_count(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| matches!(s, Segment::Literal(_)))
            .count()
    }

    pub fn has_catch_all(&self) -> bool {
        matches!(self.segments.last(), Some(Segment::CatchAll(_)))
    }

    /// Matches percent-decoded path segments; returns route values on success.
    pub fn matches(&self, path: &[String]) -> Option<BTreeMap<String, String>> {
        let mut values = BTreeMap::new();
        let mut i = 0;
        for seg in &self.segments {
            match seg {
                Segment::Literal(l) => {
                    if !path.get(i)?.eq_ignore_ascii_case(l) {
                        return None;
                    }
                    i += 1;
                }
                Segment::Param {
                    name,
                    optional,
                    constraint,
                } => match path.get(i) {
                    Some(v) => {
                        if !constraint_ok(constraint.as_deref(), v) {
                            return None;
                        }
                        values.insert(name.clone(), v.clone());
                        i += 1;
                    }
                    None if *optional => {}
                    None => return None,
                },
                Segment::CatchAll(name) => {
                    let rest = path[i.min(path.len())..].join("/");
                    if !rest.is_empty() {
                        values.insert(name.clone(), rest);
                    }
                    i = path.len();
                }
            }
        }
        (i == path.len()).then_some(values)
    }
}

fn check_param_name(name: &str, template: &str) -> Result<(), String> {
    if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return Err(format!("route {template:?}: bad parameter name {name:?}"));
    }
    Ok(())
}

fn constraint_ok(constraint: Option<&str>, value: &str) -> bool {
    match constraint {
        None => true,
        Some("int") => value.parse::<i32>().is_ok(),
        Some("long") => value.parse::<i64>().is_ok(),
        Some("bool") => value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false"),
        Some("alpha") => !value.is_empty() && value.chars().all(|c| c.is_ascii_alphabetic()),
        Some("guid") => uuid::Uuid::parse_str(value).is_ok(),
        Some("double") | Some("decimal") | Some("float") => value.parse::<f64>().is_ok(),
        // Other ASP.NET constraints (regex, min, length, …) are not checked locally.
        Some(_) => true,
    }
}

/// Splits a request path into percent-decoded segments.
pub fn path_segments(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(p: &str) -> Vec<String> {
        path_segments(p)
    }

    #[test]
    fn matching() {
        let t = RouteTemplate::parse("scans/{id}").unwrap();
        assert_eq!(t.matches(&seg("/scans/abc")).unwrap()["id"], "abc");
        assert_eq!(t.matches(&seg("/SCANS/a%20b")).unwrap()["id"], "a b");
        assert!(t.matches(&seg("/scans")).is_none());
        assert!(t.matches(&seg("/scans/a/b")).is_none());

        let t = RouteTemplate::parse("items/{n:int}/{tail?}").unwrap();
        assert!(t.matches(&seg("items/12")).is_some());
        assert_eq!(t.matches(&seg("items/12/x")).unwrap()["tail"], "x");
        assert!(t.matches(&seg("items/abc")).is_none());

        let t = RouteTemplate::parse("{*path}").unwrap();
        assert_eq!(t.matches(&seg("/a/b/c")).unwrap()["path"], "a/b/c");
        assert!(t.matches(&seg("/")).unwrap().is_empty());

        assert!(RouteTemplate::parse("a/{x}.{y}").is_err());
        assert!(RouteTemplate::parse("{*x}/b").is_err());
        assert!(RouteTemplate::parse("{x?}/b").is_err());
        assert!(RouteTemplate::parse("a//b").is_err());
    }
}
