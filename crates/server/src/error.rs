//! [`ApiError`]: the one place where failures become HTTP statuses and the
//! `{"error": {"type", "message"}}` body.

use agenthost_actors::Error;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::wire::{ErrorBody, ErrorEnvelope};

pub use agenthost_api::wire::ErrorType;

/// The HTTP status of an error type.
pub fn status(kind: ErrorType) -> StatusCode {
    StatusCode::from_u16(kind.status()).expect("invariant: error types carry valid statuses")
}

/// A failed request: its type (which decides the status), a message for the client, and what
/// only the log may hold (`detail`: store, database and other nodes' text, addresses).
///
/// Every error answer carries an `x-request-id`, and the log line of the failure names it: the
/// body says what the client can act on, the log says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ApiError {
    kind: ErrorType,
    message: String,
    detail: Option<String>,
    /// With `approval_decided`: the first decision.
    decision: Option<Box<crate::wire::ApprovalDecision>>,
}

impl ApiError {
    /// An error whose message is written for the client (it names nothing internal).
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            detail: None,
            decision: None,
        }
    }

    /// An error whose cause names internals: the client gets `message`, the log gets `detail`
    /// under the request id.
    pub fn hidden(kind: ErrorType, message: impl Into<String>, detail: impl Into<String>) -> Self {
        ApiError {
            detail: Some(detail.into()),
            ..ApiError::new(kind, message)
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorType::InvalidRequest, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorType::Internal, message)
    }

    pub fn kind(&self) -> ErrorType {
        self.kind
    }

    /// What the client is told.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// What a client is told of a runtime error that is not its own doing: what happened and what
/// to do, never the text of the store, the database, a provider or another node.
fn public(error: &Error) -> Option<String> {
    Some(match error {
        Error::Unavailable(_) => {
            "the server cannot take this request right now (its store or a limit); retry shortly"
                .into()
        }
        Error::StoreUnavailable { what, .. } => (*what).to_owned(),
        Error::Provider(e) => format!(
            "the model provider failed ({}); retry later or check the provider",
            e.kind().as_str()
        ),
        Error::Halted { session, .. } => format!(
            "session {session} is halted (recovery gave up, or it failed too often); \
             `POST /api/session/{session}/resume` runs it again"
        ),
        Error::Storage(_) | Error::Panicked(_) | Error::Config(_) => "the server failed".into(),
        _ => return None,
    })
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        let kind = match &error {
            Error::SessionNotFound(_) => ErrorType::SessionNotFound,
            Error::NotFound(_) => ErrorType::NotFound,
            Error::PromptConflict { .. } => ErrorType::PromptConflict,
            Error::AlreadyDecided { decision, .. } => {
                let mut e = ApiError::new(ErrorType::ApprovalDecided, error.to_string());
                e.decision = Some(Box::new(crate::wire::ApprovalDecision::from(&**decision)));
                return e;
            }
            Error::DigestMismatch { .. } => ErrorType::DigestMismatch,
            Error::BudgetExhausted { .. } => ErrorType::BudgetExhausted,
            Error::ScheduleConflict(_) => ErrorType::ScheduleConflict,
            Error::Busy(_) => ErrorType::SessionBusy,
            Error::Invalid(_) | Error::NothingToCompact => ErrorType::InvalidRequest,
            Error::PromptTooLarge { .. } => ErrorType::PayloadTooLarge,
            Error::Provider(e) if e.kind() == agenthost_llm::ErrorKind::ContextOverflow => {
                ErrorType::ContextOverflow
            }
            Error::Provider(_) => ErrorType::ProviderError,
            Error::ContextOverflow(_) => ErrorType::ContextOverflow,
            Error::Unavailable(_)
            | Error::StoreUnavailable { .. }
            | Error::ShuttingDown
            | Error::Timeout { .. }
            | Error::ActorDied(_)
            | Error::Halted { .. }
            | Error::Interrupted => ErrorType::Unavailable,
            // A configuration the session cannot run under (its agent or model is gone) is the
            // server's problem, not the request's.
            Error::Storage(_) | Error::Panicked(_) | Error::Config(_) => ErrorType::Internal,
        };
        match public(&error) {
            Some(message) => ApiError::hidden(kind, message, error.to_string()),
            None => ApiError::new(kind, error.to_string()),
        }
    }
}

impl From<agenthost_store::Error> for ApiError {
    fn from(error: agenthost_store::Error) -> Self {
        Error::from(error).into()
    }
}

impl From<agenthost_model::Error> for ApiError {
    fn from(error: agenthost_model::Error) -> Self {
        match error {
            agenthost_model::Error::PromptTooLarge { .. } => {
                ApiError::new(ErrorType::PayloadTooLarge, error.to_string())
            }
            other => ApiError::invalid(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status(self.kind);
        // Every error answer has a request id, and the log line of the failure names it: the
        // detail (a storage error, panic text, another node's address) stays in the log.
        let id = format!("req_{}", ulid::Ulid::new());
        let detail = self.detail.as_deref().unwrap_or(&self.message);
        let code = status.as_u16();
        if self.kind == ErrorType::Internal {
            tracing::error!(request_id = %id, status = code, error = %detail, "request failed");
        } else if status.is_server_error() {
            tracing::warn!(request_id = %id, status = code, error = %detail, "request failed");
        } else {
            tracing::debug!(request_id = %id, status = code, error = %detail, "request refused");
        }
        let message = if self.kind == ErrorType::Internal {
            format!("the server failed; its log has the details under request id {id}")
        } else if self.detail.is_some() {
            format!("{} (request id {id})", self.message)
        } else {
            self.message
        };
        let request_id = Some(id);
        let body = ErrorEnvelope {
            error: ErrorBody {
                kind: self.kind,
                message,
                decision: self.decision.map(|d| *d),
            },
        };
        let mut response = crate::api::json_response(status, &body);
        let headers = response.headers_mut();
        if let Some(id) = request_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
            headers.insert("x-request-id", id);
        }
        match self.kind {
            ErrorType::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // A hint for well-behaved clients; overload and shutdown pass quickly.
            ErrorType::Unavailable => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenthost_model::{MessageId, SessionId};

    #[test]
    fn every_runtime_error_has_its_type() {
        let session = SessionId::parse("ses_x").expect("invariant: valid id");
        let cases = [
            (
                Error::SessionNotFound(session.clone()),
                404,
                "session_not_found",
            ),
            (
                Error::PromptConflict {
                    id: MessageId::parse("msg_x").expect("invariant: valid id"),
                    reason: "different prompt",
                },
                409,
                "prompt_conflict",
            ),
            (Error::Invalid("bad".into()), 400, "invalid_request"),
            (
                Error::PromptTooLarge { size: 2, limit: 1 },
                413,
                "payload_too_large",
            ),
            (Error::Config("bad".into()), 500, "internal"),
            (Error::Unavailable("busy".into()), 503, "unavailable"),
            (Error::Busy("running".into()), 409, "session_busy"),
            (Error::ShuttingDown, 503, "unavailable"),
            (Error::ActorDied(session.clone()), 503, "unavailable"),
            (
                Error::Timeout {
                    session,
                    what: "wake",
                },
                503,
                "unavailable",
            ),
            (
                Error::ContextOverflow("big".into()),
                422,
                "context_overflow",
            ),
            (
                Error::Provider(agenthost_llm::Error::new(
                    agenthost_llm::ErrorKind::RateLimit,
                    "slow down",
                )),
                502,
                "provider_error",
            ),
            (
                Error::Provider(agenthost_llm::Error::new(
                    agenthost_llm::ErrorKind::ContextOverflow,
                    "too long",
                )),
                422,
                "context_overflow",
            ),
            (Error::Storage("disk full".into()), 500, "internal"),
            (Error::Panicked("boom".into()), 500, "internal"),
        ];
        for (error, status, kind) in cases {
            let api = ApiError::from(error.clone());
            assert_eq!(api.kind().status(), status, "{error:?}");
            assert_eq!(api.kind().as_str(), kind, "{error:?}");
            let json = serde_json::to_value(api.kind()).expect("invariant: serializable");
            assert_eq!(json, kind);
        }
    }

    /// A 500 says only that the server failed and under which request id its log has the
    /// detail: storage errors and panic text name paths and internals a client must not see.
    #[tokio::test]
    async fn a_500_keeps_its_detail_in_the_log() {
        let secret = "store record message is corrupt at /srv/agenthost/store.redb";
        let response = ApiError::from(Error::Storage(secret.into())).into_response();
        assert_eq!(response.status().as_u16(), 500);
        let id = response
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .expect("a request id header")
            .to_owned();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            !message.contains("/srv") && !message.contains("corrupt"),
            "{message}"
        );
        assert!(message.contains(&id), "{message} names {id}");
        assert_eq!(body["error"]["type"], "internal");
        // A 4xx or 503 keeps its message: it tells the client what to change or when to retry.
        let response = ApiError::invalid("bad cursor").into_response();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        assert!(String::from_utf8_lossy(&body).contains("bad cursor"));
    }
}
