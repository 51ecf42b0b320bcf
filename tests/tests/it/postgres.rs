//! The runtime over PostgreSQL: what a store shared by several nodes changes for a drain.
//!
//! Needs `AGENTHOST_PG_URL` (`.ci/with-postgres` starts a throwaway server); without it they say
//! so in one line and return, unless `AGENTHOST_REQUIRE_SERVICES` is set (as in CI).

use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{CreateSession, PromptRequest, Runtime};
use agenthost_llm::scripted::Scripted;
use agenthost_store::PgConfig;

use crate::harness::{self, text};

fn pg_url() -> Option<String> {
    agenthost_store::testing::postgres_url("the runtime's PostgreSQL tests")
}

/// A drain's store reads wait on the network and on a bounded pool of connections, so they run
/// on the blocking pool, never on a runtime thread. On a runtime of one thread, a turn whose
/// reads wait for the pool's only connection completes once a task of that same thread gives
/// the connection back; a read that held the thread would wait out the pool's timeout instead.
#[test]
fn a_drains_store_reads_never_hold_a_runtime_thread() {
    let Some(url) = pg_url() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let dir = tempfile::tempdir().expect("tempdir");
        let provider = Arc::new(Scripted::new([text("warmed up"), text("answered")]));
        let mut config = harness::config(dir.path(), provider.clone());
        let mut pg = PgConfig::new(url);
        pg.schema = format!(
            "it_reads_{}_{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        pg.pool_size = 1;
        config.store.postgres = Some(pg);
        let runtime = Runtime::start(config).await.expect("start");
        runtime.recovered().await;
        let s = runtime
            .create_session(CreateSession::default())
            .await
            .expect("session")
            .id;
        // A first turn, so the session's actor is live and the next drain starts at once.
        runtime
            .prompt(PromptRequest::new(&s, "warm up"))
            .await
            .expect("admitted");
        runtime
            .wait_idle(&s, Duration::from_secs(30))
            .await
            .expect("idle");
        // The pool's only snapshot connection, held by this thread's own task for a moment.
        let held = runtime.snapshot().expect("snapshot");
        tokio::task::spawn_local(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        });
        let mut prompt = PromptRequest::new(&s, "hello");
        prompt.resume = false;
        runtime.prompt(prompt).await.expect("admitted");
        // The drain's outcome: a read that held the thread would have failed the drain once the
        // pool's wait ran out.
        let outcome = runtime.resume(&s).await;
        assert_eq!(
            outcome,
            Ok(agenthost_actors::Outcome::Completed { steps: 1 }),
            "the drain's reads waited without holding the thread"
        );
        assert_eq!(provider.calls(), 2, "both turns ran");
        let row = runtime
            .snapshot()
            .expect("snapshot")
            .session(&s)
            .expect("read")
            .expect("row");
        assert!(row.claim.is_none(), "{row:?}");
        assert_eq!(row.pending, 0, "{row:?}");
        runtime.shutdown().await;
    });
}
