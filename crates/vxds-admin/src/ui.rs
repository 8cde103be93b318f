//! The web console at `/ui`: one HTML page, a stylesheet and a dependency-free script, embedded
//! in the binary (`include_str!`), so the binary needs no JavaScript build.
//!
//! The page itself holds no data and needs no token; everything it shows it reads from the
//! admin API with the operator's bearer token. The token is typed into the page, kept in the
//! tab's `sessionStorage` (gone when the tab closes, never sent unless the script sends it)
//! and sent as `Authorization: Bearer` on every `fetch` — the event stream included, which is
//! read with `fetch` and a stream reader because `EventSource` cannot send headers. No cookie
//! is involved, so no request carries credentials a cross-site page could trigger, and the
//! token never appears in a URL (logs, history, `Referer`). Writes (restore) are same-origin
//! `fetch`es, which `origin::check` allows as it allows any same-origin write.
//!
//! The responses forbid framing (a restore button must not be clickjacked) and allow only the
//! page's own script, style and connections.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/console.js");
const STYLE: &str = include_str!("ui/console.css");

/// Where the console is served.
pub const PREFIX: &str = "/ui";

/// Whether `path` is one of the console's files (served without a token).
pub fn is_console_path(path: &str) -> bool {
    path == PREFIX
        || path
            .strip_prefix(PREFIX)
            .is_some_and(|rest| rest.starts_with('/'))
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary may bring a new script: always revalidate.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /ui/`: the page (every view is a `#` route inside it).
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /ui`: to `/ui/`, so that the page's relative links resolve under it.
pub async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_paths() {
        for path in ["/ui", "/ui/", "/ui/console.js"] {
            assert!(is_console_path(path), "{path}");
        }
        for path in ["/uix", "/v1/ui", "/", "/u"] {
            assert!(!is_console_path(path), "{path}");
        }
    }

    #[test]
    fn the_page_loads_only_its_own_files() {
        assert!(INDEX.contains(r#"src="console.js""#));
        assert!(INDEX.contains(r#"href="console.css""#));
        // No inline script or handler: the CSP allows none.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("onclick"));
    }
}
