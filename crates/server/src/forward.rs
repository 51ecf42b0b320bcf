//! In a cluster, any node answers for any session: a request for a session whose partition
//! another node holds is forwarded to that node (one hop, the caller's headers and body as they
//! came, its `Authorization` included), and the owner's answer, event streams included, is
//! streamed back as it arrives. A forwarded request carries [`FORWARDED`] and is never
//! forwarded again: when ownership moves in between, the caller gets `503` with `Retry-After`
//! and its retry finds the new owner.
//!
//! What counts as "for a session": every route under `/api/session/{id}`, and
//! `POST /api/session` with an `id` in its body. A new session without an id is created where
//! the request arrived (the runtime mints its id in a partition this node holds).

use std::sync::Arc;
use std::time::Duration;

use agenthost_model::SessionId;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Shared;
use crate::error::{ApiError, ErrorType};

/// Marks a request one node forwarded to another; its value is the forwarding node's id.
pub const FORWARDED: &str = "x-agenthost-forwarded-by";

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

/// Sends the request to the node at `base` and streams its answer back.
async fn proxy(shared: &Shared, me: &str, base: &str, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let target = format!(
        "{}{}",
        base.trim_end_matches('/'),
        parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |pq| pq.as_str())
    );
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !HOP_BY_HOP.contains(name) && name != header::CONTENT_LENGTH {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(me) = HeaderValue::from_str(me) {
        headers.insert(FORWARDED, me);
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
    let sent = forwarder
        .request(parts.method, &target)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
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
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|e| {
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
