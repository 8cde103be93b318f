//! Bearer tokens. Scopes, each allowing what the ones before it do:
//! - `metrics`: `/metrics` only (a Prometheus scrape credential reads nothing else);
//! - `read`: every read, with secret key material redacted (see [`crate::redact`]);
//! - `write`: writes too (secrets still redacted in what it reads);
//! - `secrets`: secret key material shown too.
//!
//! The token file has one token per line: `<scope> <token> [<name>]` (or `<token> <scope>`);
//! blank lines and lines starting with `#` are ignored. A `#`
//! anywhere else is part of a word (a token may hold one): a comment after the fields is
//! refused, not silently cut off. The name, if
//! given, is recorded as the author of the revisions the token writes. Without tokens, every
//! request is allowed; `vxds serve` only allows that on a loopback address.
//!
//! A token may be stored hashed: `sha256:<64 hex digits>` in place of the token matches a
//! presented token whose SHA-256 is those digits (either case), so the file need not hold the
//! secret itself (`vxds token create` prints such a line). Plaintext tokens are hashed at load;
//! a presented token is hashed once and compared in constant time with every configured hash.

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::AdminState;
use crate::problem::ApiError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Metrics,
    Read,
    Write,
    Secrets,
}

impl Scope {
    fn parse(word: &str) -> Option<Self> {
        match word {
            "metrics" => Some(Scope::Metrics),
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            "secrets" => Some(Scope::Secrets),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Scope::Metrics => "metrics",
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Secrets => "secrets",
        }
    }
}

#[derive(Clone)]
struct Token {
    /// The SHA-256 of the token; the plaintext is not kept.
    digest: [u8; 32],
    scope: Scope,
    name: Option<String>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("scope", &self.scope)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The tokens the API accepts; none means authentication is off.
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    tokens: Vec<Token>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading the token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("token file line {line}: {message}")]
    Line { line: usize, message: String },
}

/// The prefix of a hashed token in the token file.
pub const SHA256_PREFIX: &str = "sha256:";

/// The SHA-256 of a token, as the lowercase hex a token file's `sha256:` entry holds.
pub fn token_sha256_hex(token: &str) -> String {
    use std::fmt::Write;
    Sha256::digest(token.as_bytes())
        .iter()
        .fold(String::with_capacity(64), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

/// The 32 bytes of a `sha256:` entry's hex digits, or why they are not a SHA-256.
fn parse_sha256_hex(hex: &str) -> Result<[u8; 32], String> {
    if let Some(bad) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!(
            "`{SHA256_PREFIX}` must be followed by 64 hex digits; found {bad:?}, not a hex digit"
        ));
    }
    if hex.len() != 64 {
        return Err(format!(
            "`{SHA256_PREFIX}` must be followed by 64 hex digits (a SHA-256); found {}",
            hex.len()
        ));
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).map_err(|e| e.to_string())?;
        *byte = u8::from_str_radix(pair, 16).map_err(|e| e.to_string())?;
    }
    Ok(digest)
}

/// Who made a request, for the revision's author.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    pub name: Option<String>,
    /// May see secret key material (a `secrets` token, or no tokens at all).
    pub sees_secrets: bool,
}

impl Tokens {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn load(path: &std::path::Path) -> Result<Self, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let scope_of = Scope::parse;
            let (scope, secret, name) = match words.as_slice() {
                [first, secret, rest @ ..]
                    if scope_of(first).is_some()
                        && rest.len() <= 1
                        && rest.iter().all(|n| !n.starts_with('#')) =>
                {
                    (
                        scope_of(first),
                        *secret,
                        rest.first().map(|n| (*n).to_owned()),
                    )
                }
                [secret, last] if scope_of(last).is_some() => (scope_of(last), *secret, None),
                _ => {
                    let hint = if words.iter().skip(1).any(|w| w.starts_with('#')) {
                        "; a `#` comment must be on a line of its own"
                    } else {
                        ""
                    };
                    return Err(TokenFileError::Line {
                        line: line_no,
                        message: format!(
                            "expected `<scope> <token> [name]`, the scope `metrics`, `read`, \
                             `write` or `secrets`{hint}"
                        ),
                    });
                }
            };
            let digest = if let Some(hex) = secret.strip_prefix(SHA256_PREFIX) {
                parse_sha256_hex(hex).map_err(|message| TokenFileError::Line {
                    line: line_no,
                    message,
                })?
            } else {
                if secret.len() < 16 {
                    return Err(TokenFileError::Line {
                        line: line_no,
                        message: "tokens must be at least 16 characters long".into(),
                    });
                }
                Sha256::digest(secret.as_bytes()).into()
            };
            tokens.push(Token {
                digest,
                scope: scope.unwrap_or(Scope::Read),
                name,
            });
        }
        Ok(Self { tokens })
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The token with this secret: its SHA-256 is compared in constant time with every
    /// configured token's, with no early exit.
    fn find(&self, presented: &str) -> Option<&Token> {
        let presented: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for token in &self.tokens {
            if bool::from(token.digest.ct_eq(&presented)) {
                found = Some(token);
            }
        }
        found
    }
}

/// The scope a request needs; `None` for the public endpoints.
pub(crate) fn required_scope(method: &Method, path: &str) -> Option<Scope> {
    match path {
        "/healthz" | "/healthz/store" | "/readyz" | "/v1/openapi.json" => None,
        "/metrics" => Some(Scope::Metrics),
        // The console's page and script hold no data; it reads the API with the operator's
        // token.
        _ if crate::ui::is_console_path(path)
            && (method == Method::GET || method == Method::HEAD) =>
        {
            None
        }
        // Resolving only reads, whatever its method.
        "/v1/resolve" | "/v1/impact" => Some(Scope::Read),
        _ if method == Method::GET || method == Method::HEAD => Some(Scope::Read),
        _ => Some(Scope::Write),
    }
}

/// The token of `Bearer <token>`; the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The middleware: checks the bearer token against the scope the route needs.
pub async fn authorize(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(needed) = required_scope(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    if state.tokens.is_empty() {
        request.extensions_mut().insert(Caller {
            name: None,
            sees_secrets: true,
        });
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let Some(presented) = presented else {
        return ApiError::Unauthorized(
            "this endpoint needs `Authorization: Bearer <token>`".into(),
        )
        .into_response();
    };
    let Some(token) = state.tokens.find(presented) else {
        return ApiError::Unauthorized("the bearer token is not valid".into()).into_response();
    };
    if token.scope < needed {
        return ApiError::Forbidden(format!(
            "this token's scope is `{}`; this needs `{}`",
            token.scope.as_str(),
            needed.as_str()
        ))
        .into_response();
    }
    let sees_secrets = token.scope >= Scope::Secrets;
    request.extensions_mut().insert(Caller {
        name: token.name.clone(),
        sees_secrets,
    });
    let response = next.run(request).await;
    if sees_secrets {
        response
    } else {
        crate::redact::redact_response(response).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_token_files() {
        let tokens = Tokens::parse(
            "# operators\nwrite 0123456789abcdef-write alice\n\nread 0123456789abcdef-read\n0123456789abcdef-other read\n  # indented comment\nwrite 0123456789#abcdef-hash\n",
        )
        .unwrap();
        assert_eq!(tokens.len(), 4);
        // `#` inside a token is part of it, not a comment that cuts it short.
        assert_eq!(
            tokens.find("0123456789#abcdef-hash").unwrap().scope,
            Scope::Write
        );
        assert!(tokens.find("0123456789").is_none());
        for trailing in [
            "read 0123456789abcdef-read # ci",
            "read 0123456789abcdef-read #ci",
        ] {
            let err = Tokens::parse(trailing).unwrap_err().to_string();
            assert!(err.contains("line of its own"), "{err}");
        }
        let writer = tokens.find("0123456789abcdef-write").unwrap();
        assert_eq!(
            (writer.scope, writer.name.as_deref()),
            (Scope::Write, Some("alice"))
        );
        assert_eq!(
            tokens.find("0123456789abcdef-other").unwrap().scope,
            Scope::Read
        );
        assert!(tokens.find("0123456789abcdef").is_none());
        assert!(
            Tokens::parse("admin secret-token-1234567")
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
        assert!(
            Tokens::parse("write short")
                .unwrap_err()
                .to_string()
                .contains("16 characters")
        );
        assert!(Tokens::parse("").unwrap().is_empty());
    }

    /// SHA-256 of "0123456789abcdef-hashed", computed independently (`sha256sum`).
    const HASHED_SECRET: &str = "0123456789abcdef-hashed";
    const HASHED_HEX: &str = "e324ea6132f538499ecb8c76e08fe2a0157d21655cce5dbcca8d826dcad7bdcd";

    #[test]
    fn hashed_tokens_match_their_secret() {
        assert_eq!(token_sha256_hex(HASHED_SECRET), HASHED_HEX);
        let tokens = Tokens::parse(&format!(
            "write sha256:{HASHED_HEX} ci\nread 0123456789abcdef-plain\n"
        ))
        .unwrap();
        let writer = tokens.find(HASHED_SECRET).unwrap();
        assert_eq!(
            (writer.scope, writer.name.as_deref()),
            (Scope::Write, Some("ci"))
        );
        // The hash itself is not the token, nor is the file's text.
        assert!(tokens.find(HASHED_HEX).is_none());
        assert!(tokens.find(&format!("sha256:{HASHED_HEX}")).is_none());
        assert!(tokens.find("0123456789abcdef-hashe").is_none());
        assert!(tokens.find("0123456789abcdef-hashed ").is_none());
        // Plaintext lines keep working beside hashed ones.
        assert_eq!(
            tokens.find("0123456789abcdef-plain").unwrap().scope,
            Scope::Read
        );
        // The `<token> <scope>` order takes a hash too.
        let reversed = Tokens::parse(&format!("sha256:{HASHED_HEX} read")).unwrap();
        assert_eq!(reversed.find(HASHED_SECRET).unwrap().scope, Scope::Read);
    }

    #[test]
    fn uppercase_hex_is_accepted() {
        let upper = HASHED_HEX.to_ascii_uppercase();
        assert_ne!(upper, HASHED_HEX);
        let tokens = Tokens::parse(&format!("read sha256:{upper}")).unwrap();
        assert_eq!(tokens.find(HASHED_SECRET).unwrap().scope, Scope::Read);
        assert!(tokens.find(&upper).is_none());
    }

    #[test]
    fn malformed_hashes_are_refused_with_their_line() {
        let short = &HASHED_HEX[..63];
        let long = format!("{HASHED_HEX}0");
        let not_hex = format!("{}g", &HASHED_HEX[..63]);
        for (value, why) in [
            ("", "found 0"),
            (short, "found 63"),
            (long.as_str(), "found 65"),
            (not_hex.as_str(), "'g', not a hex digit"),
            ("zz", "'z', not a hex digit"),
        ] {
            let text = format!("# ci\nread 0123456789abcdef-plain\n\nwrite sha256:{value} ci\n");
            let err = Tokens::parse(&text).unwrap_err().to_string();
            assert!(err.starts_with("token file line 4: "), "{err}");
            assert!(err.contains("64 hex digits"), "{err}");
            assert!(err.contains(why), "{value}: {err}");
        }
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc "), Some("abc"));
        assert_eq!(bearer_token("bEaReR\tabc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }

    #[test]
    fn scopes_follow_the_route() {
        assert_eq!(required_scope(&Method::GET, "/healthz"), None);
        assert_eq!(
            required_scope(&Method::GET, "/v1/resources"),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/resolve"),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&Method::PUT, "/v1/resources/route/r"),
            Some(Scope::Write)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/changesets"),
            Some(Scope::Write)
        );
        assert_eq!(
            required_scope(&Method::GET, "/metrics"),
            Some(Scope::Metrics)
        );
        assert_eq!(required_scope(&Method::GET, "/ui/console.js"), None);
        assert_eq!(required_scope(&Method::POST, "/ui/"), Some(Scope::Write));
        assert_eq!(
            required_scope(&Method::GET, "/v1/events"),
            Some(Scope::Read)
        );
    }
}
