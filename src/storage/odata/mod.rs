//! Row filters: the subset of the Table service's OData `$filter` language a caller may give
//! (`Downloads gt 1000L and Listed eq true`), parsed into [`Expr`] and rendered back
//! canonically, so a filter is never sent as the caller wrote it: every literal is re-escaped
//! from its parsed value and every sub-expression parenthesised (see docs/filters.md).
//!
//! Accepted: comparisons `eq ne gt ge lt le` between one property and one literal (either
//! side), `and`, `or`, `not`, parentheses; literals of every EDM type the service stores:
//! strings `'…'` (`''` is a quote), Int32 `123`, Int64 `123L`, Double `1.5` / `2.5E-3`,
//! `true`/`false`, `datetime'…'` (RFC 3339 with a zone, 100 ns precision), `guid'…'`,
//! `X'…'`/`binary'…'` (hex). Everything is case-sensitive, as in the service.
//!
//! Refused, with the character position: key properties (the scan's key range sets them),
//! property-to-property comparisons and a bare property (the service needs one constant side),
//! unknown operators and functions, malformed or out-of-range literals, and filters beyond the
//! bounds: [`MAX_FILTER_CHARS`] characters, [`MAX_COMPARISONS`] comparisons (the service allows
//! 15 per `$filter`, and a work item's key range takes up to 6), [`MAX_DEPTH`] nesting levels.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::entity::{EdmType, Entity};

mod parse;
#[cfg(test)]
mod tests;

pub use parse::parse;
use parse::parse_datetime;

/// Longest filter accepted, in characters.
pub const MAX_FILTER_CHARS: usize = 2048;
/// Most comparisons in one filter: the service allows 15 per `$filter`, and the key range of a
/// work item it is combined with uses up to 6.
pub const MAX_COMPARISONS: usize = 9;
/// Deepest nesting of parentheses and `not`.
pub const MAX_DEPTH: usize = 32;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl Cmp {
    fn parse(word: &str) -> Option<Cmp> {
        Some(match word {
            "eq" => Cmp::Eq,
            "ne" => Cmp::Ne,
            "gt" => Cmp::Gt,
            "ge" => Cmp::Ge,
            "lt" => Cmp::Lt,
            "le" => Cmp::Le,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
        }
    }

    /// The operator with its sides swapped (`5 lt X` is `X gt 5`).
    fn flipped(self) -> Cmp {
        match self {
            Cmp::Gt => Cmp::Lt,
            Cmp::Ge => Cmp::Le,
            Cmp::Lt => Cmp::Gt,
            Cmp::Le => Cmp::Ge,
            other => other,
        }
    }

    fn holds(self, ordering: std::cmp::Ordering) -> bool {
        match self {
            Cmp::Eq => ordering.is_eq(),
            Cmp::Ne => ordering.is_ne(),
            Cmp::Gt => ordering.is_gt(),
            Cmp::Ge => ordering.is_ge(),
            Cmp::Lt => ordering.is_lt(),
            Cmp::Le => ordering.is_le(),
        }
    }
}

/// A literal, as its parsed value (rendered canonically by [`Literal::render`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Literal {
    String(String),
    Int32(i32),
    Int64(i64),
    /// Always finite.
    Double(f64),
    Boolean(bool),
    /// UTC, in 100 ns ticks' precision, rendered `yyyy-mm-ddThh:mm:ss[.fffffff]Z`.
    DateTime(String),
    /// Lowercase, hyphenated.
    Guid(String),
    Binary(Vec<u8>),
}

impl Literal {
    /// The literal's canonical OData text.
    pub fn render(&self) -> String {
        match self {
            Literal::String(s) => format!("'{}'", s.replace('\'', "''")),
            Literal::Int32(n) => n.to_string(),
            Literal::Int64(n) => format!("{n}L"),
            Literal::Double(x) => render_double(*x),
            Literal::Boolean(b) => b.to_string(),
            Literal::DateTime(t) => format!("datetime'{t}'"),
            Literal::Guid(g) => format!("guid'{g}'"),
            Literal::Binary(bytes) => {
                let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
                format!("X'{hex}'")
            }
        }
    }
}

/// A Double's shortest round-trip digits, always with a fraction or an exponent (so the service
/// cannot read it as an integer): `1.5`, `3.0`, `1.0E+300`.
fn render_double(x: f64) -> String {
    let abs = x.abs();
    if abs == 0.0 || (1e-5..1e15).contains(&abs) {
        let text = format!("{x}");
        return if text.contains('.') {
            text
        } else {
            format!("{text}.0")
        };
    }
    let text = format!("{x:e}");
    let (mantissa, exponent) = text.split_once('e').expect("{:e} has an exponent");
    let mantissa = if mantissa.contains('.') {
        mantissa.to_string()
    } else {
        format!("{mantissa}.0")
    };
    let exponent = exponent
        .strip_prefix('-')
        .map_or_else(|| format!("+{exponent}"), |digits| format!("-{digits}"));
    format!("{mantissa}E{exponent}")
}

/// A parsed filter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    Compare {
        property: String,
        op: Cmp,
        literal: Literal,
    },
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
}

impl Expr {
    /// The canonical text: comparisons `Name op literal`, every operand of `and`/`or`/`not`
    /// parenthesised.
    pub fn render(&self) -> String {
        match self {
            Expr::Compare {
                property,
                op,
                literal,
            } => format!("{property} {} {}", op.as_str(), literal.render()),
            Expr::And(a, b) => format!("({}) and ({})", a.render(), b.render()),
            Expr::Or(a, b) => format!("({}) or ({})", a.render(), b.render()),
            Expr::Not(a) => format!("not ({})", a.render()),
        }
    }

    /// Comparisons in the expression.
    pub fn comparisons(&self) -> usize {
        match self {
            Expr::Compare { .. } => 1,
            Expr::And(a, b) | Expr::Or(a, b) => a.comparisons() + b.comparisons(),
            Expr::Not(a) => a.comparisons(),
        }
    }

    /// Evaluates the filter on an entity, for in-memory stores (tests): a comparison is false
    /// when the property is missing or of another type than the literal; `not` negates it.
    /// (How the service treats a missing property under `not` is not verified.)
    pub fn matches(&self, entity: &Entity) -> bool {
        match self {
            Expr::Compare {
                property,
                op,
                literal,
            } => compare(entity, property, literal).is_some_and(|o| op.holds(o)),
            Expr::And(a, b) => a.matches(entity) && b.matches(entity),
            Expr::Or(a, b) => a.matches(entity) || b.matches(entity),
            Expr::Not(a) => !a.matches(entity),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

/// How a property's value compares with a literal of the same type (`None`: missing, or
/// another type).
fn compare(entity: &Entity, property: &str, literal: &Literal) -> Option<std::cmp::Ordering> {
    let properties = &entity.properties;
    let value = properties.get_value(property)?;
    let text = value.as_str();
    match (properties.edm_type(property)?, literal) {
        (EdmType::String, Literal::String(s)) => Some(text?.encode_utf16().cmp(s.encode_utf16())),
        (EdmType::Int32, Literal::Int32(n)) => Some(value.as_i64()?.cmp(&i64::from(*n))),
        (EdmType::Int64, Literal::Int64(n)) => Some(text?.parse::<i64>().ok()?.cmp(n)),
        (EdmType::Double, Literal::Double(x)) => {
            let v = match text {
                Some(t) => t.parse::<f64>().ok()?,
                None => value.as_f64()?,
            };
            v.partial_cmp(x)
        }
        (EdmType::Boolean, Literal::Boolean(b)) => Some(value.as_bool()?.cmp(b)),
        (EdmType::DateTime, Literal::DateTime(t)) => {
            Some(parse_datetime(text?).ok()?.cmp(&parse_datetime(t).ok()?))
        }
        (EdmType::Guid, Literal::Guid(g)) => Some(text?.to_ascii_lowercase().cmp(g)),
        (EdmType::Binary, Literal::Binary(bytes)) => {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(text?)
                .ok()?;
            Some(decoded.cmp(bytes))
        }
        _ => None,
    }
}

/// Why a filter is refused: the 1-based character position and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pub position: usize,
    pub message: String,
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at character {}: {}", self.position, self.message)
    }
}

impl std::error::Error for FilterError {}
