//! Crash consistency with a real process: a child process admits, promotes and
//! appends concurrently and reports every acknowledged admission; the parent kills it with
//! SIGKILL at a random moment, reopens the store and checks that every acknowledged admission is
//! there, nothing partial is visible, and the projections equal a replay of the log.
//!
//! CI runs a few kills; `AGENTHOST_SOAK=1` runs many.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use agenthost_model::promotion::Boundary;
use agenthost_model::{Event, IndexEntry, MessageId, Seq, SessionId};

use super::*;

const CHILD_ENV: &str = "AGENTHOST_CRASH_CHILD";

/// Entry point of the child process; does nothing in a normal test run.
#[test]
fn crash_child_entry() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let round: u32 = std::env::var("AGENTHOST_CRASH_ROUND")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let store = Arc::new(open(std::path::Path::new(&dir)));
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    let s = sid(&format!("w{w}"));
                    store.create_session(new_session(&s)).await.expect("create");
                    for i in 0.. {
                        let id = mid(&format!("r{round}w{w}i{i}"));
                        let receipt = store
                            .admit(admission(&s, &id, "work"))
                            .await
                            .expect("admit");
                        {
                            let mut out = std::io::stdout().lock();
                            writeln!(out, "ack {s} {id} {}", receipt.admitted_seq).expect("stdout");
                            out.flush().expect("flush");
                        }
                        if i % 3 == 0 {
                            store
                                .promote(s.clone(), Boundary::Idle)
                                .await
                                .expect("promote");
                        }
                        if i % 5 == 0 {
                            let events = vec![
                                Event::ExecutionStarted { forced: false },
                                Event::UsageRecorded {
                                    usage: Default::default(),
                                },
                            ];
                            store.append(s.clone(), events).await.expect("append");
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.expect("worker");
        }
    });
}

fn parse_ack(line: &str) -> Option<(SessionId, MessageId, Seq)> {
    let mut parts = line.strip_prefix("ack ")?.split(' ');
    let s = SessionId::parse(parts.next()?).ok()?;
    let id = MessageId::parse(parts.next()?).ok()?;
    let seq = parts.next()?.parse().ok()?;
    Some((s, id, Seq(seq)))
}

#[test]
fn acknowledged_admissions_survive_sigkill() {
    let rounds = if std::env::var_os("AGENTHOST_SOAK").is_some() {
        40
    } else {
        3
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let mut acked: BTreeMap<MessageId, (SessionId, Seq)> = BTreeMap::new();
    // A fixed LCG keeps kill points varied but reproducible.
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..rounds {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let kill_after = 5 + (rng >> 33) % 400;
        let mut child = Command::new(&exe)
            .args([
                "tests::crash::crash_child_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .env("AGENTHOST_CRASH_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("child starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(ack) = parse_ack(&line)
                    && tx.send(ack).is_err()
                {
                    break;
                }
            }
        });
        let mut seen = 0;
        while seen < kill_after {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok((s, id, seq)) => {
                    acked.insert(id, (s, seq));
                    seen += 1;
                }
                Err(_) => panic!("the child stopped acknowledging (round {round})"),
            }
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        reader.join().expect("reader");
        // Acks printed before the kill are acknowledged too.
        for (s, id, seq) in rx.try_iter() {
            acked.insert(id, (s, seq));
        }

        let store = open(dir.path());
        let snap = store.snapshot().expect("snapshot");
        for (id, (s, seq)) in &acked {
            match snap.index(id).expect("index") {
                Some(IndexEntry::Prompt {
                    session,
                    admitted_seq,
                    ..
                }) => {
                    assert_eq!((&session, admitted_seq), (s, *seq), "{id} moved");
                }
                other => panic!("acknowledged {id} lost after SIGKILL in round {round}: {other:?}"),
            }
        }
        assert_replay_equal(&store);
    }
    assert!(acked.len() as u64 >= 5 * rounds, "the child made progress");
}
