//! The filter parser: characters to tokens to [`Expr`], with the bounds and refusals of the
//! module documentation.

use super::{Cmp, Expr, FilterError, Literal, MAX_COMPARISONS, MAX_DEPTH, MAX_FILTER_CHARS};

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
pub(super) fn parse_datetime(text: &str) -> Result<time::OffsetDateTime, String> {
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
