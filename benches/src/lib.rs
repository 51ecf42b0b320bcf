//! Fixtures shared by the benchmarks in `benches/`: a runtime builder and a bounded fan-out.

use std::future::Future;
use std::sync::Arc;

use agenthost_model::Timestamp;

/// The benches run on the allocator the `agenthost` binary runs on.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The tokio runtime every bench drives: two workers, like the machines the figures come from.
pub fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `f` on every item with `workers` concurrent tasks.
pub async fn concurrently<T, F, Fut>(items: Arc<Vec<T>>, workers: usize, f: F)
where
    T: Send + Sync + 'static,
    F: Fn(Arc<Vec<T>>, usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers.min(items.len()) {
        let items = items.clone();
        let f = f.clone();
        tasks.spawn(async move {
            let mut i = w;
            while i < items.len() {
                f(items.clone(), i).await;
                i += workers;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("task");
    }
}

/// Spreads a counter over the 80 bits of entropy of a minted id, so benches mint sortable ids
/// as the runtime does without a random source.
pub fn entropy(n: usize) -> u128 {
    (n as u128 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
}

/// The time and entropy of the next id of a kind, as the runtime mints ids: from the clock, in
/// minting order within a millisecond too (one `Monotonic` minter per kind), with entropy from
/// `n`.
fn next_id(minter: &std::sync::Mutex<agenthost_model::Monotonic>, n: usize) -> (Timestamp, u128) {
    // A poisoned minter only means a thread panicked between two plain assignments.
    minter
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .next(agenthost_store::system_clock(), entropy(n))
}

/// Mints a message id as the runtime mints one the client did not supply (see `next_id`).
pub fn message_id(n: usize) -> agenthost_model::MessageId {
    static MINTER: std::sync::Mutex<agenthost_model::Monotonic> =
        std::sync::Mutex::new(agenthost_model::Monotonic::new());
    let (now, bits) = next_id(&MINTER, n);
    agenthost_model::MessageId::mint(now, bits)
}

/// Mints a session id as the runtime mints one (see `next_id`).
pub fn session_id(n: usize) -> agenthost_model::SessionId {
    static MINTER: std::sync::Mutex<agenthost_model::Monotonic> =
        std::sync::Mutex::new(agenthost_model::Monotonic::new());
    let (now, bits) = next_id(&MINTER, n);
    agenthost_model::SessionId::mint(now, bits)
}

/// CPU time (user + system) from a `/proc` `stat` line, in clock ticks of 10 ms
/// (`getconf CLK_TCK` is 100 on Linux).
fn stat_cpu(stat: &str) -> std::time::Duration {
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    std::time::Duration::from_millis(ticks * 10)
}

/// CPU time of the whole process (all threads).
pub fn process_cpu() -> std::time::Duration {
    stat_cpu(&std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat"))
}

/// CPU time per thread name (threads of one name summed), to tell the store's writer threads
/// from the async workers.
pub fn thread_cpu() -> std::collections::BTreeMap<String, std::time::Duration> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let Ok(stat) = std::fs::read_to_string(task.expect("task").path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let name =
            stat[stat.find('(').expect("comm") + 1..stat.rfind(')').expect("comm")].to_owned();
        *out.entry(name).or_default() += stat_cpu(&stat);
    }
    out
}

/// Bytes this process has passed to write calls so far (`wchar` of `/proc/self/io`).
pub fn written_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.parse().ok())
        .expect("wchar")
}
