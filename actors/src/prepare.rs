//! Request preparation: the one place that turns a session snapshot into a provider request.
//!
//! Durable steps and `generate` both call [`prepare`]; nothing else builds requests, so the two
//! cannot drift. It is pure given its inputs: the catalog of agents, models and
//! providers, the tool registry, the hooks, the session row and its selected history.

use std::sync::Arc;

use agenthost_llm as llm;
use agenthost_model::history::History;
use agenthost_model::{Message, Part, SessionRow, ToolState};

use crate::config::Model;
use crate::error::Result;
use crate::hooks::{Hook, Purpose, RequestContext};
use crate::tools::Tools;

pub use crate::catalog::Catalog;

/// The note that ends the request of an exchange's last step.
pub const MAX_STEPS_NOTE: &str = "MAXIMUM STEPS REACHED. Tools are disabled for this final step: \
     answer with what you have, summarize what was done and what remains.";

/// The header that pins a session's requests to one backend replica where providers support it.
pub const AFFINITY_HEADER: &str = "x-session-affinity";

/// A request ready to send, with what the caller needs to account for it.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub request: llm::Request,
    pub provider: Arc<dyn llm::Provider>,
    pub model: Model,
    pub agent: String,
    /// The tools the request advertises: what the step allows and runs, whatever changes after.
    pub tools: Arc<Tools>,
    /// Whether this is the exchange's last step (tools defined, calls forbidden).
    pub last_step: bool,
    /// A rough size of the request in tokens (4 bytes a token), for compaction decisions.
    pub estimated_tokens: u64,
    /// The session's budget (its agent's, with its own limits over them), what the session spent
    /// in all, and what its current user turn spent, as of the request's snapshot.
    pub budget: agenthost_model::Budget,
    pub spent: agenthost_model::Spend,
    pub turn: agenthost_model::Spend,
}

impl Prepared {
    /// The most the call can spend: its whole input estimate and its whole `max_output`, at its
    /// model's price.
    pub fn worst(&self) -> agenthost_model::Spend {
        let usage = llm::Usage {
            input: self.estimated_tokens,
            // Without a bound of its own, a reply may fill the context window.
            output: u64::from(self.model.max_output.unwrap_or(self.model.context_window)),
            ..Default::default()
        };
        agenthost_model::Spend::of(&crate::drain::step::cost(&usage, &self.model.price))
    }

    /// The limit this call could pass, counting `more` (what earlier attempts of the same call
    /// spent since the snapshot) as spent too; `None` when it may be made.
    pub fn over_budget(
        &self,
        more: agenthost_model::Spend,
    ) -> Option<agenthost_model::budget::Exceeded> {
        let add = |a: agenthost_model::Spend| agenthost_model::Spend {
            tokens: a.tokens.saturating_add(more.tokens),
            cost_nanos: a.cost_nanos.saturating_add(more.cost_nanos),
        };
        self.budget
            .check(add(self.spent), add(self.turn), self.worst())
    }

    /// [`Prepared::over_budget`] against the session's life limits only: for a call that is no
    /// part of a user turn (a compaction's summary).
    pub fn over_life_budget(
        &self,
        more: agenthost_model::Spend,
    ) -> Option<agenthost_model::budget::Exceeded> {
        let life = agenthost_model::Budget {
            turn_max_tokens: None,
            turn_max_cost_nanos: None,
            ..self.budget
        };
        let spent = agenthost_model::Spend {
            tokens: self.spent.tokens.saturating_add(more.tokens),
            cost_nanos: self.spent.cost_nanos.saturating_add(more.cost_nanos),
        };
        life.check(spent, agenthost_model::Spend::default(), self.worst())
    }
}

/// Everything [`prepare`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub catalog: &'a Catalog,
    pub tools: &'a Arc<Tools>,
    pub hooks: &'a [Arc<dyn Hook>],
    pub row: &'a SessionRow,
    pub history: &'a History,
    pub step: u32,
    pub purpose: Purpose,
}

impl<'a> Inputs<'a> {
    /// The runtime's catalog, tools and hooks with a session's row and selected history.
    pub(crate) fn of(
        shared: &'a crate::shared::Shared,
        tools: &'a Arc<Tools>,
        row: &'a SessionRow,
        history: &'a History,
        step: u32,
        purpose: Purpose,
    ) -> Self {
        Inputs {
            catalog: &shared.catalog,
            tools,
            hooks: &shared.hooks,
            row,
            history,
            step,
            purpose,
        }
    }
}

/// Builds the request for `inputs`. For [`Purpose::Generate`], `prompt` is appended as the last
/// user message and `tool_choice` forbids calls (the agent's tools are still defined); everything
/// else is what a durable step at the same state would send.
pub fn prepare(inputs: Inputs<'_>, prompt: Option<&str>) -> Result<Prepared> {
    let Inputs {
        catalog,
        tools,
        hooks,
        row,
        history,
        step,
        purpose,
    } = inputs;
    let (agent, model, provider) = catalog.resolve(&row.agent, row.model.as_deref())?;
    let mut request = llm::Request::new(model.model.clone());
    request.system = vec![llm::SystemPart::stable(agent.system.clone())];
    request.messages = convert(history);
    request.max_output = model.max_output;
    request.temperature = agent.temperature;
    request.prompt_cache_key = Some(row.id.to_string());
    request.session_id = Some(row.id.to_string());
    request.headers.insert(AFFINITY_HEADER, row.id.to_string());

    let last_step = step >= agent.steps;
    // Every request advertises the agent's tools: providers refuse tool calls and results in
    // history without definitions, and the same definitions keep the prompt-cache prefix of
    // every request of the session the same. Where no call may be made, `tool_choice` forbids
    // it (`auto` for a server that refuses `none`: a call it returns anyway is never run).
    request.tools = tools.advertised(&agent.tools);
    let forbid = match model.tool_choice_none {
        true => llm::ToolChoice::None,
        false => llm::ToolChoice::Auto,
    };
    match purpose {
        Purpose::Step if last_step => {
            request.tool_choice = forbid.clone();
            request
                .messages
                .push(llm::Message::assistant(MAX_STEPS_NOTE));
        }
        Purpose::Step => request.tool_choice = llm::ToolChoice::Auto,
        Purpose::Generate | Purpose::Compaction => request.tool_choice = forbid.clone(),
    }
    if let Some(prompt) = prompt {
        request.messages.push(llm::Message::user(prompt));
    }

    let ctx = RequestContext {
        session: row.id.clone(),
        agent: row.agent.clone(),
        step,
        purpose,
    };
    for hook in hooks {
        hook.on_request(&ctx, &mut request);
    }
    if purpose != Purpose::Step {
        // Hooks shape the tool definitions as they do a step's (the requests stay equivalent),
        // but cannot let `generate` or a compaction call a tool.
        request.tool_choice = forbid;
    }
    let estimated_tokens = estimate(&request);
    Ok(Prepared {
        request,
        provider,
        model: model.clone(),
        agent: row.agent.clone(),
        tools: tools.clone(),
        last_step,
        estimated_tokens,
        budget: agent.budget.with(&row.budget),
        spent: agenthost_model::Spend::of(&row.usage),
        turn: agenthost_model::budget::turn_spend(&history.messages),
    })
}

/// Provider messages for a history: user → assistant(text, reasoning, tool calls) → tool
/// results. Chronological instruction updates become user-side system reminders, because not
/// every provider accepts system messages mid-conversation.
pub fn convert(history: &History) -> Vec<llm::Message> {
    let mut out = Vec::with_capacity(history.messages.len() + 1);
    if let Some(summary) = &history.summary {
        out.push(llm::Message::user(format!(
            "<conversation-summary>\n{summary}\n</conversation-summary>"
        )));
    }
    for message in &history.messages {
        match message {
            Message::User { prompt, .. } => out.push(llm::Message::User {
                text: prompt.text.clone(),
                files: prompt
                    .files
                    .iter()
                    .map(|f| llm::File {
                        name: f.filename.clone(),
                        media_type: f.mime.clone(),
                        content: llm::FileContent::Url(f.url.clone()),
                    })
                    .collect(),
            }),
            Message::System { text, .. } => out.push(llm::Message::user(format!(
                "<system-reminder>\n{text}\n</system-reminder>"
            ))),
            Message::Assistant(a) => {
                let mut parts = Vec::new();
                let mut results = Vec::new();
                for part in &a.parts {
                    match part {
                        Part::Text { text, .. } if !text.is_empty() => {
                            parts.push(llm::AssistantPart::Text(text.clone()))
                        }
                        Part::Text { .. } => {}
                        Part::Reasoning { text, metadata, .. } => {
                            parts.push(llm::AssistantPart::Reasoning {
                                text: text.clone(),
                                metadata: metadata
                                    .as_deref()
                                    .and_then(|m| serde_json::from_str(m).ok()),
                            })
                        }
                        Part::Tool(t) => {
                            parts.push(llm::AssistantPart::ToolCall(llm::ToolCall {
                                id: t.call_id.clone(),
                                name: t.name.clone(),
                                input: t.input.clone(),
                            }));
                            results.push(match &t.state {
                                ToolState::Completed { output, .. } => {
                                    llm::Message::tool_result(&t.call_id, output)
                                }
                                ToolState::Error { error } => {
                                    llm::Message::tool_error(&t.call_id, error)
                                }
                                ToolState::Running => llm::Message::tool_error(
                                    &t.call_id,
                                    "the tool has not finished",
                                ),
                                ToolState::Held => {
                                    llm::Message::tool_error(&t.call_id, held(a, &t.call_id))
                                }
                            });
                        }
                        // Approvals are the runtime's business; the model sees their outcome
                        // as the call's result.
                        Part::Approval(_) => {}
                    }
                }
                if !parts.is_empty() {
                    out.push(llm::Message::Assistant { parts });
                    out.extend(results);
                }
            }
            Message::Compaction { .. } => {}
        }
    }
    out
}

/// The result a call held for approval shows until it settles (a `generate` on a session that
/// waits sees it): the refusal once refused, otherwise that it has not run.
fn held(a: &agenthost_model::AssistantMessage, call_id: &str) -> String {
    let decision = a.approval(call_id).and_then(|x| x.decision.as_ref());
    match decision {
        Some(decision) => decision
            .refusal()
            .unwrap_or_else(|| "the call was approved and has not run yet".to_owned()),
        None => "the call waits for a person's approval; it has not run".to_owned(),
    }
}

/// About four bytes a token: coarse, but monotone in the request's size, which is what the
/// compaction threshold needs.
pub fn estimate(request: &llm::Request) -> u64 {
    let mut bytes = request.system.iter().map(|s| s.text.len()).sum::<usize>();
    for m in &request.messages {
        bytes += match m {
            llm::Message::User { text, files } => {
                text.len() + files.iter().map(|f| f.media_type.len() + 64).sum::<usize>()
            }
            llm::Message::Assistant { parts } => parts
                .iter()
                .map(|p| match p {
                    llm::AssistantPart::Text(t) => t.len(),
                    llm::AssistantPart::Reasoning { text, .. } => text.len(),
                    llm::AssistantPart::ToolCall(c) => c.name.len() + c.input.len(),
                })
                .sum(),
            llm::Message::Tool(r) => r.output.len(),
        };
    }
    bytes += request
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum::<usize>();
    (bytes as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    //! The request builder's transcript law: whatever a history holds (tools running, held for
    //! approval, decided, refused, settled; text and reasoning in any order, doubled or empty),
    //! every tool call the provider sees is followed by exactly one result, and no result stands
    //! without its call.

    use agenthost_model::{
        Approval, AssistantMessage, Decision, Message, MessageId, Part, Seq, Timestamp, ToolPart,
        ToolState, Usage, Verdict,
    };
    use proptest::prelude::*;

    use super::*;

    fn state() -> impl Strategy<Value = (ToolState, Option<Option<Verdict>>)> {
        let verdict = prop_oneof![
            Just(Verdict::Approved),
            Just(Verdict::Denied),
            Just(Verdict::Expired),
            Just(Verdict::Cancelled),
        ];
        prop_oneof![
            Just((ToolState::Running, None)),
            Just((
                ToolState::Completed {
                    output: "ok".into(),
                    truncated: false
                },
                None
            )),
            Just((ToolState::Error { error: "no".into() }, None)),
            Just((ToolState::Held, Some(None))),
            verdict.prop_map(|v| (ToolState::Held, Some(Some(v)))),
        ]
    }

    /// One assistant message's parts: texts, reasoning and calls (with unique call ids), and the
    /// approval parts of the held ones, in a shuffled order.
    fn parts() -> impl Strategy<Value = Vec<Part>> {
        let text = prop_oneof![Just(String::new()), Just("t".to_owned())];
        let part = prop_oneof![
            text.clone().prop_map(|text| vec![Part::Text {
                text,
                incomplete: false
            }]),
            text.prop_map(|text| vec![Part::Reasoning {
                text,
                metadata: None,
                incomplete: false
            }]),
            state().prop_map(|(state, approval)| {
                let mut parts = vec![Part::Tool(ToolPart {
                    call_id: String::new(),
                    name: "t".into(),
                    input: "{}".into(),
                    state,
                })];
                if let Some(verdict) = approval {
                    parts.push(Part::Approval(Approval {
                        call_id: String::new(),
                        digest: "sha256:0".into(),
                        expires_at: Timestamp(1),
                        decision: verdict.map(|verdict| Decision {
                            verdict,
                            by: Some("ann".into()),
                            reason: None,
                            time: Timestamp(1),
                        }),
                    }));
                }
                parts
            }),
        ];
        proptest::collection::vec(part, 0..6).prop_map(|groups| {
            let mut parts = Vec::new();
            for (n, group) in groups.into_iter().enumerate() {
                for mut part in group {
                    match &mut part {
                        Part::Tool(t) => t.call_id = format!("c{n}"),
                        Part::Approval(a) => a.call_id = format!("c{n}"),
                        _ => {}
                    }
                    parts.push(part);
                }
            }
            parts
        })
    }

    fn history() -> impl Strategy<Value = History> {
        let message = prop_oneof![Just(None), parts().prop_map(Some),];
        proptest::collection::vec(message, 0..8).prop_map(|messages| History {
            summary: None,
            messages: messages
                .into_iter()
                .enumerate()
                .map(|(n, parts)| {
                    let id = MessageId::mint(Timestamp(n as u64), n as u128);
                    match parts {
                        None => Message::System {
                            id,
                            seq: Seq(n as u64),
                            text: "note".into(),
                            time: Timestamp(0),
                        },
                        Some(parts) => Message::Assistant(AssistantMessage {
                            id,
                            seq: Seq(n as u64),
                            step: 1,
                            agent: "a".into(),
                            model: "m".into(),
                            parts,
                            finish: None,
                            error: None,
                            usage: Usage::default(),
                            retries: 0,
                            created: Timestamp(0),
                            completed: None,
                        }),
                    }
                })
                .collect(),
        })
    }

    proptest! {
        #[test]
        fn every_call_the_provider_sees_has_exactly_one_result(history in history()) {
            let out = convert(&history);
            let mut n = 0;
            while n < out.len() {
                match &out[n] {
                    llm::Message::Tool(result) => {
                        prop_assert!(false, "a result without its call: {result:?}");
                    }
                    llm::Message::Assistant { parts } => {
                        let calls: Vec<&str> = parts
                            .iter()
                            .filter_map(|p| match p {
                                llm::AssistantPart::ToolCall(c) => Some(c.id.as_str()),
                                _ => None,
                            })
                            .collect();
                        let results: Vec<&str> = out[n + 1..]
                            .iter()
                            .map_while(|m| match m {
                                llm::Message::Tool(r) => Some(r.call_id.as_str()),
                                _ => None,
                            })
                            .collect();
                        prop_assert_eq!(&calls, &results);
                        n += 1 + results.len();
                    }
                    llm::Message::User { .. } => n += 1,
                }
            }
        }
    }
}
