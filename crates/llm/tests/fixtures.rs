//! Recorded provider streams (`testdata/providers/`, copied from `shared/fixtures/providers/`)
//! parse to exactly their `.expected.json`, and any split of their bytes into chunks, and any
//! line-ending style, yields the same events.

use std::path::PathBuf;

use agenthost_llm::{Error, ErrorKind, Event, ReasoningMetadata, anthropic, openai};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    OpenAi,
    Anthropic,
}

type Items = Vec<Result<Event, Error>>;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/providers")
}

/// Every fixture: name, wire format, bytes.
fn fixtures() -> Vec<(String, Format, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(testdata()).expect("testdata/providers exists") {
        let path = entry.expect("readable dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("sse") {
            continue;
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_owned();
        let format = if name.starts_with("anthropic") {
            Format::Anthropic
        } else {
            Format::OpenAi
        };
        out.push((
            name,
            format,
            std::fs::read(&path).expect("readable fixture"),
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(out.len(), 12, "all twelve fixtures are present");
    out
}

fn parse<'a>(format: Format, chunks: impl IntoIterator<Item = &'a [u8]>) -> Items {
    let mut out = Vec::new();
    match format {
        Format::OpenAi => {
            let mut parser = openai::Parser::new();
            for chunk in chunks {
                parser.feed(chunk, &mut out);
            }
            parser.finish(&mut out);
        }
        Format::Anthropic => {
            let mut parser = anthropic::Parser::new();
            for chunk in chunks {
                parser.feed(chunk, &mut out);
            }
            parser.finish(&mut out);
        }
    }
    out
}

fn parse_whole(format: Format, bytes: &[u8]) -> Items {
    parse(format, [bytes])
}

/// Renders parsed items in the shape of the `.expected.json` files (see their README).
fn render(format: Format, items: &Items) -> Value {
    let mut outcome = "completed";
    let mut message_id = Value::Null;
    let mut model = Value::Null;
    let mut text = String::new();
    let mut reasoning: Option<(String, Value, u32)> = None;
    // (part, id, name, raw arguments, parsed arguments, complete)
    let mut tools: Vec<(u32, String, String, String, Value, bool)> = Vec::new();
    let mut finish = json!({ "raw": null, "normalized": "error" });
    let mut usage = agenthost_llm::Usage::default();
    let mut error = Value::Null;
    for item in items {
        match item {
            Ok(Event::StepStart { id, model: m }) => {
                message_id = json!(id);
                model = json!(m);
            }
            Ok(Event::TextDelta { delta, .. }) => text.push_str(delta),
            Ok(Event::ReasoningStart { part }) => {
                reasoning = Some((String::new(), Value::Null, *part))
            }
            Ok(Event::ReasoningDelta { delta, .. }) => {
                reasoning
                    .as_mut()
                    .expect("delta after start")
                    .0
                    .push_str(delta);
            }
            Ok(Event::ReasoningEnd { metadata, .. }) => {
                if let Some(ReasoningMetadata::Anthropic { signature }) = metadata {
                    reasoning.as_mut().expect("end after start").1 = json!(signature);
                }
            }
            Ok(Event::ToolInputStart { part, id, name }) => {
                tools.push((
                    *part,
                    id.clone(),
                    name.clone(),
                    String::new(),
                    Value::Null,
                    false,
                ));
            }
            Ok(Event::ToolInputDelta { part, delta }) => {
                let tool = tools
                    .iter_mut()
                    .find(|t| t.0 == *part)
                    .expect("delta after start");
                tool.3.push_str(delta);
            }
            Ok(Event::ToolCall { part, call }) => {
                let tool = tools
                    .iter_mut()
                    .find(|t| t.0 == *part)
                    .expect("call after start");
                assert_eq!((&tool.1, &tool.2), (&call.id, &call.name));
                tool.4 = serde_json::from_str(&call.input).expect("complete calls parse");
                tool.5 = true;
            }
            Ok(Event::StepFinish {
                reason,
                raw_reason,
                usage: u,
            }) => {
                finish = json!({ "raw": raw_reason, "normalized": reason.as_str() });
                usage = *u;
            }
            Ok(Event::TextStart { .. } | Event::TextEnd { .. } | Event::ToolInputEnd { .. }) => {}
            Err(e) => {
                outcome = "error";
                error = match format {
                    Format::OpenAi => json!({ "code": e.status(), "message": e.message() }),
                    Format::Anthropic => json!({ "type": e.code(), "message": e.message() }),
                };
            }
        }
    }
    let reasoning = match reasoning {
        None => Value::Null,
        Some((text, signature, part)) => {
            let mut object = Map::new();
            object.insert("text".into(), json!(text));
            object.insert("signature".into(), signature);
            if format == Format::Anthropic {
                object.insert("block_index".into(), json!(part));
            }
            Value::Object(object)
        }
    };
    let tool_calls: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(ordinal, (part, id, name, raw, arguments, complete))| {
            // Anthropic's index is the content-block index (our part number); OpenAI's is the
            // position in the message's tool_calls array.
            let index = match format {
                Format::Anthropic => *part as usize,
                Format::OpenAi => ordinal,
            };
            json!({ "index": index, "id": id, "name": name, "arguments_raw": raw,
                    "arguments": arguments, "complete": complete })
        })
        .collect();
    let usage = match format {
        Format::OpenAi => {
            let prompt = usage.input + usage.cache_read;
            json!({ "prompt_tokens": prompt, "completion_tokens": usage.output,
                    "total_tokens": prompt + usage.output, "cached_tokens": usage.cache_read,
                    "reasoning_tokens": usage.reasoning })
        }
        Format::Anthropic => json!({
            "input_tokens": usage.input, "cache_creation_input_tokens": usage.cache_write,
            "cache_read_input_tokens": usage.cache_read, "output_tokens": usage.output,
            "total_input_tokens": usage.total_input() }),
    };
    json!({ "outcome": outcome, "message_id": message_id, "model": model, "text": text,
            "reasoning": reasoning, "tool_calls": tool_calls, "finish_reason": finish,
            "usage": usage, "error": error })
}

/// Documentation in the expected files, not parse results: skipped by the comparison.
/// `cache_creation` is Anthropic's per-TTL split of cache writes, which `Usage` does not keep
/// (this client only writes 5-minute entries, so `cache_write` is the whole of it).
const NOT_COMPARED: [&str; 9] = [
    "fixture",
    "wire_format",
    "synthetic",
    "parser_must",
    "note",
    "source_field",
    "where",
    "retryable_class",
    "cache_creation",
];

fn compare(path: &str, expected: &Value, actual: &Value, mismatches: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(expected), Value::Object(actual)) => {
            for (key, value) in expected {
                if NOT_COMPARED.contains(&key.as_str()) {
                    continue;
                }
                match actual.get(key) {
                    Some(got) => compare(&format!("{path}.{key}"), value, got, mismatches),
                    None => mismatches.push(format!("{path}.{key}: missing from the parse")),
                }
            }
            for key in actual.keys() {
                if !expected.contains_key(key) {
                    mismatches.push(format!("{path}.{key}: not in the expected file"));
                }
            }
        }
        (Value::Array(expected), Value::Array(actual)) => {
            if expected.len() != actual.len() {
                mismatches.push(format!(
                    "{path}: {} items expected, {} parsed",
                    expected.len(),
                    actual.len()
                ));
            }
            for (n, (e, a)) in expected.iter().zip(actual).enumerate() {
                compare(&format!("{path}[{n}]"), e, a, mismatches);
            }
        }
        _ if expected == actual => {}
        _ => mismatches.push(format!("{path}: expected {expected}, parsed {actual}")),
    }
}

#[test]
fn every_fixture_parses_to_its_expected_json() {
    let mut failures = Vec::new();
    for (name, format, bytes) in fixtures() {
        let expected: Value = serde_json::from_slice(
            &std::fs::read(testdata().join(format!("{name}.expected.json")))
                .expect("expected file"),
        )
        .expect("expected JSON");
        let items = parse_whole(format, &bytes);
        let mut mismatches = Vec::new();
        compare("", &expected, &render(format, &items), &mut mismatches);
        failures.extend(mismatches.into_iter().map(|m| format!("{name}{m}")));
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn in_stream_errors_are_classified_from_their_body() {
    let (_, _, bytes) = fixtures()
        .into_iter()
        .find(|(name, ..)| name == "anthropic-error-mid-stream-synthetic")
        .expect("fixture");
    let error = parse_whole(Format::Anthropic, &bytes)
        .pop()
        .expect("items")
        .expect_err("ends with an error");
    assert_eq!(
        error.kind(),
        ErrorKind::ProviderInternal { overloaded: true }
    );
    assert!(error.retryable());

    let (_, _, bytes) = fixtures()
        .into_iter()
        .find(|(name, ..)| name == "openrouter-error-mid-stream")
        .expect("fixture");
    let error = parse_whole(Format::OpenAi, &bytes)
        .pop()
        .expect("items")
        .expect_err("ends with an error");
    // `{"code": 400}` inside the stream reads as the status it stands for.
    assert_eq!(error.kind(), ErrorKind::InvalidRequest);
    assert!(!error.retryable());
}

#[test]
fn the_stream_contract_holds_for_every_fixture() {
    for (name, format, bytes) in fixtures() {
        let items = parse_whole(format, &bytes);
        let starts = items
            .iter()
            .filter(|i| matches!(i, Ok(Event::StepStart { .. })))
            .count();
        let finishes = items
            .iter()
            .filter(|i| matches!(i, Ok(Event::StepFinish { .. })))
            .count();
        assert_eq!((starts, finishes), (1, 1), "{name}: one start, one finish");
        assert!(
            matches!(items[0], Ok(Event::StepStart { .. })),
            "{name}: starts with StepStart"
        );
        let errors = items.iter().filter(|i| i.is_err()).count();
        match items.last() {
            Some(Err(_)) => {
                assert_eq!(errors, 1, "{name}");
                assert!(
                    matches!(items[items.len() - 2], Ok(Event::StepFinish { .. })),
                    "{name}"
                );
            }
            Some(Ok(Event::StepFinish { .. })) => assert_eq!(errors, 0, "{name}"),
            other => panic!("{name}: ends with {other:?}"),
        }
    }
}

fn with_line_endings(bytes: &[u8], ending: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        if byte == b'\n' {
            out.extend_from_slice(ending);
        } else {
            out.push(byte);
        }
    }
    out
}

#[test]
fn line_endings_do_not_matter() {
    for (name, format, bytes) in fixtures() {
        let reference = parse_whole(format, &bytes);
        for ending in [&b"\r\n"[..], b"\r"] {
            let converted = with_line_endings(&bytes, ending);
            assert_eq!(
                parse_whole(format, &converted),
                reference,
                "{name} with {ending:?}"
            );
        }
    }
}

#[test]
fn every_two_chunk_split_yields_the_same_events() {
    // Exhaustive for one cut: covers every position inside multi-byte characters and, in the
    // CRLF variant, between every `\r` and its `\n`.
    for (name, format, bytes) in fixtures() {
        let reference = parse_whole(format, &bytes);
        let crlf = with_line_endings(&bytes, b"\r\n");
        for input in [&bytes, &crlf] {
            for cut in 0..=input.len() {
                let items = parse(format, [&input[..cut], &input[cut..]]);
                assert_eq!(items, reference, "{name} cut at {cut}");
            }
        }
    }
}

fn split_at<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for cut in cuts {
        chunks.push(&bytes[start..cut]);
        start = cut;
    }
    chunks.push(&bytes[start..]);
    chunks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_chunking_yields_the_same_events(
        fixture in 0usize..12,
        ending in 0usize..3,
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let (name, format, bytes) = fixtures().swap_remove(fixture);
        let reference = parse_whole(format, &bytes);
        let input = match ending {
            0 => bytes,
            1 => with_line_endings(&bytes, b"\r\n"),
            _ => with_line_endings(&bytes, b"\r"),
        };
        let items = parse(format, split_at(&input, &cuts));
        prop_assert_eq!(items, reference, "{} split at {:?}", name, cuts);
    }
}

/// How one recorded stream is damaged.
#[derive(Debug, Clone)]
enum Damage {
    Flip { at: usize, mask: u8 },
    Delete { at: usize, len: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Truncate { at: usize },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Damage::Flip { at, mask }),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Damage::Delete { at, len }),
        (
            any::<usize>(),
            prop::collection::vec(
                prop_oneof![
                    Just(b'\n'),
                    Just(b'\r'),
                    Just(b':'),
                    Just(b'{'),
                    Just(b'"'),
                    any::<u8>()
                ],
                1..32
            )
        )
            .prop_map(|(at, bytes)| Damage::Insert { at, bytes }),
        any::<usize>().prop_map(|at| Damage::Truncate { at }),
    ]
}

fn apply(bytes: &mut Vec<u8>, damage: &Damage) {
    let len = bytes.len().max(1);
    match damage {
        Damage::Flip { at, mask } => {
            if let Some(b) = bytes.get_mut(at % len) {
                *b ^= mask;
            }
        }
        Damage::Delete { at, len: n } => {
            let at = at % len;
            let end = (at + n).min(bytes.len());
            if at < end {
                bytes.drain(at..end);
            }
        }
        Damage::Insert { at, bytes: more } => {
            let at = (at % len).min(bytes.len());
            bytes.splice(at..at, more.iter().copied());
        }
        Damage::Truncate { at } => bytes.truncate(at % len),
    }
}

fn fuzz_cases() -> u32 {
    if std::env::var_os("AGENTHOST_SOAK").is_some() {
        20_000
    } else {
        128
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases()))]

    /// Recorded streams, damaged (bytes flipped, cut, inserted, truncated) and split anywhere:
    /// the parsers never panic, and what they yield keeps the stream contract. Events are
    /// followed by at most one error, which comes last. There is at most one `StepFinish`. A
    /// stream that does not finish ends in an error, never silently.
    #[test]
    fn damaged_streams_keep_the_contract(
        which in 0usize..12,
        damages in prop::collection::vec(damage(), 0..6),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let (name, format, mut bytes) = fixtures().swap_remove(which);
        for d in &damages {
            apply(&mut bytes, d);
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks = Vec::new();
        let mut from = 0;
        for cut in cuts {
            chunks.push(&bytes[from..cut]);
            from = cut;
        }
        chunks.push(&bytes[from..]);
        let items = parse(format, chunks);
        let errors = items.iter().filter(|i| i.is_err()).count();
        prop_assert!(errors <= 1, "{name}: {errors} errors");
        if errors == 1 {
            prop_assert!(items.last().is_some_and(|i| i.is_err()), "{name}: the error is not last");
        }
        let finishes = items.iter().filter(|i| matches!(i, Ok(Event::StepFinish { .. }))).count();
        prop_assert!(finishes <= 1, "{name}: {finishes} finishes");
        prop_assert!(
            matches!(items.last(), Some(Err(_)) | Some(Ok(Event::StepFinish { .. }))),
            "{name}: ends with {:?}", items.last()
        );
    }

    /// Arbitrary bytes, not a stream at all: no panic, and an error at the end.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        anthropic in any::<bool>(),
    ) {
        let format = if anthropic { Format::Anthropic } else { Format::OpenAi };
        let items = parse_whole(format, &bytes);
        let ended = matches!(items.last(), Some(Err(_)) | Some(Ok(Event::StepFinish { .. })));
        prop_assert!(ended, "ends with {:?}", items.last());
    }
}
