//! `agenthost mcp`: agenthost as an MCP server over stdio, for MCP clients that only start
//! processes. The tools are those of `/mcp` (`agenthost_server::mcp`), calling the HTTP API of
//! the server at `--url` with the token in `--token-env`. Only MCP messages go to stdout; logs go
//! to stderr.

use agenthost_api::Client;
use anyhow::anyhow;
use rmcp::ServiceExt as _;

use crate::{Classify, Failure};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agenthost server whose sessions to drive.
    #[arg(long, default_value = "http://127.0.0.1:4096")]
    url: String,
    /// The environment variable holding the server's bearer token (`AGENTHOST_TOKEN` unless
    /// given; a variable named here must be set).
    #[arg(long)]
    token_env: Option<String>,
}

pub async fn run(args: Args) -> Result<(), Failure> {
    let mut client = Client::new(&args.url).usage()?;
    let token = match &args.token_env {
        Some(var) => Some(
            std::env::var(var)
                .ok()
                .filter(|t| !t.is_empty())
                .ok_or_else(|| Failure::Usage(anyhow!("--token-env {var}: {var} is not set")))?,
        ),
        None => std::env::var("AGENTHOST_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
    };
    if let Some(token) = token {
        client = client.with_token(token);
    }
    let service = agenthost_server::mcp::Handler::new(client)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Failure::Runtime(anyhow!("the MCP handshake on stdio failed: {e}")))?;
    service
        .waiting()
        .await
        .map_err(|e| Failure::Runtime(anyhow!("the MCP service failed: {e}")))?;
    Ok(())
}
