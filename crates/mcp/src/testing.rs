//! Where the MCP test fixtures are (`tests/fixtures/mcp`, installed by `.ci/mcp-fixtures`), for
//! the tests of other crates. Without them a suite says so in one line and its tests return;
//! with `AGENTHOST_REQUIRE_SERVICES` set (as in CI) a missing fixture fails the test instead.

use std::path::PathBuf;

/// The installed fixtures.
#[derive(Debug, Clone)]
pub struct Fixtures {
    /// The virtual environment's Python, with the official `mcp` package.
    pub python: PathBuf,
    /// The fixture server (`server.py stdio`, or `server.py http 0`).
    pub server: PathBuf,
    /// `@modelcontextprotocol/server-everything`'s entry point (argument `stdio`).
    pub everything: PathBuf,
}

/// The fixtures for the tests of `suite`, or `None` (with one line on stderr) when they are not
/// installed. Found through `AGENTHOST_MCP_PYTHON` and `AGENTHOST_MCP_EVERYTHING`, or where
/// `.ci/mcp-fixtures` puts them by default.
pub fn fixtures(suite: &str) -> Option<Fixtures> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fixtures = root.join("tests/fixtures/mcp");
    let python = std::env::var_os("AGENTHOST_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/mcp-venv/bin/python"));
    let everything = std::env::var_os("AGENTHOST_MCP_EVERYTHING")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures.join("node/node_modules/.bin/mcp-server-everything"));
    if python.exists() && everything.exists() {
        return Some(Fixtures {
            python,
            server: fixtures.join("server.py"),
            everything,
        });
    }
    const REQUIRE: &str = "AGENTHOST_REQUIRE_SERVICES";
    if std::env::var_os(REQUIRE).is_some() {
        panic!(
            "{suite} needs the MCP fixtures and {REQUIRE} is set: run .ci/mcp-fixtures (it \
             installs the Python SDK and server-everything) and export what it prints"
        );
    }
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|s| s == suite) {
        said.push(suite.to_owned());
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {suite} (no MCP fixtures: run `eval \"$(.ci/mcp-fixtures)\"` first)"
        );
    }
    None
}
