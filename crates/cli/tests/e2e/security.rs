//! Hostile clients and hostile networks against the binary: what they cannot do, and what they
//! cannot make the server spend.

use super::*;

/// `VmRSS` of a process, in bytes.
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|l| l.trim().strip_suffix("kB"))
        .and_then(|l| l.trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// An event stream whose client sends its request and never reads: a socket with a small
/// receive buffer, so the server's writes stop at once.
async fn unread_stream(addr: std::net::SocketAddr, session: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let mut stream = socket.connect(addr).await.expect("connect");
    let head = format!(
        "GET /api/session/{session}/events HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: text/event-stream\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("request");
    stream
}

/// `agenthost serve` on a free port for the unread-stream tests, with two sessions: the
/// process, a client, its address, its pid and the sessions.
async fn unread_server(
    name: &str,
    d: &std::path::Path,
) -> (Proc, Http, std::net::SocketAddr, u32, [String; 2]) {
    let data = d.join("data");
    let mut server = Proc::spawn(
        name,
        d,
        &[
            "serve",
            "--data-dir",
            data.to_str().expect("utf-8 path"),
            "--bind",
            "127.0.0.1:0",
        ],
    );
    let url = server.url();
    server.url = Some(url.clone());
    let http = Http::new(&url);
    let addr = url
        .trim_start_matches("http://")
        .parse()
        .expect("a socket address");
    let pid = server.child.id();
    let sessions = [http.session("default").await, http.session("default").await];
    (server, http, addr, pid, sessions)
}

/// Streams that never read: `n` of them, over `sessions` in turn.
async fn unread_streams(
    addr: std::net::SocketAddr,
    sessions: &[String],
    n: usize,
) -> Vec<tokio::net::TcpStream> {
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        streams.push(unread_stream(addr, &sessions[i % sessions.len()]).await);
    }
    streams
}

/// Six rounds of a 512 KiB prompt into each session, admitted without running.
async fn large_prompts(http: &Http, sessions: &[String]) {
    let big = "x".repeat(512 * 1024);
    for round in 0..6 {
        for session in sessions {
            http.post(
                &format!("/api/session/{session}/prompt"),
                Some(json!({"text": format!("{round}{big}"), "resume": false})),
            )
            .await;
        }
    }
}

/// Watches the server for `samples` × 200 ms, checking that it answers each time, and asserts
/// that its resident memory stayed within 100 MiB of `before`.
async fn stays_bounded(http: &Http, pid: u32, before: u64, samples: usize, what: &str) {
    let mut peak = 0;
    for _ in 0..samples {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(http.get("/healthz").await["status"], "ok");
        peak = peak.max(resident(pid));
    }
    let grown = peak.saturating_sub(before);
    eprintln!(
        "{what}: before {} MiB, peak {} MiB, grown {} MiB",
        before >> 20,
        peak >> 20,
        grown >> 20
    );
    assert!(
        grown < 100 << 20,
        "{what} grew the server by {} MiB",
        grown >> 20
    );
}

/// 500 event streams whose clients never read, opened on sessions whose logs already hold large
/// events: every stream's replay reads them from the store at once. What the replays hold at a
/// time is bounded, not one large event per stream, so the server stays within 100 MiB of its
/// size before the streams, and answers everyone else throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_streams_replaying_large_events_cannot_grow_the_server() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_server, http, addr, pid, sessions) = unread_server("replays", dir.path()).await;
    large_prompts(&http, &sessions).await;
    assert_eq!(http.get("/healthz").await["status"], "ok");
    let before = resident(pid);
    let streams = unread_streams(addr, &sessions, 500).await;
    let what = "500 unread streams replaying large events";
    stays_bounded(&http, pid, before, 15, what).await;
    drop(streams);
}

/// 500 event streams whose clients never read, on sessions that keep getting large input: what
/// one stream may hold is bounded in bytes, so the server stays within 100 MiB of its idle
/// size, and answers everyone else throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_event_streams_cannot_grow_the_server() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_server, http, addr, pid, sessions) = unread_server("unread", dir.path()).await;
    http.turn("warm up").await;
    let idle = resident(pid);
    let streams = unread_streams(addr, &sessions, 500).await;
    // Large input into every watched session: each admission is a frame of about 512 KiB for
    // each of its 250 streams.
    large_prompts(&http, &sessions).await;
    // The server still answers, and what it holds settles.
    stays_bounded(&http, pid, idle, 10, "500 unread streams").await;
    drop(streams);
}

/// One request over a fresh connection with the `Host` given: the status and the body.
async fn with_host(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    host: &str,
) -> (u16, String) {
    raw(addr, method, path, host, "").await
}

/// A `GET` naming `host` and claiming to be another node's forward, unsigned.
async fn with_forwarded(addr: std::net::SocketAddr, path: &str, host: &str) -> (u16, String) {
    raw(addr, "GET", path, host, "x-agenthost-forwarded-by: n9\r\n").await
}

/// One request with `extra` header lines over a fresh connection: the status and the body.
async fn raw(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    extra: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = if method == "POST" { "{}" } else { "" };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\n{extra}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("request");
    let mut answer = Vec::new();
    tokio::time::timeout(LIMIT, stream.read_to_end(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// DNS rebinding: a web page whose name now resolves to this machine sends requests the browser
/// thinks same-origin, naming the page's host. Without a token, a request naming a host the
/// server does not answer to is refused (403 `forbidden`) on every route, `/mcp` and the
/// console included; addresses, `localhost` and `[server] allowed_hosts` are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_is_refused_by_its_host() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let server = serve_with(
        d,
        "rebind",
        "allowed_hosts = [\"agents.test\", \"*.corp.test\"]",
    );
    let url = server.url();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .expect("a socket address");
    let port = addr.port();
    for (method, path) in [
        ("GET", "/api/session"),
        ("POST", "/api/session"),
        ("GET", "/console"),
        ("GET", "/healthz"),
        ("POST", "/mcp"),
    ] {
        for host in [
            "attacker.example",
            &format!("attacker.example:{port}"),
            "localhost.attacker.example",
        ] {
            let (status, body) = with_host(addr, method, path, host).await;
            assert_eq!(status, 403, "{method} {path} with Host {host}: {body}");
            let json: Value = serde_json::from_str(&body).expect("a JSON error");
            assert_eq!(json["error"]["type"], "forbidden", "{body}");
        }
    }
    // A forward names the owner's host, and passes the check to be judged by its signature,
    // which a page cannot make: refused as unsigned, not served. Nothing else is let through by
    // the header.
    let (status, body) = with_forwarded(addr, "/api/session", "attacker.example").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = with_forwarded(addr, "/metrics", "attacker.example").await;
    assert_eq!(status, 403, "{body}");
    // Nothing was created by the refused POSTs.
    let (_, listed) = with_host(addr, "GET", "/api/session", "127.0.0.1").await;
    let listed: Value = serde_json::from_str(&listed).expect("JSON");
    assert_eq!(
        listed["data"]["sessions"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "[::1]".to_owned(),
        "agents.test".to_owned(),
        format!("build.corp.test:{port}"),
    ] {
        let (status, body) = with_host(addr, "GET", "/api/session", &host).await;
        assert_eq!(status, 200, "Host {host}: {body}");
    }
}
