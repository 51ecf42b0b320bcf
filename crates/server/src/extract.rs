//! Our own extractors, so that every malformed request gets the API's error shape and a message
//! that says what to fix, instead of axum's plain-text rejections.
//!
//! - [`Json`]: the body as JSON. The content type must be JSON when one is given: a browser can
//!   send a cross-site `text/plain` or form POST without a CORS preflight, so accepting those
//!   would let any web page drive a token-less loopback server.
//! - [`OptionalJson`]: the same, where an empty body stands for `{}`.
//! - [`Query`]: the query string, unknown parameters refused.
//! - [`SessionPath`]: a `{id}` path segment parsed as a session id.
//! - [`RouteOptions`]: a POST route's options, from the query string or a JSON body.

use agenthost_model::SessionId;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ErrorType};

/// A JSON request body.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        check_content_type(req.headers())?;
        let bytes = body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::invalid(
                "the request body is empty; this route expects a JSON object",
            ));
        }
        parse(&bytes).map(Json)
    }
}

/// A JSON request body whose fields are all optional: an empty body means `T::default()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct OptionalJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        check_content_type(req.headers())?;
        let bytes = body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        parse(&bytes).map(OptionalJson)
    }
}

/// Parses a JSON body, naming what is wrong and where. Every body is a JSON object: serde would
/// also build a struct from an array of its fields in order, which no client means.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
            return Err(ApiError::invalid(
                "invalid request body: expected a JSON object (`{...}`)",
            ));
        }
        _ => {}
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::invalid(format!("malformed JSON body: {e}"))
            }
            Category::Data => ApiError::invalid(format!("invalid request body: {e}")),
        }
    })
}

fn check_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let essence = value
        .to_str()
        .ok()
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence {
        Some(mime) if mime == "application/json" || mime.ends_with("+json") => Ok(()),
        _ => Err(ApiError::new(
            ErrorType::UnsupportedMediaType,
            "request bodies must be JSON: send `Content-Type: application/json`",
        )),
    }
}

/// The longest a request body may take to arrive, whole (`Options::body_timeout`, put on every
/// request by the router): a client that trickles its body cannot hold a connection and a
/// handler forever.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub std::time::Duration);

/// Without the router's extension (a handler driven directly), the default.
const DEFAULT_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    let limit = req
        .extensions()
        .get::<BodyTimeout>()
        .map_or(DEFAULT_BODY_TIMEOUT, |t| t.0);
    let read = tokio::time::timeout(limit, Bytes::from_request(req, state));
    let Ok(read) = read.await else {
        return Err(ApiError::new(
            ErrorType::RequestTimeout,
            format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ),
        ));
    };
    read.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorType::PayloadTooLarge,
                "the request body is over the server's body limit",
            )
        } else {
            ApiError::invalid(format!("cannot read the request body: {rejection}"))
        }
    })
}

/// Query parameters; unknown ones are refused (the target types deny unknown fields).
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|rejection| {
                // axum's text is "Failed to deserialize query string: <serde's reason>".
                let text = rejection.body_text();
                let reason = text.split_once(": ").map_or(text.as_str(), |(_, r)| r);
                ApiError::invalid(format!("invalid query string: {reason}"))
            })
    }
}

/// The `{id}` segment of a session route, parsed. A path names a session or none: an id that
/// cannot be one (no `ses_` prefix, say) is `session_not_found` (404) like a well-formed id that
/// does not exist, with the reason in the message. Only a body that would create a session under
/// a malformed id is `invalid_request` (see ARCHITECTURE.md, "crates/server").
#[derive(Debug, Clone)]
pub struct SessionPath(pub SessionId);

/// The session a path segment names; see [`SessionPath`].
pub(crate) fn session_in_path(raw: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(raw).map_err(|e| {
        ApiError::new(
            ErrorType::SessionNotFound,
            format!("session not found: {e}"),
        )
    })
}

/// What a path segment names below a session (a message, a tool call, a schedule): an id that
/// cannot be one names nothing, `not_found` (404), with the reason in the message.
pub(crate) fn id_in_path<T>(
    raw: &str,
    parse: impl FnOnce(&str) -> Result<T, agenthost_model::Error>,
) -> Result<T, ApiError> {
    parse(raw).map_err(|e| ApiError::new(ErrorType::NotFound, format!("not found: {e}")))
}

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| {
                ApiError::invalid(format!("invalid path: {}", rejection.body_text()))
            })?;
        session_in_path(&raw).map(SessionPath)
    }
}

/// A POST route's options, as query parameters or as a JSON object in the body; where both
/// name an option, the body wins. No body, an empty body and `{}` mean no options. Malformed JSON
/// and unknown options are refused (the target types deny unknown fields), so an option with a
/// typo is never silently ignored.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteOptions<T>(pub T);

impl<S, T> FromRequest<S> for RouteOptions<T>
where
    S: Send + Sync,
    T: DeserializeOwned + serde::Serialize + Send,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (mut parts, rest) = req.into_parts();
        let Query(query) = Query::<T>::from_request_parts(&mut parts, state).await?;
        let req = Request::from_parts(parts, rest);
        check_content_type(req.headers())?;
        let bytes = body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(RouteOptions(query));
        }
        let given: serde_json::Map<String, serde_json::Value> = parse(&bytes)?;
        let mut merged = match serde_json::to_value(&query) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        merged.extend(given);
        serde_json::from_value(serde_json::Value::Object(merged))
            .map(RouteOptions)
            .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
    }
}
