//! Fixtures shared by the benchmarks in `benches/`: a runtime builder and a bounded fan-out.

use std::future::Future;
use std::sync::Arc;

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
