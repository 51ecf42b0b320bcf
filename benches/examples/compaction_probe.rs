//! The cost of one compaction against the length of the active history: sessions shaped like
//! agent work (one prompt, then a long tool loop with 1 KiB outputs) of 1 000 and 10 000
//! messages are compacted through the runtime with an instant mock provider. Reports the time of
//! `Runtime::compact` (reading the history, choosing the cut, serializing and fitting the summary
//! request, the provider call at zero latency, the commit) and the summary request's size.
//!
//! `cargo run --release -p agenthost-benches --example compaction_probe -- [samples]`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthost_actors::{Config, Runtime};
use agenthost_benches::tokio_runtime;
use agenthost_llm::{EventStream, Provider, Request};
use agenthost_model::{Delivery, Event, Finish, MessageId, Prompt, SessionId, Usage};
use agenthost_store::{NewSession, RedbStore, Store};

/// Records the size of every request, answers through the mock.
#[derive(Debug)]
struct Sized {
    inner: agenthost_llm::Mock,
    sizes: Mutex<Vec<(usize, u64)>>,
}

impl Provider for Sized {
    fn stream(&self, request: Request) -> EventStream {
        let bytes = format!("{:?}{:?}", request.system, request.messages).len();
        let tokens = agenthost_actors::prepare::estimate(&request);
        self.sizes.lock().expect("lock").push((bytes, tokens));
        self.inner.stream(request)
    }
}

fn id(prefix: &str, n: usize) -> MessageId {
    MessageId::parse(&format!("msg_{prefix}{n}")).expect("valid")
}

/// One prompt, then `messages - 1` steps that each call a tool returning 1 KiB.
async fn fill(store: &RedbStore, s: &SessionId, messages: usize) {
    store
        .create_session(NewSession {
            id: s.clone(),
            agent: "default".into(),
            model: None,
            title: None,
        })
        .await
        .expect("created");
    let prompt = id(&format!("{s}p"), 0);
    store
        .append(
            s.clone(),
            vec![
                Event::PromptAdmitted {
                    id: prompt.clone(),
                    delivery: Delivery::Steer,
                    prompt: Prompt::text("go through every file in src/ and fix the lint errors"),
                    wake: true,
                },
                Event::PromptPromoted { id: prompt },
            ],
        )
        .await
        .expect("prompt");
    let steps: Vec<usize> = (1..messages).collect();
    for chunk in steps.chunks(250) {
        let mut events = Vec::new();
        for &n in chunk {
            let a = id(&format!("{s}a"), n);
            events.extend([
                Event::StepStarted {
                    id: a.clone(),
                    step: 1,
                    agent: "default".into(),
                    model: "mock-1".into(),
                },
                Event::ToolCalled {
                    id: a.clone(),
                    call_id: "c".into(),
                    name: "read".into(),
                    input: format!("{{\"path\":\"src/file_{n}.rs\"}}"),
                },
                Event::ToolSucceeded {
                    id: a.clone(),
                    call_id: "c".into(),
                    output: format!("// file {n}\n{}", "let x = 1;\n".repeat(93)),
                    truncated: false,
                },
                Event::StepEnded {
                    id: a,
                    finish: Finish::ToolCalls,
                    usage: Usage::default(),
                },
            ]);
        }
        store.append(s.clone(), events).await.expect("steps");
    }
}

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map_or(5, |s| s.parse().expect("a number"));
    let rt = tokio_runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.redb");
        let sizes = [1_000usize, 10_000];
        {
            let store = RedbStore::open(agenthost_store::Config::new(&path)).expect("store");
            for messages in sizes {
                for k in 0..samples {
                    let s = SessionId::parse(&format!("ses_c{messages}x{k}")).expect("id");
                    fill(&store, &s, messages).await;
                }
            }
            store.close();
        }
        let provider = Arc::new(Sized {
            inner: agenthost_llm::Mock::new(agenthost_llm::mock::Config {
                latency: Duration::ZERO,
                tokens_per_second: 0.0,
                tool_call_ratio: 0.0,
                reply_tokens: 200,
                seed: 1,
            }),
            sizes: Mutex::default(),
        });
        let mut config = Config::new(&path).with_provider("mock", provider.clone());
        config.compaction.auto = false;
        let runtime = Runtime::start(config).await.expect("runtime");
        runtime.recovered().await;
        println!("messages  compact p50     max        request bytes  request tokens (est.)");
        for messages in sizes {
            let mut times = Vec::new();
            for k in 0..samples {
                let s = SessionId::parse(&format!("ses_c{messages}x{k}")).expect("id");
                let start = Instant::now();
                runtime.compact(&s).await.expect("compacted");
                times.push(start.elapsed());
            }
            times.sort();
            let (bytes, tokens) = *provider
                .sizes
                .lock()
                .expect("lock")
                .last()
                .expect("a request");
            println!(
                "{messages:>8}  {:>10.1?}  {:>10.1?}  {bytes:>13}  {tokens:>21}",
                times[times.len() / 2],
                times[times.len() - 1],
            );
        }
        runtime.shutdown().await;
    });
}
