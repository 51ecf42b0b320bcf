//! The crate's one error type, [`Error`], and its classification from an HTTP status, response
//! headers and an error body.
//!
//! Classification is pure: [`Error::from_http_at`] takes the clock reading it needs for
//! `retry-after` HTTP dates, so the whole table is unit-testable.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use serde_json::Value;

/// What went wrong, as the runtime needs to know it to decide about retries and recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Too many requests or tokens for now (HTTP 429). Retryable, often with a `retry-after`.
    RateLimit,
    /// The account is out of credit or quota (OpenAI `insufficient_quota`, HTTP 402, Anthropic's
    /// "credit balance is too low"). Retrying does not help.
    QuotaExceeded,
    /// The provider failed (HTTP 5xx, 408/409, an error inside the stream). `overloaded` marks
    /// Anthropic's 529 `overloaded_error` and its equivalents.
    ProviderInternal {
        /// The provider said it is overloaded rather than broken.
        overloaded: bool,
    },
    /// The connection failed, timed out, or went idle. `received_any` is true when response body
    /// bytes had already arrived, so the failure happened mid-generation.
    Transport {
        /// Whether any response body bytes arrived before the failure.
        received_any: bool,
    },
    /// The API key or its permissions were rejected (HTTP 401/403).
    Authentication,
    /// The provider rejected the request itself (other 4xx). Retrying the same request fails again.
    InvalidRequest,
    /// The prompt does not fit the model's context window. Compaction may help; a retry does not.
    ContextOverflow,
    /// The provider refused on content-policy grounds.
    ContentPolicy,
    /// The stream ended before the provider said it was done (no `[DONE]`, no `message_stop`).
    IncompleteStream,
    /// The provider sent something that is not a valid stream of its wire format.
    InvalidOutput,
}

impl ErrorKind {
    /// A short stable name, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorKind::RateLimit => "rate_limit",
            ErrorKind::QuotaExceeded => "quota_exceeded",
            ErrorKind::ProviderInternal { overloaded: true } => "overloaded",
            ErrorKind::ProviderInternal { overloaded: false } => "provider_internal",
            ErrorKind::Transport { .. } => "transport",
            ErrorKind::Authentication => "authentication",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::ContentPolicy => "content_policy",
            ErrorKind::IncompleteStream => "incomplete_stream",
            ErrorKind::InvalidOutput => "invalid_output",
        }
    }

    /// Whether an error of this kind is worth retrying, absent an `x-should-retry` override.
    ///
    /// Rate limit, provider internal, a transport error (a reset mid-stream is an incomplete
    /// stream: the runtime continues from what arrived) and an incomplete stream.
    pub fn retryable_by_default(self) -> bool {
        match self {
            // A connection cut mid-stream is an incomplete stream: the runtime keeps what
            // arrived and continues from it, as it does for any other cut.
            Self::RateLimit
            | Self::ProviderInternal { .. }
            | Self::IncompleteStream
            | Self::Transport { .. } => true,
            Self::QuotaExceeded
            | Self::Authentication
            | Self::InvalidRequest
            | Self::ContextOverflow
            | Self::ContentPolicy
            | Self::InvalidOutput => false,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::RateLimit => "rate limited",
            Self::QuotaExceeded => "quota exceeded",
            Self::ProviderInternal { overloaded: true } => "provider overloaded",
            Self::ProviderInternal { overloaded: false } => "provider error",
            Self::Transport {
                received_any: false,
            } => "transport error before any response",
            Self::Transport { received_any: true } => "transport error mid-stream",
            Self::Authentication => "authentication failed",
            Self::InvalidRequest => "invalid request",
            Self::ContextOverflow => "context overflow",
            Self::ContentPolicy => "content policy refusal",
            Self::IncompleteStream => "incomplete stream",
            Self::InvalidOutput => "invalid provider output",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A classified provider failure. The client never retries; the runtime reads [`Error::kind`],
/// [`Error::retryable`] and [`Error::retry_after`] and decides.
///
/// The message is the provider's own (or ours for transport and parse failures), scrubbed of the
/// API key the provider was configured with, so printing an `Error` never leaks a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    status: Option<u16>,
    code: Option<String>,
    retry_after: Option<Duration>,
    should_retry: Option<bool>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        match (self.status, &self.code) {
            (Some(status), Some(code)) => write!(f, " (HTTP {status}, {code})")?,
            (Some(status), None) => write!(f, " (HTTP {status})")?,
            (None, Some(code)) => write!(f, " ({code})")?,
            (None, None) => {}
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        if let Some(after) = self.retry_after {
            write!(f, " (retry after {} ms)", after.as_millis())?;
        }
        Ok(())
    }
}

/// Longest provider message kept in an error; bodies can be whole HTML pages.
const MAX_MESSAGE: usize = 1000;

impl Error {
    /// An error of `kind` with a human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: truncate(message.into()),
            status: None,
            code: None,
            retry_after: None,
            should_retry: None,
        }
    }

    /// A rate-limit error, e.g. for scripted transcripts.
    pub fn rate_limit(retry_after: Option<Duration>) -> Self {
        let mut error = Self::new(ErrorKind::RateLimit, "rate limit reached").with_status(429);
        error.retry_after = retry_after;
        error
    }

    /// An overloaded error, as Anthropic's 529.
    pub fn overloaded() -> Self {
        Self::new(
            ErrorKind::ProviderInternal { overloaded: true },
            "Overloaded",
        )
        .with_status(529)
        .with_code("overloaded_error")
    }

    /// A context-overflow error.
    pub fn context_overflow(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ContextOverflow, message).with_status(400)
    }

    /// A transport error.
    pub fn transport(received_any: bool, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transport { received_any }, message)
    }

    /// The stream ended before the provider finished.
    pub fn incomplete(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::IncompleteStream, message)
    }

    /// The provider's output could not be understood.
    pub fn invalid_output(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidOutput, message)
    }

    /// Sets the HTTP status the error came with.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the provider's error code or type (`rate_limit_exceeded`, `overloaded_error`, …).
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Sets the minimum wait the provider asked for.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Overrides [`ErrorKind::retryable_by_default`], as the `x-should-retry` header does.
    pub fn with_should_retry(mut self, should_retry: bool) -> Self {
        self.should_retry = Some(should_retry);
        self
    }

    /// The classified kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The provider's message, or ours.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The HTTP status, when the error came from a non-2xx response (or an in-stream error that
    /// carried a numeric code).
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The provider's error code or type, when it sent one.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// Whether the runtime may retry: the provider's `x-should-retry` header when it sent one,
    /// else [`ErrorKind::retryable_by_default`].
    pub fn retryable(&self) -> bool {
        self.should_retry
            .unwrap_or_else(|| self.kind.retryable_by_default())
    }

    /// The minimum wait the provider asked for (`retry-after-ms`, else `retry-after` in seconds
    /// or as an HTTP date). Reported as sent: capping it is the runtime's schedule's job.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Classifies a non-2xx HTTP response, reading `retry-after` dates against the system clock.
    pub fn from_http(status: u16, headers: &HeaderMap, body: &str) -> Self {
        Self::from_http_at(status, headers, body, SystemTime::now())
    }

    /// Classifies a non-2xx HTTP response; `now` is the clock reading for `retry-after` dates.
    pub fn from_http_at(status: u16, headers: &HeaderMap, body: &str, now: SystemTime) -> Self {
        let detail = Detail::parse(body);
        let kind = classify(Some(status), &detail);
        let mut error =
            Self::new(kind, detail.message_or(|| format!("HTTP {status}"))).with_status(status);
        error.code = detail.code_or_type().map(str::to_owned);
        error.retry_after = retry_after(headers, now);
        error.should_retry = should_retry(headers);
        error
    }

    /// Classifies an error that arrived inside a 200 stream: an OpenAI-style chunk with a
    /// top-level `error` object, or Anthropic's `event: error` payload.
    ///
    /// A numeric `code` between 400 and 599 (OpenRouter sends `{"code": 400, …}`) is read as the
    /// status it stands for; otherwise the error type decides, and an unrecognised mid-stream
    /// failure counts as a provider fault, since the request itself had been accepted.
    pub fn from_stream_body(body: &Value) -> Self {
        let detail = Detail::from_value(body);
        let status = detail.numeric_code.filter(|code| (400..600).contains(code));
        let kind = match classify(status, &detail) {
            ErrorKind::InvalidOutput => ErrorKind::ProviderInternal { overloaded: false },
            kind => kind,
        };
        let mut error = Self::new(kind, detail.message_or(|| "error inside the stream".into()));
        error.status = status;
        error.code = detail
            .code_or_type()
            .map(str::to_owned)
            .or_else(|| detail.numeric_code.map(|code| code.to_string()));
        error
    }

    /// Replaces every occurrence of `secret` in the message, so a provider that echoes the key
    /// back in an error body cannot make us print it.
    pub(crate) fn redact(mut self, secret: &str) -> Self {
        // Short strings would match innocent text; real keys are long.
        if secret.len() >= 8 && self.message.contains(secret) {
            self.message = self.message.replace(secret, "[redacted]");
        }
        self
    }
}

fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// The parts of an error body that classification looks at, from either provider's shape:
/// OpenAI `{"error": {"message", "type", "code", "param"}}`, Anthropic
/// `{"type": "error", "error": {"type", "message"}}`, and the looser shapes of compatible servers
/// (`{"error": "text"}`, `{"message": …}`, `{"detail": …}`, plain text).
#[derive(Debug, Default)]
struct Detail {
    message: Option<String>,
    kind: Option<String>,
    code: Option<String>,
    numeric_code: Option<u16>,
}

impl Detail {
    fn parse(body: &str) -> Self {
        match serde_json::from_str::<Value>(body) {
            Ok(value) => Self::from_value(&value),
            Err(_) => {
                let text = body.trim();
                Self {
                    message: (!text.is_empty()).then(|| text.to_owned()),
                    ..Self::default()
                }
            }
        }
    }

    fn from_value(value: &Value) -> Self {
        let inner = match value.get("error") {
            Some(Value::String(text)) => {
                return Self {
                    message: Some(text.clone()),
                    ..Self::default()
                };
            }
            Some(inner @ Value::Object(_)) => inner,
            _ => value,
        };
        let text = |key: &str| inner.get(key).and_then(Value::as_str).map(str::to_owned);
        let (code, numeric_code) = match inner.get("code") {
            Some(Value::String(code)) => (Some(code.clone()), code.parse().ok()),
            Some(Value::Number(code)) => (None, code.as_u64().and_then(|c| u16::try_from(c).ok())),
            _ => (None, None),
        };
        let kind = text("type").filter(|kind| kind != "error");
        let message = text("message").or_else(|| text("detail")).or_else(|| {
            value
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        Self {
            message,
            kind,
            code,
            numeric_code,
        }
    }

    fn message_or(&self, fallback: impl FnOnce() -> String) -> String {
        self.message.clone().unwrap_or_else(fallback)
    }

    fn code_or_type(&self) -> Option<&str> {
        self.code
            .as_deref()
            .filter(|code| code.parse::<u16>().is_err())
            .or(self.kind.as_deref())
    }

    /// True when `needle` is the error's code or type.
    fn is(&self, needle: &str) -> bool {
        self.code.as_deref() == Some(needle) || self.kind.as_deref() == Some(needle)
    }

    fn says(&self, needles: &[&str]) -> bool {
        let Some(message) = &self.message else {
            return false;
        };
        let message = message.to_ascii_lowercase();
        needles.iter().any(|needle| message.contains(needle))
    }

    fn context_overflow(&self) -> bool {
        self.is("context_length_exceeded")
            || self.is("exceed_context_size_error")
            || self.is("request_too_large")
            || self.says(&[
                // Anthropic: "prompt is too long: 208310 tokens > 200000 maximum".
                "prompt is too long",
                // Anthropic: "input length and `max_tokens` exceed context limit: …".
                "exceed context limit",
                // OpenAI, vLLM, OpenRouter: "This model's maximum context length is … tokens".
                "maximum context length",
                "context_length_exceeded",
                "reduce the length of the messages",
                // llama.cpp: "the request exceeds the available context size".
                "exceeds the available context size",
                "context window",
            ])
    }

    fn quota(&self) -> bool {
        self.is("insufficient_quota")
            || self.is("billing_hard_limit_reached")
            || self.says(&[
                "exceeded your current quota",
                // Anthropic sends this as a 400 invalid_request_error.
                "credit balance is too low",
            ])
    }

    fn content_policy(&self) -> bool {
        self.is("content_policy_violation")
            || self.is("content_filter")
            || self.says(&["content management policy"])
    }

    fn overloaded(&self) -> bool {
        self.is("overloaded_error") || self.says(&["overloaded"])
    }
}

/// The classification table. `status` is `None` for in-stream errors without a numeric code.
fn classify(status: Option<u16>, detail: &Detail) -> ErrorKind {
    use ErrorKind::*;
    match status {
        Some(401 | 403) => Authentication,
        Some(402) => QuotaExceeded,
        Some(400..=499) if detail.quota() => QuotaExceeded,
        Some(429) => RateLimit,
        Some(529) => ProviderInternal { overloaded: true },
        Some(500..=599) => ProviderInternal {
            overloaded: detail.overloaded(),
        },
        // 413 is a request over the provider's byte limit: in practice a history too large,
        // which compaction addresses, so it is reported as an overflow.
        Some(413) => ContextOverflow,
        Some(400..=499) if detail.context_overflow() => ContextOverflow,
        Some(400..=499) if detail.content_policy() => ContentPolicy,
        // Request timeout and conflict are transient on the provider's side (the official SDKs
        // retry both).
        Some(408 | 409) => ProviderInternal { overloaded: false },
        Some(400..=499) => InvalidRequest,
        Some(_) => InvalidOutput,
        None => classify_by_type(detail),
    }
}

fn classify_by_type(detail: &Detail) -> ErrorKind {
    use ErrorKind::*;
    if detail.quota() {
        QuotaExceeded
    } else if detail.context_overflow() {
        ContextOverflow
    } else if detail.content_policy() {
        ContentPolicy
    } else if detail.overloaded() {
        ProviderInternal { overloaded: true }
    } else if detail.is("rate_limit_error") || detail.is("rate_limit_exceeded") {
        RateLimit
    } else if detail.is("authentication_error")
        || detail.is("permission_error")
        || detail.is("invalid_api_key")
    {
        Authentication
    } else if detail.is("invalid_request_error") || detail.is("not_found_error") {
        InvalidRequest
    } else if detail.is("api_error") || detail.is("server_error") {
        ProviderInternal { overloaded: false }
    } else {
        // The caller maps this to a provider fault for in-stream errors.
        InvalidOutput
    }
}

/// `retry-after-ms` (milliseconds, possibly fractional) wins over `retry-after` (seconds or an
/// HTTP date). Unparseable or negative values are ignored.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = header("retry-after")?.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn should_retry(headers: &HeaderMap) -> Option<bool> {
    match headers.get("x-should-retry")?.to_str().ok()?.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}
