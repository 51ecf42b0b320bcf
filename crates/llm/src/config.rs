//! Provider configuration ([`Config`], [`Kind`]) and construction of an `Arc<dyn Provider>`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::anthropic::Anthropic;
use crate::error::{Error, ErrorKind};
use crate::mock::Mock;
use crate::openai::OpenAi;
use crate::provider::Provider;
use crate::request::Headers;
use crate::secret::ApiKey;

/// Which wire format a configured provider speaks (`kind = "…"` in the config file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// OpenAI-compatible Chat Completions (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter, the
    /// mock server).
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// The in-process mock provider; no network.
    Mock,
}

impl FromStr for Kind {
    type Err = Error;

    fn from_str(kind: &str) -> Result<Self, Error> {
        match kind {
            "openai" => Ok(Self::Openai),
            "anthropic" => Ok(Self::Anthropic),
            "mock" => Ok(Self::Mock),
            other => Err(Error::new(
                ErrorKind::InvalidRequest,
                format!("unknown provider kind {other:?} (expected openai, anthropic or mock)"),
            )),
        }
    }
}

/// Default of [`Config::streams_per_connection`]: the fewest concurrent streams RFC 9113 asks a
/// server to allow, so that no call waits on a server that follows it.
pub const DEFAULT_STREAMS_PER_CONNECTION: usize = 100;

/// How to reach one provider. `Debug` never shows the key ([`ApiKey`]) or credential headers
/// ([`Headers`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// The wire format.
    pub kind: Kind,
    /// Base URL including the version path, e.g. `http://127.0.0.1:8080/v1`. `None` means the
    /// provider's public endpoint (`https://api.openai.com/v1`, `https://api.anthropic.com/v1`).
    pub base_url: Option<String>,
    /// The API key: `Authorization: Bearer` for OpenAI, `x-api-key` for Anthropic. Local
    /// OpenAI-compatible servers often need none.
    pub api_key: Option<ApiKey>,
    /// Headers sent with every request (a request's own headers come after and win).
    pub headers: Headers,
    /// The header carrying [`crate::Request::session_id`]; empty to send none.
    pub affinity_header: String,
    /// TCP and TLS connect timeout.
    pub connect_timeout: Duration,
    /// Longest silence tolerated while waiting for response headers or between body bytes.
    /// There is deliberately no total deadline: long generations are fine while bytes flow.
    pub idle_timeout: Duration,
    /// Speak HTTP/2 from the first byte, without negotiating it: for a plain `http://` server
    /// that serves HTTP/2 (h2c). Over TLS, HTTP/2 is negotiated anyway when the server offers
    /// it; with this set, a server that does not speak it cannot be reached.
    pub http2_prior_knowledge: bool,
    /// Calls multiplexed on one HTTP/2 connection at most; one more opens another connection
    /// (hyper alone would make it wait for the server's stream limit). Over HTTP/1.1, where
    /// each call has a connection of its own, it only splits the pool of idle connections.
    pub streams_per_connection: usize,
    /// Anthropic requires `max_tokens`; this is sent when a request has no `max_output`.
    pub default_max_output: u32,
    /// Send OpenAI's legacy `max_tokens` instead of `max_completion_tokens` (which OpenAI's
    /// reasoning models require but some older compatible servers do not know).
    pub legacy_max_tokens: bool,
    /// Behaviour of the mock provider (`kind = "mock"` only).
    pub mock: crate::mock::Config,
}

impl Config {
    /// Defaults for `kind`: public endpoint, no key, 10 s connect timeout, 180 s idle timeout
    /// (reasoning models can think quietly for minutes), HTTP/2 only where TLS negotiates it,
    /// [`DEFAULT_STREAMS_PER_CONNECTION`], `x-session-affinity`, 4096 default output tokens for
    /// Anthropic.
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            base_url: None,
            api_key: None,
            headers: Headers::new(),
            affinity_header: "x-session-affinity".to_owned(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(180),
            http2_prior_knowledge: false,
            streams_per_connection: DEFAULT_STREAMS_PER_CONNECTION,
            default_max_output: 4096,
            legacy_max_tokens: false,
            mock: crate::mock::Config::default(),
        }
    }

    /// The base URL to use, without a trailing slash.
    pub(crate) fn base_url_or(&self, default: &str) -> String {
        self.base_url
            .as_deref()
            .unwrap_or(default)
            .trim_end_matches('/')
            .to_owned()
    }

    /// Builds the configured provider.
    pub fn build(&self) -> Result<Arc<dyn Provider>, Error> {
        Ok(match self.kind {
            Kind::Openai => Arc::new(OpenAi::new(self)?),
            Kind::Anthropic => Arc::new(Anthropic::new(self)?),
            Kind::Mock => Arc::new(Mock::new(self.mock.clone())),
        })
    }
}
