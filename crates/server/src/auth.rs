//! Bearer-token authentication of the `/api` routes, and the refusal of cross-site browser
//! requests.
//!
//! The token is compared in constant time (`subtle`), so response timing does not reveal how
//! much of a guess was right. Only the length can differ in time, which reveals nothing useful
//! about a random token.

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::Shared;
use crate::error::{ApiError, ErrorType};

/// A bearer token. `Debug` never shows it and there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// `None` for an empty or whitespace-only token, which would protect nothing.
    pub fn new(token: impl Into<String>) -> Option<Token> {
        let token = token.into();
        if token.trim().is_empty() {
            None
        } else {
            Some(Token(token))
        }
    }

    /// Whether `candidate` is this token, compared in constant time.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(candidate).into()
    }

    /// The token itself, for a client's `Authorization` header and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token([redacted])")
    }
}

/// Middleware of the `/api` routes: with a token configured the request needs
/// `Authorization: Bearer <token>`; without one, loopback binding is the protection, so
/// requests a browser marks as cross-site (`Sec-Fetch-Site: cross-site`) are refused, which
/// keeps web pages from driving a local server.
pub(crate) async fn require(
    State(shared): State<Arc<Shared>>,
    req: Request,
    next: Next,
) -> Response {
    match check(shared.options.token.as_ref(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn check(token: Option<&Token>, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(token) = token else {
        let cross_site = headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        if cross_site {
            return Err(ApiError::new(
                ErrorType::Unauthorized,
                "cross-site browser requests are refused; configure a token to allow them",
            ));
        }
        return Ok(());
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::new(
            ErrorType::Unauthorized,
            "this server requires `Authorization: Bearer <token>`",
        ));
    };
    let bytes = value.as_bytes();
    let presented = bytes
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| bytes[7..].trim_ascii());
    match presented {
        Some(candidate) if token.matches(candidate) => Ok(()),
        Some(_) => Err(ApiError::new(
            ErrorType::Unauthorized,
            "invalid bearer token",
        )),
        None => Err(ApiError::new(
            ErrorType::Unauthorized,
            "the Authorization header must use the Bearer scheme",
        )),
    }
}

/// Middleware of every route: refuses a request whose `Host` names this server by a name it
/// does not answer to, so that a web page which rebinds its own name to this machine (DNS
/// rebinding) is refused although the browser thinks it same-origin. Answered: IP literals (a
/// page served from an address cannot rebind it), `localhost` and `*.localhost` (browsers pin
/// them to loopback), and `allowed_hosts`. A request without `Host` comes from no browser and
/// passes. Checked without a token always; with one, when `allowed_hosts` lists names.
pub(crate) async fn host(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let options = &shared.options;
    if options.token.is_some() && options.allowed_hosts.is_empty() {
        return next.run(req).await;
    }
    let named = req
        .headers()
        .get(header::HOST)
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            req.uri()
                .authority()
                .map(|a| a.as_str().as_bytes().to_vec())
        });
    match named {
        Some(host) if !host_allowed(&host, &options.allowed_hosts) => ApiError::new(
            ErrorType::Forbidden,
            "the Host of this request is not a name this server answers to (add it to \
             [server] allowed_hosts)",
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

/// Whether `host` (a `Host` header: a name or address, maybe with a port) is one this server
/// answers to: an IP literal, `localhost` or a name under it, or one of `allowed` (exact, or
/// `*.example.com` for the names under `example.com`), compared without case.
fn host_allowed(host: &[u8], allowed: &[String]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let host = host.trim();
    // `[::1]:8080`, `[::1]`, `127.0.0.1:8080`, `name:8080`, `name`.
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((v6, _)) => return v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        }
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name.is_empty() {
        return false;
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
    {
        return true;
    }
    allowed.iter().any(|pattern| {
        let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
        match pattern.strip_prefix("*.") {
            Some(domain) => name.len() > domain.len() + 1 && name.ends_with(&format!(".{domain}")),
            None => name == pattern,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(a).expect("invariant: ascii"),
            );
        }
        h
    }

    #[test]
    fn bearer_checks() {
        let token = Token::new("s3cret").expect("invariant: non-empty");
        assert!(check(Some(&token), &headers(Some("Bearer s3cret"))).is_ok());
        assert!(check(Some(&token), &headers(Some("bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cretx"),
            Some("Basic s3cret"),
            Some("Bearer"),
        ] {
            let e = check(Some(&token), &headers(bad)).expect_err("must be refused");
            assert_eq!(e.kind(), ErrorType::Unauthorized, "{bad:?}");
        }
        assert!(check(None, &headers(None)).is_ok());
        assert!(Token::new("  ").is_none());
        assert_eq!(format!("{token:?}"), "Token([redacted])");
    }

    #[test]
    fn hosts_a_rebinding_page_cannot_use_are_answered() {
        let allowed = vec!["agents.example.com".to_owned(), "*.internal".to_owned()];
        for ok in [
            "127.0.0.1",
            "127.0.0.1:4096",
            "[::1]:4096",
            "[::1]",
            "10.0.0.7:80",
            "localhost",
            "LOCALHOST:4096",
            "app.localhost:4096",
            "agents.example.com",
            "Agents.Example.com.:443",
            "node1.internal:4096",
        ] {
            assert!(host_allowed(ok.as_bytes(), &allowed), "{ok}");
        }
        for refused in [
            "attacker.example",
            "attacker.example:4096",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "example.com",
            "internal",
            "evil-agents.example.com",
            "[not-an-address]",
            "",
            ":4096",
        ] {
            assert!(!host_allowed(refused.as_bytes(), &allowed), "{refused}");
        }
        assert!(!host_allowed(&[0xff, 0xfe], &allowed));
    }

    #[test]
    fn cross_site_refused_without_token() {
        let mut h = headers(None);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(check(None, &h).is_err());
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(check(None, &h).is_ok());
    }
}
