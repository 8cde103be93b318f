//! The compact text syntax for constraints, for operators to write and read.
//!
//! ```text
//! constraints := "" | "*" | expr
//! expr        := and ("||" and)*
//! and         := unary ("&&" unary)*
//! unary       := "!" unary | primary
//! primary     := "(" expr ")" | "*" | "exists" "(" key ")"
//!              | "all" "(" [expr ("," expr)*] ")" | "any" "(" [expr ("," expr)*] ")"
//!              | key ("=" | "==") value | key "!=" value
//!              | key ["not"] "in" "(" value ("," value)* ")"
//! key, value  := "quoted \"string\"" | bare-word      (bare: A-Z a-z 0-9 _ . - / : @ +)
//! ```
//!
//! `k != v` is `!(k = v)`, `k in (a, b)` is `k = a || k = b`; `all(..)` and `any(..)` spell AND
//! and OR of any arity (`all()` matches everything, `any()` nothing); a nested `*` is the empty
//! message. Printing chooses spellings that parse back to the identical tree, so print and
//! parse round-trip on every [`Constraint`], not only on canonical ones.

use std::fmt::{self, Write as _};

use super::{Constraint, Constraints, Limits};

/// Where parsing stopped and why. `line` and `column` count from 1, columns in characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {kind}")]
pub struct ParseError {
    /// Byte offset into the input.
    pub offset: usize,
    pub line: usize,
    pub column: usize,
    pub kind: ParseErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    #[error("expected {expected}, found {found}")]
    Expected { expected: String, found: String },
    #[error("{0}")]
    Invalid(String),
}

impl ParseError {
    fn at(input: &str, offset: usize, kind: ParseErrorKind) -> Self {
        let before = &input[..offset.min(input.len())];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        Self {
            offset,
            line,
            column,
            kind,
        }
    }

    /// What the parser expected at the error position, when that is the problem.
    pub fn expected(&self) -> Option<&str> {
        match &self.kind {
            ParseErrorKind::Expected { expected, .. } => Some(expected),
            ParseErrorKind::Invalid(_) => None,
        }
    }
}

pub(super) fn parse(input: &str, limits: &Limits) -> Result<Constraints, ParseError> {
    let mut parser = Parser {
        input,
        pos: 0,
        limits,
        nesting: 0,
        nodes: 0,
    };
    let first = parser.peek()?;
    if first.tok == Tok::End {
        return Ok(Constraints::unconstrained());
    }
    let root = parser.expr()?;
    let end = parser.peek()?;
    if end.tok != Tok::End {
        return Err(parser.expected(&end, "`&&`, `||` or end of input"));
    }
    // The parser enforced nesting and size as it went; this applies the exact rules (tree
    // depth, key and value checks) once more on the finished tree.
    Constraints::from_root(Some(root), limits).map_err(|e| {
        ParseError::at(
            input,
            0,
            ParseErrorKind::Invalid(format!("{}: {}", e.path, e.kind)),
        )
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    LParen,
    RParen,
    Comma,
    AndAnd,
    OrOr,
    Bang,
    Eq,
    NotEq,
    Star,
    Str(String),
    Word(String),
    End,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::LParen => f.write_str("`(`"),
            Tok::RParen => f.write_str("`)`"),
            Tok::Comma => f.write_str("`,`"),
            Tok::AndAnd => f.write_str("`&&`"),
            Tok::OrOr => f.write_str("`||`"),
            Tok::Bang => f.write_str("`!`"),
            Tok::Eq => f.write_str("`=`"),
            Tok::NotEq => f.write_str("`!=`"),
            Tok::Star => f.write_str("`*`"),
            Tok::Str(s) => write!(f, "string {}", Quoted(s)),
            Tok::Word(w) => write!(f, "`{w}`"),
            Tok::End => f.write_str("end of input"),
        }
    }
}

struct Token {
    tok: Tok,
    start: usize,
    end: usize,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':' | '@' | '+')
}

const KEYWORDS: [&str; 5] = ["exists", "all", "any", "in", "not"];

struct Parser<'a> {
    input: &'a str,
    pos: usize,
    limits: &'a Limits,
    nesting: usize,
    nodes: usize,
}

impl Parser<'_> {
    fn error(&self, offset: usize, kind: ParseErrorKind) -> ParseError {
        ParseError::at(self.input, offset, kind)
    }

    fn expected(&self, token: &Token, what: &str) -> ParseError {
        self.error(
            token.start,
            ParseErrorKind::Expected {
                expected: what.to_owned(),
                found: token.tok.to_string(),
            },
        )
    }

    fn invalid(&self, offset: usize, message: String) -> ParseError {
        self.error(offset, ParseErrorKind::Invalid(message))
    }

    fn peek(&self) -> Result<Token, ParseError> {
        self.lex(self.pos)
    }

    fn next(&mut self) -> Result<Token, ParseError> {
        let token = self.lex(self.pos)?;
        self.pos = token.end;
        Ok(token)
    }

    fn eat(&mut self, tok: &Tok) -> Result<bool, ParseError> {
        let token = self.peek()?;
        if token.tok == *tok {
            self.pos = token.end;
            return Ok(true);
        }
        Ok(false)
    }

    fn expect(&mut self, tok: Tok, what: &str) -> Result<Token, ParseError> {
        let token = self.next()?;
        if token.tok != tok {
            return Err(self.expected(&token, what));
        }
        Ok(token)
    }

    fn lex(&self, from: usize) -> Result<Token, ParseError> {
        let rest = &self.input[from..];
        let trimmed = rest.trim_start();
        let start = from + (rest.len() - trimmed.len());
        let mut chars = trimmed.chars();
        let Some(c) = chars.next() else {
            return Ok(Token {
                tok: Tok::End,
                start,
                end: start,
            });
        };
        let two = trimmed.get(..2).unwrap_or("");
        let (tok, len) = match (c, two) {
            (_, "&&") => (Tok::AndAnd, 2),
            (_, "||") => (Tok::OrOr, 2),
            (_, "!=") => (Tok::NotEq, 2),
            (_, "==") => (Tok::Eq, 2),
            ('(', _) => (Tok::LParen, 1),
            (')', _) => (Tok::RParen, 1),
            (',', _) => (Tok::Comma, 1),
            ('!', _) => (Tok::Bang, 1),
            ('=', _) => (Tok::Eq, 1),
            ('*', _) => (Tok::Star, 1),
            ('"', _) => return self.lex_string(start),
            (c, _) if is_word_char(c) => {
                let len = trimmed.find(|c| !is_word_char(c)).unwrap_or(trimmed.len());
                (Tok::Word(trimmed[..len].to_owned()), len)
            }
            (c, _) => {
                let found = if c == '&' || c == '|' {
                    format!("`{c}` (write `{c}{c}`)")
                } else {
                    format!("`{c}`")
                };
                return Err(self.error(
                    start,
                    ParseErrorKind::Expected {
                        expected: "a constraint or operator".into(),
                        found,
                    },
                ));
            }
        };
        Ok(Token {
            tok,
            start,
            end: start + len,
        })
    }

    fn lex_string(&self, start: usize) -> Result<Token, ParseError> {
        let body = &self.input[start + 1..];
        let mut out = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    return Ok(Token {
                        tok: Tok::Str(out),
                        start,
                        end: start + 1 + i + 1,
                    });
                }
                '\\' => {
                    let escape_at = start + 1 + i;
                    match chars.next().map(|(_, c)| c) {
                        Some('"') => out.push('"'),
                        Some('\\') => out.push('\\'),
                        Some('n') => out.push('\n'),
                        Some('r') => out.push('\r'),
                        Some('t') => out.push('\t'),
                        Some('u') => out.push(self.unicode_escape(&mut chars, escape_at)?),
                        _ => {
                            return Err(self.invalid(
                                escape_at,
                                "unknown escape; use \\\", \\\\, \\n, \\r, \\t or \\u{...}".into(),
                            ));
                        }
                    }
                }
                c => out.push(c),
            }
        }
        Err(self.invalid(start, "unterminated string: expected a closing `\"`".into()))
    }

    fn unicode_escape(
        &self,
        chars: &mut std::str::CharIndices<'_>,
        escape_at: usize,
    ) -> Result<char, ParseError> {
        let bad = || {
            self.invalid(
                escape_at,
                "expected \\u{hex digits} with a valid code point".into(),
            )
        };
        if chars.next().map(|(_, c)| c) != Some('{') {
            return Err(bad());
        }
        let mut hex = String::new();
        for (_, c) in chars.by_ref() {
            if c == '}' {
                // `from_str_radix` would also take a sign (`\u{+41}`).
                let digits =
                    (1..=6).contains(&hex.len()) && hex.chars().all(|c| c.is_ascii_hexdigit());
                return u32::from_str_radix(&hex, 16)
                    .ok()
                    .filter(|_| digits)
                    .and_then(char::from_u32)
                    .ok_or_else(bad);
            }
            hex.push(c);
        }
        Err(bad())
    }

    fn node(&mut self, at: usize, c: Constraint) -> Result<Constraint, ParseError> {
        self.nodes += 1;
        if self.nodes > self.limits.max_nodes {
            return Err(self.invalid(
                at,
                format!("constraints have more than {} nodes", self.limits.max_nodes),
            ));
        }
        Ok(c)
    }

    fn enter(&mut self, at: usize) -> Result<(), ParseError> {
        self.nesting += 1;
        if self.nesting > self.limits.max_depth {
            return Err(self.invalid(
                at,
                format!(
                    "constraints nest deeper than {} levels",
                    self.limits.max_depth
                ),
            ));
        }
        Ok(())
    }

    fn expr(&mut self) -> Result<Constraint, ParseError> {
        let start = self.peek()?.start;
        let first = self.and()?;
        if !self.eat(&Tok::OrOr)? {
            return Ok(first);
        }
        let mut children = vec![first, self.and()?];
        while self.eat(&Tok::OrOr)? {
            children.push(self.and()?);
        }
        self.node(start, Constraint::Or(children))
    }

    fn and(&mut self) -> Result<Constraint, ParseError> {
        let start = self.peek()?.start;
        let first = self.unary()?;
        if !self.eat(&Tok::AndAnd)? {
            return Ok(first);
        }
        let mut children = vec![first, self.unary()?];
        while self.eat(&Tok::AndAnd)? {
            children.push(self.unary()?);
        }
        self.node(start, Constraint::And(children))
    }

    fn unary(&mut self) -> Result<Constraint, ParseError> {
        let token = self.peek()?;
        if token.tok == Tok::Bang {
            self.pos = token.end;
            self.enter(token.start)?;
            let inner = self.unary()?;
            self.nesting -= 1;
            return self.node(token.start, Constraint::not(inner));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Constraint, ParseError> {
        let token = self.next()?;
        match token.tok {
            Tok::LParen => {
                self.enter(token.start)?;
                let inner = self.expr()?;
                self.expect(Tok::RParen, "`)`")?;
                self.nesting -= 1;
                Ok(inner)
            }
            Tok::Star => self.node(token.start, Constraint::Any),
            Tok::Word(ref w) if w == "exists" && self.peek()?.tok == Tok::LParen => {
                self.next()?;
                let key = self.key()?;
                self.expect(Tok::RParen, "`)` after the key")?;
                self.node(token.start, Constraint::Exists { key })
            }
            Tok::Word(ref w) if (w == "all" || w == "any") && self.peek()?.tok == Tok::LParen => {
                let is_all = w == "all";
                self.next()?;
                self.enter(token.start)?;
                let mut children = Vec::new();
                if !self.eat(&Tok::RParen)? {
                    loop {
                        children.push(self.expr()?);
                        if self.eat(&Tok::RParen)? {
                            break;
                        }
                        self.expect(Tok::Comma, "`,` or `)`")?;
                    }
                }
                self.nesting -= 1;
                let list = if is_all {
                    Constraint::And(children)
                } else {
                    Constraint::Or(children)
                };
                self.node(token.start, list)
            }
            Tok::Word(_) | Tok::Str(_) => {
                let key = self.check_key(token)?;
                self.comparison(key)
            }
            _ => Err(self.expected(
                &token,
                "a constraint: `key = \"value\"`, `exists(key)`, `!`, `(` or `*`",
            )),
        }
    }

    fn comparison(&mut self, (key, key_at): (String, usize)) -> Result<Constraint, ParseError> {
        let op = self.next()?;
        match op.tok {
            Tok::Eq => {
                let value = self.value()?;
                self.node(key_at, Constraint::Equals { key, value })
            }
            Tok::NotEq => {
                let value = self.value()?;
                let equals = self.node(key_at, Constraint::Equals { key, value })?;
                self.node(key_at, Constraint::not(equals))
            }
            Tok::Word(ref w) if w == "in" => self.in_list(key, key_at),
            Tok::Word(ref w) if w == "not" => {
                let in_kw = self.next()?;
                if in_kw.tok != Tok::Word("in".into()) {
                    return Err(self.expected(&in_kw, "`in` after `not`"));
                }
                let list = self.in_list(key, key_at)?;
                self.node(key_at, Constraint::not(list))
            }
            _ => Err(self.expected(&op, "`=`, `!=`, `in` or `not in` after the key")),
        }
    }

    fn in_list(&mut self, key: String, key_at: usize) -> Result<Constraint, ParseError> {
        self.expect(Tok::LParen, "`(` to start the list of values")?;
        let mut values = vec![self.value()?];
        while !self.eat(&Tok::RParen)? {
            self.expect(Tok::Comma, "`,` or `)`")?;
            values.push(self.value()?);
        }
        let mut children = Vec::with_capacity(values.len());
        for value in values {
            children.push(self.node(
                key_at,
                Constraint::Equals {
                    key: key.clone(),
                    value,
                },
            )?);
        }
        if children.len() == 1 {
            return Ok(children.remove(0));
        }
        self.node(key_at, Constraint::Or(children))
    }

    fn key(&mut self) -> Result<String, ParseError> {
        let token = self.next()?;
        match token.tok {
            Tok::Word(_) | Tok::Str(_) => Ok(self.check_key(token)?.0),
            _ => Err(self.expected(&token, "a key")),
        }
    }

    fn check_key(&self, token: Token) -> Result<(String, usize), ParseError> {
        let (Tok::Word(key) | Tok::Str(key)) = token.tok else {
            return Err(self.invalid(token.start, "expected a key".into()));
        };
        if key.is_empty() {
            return Err(self.invalid(token.start, "key must not be empty".into()));
        }
        if key.len() > self.limits.max_key_len {
            return Err(self.invalid(
                token.start,
                format!(
                    "key is {} bytes long; the limit is {}",
                    key.len(),
                    self.limits.max_key_len
                ),
            ));
        }
        if let Some(c) = key.chars().find(|c| c.is_control()) {
            return Err(self.invalid(
                token.start,
                format!("key contains the control character U+{:04X}", c as u32),
            ));
        }
        Ok((key, token.start))
    }

    fn value(&mut self) -> Result<String, ParseError> {
        let token = self.next()?;
        let value = match token.tok {
            Tok::Word(w) => w,
            Tok::Str(s) => s,
            _ => return Err(self.expected(&token, "a value (a quoted string)")),
        };
        if value.len() > self.limits.max_value_len {
            return Err(self.invalid(
                token.start,
                format!(
                    "value is {} bytes long; the limit is {}",
                    value.len(),
                    self.limits.max_value_len
                ),
            ));
        }
        if let Some(c) = value.chars().find(|c| c.is_control()) {
            return Err(self.invalid(
                token.start,
                format!("value contains the control character U+{:04X}", c as u32),
            ));
        }
        Ok(value)
    }
}

/// Where a node is printed, which decides the parentheses it needs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Top,
    And,
    Or,
    Not,
    List,
}

pub(super) fn write(c: &Constraint, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write_in(c, f, Ctx::Top)
}

fn write_in(c: &Constraint, f: &mut fmt::Formatter<'_>, ctx: Ctx) -> fmt::Result {
    match c {
        Constraint::Equals { key, value } => write!(f, "{} = {}", Key(key), Quoted(value)),
        Constraint::Exists { key } => write!(f, "exists({})", Key(key)),
        Constraint::Any => f.write_str("*"),
        Constraint::Or(children) if same_key_values(children).is_some() => {
            let (key, values) = same_key_values(children).unwrap_or_default();
            write!(f, "{} in ({})", Key(key), ValueList(&values))
        }
        Constraint::And(children) | Constraint::Or(children) if children.len() >= 2 => {
            let (op, own) = if matches!(c, Constraint::And(_)) {
                (" && ", Ctx::And)
            } else {
                (" || ", Ctx::Or)
            };
            // An AND inside an OR needs no parentheses, but reads better with them.
            let paren = matches!(ctx, Ctx::And | Ctx::Or | Ctx::Not);
            if paren {
                f.write_char('(')?;
            }
            for (i, child) in children.iter().enumerate() {
                if i > 0 {
                    f.write_str(op)?;
                }
                write_in(child, f, own)?;
            }
            if paren {
                f.write_char(')')?;
            }
            Ok(())
        }
        Constraint::And(children) | Constraint::Or(children) => {
            f.write_str(if matches!(c, Constraint::And(_)) {
                "all("
            } else {
                "any("
            })?;
            for (i, child) in children.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write_in(child, f, Ctx::List)?;
            }
            f.write_char(')')
        }
        Constraint::Not(inner) => match inner.as_ref() {
            Constraint::Equals { key, value } => write!(f, "{} != {}", Key(key), Quoted(value)),
            Constraint::Or(children) if same_key_values(children).is_some() => {
                let (key, values) = same_key_values(children).unwrap_or_default();
                write!(f, "{} not in ({})", Key(key), ValueList(&values))
            }
            inner => {
                f.write_char('!')?;
                write_in(inner, f, Ctx::Not)
            }
        },
    }
}

/// `Some((key, values))` when every child is `key = value` on one key and there are at least
/// two, which is exactly what `key in (...)` parses to.
fn same_key_values(children: &[Constraint]) -> Option<(&str, Vec<&str>)> {
    if children.len() < 2 {
        return None;
    }
    let mut key = None;
    let mut values = Vec::with_capacity(children.len());
    for child in children {
        let Constraint::Equals { key: k, value } = child else {
            return None;
        };
        if *key.get_or_insert(k.as_str()) != k.as_str() {
            return None;
        }
        values.push(value.as_str());
    }
    key.map(|k| (k, values))
}

struct Key<'a>(&'a str);

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bare =
            !self.0.is_empty() && self.0.chars().all(is_word_char) && !KEYWORDS.contains(&self.0);
        if bare {
            f.write_str(self.0)
        } else {
            Quoted(self.0).fmt(f)
        }
    }
}

struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control() => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

struct ValueList<'a, 'b>(&'a [&'b str]);

impl fmt::Display for ValueList<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, value) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            Quoted(value).fmt(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
