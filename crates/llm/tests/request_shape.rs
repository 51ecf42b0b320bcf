//! Request-building snapshots for both wire formats: one conversation with system parts, user
//! input, assistant reasoning (signed), text and two tool calls, two tool results (one failed)
//! and a follow-up, checked field by field against the documented request shapes of OpenAI
//! Chat Completions and Anthropic Messages.

use agenthost_llm::{
    Anthropic, ApiKey, AssistantPart, Config, File, FileContent, Kind, Message, OpenAi,
    ReasoningMetadata, Request, SystemPart, Tool, ToolCall, ToolChoice,
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789abcdef";

fn conversation(model: &str) -> Request {
    let mut request = Request::new(model);
    request.system = vec![
        SystemPart::stable("You are a helpful agent."),
        SystemPart::stable("Project rules: be brief."),
        SystemPart::volatile("Today is 2025-01-01."),
    ];
    request.messages = vec![
        Message::user("What's the weather in Paris and Rome?"),
        Message::Assistant {
            parts: vec![
                AssistantPart::Reasoning {
                    text: "The user wants two cities.".into(),
                    metadata: Some(ReasoningMetadata::Anthropic {
                        signature: "EsQDCkYICBgCKkBr9+sig==".into(),
                    }),
                },
                AssistantPart::Text("Let me check both.".into()),
                AssistantPart::ToolCall(ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    input: r#"{"city":"Paris"}"#.into(),
                }),
                AssistantPart::ToolCall(ToolCall {
                    id: "call_2".into(),
                    name: "get_weather".into(),
                    input: r#"{"city":"Rome"}"#.into(),
                }),
            ],
        },
        Message::tool_result("call_1", "18°C, sunny"),
        Message::tool_error("call_2", "weather service unavailable"),
        Message::user("Thanks! And tomorrow?"),
    ];
    request.tools = vec![Tool {
        name: "get_weather".into(),
        description: "Current weather for a city".into(),
        parameters: json!({
            "type": "object",
            "properties": { "city": { "type": "string" } },
            "required": ["city"],
        }),
    }];
    request.max_output = Some(1024);
    request.temperature = Some(0.2);
    request.prompt_cache_key = Some("ses_01J".into());
    request.session_id = Some("ses_01J".into());
    request.headers.insert("x-trace", "abc");
    request
}

fn config(kind: Kind, base: &str) -> Config {
    let mut config = Config::new(kind);
    config.base_url = Some(base.into());
    config.api_key = Some(ApiKey::new(KEY));
    config.headers.insert("x-org", "acme");
    config
}

/// Lists every path where `actual` differs from `expected`.
fn diff(path: &str, expected: &Value, actual: &Value, out: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, value) in e {
                match a.get(key) {
                    Some(got) => diff(&format!("{path}.{key}"), value, got, out),
                    None => out.push(format!("{path}.{key}: missing")),
                }
            }
            for key in a.keys().filter(|key| !e.contains_key(*key)) {
                out.push(format!("{path}.{key}: unexpected {}", a[key]));
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (n, (e, a)) in e.iter().zip(a).enumerate() {
                diff(&format!("{path}[{n}]"), e, a, out);
            }
        }
        _ if expected == actual => {}
        _ => out.push(format!("{path}: expected {expected}, got {actual}")),
    }
}

fn assert_shape(expected: &Value, actual: &Value) {
    let mut out = Vec::new();
    diff("", expected, actual, &mut out);
    assert!(
        out.is_empty(),
        "body differs:\n{}\nfull body: {actual:#}",
        out.join("\n")
    );
}

/// The JSON body of a built request, as sent.
fn sent(request: &reqwest::Request) -> Value {
    let bytes = request
        .body()
        .and_then(|b| b.as_bytes())
        .expect("buffered body");
    serde_json::from_slice(bytes).expect("JSON body")
}

fn header<'a>(request: &'a reqwest::Request, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

#[test]
fn openai_chat_completions_body() {
    let client = OpenAi::new(&config(Kind::Openai, "http://127.0.0.1:9/v1")).expect("client");
    let expected = json!({
        "model": "gpt-4o-mini",
        "messages": [
            // One system message: several compatible servers accept only one.
            { "role": "system", "content": "You are a helpful agent.\n\nProject rules: be brief.\n\nToday is 2025-01-01." },
            { "role": "user", "content": "What's the weather in Paris and Rome?" },
            // Reasoning is not replayed to Chat Completions.
            { "role": "assistant", "content": "Let me check both.", "tool_calls": [
                { "id": "call_1", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } },
                { "id": "call_2", "type": "function", "function": { "name": "get_weather", "arguments": "{\"city\":\"Rome\"}" } },
            ] },
            { "role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny" },
            { "role": "tool", "tool_call_id": "call_2", "content": "weather service unavailable" },
            { "role": "user", "content": "Thanks! And tomorrow?" },
        ],
        "stream": true,
        "stream_options": { "include_usage": true },
        "tools": [{ "type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
        } }],
        "tool_choice": "auto",
        "max_completion_tokens": 1024,
        "temperature": 0.2,
        "prompt_cache_key": "ses_01J",
    });
    let request = conversation("gpt-4o-mini");
    assert_shape(&expected, &client.body(&request));

    let http = client.http_request(&request).expect("request");
    assert_eq!(http.method(), reqwest::Method::POST);
    assert_eq!(
        http.url().as_str(),
        "http://127.0.0.1:9/v1/chat/completions"
    );
    assert_eq!(
        header(&http, "authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(http.headers()["authorization"].is_sensitive());
    assert_eq!(header(&http, "content-type"), Some("application/json"));
    assert_eq!(header(&http, "accept"), Some("text/event-stream"));
    assert_eq!(header(&http, "x-session-affinity"), Some("ses_01J"));
    assert_eq!(header(&http, "x-org"), Some("acme"));
    assert_eq!(header(&http, "x-trace"), Some("abc"));
    assert!(http.headers().get("x-api-key").is_none());
    assert_eq!(sent(&http), client.body(&request));
}

#[test]
fn anthropic_messages_body() {
    let client = Anthropic::new(&config(Kind::Anthropic, "http://127.0.0.1:9/v1")).expect("client");
    let expected = json!({
        "model": "claude-sonnet-4-20250514",
        "max_tokens": 1024,
        "stream": true,
        // cache_control on the last part of the stable prefix only.
        "system": [
            { "type": "text", "text": "You are a helpful agent." },
            { "type": "text", "text": "Project rules: be brief.", "cache_control": { "type": "ephemeral" } },
            { "type": "text", "text": "Today is 2025-01-01." },
        ],
        "messages": [
            { "role": "user", "content": [{ "type": "text", "text": "What's the weather in Paris and Rome?" }] },
            { "role": "assistant", "content": [
                { "type": "thinking", "thinking": "The user wants two cities.", "signature": "EsQDCkYICBgCKkBr9+sig==" },
                { "type": "text", "text": "Let me check both." },
                { "type": "tool_use", "id": "call_1", "name": "get_weather", "input": { "city": "Paris" } },
                { "type": "tool_use", "id": "call_2", "name": "get_weather", "input": { "city": "Rome" } },
            ] },
            // Both results in one user turn, ahead of the follow-up text.
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "call_1", "content": "18°C, sunny" },
                { "type": "tool_result", "tool_use_id": "call_2", "content": "weather service unavailable", "is_error": true },
                { "type": "text", "text": "Thanks! And tomorrow?" },
            ] },
        ],
        "tools": [{
            "name": "get_weather",
            "description": "Current weather for a city",
            "input_schema": { "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] },
        }],
        "tool_choice": { "type": "auto" },
        "temperature": 0.2,
    });
    let request = conversation("claude-sonnet-4-20250514");
    assert_shape(&expected, &client.body(&request));

    let http = client.http_request(&request).expect("request");
    assert_eq!(http.method(), reqwest::Method::POST);
    assert_eq!(http.url().as_str(), "http://127.0.0.1:9/v1/messages");
    assert_eq!(header(&http, "x-api-key"), Some(KEY));
    assert!(http.headers()["x-api-key"].is_sensitive());
    assert_eq!(header(&http, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(&http, "content-type"), Some("application/json"));
    assert_eq!(header(&http, "x-session-affinity"), Some("ses_01J"));
    assert_eq!(header(&http, "x-org"), Some("acme"));
    assert_eq!(header(&http, "x-trace"), Some("abc"));
    assert!(http.headers().get("authorization").is_none());
    assert_eq!(sent(&http), client.body(&request));
}

#[test]
fn tool_choice_mappings() {
    let openai = OpenAi::new(&Config::new(Kind::Openai)).expect("client");
    let anthropic = Anthropic::new(&Config::new(Kind::Anthropic)).expect("client");
    let cases = [
        (ToolChoice::Auto, json!("auto"), json!({ "type": "auto" })),
        (ToolChoice::None, json!("none"), json!({ "type": "none" })),
        (
            ToolChoice::Required,
            json!("required"),
            json!({ "type": "any" }),
        ),
        (
            ToolChoice::Tool("get_weather".into()),
            json!({ "type": "function", "function": { "name": "get_weather" } }),
            json!({ "type": "tool", "name": "get_weather" }),
        ),
    ];
    for (choice, want_openai, want_anthropic) in cases {
        let mut request = conversation("m");
        request.tool_choice = choice;
        assert_eq!(openai.body(&request)["tool_choice"], want_openai);
        assert_eq!(anthropic.body(&request)["tool_choice"], want_anthropic);
    }
}

#[test]
fn without_tools_neither_tools_nor_tool_choice_is_sent() {
    let mut request = Request::new("m");
    request.messages.push(Message::user("hi"));
    request.tool_choice = ToolChoice::None;
    let openai = OpenAi::new(&Config::new(Kind::Openai))
        .expect("client")
        .body(&request);
    let anthropic = Anthropic::new(&Config::new(Kind::Anthropic))
        .expect("client")
        .body(&request);
    for body in [&openai, &anthropic] {
        assert!(
            body.get("tools").is_none() && body.get("tool_choice").is_none(),
            "{body}"
        );
        assert!(
            body.get("temperature").is_none() && body.get("system").is_none(),
            "{body}"
        );
    }
    assert!(
        openai.get("max_completion_tokens").is_none() && openai.get("prompt_cache_key").is_none()
    );
    // Anthropic requires max_tokens: the configured default fills in.
    assert_eq!(anthropic["max_tokens"], json!(4096));
    assert_eq!(
        openai["messages"],
        json!([{ "role": "user", "content": "hi" }])
    );
}

#[test]
fn legacy_max_tokens_and_extra_body() {
    let mut config = Config::new(Kind::Openai);
    config.legacy_max_tokens = true;
    let client = OpenAi::new(&config).expect("client");
    let mut request = conversation("m");
    request
        .extra_body
        .insert("reasoning_effort".into(), json!("low"));
    let body = client.body(&request);
    assert_eq!(body["max_tokens"], json!(1024));
    assert!(body.get("max_completion_tokens").is_none());
    assert_eq!(body["reasoning_effort"], json!("low"));

    // A key of `extra_body` replaces the built one: it is sent once, with the extra value.
    request
        .extra_body
        .insert("stream_options".into(), json!({ "include_usage": false }));
    let http = client.http_request(&request).expect("request");
    let bytes = http
        .body()
        .and_then(|b| b.as_bytes())
        .expect("buffered body");
    let text = std::str::from_utf8(bytes).expect("UTF-8");
    assert_eq!(text.matches("\"stream_options\"").count(), 1, "{text}");
    assert_eq!(
        sent(&http)["stream_options"],
        json!({ "include_usage": false })
    );
    assert_eq!(sent(&http), client.body(&request));

    let anthropic = Anthropic::new(&Config::new(Kind::Anthropic)).expect("client");
    request.extra_body.insert(
        "thinking".into(),
        json!({ "type": "enabled", "budget_tokens": 512 }),
    );
    assert_eq!(
        anthropic.body(&request)["thinking"]["budget_tokens"],
        json!(512)
    );
}

#[test]
fn attachments_map_to_content_parts() {
    let mut request = Request::new("m");
    request.messages.push(Message::User {
        text: "Look at these".into(),
        files: vec![
            File {
                name: Some("notes.txt".into()),
                media_type: "text/plain".into(),
                content: FileContent::Text("line one".into()),
            },
            File {
                name: None,
                media_type: "image/png".into(),
                content: FileContent::Url("https://example.invalid/a.png".into()),
            },
            File {
                name: Some("paper.pdf".into()),
                media_type: "application/pdf".into(),
                content: FileContent::Url("https://example.invalid/p.pdf".into()),
            },
        ],
    });
    let file_text = "<file name=\"notes.txt\" type=\"text/plain\">\nline one\n</file>";
    let openai = OpenAi::new(&Config::new(Kind::Openai))
        .expect("client")
        .body(&request);
    assert_shape(
        &json!([{ "role": "user", "content": [
            { "type": "text", "text": "Look at these" },
            { "type": "text", "text": file_text },
            { "type": "image_url", "image_url": { "url": "https://example.invalid/a.png" } },
            { "type": "text", "text": "[file paper.pdf: https://example.invalid/p.pdf]" },
        ] }]),
        &openai["messages"],
    );
    let anthropic = Anthropic::new(&Config::new(Kind::Anthropic))
        .expect("client")
        .body(&request);
    assert_shape(
        &json!([{ "role": "user", "content": [
            { "type": "text", "text": "Look at these" },
            { "type": "text", "text": file_text },
            { "type": "image", "source": { "type": "url", "url": "https://example.invalid/a.png" } },
            { "type": "document", "source": { "type": "url", "url": "https://example.invalid/p.pdf" } },
        ] }]),
        &anthropic["messages"],
    );
}

#[test]
fn reasoning_replay_rules() {
    let mut request = Request::new("m");
    request.messages = vec![
        Message::user("q"),
        Message::Assistant {
            parts: vec![
                AssistantPart::Reasoning {
                    text: String::new(),
                    metadata: Some(ReasoningMetadata::AnthropicRedacted {
                        data: "ENCRYPTED".into(),
                    }),
                },
                // Unsigned reasoning (another provider's) cannot be replayed to Anthropic.
                AssistantPart::Reasoning {
                    text: "unsigned".into(),
                    metadata: None,
                },
                AssistantPart::Text(String::new()),
                AssistantPart::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "t".into(),
                    input: "not json".into(),
                }),
            ],
        },
        // An assistant turn of reasoning only has nothing to send to Chat Completions.
        Message::Assistant {
            parts: vec![AssistantPart::Reasoning {
                text: "hmm".into(),
                metadata: None,
            }],
        },
        Message::tool_result("c1", ""),
    ];
    let anthropic = Anthropic::new(&Config::new(Kind::Anthropic))
        .expect("client")
        .body(&request);
    assert_shape(
        &json!([
            { "role": "user", "content": [{ "type": "text", "text": "q" }] },
            { "role": "assistant", "content": [
                { "type": "redacted_thinking", "data": "ENCRYPTED" },
                { "type": "tool_use", "id": "c1", "name": "t", "input": {} },
            ] },
            { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "c1" }] },
        ]),
        &anthropic["messages"],
    );
    let openai = OpenAi::new(&Config::new(Kind::Openai))
        .expect("client")
        .body(&request);
    assert_shape(
        &json!([
            { "role": "user", "content": "q" },
            { "role": "assistant", "content": null, "tool_calls": [
                { "id": "c1", "type": "function", "function": { "name": "t", "arguments": "not json" } },
            ] },
            { "role": "tool", "tool_call_id": "c1", "content": "" },
        ]),
        &openai["messages"],
    );
}

#[test]
fn no_affinity_header_when_disabled_or_without_session() {
    let mut config = Config::new(Kind::Openai);
    config.affinity_header = String::new();
    let client = OpenAi::new(&config).expect("client");
    let http = client.http_request(&conversation("m")).expect("request");
    assert!(http.headers().get("x-session-affinity").is_none());
    assert!(
        http.headers().get("authorization").is_none(),
        "no key configured"
    );

    let client = OpenAi::new(&Config::new(Kind::Openai)).expect("client");
    let http = client.http_request(&Request::new("m")).expect("request");
    assert!(http.headers().get("x-session-affinity").is_none());
    assert_eq!(
        http.url().as_str(),
        "https://api.openai.com/v1/chat/completions"
    );
}
