//! Where a request may come from: the `Host` it names and, for writes, the `Origin` a browser
//! sends.
//!
//! A web page cannot read or write the admin API of another origin, unless DNS rebinding makes
//! its own name resolve to the server (then the page is same-origin, and only `Host` still
//! tells), or it sends a simple cross-origin POST without reading the answer (then `Origin`
//! tells). So `Host` must name this server — a loopback name, the listen address or a
//! configured name — and a write whose `Origin` is another origin is refused, with tokens or
//! without. Requests without `Host` (HTTP/2 carries the authority in the URI) or without
//! `Origin` do not come from a browser page and pass.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AdminState;
use crate::problem::ApiError;

/// The hosts and origins the admin API answers to.
#[derive(Clone, Debug)]
pub struct OriginPolicy {
    hosts: Vec<HostPattern>,
    any_host: bool,
    /// Origins allowed to write besides the server's own, as `scheme://host[:port]`.
    origins: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct HostPattern {
    /// Lower case, IPv6 without brackets.
    host: String,
    /// `None` matches any port.
    port: Option<u16>,
}

/// A configured host or origin that cannot be one.
#[derive(Debug, thiserror::Error)]
pub enum OriginConfigError {
    #[error("allowed host `{0}` is not `name`, `name:port`, `[v6]:port` or `*`")]
    Host(String),
    #[error("allowed origin `{0}` is not `scheme://host[:port]`")]
    Origin(String),
}

impl Default for OriginPolicy {
    /// Loopback names only (any port), and no other origin.
    fn default() -> Self {
        Self {
            hosts: ["localhost", "127.0.0.1", "::1"]
                .into_iter()
                .map(|h| HostPattern {
                    host: h.to_owned(),
                    port: None,
                })
                .collect(),
            any_host: false,
            origins: Vec::new(),
        }
    }
}

impl OriginPolicy {
    /// The loopback names, plus `hosts` (`name`, `name:port`, `[v6]:port`; `*` for any host)
    /// and the extra `origins` that may write.
    pub fn new<H, O>(hosts: H, origins: O) -> Result<Self, OriginConfigError>
    where
        H: IntoIterator,
        H::Item: AsRef<str>,
        O: IntoIterator,
        O::Item: AsRef<str>,
    {
        let mut policy = Self::default();
        for host in hosts {
            let host = host.as_ref().trim();
            if host == "*" {
                policy.any_host = true;
                continue;
            }
            let pattern =
                HostPattern::parse(host).ok_or_else(|| OriginConfigError::Host(host.to_owned()))?;
            policy.hosts.push(pattern);
        }
        for origin in origins {
            let origin = origin.as_ref().trim();
            let normal = normal_origin(origin)
                .ok_or_else(|| OriginConfigError::Origin(origin.to_owned()))?;
            policy.origins.push(normal);
        }
        Ok(policy)
    }

    /// Also answer to this IP address, at any port (the listen address; an unspecified
    /// address such as 0.0.0.0 names no host and adds nothing).
    pub fn with_address(mut self, ip: IpAddr) -> Self {
        if !ip.is_unspecified() {
            self.hosts.push(HostPattern {
                host: ip.to_string(),
                port: None,
            });
        }
        self
    }

    fn allows_host(&self, authority: &str) -> bool {
        if self.any_host {
            return true;
        }
        let Some(given) = HostPattern::parse(authority) else {
            return false;
        };
        // Any loopback address is this machine, whatever the configuration.
        if given
            .host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        {
            return true;
        }
        self.hosts
            .iter()
            .any(|p| p.host == given.host && p.port.is_none_or(|port| Some(port) == given.port))
    }

    /// Whether `origin` may write to a server reached as `authority`.
    fn allows_origin(&self, origin: &str, authority: Option<&str>) -> bool {
        let Some(origin) = normal_origin(origin) else {
            return false;
        };
        if self.origins.contains(&origin) {
            return true;
        }
        // Same origin: the page was served by the authority the request names.
        let origin_authority = origin.split_once("://").map(|(_, a)| a);
        authority.is_some_and(|a| origin_authority == Some(a.to_ascii_lowercase().as_str()))
    }
}

impl HostPattern {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']')?;
            host.parse::<std::net::Ipv6Addr>().ok()?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':')?),
            };
            (host, port)
        } else if text.matches(':').count() > 1 {
            // An IPv6 address without brackets, so without a port.
            text.parse::<std::net::Ipv6Addr>().ok()?;
            (text, None)
        } else {
            match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        let port = match port {
            Some(p) => Some(p.parse::<u16>().ok()?),
            None => None,
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let valid = !host.is_empty()
            && (host.parse::<std::net::Ipv6Addr>().is_ok()
                || host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')));
        valid.then_some(Self { host, port })
    }
}

/// `scheme://host[:port]` in lower case, or `None` for anything else (`null` included).
fn normal_origin(text: &str) -> Option<String> {
    let lower = text.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, authority) = lower.split_once("://")?;
    let scheme_ok = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (scheme_ok && HostPattern::parse(authority).is_some()).then_some(lower)
}

/// The one value of header `name`: `Ok(None)` if absent, an error naming it if repeated or
/// not ASCII.
fn single<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_header(
            name,
            "repeated_header",
            "the header is given more than once",
        ));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::bad_header(name, "invalid_header", "the header is not ASCII"))
}

/// Whether a method can change anything (everything but GET, HEAD and OPTIONS).
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The middleware: `Host` must name this server (except on the public probes), and a write
/// must not come from another origin.
pub async fn check(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    match verdict(&state.origins, &request) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn verdict(policy: &OriginPolicy, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let authority = match single(headers, header::HOST.as_str())? {
        Some(host) => Some(host.to_owned()),
        None => request.uri().authority().map(|a| a.as_str().to_owned()),
    };
    let path = request.uri().path();
    // The console needs no token, but answers only to this server's names like the API.
    let public = crate::auth::required_scope(request.method(), path).is_none()
        && !crate::ui::is_console_path(path);
    if let Some(authority) = &authority
        && !public
        && !policy.allows_host(authority)
    {
        return Err(ApiError::MisdirectedHost(format!(
            "`{authority}` is not a name this server answers to; add it to \
             --admin-allowed-hosts if clients reach the server by it"
        )));
    }
    if is_write(request.method())
        && let Some(origin) = single(headers, header::ORIGIN.as_str())?
        && !policy.allows_origin(origin, authority.as_deref())
    {
        return Err(ApiError::CrossOrigin(format!(
            "writes from the origin `{origin}` are refused; add it to --admin-allowed-origins \
             to allow them"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let policy = OriginPolicy::new(["vxds.example", "admin.internal:9000"], [""; 0])
            .unwrap()
            .with_address("10.1.2.3".parse().unwrap());
        for ok in [
            "localhost:8080",
            "LOCALHOST",
            "127.0.0.1:1",
            "127.9.9.9",
            "[::1]:8080",
            "vxds.example",
            "vxds.example.:443",
            "admin.internal:9000",
            "10.1.2.3:8080",
        ] {
            assert!(policy.allows_host(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "admin.internal:9001",
            "admin.internal",
            "localhost.evil.example",
            "10.1.2.4",
            "",
            "a b",
        ] {
            assert!(!policy.allows_host(refused), "{refused}");
        }
        assert!(
            OriginPolicy::new(["*"], [""; 0])
                .unwrap()
                .allows_host("any.where")
        );
        assert!(OriginPolicy::new(["a b"], [""; 0]).is_err());
        assert!(OriginPolicy::new([""; 0], ["not-an-origin"]).is_err());
    }

    #[test]
    fn origins() {
        let policy = OriginPolicy::new([""; 0], ["https://Console.example/"]).unwrap();
        assert!(policy.allows_origin("http://localhost:8080", Some("localhost:8080")));
        assert!(policy.allows_origin("https://console.example", Some("localhost:8080")));
        assert!(!policy.allows_origin("http://evil.example", Some("localhost:8080")));
        assert!(!policy.allows_origin("http://localhost:8081", Some("localhost:8080")));
        assert!(!policy.allows_origin("null", Some("localhost:8080")));
        assert!(!policy.allows_origin("http://localhost:8080", None));
    }
}
