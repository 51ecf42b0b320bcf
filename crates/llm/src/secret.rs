//! [`ApiKey`], a credential that cannot be printed by accident.

use std::fmt;

/// An API key. `Debug` prints `ApiKey([redacted])` and there is no `Display`, so a key cannot
/// reach a log line or an error message through formatting; the provider clients also scrub it
/// from provider error messages that echo it back.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// Reads a key from an environment variable; `None` when unset or empty.
    pub fn from_env(var: &str) -> Option<Self> {
        std::env::var(var)
            .ok()
            .filter(|key| !key.is_empty())
            .map(Self)
    }

    /// The key itself, for building the request header and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}
