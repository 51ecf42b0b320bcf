//! Bearer-token authentication of the `/api` routes with roles, the refusal of cross-site
//! browser requests, and the `Host` check against DNS rebinding.
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

/// What a token may do. Ordered: each role may do what the one before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `GET` routes and event streams (and `POST …/wait`, which only waits).
    Read,
    /// Also prompts, interrupts, resumes, approvals, schedules, `generate` and compaction.
    Write,
    /// Everything: also the cluster's routes, and `/metrics` when it is protected.
    Admin,
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "read" => Some(Role::Read),
            "write" => Some(Role::Write),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }

    /// The role a request needs: by its route (`path`, the route's pattern where routing matched
    /// one) and method.
    pub fn required(method: &axum::http::Method, path: &str) -> Role {
        use axum::http::Method;
        if path.starts_with("/api/cluster") || path == "/metrics" {
            return Role::Admin;
        }
        let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
            || (*method == Method::POST && path.ends_with("/wait"))
            // `/mcp`'s tools call the API with the caller's own token, where each is checked.
            || path == "/mcp";
        if reads { Role::Read } else { Role::Write }
    }
}

/// Who a request comes from, as authentication established it: the token's name (none for the
/// single `token_env` token and without tokens) and role. Handlers read it from the request's
/// extensions (an approval records the name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: Option<String>,
    pub role: Role,
}

impl Caller {
    /// A caller with every right: a server without tokens (loopback), or the single token.
    pub fn anyone() -> Caller {
        Caller {
            name: None,
            role: Role::Admin,
        }
    }
}

/// A token with its name and role.
#[derive(Debug, Clone)]
pub struct NamedToken {
    pub name: String,
    pub role: Role,
    pub token: Token,
}

/// The named tokens a server accepts, replaceable while it serves (a tokens file that changed
/// is read again). With a `Tokens` set the server requires a token even when the list is empty:
/// emptying the file locks everyone out, never opens the server.
#[derive(Debug, Default)]
pub struct Tokens {
    list: std::sync::RwLock<Arc<Vec<NamedToken>>>,
}

impl Tokens {
    pub fn new(list: Vec<NamedToken>) -> Tokens {
        let tokens = Tokens::default();
        tokens.replace(list);
        tokens
    }

    /// Replaces the list: requests from now on are checked against `list`.
    pub fn replace(&self, list: Vec<NamedToken>) {
        *self.list.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(list);
    }

    /// The names and roles of the tokens, for logs.
    pub fn names(&self) -> Vec<(String, Role)> {
        self.current()
            .iter()
            .map(|t| (t.name.clone(), t.role))
            .collect()
    }

    fn current(&self) -> Arc<Vec<NamedToken>> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The caller whose token `candidate` is. Every token is compared, in constant time each,
    /// whichever matches.
    fn find(&self, candidate: &[u8]) -> Option<Caller> {
        let mut found = None;
        for named in self.current().iter() {
            if named.token.matches(candidate) && found.is_none() {
                found = Some(Caller {
                    name: Some(named.name.clone()),
                    role: named.role,
                });
            }
        }
        found
    }
}

/// Middleware of the `/api` routes (and of `/metrics`, `/healthz` and `/mcp` where they are
/// protected): establishes the [`Caller`] and refuses a role that does not reach the route's.
/// With a token configured the request needs `Authorization: Bearer <token>`; a request another
/// node forwarded is authenticated by its signature instead ([`crate::forward::verify`]), never
/// by a token. Without tokens, loopback binding is the protection, so requests a browser marks as
/// cross-site (`Sec-Fetch-Site: cross-site`) are refused, which keeps web pages from driving a
/// local server.
pub(crate) async fn require(
    State(shared): State<Arc<Shared>>,
    req: Request,
    next: Next,
) -> Response {
    let path = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let needed = Role::required(req.method(), &path);
    let (caller, mut req) = if req.headers().contains_key(crate::forward::FORWARDED) {
        match crate::forward::verify(&shared, req).await {
            Ok(verified) => verified,
            Err(e) => return e.into_response(),
        }
    } else {
        let tokens = shared.options.tokens.as_deref();
        match check(shared.options.token.as_ref(), tokens, req.headers()) {
            Ok(caller) => (caller, req),
            Err(e) => return e.into_response(),
        }
    };
    if caller.role < needed {
        let who = caller
            .name
            .as_deref()
            .map_or_else(|| "this token".to_owned(), |n| format!("token {n:?}"));
        return ApiError::new(
            ErrorType::Forbidden,
            format!(
                "{who} has the role {}; {} {path} needs {}",
                caller.role.as_str(),
                req.method(),
                needed.as_str()
            ),
        )
        .into_response();
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

fn check(
    token: Option<&Token>,
    tokens: Option<&Tokens>,
    headers: &axum::http::HeaderMap,
) -> Result<Caller, ApiError> {
    if token.is_none() && tokens.is_none() {
        let cross_site = headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        if cross_site {
            return Err(ApiError::new(
                ErrorType::Unauthorized,
                "cross-site browser requests are refused; configure a token to allow them",
            ));
        }
        return Ok(Caller::anyone());
    }
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
    let Some(candidate) = presented else {
        return Err(ApiError::new(
            ErrorType::Unauthorized,
            "the Authorization header must use the Bearer scheme",
        ));
    };
    // Both are compared, whichever matches, so the time does not tell which kind a token is.
    let single = token.is_some_and(|t| t.matches(candidate));
    let named = tokens.and_then(|t| t.find(candidate));
    match (single, named) {
        (true, _) => Ok(Caller::anyone()),
        (false, Some(caller)) => Ok(caller),
        (false, None) => Err(ApiError::new(
            ErrorType::Unauthorized,
            "invalid bearer token",
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
    // A forward names the owner's advertised host; its signature, which no page can make, is
    // checked instead (`require`), so the nodes' names need not be listed.
    let forwarded = req.headers().contains_key(crate::forward::FORWARDED)
        && req.uri().path().starts_with("/api/");
    if forwarded || (options.token.is_some() && options.allowed_hosts.is_empty()) {
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
        assert!(check(Some(&token), None, &headers(Some("Bearer s3cret"))).is_ok());
        assert!(check(Some(&token), None, &headers(Some("bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cretx"),
            Some("Basic s3cret"),
            Some("Bearer"),
        ] {
            let e = check(Some(&token), None, &headers(bad)).expect_err("must be refused");
            assert_eq!(e.kind(), ErrorType::Unauthorized, "{bad:?}");
        }
        assert_eq!(check(None, None, &headers(None)), Ok(Caller::anyone()));
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
        assert!(check(None, None, &h).is_err());
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(check(None, None, &h).is_ok());
    }
}
