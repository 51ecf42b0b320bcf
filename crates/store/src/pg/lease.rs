//! Partition leases and node membership.
//!
//! Every third of the TTL a node: records itself alive in `nodes`; renews the leases it holds at
//! the epochs it took them (a lease it no longer holds at that epoch was taken over: it is
//! lost); counts the live nodes and computes its share, `ceil(partitions / live)`; takes free,
//! expired or its own leftover leases (from before a restart) up to that share, each with a new
//! epoch; and hands back partitions beyond its share, fencing its own writes to them first. A
//! node that cannot renew for a whole TTL counts its leases as lost: another node may hold them
//! by then.
//!
//! Clocks only decide when a takeover is tried (the database's `now()`, one clock for all
//! nodes); safety comes from the epochs the writer checks in every transaction.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenthost_model::SessionId;
use tokio::sync::{broadcast, watch};
use tokio_postgres::Client;

use super::{Connector, PgConfig, db, wait};
use crate::cluster::{ClusterView, Lease, Node, Ownership, partition_of};
use crate::error::{Error, Result};
use crate::{Health, lock};

/// The partitions this node holds and the epoch it took each at. `version` changes with every
/// change, so the writer knows when its cached rows may be stale.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held {
    pub(crate) epochs: HashMap<u32, i64>,
    pub(crate) version: u64,
}

#[derive(Debug)]
pub(crate) struct Leases {
    node: String,
    url: String,
    partitions: u32,
    ttl: Duration,
    held: Mutex<Arc<Held>>,
    /// The owner of each partition with an unexpired lease, and the cluster, as last read.
    owners: Mutex<Vec<Option<String>>>,
    view: Mutex<ClusterView>,
    changes: broadcast::Sender<Lease>,
    /// Why the last round failed; `None` after a round that worked.
    failure: Mutex<Option<String>>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Leases {
    pub(crate) fn new(config: &PgConfig) -> Self {
        Leases {
            node: config.node_id.clone(),
            url: config.advertise_url.clone(),
            partitions: config.partitions,
            ttl: config.lease_ttl.max(Duration::from_millis(30)),
            held: Mutex::default(),
            owners: Mutex::new(vec![None; config.partitions as usize]),
            view: Mutex::default(),
            changes: broadcast::channel(256).0,
            failure: Mutex::default(),
            stop: watch::channel(false).0,
            task: Mutex::default(),
        }
    }

    pub(crate) fn held(&self) -> Arc<Held> {
        lock(&self.held).clone()
    }

    pub(crate) fn health(&self) -> Health {
        match &*lock(&self.failure) {
            None => Health::Ok,
            Some(reason) => Health::Unreachable(reason.clone()),
        }
    }

    /// Runs the first round (so a node alone holds every partition when this returns) and
    /// starts the rounds that follow on the store's runtime.
    pub(crate) fn start(self: &Arc<Self>, connector: &Connector, client: Client) -> Result<()> {
        let leases = self.clone();
        let first = connector.rt.spawn(async move {
            let result = leases.round(&client).await;
            (client, result)
        });
        let (client, result) =
            wait(first).map_err(|e| Error::Io(format!("the lease round failed: {e}")))?;
        result?;
        let leases = self.clone();
        let mut stop = self.stop.subscribe();
        let connector = connector.clone();
        let task = connector.rt.clone().spawn(async move {
            let mut client = Some(client);
            let mut renewed = Instant::now();
            let mut tick = tokio::time::interval(leases.ttl / 3);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => break,
                }
                let started = Instant::now();
                // A connection the database dropped is opened again for the next round.
                if client.as_ref().is_none_or(Client::is_closed) {
                    client = connector.connect_async().await.ok();
                }
                let result = match &client {
                    Some(client) => leases.round(client).await,
                    None => Err(Error::Io("PostgreSQL: cannot connect".into())),
                };
                match result {
                    Ok(()) => {
                        renewed = started;
                        *lock(&leases.failure) = None;
                    }
                    Err(e) => {
                        *lock(&leases.failure) = Some(e.to_string());
                        tracing::warn!(node = %leases.node, error = %e, "lease round failed");
                        if renewed.elapsed() >= leases.ttl {
                            // Another node may hold them by now.
                            leases.drop_all();
                        }
                    }
                }
            }
            // Bounded: a database that does not answer lets the leases expire instead.
            if let Some(client) = &client {
                let _ = tokio::time::timeout(leases.ttl, leases.release_all(client)).await;
            }
        });
        *lock(&self.task) = Some(task);
        Ok(())
    }

    /// Stops the rounds and hands every held partition back, so that other nodes (or this one,
    /// restarted) take them at once.
    pub(crate) fn stop(&self) {
        let _ = self.stop.send(true);
        if let Some(task) = lock(&self.task).take() {
            let _ = wait(task);
        }
    }

    /// One round: membership, renewal, share, the view.
    async fn round(&self, client: &Client) -> Result<()> {
        let ttl_ms = millis(self.ttl);
        client
            .execute(
                "INSERT INTO nodes (node, url, seen_at) VALUES ($1, $2, now())
                 ON CONFLICT (node) DO UPDATE SET url = excluded.url, seen_at = now()",
                &[&self.node, &self.url],
            )
            .await
            .map_err(db)?;
        let held = self.held();
        if !held.epochs.is_empty() {
            let (parts, epochs): (Vec<i32>, Vec<i64>) =
                held.epochs.iter().map(|(p, e)| (*p as i32, *e)).unzip();
            let rows = client
                .query(
                    "UPDATE leases l SET expires_at = now() + $2 * interval '1 millisecond'
                     FROM UNNEST($3::int4[], $4::int8[]) AS h(part, epoch)
                     WHERE l.part = h.part AND l.epoch = h.epoch AND l.owner = $1
                       AND l.part IN (SELECT part FROM leases WHERE part = ANY($3::int4[])
                                      ORDER BY part FOR UPDATE)
                     RETURNING l.part",
                    &[&self.node, &ttl_ms, &parts, &epochs],
                )
                .await
                .map_err(db)?;
            let kept: std::collections::HashSet<u32> =
                rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect();
            let lost: Vec<u32> = held
                .epochs
                .keys()
                .copied()
                .filter(|p| !kept.contains(p))
                .collect();
            if !lost.is_empty() {
                tracing::warn!(node = %self.node, partitions = ?lost, "leases taken over");
                self.remove(&lost);
            }
        }
        let live: i64 = client
            .query_one(
                "SELECT count(*) FROM nodes WHERE seen_at > now() - $1 * interval '1 millisecond'",
                &[&ttl_ms],
            )
            .await
            .map_err(db)?
            .get(0);
        let live = live.max(1) as u32;
        let share = self.partitions.div_ceil(live);
        let holding = self.held().epochs.len() as u32;
        if holding < share {
            self.acquire(client, share - holding).await?;
        } else if holding > share {
            self.release(client, holding - share).await?;
        }
        self.read_view(client).await
    }

    /// Takes up to `want` partitions that are free, expired, or this node's own from before a
    /// restart, each at a new epoch.
    async fn acquire(&self, client: &Client, want: u32) -> Result<()> {
        let held: Vec<i32> = self.held().epochs.keys().map(|p| *p as i32).collect();
        let rows = client
            .query(
                "UPDATE leases SET owner = $1, epoch = epoch + 1,
                     expires_at = now() + $2 * interval '1 millisecond'
                 WHERE part IN (
                     SELECT part FROM leases
                     WHERE (owner IS NULL OR expires_at < now() OR owner = $1)
                       AND part <> ALL($3::int4[])
                     ORDER BY owner IS NOT DISTINCT FROM $1 DESC, part LIMIT $4
                     FOR UPDATE SKIP LOCKED)
                 RETURNING part, epoch",
                &[&self.node, &millis(self.ttl), &held, &i64::from(want)],
            )
            .await
            .map_err(db)?;
        if rows.is_empty() {
            return Ok(());
        }
        let gained: Vec<(u32, i64)> = rows
            .iter()
            .map(|r| (r.get::<_, i32>(0) as u32, r.get::<_, i64>(1)))
            .collect();
        let version = {
            let mut held = lock(&self.held);
            let mut next = (**held).clone();
            next.epochs.extend(gained.iter().copied());
            next.version += 1;
            let version = next.version;
            *held = Arc::new(next);
            version
        };
        let mut parts: Vec<u32> = gained.iter().map(|(p, _)| *p).collect();
        parts.sort_unstable();
        tracing::info!(node = %self.node, partitions = ?parts, "leases taken");
        let _ = self.changes.send(Lease::Gained(parts, version));
        Ok(())
    }

    /// Hands back `count` partitions (the highest numbered): this node's writes to them are
    /// fenced before the leases are freed.
    async fn release(&self, client: &Client, count: u32) -> Result<()> {
        let mut parts: Vec<u32> = self.held().epochs.keys().copied().collect();
        parts.sort_unstable();
        let extra = parts.split_off(parts.len() - count as usize);
        self.remove(&extra);
        let extra: Vec<i32> = extra.iter().map(|p| *p as i32).collect();
        client
            .execute(
                "UPDATE leases SET owner = NULL, expires_at = now()
                 WHERE owner = $1 AND part IN (SELECT part FROM leases
                                               WHERE part = ANY($2::int4[])
                                               ORDER BY part FOR UPDATE)",
                &[&self.node, &extra],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Leaves the cluster: hands every partition back and removes this node from `nodes`, so
    /// the others' shares grow at their next round.
    async fn release_all(&self, client: &Client) {
        let count = self.held().epochs.len() as u32;
        let left = async {
            if count > 0 {
                self.release(client, count).await?;
            }
            client
                .execute("DELETE FROM nodes WHERE node = $1", &[&self.node])
                .await
                .map_err(db)
        };
        if let Err(e) = left.await {
            tracing::warn!(node = %self.node, error = %e, "could not leave the cluster cleanly; its leases expire");
        }
    }

    /// Forgets partitions (their writes are refused from now on) and says so.
    fn remove(&self, parts: &[u32]) {
        let version = {
            let mut held = lock(&self.held);
            let mut next = (**held).clone();
            for p in parts {
                next.epochs.remove(p);
            }
            next.version += 1;
            let version = next.version;
            *held = Arc::new(next);
            version
        };
        let mut parts = parts.to_vec();
        parts.sort_unstable();
        let _ = self.changes.send(Lease::Lost(parts, version));
    }

    fn drop_all(&self) {
        let parts: Vec<u32> = self.held().epochs.keys().copied().collect();
        if !parts.is_empty() {
            tracing::warn!(node = %self.node, "leases not renewed for a whole TTL: dropped");
            self.remove(&parts);
        }
    }

    async fn read_view(&self, client: &Client) -> Result<()> {
        let ttl_ms = millis(self.ttl);
        let leases = client
            .query(
                "SELECT part, owner FROM leases WHERE owner IS NOT NULL AND expires_at > now()",
                &[],
            )
            .await
            .map_err(db)?;
        let nodes = client
            .query(
                "SELECT node, url, seen_at > now() - $1 * interval '1 millisecond' FROM nodes
                 ORDER BY node",
                &[&ttl_ms],
            )
            .await
            .map_err(db)?;
        let mut owners = vec![None; self.partitions as usize];
        let mut by_node: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for row in &leases {
            let part = row.get::<_, i32>(0) as u32;
            let owner: String = row.get(1);
            if let Some(slot) = owners.get_mut(part as usize) {
                *slot = Some(owner.clone());
            }
            by_node.entry(owner).or_default().push(part);
        }
        let nodes = nodes
            .iter()
            .map(|row| {
                let id: String = row.get(0);
                let mut partitions = by_node.remove(&id).unwrap_or_default();
                partitions.sort_unstable();
                Node {
                    url: row.get(1),
                    alive: row.get(2),
                    partitions,
                    id,
                }
            })
            .collect();
        *lock(&self.owners) = owners;
        *lock(&self.view) = ClusterView {
            node: self.node.clone(),
            partitions: self.partitions,
            nodes,
        };
        Ok(())
    }
}

impl Ownership for Leases {
    fn node(&self) -> &str {
        &self.node
    }

    fn version(&self) -> u64 {
        lock(&self.held).version
    }

    fn partitions(&self) -> u32 {
        self.partitions
    }

    fn owns(&self, session: &SessionId) -> bool {
        let part = partition_of(session, self.partitions);
        lock(&self.held).epochs.contains_key(&part)
    }

    fn epoch(&self, session: &SessionId) -> Option<i64> {
        let part = partition_of(session, self.partitions);
        lock(&self.held).epochs.get(&part).copied()
    }

    fn owner(&self, session: &SessionId) -> Option<Node> {
        if self.owns(session) {
            return None;
        }
        let part = partition_of(session, self.partitions);
        let owner = lock(&self.owners).get(part as usize).cloned().flatten()?;
        if owner == self.node {
            return None;
        }
        lock(&self.view)
            .nodes
            .iter()
            .find(|n| n.id == owner)
            .cloned()
    }

    fn view(&self) -> ClusterView {
        lock(&self.view).clone()
    }

    fn subscribe(&self) -> broadcast::Receiver<Lease> {
        self.changes.subscribe()
    }
}
