//! Crash consistency with a real process, through the conformance suite's crash check: a child
//! process admits, promotes and appends concurrently and reports every acknowledged admission;
//! the parent kills it with SIGKILL at a varied moment, reopens the store and checks that every
//! acknowledged admission is there and the store verifies.
//!
//! CI runs a few kills; `AGENTHOST_SOAK=1` runs many.

use std::process::{Command, Stdio};
use std::sync::Arc;

use super::*;

const CHILD_ENV: &str = "AGENTHOST_CRASH_CHILD";

/// Entry point of the child process; does nothing in a normal test run.
#[test]
fn crash_child_entry() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    crate::conformance::crash_child(|| Arc::new(open(std::path::Path::new(&dir))));
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
    crate::conformance::crash_rounds(
        rounds,
        |round| {
            Command::new(&exe)
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
                .expect("child starts")
        },
        || Arc::new(open(dir.path())),
    );
}
