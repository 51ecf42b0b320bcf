//! Newtype ids and sequence numbers.
//!
//! Ids are a type prefix plus a body. Minted bodies are ULIDs (48-bit millisecond time, 80 bits of
//! entropy, Crockford base32), so ids minted later sort later. The model never reads a clock or a
//! random source: [`SessionId::mint`] and [`MessageId::mint`] take both as arguments, and the
//! runtime supplies them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Longest body accepted after the prefix (a ULID is 26 characters).
const MAX_BODY: usize = 64;

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        ///
        /// Shared, not copied: a clone (every event, delta and message carries ids) is a
        /// reference count.
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// Mints a new sortable id from a time (ms since the Unix epoch) and 80 bits of
            /// entropy.
            pub fn mint(now: Timestamp, entropy: u128) -> Self {
                Self(minted($prefix, ulid::Ulid::from_parts(now.0, entropy)))
            }

            /// Parses and validates an id supplied from outside.
            pub fn parse(value: &str) -> Result<Self, Error> {
                validate(value, $prefix, $kind)?;
                Ok(Self(value.into()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                Self::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(value: String) -> Result<Self, Error> {
                validate(&value, $prefix, $kind)?;
                Ok(Self(value.into()))
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

prefixed_id!(
    /// A session, `ses_…`.
    SessionId,
    "ses_",
    "session"
);
prefixed_id!(
    /// A message or admitted input, `msg_…`. An admitted input keeps its id when it is promoted
    /// into a user message.
    MessageId,
    "msg_",
    "message"
);

prefixed_id!(
    /// A schedule of a session, `sch_…`: unique within its session.
    ScheduleId,
    "sch_",
    "schedule"
);

impl ScheduleId {
    /// The longest body a schedule id may have: the id of the prompt a firing admits holds it
    /// and the firing's time (see [`ScheduleId::firing`]).
    pub const MAX_BODY: usize = 40;

    /// The id of the input the firing of this schedule at `at` admits: the same for every
    /// attempt of that firing, so it is admitted once across retries, restarts and nodes.
    pub fn firing(&self, at: Timestamp) -> MessageId {
        let body = &self.0[Self::PREFIX.len()..];
        MessageId(format!("{}{body}-{}", MessageId::PREFIX, at.0).into())
    }
}

/// The text of a minted id, put together where it is kept: one allocation, no formatting
/// machinery (the runtime mints an id for every message and every input without one).
fn minted(prefix: &str, body: ulid::Ulid) -> Arc<str> {
    let mut text = [0u8; 8 + ulid::ULID_LEN];
    let (head, tail) = text.split_at_mut(prefix.len());
    head.copy_from_slice(prefix.as_bytes());
    body.array_to_str(
        tail.first_chunk_mut()
            .expect("invariant: prefixes are short"),
    );
    let text = &text[..prefix.len() + ulid::ULID_LEN];
    Arc::from(std::str::from_utf8(text).expect("invariant: a prefix and base32 are ASCII"))
}

fn validate(value: &str, prefix: &str, kind: &'static str) -> Result<(), Error> {
    let invalid = |reason| Error::InvalidId {
        kind,
        value: value.chars().take(80).collect(),
        reason,
    };
    let body = value
        .strip_prefix(prefix)
        .ok_or_else(|| invalid("missing prefix"))?;
    if body.is_empty() {
        return Err(invalid("empty body after the prefix"));
    }
    if body.len() > MAX_BODY {
        return Err(invalid("longer than 64 characters after the prefix"));
    }
    if !body
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(
            "only ASCII letters, digits, '_' and '-' are allowed",
        ));
    }
    Ok(())
}

/// Position of an event in its session's log: 0, 1, 2, … without gaps.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl Seq {
    pub const ZERO: Seq = Seq(0);

    pub fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Milliseconds since the Unix epoch. Only ever passed in; the model never reads a clock.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

/// Keeps the ids one minter makes in the order it makes them, within a millisecond too: the
/// time and entropy for each next id, from the clock's time and fresh entropy. Ids minted in
/// order are appended to the store's index instead of landing among the ones before them.
#[derive(Debug, Default)]
pub struct Monotonic {
    last: Option<(u64, u128)>,
}

/// A ULID's entropy: 80 bits.
const ENTROPY: u128 = (1 << 80) - 1;

impl Monotonic {
    pub const fn new() -> Self {
        Monotonic { last: None }
    }

    /// `now` and `entropy` when `now` is past the last id's millisecond. Otherwise (the same
    /// millisecond, or a clock that stepped back) the last id's millisecond and its entropy
    /// raised by a random step of at most 2^32, so the id sorts after the last one and is still
    /// hard to guess; when that overflows, the next millisecond with fresh entropy.
    pub fn next(&mut self, now: Timestamp, entropy: u128) -> (Timestamp, u128) {
        let entropy = entropy & ENTROPY;
        let next = match self.last {
            Some((ms, last)) if now.0 <= ms => {
                let step = 1 + (entropy & 0xFFFF_FFFF);
                match last.checked_add(step).filter(|raised| *raised <= ENTROPY) {
                    Some(raised) => (ms, raised),
                    None => (ms + 1, entropy),
                }
            }
            _ => (now.0, entropy),
        };
        self.last = Some(next);
        (Timestamp(next.0), next.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever the clock does, a minter's ids only grow; with the clock moving on, each is
        /// the plain mint of its time and entropy.
        #[test]
        fn a_minters_ids_only_grow(
            draws in proptest::collection::vec((0u64..6, proptest::prelude::any::<u128>()), 1..200),
        ) {
            let mut minter = Monotonic::new();
            let mut last: Option<(Timestamp, MessageId)> = None;
            for (now, entropy) in draws {
                let (time, bits) = minter.next(Timestamp(now), entropy);
                let id = MessageId::mint(time, bits);
                if last.as_ref().is_none_or(|(ms, _)| now > ms.0) {
                    proptest::prop_assert_eq!(&id, &MessageId::mint(Timestamp(now), entropy));
                }
                if let Some((_, last)) = &last {
                    proptest::prop_assert!(*last < id, "{} then {}", last, id);
                }
                last = Some((time, id));
            }
        }
    }

    #[test]
    fn a_minter_spills_into_the_next_millisecond_when_the_entropy_is_spent() {
        let mut minter = Monotonic::new();
        let first = minter.next(Timestamp(7), ENTROPY - 3);
        assert_eq!(first, (Timestamp(7), ENTROPY - 3));
        let second = minter.next(Timestamp(7), 5);
        assert_eq!(second, (Timestamp(8), 5));
    }

    #[test]
    fn minted_ids_sort_by_time_and_round_trip() {
        let a = SessionId::mint(Timestamp(1_000), u128::MAX);
        let b = SessionId::mint(Timestamp(1_001), 0);
        assert!(a < b);
        assert!(a.as_str().starts_with("ses_"));
        assert_eq!(a.as_str().len(), 4 + 26);
        assert_eq!(SessionId::parse(a.as_str()), Ok(a));
        let body = ulid::Ulid::from_parts(1_002, 7);
        let m = MessageId::mint(Timestamp(1_002), 7);
        assert_eq!(m.as_str(), format!("msg_{body}"));
        assert_eq!(MessageId::parse(m.as_str()), Ok(m));
        let s = ScheduleId::mint(Timestamp(1_002), 7);
        assert_eq!(s.as_str(), format!("sch_{body}"));
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in [
            "",
            "ses_",
            "msg_abc",
            "ses_a b",
            "ses_ü",
            &format!("ses_{}", "a".repeat(65)),
        ] {
            assert!(
                matches!(SessionId::parse(bad), Err(Error::InvalidId { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(MessageId::parse("msg_client-1").is_ok());
    }
}
