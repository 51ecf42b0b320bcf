//! Error classification tables for both providers: status × headers × body → kind, retryable,
//! retry-after, for HTTP responses and for errors inside a 200 stream.

use std::time::{Duration, SystemTime};

use agenthost_llm::{Error, ErrorKind};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use ErrorKind::*;

struct Case {
    name: &'static str,
    status: u16,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    kind: ErrorKind,
    retryable: bool,
    retry_after: Option<Duration>,
}

const OPENAI_429: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
const OPENAI_QUOTA: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const OPENAI_OVERFLOW: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130417 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const OPENAI_500: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
const OPENAI_401: &str = r#"{"error":{"message":"Incorrect API key provided: sk-abc***xyz.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
const OPENAI_400: &str = r#"{"error":{"message":"Invalid 'messages[1].tool_calls': empty array.","type":"invalid_request_error","param":"messages[1].tool_calls","code":"empty_array"}}"#;
const OPENAI_POLICY: &str = r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","param":null,"code":"content_policy_violation"}}"#;
const ANTHROPIC_429: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
const ANTHROPIC_529: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011"}"#;
const ANTHROPIC_500: &str =
    r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
const ANTHROPIC_OVERFLOW: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#;
const ANTHROPIC_OVERFLOW_MAX_TOKENS: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"}}"#;
const ANTHROPIC_CREDIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
const ANTHROPIC_401: &str =
    r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
const ANTHROPIC_403: &str = r#"{"type":"error","error":{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}}"#;
const ANTHROPIC_404: &str =
    r#"{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}"#;
const ANTHROPIC_413: &str = r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#;
const ANTHROPIC_400: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate between \"user\" and \"assistant\""}}"#;
const LLAMA_CPP_OVERFLOW: &str = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#;

fn secs(s: u64) -> Option<Duration> {
    Some(Duration::from_secs(s))
}

fn cases() -> Vec<Case> {
    vec![
        // OpenAI.
        Case {
            name: "openai 429 with retry-after seconds",
            status: 429,
            headers: &[("retry-after", "2")],
            body: OPENAI_429,
            kind: RateLimit,
            retryable: true,
            retry_after: secs(2),
        },
        Case {
            name: "openai 429 retry-after-ms wins",
            status: 429,
            headers: &[("retry-after", "2"), ("retry-after-ms", "1500")],
            body: OPENAI_429,
            kind: RateLimit,
            retryable: true,
            retry_after: Some(Duration::from_millis(1500)),
        },
        Case {
            name: "openai 429 fractional retry-after",
            status: 429,
            headers: &[("retry-after", "0.25")],
            body: OPENAI_429,
            kind: RateLimit,
            retryable: true,
            retry_after: Some(Duration::from_millis(250)),
        },
        Case {
            name: "openai 429 without retry-after",
            status: 429,
            headers: &[],
            body: OPENAI_429,
            kind: RateLimit,
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "openai insufficient_quota is not a rate limit",
            status: 429,
            headers: &[("retry-after", "20")],
            body: OPENAI_QUOTA,
            kind: QuotaExceeded,
            retryable: false,
            retry_after: secs(20),
        },
        Case {
            name: "openai context_length_exceeded",
            status: 400,
            headers: &[],
            body: OPENAI_OVERFLOW,
            kind: ContextOverflow,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "openai 500",
            status: 500,
            headers: &[],
            body: OPENAI_500,
            kind: ProviderInternal { overloaded: false },
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "openai 503 slow down",
            status: 503,
            headers: &[],
            body: r#"{"error":{"message":"The engine is currently overloaded, please try again later.","type":"server_error"}}"#,
            kind: ProviderInternal { overloaded: true },
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "openai 401",
            status: 401,
            headers: &[],
            body: OPENAI_401,
            kind: Authentication,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "openai 400",
            status: 400,
            headers: &[],
            body: OPENAI_400,
            kind: InvalidRequest,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "openai content policy",
            status: 400,
            headers: &[],
            body: OPENAI_POLICY,
            kind: ContentPolicy,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "x-should-retry false overrides a 500",
            status: 500,
            headers: &[("x-should-retry", "false")],
            body: OPENAI_500,
            kind: ProviderInternal { overloaded: false },
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "x-should-retry true overrides a 400",
            status: 400,
            headers: &[("x-should-retry", "true")],
            body: OPENAI_400,
            kind: InvalidRequest,
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "unparseable retry-after is ignored",
            status: 429,
            headers: &[("retry-after", "soon")],
            body: OPENAI_429,
            kind: RateLimit,
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "negative retry-after-ms falls back to retry-after",
            status: 429,
            headers: &[("retry-after-ms", "-5"), ("retry-after", "3")],
            body: OPENAI_429,
            kind: RateLimit,
            retryable: true,
            retry_after: secs(3),
        },
        // Anthropic.
        Case {
            name: "anthropic 429",
            status: 429,
            headers: &[("retry-after", "17")],
            body: ANTHROPIC_429,
            kind: RateLimit,
            retryable: true,
            retry_after: secs(17),
        },
        Case {
            name: "anthropic 529 overloaded",
            status: 529,
            headers: &[],
            body: ANTHROPIC_529,
            kind: ProviderInternal { overloaded: true },
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "anthropic 500",
            status: 500,
            headers: &[],
            body: ANTHROPIC_500,
            kind: ProviderInternal { overloaded: false },
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "anthropic prompt is too long",
            status: 400,
            headers: &[],
            body: ANTHROPIC_OVERFLOW,
            kind: ContextOverflow,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic input + max_tokens over the limit",
            status: 400,
            headers: &[],
            body: ANTHROPIC_OVERFLOW_MAX_TOKENS,
            kind: ContextOverflow,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic credit balance",
            status: 400,
            headers: &[],
            body: ANTHROPIC_CREDIT,
            kind: QuotaExceeded,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic 401",
            status: 401,
            headers: &[],
            body: ANTHROPIC_401,
            kind: Authentication,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic 403",
            status: 403,
            headers: &[],
            body: ANTHROPIC_403,
            kind: Authentication,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic 404 model",
            status: 404,
            headers: &[],
            body: ANTHROPIC_404,
            kind: InvalidRequest,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic 413 is an overflow",
            status: 413,
            headers: &[],
            body: ANTHROPIC_413,
            kind: ContextOverflow,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic 400",
            status: 400,
            headers: &[],
            body: ANTHROPIC_400,
            kind: InvalidRequest,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "anthropic 529 told not to retry",
            status: 529,
            headers: &[("x-should-retry", "false")],
            body: ANTHROPIC_529,
            kind: ProviderInternal { overloaded: true },
            retryable: false,
            retry_after: None,
        },
        // Compatible servers and gateways.
        Case {
            name: "llama.cpp overflow",
            status: 400,
            headers: &[],
            body: LLAMA_CPP_OVERFLOW,
            kind: ContextOverflow,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "openrouter 402 credits",
            status: 402,
            headers: &[],
            body: r#"{"error":{"message":"Insufficient credits","code":402}}"#,
            kind: QuotaExceeded,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "gateway 502 html",
            status: 502,
            headers: &[],
            body: "<html><body>Bad Gateway</body></html>",
            kind: ProviderInternal { overloaded: false },
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "408 request timeout",
            status: 408,
            headers: &[],
            body: "",
            kind: ProviderInternal { overloaded: false },
            retryable: true,
            retry_after: None,
        },
        Case {
            name: "plain-text 404",
            status: 404,
            headers: &[],
            body: "404 page not found",
            kind: InvalidRequest,
            retryable: false,
            retry_after: None,
        },
        Case {
            name: "string error body",
            status: 400,
            headers: &[],
            body: r#"{"error":"model 'llama9' not found"}"#,
            kind: InvalidRequest,
            retryable: false,
            retry_after: None,
        },
    ]
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(
            HeaderName::from_bytes(name.as_bytes()).expect("valid name"),
            HeaderValue::from_str(value).expect("valid value"),
        );
    }
    map
}

#[test]
fn http_error_table() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut failures = Vec::new();
    for case in cases() {
        let error = Error::from_http_at(case.status, &headers(case.headers), case.body, now);
        let got = (error.kind(), error.retryable(), error.retry_after());
        let want = (case.kind, case.retryable, case.retry_after);
        if got != want {
            failures.push(format!(
                "{}: got {got:?}, want {want:?} ({error})",
                case.name
            ));
        }
        if error.status() != Some(case.status) {
            failures.push(format!("{}: status {:?}", case.name, error.status()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn retry_after_as_an_http_date() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
    let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
    let error = Error::from_http_at(429, &headers(&[("retry-after", &later)]), OPENAI_429, now);
    assert_eq!(error.retry_after(), secs(30));
    // A date in the past means "now".
    let error = Error::from_http_at(429, &headers(&[("retry-after", &earlier)]), OPENAI_429, now);
    assert_eq!(error.retry_after(), Some(Duration::ZERO));
}

#[test]
fn provider_codes_and_messages_are_kept() {
    let error = Error::from_http(400, &HeaderMap::new(), OPENAI_OVERFLOW);
    assert_eq!(error.code(), Some("context_length_exceeded"));
    assert!(
        error
            .message()
            .starts_with("This model's maximum context length")
    );
    let shown = error.to_string();
    assert!(
        shown.starts_with("context overflow (HTTP 400, context_length_exceeded): This model's"),
        "{shown}"
    );

    let error = Error::from_http(529, &HeaderMap::new(), ANTHROPIC_529);
    assert_eq!(error.code(), Some("overloaded_error"));
    assert_eq!(error.message(), "Overloaded");

    let error = Error::from_http(429, &headers(&[("retry-after", "2")]), OPENAI_429);
    assert!(
        error.to_string().ends_with("(retry after 2000 ms)"),
        "{error}"
    );
}

#[test]
fn huge_bodies_are_truncated_in_the_message() {
    let body = "é".repeat(5000);
    let error = Error::from_http(502, &HeaderMap::new(), &body);
    assert!(error.message().len() <= 1004, "{}", error.message().len());
    assert!(error.message().ends_with('…'));
}

#[test]
fn in_stream_error_table() {
    let cases: Vec<(&str, Value, ErrorKind, bool)> = vec![
        (
            "anthropic overloaded",
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
            ProviderInternal { overloaded: true },
            true,
        ),
        (
            "anthropic api_error",
            json!({"type":"error","error":{"type":"api_error","message":"Internal server error"}}),
            ProviderInternal { overloaded: false },
            true,
        ),
        (
            "anthropic rate limit",
            json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}),
            RateLimit,
            true,
        ),
        (
            "anthropic overflow",
            json!({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 1 tokens > 0 maximum"}}),
            ContextOverflow,
            false,
        ),
        (
            "openrouter numeric 400",
            json!({"error":{"code":400,"message":"Token limit reached"}}),
            InvalidRequest,
            false,
        ),
        (
            "openrouter numeric 429",
            json!({"error":{"code":429,"message":"Rate limit exceeded: free-models-per-min"}}),
            RateLimit,
            true,
        ),
        (
            "openrouter numeric 502",
            json!({"error":{"code":502,"message":"Provider returned error"}}),
            ProviderInternal { overloaded: false },
            true,
        ),
        (
            "openai server_error",
            json!({"error":{"message":"The server had an error","type":"server_error","code":null}}),
            ProviderInternal { overloaded: false },
            true,
        ),
        (
            "openai overflow code",
            json!({"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}),
            ContextOverflow,
            false,
        ),
        (
            "openai quota",
            json!({"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}),
            QuotaExceeded,
            false,
        ),
        (
            "unknown mid-stream failure is the provider's",
            json!({"error":{"message":"something broke"}}),
            ProviderInternal { overloaded: false },
            true,
        ),
        (
            "bare string",
            json!({"error":"upstream disconnected"}),
            ProviderInternal { overloaded: false },
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (name, body, kind, retryable) in cases {
        let error = Error::from_stream_body(&body);
        if (error.kind(), error.retryable()) != (kind, retryable) {
            failures.push(format!(
                "{name}: got {:?}/{}, want {kind:?}/{retryable}",
                error.kind(),
                error.retryable()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn default_retryability_follows_the_spec() {
    // Rate limit, provider internal, transport errors (before anything was received, or a reset
    // mid-stream, which is an incomplete stream) and incomplete streams are retryable; nothing
    // else is. After output, "retry" means continue from the partial message.
    let retryable = [
        RateLimit,
        ProviderInternal { overloaded: false },
        ProviderInternal { overloaded: true },
        Transport {
            received_any: false,
        },
        Transport { received_any: true },
        IncompleteStream,
    ];
    let final_ = [
        QuotaExceeded,
        Authentication,
        InvalidRequest,
        ContextOverflow,
        ContentPolicy,
        InvalidOutput,
    ];
    for kind in retryable {
        assert!(kind.retryable_by_default(), "{kind:?}");
        assert!(Error::new(kind, "x").retryable(), "{kind:?}");
    }
    for kind in final_ {
        assert!(!kind.retryable_by_default(), "{kind:?}");
    }
    assert!(
        !Error::new(RateLimit, "x")
            .with_should_retry(false)
            .retryable()
    );
    assert!(
        Error::new(InvalidRequest, "x")
            .with_should_retry(true)
            .retryable()
    );
}
