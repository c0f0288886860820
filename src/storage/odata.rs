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

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Literal(Literal),
    Open,
    Close,
}

/// Parses and checks a filter (see the module documentation for what is accepted).
pub fn parse(text: &str) -> Result<Expr, FilterError> {
    let chars = text.chars().count();
    if chars > MAX_FILTER_CHARS {
        return Err(FilterError {
            position: MAX_FILTER_CHARS + 1,
            message: format!(
                "the filter is {chars} characters, over the {MAX_FILTER_CHARS} allowed"
            ),
        });
    }
    let tokens = tokenize(text)?;
    let mut parser = Parser {
        tokens,
        next: 0,
        end: chars + 1,
    };
    let expr = parser.or(0)?;
    if let Some((position, token)) = parser.tokens.get(parser.next) {
        return Err(FilterError {
            position: *position,
            message: format!("unexpected {} after a complete expression", describe(token)),
        });
    }
    let comparisons = expr.comparisons();
    if comparisons > MAX_COMPARISONS {
        return Err(FilterError {
            position: 1,
            message: format!("{comparisons} comparisons, over the {MAX_COMPARISONS} allowed (the service takes 15 per query, and each work item's key range uses up to 6)"),
        });
    }
    Ok(expr)
}

fn describe(token: &Token) -> String {
    match token {
        Token::Word(w) => format!("{w:?}"),
        Token::Literal(l) => format!("literal {}", l.render()),
        Token::Open => "\"(\"".into(),
        Token::Close => "\")\"".into(),
    }
}

fn err<T>(position: usize, message: impl Into<String>) -> Result<T, FilterError> {
    Err(FilterError {
        position,
        message: message.into(),
    })
}

/// Splits the text into words, literals and parentheses, each with its 1-based position.
fn tokenize(text: &str) -> Result<Vec<(usize, Token)>, FilterError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let position = i + 1;
        if c == ' ' {
            i += 1;
        } else if c == '(' || c == ')' {
            tokens.push((position, if c == '(' { Token::Open } else { Token::Close }));
            i += 1;
        } else if c == '\'' {
            let (content, next) = quoted(&chars, i)?;
            tokens.push((position, Token::Literal(Literal::String(content))));
            i = next;
        } else if c.is_ascii_digit() || c == '-' {
            let start = i;
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '.' | '+' | '-'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            tokens.push((position, Token::Literal(number(&word, position)?)));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let keyword = ["and", "or", "not"].contains(&word.as_str());
            if chars.get(i) == Some(&'(') && !keyword {
                return err(
                    position,
                    format!("functions such as {word}(…) are not supported by the Table service"),
                );
            }
            if i < chars.len() && chars[i] == '\'' {
                let (content, next) = quoted(&chars, i)?;
                tokens.push((position, Token::Literal(typed(&word, &content, position)?)));
                i = next;
            } else {
                tokens.push((position, Token::Word(word)));
            }
        } else {
            return err(
                position,
                format!("unexpected character {c:?} (only spaces separate words)"),
            );
        }
    }
    Ok(tokens)
}

/// The content of the quoted text starting at `chars[open]` (`''` is a quote) and the index
/// after its closing quote.
fn quoted(chars: &[char], open: usize) -> Result<(String, usize), FilterError> {
    let mut content = String::new();
    let mut i = open + 1;
    loop {
        match chars.get(i) {
            None => {
                return err(
                    open + 1,
                    "unterminated quoted literal (a quote inside is written '')",
                )
            }
            Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                content.push('\'');
                i += 2;
            }
            Some('\'') => return Ok((content, i + 1)),
            Some(c) => {
                content.push(*c);
                i += 1;
            }
        }
    }
}

/// A numeric literal: Int32, Int64 (`L`), or Double (with a fraction or an exponent).
fn number(word: &str, position: usize) -> Result<Literal, FilterError> {
    if let Some(digits) = word.strip_suffix(['L', 'l']) {
        return match digits.parse::<i64>() {
            Ok(n) if is_integer(digits) => Ok(Literal::Int64(n)),
            _ => err(
                position,
                format!("{word:?} is not an Int64 literal (digits, then L)"),
            ),
        };
    }
    if is_integer(word) {
        return word.parse::<i32>().map(Literal::Int32).or_else(|_| {
            err(
                position,
                format!("{word} is out of the Int32 range; write {word}L for an Int64"),
            )
        });
    }
    let decimal = word.trim_start_matches('-');
    let (mantissa, exponent) = match decimal.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (decimal, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(whole) && digits(fraction) && exponent.map_or(true, digits)) {
        return err(
            position,
            format!("{word:?} is not a number literal (123, 123L, 1.5, 1.5E+3)"),
        );
    }
    match word.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(Literal::Double(x)),
        _ => err(position, format!("{word} is out of the Double range")),
    }
}

fn is_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// A typed literal `prefix'content'`.
fn typed(prefix: &str, content: &str, position: usize) -> Result<Literal, FilterError> {
    match prefix {
        "datetime" => parse_datetime(content)
            .map(|_| Literal::DateTime(canonical_datetime(content)))
            .map_err(|m| FilterError {
                position,
                message: m,
            }),
        "guid" => uuid::Uuid::try_parse(content)
            .ok()
            .filter(|_| content.len() == 36)
            .map(|g| Literal::Guid(g.hyphenated().to_string()))
            .ok_or_else(|| FilterError {
                position,
                message: format!("guid'{content}' is not a GUID (8-4-4-4-12 hex digits)"),
            }),
        "X" | "binary" => hex(content)
            .map(Literal::Binary)
            .ok_or_else(|| FilterError {
                position,
                message: format!(
                    "{prefix}'{content}' is not binary (an even number of hex digits)"
                ),
            }),
        other => err(
            position,
            format!("unknown literal type {other:?} (datetime, guid, X, binary)"),
        ),
    }
}

fn hex(content: &str) -> Option<Vec<u8>> {
    if content.len() % 2 != 0 || !content.is_ascii() {
        return None;
    }
    (0..content.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&content[i..i + 2], 16).ok())
        .collect()
}

/// An RFC 3339 time with a zone, within 100 ns precision, as UTC.
fn parse_datetime(text: &str) -> Result<time::OffsetDateTime, String> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("datetime'{text}' is not an RFC 3339 time with a zone ({e})"))?;
    if !(1601..=9999).contains(&t.to_offset(time::UtcOffset::UTC).year()) {
        return Err(format!(
            "datetime'{text}' is outside the service's years 1601 to 9999"
        ));
    }
    if t.nanosecond() % 100 != 0 {
        return Err(format!(
            "datetime'{text}' is finer than the service's 100 ns"
        ));
    }
    Ok(t.to_offset(time::UtcOffset::UTC))
}

/// `yyyy-mm-ddThh:mm:ss[.fffffff]Z` of a time [`parse_datetime`] accepted.
fn canonical_datetime(text: &str) -> String {
    let t = parse_datetime(text).expect("checked by the caller");
    let ticks = t.nanosecond() / 100;
    let fraction = if ticks == 0 {
        String::new()
    } else {
        format!(".{ticks:07}")
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

struct Parser {
    tokens: Vec<(usize, Token)>,
    next: usize,
    /// Position just past the text (for "ended early" errors).
    end: usize,
}

impl Parser {
    fn peek_word(&self, word: &str) -> bool {
        matches!(self.tokens.get(self.next), Some((_, Token::Word(w))) if w == word)
    }

    fn position(&self) -> usize {
        self.tokens.get(self.next).map_or(self.end, |(p, _)| *p)
    }

    fn or(&mut self, depth: usize) -> Result<Expr, FilterError> {
        let mut left = self.and(depth)?;
        while self.peek_word("or") {
            self.next += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and(depth)?));
        }
        Ok(left)
    }

    fn and(&mut self, depth: usize) -> Result<Expr, FilterError> {
        let mut left = self.unary(depth)?;
        while self.peek_word("and") {
            self.next += 1;
            left = Expr::And(Box::new(left), Box::new(self.unary(depth)?));
        }
        Ok(left)
    }

    fn unary(&mut self, depth: usize) -> Result<Expr, FilterError> {
        if depth >= MAX_DEPTH {
            return err(
                self.position(),
                format!("nested more than {MAX_DEPTH} levels deep"),
            );
        }
        if self.peek_word("not") {
            self.next += 1;
            return Ok(Expr::Not(Box::new(self.unary(depth + 1)?)));
        }
        if matches!(self.tokens.get(self.next), Some((_, Token::Open))) {
            let open = self.position();
            self.next += 1;
            let inner = self.or(depth + 1)?;
            return match self.tokens.get(self.next) {
                Some((_, Token::Close)) => {
                    self.next += 1;
                    Ok(inner)
                }
                _ => err(
                    self.position(),
                    format!("expected \")\" closing the \"(\" at character {open}"),
                ),
            };
        }
        self.comparison()
    }

    fn operand(&mut self) -> Result<(usize, Token), FilterError> {
        let position = self.position();
        let token = self
            .tokens
            .get(self.next)
            .cloned()
            .ok_or_else(|| FilterError {
                position,
                message: "the filter ends where a property or a literal was expected".into(),
            })?;
        self.next += 1;
        match &token.1 {
            Token::Word(w) if w == "true" || w == "false" => {
                Ok((position, Token::Literal(Literal::Boolean(w == "true"))))
            }
            Token::Word(w)
                if ["and", "or", "not"].contains(&w.as_str()) || Cmp::parse(w).is_some() =>
            {
                err(
                    position,
                    format!("expected a property or a literal, found {w:?}"),
                )
            }
            Token::Word(w) => {
                check_property(w, position)?;
                Ok(token)
            }
            Token::Literal(_) => Ok(token),
            Token::Open | Token::Close => err(
                position,
                format!(
                    "expected a property or a literal, found {}",
                    describe(&token.1)
                ),
            ),
        }
    }

    fn comparison(&mut self) -> Result<Expr, FilterError> {
        let (left_at, left) = self.operand()?;
        let op_at = self.position();
        let op = match self.tokens.get(self.next) {
            Some((_, Token::Word(w))) => Cmp::parse(w).ok_or_else(|| FilterError {
                position: op_at,
                message: format!("unknown operator {w:?} (eq, ne, gt, ge, lt, le; lowercase)"),
            })?,
            Some((_, other)) => return err(op_at, format!("expected a comparison operator, found {}", describe(other))),
            None => return err(op_at, "the filter ends where a comparison operator was expected (a property alone is not a condition: write Listed eq true)"),
        };
        self.next += 1;
        let (right_at, right) = self.operand()?;
        match (left, right) {
            (Token::Word(property), Token::Literal(literal)) => Ok(Expr::Compare { property, op, literal }),
            (Token::Literal(literal), Token::Word(property)) => Ok(Expr::Compare { property, op: op.flipped(), literal }),
            (Token::Word(_), Token::Word(_)) => err(right_at, "one side of a comparison must be a literal (the service cannot compare two properties)"),
            _ => err(left_at, "one side of a comparison must be a property"),
        }
    }
}

/// Property names: C# identifiers up to 255 characters, not the keys.
fn check_property(name: &str, position: usize) -> Result<(), FilterError> {
    if name == "PartitionKey" || name == "RowKey" {
        return err(position, format!("{name} is a key property: the scan's key range (partitionKeyPrefix, partitionKeyLowerBound, partitionKeyUpperBound) sets it; filter covers the other properties"));
    }
    if name.chars().count() > 255 {
        return err(position, "property names have at most 255 characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .render()
    }

    #[test]
    fn renders_canonically() {
        for (given, want) in [
            (
                "Downloads gt 1000L and Listed eq true",
                "(Downloads gt 1000L) and (Listed eq true)",
            ),
            ("1000L lt Downloads", "Downloads gt 1000L"),
            ("Name eq 'it''s'", "Name eq 'it''s'"),
            ("not (A eq 1) or B ne -2", "(not (A eq 1)) or (B ne -2)"),
            (
                "A eq 1 or B eq 2 and C eq 3",
                "(A eq 1) or ((B eq 2) and (C eq 3))",
            ),
            ("((X ge 1.5))", "X ge 1.5"),
            ("X lt 3.0", "X lt 3.0"),
            ("X lt 1e300", "X lt 1.0E+300"),
            ("X lt 2.5E-7", "X lt 2.5E-7"),
            ("X lt -0.0", "X lt -0.0"),
            (
                "T ge datetime'2024-01-02T03:04:05.1234567+01:00'",
                "T ge datetime'2024-01-02T02:04:05.1234567Z'",
            ),
            (
                "T ge datetime'2024-01-02T03:04:05Z'",
                "T ge datetime'2024-01-02T03:04:05Z'",
            ),
            (
                "G eq guid'0A1B2C3D-0000-1111-2222-333344445555'",
                "G eq guid'0a1b2c3d-0000-1111-2222-333344445555'",
            ),
            ("B eq binary'0aff'", "B eq X'0AFF'"),
            ("Ünï_1 eq 'x'", "Ünï_1 eq 'x'"),
        ] {
            assert_eq!(canonical(given), want, "{given}");
            assert_eq!(canonical(want), want, "canonical text is a fixed point");
        }
    }

    #[test]
    fn refuses_with_position_and_reason() {
        for (text, position, says) in [
            ("PartitionKey eq 'a'", 1, "key property"),
            ("A eq 1 and RowKey gt 'x'", 12, "key property"),
            ("A eq B", 6, "must be a literal"),
            ("1 eq 2", 1, "must be a property"),
            ("A like 'x'", 3, "unknown operator"),
            ("A EQ 1", 3, "unknown operator"),
            ("A eq 1 AND B eq 2", 8, "unexpected"),
            ("A eq 'open", 6, "unterminated"),
            ("A eq 3000000000", 6, "Int32 range"),
            ("A eq 12x", 6, "not a number"),
            ("A eq 1.", 6, "not a number"),
            ("A eq 1e999", 6, "Double range"),
            ("A eq datetime'2024-13-01T00:00:00Z'", 6, "RFC 3339"),
            ("A eq datetime'2024-01-01T00:00:00'", 6, "RFC 3339"),
            ("A eq datetime'2024-01-01T00:00:00.123456789Z'", 6, "100 ns"),
            ("A eq guid'xyz'", 6, "not a GUID"),
            ("A eq X'abc'", 6, "not binary"),
            ("A eq time'x'", 6, "unknown literal type"),
            ("A eq datetime'1600-12-31T00:00:00Z'", 6, "1601"),
            ("startswith(A, 'x') eq true", 1, "functions"),
            ("Listed", 7, "a property alone"),
            ("(A eq 1", 8, "closing"),
            ("A eq 1)", 7, "unexpected"),
            ("A eq 1 and", 11, "ends where"),
            ("A eq 1 & B eq 2", 8, "unexpected character"),
            ("", 1, "ends where"),
        ] {
            let e = parse(text).expect_err(text);
            assert_eq!(e.position, position, "{text}: {e}");
            assert!(e.message.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn bounds_hold() {
        let nine = (0..9)
            .map(|i| format!("A{i} eq {i}"))
            .collect::<Vec<_>>()
            .join(" or ");
        assert!(parse(&nine).is_ok());
        let ten = format!("{nine} or B eq 1");
        assert!(parse(&ten).unwrap_err().message.contains("comparisons"));
        let deep = format!("{}A eq 1{}", "(".repeat(40), ")".repeat(40));
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
        let nots = format!("{}A eq 1", "not ".repeat(40));
        assert!(parse(&nots).unwrap_err().message.contains("nested"));
        let long = format!("A eq '{}'", "x".repeat(MAX_FILTER_CHARS));
        assert!(parse(&long).unwrap_err().message.contains("characters"));
    }

    #[test]
    fn evaluates_typed_values() {
        let mut e = Entity::new("p", "r");
        e.properties.insert("S", serde_json::json!("it's"));
        e.properties.insert("N", serde_json::json!("5000"));
        e.properties
            .insert("N@odata.type", serde_json::json!("Edm.Int64"));
        e.properties.insert("I", serde_json::json!(7));
        e.properties.insert("D", serde_json::json!(2.5));
        e.properties.insert("B", serde_json::json!(true));
        e.properties
            .insert("T", serde_json::json!("2024-01-02T03:04:05Z"));
        e.properties
            .insert("T@odata.type", serde_json::json!("Edm.DateTime"));
        for (filter, want) in [
            ("S eq 'it''s'", true),
            ("N gt 1000L and B eq true", true),
            ("N gt 1000", false),
            ("I le 7 and D lt 3.0", true),
            ("T ge datetime'2024-01-02T04:00:00+01:00'", true),
            ("Missing eq 1", false),
            ("not (Missing eq 1)", true),
        ] {
            assert_eq!(parse(filter).unwrap().matches(&e), want, "{filter}");
        }
    }
}
