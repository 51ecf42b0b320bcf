//! [`Client`]: one typed method per route of the API, over reqwest.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::events::{Events, Reconnect};
use crate::wire::{self, Data, ErrorEnvelope};

/// Deadline of an ordinary request. A `wait` adds its own timeout to it; an event stream has
/// none.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a connection may take to open (an event stream's too).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request did not get a response: connection refused or reset, a timeout.
    #[error("request failed: {0}")]
    Http(String),
    /// The server answered with an error body.
    #[error("{status}: {} ({})", .body.message, .body.kind.as_str())]
    Api { status: u16, body: wire::ErrorBody },
    /// The response was not what the API promises.
    #[error("unexpected response: {0}")]
    Decode(String),
}

impl Error {
    /// The error body's type, for an error the server answered.
    pub fn kind(&self) -> Option<wire::ErrorType> {
        match self {
            Error::Api { body, .. } => Some(body.kind),
            _ => None,
        }
    }

    pub(crate) fn http(error: reqwest::Error) -> Error {
        Error::Http(describe(&error))
    }
}

/// reqwest's error with its causes, which its `Display` leaves out.
fn describe(error: &reqwest::Error) -> String {
    agenthost_http::describe(error)
}

/// A bearer token, never printed.
#[derive(Clone)]
struct Bearer(String);

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

/// A client of one agenthost server. Cheap to clone: clones share the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    base: Url,
    token: Option<Bearer>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base_url` (`http://127.0.0.1:4096`), with its own connection
    /// pool.
    pub fn new(base_url: &str) -> Result<Client, Error> {
        let http = agenthost_http::client_builder()
            .map_err(Error::Http)?
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(Error::http)?;
        Client::with_http(base_url, http)
    }

    /// A client of the server at `base_url` over a reqwest client of the caller's.
    pub fn with_http(base_url: &str, http: reqwest::Client) -> Result<Client, Error> {
        let base = Url::parse(base_url)
            .map_err(|e| Error::Http(format!("invalid base URL {base_url:?}: {e}")))?;
        if base.cannot_be_a_base() {
            return Err(Error::Http(format!("invalid base URL {base_url:?}")));
        }
        Ok(Client {
            base,
            token: None,
            http,
        })
    }

    /// Sends `Authorization: Bearer <token>` with every request.
    pub fn with_token(mut self, token: impl Into<String>) -> Client {
        self.token = Some(Bearer(token.into()));
        self
    }

    /// The URL of `segments` under the base URL, each segment percent-encoded.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("invariant: checked in with_http that the base URL can be a base");
            path.pop_if_empty();
            path.extend(segments);
        }
        url
    }

    pub(crate) fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let builder = self.http.request(method, url);
        match &self.token {
            Some(Bearer(token)) => builder.bearer_auth(token),
            None => builder,
        }
    }

    async fn send(&self, request: RequestBuilder) -> Result<(StatusCode, Vec<u8>), Error> {
        let response = request.send().await.map_err(Error::http)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(Error::http)?;
        Ok((status, bytes.to_vec()))
    }

    /// One `/api` call: `body` as JSON when given, the `data` of the answer decoded.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&(impl Serialize + ?Sized)>,
        timeout: Duration,
    ) -> Result<T, Error> {
        let mut request = self.request(method, url).timeout(timeout);
        if let Some(body) = body {
            let bytes = serde_json::to_vec(body).map_err(|e| Error::Decode(e.to_string()))?;
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes);
        }
        let (status, bytes) = self.send(request).await?;
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &bytes));
        }
        decode::<Data<T>>(&bytes).map(|d| d.data)
    }

    async fn get<T: DeserializeOwned>(&self, url: Url) -> Result<T, Error> {
        self.call(Method::GET, url, None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        url: Url,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T, Error> {
        self.call(Method::POST, url, Some(body), REQUEST_TIMEOUT)
            .await
    }

    fn session_url(&self, id: &str, tail: &[&str]) -> Url {
        let mut segments = vec!["api", "session", id];
        segments.extend_from_slice(tail);
        self.url(&segments)
    }

    // ---------------------------------------------------------------------------------------
    // Meta.

    /// `GET /healthz`: the health, whether it is `ok` (200) or not (503).
    pub async fn health(&self) -> Result<wire::Health, Error> {
        let request = self
            .request(Method::GET, self.url(&["healthz"]))
            .timeout(REQUEST_TIMEOUT);
        let (status, bytes) = self.send(request).await?;
        match status.as_u16() {
            200 | 503 => decode(&bytes),
            other => Err(api_error(other, &bytes)),
        }
    }

    /// `GET /metrics`: the OpenMetrics text.
    pub async fn metrics(&self) -> Result<String, Error> {
        self.text(&["metrics"]).await
    }

    /// `GET /openapi.json`: the server's OpenAPI document.
    pub async fn openapi(&self) -> Result<String, Error> {
        self.text(&["openapi.json"]).await
    }

    async fn text(&self, segments: &[&str]) -> Result<String, Error> {
        let request = self
            .request(Method::GET, self.url(segments))
            .timeout(REQUEST_TIMEOUT);
        let (status, bytes) = self.send(request).await?;
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &bytes));
        }
        String::from_utf8(bytes).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `GET /api/cluster`: the nodes sharing the store and the partitions each holds.
    pub async fn cluster(&self) -> Result<wire::Cluster, Error> {
        self.get(self.url(&["api", "cluster"])).await
    }

    /// `GET /api/mcp`: the MCP servers whose tools the runtime runs, with their status.
    pub async fn mcp(&self) -> Result<Vec<wire::McpServer>, Error> {
        self.get(self.url(&["api", "mcp"])).await
    }

    // ---------------------------------------------------------------------------------------
    // Sessions.

    /// `POST /api/session`: creates a session, or returns the existing one with that id.
    pub async fn create_session(&self, body: &wire::CreateSession) -> Result<wire::Session, Error> {
        self.post(self.url(&["api", "session"]), body).await
    }

    /// `GET /api/session`: one page of sessions, newest first.
    pub async fn sessions(&self, query: &wire::ListQuery) -> Result<wire::SessionPage, Error> {
        let mut url = self.url(&["api", "session"]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(limit) = query.limit {
                pairs.append_pair("limit", &limit.to_string());
            }
            if let Some(cursor) = &query.cursor {
                pairs.append_pair("cursor", cursor);
            }
        }
        self.get(clean(url)).await
    }

    /// `GET /api/session/active`: the sessions whose drain is running, by id.
    pub async fn active(&self) -> Result<BTreeMap<String, wire::Status>, Error> {
        self.get(self.url(&["api", "session", "active"])).await
    }

    /// `GET /api/session/{id}`.
    pub async fn session(&self, id: &str) -> Result<wire::Session, Error> {
        self.get(self.session_url(id, &[])).await
    }

    /// `PATCH /api/session/{id}`: changes the session (its own budget); a session its budget
    /// blocked goes on where it stopped.
    pub async fn update_session(
        &self,
        id: &str,
        body: &wire::UpdateSession,
    ) -> Result<wire::Session, Error> {
        self.call(
            Method::PATCH,
            self.session_url(id, &[]),
            Some(body),
            REQUEST_TIMEOUT,
        )
        .await
    }

    /// `POST /api/session/{id}/prompt`: admits the input durably and returns its receipt. A
    /// retry with the same prompt id returns the original receipt.
    pub async fn prompt(&self, id: &str, body: &wire::Prompt) -> Result<wire::Admitted, Error> {
        self.post(self.session_url(id, &["prompt"]), body).await
    }

    /// `POST /api/session/{id}/resume`: wakes the session; returns once it was handed over.
    pub async fn resume(&self, id: &str) -> Result<wire::Accepted, Error> {
        self.post(self.session_url(id, &["resume"]), &wire::NoOptions {})
            .await
    }

    /// `POST /api/session/{id}/resume?wait=true`: wakes the session and waits for the drain
    /// to end.
    pub async fn resume_and_wait(&self, id: &str) -> Result<wire::DrainOutcome, Error> {
        let body = wire::ResumeQuery { wait: Some(true) };
        self.post(self.session_url(id, &["resume"]), &body).await
    }

    /// `POST /api/session/{id}/compact`: summarizes the history now.
    pub async fn compact(&self, id: &str) -> Result<wire::DrainOutcome, Error> {
        self.post(self.session_url(id, &["compact"]), &wire::NoOptions {})
            .await
    }

    /// `POST /api/session/{id}/interrupt`: stops a running drain after durable cleanup.
    pub async fn interrupt(&self, id: &str) -> Result<wire::Interrupted, Error> {
        self.post(self.session_url(id, &["interrupt"]), &wire::NoOptions {})
            .await
    }

    /// `POST /api/session/{id}/wait`: waits until the session is idle, at most `timeout`.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<wire::Idle, Error> {
        let body = wire::WaitQuery {
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        self.call(
            Method::POST,
            self.session_url(id, &["wait"]),
            Some(&body),
            REQUEST_TIMEOUT.saturating_add(timeout),
        )
        .await
    }

    /// `POST /api/session/{id}/generate`: a transient answer in the session's context, written
    /// nowhere.
    pub async fn generate(&self, id: &str, prompt: &str) -> Result<wire::Generated, Error> {
        let body = wire::Generate {
            prompt: prompt.to_owned(),
        };
        self.post(self.session_url(id, &["generate"]), &body).await
    }

    /// `GET /api/session/{id}/messages`: one page of the history, oldest first.
    pub async fn messages(
        &self,
        id: &str,
        query: &wire::MessagesQuery,
    ) -> Result<Vec<wire::Message>, Error> {
        let url = self.session_url(id, &["messages"]);
        self.get(paged(url, query.after_seq, query.limit)).await
    }

    /// `GET /api/session/{id}/inbox`: inputs admitted and not yet promoted, the first page.
    pub async fn inbox(&self, id: &str) -> Result<Vec<wire::InboxItem>, Error> {
        self.inbox_page(id, &wire::InboxQuery::default()).await
    }

    /// `GET /api/session/{id}/inbox` a page at a time: page on with the last item's
    /// `admitted_seq` as `after_seq`.
    pub async fn inbox_page(
        &self,
        id: &str,
        query: &wire::InboxQuery,
    ) -> Result<Vec<wire::InboxItem>, Error> {
        let url = self.session_url(id, &["inbox"]);
        self.get(paged(url, query.after_seq, query.limit)).await
    }

    /// `GET /api/session/{id}/tool-output/{message_id}/{call_id}`: a tool call's whole output.
    pub async fn tool_output(
        &self,
        id: &str,
        message_id: &str,
        call_id: &str,
    ) -> Result<wire::ToolOutput, Error> {
        self.get(self.session_url(id, &["tool-output", message_id, call_id]))
            .await
    }

    /// `GET /api/session/{id}/approvals`: the approvals the session waits for.
    pub async fn approvals(&self, id: &str) -> Result<Vec<wire::Approval>, Error> {
        self.get(self.session_url(id, &["approvals"])).await
    }

    /// `POST /api/session/{id}/approvals/{message_id}/{call_id}`: decides an approval once; a
    /// second decision is `approval_decided` (409) with the first, another digest
    /// `digest_mismatch` (409).
    pub async fn decide(
        &self,
        id: &str,
        message_id: &str,
        call_id: &str,
        body: &wire::Decide,
    ) -> Result<wire::ApprovalDecision, Error> {
        self.post(
            self.session_url(id, &["approvals", message_id, call_id]),
            body,
        )
        .await
    }

    /// `POST /api/session/{id}/schedules`: sets a schedule (an exact retry of an `id` returns
    /// it unchanged).
    pub async fn set_schedule(
        &self,
        id: &str,
        body: &wire::NewSchedule,
    ) -> Result<wire::Schedule, Error> {
        self.post(self.session_url(id, &["schedules"]), body).await
    }

    /// `GET /api/session/{id}/schedules`: the session's schedules with their next firings.
    pub async fn schedules(&self, id: &str) -> Result<Vec<wire::Schedule>, Error> {
        self.get(self.session_url(id, &["schedules"])).await
    }

    /// `DELETE /api/session/{id}/schedules/{schedule_id}`: cancels a schedule (idempotent).
    pub async fn cancel_schedule(
        &self,
        id: &str,
        schedule: &str,
    ) -> Result<wire::ScheduleCancelled, Error> {
        let url = self.session_url(id, &["schedules", schedule]);
        self.call(Method::DELETE, url, None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /api/session/{id}/events`: the session's event stream after seq `after` (from the
    /// start when `None`), reconnecting as [`Reconnect::default`] says. Nothing is sent until
    /// the first [`Events::next`].
    pub fn events(&self, id: &str, after: Option<u64>) -> Events {
        self.events_with(id, after, Reconnect::default())
    }

    /// [`Client::events`] with a reconnection policy of the caller's.
    pub fn events_with(&self, id: &str, after: Option<u64>, reconnect: Reconnect) -> Events {
        Events::new(
            self.clone(),
            self.session_url(id, &["events"]),
            after,
            reconnect,
        )
    }
}

/// `url` without a trailing `?` when no pair was added.
/// `url` with the paging parameters a list route takes (`after_seq`, `limit`), when given.
fn paged(mut url: Url, after_seq: Option<u64>, limit: Option<usize>) -> Url {
    {
        let mut pairs = url.query_pairs_mut();
        if let Some(after) = after_seq {
            pairs.append_pair("after_seq", &after.to_string());
        }
        if let Some(limit) = limit {
            pairs.append_pair("limit", &limit.to_string());
        }
    }
    clean(url)
}

fn clean(mut url: Url) -> Url {
    if url.query() == Some("") {
        url.set_query(None);
    }
    url
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|e| {
        Error::Decode(format!(
            "{e}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    })
}

pub(crate) fn api_error(status: u16, bytes: &[u8]) -> Error {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_percent_encoded_under_the_base_path() {
        let client = Client::new("http://127.0.0.1:1/prefix/").expect("client");
        let url = client.session_url("ses_a/b c", &["tool-output", "msg_1", "call?1"]);
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:1/prefix/api/session/ses_a%2Fb%20c/tool-output/msg_1/call%3F1"
        );
        let client = Client::new("http://127.0.0.1:1").expect("client");
        assert_eq!(
            client.url(&["healthz"]).as_str(),
            "http://127.0.0.1:1/healthz"
        );
        assert!(Client::new("not a url").is_err());
        assert!(Client::new("mailto:someone@example.invalid").is_err());
    }

    #[test]
    fn the_token_is_never_printed() {
        let client = Client::new("http://127.0.0.1:1")
            .expect("client")
            .with_token("s3cret-token");
        assert!(!format!("{client:?}").contains("s3cret"));
    }
}
