//! A typed client of this API over reqwest, for programs that drive a running server (the
//! `loadtest --url` command). It speaks the same [`wire`] types the server does, so the two
//! cannot disagree about a field.

use std::collections::VecDeque;
use std::time::Duration;

use agenthost_llm::sse;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::auth::Token;
use crate::wire::{self, Data, ErrorEnvelope};

/// Deadline of an ordinary request (not of an event stream, which has none).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("request failed: {0}")]
    Http(String),
    #[error("{status}: {} ({})", .body.message, .body.kind.as_str())]
    Api { status: u16, body: wire::ErrorBody },
    #[error("unexpected response: {0}")]
    Decode(String),
}

/// A client of one server.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<Token>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base_url` (`http://127.0.0.1:4096`).
    pub fn new(base_url: &str, token: Option<Token>) -> Result<Client, Error> {
        let http = agenthost_llm::client_builder()
            .map_err(Error::Http)?
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .map_err(|e| Error::Http(e.to_string()))?;
        Ok(Client {
            base: base_url.trim_end_matches('/').to_owned(),
            token,
            http,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => builder.bearer_auth(token.expose()),
            None => builder,
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        let mut request = self.request(method, path).timeout(REQUEST_TIMEOUT);
        if let Some(body) = body {
            let bytes = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &bytes));
        }
        serde_json::from_slice::<Data<T>>(&bytes)
            .map(|d| d.data)
            .map_err(|e| Error::Decode(e.to_string()))
    }

    pub async fn create_session(&self, body: &wire::CreateSession) -> Result<wire::Session, Error> {
        self.call(reqwest::Method::POST, "/api/session", Some(body))
            .await
    }

    pub async fn session(&self, id: &str) -> Result<wire::Session, Error> {
        self.call::<(), _>(reqwest::Method::GET, &format!("/api/session/{id}"), None)
            .await
    }

    pub async fn prompt(
        &self,
        session: &str,
        body: &wire::Prompt,
    ) -> Result<wire::Admitted, Error> {
        self.call(
            reqwest::Method::POST,
            &format!("/api/session/{session}/prompt"),
            Some(body),
        )
        .await
    }

    pub async fn wait(&self, session: &str, timeout: Duration) -> Result<wire::Idle, Error> {
        let path = format!(
            "/api/session/{session}/wait?timeout_ms={}",
            timeout.as_millis()
        );
        self.call::<(), _>(reqwest::Method::POST, &path, None).await
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<wire::Message>, Error> {
        self.call::<(), _>(
            reqwest::Method::GET,
            &format!("/api/session/{session}/messages?limit=1000"),
            None,
        )
        .await
    }

    /// Opens the session's event stream after `after` (from the start when `None`).
    pub async fn events(&self, session: &str, after: Option<u64>) -> Result<Events, Error> {
        let mut path = format!("/api/session/{session}/events");
        if let Some(after) = after {
            path.push_str(&format!("?after={after}"));
        }
        let response = self
            .request(reqwest::Method::GET, &path)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| Error::Http(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.unwrap_or_default();
            return Err(api_error(status.as_u16(), &bytes));
        }
        Ok(Events {
            response,
            decoder: sse::Decoder::new(),
            frames: VecDeque::new(),
            ended: false,
        })
    }
}

fn api_error(status: u16, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorEnvelope>(bytes) {
        Ok(envelope) => Error::Api {
            status,
            body: envelope.error,
        },
        Err(_) => Error::Decode(format!(
            "status {status} with a body that is not an API error: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        )),
    }
}

/// One frame of an event stream, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Event(wire::Event),
    Synced(wire::Synced),
    Delta(wire::Delta),
    Status(wire::Status),
    Error(wire::ErrorBody),
}

/// An open event stream.
#[derive(Debug)]
pub struct Events {
    response: reqwest::Response,
    decoder: sse::Decoder,
    frames: VecDeque<sse::Frame>,
    ended: bool,
}

impl Events {
    /// The next frame; `None` when the server ended the stream.
    pub async fn next(&mut self) -> Option<Result<Frame, Error>> {
        loop {
            if let Some(frame) = self.frames.pop_front() {
                return Some(decode(&frame));
            }
            if self.ended {
                return None;
            }
            let mut out = Vec::new();
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.decoder.feed(&chunk, &mut out),
                Ok(None) => {
                    self.decoder.finish(&mut out);
                    self.ended = true;
                }
                Err(e) => {
                    self.ended = true;
                    return Some(Err(Error::Http(e.to_string())));
                }
            }
            self.frames.extend(out);
        }
    }
}

fn decode(frame: &sse::Frame) -> Result<Frame, Error> {
    fn parse<T: DeserializeOwned>(data: &str) -> Result<T, Error> {
        serde_json::from_str(data).map_err(|e| Error::Decode(format!("{e}: {data}")))
    }
    match frame.event.as_str() {
        "synced" => parse(&frame.data).map(Frame::Synced),
        "delta" => parse(&frame.data).map(Frame::Delta),
        "status" => parse(&frame.data).map(Frame::Status),
        "error" => parse(&frame.data).map(Frame::Error),
        _ => parse(&frame.data).map(Frame::Event),
    }
}
