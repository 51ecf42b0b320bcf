//! The catalog: agents, models and providers by name, as the configuration names them, and how
//! a session's agent resolves to its model and provider. A leaf: it knows no actor and no drain.

use std::sync::Arc;

use agenthost_llm as llm;

use crate::config::{Agent, Model};
use crate::error::{Error, Result};

/// Agents, models and providers by name.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub providers: std::collections::BTreeMap<String, Arc<dyn llm::Provider>>,
    pub models: std::collections::BTreeMap<String, Model>,
    pub agents: std::collections::BTreeMap<String, Agent>,
    pub default_agent: String,
}

impl Catalog {
    /// The agent of a session, its model (the session's own when it names one, else the
    /// agent's) and the provider serving it.
    pub fn resolve(
        &self,
        agent: &str,
        session_model: Option<&str>,
    ) -> Result<(&Agent, &Model, Arc<dyn llm::Provider>)> {
        let agent_cfg = self
            .agents
            .get(agent)
            .ok_or_else(|| Error::Config(format!("unknown agent {agent:?}")))?;
        let name = session_model.unwrap_or(&agent_cfg.model);
        let model = self
            .models
            .get(name)
            .ok_or_else(|| Error::Config(format!("agent {agent:?}: unknown model {name:?}")))?;
        let provider = self
            .providers
            .get(&model.provider)
            .cloned()
            .ok_or_else(|| {
                Error::Config(format!(
                    "model {name:?}: unknown provider {:?}",
                    model.provider
                ))
            })?;
        Ok((agent_cfg, model, provider))
    }
}
