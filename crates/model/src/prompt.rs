//! User input: prompt text, file attachments and the delivery mode.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The default bound on a prompt's size.
pub const DEFAULT_PROMPT_LIMIT: usize = 1024 * 1024;

/// What the user said: text and optional file attachments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prompt {
    pub text: String,
    pub files: Vec<FileAttachment>,
}

/// A file attached to a prompt, by URL (`data:`, `file:` or `http(s):`). The runtime does not
/// fetch it; providers receive it as given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttachment {
    pub mime: String,
    pub url: String,
    pub filename: Option<String>,
}

impl Prompt {
    pub fn text(text: impl Into<String>) -> Self {
        Prompt {
            text: text.into(),
            files: Vec::new(),
        }
    }

    /// Bytes the prompt occupies, counted over its text and every attachment field.
    pub fn size(&self) -> usize {
        self.text.len()
            + self
                .files
                .iter()
                .map(|f| f.mime.len() + f.url.len() + f.filename.as_ref().map_or(0, String::len))
                .sum::<usize>()
    }

    /// Checks the admission rules: not empty, not over `limit` bytes, attachments
    /// well formed.
    pub fn validate(&self, limit: usize) -> Result<(), Error> {
        if self.text.trim().is_empty() && self.files.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let size = self.size();
        if size > limit {
            return Err(Error::PromptTooLarge { size, limit });
        }
        for (index, file) in self.files.iter().enumerate() {
            if file.url.is_empty() {
                return Err(Error::InvalidFile {
                    index,
                    reason: "url is empty",
                });
            }
            if !file.mime.contains('/') {
                return Err(Error::InvalidFile {
                    index,
                    reason: "mime must look like type/subtype",
                });
            }
        }
        Ok(())
    }
}

/// How an admitted input joins the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// Joins work in progress at the next safe boundary.
    #[default]
    Steer,
    /// Waits until the session would otherwise go idle, then starts a new exchange.
    Queue,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Steer => "steer",
            Delivery::Queue => "queue",
        }
    }
}

impl FromStr for Delivery {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "steer" => Ok(Delivery::Steer),
            "queue" => Ok(Delivery::Queue),
            other => Err(Error::UnknownDelivery(other.chars().take(40).collect())),
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rules() {
        assert_eq!(Prompt::text("  ").validate(10), Err(Error::EmptyPrompt));
        assert_eq!(
            Prompt::text("hello world").validate(5),
            Err(Error::PromptTooLarge { size: 11, limit: 5 })
        );
        let with_file = Prompt {
            text: String::new(),
            files: vec![FileAttachment {
                mime: "image/png".into(),
                url: "data:image/png;base64,AAAA".into(),
                filename: None,
            }],
        };
        assert_eq!(with_file.validate(1000), Ok(()));
        assert_eq!("queue".parse(), Ok(Delivery::Queue));
        assert!(matches!(
            "later".parse::<Delivery>(),
            Err(Error::UnknownDelivery(_))
        ));
    }
}
