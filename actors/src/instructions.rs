//! Instruction sources: static text and files from configuration, plus context hooks
//! provide. They are sampled at each safe boundary, never pushed. A change is committed as one
//! chronological system message; an unreadable source keeps its last value; a source with no
//! value at all blocks the step, and its input stays pending.

use std::collections::BTreeMap;
use std::path::PathBuf;

use agenthost_model::{InstructionState, SessionId};

use crate::hooks::Hook;

/// One configured source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Instruction {
    /// Fixed text.
    Text { name: String, text: String },
    /// A file read at every boundary (for example an `AGENTS.md`).
    File { name: String, path: PathBuf },
}

/// The current value of every source; `None` for a source that could not be read now.
pub(crate) type Resolved = BTreeMap<String, Option<String>>;

/// Reads every source. Blocking (files): call it off the async workers.
pub(crate) fn resolve(
    sources: &[Instruction],
    hooks: &[std::sync::Arc<dyn Hook>],
    session: &SessionId,
) -> Resolved {
    let mut resolved = Resolved::new();
    for source in sources {
        match source {
            Instruction::Text { name, text } => {
                resolved.insert(name.clone(), Some(text.clone()));
            }
            Instruction::File { name, path } => {
                let value = std::fs::read_to_string(path)
                    .map_err(|e| {
                        tracing::warn!(source = %name, path = %path.display(), error = %e, "instruction source unreadable");
                    })
                    .ok();
                resolved.insert(name.clone(), value);
            }
        }
    }
    for hook in hooks {
        for (name, value) in hook.instructions(session) {
            resolved.insert(name, value);
        }
    }
    resolved
}

/// What changed since the model was last told, rendered as one system message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub changed: Vec<(String, String)>,
    pub text: String,
}

/// Compares what the sources say now with what the model was last told. `Err(name)` when a
/// source has never had a value: the step must not run without it.
pub(crate) fn diff(resolved: &Resolved, told: &InstructionState) -> Result<Option<Change>, String> {
    let mut changed = Vec::new();
    for (name, value) in resolved {
        match (value, told.sources.get(name)) {
            (Some(now), Some(before)) if now == before => {}
            (Some(now), _) => changed.push((name.clone(), now.clone())),
            // Unreadable now: keep the last value the model saw.
            (None, Some(_)) => {}
            (None, None) => return Err(name.clone()),
        }
    }
    if changed.is_empty() {
        return Ok(None);
    }
    let text = changed
        .iter()
        .map(|(name, value)| format!("# {name}\n{value}"))
        .collect::<Vec<_>>()
        .join("\n\n");
    Ok(Some(Change { changed, text }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_sources_keep_their_last_value_and_block_without_one() {
        let mut told = InstructionState::default();
        let now = Resolved::from([("rules".to_owned(), Some("be brief".to_owned()))]);
        let change = diff(&now, &told)
            .expect("readable")
            .expect("first value is a change");
        assert_eq!(
            change.changed,
            [("rules".to_owned(), "be brief".to_owned())]
        );
        told.sources.insert("rules".into(), "be brief".into());
        assert_eq!(diff(&now, &told), Ok(None));
        let unreadable = Resolved::from([("rules".to_owned(), None)]);
        assert_eq!(diff(&unreadable, &told), Ok(None));
        assert_eq!(
            diff(&unreadable, &InstructionState::default()),
            Err("rules".into())
        );
    }
}
