//! The route handlers of the HTTP API (except the event stream, in `crate::events`). Each handler
//! parses its input with [`crate::extract`], calls the runtime, and wraps the result as
//! `{"data": …}`; every failure is an [`ApiError`].
//!
//! Not here yet: `POST /api/session/{id}/compact` arrives with compaction in the runtime.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agenthost_actors::{CreateSession, Error, PromptRequest};
use agenthost_model::{
    Delivery, FileAttachment, MessageId, Prompt, Seq, SessionId, SessionRow, Timestamp,
};
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use crate::error::{ApiError, ErrorType};
use crate::extract::{Json, Query, RouteOptions, SessionPath, id_in_path, session_in_path};
use crate::wire::{self, Data, ErrorEnvelope};
use crate::{Shared, read};

type AppState = State<Arc<Shared>>;

/// Default and largest page sizes.
const SESSIONS_PAGE: usize = 50;
const MESSAGES_PAGE: usize = 100;
/// Prompt bytes after which a page of the inbox ends (at least one input is in it).
const INBOX_PAGE_BYTES: usize = 4 * 1024 * 1024;
const MAX_PAGE: usize = 1000;
/// Default `timeout_ms` of `wait`.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// The `/api` routes (state still to be supplied).
pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/session", post(create).get(list))
        .route("/api/session/active", get(active))
        .route("/api/session/{id}", get(session).patch(update))
        .route("/api/session/{id}/prompt", post(prompt))
        .route("/api/session/{id}/resume", post(resume))
        .route("/api/session/{id}/interrupt", post(interrupt))
        .route("/api/session/{id}/wait", post(wait))
        .route("/api/session/{id}/generate", post(generate))
        .route("/api/session/{id}/compact", post(compact))
        .route("/api/session/{id}/messages", get(messages))
        .route("/api/session/{id}/inbox", get(inbox))
        .route(
            "/api/session/{id}/tool-output/{message_id}/{call_id}",
            get(tool_output),
        )
        .route("/api/session/{id}/events", get(crate::events::stream))
        .route("/api/session/{id}/approvals", get(approvals))
        .route(
            "/api/session/{id}/schedules",
            post(set_schedule).get(schedules),
        )
        .route(
            "/api/session/{id}/schedules/{schedule_id}",
            axum::routing::delete(cancel_schedule),
        )
        .route(
            "/api/session/{id}/approvals/{message_id}/{call_id}",
            post(decide),
        )
        .route("/api/cluster", get(cluster))
        .route("/api/mcp", get(mcp))
}

/// The nodes sharing the store and the partitions each holds, as this node last read the lease
/// table (refreshed every third of the lease TTL). On the embedded store: this one node.
#[utoipa::path(get, path = "/api/cluster", operation_id = "cluster", tag = "meta",
    responses(
        (status = 200, description = "The cluster", body = Data<wire::Cluster>),
        (status = 401, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn cluster(State(shared): AppState) -> Response {
    let Some(ownership) = shared.runtime.store().ownership() else {
        return data(wire::Cluster {
            store: "redb".into(),
            node: "local".into(),
            partitions: 1,
            nodes: vec![wire::ClusterNode {
                id: "local".into(),
                url: String::new(),
                alive: true,
                partitions: vec![0],
            }],
        });
    };
    let view = ownership.view();
    data(wire::Cluster {
        store: "postgres".into(),
        node: view.node,
        partitions: view.partitions,
        nodes: view
            .nodes
            .into_iter()
            .map(|n| wire::ClusterNode {
                id: n.id,
                url: n.url,
                alive: n.alive,
                partitions: n.partitions,
            })
            .collect(),
    })
}

/// The MCP servers whose tools the runtime runs, with their status, tools, last error,
/// restarts and stderr tail. Empty without `[mcp]` servers.
#[utoipa::path(get, path = "/api/mcp", operation_id = "mcp", tag = "meta",
    responses(
        (status = 200, description = "The MCP servers, in configuration order", body = Data<Vec<wire::McpServer>>),
        (status = 401, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn mcp(State(shared): AppState) -> Response {
    let servers = shared.options.mcp.as_ref().map_or_else(Vec::new, |mcp| {
        mcp.status().into_iter().map(mcp_server).collect()
    });
    data(servers)
}

fn mcp_server(s: agenthost_mcp::ServerStatus) -> wire::McpServer {
    use agenthost_mcp::State;
    wire::McpServer {
        name: s.name,
        transport: s.transport.to_owned(),
        trusted: s.trusted,
        status: match s.state {
            State::Starting => wire::McpStatus::Starting,
            State::Ready => wire::McpStatus::Ready,
            State::Failed => wire::McpStatus::Failed,
            State::Restarting => wire::McpStatus::Restarting,
        },
        tools: s
            .tools
            .into_iter()
            .map(|t| wire::McpTool {
                name: t.name,
                original: t.original,
                description: t.description,
                read_only: t.read_only,
                idempotent: t.idempotent,
                destructive: t.destructive,
                reruns: t.reruns,
            })
            .collect(),
        last_error: s.last_error,
        restarts: s.restarts,
        stderr: s.stderr,
    }
}

/// A JSON response with `status`.
pub(crate) fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        // Our wire types serialize infallibly (string keys, no custom serializers); this arm
        // exists only so a future mistake is a 500, not a panic.
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot serialize the response: {e}"),
        )
            .into_response(),
    }
}

/// `{"data": payload}` with 200.
pub(crate) fn data<T: Serialize>(payload: T) -> Response {
    json_response(StatusCode::OK, &Data { data: payload })
}

fn status(shared: &Shared, id: &SessionId) -> wire::StatusType {
    wire::status(shared.runtime.activity(id))
}

/// Reads the session row or fails `session_not_found`.
async fn row(shared: &Shared, id: &SessionId) -> Result<SessionRow, ApiError> {
    let id = id.clone();
    read(shared, move |snap| {
        snap.session(&id)?
            .ok_or_else(|| Error::SessionNotFound(id.clone()).into())
    })
    .await
}

/// Liveness: `ok`; `disk_full` while the disk refuses writes (reads work); 503 `store_failed`
/// once an I/O error stopped writes until a restart; 503 `shutting_down` once shutdown began.
/// Not under `/api`, never needs the token, and is not wrapped in `data`.
#[utoipa::path(get, path = "/healthz", operation_id = "health", tag = "meta",
    responses(
        (status = 200, description = "Serving (`ok`, or `disk_full` with reads only)", body = wire::Health),
        (status = 503, description = "Shutting down, writes stopped by an I/O error (`store_failed`), or the shared database unreachable (`store_unreachable`)", body = wire::Health),
    ))]
pub(crate) async fn healthz(State(shared): AppState) -> Response {
    let (status, state, reason) = match shared.runtime.store().health() {
        _ if shared.closing.is_cancelled() => {
            (StatusCode::SERVICE_UNAVAILABLE, "shutting_down", None)
        }
        agenthost_store::Health::Ok => (StatusCode::OK, "ok", None),
        // What the state means for a client; the store's own error text (paths, addresses) is
        // in the log, where the store reported it when it happened.
        agenthost_store::Health::DiskFull(_) => (
            StatusCode::OK,
            "disk_full",
            Some("the disk of the store is full: writes are refused until there is space"),
        ),
        agenthost_store::Health::Failed(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store_failed",
            Some("a write to the store failed: writes are refused until a restart (see the log)"),
        ),
        agenthost_store::Health::Unreachable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unreachable",
            Some("the database cannot be reached: reads and writes resume once it is back"),
        ),
    };
    json_response(
        status,
        &wire::Health {
            status: state.into(),
            reason: reason.map(str::to_owned),
        },
    )
}

/// Creates a session, or returns the existing session when `id` names one.
#[utoipa::path(post, path = "/api/session", operation_id = "createSession", tag = "session",
    request_body(content = wire::CreateSession, description = "All fields optional; no body, an empty body and `{}` are the same. `id`, `agent`, `model` and `title` may be query parameters instead; the body wins"),
    responses(
        (status = 200, description = "The session", body = Data<wire::Session>),
        (status = 400, description = "Invalid id, unknown agent or model, malformed body", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn create(
    State(shared): AppState,
    RouteOptions(body): RouteOptions<wire::CreateSession>,
) -> Result<Response, ApiError> {
    let id = body.id.as_deref().map(SessionId::parse).transpose()?;
    let row = shared
        .runtime
        .create_session(CreateSession {
            id,
            agent: body.agent,
            model: body.model,
            title: body.title,
            budget: body.budget.as_ref().map(budget).transpose()?,
        })
        .await?;
    Ok(data(info(&shared, &row)))
}

/// A wire budget as the runtime's, or `invalid_request` naming the field.
fn budget(budget: &wire::Budget) -> Result<agenthost_model::Budget, ApiError> {
    agenthost_model::Budget::try_from(budget).map_err(ApiError::invalid)
}

/// A session as the API shows it: its row, what it is doing, and its budget.
fn info(shared: &Shared, row: &SessionRow) -> wire::Session {
    wire::Session::from_row(row, status(shared, &row.id))
        .with_budget(row, &shared.runtime.budget_of(row))
}

/// Changes a session: its own budget (replacing the one it had). A session the budget blocked
/// goes on where it stopped, its next call checked against the new budget.
#[utoipa::path(patch, path = "/api/session/{id}", operation_id = "updateSession", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    request_body = wire::UpdateSession,
    responses(
        (status = 200, description = "The session, changed", body = Data<wire::Session>),
        (status = 400, description = "Malformed body or budget", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn update(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    Json(body): Json<wire::UpdateSession>,
) -> Result<Response, ApiError> {
    let row = row(&shared, &id).await?;
    let row = match &body.budget {
        Some(b) => shared.runtime.set_budget(&id, budget(b)?).await?,
        None => row,
    };
    Ok(data(info(&shared, &row)))
}

/// Sessions, newest first, one page at a time.
#[utoipa::path(get, path = "/api/session", operation_id = "listSessions", tag = "session",
    params(wire::ListQuery),
    responses(
        (status = 200, description = "One page of sessions", body = Data<wire::SessionPage>),
        (status = 400, description = "Bad limit or cursor", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn list(
    State(shared): AppState,
    Query(query): Query<wire::ListQuery>,
) -> Result<Response, ApiError> {
    let limit = page_size(query.limit, SESSIONS_PAGE)?;
    let cursor = query.cursor.as_deref().map(parse_cursor).transpose()?;
    let mut rows = read(&shared, move |snap| Ok(snap.sessions(cursor, limit + 1)?)).await?;
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| format!("{}.{}", r.created.0, r.id))
    } else {
        None
    };
    let sessions = rows.iter().map(|r| info(&shared, r)).collect();
    Ok(data(wire::SessionPage {
        sessions,
        cursor: wire::Cursor { next },
    }))
}

fn page_size(limit: Option<usize>, default: usize) -> Result<usize, ApiError> {
    match limit {
        None => Ok(default),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_PAGE}, got {n}"
        ))),
    }
}

/// A cursor is `<created ms>.<session id>` of the last session of the previous page.
fn parse_cursor(raw: &str) -> Result<(Timestamp, SessionId), ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "invalid cursor {raw:?}: pass `cursor.next` as given"
        ))
    };
    let (created, id) = raw.split_once('.').ok_or_else(bad)?;
    let created = created.parse::<u64>().map_err(|_| bad())?;
    let id = SessionId::parse(id).map_err(|_| bad())?;
    Ok((Timestamp(created), id))
}

/// Sessions with a drain in progress in this process.
#[utoipa::path(get, path = "/api/session/active", operation_id = "activeSessions", tag = "session",
    responses(
        (status = 200, description = "Map of running session ids", body = Data<BTreeMap<String, wire::Status>>),
        (status = 401, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn active(State(shared): AppState) -> Response {
    let map: BTreeMap<String, wire::Status> = shared
        .runtime
        .active()
        .into_iter()
        .map(|id| (id.to_string(), wire::Status::new(true)))
        .collect();
    data(map)
}

/// One session with its usage, status and last seq.
#[utoipa::path(get, path = "/api/session/{id}", operation_id = "getSession", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "The session", body = Data<wire::Session>),
        (status = 401, body = ErrorEnvelope),
        (status = 404, description = "No such session", body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn session(
    State(shared): AppState,
    SessionPath(id): SessionPath,
) -> Result<Response, ApiError> {
    let row = row(&shared, &id).await?;
    Ok(data(info(&shared, &row)))
}

/// Admits a prompt durably and idempotently and, unless `resume` is false, wakes the
/// session. Returns once the input is durable.
#[utoipa::path(post, path = "/api/session/{id}/prompt", operation_id = "prompt", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    request_body = wire::Prompt,
    responses(
        (status = 200, description = "The admission receipt (the original one for an exact retry)", body = Data<wire::Admitted>),
        (status = 400, description = "Empty prompt, bad id, unknown delivery, malformed body", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 409, description = "The id was used with another prompt, delivery or session", body = ErrorEnvelope),
        (status = 413, description = "Prompt over the size limit", body = ErrorEnvelope),
        (status = 503, description = "Too many pending inputs, or shutting down", body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn prompt(
    State(shared): AppState,
    SessionPath(session): SessionPath,
    Json(body): Json<wire::Prompt>,
) -> Result<Response, ApiError> {
    let id = body.id.as_deref().map(MessageId::parse).transpose()?;
    let delivery = match body.delivery {
        None | Some(wire::Delivery::Steer) => Delivery::Steer,
        Some(wire::Delivery::Queue) => Delivery::Queue,
    };
    let prompt = Prompt {
        text: body.text,
        files: body
            .files
            .into_iter()
            .map(|f| FileAttachment {
                mime: f.mime,
                url: f.url,
                filename: f.filename,
            })
            .collect(),
    };
    let receipt = shared
        .runtime
        .prompt(PromptRequest {
            session,
            id,
            prompt,
            delivery,
            resume: body.resume.unwrap_or(true),
        })
        .await?;
    Ok(data(wire::admitted(&receipt)))
}

/// Compacts the session's active history now: the older part becomes a summary, the recent part
/// stays verbatim. Refused while a drain runs (409 `session_busy`: it is the session that is
/// busy, not the server) and when there is nothing to compact (400, no provider call).
#[utoipa::path(post, path = "/api/session/{id}/compact", operation_id = "compact", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "The compaction outcome", body = Data<wire::DrainOutcome>),
        (status = 400, description = "Nothing to compact, or a malformed request", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 409, description = "A drain is running, or a previous run's work is not recovered yet (`session_busy`)", body = ErrorEnvelope),
        (status = 402, description = "The summary's call could pass the session's budget (`budget_exhausted`)", body = ErrorEnvelope),
        (status = 502, description = "The summary request failed", body = ErrorEnvelope),
        (status = 503, description = "Overloaded, or the runtime is shutting down", body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn compact(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    _: RouteOptions<wire::NoOptions>,
) -> Result<Response, ApiError> {
    let kept_from = shared.runtime.compact(&id).await?;
    Ok(data(wire::DrainOutcome::Compacted {
        kept_from: kept_from.0,
    }))
}

/// Starts a forced drain or joins the running one. Without `wait`, answers 202 as soon as the
/// session holds the request (a `wait` sent after the 202 sees its drain); with `wait=true`,
/// answers with the drain's outcome (or its error).
#[utoipa::path(post, path = "/api/session/{id}/resume", operation_id = "resume", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"), wire::ResumeQuery),
    responses(
        (status = 200, description = "With `wait=true`: how the drain ended", body = Data<wire::DrainOutcome>),
        (status = 202, description = "Without `wait`: the resume was handed to the session", body = Data<wire::Accepted>),
        (status = 400, body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 422, description = "History does not fit the context window", body = ErrorEnvelope),
        (status = 500, description = "The drain panicked", body = ErrorEnvelope),
        (status = 502, description = "The provider failed", body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn resume(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    RouteOptions(query): RouteOptions<wire::ResumeQuery>,
) -> Result<Response, ApiError> {
    if query.wait.unwrap_or(false) {
        let outcome = shared.runtime.resume(&id).await?;
        return Ok(data(wire::outcome(outcome)));
    }
    row(&shared, &id).await?;
    if shared.closing.is_cancelled() {
        return Err(Error::ShuttingDown.into());
    }
    // The 202 goes once the session's actor holds the request, so that a wait or anything else
    // asked after it is queued behind it. The drain belongs to the actor; this task only logs
    // the outcome nobody waits for. The tracker lets shutdown wait for it.
    let outcome = shared.runtime.start_resume(&id).await?;
    shared.tasks.spawn(async move {
        match outcome.await {
            Ok(outcome) => tracing::debug!(session_id = %id, ?outcome, "resume finished"),
            // The drain stopped with the server; the next start resumes what it owed.
            Err(Error::ShuttingDown) => {
                tracing::debug!(session_id = %id, "resume ended by shutdown")
            }
            Err(e) => tracing::warn!(session_id = %id, error = %e, "resume failed"),
        }
    });
    Ok(json_response(
        StatusCode::ACCEPTED,
        &Data {
            data: wire::Accepted {
                status: "accepted".into(),
            },
        },
    ))
}

/// Interrupts the running drain and answers after its durable cleanup.
#[utoipa::path(post, path = "/api/session/{id}/interrupt", operation_id = "interrupt", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "Whether a drain was running", body = Data<wire::Interrupted>),
        (status = 400, body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn interrupt(
    State(shared): AppState,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    SessionPath(id): SessionPath,
    _: RouteOptions<wire::NoOptions>,
) -> Result<Response, ApiError> {
    row(&shared, &id).await?;
    // A named token's interrupt is recorded as its own.
    let by = caller.and_then(|c| c.0.name);
    let interrupted = shared.runtime.interrupt_by(&id, by).await?;
    Ok(data(wire::Interrupted { interrupted }))
}

/// Returns when the session has no drain and no follow-up pending, or when `timeout_ms` passed
/// (then `idle` is false).
#[utoipa::path(post, path = "/api/session/{id}/wait", operation_id = "waitIdle", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"), wire::WaitQuery),
    responses(
        (status = 200, description = "Idle, or not idle when the timeout passed", body = Data<wire::Idle>),
        (status = 400, description = "timeout_ms over the limit", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn wait(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    RouteOptions(query): RouteOptions<wire::WaitQuery>,
) -> Result<Response, ApiError> {
    let timeout = match query.timeout_ms {
        None => DEFAULT_WAIT.min(shared.options.max_wait),
        Some(ms) if Duration::from_millis(ms) <= shared.options.max_wait => {
            Duration::from_millis(ms)
        }
        Some(ms) => {
            return Err(ApiError::invalid(format!(
                "timeout_ms {ms} is over the limit of {} ms",
                shared.options.max_wait.as_millis()
            )));
        }
    };
    match shared.runtime.wait_idle(&id, timeout).await {
        Ok(()) => Ok(data(wire::Idle { idle: true })),
        // The timeout we passed elapsed: a normal answer for a long poll, not a failure.
        Err(Error::Timeout { .. }) => Ok(data(wire::Idle { idle: false })),
        Err(e) => Err(e.into()),
    }
}

/// A transient, session-aware, one-shot model call; nothing is recorded.
#[utoipa::path(post, path = "/api/session/{id}/generate", operation_id = "generate", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    request_body = wire::Generate,
    responses(
        (status = 200, description = "The model's answer (possibly empty)", body = Data<wire::Generated>),
        (status = 400, description = "Empty prompt, malformed body", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 402, description = "The call could pass the session's budget (`budget_exhausted`)", body = ErrorEnvelope),
        (status = 422, description = "The history plus prompt does not fit the context window", body = ErrorEnvelope),
        (status = 502, description = "The provider failed", body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn generate(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    Json(body): Json<wire::Generate>,
) -> Result<Response, ApiError> {
    let text = shared.runtime.generate(&id, &body.prompt).await?;
    Ok(data(wire::Generated { text }))
}

/// Messages in seq order, after `after_seq`.
#[utoipa::path(get, path = "/api/session/{id}/messages", operation_id = "listMessages", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"), wire::MessagesQuery),
    responses(
        (status = 200, description = "Messages; page on with the last one's seq", body = Data<Vec<wire::Message>>),
        (status = 400, body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn messages(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    Query(query): Query<wire::MessagesQuery>,
) -> Result<Response, ApiError> {
    let limit = page_size(query.limit, MESSAGES_PAGE)?;
    let from = match query.after_seq {
        None => Some(Seq::ZERO),
        Some(after) => after.checked_add(1).map(Seq),
    };
    let messages = read(&shared, move |snap| {
        snap.session(&id)?
            .ok_or_else(|| ApiError::from(Error::SessionNotFound(id.clone())))?;
        match from {
            Some(from) => Ok(snap.messages(&id, from, limit)?),
            None => Ok(Vec::new()),
        }
    })
    .await?;
    Ok(data(
        messages.iter().map(wire::Message::from).collect::<Vec<_>>(),
    ))
}

/// The whole output of one tool call (or its error), as the tool returned it, even where
/// history keeps only a head-and-tail preview.
#[utoipa::path(get, path = "/api/session/{id}/tool-output/{message_id}/{call_id}", operation_id = "getToolOutput", tag = "session",
    params(
        ("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"),
        ("message_id" = String, Path, description = "The assistant message that made the call, `msg_…`", pattern = r"^msg_[A-Za-z0-9_-]{1,64}$"),
        ("call_id" = String, Path, description = "The call's id within that message"),
    ),
    responses(
        (status = 200, description = "The whole output", body = Data<wire::ToolOutput>),
        (status = 400, body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, description = "No such session, message or settled call", body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn tool_output(
    State(shared): AppState,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, message_id, call_id)) =
        path.map_err(|r| ApiError::invalid(format!("invalid path: {}", r.body_text())))?;
    let id = session_in_path(&id)?;
    let message_id = id_in_path(&message_id, agenthost_model::MessageId::parse)?;
    let whole = shared
        .runtime
        .tool_output(&id, &message_id, &call_id)
        .await?;
    Ok(data(wire::ToolOutput {
        message_id: message_id.to_string(),
        call_id,
        bytes: whole.output.len() as u64,
        output: whole.output,
        failed: whole.failed,
        cut: whole.cut,
    }))
}

/// Admitted inputs not yet promoted, in admission order, a page at a time: at most `limit`, and
/// a page ends early once its prompts pass [`INBOX_PAGE_BYTES`] (an inbox may hold a thousand
/// inputs of a MiB each).
#[utoipa::path(get, path = "/api/session/{id}/inbox", operation_id = "listInbox", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"), wire::InboxQuery),
    responses(
        (status = 200, description = "Pending inputs; page on with the last one's admitted_seq", body = Data<Vec<wire::InboxItem>>),
        (status = 400, body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn inbox(
    State(shared): AppState,
    SessionPath(id): SessionPath,
    Query(query): Query<wire::InboxQuery>,
) -> Result<Response, ApiError> {
    let limit = page_size(query.limit, MESSAGES_PAGE)?;
    let after = query.after_seq.map(Seq);
    let rows = read(&shared, move |snap| {
        snap.session(&id)?
            .ok_or_else(|| ApiError::from(Error::SessionNotFound(id.clone())))?;
        Ok(snap.pending_page(&id, after, limit, INBOX_PAGE_BYTES)?)
    })
    .await?;
    Ok(data(
        rows.iter().map(wire::InboxItem::from).collect::<Vec<_>>(),
    ))
}

pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        ErrorType::NotFound,
        format!("no route for {method} {}", uri.path()),
    )
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        ErrorType::MethodNotAllowed,
        format!("{} does not accept {method}", uri.path()),
    )
}

/// The most bytes of a decision's `by` and `reason`.
const MAX_DECIDED_BY: usize = 256;
const MAX_REASON: usize = 4096;

/// The approvals the session waits for, in call order.
#[utoipa::path(get, path = "/api/session/{id}/approvals", operation_id = "approvals", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "Pending approvals", body = Data<Vec<wire::Approval>>),
        (status = 401, body = ErrorEnvelope),
        (status = 404, description = "No such session", body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn approvals(
    State(shared): AppState,
    SessionPath(id): SessionPath,
) -> Result<Response, ApiError> {
    let pending = shared.runtime.approvals(&id).await?;
    Ok(data(
        pending
            .into_iter()
            .map(|p| {
                wire::Approval::pending(
                    &p.message,
                    p.call_id,
                    p.name,
                    &p.input,
                    p.digest,
                    p.expires_at,
                )
            })
            .collect::<Vec<_>>(),
    ))
}

/// Decides an approval, durably and once, and wakes the session: approved, the call runs
/// exactly once; denied, the model gets the denial with who denied it and why.
#[utoipa::path(post, path = "/api/session/{id}/approvals/{message_id}/{call_id}", operation_id = "decideApproval", tag = "session",
    params(
        ("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"),
        ("message_id" = String, Path, description = "The assistant message that made the call, `msg_…`"),
        ("call_id" = String, Path, description = "The call"),
    ),
    request_body = wire::Decide,
    responses(
        (status = 200, description = "The decision", body = Data<wire::ApprovalDecision>),
        (status = 400, description = "Malformed body; `by` or `reason` over its limit", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, description = "No such session, or no such call waiting for approval (or an id that cannot be one)", body = ErrorEnvelope),
        (status = 409, description = "Decided already (`approval_decided`, with the first decision) or the digest is not the call's (`digest_mismatch`); nothing changed", body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn decide(
    State(shared): AppState,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    Json(body): Json<wire::Decide>,
) -> Result<Response, ApiError> {
    let Path((id, message_id, call_id)) =
        path.map_err(|r| ApiError::invalid(format!("invalid path: {}", r.body_text())))?;
    let id = session_in_path(&id)?;
    let message_id = id_in_path(&message_id, MessageId::parse)?;
    let bounded = |field: &str, value: &Option<String>, limit: usize| match value {
        Some(v) if v.len() > limit => Err(ApiError::invalid(format!(
            "{field} is {} bytes, over the limit of {limit}",
            v.len()
        ))),
        _ => Ok(()),
    };
    bounded("by", &body.by, MAX_DECIDED_BY)?;
    bounded("reason", &body.reason, MAX_REASON)?;
    // A named token decides as itself: its name is recorded, with what the client said of who
    // it is after it.
    let by = match (caller.and_then(|c| c.0.name), body.by) {
        (Some(name), Some(by)) => Some(format!("{name}: {by}")),
        (Some(name), None) => Some(name),
        (None, by) => by,
    };
    let decision = shared
        .runtime
        .decide(
            &id,
            &message_id,
            &call_id,
            agenthost_actors::Decide {
                approve: body.decision == wire::DecideKind::Approve,
                digest: body.digest,
                reason: body.reason,
                by,
            },
        )
        .await?;
    Ok(data(wire::ApprovalDecision::from(&decision)))
}

/// Sets a schedule: exactly one of `at` (RFC 3339), `after_ms` and `cron` (five fields, in `tz`,
/// UTC by default). Each firing admits `text` as a prompt whose id is derived from the schedule
/// and the firing time, so it is admitted once across restarts and nodes.
#[utoipa::path(post, path = "/api/session/{id}/schedules", operation_id = "setSchedule", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    request_body = wire::NewSchedule,
    responses(
        (status = 200, description = "The schedule, with its id and next firing (the same one for an exact retry)", body = Data<wire::Schedule>),
        (status = 400, description = "A field is invalid (named in the message), or the session has its most schedules", body = ErrorEnvelope),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 409, description = "The id names a schedule with another text, delivery or time", body = ErrorEnvelope),
        (status = 413, description = "The text is over the prompt size limit", body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn set_schedule(
    State(shared): AppState,
    SessionPath(session): SessionPath,
    Json(body): Json<wire::NewSchedule>,
) -> Result<Response, ApiError> {
    use agenthost_actors::ScheduleAt;
    let id = body
        .id
        .as_deref()
        .map(agenthost_model::ScheduleId::parse)
        .transpose()
        .map_err(|e| ApiError::invalid(format!("id: {e}")))?;
    if body.tz.is_some() && body.cron.is_none() {
        return Err(ApiError::invalid("tz: only with cron"));
    }
    let when = match (body.at, body.after_ms, body.cron) {
        (Some(at), None, None) => ScheduleAt::At(
            agenthost_actors::parse_time(&at).map_err(|e| ApiError::invalid(format!("at: {e}")))?,
        ),
        (None, Some(after), None) => ScheduleAt::After(Duration::from_millis(after)),
        (None, None, Some(cron)) => ScheduleAt::Cron {
            expr: cron,
            tz: body.tz,
        },
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of at, after_ms and cron",
            ));
        }
    };
    let schedule = shared
        .runtime
        .set_schedule(
            &session,
            agenthost_actors::NewSchedule {
                id,
                text: body.text,
                delivery: match body.delivery {
                    None | Some(wire::Delivery::Steer) => Delivery::Steer,
                    Some(wire::Delivery::Queue) => Delivery::Queue,
                },
                when,
                catch_up: match body.catch_up {
                    None | Some(wire::CatchUp::Once) => agenthost_model::CatchUp::Once,
                    Some(wire::CatchUp::Skip) => agenthost_model::CatchUp::Skip,
                },
            },
        )
        .await?;
    Ok(data(wire::Schedule::from(&schedule)))
}

/// The session's schedules, in id order, each with its next firing.
#[utoipa::path(get, path = "/api/session/{id}/schedules", operation_id = "schedules", tag = "session",
    params(("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$")),
    responses(
        (status = 200, description = "The schedules", body = Data<Vec<wire::Schedule>>),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn schedules(
    State(shared): AppState,
    SessionPath(session): SessionPath,
) -> Result<Response, ApiError> {
    let list = shared.runtime.schedules(&session).await?;
    Ok(data(
        list.iter().map(wire::Schedule::from).collect::<Vec<_>>(),
    ))
}

/// Cancels a schedule. Idempotent: cancelling one that does not exist (any more) answers
/// `{"cancelled": false}`.
#[utoipa::path(delete, path = "/api/session/{id}/schedules/{schedule_id}", operation_id = "cancelSchedule", tag = "session",
    params(
        ("id" = String, Path, description = "Session id, `ses_…`", pattern = r"^ses_[A-Za-z0-9_-]{1,64}$"),
        ("schedule_id" = String, Path, description = "Schedule id, `sch_…`"),
    ),
    responses(
        (status = 200, description = "Whether a schedule was cancelled", body = Data<wire::ScheduleCancelled>),
        (status = 401, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope),
        (status = 503, body = ErrorEnvelope),
    ),
    security((), ("bearer" = [])))]
pub(crate) async fn cancel_schedule(
    State(shared): AppState,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((id, schedule)) =
        path.map_err(|r| ApiError::invalid(format!("invalid path: {}", r.body_text())))?;
    let id = session_in_path(&id)?;
    let schedule = id_in_path(&schedule, agenthost_model::ScheduleId::parse)?;
    let cancelled = shared.runtime.cancel_schedule(&id, &schedule).await?;
    Ok(data(wire::ScheduleCancelled { cancelled }))
}
