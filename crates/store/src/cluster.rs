//! What a store shared by several nodes tells the runtime above it: which sessions this node
//! may write, who holds the others, and when that changes. The embedded store has no cluster
//! ([`crate::Store::ownership`] is `None`: one process owns every session).

use std::fmt;

use agenthost_model::SessionId;

/// A change of this node's partitions, with the [`Ownership::version`] it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This node took these partitions (at a new epoch): their sessions need recovery here.
    Gained(Vec<u32>, u64),
    /// This node no longer holds these partitions: its writes to them are refused from now on,
    /// and their session actors must stop.
    Lost(Vec<u32>, u64),
}

/// One node of the cluster as the lease table last showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    /// How other nodes reach it over HTTP.
    pub url: String,
    /// Whether it renewed its membership within the lease TTL.
    pub alive: bool,
    /// The partitions it holds unexpired leases on.
    pub partitions: Vec<u32>,
}

/// The cluster as this node last read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// This node's id.
    pub node: String,
    pub partitions: u32,
    pub nodes: Vec<Node>,
}

/// Partition ownership, for a store shared by several nodes.
pub trait Ownership: Send + Sync + fmt::Debug {
    /// This node's id.
    fn node(&self) -> &str;
    /// How many partitions sessions hash into.
    fn partitions(&self) -> u32;
    /// The partition of a session.
    fn partition(&self, session: &SessionId) -> u32 {
        partition_of(session, self.partitions())
    }
    /// Whether this node holds the session's partition now.
    fn owns(&self, session: &SessionId) -> bool;
    /// The epoch at which this node holds the session's partition now, if it does: what a drain
    /// fences its writes with ([`crate::Action::Fence`]).
    fn epoch(&self, _session: &SessionId) -> Option<i64> {
        None
    }
    /// The other node holding the session's partition, as last read; `None` when this node
    /// holds it or nobody does (a takeover is due).
    fn owner(&self, session: &SessionId) -> Option<Node>;
    /// The cluster as last read.
    fn view(&self) -> ClusterView;
    /// Changes of this node's partitions from now on.
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Lease>;
    /// Counts the changes of this node's partitions: a holder that has handled the [`Lease`]
    /// carrying this version is up to date.
    fn version(&self) -> u64;
}

/// The partition a session hashes into: FNV-1a over its id, the same on every node and in every
/// release (changing it would move every session).
pub fn partition_of(session: &SessionId, partitions: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in session.as_str().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % u64::from(partitions.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        let id = SessionId::parse("ses_stable").expect("id");
        // The hash is part of the cluster's format: a change moves every session.
        assert_eq!(partition_of(&id, 64), partition_of(&id, 64));
        assert_eq!(partition_of(&id, 1), 0);
        let mut counts = [0u32; 8];
        for n in 0..8000 {
            let id = SessionId::parse(&format!("ses_{n:08}")).expect("id");
            counts[partition_of(&id, 8) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }

    #[test]
    fn the_hash_is_fnv1a() {
        let id = SessionId::parse("ses_a").expect("id");
        // FNV-1a 64 of "ses_a", computed independently.
        let mut h: u64 = 0xcbf29ce484222325;
        for b in b"ses_a" {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
        }
        assert_eq!(u64::from(partition_of(&id, 1_000_003)), h % 1_000_003);
    }
}
