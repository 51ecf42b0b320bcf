//! agenthost as an MCP server, driven by clients no one here wrote: the official Python SDK's
//! client (`tests/fixtures/mcp/client.py`) and the TypeScript SDK's
//! (`tests/fixtures/mcp/node/client.mjs`), each over streamable HTTP (`/mcp`) and over stdio
//! (`agenthost mcp --url`): list the tools, create a session, prompt, wait until answered, read
//! the messages, interrupt a running turn, decide an approval, and a wrong token refused. Each
//! script starts its own servers from this build's binary. Needs the fixtures
//! (`.ci/mcp-fixtures`).

use super::*;

fn run(program: &Path, script: &Path, what: &str) {
    let output = Command::new(program)
        .arg(script)
        .env("AGENTHOST_BIN", BIN)
        .env_remove("AGENTHOST_TOKEN")
        .env_remove("AGENTHOST_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_official_python_client_drives_sessions_over_http_and_stdio() {
    let Some(f) = agenthost_mcp::testing::fixtures("the MCP server tests") else {
        return;
    };
    let script = f.server.with_file_name("client.py");
    run(&f.python, &script, "the Python MCP client");
}

#[test]
fn the_typescript_sdk_client_drives_sessions_over_http_and_stdio() {
    let Some(f) = agenthost_mcp::testing::fixtures("the MCP server tests") else {
        return;
    };
    let script = f.server.with_file_name("node").join("client.mjs");
    run(Path::new("node"), &script, "the TypeScript MCP client");
}
