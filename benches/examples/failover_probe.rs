//! Failover time of a cluster: three `agenthost serve` nodes over one PostgreSQL; `kills` times,
//! SIGKILL the node owning a session while its turn runs, and time how long until that session,
//! asked through a survivor, has answered a new prompt. The killed node is started again (same
//! node id) before the next round.
//!
//! `AGENTHOST_PG_URL=… cargo run --release -p agenthost-benches --example failover_probe -- [path to agenthost] [kills] [lease ttl ms]`

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Node {
    child: Child,
    url: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(bin: &str, dir: &std::path::Path, n: usize, schema: &str, ttl: u64) -> Node {
    let port = 4900 + n;
    let config = dir.join(format!("n{n}.toml"));
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\n[providers.mock]\nkind = \"mock\"\nlatency_ms = 300\n[models.default]\nprovider = \"mock\"\n[agents.default]\nmodel = \"default\"\n[store]\nkind = \"postgres\"\nschema = \"{schema}\"\n[cluster]\nnode_id = \"n{n}\"\nlease_ttl_ms = {ttl}\n",
            dir.join(format!("d{n}")).display()
        ),
    )
    .expect("config");
    let child = Command::new(bin)
        .args([
            "serve",
            "--config",
            config.to_str().expect("utf-8"),
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("n{n}.log"))).expect("log"))
        .spawn()
        .expect("serve starts");
    Node {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Value,
) -> (u16, Value) {
    match http
        .request(method, url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            let text = r.text().await.unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Which node holds each partition, from `/api/cluster`.
async fn owners(http: &reqwest::Client, url: &str) -> Vec<(String, String, Vec<u64>)> {
    let (_, cluster) = call(
        http,
        reqwest::Method::GET,
        &format!("{url}/api/cluster"),
        Value::Null,
    )
    .await;
    cluster["data"]["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter(|n| n["alive"] == true)
                .map(|n| {
                    (
                        n["id"].as_str().unwrap_or("").to_owned(),
                        n["url"].as_str().unwrap_or("").to_owned(),
                        n["partitions"]
                            .as_array()
                            .map(|p| p.iter().filter_map(Value::as_u64).collect())
                            .unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/agenthost".into());
    let kills: usize = args.get(2).map_or(20, |s| s.parse().expect("kills"));
    let ttl: u64 = args.get(3).map_or(10_000, |s| s.parse().expect("ttl"));
    std::env::var("AGENTHOST_PG_URL").expect("AGENTHOST_PG_URL names a server");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = format!("failover{}", std::process::id());
    let rt = agenthost_benches::tokio_runtime();
    let mut nodes: Vec<Node> = (0..3)
        .map(|n| start(&bin, dir.path(), n, &schema, ttl))
        .collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let mut times = Vec::new();
    rt.block_on(async {
        for round in 0..kills {
            let victim = round % 3;
            // Every node up and holding partitions.
            let deadline = Instant::now() + Duration::from_secs(120);
            while owners(&http, &nodes[(victim + 1) % 3].url)
                .await
                .iter()
                .filter(|n| !n.2.is_empty())
                .count()
                < 3
            {
                assert!(Instant::now() < deadline, "the cluster did not form");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // A session on the victim, with a turn running.
            let (status, created) = call(
                &http,
                reqwest::Method::POST,
                &format!("{}/api/session", nodes[victim].url),
                json!({}),
            )
            .await;
            assert_eq!(status, 200, "{created}");
            let s = created["data"]["id"].as_str().expect("id").to_owned();
            let (status, _) = call(
                &http,
                reqwest::Method::POST,
                &format!("{}/api/session/{s}/prompt", nodes[victim].url),
                json!({"text": "work"}),
            )
            .await;
            assert_eq!(status, 200);
            tokio::time::sleep(Duration::from_millis(100)).await;
            nodes[victim].child.kill().expect("SIGKILL");
            nodes[victim].child.wait().expect("reaped");
            let killed = Instant::now();
            let survivor = nodes[(victim + 1) % 3].url.clone();
            loop {
                let (status, reply) = call(
                    &http,
                    reqwest::Method::POST,
                    &format!("{survivor}/api/session/{s}/prompt"),
                    json!({"text": "after the kill", "id": format!("msg_01J{round:023}")}),
                )
                .await;
                if std::env::var_os("FAILOVER_DEBUG").is_some() {
                    eprintln!("{:?} {status} {reply}", killed.elapsed());
                }
                if status == 200 {
                    let (status, idle) = call(
                        &http,
                        reqwest::Method::POST,
                        &format!("{survivor}/api/session/{s}/wait?timeout_ms=60000"),
                        json!({}),
                    )
                    .await;
                    if status == 200 && idle["data"]["idle"] == true {
                        break;
                    }
                }
                assert!(killed.elapsed() < Duration::from_secs(120), "no failover");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let took = killed.elapsed();
            println!(
                "kill {round}: node n{victim}, session answered through a survivor after {took:.2?}"
            );
            times.push(took);
            nodes[victim] = start(&bin, dir.path(), victim, &schema, ttl);
        }
    });
    drop(nodes);
    times.sort();
    let ms = |d: Duration| d.as_millis();
    println!(
        "{kills} kills, lease TTL {ttl} ms: failover min {} ms, p50 {} ms, p90 {} ms, max {} ms",
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() * 9 / 10]),
        ms(times[times.len() - 1])
    );
}
