//! SSE parse throughput: bytes of a provider stream to `llm::Event`s, for a
//! long OpenAI Chat Completions stream and a long Anthropic Messages stream, each 5000 deltas of
//! text plus a tool call with fragmented arguments, fed in 1400-byte chunks as a network
//! delivers them. Reported both as bytes/s and as events/s.

use agenthost_llm::{Output, anthropic, openai};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const DELTAS: usize = 5000;
const CHUNK: usize = 1400;
const WORDS: [&str; 8] = [
    " the", " agent", " reads", " olá", " a", " file", " —", " done",
];

fn openai_stream() -> Vec<u8> {
    let mut out = String::new();
    let head = r#"{"id":"chatcmpl-CRdz8RCAgBM561aJOMPL9YeHB957W","object":"chat.completion.chunk","created":1760704594,"model":"gpt-5-2025-08-07","service_tier":"default","system_fingerprint":null,"choices":[{"index":0,"delta":"#;
    let tail = |finish: &str| {
        format!(
            r#","logprobs":null,"finish_reason":{finish}}}],"usage":null,"obfuscation":"x2Y1eWqda"}}"#
        )
    };
    out.push_str(&format!(
        "data: {head}{{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}}{}\n\n",
        tail("null")
    ));
    for n in 0..DELTAS {
        let word = WORDS[n % WORDS.len()];
        out.push_str(&format!(
            "data: {head}{{\"content\":\"{word}\"}}{}\n\n",
            tail("null")
        ));
    }
    out.push_str(&format!(
        "data: {head}{{\"tool_calls\":[{{\"index\":0,\"id\":\"call_4ebZx1iZmHY4sPZ1h1iMHaWD\",\"type\":\"function\",\"function\":{{\"name\":\"add\",\"arguments\":\"\"}}}}]}}{}\n\n",
        tail("null")
    ));
    for fragment in ["{\\\"a\\\"", ": 2, ", "\\\"b\\\": 3", "}"]
        .iter()
        .cycle()
        .take(200)
    {
        out.push_str(&format!(
            "data: {head}{{\"tool_calls\":[{{\"index\":0,\"function\":{{\"arguments\":\"{fragment}\"}}}}]}}{}\n\n",
            tail("null")
        ));
    }
    out.push_str(&format!("data: {head}{{}}{}\n\n", tail("\"stop\"")));
    out.push_str(r#"data: {"id":"chatcmpl-CRdz8RCAgBM561aJOMPL9YeHB957W","object":"chat.completion.chunk","created":1760704594,"model":"gpt-5-2025-08-07","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":5275,"total_tokens":5294,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":64}}}"#);
    out.push_str("\n\ndata: [DONE]\n\n");
    out.into_bytes()
}

fn anthropic_stream() -> Vec<u8> {
    let mut out = String::new();
    out.push_str("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01LA3hHsa4pzM8hT7PTXtJGz\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-20250514\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":16,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":4}}}\n\n");
    out.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    for n in 0..DELTAS {
        if n % 100 == 0 {
            out.push_str("event: ping\ndata: {\"type\": \"ping\"}\n\n");
        }
        let word = WORDS[n % WORDS.len()];
        out.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{word}\"}}     }}\n\n"));
    }
    out.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    out.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01NRLabsLyVHZPKxbKvkfSMn\",\"name\":\"add\",\"input\":{}}}\n\n");
    for fragment in ["{\\\"a\\\"", ": 2, ", "\\\"b\\\": 3", "}"]
        .iter()
        .cycle()
        .take(200)
    {
        out.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{fragment}\"}}}}\n\n"));
    }
    out.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
    );
    out.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":5275}}\n\n");
    out.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    out.into_bytes()
}

fn parse_openai(bytes: &[u8], out: &mut Output) -> usize {
    out.clear();
    let mut parser = openai::Parser::new();
    for chunk in bytes.chunks(CHUNK) {
        parser.feed(chunk, out);
    }
    parser.finish(out);
    out.len()
}

fn parse_anthropic(bytes: &[u8], out: &mut Output) -> usize {
    out.clear();
    let mut parser = anthropic::Parser::new();
    for chunk in bytes.chunks(CHUNK) {
        parser.feed(chunk, out);
    }
    parser.finish(out);
    out.len()
}

type Parse = fn(&[u8], &mut Output) -> usize;

fn bench(c: &mut Criterion) {
    let streams: [(&str, Vec<u8>, Parse); 2] = [
        ("openai", openai_stream(), parse_openai),
        ("anthropic", anthropic_stream(), parse_anthropic),
    ];
    let mut out = Vec::new();
    for (name, bytes, parse) in &streams {
        let events = parse(bytes, &mut out);
        assert!(
            out.iter().all(Result::is_ok),
            "{name}: the synthetic stream parses cleanly"
        );
        assert!(events > DELTAS, "{name}: {events} events");
        let mut group = c.benchmark_group("sse_parse_bytes");
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(*name, |b| {
            b.iter(|| parse(std::hint::black_box(bytes), &mut out))
        });
        group.finish();
        let mut group = c.benchmark_group("sse_parse_events");
        group.throughput(Throughput::Elements(events as u64));
        group.bench_function(*name, |b| {
            b.iter(|| parse(std::hint::black_box(bytes), &mut out))
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
