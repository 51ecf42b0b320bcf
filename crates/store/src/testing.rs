//! What the tests of several crates share about the services they need: a PostgreSQL server is
//! optional for a newcomer's `cargo test --workspace` and required in CI.

/// The variable that makes a missing service a failure instead of a skip (`.ci/run` sets it).
pub const REQUIRE_SERVICES: &str = "AGENTHOST_REQUIRE_SERVICES";

/// The PostgreSQL server's URL (`AGENTHOST_PG_URL`) for the tests of `suite`, or `None` when none
/// is set: the suite then returns at once, and one line per suite and process says what was left
/// out. With [`REQUIRE_SERVICES`] set, a missing server fails the test instead.
pub fn postgres_url(suite: &str) -> Option<String> {
    if let Ok(url) = std::env::var("AGENTHOST_PG_URL") {
        return Some(url);
    }
    if std::env::var_os(REQUIRE_SERVICES).is_some() {
        panic!(
            "{suite} needs PostgreSQL and {REQUIRE_SERVICES} is set: run the tests through \
             `.ci/with-postgres cargo test --workspace` (it starts a throwaway server), or set \
             AGENTHOST_PG_URL"
        );
    }
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|s| s == suite) {
        said.push(suite.to_owned());
        // Straight to the process's stderr: the test harness captures `eprintln!`, and this line
        // is for whoever runs `cargo test`.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {suite} (no PostgreSQL: set AGENTHOST_PG_URL, or run under .ci/with-postgres)"
        );
    }
    None
}
