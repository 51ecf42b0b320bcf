//! The published request rules of each wire format, as checks: the requests the real APIs
//! refuse with a 400. The mock provider enforces them, so a request agenthost builds that a real
//! API would refuse fails in tests and for users trying agenthost without keys.
//!
//! Anthropic Messages:
//! - `max_tokens` is set (a positive integer).
//! - A request with `tool_use` or `tool_result` blocks in its messages defines `tools`
//!   ("Requests which include `tool_use` or `tool_result` blocks must define tools").
//! - `tool_choice` is sent only with `tools`.
//! - Every `tool_use` of an assistant message is answered by a `tool_result` in the user message
//!   right after it, and those `tool_result` blocks come first in that message; every
//!   `tool_result` answers a `tool_use` of the assistant message right before it.
//! - `thinking` blocks are replayed with their `signature`; text blocks are not empty.
//!
//! OpenAI Chat Completions (and compatible servers, which are stricter than OpenAI itself):
//! - An assistant message with `tool_calls` is followed by one `tool` message per call id, and a
//!   `tool` message answers a call of the assistant message before it.
//! - A request with tool calls or tool messages in history defines `tools` (several compatible
//!   servers refuse it otherwise); `tool_choice` is sent only with `tools`.

use std::collections::BTreeSet;

use serde_json::Value;

/// Checks an Anthropic Messages request body; the error says which rule it breaks.
pub fn anthropic(body: &Value) -> Result<(), String> {
    match body.get("max_tokens").and_then(Value::as_u64) {
        Some(n) if n > 0 => {}
        _ => return Err("max_tokens: Field required".into()),
    }
    let (messages, has_tools) = common(
        body,
        "tool_choice may only be specified while providing tools",
    )?;
    let blocks = |message: &Value| -> Vec<Value> {
        match message.get("content") {
            Some(Value::Array(blocks)) => blocks.clone(),
            Some(Value::String(text)) => {
                vec![serde_json::json!({ "type": "text", "text": text })]
            }
            _ => Vec::new(),
        }
    };
    let mut asked: BTreeSet<String> = BTreeSet::new();
    for (n, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let blocks = blocks(message);
        let answered: Vec<String> = blocks
            .iter()
            .filter(|b| kind(b) == "tool_result")
            .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        if !has_tools
            && blocks
                .iter()
                .any(|b| matches!(kind(b), "tool_use" | "tool_result"))
        {
            return Err(
                "Requests which include `tool_use` or `tool_result` blocks must define tools."
                    .into(),
            );
        }
        for block in &blocks {
            match kind(block) {
                "text" if block.get("text").and_then(Value::as_str) == Some("") => {
                    return Err(format!(
                        "messages.{n}: text content blocks must be non-empty"
                    ));
                }
                "thinking"
                    if block
                        .get("signature")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty) =>
                {
                    return Err(format!(
                        "messages.{n}: thinking blocks need their signature"
                    ));
                }
                _ => {}
            }
        }
        match role {
            "user" => {
                let missing: Vec<&String> =
                    asked.iter().filter(|id| !answered.contains(id)).collect();
                if !missing.is_empty() {
                    return Err(format!(
                        "messages.{n}: `tool_use` ids were found without `tool_result` blocks \
                         immediately after: {missing:?}"
                    ));
                }
                if let Some(stray) = answered.iter().find(|id| !asked.contains(*id)) {
                    return Err(format!(
                        "messages.{n}: unexpected `tool_use_id` {stray:?} in `tool_result` \
                         blocks: each must have a corresponding `tool_use` in the previous \
                         message"
                    ));
                }
                let first_other = blocks.iter().position(|b| kind(b) != "tool_result");
                let last_result = blocks.iter().rposition(|b| kind(b) == "tool_result");
                if let (Some(other), Some(result)) = (first_other, last_result)
                    && other < result
                {
                    return Err(format!(
                        "messages.{n}: `tool_result` blocks must come first in the message"
                    ));
                }
                asked.clear();
            }
            "assistant" => {
                if !asked.is_empty() {
                    return Err(format!(
                        "messages.{n}: `tool_use` blocks must be answered before the next \
                         assistant message"
                    ));
                }
                if !answered.is_empty() {
                    return Err(format!(
                        "messages.{n}: `tool_result` blocks belong in user messages"
                    ));
                }
                asked = blocks
                    .iter()
                    .filter(|b| kind(b) == "tool_use")
                    .filter_map(|b| b.get("id").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect();
            }
            other => return Err(format!("messages.{n}: unexpected role {other:?}")),
        }
    }
    // A trailing assistant message with tool calls (a prefill) would be answered by the model
    // itself: the API refuses it.
    if !asked.is_empty() {
        return Err("the last message has `tool_use` blocks without results".into());
    }
    Ok(())
}

/// The rules both formats share: at least one message, and `tool_choice` only with `tools`
/// (refused with `choice_without_tools`, each API's own words). Returns the messages and whether
/// tools are defined.
fn common<'a>(
    body: &'a Value,
    choice_without_tools: &str,
) -> Result<(&'a Vec<Value>, bool), String> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    let has_tools = body
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if body.get("tool_choice").is_some() && !has_tools {
        return Err(choice_without_tools.into());
    }
    Ok((messages, has_tools))
}

/// The `type` of a content block.
fn kind(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Checks an OpenAI Chat Completions request body; the error says which rule it breaks.
pub fn openai(body: &Value) -> Result<(), String> {
    let (messages, has_tools) = common(
        body,
        "'tool_choice' is only allowed when 'tools' are specified",
    )?;
    let mut asked: BTreeSet<String> = BTreeSet::new();
    for (n, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        let calls: Vec<String> = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .filter_map(|c| c.get("id").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if !has_tools && (role == "tool" || !calls.is_empty()) {
            return Err(format!(
                "messages.{n}: tool calls and tool messages in history need `tools` defined"
            ));
        }
        if role == "tool" {
            let id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !asked.remove(id) {
                return Err(format!(
                    "messages.{n}: messages with role 'tool' must be a response to a preceding \
                     message with 'tool_calls' (id {id:?})"
                ));
            }
            continue;
        }
        if !asked.is_empty() {
            return Err(format!(
                "messages.{n}: an assistant message with 'tool_calls' must be followed by tool \
                 messages responding to each 'tool_call_id': {asked:?} have none"
            ));
        }
        asked = calls.into_iter().collect();
    }
    if !asked.is_empty() {
        return Err(format!(
            "an assistant message with 'tool_calls' must be followed by tool messages: {asked:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool_loop() -> Value {
        json!({
            "max_tokens": 100,
            "tools": [{ "name": "t", "input_schema": {"type": "object"} }],
            "messages": [
                { "role": "user", "content": "go" },
                { "role": "assistant", "content": [
                    { "type": "thinking", "thinking": "hm", "signature": "sig" },
                    { "type": "tool_use", "id": "a", "name": "t", "input": {} },
                ]},
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "a", "content": "ok" },
                    { "type": "text", "text": "and then" },
                ]},
            ],
        })
    }

    #[test]
    fn anthropic_accepts_a_well_formed_tool_loop_and_names_each_broken_rule() {
        assert_eq!(anthropic(&tool_loop()), Ok(()));
        let broken = |edit: &dyn Fn(&mut Value)| {
            let mut body = tool_loop();
            edit(&mut body);
            anthropic(&body).expect_err("refused")
        };
        assert!(
            broken(&|b| b
                .as_object_mut()
                .map(|o| o.remove("tools"))
                .map(drop)
                .unwrap_or(()))
            .contains("must define tools")
        );
        assert!(
            broken(&|b| b
                .as_object_mut()
                .map(|o| o.remove("max_tokens"))
                .map(drop)
                .unwrap_or(()))
            .contains("max_tokens")
        );
        assert!(
            broken(&|b| b["messages"][2]["content"][0]["tool_use_id"] = json!("z"))
                .contains("without `tool_result`")
        );
        assert!(
            broken(&|b| b["messages"][1]["content"][0]["signature"] = json!(""))
                .contains("signature")
        );
        assert!(
            broken(&|b| {
                let blocks = b["messages"][2]["content"].as_array_mut().expect("blocks");
                blocks.reverse();
            })
            .contains("must come first")
        );
    }

    #[test]
    fn openai_wants_every_call_answered_and_tools_defined() {
        let body = json!({
            "tools": [{ "type": "function", "function": { "name": "t" } }],
            "messages": [
                { "role": "user", "content": "go" },
                { "role": "assistant", "content": null, "tool_calls": [{ "id": "a", "type": "function", "function": { "name": "t", "arguments": "{}" } }] },
                { "role": "tool", "tool_call_id": "a", "content": "ok" },
            ],
        });
        assert_eq!(openai(&body), Ok(()));
        let mut no_tools = body.clone();
        no_tools.as_object_mut().map(|o| o.remove("tools"));
        assert!(openai(&no_tools).is_err());
        let mut unanswered = body.clone();
        unanswered["messages"].as_array_mut().map(Vec::pop);
        assert!(openai(&unanswered).is_err());
    }
}
