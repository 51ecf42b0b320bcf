//! In a cluster, any node answers for any session: a request for a session whose partition
//! another node holds is forwarded to that node (one hop, the caller's headers and body as they
//! came, but never its `Authorization`), and the owner's answer, event streams included, is
//! streamed back as it arrives. A forwarded request carries [`FORWARDED`] and is never
//! forwarded again: when ownership moves in between, the caller gets `503` with `Retry-After`
//! and its retry finds the new owner.
//!
//! **Nodes authenticate each other** with the cluster's shared secret, never with the caller's
//! token (which is not sent on): the forwarding node signs the request with HMAC-SHA256 over its
//! method, path and query, the SHA-256 of its body, the time, a random nonce, its own node id and
//! the caller it authenticated ([`CALLER`]: the token's name and role). The owner accepts a
//! forwarded request only with a valid signature made within [`WINDOW`] of its own clock, and a
//! nonce it has not seen in that window, and then serves it as that caller. Without a secret a
//! node neither forwards nor accepts forwarded requests. A forwarded call has an overall
//! deadline (the longest wait plus a margin), event streams excepted.
//!
//! What counts as "for a session": every route under `/api/session/{id}`, and
//! `POST /api/session` with an `id` in its body. A new session without an id is created where
//! the request arrived (the runtime mints its id in a partition this node holds).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agenthost_model::SessionId;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use hmac::{KeyInit as _, Mac as _};
use sha2::Digest as _;

use crate::Shared;
use crate::auth::{Caller, Role};
use crate::error::{ApiError, ErrorType};

/// Marks a request one node forwarded to another; its value is the forwarding node's id.
pub const FORWARDED: &str = "x-agenthost-forwarded-by";

/// The caller the forwarding node authenticated: `<role>` or `<role>:<token name>`. Signed.
pub const CALLER: &str = "x-agenthost-caller";

/// The forwarding node's signature: `t=<unix ms>,n=<nonce>,v1=<hex HMAC-SHA256>`.
pub const SIGNATURE: &str = "x-agenthost-signature";

/// How far a signature's time may be from the receiving node's clock, either way.
pub const WINDOW: Duration = Duration::from_secs(30);

/// How much longer than the longest wait a forwarded call may take, in all.
const FORWARD_MARGIN: Duration = Duration::from_secs(30);

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The cluster's shared secret. `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

impl ClusterSecret {
    /// The shortest secret accepted, in bytes.
    pub const MIN_LEN: usize = 16;

    /// `None` for a secret shorter than [`ClusterSecret::MIN_LEN`] bytes.
    pub fn new(secret: &str) -> Option<ClusterSecret> {
        let secret = secret.trim();
        (secret.len() >= Self::MIN_LEN).then(|| ClusterSecret(Arc::from(secret.as_bytes())))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("invariant: HMAC takes a key of any length")
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret([redacted])")
    }
}

/// Nonces of forwarded requests accepted within [`WINDOW`], with when each may be forgotten.
#[derive(Debug, Default)]
pub(crate) struct Nonces {
    seen: Mutex<HashMap<u128, u64>>,
}

impl Nonces {
    /// Records `nonce`; `false` when it was seen already (a replay).
    fn fresh(&self, nonce: u128, now_ms: u64) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= 1024 && seen.len().is_power_of_two() {
            seen.retain(|_, forget| *forget > now_ms);
        }
        let forget = now_ms + 2 * WINDOW.as_millis() as u64;
        seen.insert(nonce, forget)
            .is_none_or(|until| until <= now_ms)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The signed text's fields, in order.
struct Signed<'a> {
    method: &'a str,
    target: &'a str,
    body: &'a [u8],
    time: u64,
    nonce: u128,
    node: &'a str,
    caller: &'a str,
}

impl Signed<'_> {
    fn mac(&self, secret: &ClusterSecret) -> HmacSha256 {
        let digest = sha2::Sha256::digest(self.body);
        let mut mac = secret.mac();
        for field in [
            b"agenthost-forward-v1".as_slice(),
            self.method.as_bytes(),
            self.target.as_bytes(),
            &digest,
            self.time.to_string().as_bytes(),
            format!("{:032x}", self.nonce).as_bytes(),
            self.node.as_bytes(),
            self.caller.as_bytes(),
        ] {
            // Each field with its length: no two different requests sign the same bytes.
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac
    }
}

/// The [`SIGNATURE`] of a forwarded request from node `node` on behalf of `caller` (the
/// [`CALLER`] header's value), made at `at` with a fresh nonce: what the receiving node checks
/// with [`verify`].
pub fn sign(
    secret: &ClusterSecret,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    node: &str,
    caller: &str,
    at: SystemTime,
) -> String {
    let time = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let nonce = rand::random::<u128>();
    let signed = Signed {
        method,
        target: path_and_query,
        body,
        time,
        nonce,
        node,
        caller,
    };
    let tag = hex(&signed.mac(secret).finalize().into_bytes());
    format!("t={time},n={nonce:032x},v1={tag}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn caller_header(caller: &Caller) -> String {
    match &caller.name {
        Some(name) => format!("{}:{name}", caller.role.as_str()),
        None => caller.role.as_str().to_owned(),
    }
}

fn parse_caller(text: &str) -> Option<Caller> {
    let (role, name) = match text.split_once(':') {
        Some((role, name)) => (role, Some(name.to_owned())),
        None => (text, None),
    };
    Some(Caller {
        name,
        role: Role::parse(role)?,
    })
}

/// Authenticates a request another node forwarded: its signature, made with the cluster's
/// secret within [`WINDOW`] and with a nonce not seen before, over exactly this request. Returns
/// the caller it carries and the request rebuilt around its body (read to check its digest,
/// bounded by the body limit).
pub(crate) async fn verify(
    shared: &Shared,
    request: Request,
) -> Result<(Caller, Request), ApiError> {
    let refused = |why: &str| {
        ApiError::new(
            ErrorType::Unauthorized,
            format!("a forwarded request is accepted only signed by a node of this cluster: {why}"),
        )
    };
    let Some(secret) = &shared.options.cluster_secret else {
        return Err(refused("this node has no cluster secret"));
    };
    let (parts, body) = request.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let node = header(FORWARDED).unwrap_or_default();
    let caller_text = header(CALLER).ok_or_else(|| refused("no caller"))?;
    let signature = header(SIGNATURE).ok_or_else(|| refused("no signature"))?;
    let mut fields = HashMap::new();
    for field in signature.split(',') {
        if let Some((key, value)) = field.trim().split_once('=') {
            fields.insert(key, value);
        }
    }
    let time: u64 = fields
        .get("t")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| refused("a malformed signature"))?;
    let nonce = fields
        .get("n")
        .and_then(|n| u128::from_str_radix(n, 16).ok())
        .ok_or_else(|| refused("a malformed signature"))?;
    let tag = fields
        .get("v1")
        .and_then(|v| unhex(v))
        .ok_or_else(|| refused("a malformed signature"))?;
    let now = now_ms();
    if now.abs_diff(time) > WINDOW.as_millis() as u64 {
        return Err(refused("the signature is outside its validity window"));
    }
    let body = axum::body::to_bytes(body, shared.options.body_limit)
        .await
        .map_err(|_| ApiError::new(ErrorType::PayloadTooLarge, "the body is over the limit"))?;
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let signed = Signed {
        method: parts.method.as_str(),
        target,
        body: &body,
        time,
        nonce,
        node: &node,
        caller: &caller_text,
    };
    // Constant-time comparison of the tag.
    if signed.mac(secret).verify_slice(&tag).is_err() {
        return Err(refused("the signature does not match"));
    }
    if !shared.nonces.fresh(nonce, now) {
        return Err(refused("the request was already received (a replay)"));
    }
    let caller = parse_caller(&caller_text).ok_or_else(|| refused("a malformed caller"))?;
    Ok((caller, Request::from_parts(parts, Body::from(body))))
}

/// Headers of one connection, not of the request: never passed on.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// The HTTP client that forwards, shared by every request.
pub(crate) fn client() -> Result<reqwest::Client, String> {
    agenthost_llm::client_builder()?
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .build()
        .map_err(|e| format!("cannot build the forwarding client: {e}"))
}

/// The session a path is about, when it is one of a session's routes.
fn session_in(path: &str) -> Option<SessionId> {
    let rest = path.strip_prefix("/api/session/")?;
    let id = rest.split('/').next()?;
    if id == "active" {
        return None;
    }
    SessionId::parse(id).ok()
}

fn unavailable(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The middleware: passes the request on when this node owns its session (or it is about no
/// session, or there is no cluster), forwards it otherwise.
pub(crate) async fn route(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(ownership) = shared.runtime.store().ownership() else {
        return next.run(request).await;
    };
    let (session, request) = match session_in(request.uri().path()) {
        Some(session) => (session, request),
        None if request.method() == Method::POST && request.uri().path() == "/api/session" => {
            match created_id(&shared, request).await {
                Ok((Some(session), request)) => (session, request),
                Ok((None, request)) => return next.run(request).await,
                Err(response) => return *response,
            }
        }
        None => return next.run(request).await,
    };
    if ownership.owns(&session) {
        return next.run(request).await;
    }
    if request.headers().contains_key(FORWARDED) {
        return unavailable(ApiError::new(
            ErrorType::Unavailable,
            format!("session {session} moved while the request was forwarded; retry"),
        ));
    }
    match ownership.owner(&session) {
        Some(node) => proxy(&shared, ownership.node(), &node.url, request).await,
        None => unavailable(ApiError::new(
            ErrorType::Unavailable,
            format!("no node holds session {session} right now (a takeover is under way); retry"),
        )),
    }
}

/// Reads a create request's body (bounded by the body limit) for the session id it names, and
/// rebuilds the request around it.
async fn created_id(
    shared: &Shared,
    request: Request,
) -> Result<(Option<SessionId>, Request), Box<Response>> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, shared.options.body_limit)
        .await
        .map_err(|e| {
            Box::new(
                ApiError::new(
                    ErrorType::PayloadTooLarge,
                    format!("the body could not be read within the limit: {e}"),
                )
                .into_response(),
            )
        })?;
    let id = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("id")?.as_str().map(str::to_owned))
        .and_then(|id| SessionId::parse(&id).ok());
    Ok((id, Request::from_parts(parts, Body::from(bytes))))
}

/// Sends the request to the node at `base`, signed, and streams its answer back.
async fn proxy(shared: &Shared, me: &str, base: &str, request: Request) -> Response {
    let Some(secret) = &shared.options.cluster_secret else {
        return unavailable(ApiError::new(
            ErrorType::Unavailable,
            "another node owns this session, and this node has no cluster secret to forward the \
             request with ([cluster] secret_env); send it to the owner",
        ));
    };
    let (parts, body) = request.into_parts();
    let caller = parts
        .extensions
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::anyone);
    let body = match axum::body::to_bytes(body, shared.options.body_limit).await {
        Ok(body) => body,
        Err(_) => {
            return ApiError::new(ErrorType::PayloadTooLarge, "the body is over the limit")
                .into_response();
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let target = format!("{}{path}", base.trim_end_matches('/'));
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        let ours = [FORWARDED, CALLER, SIGNATURE].contains(&name.as_str());
        if !HOP_BY_HOP.contains(name)
            && name != header::CONTENT_LENGTH
            && name != header::AUTHORIZATION
            && !ours
        {
            headers.append(name.clone(), value.clone());
        }
    }
    let caller_text = caller_header(&caller);
    let signature = sign(
        secret,
        parts.method.as_str(),
        path,
        &body,
        me,
        &caller_text,
        SystemTime::now(),
    );
    for (name, value) in [
        (FORWARDED, me),
        (CALLER, &caller_text),
        (SIGNATURE, &signature),
    ] {
        match HeaderValue::from_str(value) {
            Ok(value) => {
                headers.insert(name, value);
            }
            Err(_) => {
                return ApiError::invalid("the token's name cannot be forwarded in a header")
                    .into_response();
            }
        }
    }
    let forwarder = match &shared.forwarder {
        Ok(client) => client,
        Err(e) => {
            return unavailable(ApiError::hidden(
                ErrorType::Unavailable,
                "this node cannot reach the node that owns the session; retry",
                format!("this node cannot forward: {e}"),
            ));
        }
    };
    // The whole call within the longest wait a request may ask for plus a margin; an event
    // stream, which lasts as long as its client wants, only until its answer begins.
    let deadline = tokio::time::Instant::now() + shared.options.max_wait + FORWARD_MARGIN;
    let streaming = parts.uri.path().ends_with("/events");
    let sent = forwarder
        .request(parts.method, &target)
        .headers(headers)
        .body(body)
        .send();
    let sent = match tokio::time::timeout_at(deadline, sent).await {
        Ok(sent) => sent,
        Err(_) => {
            return unavailable(ApiError::new(
                ErrorType::Unavailable,
                "the node that owns the session did not answer in time; retry",
            ));
        }
    };
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(target_url = %target, error = %e, "forwarding failed");
            return unavailable(ApiError::hidden(
                ErrorType::Unavailable,
                "the node that owns the session did not answer; retry",
                format!("the node owning this session ({base}) did not answer: {e}"),
            ));
        }
    };
    let mut response = Response::builder().status(answer.status());
    if let Some(out) = response.headers_mut() {
        for (name, value) in answer.headers() {
            if !HOP_BY_HOP.contains(name) && name != header::CONTENT_LENGTH {
                out.append(name.clone(), value.clone());
            }
        }
    }
    let stream = answer.bytes_stream();
    let body = if streaming {
        Body::from_stream(stream)
    } else {
        use futures::StreamExt as _;
        Body::from_stream(stream.take_until(tokio::time::sleep_until(deadline)))
    };
    response.body(body).unwrap_or_else(|e| {
        ApiError::internal(format!("cannot relay the answer: {e}")).into_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_session_routes_name_a_session() {
        let id = "ses_01J0000000000000000000000A";
        assert!(session_in(&format!("/api/session/{id}")).is_some());
        assert!(session_in(&format!("/api/session/{id}/events")).is_some());
        assert!(session_in("/api/session/active").is_none());
        assert!(session_in("/api/session").is_none());
        assert!(session_in("/api/session/not-an-id/messages").is_none());
        assert!(session_in("/healthz").is_none());
    }
}
