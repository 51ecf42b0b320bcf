//! The mock provider (`kind = "mock"`): deterministic, in-process, with configurable latency,
//! token rate and tool-call ratio, producing plausible text, tool calls and usage. The
//! [`server`] module serves the same behaviour over HTTP in the OpenAI wire format, for load
//! tests through the real client.
//!
//! Determinism: the reply is a function of the request (model, system, messages, tools) and
//! [`Config::seed`] only, through a fixed hash (FNV-1a over 8-byte words, not std's hasher,
//! whose algorithm may change between Rust releases).

pub mod server;

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Map, Value, json};

use crate::event::{Event, FinishReason, Usage};
use crate::provider::{EventStream, Provider};
use crate::request::{AssistantPart, Message, Request, ToolCall, ToolChoice};

/// Mock behaviour.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Delay before the first token.
    pub latency: Duration,
    /// Tokens per second after the first; 0 means unlimited.
    pub tokens_per_second: f64,
    /// Share of calls (0.0–1.0) answered with a tool call when the request offers tools with
    /// `tool_choice: auto`. `required` or a named tool always gets one; `none`, no tools, or a
    /// conversation ending in a tool result never does (the mock then answers in text).
    pub tool_call_ratio: f64,
    /// Tokens in a text reply.
    pub reply_tokens: u32,
    /// Mixed into every decision, so different seeds give different (still reproducible) runs.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            tokens_per_second: 0.0,
            tool_call_ratio: 0.0,
            reply_tokens: 24,
            seed: 0,
        }
    }
}

impl Config {
    /// The pause between two tokens.
    pub(crate) fn token_interval(&self) -> Duration {
        if self.tokens_per_second > 0.0 && self.tokens_per_second.is_finite() {
            Duration::from_secs_f64(1.0 / self.tokens_per_second)
        } else {
            Duration::ZERO
        }
    }
}

/// The in-process mock provider.
#[derive(Clone, Debug, Default)]
pub struct Mock {
    config: Config,
}

impl Mock {
    /// A mock with this behaviour.
    pub fn new(config: Config) -> Self {
        Self { config }
    }
}

impl Provider for Mock {
    fn stream(&self, request: Request) -> EventStream {
        self.stream_ref(&request)
    }

    fn stream_ref(&self, request: &Request) -> EventStream {
        let plan = plan(&self.config, request);
        let interval = self.config.token_interval();
        let Plan { id, reply, usage } = plan;
        let mut schedule: VecDeque<(Duration, Event)> = VecDeque::with_capacity(match &reply {
            Reply::Text(tokens) => tokens.len() + 4,
            Reply::Tool(_) => 8,
        });
        schedule.push_back((
            self.config.latency,
            Event::StepStart {
                id: Some(id),
                model: Some(request.model.clone()),
            },
        ));
        let (reason, raw) = match reply {
            Reply::Text(tokens) => {
                schedule.push_back((Duration::ZERO, Event::TextStart { part: 0 }));
                for (position, token) in tokens.into_iter().enumerate() {
                    let pause = if position == 0 {
                        Duration::ZERO
                    } else {
                        interval
                    };
                    schedule.push_back((
                        pause,
                        Event::TextDelta {
                            part: 0,
                            delta: token,
                        },
                    ));
                }
                schedule.push_back((Duration::ZERO, Event::TextEnd { part: 0 }));
                (FinishReason::Stop, "stop")
            }
            Reply::Tool(call) => {
                schedule.push_back((
                    Duration::ZERO,
                    Event::ToolInputStart {
                        part: 0,
                        id: call.id.clone(),
                        name: call.name.clone(),
                    },
                ));
                for (position, fragment) in fragments(&call.input).into_iter().enumerate() {
                    let pause = if position == 0 {
                        Duration::ZERO
                    } else {
                        interval
                    };
                    schedule.push_back((
                        pause,
                        Event::ToolInputDelta {
                            part: 0,
                            delta: fragment,
                        },
                    ));
                }
                schedule.push_back((Duration::ZERO, Event::ToolInputEnd { part: 0 }));
                schedule.push_back((Duration::ZERO, Event::ToolCall { part: 0, call }));
                (FinishReason::ToolCalls, "tool_calls")
            }
        };
        schedule.push_back((
            Duration::ZERO,
            Event::StepFinish {
                reason,
                raw_reason: Some(raw.to_owned()),
                usage,
            },
        ));
        futures::stream::unfold(schedule, |mut schedule| async move {
            let (pause, event) = schedule.pop_front()?;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            Some((Ok(event), schedule))
        })
        .boxed()
    }
}

/// What the mock answers to one request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Plan {
    pub id: String,
    pub reply: Reply,
    pub usage: Usage,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Reply {
    /// Text tokens, each with its leading space.
    Text(Vec<String>),
    Tool(ToolCall),
}

/// Decides the reply to `request`.
pub(crate) fn plan(config: &Config, request: &Request) -> Plan {
    let hash = fingerprint(config.seed, request);
    let mut random = SplitMix(hash);
    let last_is_tool_result = matches!(request.messages.last(), Some(Message::Tool(_)));
    let tool = if request.tools.is_empty()
        || last_is_tool_result
        || request.tool_choice == ToolChoice::None
    {
        None
    } else {
        match &request.tool_choice {
            ToolChoice::Tool(name) => request.tools.iter().find(|tool| &tool.name == name),
            ToolChoice::Required => Some(&request.tools[random.below(request.tools.len())]),
            _ if random.unit() < config.tool_call_ratio => {
                Some(&request.tools[random.below(request.tools.len())])
            }
            _ => None,
        }
    };
    let prompt_chars = prompt_chars(request);
    let input = (prompt_chars as u64).div_ceil(4).max(1);
    match tool {
        Some(tool) => {
            let input_json = arguments(&tool.parameters, &mut random);
            let output = (input_json.len() as u64).div_ceil(4) + 8;
            Plan {
                id: format!("mock-{hash:016x}"),
                reply: Reply::Tool(ToolCall {
                    id: format!("call_{:016x}", random.next()),
                    name: tool.name.clone(),
                    input: input_json,
                }),
                usage: Usage {
                    input,
                    output,
                    ..Usage::default()
                },
            }
        }
        None => {
            let tokens = match sections(request) {
                // Asked for Markdown sections (a compaction's summary): each gets a few words.
                sections if !sections.is_empty() => {
                    let per = (config.reply_tokens / sections.len() as u32).max(1);
                    let mut tokens = Vec::new();
                    for section in sections {
                        tokens.push(format!("## {section}\n"));
                        tokens.extend(text(per, &mut random));
                        tokens.push("\n\n".to_owned());
                    }
                    tokens
                }
                _ => text(config.reply_tokens.max(1), &mut random),
            };
            Plan {
                id: format!("mock-{hash:016x}"),
                usage: Usage {
                    input,
                    output: tokens.len() as u64,
                    ..Usage::default()
                },
                reply: Reply::Text(tokens),
            }
        }
    }
}

/// The Markdown sections (`## Name` lines) the last user message asks the reply to have.
fn sections(request: &Request) -> Vec<&str> {
    let Some(Message::User { text, .. }) = request.messages.last() else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| line.strip_prefix("## "))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect()
}

/// Splits tool arguments into up to three fragments at character boundaries, as providers do.
pub(crate) fn fragments(input: &str) -> Vec<String> {
    let chars: Vec<char> = input.chars().collect();
    if chars.len() < 3 {
        return vec![input.to_owned()];
    }
    let third = chars.len() / 3;
    vec![
        chars[..third].iter().collect(),
        chars[third..2 * third].iter().collect(),
        chars[2 * third..].iter().collect(),
    ]
}

fn prompt_chars(request: &Request) -> usize {
    let system: usize = request.system.iter().map(|part| part.text.len()).sum();
    let messages: usize = request
        .messages
        .iter()
        .map(|message| match message {
            Message::User { text, .. } => text.len(),
            Message::Assistant { parts } => parts
                .iter()
                .map(|part| match part {
                    AssistantPart::Text(text) => text.len(),
                    AssistantPart::Reasoning { text, .. } => text.len(),
                    AssistantPart::ToolCall(call) => call.name.len() + call.input.len(),
                })
                .sum(),
            Message::Tool(result) => result.output.len(),
        })
        .sum();
    let tools: usize = request
        .tools
        .iter()
        .map(|tool| tool.name.len() + tool.description.len() + tool.parameters.to_string().len())
        .sum();
    system + messages + tools
}

/// Arguments that satisfy the shape of a JSON schema's top-level properties.
fn arguments(schema: &Value, random: &mut SplitMix) -> String {
    let mut object = Map::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            let value = match property.get("type").and_then(Value::as_str) {
                Some("integer") => json!(random.below(100)),
                Some("number") => json!(random.below(1000) as f64 / 10.0),
                Some("boolean") => json!(random.below(2) == 1),
                Some("array") => json!([]),
                Some("object") => json!({}),
                Some("null") => Value::Null,
                _ => json!(WORDS[random.below(WORDS.len())]),
            };
            object.insert(name.clone(), value);
        }
    }
    Value::Object(object).to_string()
}

const WORDS: [&str; 48] = [
    "the", "agent", "session", "reads", "a", "file", "and", "then", "writes", "summary", "of",
    "its", "work", "while", "tools", "run", "in", "order", "with", "care", "for", "every", "step",
    "model", "answers", "quickly", "history", "stays", "durable", "after", "restart", "input",
    "is", "never", "lost", "result", "looks", "fine", "so", "we", "continue", "to", "next", "task",
    "here", "data", "plan", "done",
];

fn text(tokens: u32, random: &mut SplitMix) -> Vec<String> {
    let mut out = Vec::with_capacity(tokens as usize);
    let mut sentence_left = 6 + random.below(8);
    let mut capitalize = true;
    for position in 0..tokens {
        let word = WORDS[random.below(WORDS.len())];
        // Room for the leading space, the word and a full stop.
        let mut token = String::with_capacity(word.len() + 2);
        if position != 0 {
            token.push(' ');
        }
        if capitalize {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                token.extend(first.to_uppercase());
                token.push_str(chars.as_str());
            }
        } else {
            token.push_str(word);
        }
        capitalize = false;
        sentence_left -= 1;
        if sentence_left == 0 || position + 1 == tokens {
            token.push('.');
            sentence_left = 6 + random.below(8);
            capitalize = true;
        }
        out.push(token);
    }
    out
}

/// FNV-1a (by word) over everything that identifies a request.
fn fingerprint(seed: u64, request: &Request) -> u64 {
    let mut hash = Fnv(0xcbf2_9ce4_8422_2325);
    hash.write(&seed.to_le_bytes());
    hash.field(request.model.as_bytes());
    for part in &request.system {
        hash.field(part.text.as_bytes());
    }
    for message in &request.messages {
        match message {
            Message::User { text, .. } => {
                hash.field(b"user");
                hash.field(text.as_bytes());
            }
            Message::Assistant { parts } => {
                hash.field(b"assistant");
                for part in parts {
                    match part {
                        AssistantPart::Text(text) | AssistantPart::Reasoning { text, .. } => {
                            hash.field(text.as_bytes());
                        }
                        AssistantPart::ToolCall(call) => {
                            hash.field(call.id.as_bytes());
                            hash.field(call.name.as_bytes());
                            hash.field(call.input.as_bytes());
                        }
                    }
                }
            }
            Message::Tool(result) => {
                hash.field(b"tool");
                hash.field(result.call_id.as_bytes());
                hash.field(result.output.as_bytes());
            }
        }
    }
    for tool in &request.tools {
        hash.field(tool.name.as_bytes());
    }
    mix(hash.0)
}

/// FNV-1a over 8-byte words instead of bytes: a request is hashed whole for every call, so
/// this runs over the entire history each step.
struct Fnv(u64);

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in words.by_ref() {
            let word: [u8; 8] = word.try_into().expect("invariant: chunks of eight");
            self.word(u64::from_le_bytes(word));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(word));
        }
    }

    fn word(&mut self, word: u64) {
        self.0 ^= word;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }

    /// Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
    fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
}

/// The splitmix64 finalizer: spreads FNV's weak low bits over the whole word.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A tiny deterministic generator (splitmix64).
pub(crate) struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n); `n` must be positive.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Tool;
    use crate::{Collector, Response};

    fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "lookup".into(),
                description: "Look a thing up".into(),
                parameters: json!({ "type": "object", "properties": { "q": { "type": "string" } } }),
            },
            Tool {
                name: "add".into(),
                description: String::new(),
                parameters: json!({ "type": "object", "properties": {
                    "a": { "type": "integer" }, "b": { "type": "integer" } } }),
            },
        ]
    }

    fn request(text: &str) -> Request {
        let mut request = Request::new("mock-model");
        request.messages.push(Message::user(text));
        request
    }

    async fn run(mock: &Mock, request: Request) -> Response {
        let mut collector = Collector::new();
        let mut stream = mock.stream(request);
        while let Some(item) = stream.next().await {
            collector
                .push(&item.expect("mock streams never fail"))
                .expect("within the output bound");
        }
        collector.finish().expect("mock streams finish")
    }

    #[tokio::test]
    async fn a_requested_section_template_is_followed() {
        let mock = Mock::new(Config::default());
        let reply = run(
            &mock,
            request("Summarize. Reply with these sections:\n## Objective\n## Next Move\n"),
        )
        .await;
        let objective = reply.text.find("## Objective\n").expect("objective");
        let next = reply.text.find("## Next Move\n").expect("next move");
        assert!(objective < next, "{}", reply.text);
        assert!(
            reply.text[objective + 13..next].trim().len() > 3,
            "{}",
            reply.text
        );
    }

    #[tokio::test]
    async fn replies_are_deterministic_per_request_and_seed() {
        let mock = Mock::new(Config::default());
        let first = run(&mock, request("hello")).await;
        let again = run(&mock, request("hello")).await;
        let other = run(&mock, request("something else")).await;
        let reseeded = run(
            &Mock::new(Config {
                seed: 7,
                ..Config::default()
            }),
            request("hello"),
        )
        .await;
        assert_eq!(first, again);
        assert_ne!(first.text, other.text);
        assert_ne!(first.text, reseeded.text);
        assert!(first.text.ends_with('.'));
        assert_eq!(first.usage.output, 24);
        assert_eq!(first.finish, FinishReason::Stop);
    }

    #[tokio::test]
    async fn tool_calls_follow_the_ratio_and_only_name_offered_tools() {
        let mock = Mock::new(Config {
            tool_call_ratio: 0.5,
            ..Config::default()
        });
        let mut calls = 0;
        for n in 0..200 {
            let mut request = request(&format!("question {n}"));
            request.tools = tools();
            let response = run(&mock, request).await;
            if let Some(call) = response.tool_calls.first() {
                calls += 1;
                assert!(["lookup", "add"].contains(&call.name.as_str()));
                let input: Value = serde_json::from_str(&call.input).expect("valid JSON");
                assert!(input.is_object());
                assert_eq!(response.finish, FinishReason::ToolCalls);
                assert!(response.text.is_empty());
            }
        }
        // 200 draws at p = 0.5: far outside [60, 140] would mean the ratio is ignored.
        assert!((60..=140).contains(&calls), "{calls} tool calls of 200");
    }

    #[tokio::test]
    async fn never_calls_tools_when_told_not_to_or_after_a_tool_result() {
        let mock = Mock::new(Config {
            tool_call_ratio: 1.0,
            ..Config::default()
        });
        for n in 0..50 {
            let mut none = request(&format!("q{n}"));
            none.tools = tools();
            none.tool_choice = ToolChoice::None;
            assert!(run(&mock, none).await.tool_calls.is_empty());

            let mut after_result = request(&format!("q{n}"));
            after_result.tools = tools();
            after_result.tool_choice = ToolChoice::Required;
            after_result.messages.push(Message::Assistant {
                parts: vec![AssistantPart::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "lookup".into(),
                    input: "{}".into(),
                })],
            });
            after_result
                .messages
                .push(Message::tool_result("c1", "found"));
            let response = run(&mock, after_result).await;
            assert!(response.tool_calls.is_empty());
            assert!(!response.text.is_empty());

            // Without tools there is nothing to call, whatever the ratio.
            assert!(
                run(&mock, request(&format!("q{n}")))
                    .await
                    .tool_calls
                    .is_empty()
            );
        }
        let mut named = request("q");
        named.tools = tools();
        named.tool_choice = ToolChoice::Tool("add".into());
        assert_eq!(run(&mock, named).await.tool_calls[0].name, "add");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_and_token_rate_use_tokio_time() {
        let mock = Mock::new(Config {
            latency: Duration::from_secs(2),
            tokens_per_second: 10.0,
            reply_tokens: 11,
            ..Config::default()
        });
        let start = tokio::time::Instant::now();
        let mut stream = mock.stream(request("hi"));
        let first = stream.next().await;
        assert!(matches!(first, Some(Ok(Event::StepStart { .. }))));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        while stream.next().await.is_some() {}
        // Ten pauses of 100 ms between eleven tokens.
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }
}
