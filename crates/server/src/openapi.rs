//! `GET /openapi.json`: the OpenAPI document, generated from the handlers' annotations and the
//! wire types, so it cannot drift from the code. A test checks that it lists every route the
//! router serves.

use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::ErrorType;
use crate::{api, events, metrics, wire};

#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "agenthost",
        description = "Durable LLM agent sessions over HTTP and SSE. Successful `/api` responses \
                       are `{\"data\": …}`; errors are `{\"error\": {\"type\", \"message\"}}`. \
                       With a token configured, every `/api` route needs \
                       `Authorization: Bearer <token>`.",
    ),
    paths(
        api::healthz,
        metrics::render,
        serve,
        api::create,
        api::list,
        api::active,
        api::session,
        api::update,
        api::prompt,
        api::resume,
        api::compact,
        api::interrupt,
        api::wait,
        api::generate,
        api::messages,
        api::inbox,
        api::tool_output,
        api::approvals,
        api::decide,
        api::set_schedule,
        api::schedules,
        api::cancel_schedule,
        events::stream,
        api::cluster,
        api::mcp,
    ),
    components(schemas(
        ErrorType,
        wire::ErrorEnvelope,
        wire::ErrorBody,
        wire::Health,
        wire::Cluster,
        wire::ClusterNode,
        wire::McpServer,
        wire::McpStatus,
        wire::McpTool,
        wire::CreateSession,
        wire::UpdateSession,
        wire::Budget,
        wire::BudgetState,
        wire::Prompt,
        wire::File,
        wire::Generate,
        wire::ToolOutput,
        wire::Approval,
        wire::NewSchedule,
        wire::Schedule,
        wire::CatchUp,
        wire::ScheduleCancelled,
        wire::ApprovalDecision,
        wire::Verdict,
        wire::Decide,
        wire::DecideKind,
        wire::Session,
        wire::Status,
        wire::StatusType,
        wire::SessionPage,
        wire::Cursor,
        wire::Usage,
        wire::Admitted,
        wire::Delivery,
        wire::Accepted,
        wire::DrainOutcome,
        wire::Interrupted,
        wire::Idle,
        wire::Generated,
        wire::InboxItem,
        wire::Message,
        wire::Time,
        wire::Part,
        wire::ToolState,
        wire::StepError,
        wire::FailureKind,
        wire::Compaction,
        wire::Event,
        wire::EventBody,
        wire::InstructionChange,
        wire::InterruptReason,
        wire::Delta,
        wire::DeltaType,
        wire::Synced,
    )),
    modifiers(&Bearer, &OptionalBodies, &Refusals),
    tags(
        (name = "session", description = "Sessions: admission, execution, history, events"),
        (name = "meta", description = "Health, metrics and this document"),
    )
)]
pub struct ApiDoc;

/// Registers the `bearer` security scheme the `/api` routes refer to.
struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Marks the bodies that may be left out as optional (utoipa marks every typed body required,
/// unless its type is an `Option`, which would also admit `null`).
struct OptionalBodies;

impl Modify for OptionalBodies {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let create = openapi
            .paths
            .paths
            .get_mut("/api/session")
            .and_then(|item| item.post.as_mut())
            .and_then(|op| op.request_body.as_mut());
        if let Some(utoipa::openapi::RefOr::T(body)) = create {
            body.required = Some(utoipa::openapi::Required::False);
        }
    }
}

/// The refusals any route may answer: 403 on every route (a role below the route's, or a `Host`
/// this server does not answer to), and 401 on every route behind the token.
struct Refusals;

impl Modify for Refusals {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        let error = |description: &str| {
            RefOr::T(
                ResponseBuilder::new()
                    .description(description)
                    .content(
                        "application/json",
                        ContentBuilder::new()
                            .schema(Some(Ref::from_schema_name("ErrorEnvelope")))
                            .build(),
                    )
                    .build(),
            )
        };
        for (path, item) in openapi.paths.paths.iter_mut() {
            let guarded = path.starts_with("/api") || path == "/metrics" || path == "/healthz";
            let operations = [
                item.get.as_mut(),
                item.post.as_mut(),
                item.put.as_mut(),
                item.delete.as_mut(),
                item.patch.as_mut(),
            ];
            for operation in operations.into_iter().flatten() {
                let responses = &mut operation.responses.responses;
                responses.entry("403".into()).or_insert_with(|| {
                    error(
                        "The token's role does not allow this route, or the request's `Host` is \
                         not a name this server answers to",
                    )
                });
                if guarded {
                    responses
                        .entry("401".into())
                        .or_insert_with(|| error("A token is required, and this one is not valid"));
                }
            }
        }
    }
}

/// The document as JSON, rendered once.
pub fn json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("invariant: the generated document is plain JSON data")
    })
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "meta",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)))]
pub(crate) async fn serve() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        json(),
    )
        .into_response()
}
