//! What `fanout cluster status` shows an operator, read from the store: the
//! live engine nodes, which node holds each shard's lease and under which
//! term, and how far each shard's dispatch lags its ingest (boundary minus
//! checkpoint, and the age of the oldest envelope not yet dispatched). On a
//! store one node owns alone (the embedded store) that node owns every
//! shard.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use crate::domain::{ShardId, Timestamp};
use crate::store::{LeaseHolder, LiveNode, NodeId, ShardLeases, Store, StoreError};

/// Shards read at once.
const CONCURRENCY: usize = 16;

/// The cluster as the store records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterStatus {
    /// "redb" or "scylla".
    pub backend: &'static str,
    /// Live nodes, in node order, each with the shards it holds.
    pub nodes: Vec<NodeStatus>,
    /// Every shard, in shard order.
    pub shards: Vec<ShardStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeStatus {
    pub node: String,
    /// The gRPC address it advertises.
    pub address: String,
    /// How many shards' leases it holds.
    pub shards: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardStatus {
    pub shard: u16,
    /// The lease holder; `None` while no node holds it (a handover).
    pub owner: Option<String>,
    pub address: Option<String>,
    /// The term its owner appends under; `None` on the embedded store, or
    /// before the first term.
    pub term: Option<u64>,
    /// What is left of the lease unless renewed.
    pub lease_expires_in_seconds: Option<u64>,
    /// The largest id whose whole prefix is stored.
    pub boundary: u64,
    /// Every delivery at or below it has had a first attempt.
    pub checkpoint: u64,
    /// `boundary - checkpoint`: ids stored and not yet dispatched.
    pub lag: u64,
    /// The age of the oldest stored envelope above the checkpoint; `None`
    /// when there is none (the ids above it were not push-eligible).
    pub oldest_undelivered_age_seconds: Option<f64>,
}

/// Reads the status of the cluster sharing `store` (of `shard_count`
/// shards) at `now`: from `leases` (`Store::leases`) when several nodes
/// share it, else `local` (this node's id and advertised address) owns
/// every shard.
pub async fn read(
    store: Arc<dyn Store>,
    leases: Option<Arc<dyn ShardLeases>>,
    shard_count: u16,
    local: LiveNode,
    now: Timestamp,
) -> Result<ClusterStatus, StoreError> {
    let (nodes, holders) = match leases {
        Some(leases) => futures::try_join!(leases.node_addresses(), leases.lease_holders())?,
        None => {
            let holders = ShardId::all(shard_count)
                .map(|shard| LeaseHolder {
                    shard,
                    node: local.node.clone(),
                    address: local.address.clone(),
                    term: None,
                    expires_in: None,
                })
                .collect();
            (vec![local], holders)
        }
    };
    let by_shard: BTreeMap<ShardId, LeaseHolder> = holders.into_iter().map(|h| (h.shard, h)).collect();
    let mut held: BTreeMap<&NodeId, usize> = BTreeMap::new();
    for h in by_shard.values() {
        *held.entry(&h.node).or_default() += 1;
    }
    let nodes = nodes
        .iter()
        .map(|n| NodeStatus {
            node: n.node.to_string(),
            address: n.address.clone(),
            shards: held.get(&n.node).copied().unwrap_or(0),
        })
        .collect();
    let reads = ShardId::all(shard_count).map(|shard| {
        let (store, holder) = (store.clone(), by_shard.get(&shard));
        async move {
            let position = store.shard_position(shard).await?;
            let oldest = store.read_window(shard, position.checkpoint, position.boundary, 1).await?;
            let age = oldest.first().map(|e| age_seconds(now, e.server_ts_ns));
            Ok::<_, StoreError>(ShardStatus {
                shard: shard.index(),
                owner: holder.map(|h| h.node.to_string()),
                address: holder.map(|h| h.address.clone()),
                term: holder.and_then(|h| h.term),
                lease_expires_in_seconds: holder.and_then(|h| h.expires_in).map(|d| d.as_secs()),
                boundary: position.boundary,
                checkpoint: position.checkpoint,
                lag: position.boundary.saturating_sub(position.checkpoint),
                oldest_undelivered_age_seconds: age,
            })
        }
    });
    let mut shards: Vec<ShardStatus> = stream::iter(reads).buffer_unordered(CONCURRENCY).try_collect().await?;
    shards.sort_by_key(|s| s.shard);
    Ok(ClusterStatus { backend: store.backend_name(), nodes, shards })
}

/// Seconds from `ts_ns` to `now`, never negative (clocks differ between nodes).
fn age_seconds(now: Timestamp, ts_ns: i64) -> f64 {
    let nanos = now.as_unix_nanos().saturating_sub(ts_ns).max(0);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)).as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EnvelopeKind, NewEnvelope};
    use crate::store::RedbStore;
    use crate::testing::MemoryLeases;

    fn local() -> LiveNode {
        LiveNode { node: NodeId("embedded".into()), address: "10.0.0.5:50051".into() }
    }

    /// Three push-eligible envelopes on one shard, stored 5 s ago, the first dispatched.
    async fn lagging(store: &Arc<dyn Store>) -> ShardId {
        let topic = crate::testing::envelope(0).topic;
        let new = || NewEnvelope::new(topic.clone(), 4, EnvelopeKind::Application, true, None, vec![1], None).unwrap();
        let stored_at = Timestamp::now().as_unix_nanos() - 5_000_000_000;
        store.append(&[new(), new(), new()], stored_at).await.unwrap();
        let shard = topic.shard(4);
        store.advance_checkpoint(shard, 1).await.unwrap();
        shard
    }

    fn embedded(dir: &tempfile::TempDir) -> Arc<dyn Store> {
        Arc::new(RedbStore::open(dir.path(), 4).unwrap())
    }

    #[tokio::test]
    async fn on_the_embedded_store_one_node_owns_every_shard_and_the_lag_is_boundary_minus_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = embedded(&dir);
        let shard = lagging(&store).await;

        let status = read(store, None, 4, local(), Timestamp::now()).await.unwrap();
        assert_eq!(status.backend, "redb");
        let node = NodeStatus { node: "embedded".into(), address: "10.0.0.5:50051".into(), shards: 4 };
        assert_eq!(status.nodes, vec![node]);
        assert_eq!(status.shards.iter().map(|s| s.shard).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert!(status.shards.iter().all(|s| s.owner.as_deref() == Some("embedded") && s.term.is_none()));
        let lagging = &status.shards[usize::from(shard.index())];
        assert_eq!((lagging.boundary, lagging.checkpoint, lagging.lag), (3, 1, 2));
        let age = lagging.oldest_undelivered_age_seconds.unwrap();
        assert!((5.0..60.0).contains(&age), "the oldest undelivered envelope was stored 5 s ago: {age}");
        for other in status.shards.iter().filter(|s| s.shard != shard.index()) {
            assert_eq!((other.lag, other.oldest_undelivered_age_seconds), (0, None));
        }
    }

    #[tokio::test]
    async fn with_leases_each_shard_names_its_holder_and_term_and_each_node_its_count() {
        let dir = tempfile::tempdir().unwrap();
        let store = embedded(&dir);
        let shard = lagging(&store).await;
        let leases = Arc::new(MemoryLeases::default());
        let (a, b) = (NodeId("a".into()), NodeId("b".into()));
        let ttl = Duration::from_secs(30);
        for n in [&a, &b] {
            leases.heartbeat(n, &format!("{n}:50051"), ttl).await.unwrap();
        }
        let [s0, s1, s2, _] = [0, 1, 2, 3].map(|i| ShardId::parse(i, 4).unwrap());
        for (s, n) in [(s0, &a), (s1, &a), (s2, &b)] {
            assert!(leases.acquire_lease(s, n, &format!("{n}:50051"), ttl).await.unwrap());
        }
        // s2 changes hands: a new term.
        leases.release_lease(s2, &b).await.unwrap();
        assert!(leases.acquire_lease(s2, &a, "a:50051", ttl).await.unwrap());

        let status = read(store, Some(leases), 4, local(), Timestamp::now()).await.unwrap();
        let nodes: Vec<(&str, &str, usize)> =
            status.nodes.iter().map(|n| (n.node.as_str(), n.address.as_str(), n.shards)).collect();
        assert_eq!(nodes, vec![("a", "a:50051", 3), ("b", "b:50051", 0)]);
        let shards: Vec<(Option<&str>, Option<u64>)> =
            status.shards.iter().map(|s| (s.owner.as_deref(), s.term)).collect();
        assert_eq!(shards, vec![(Some("a"), Some(1)), (Some("a"), Some(1)), (Some("a"), Some(2)), (None, None)]);
        assert!(status.shards[..3].iter().all(|s| s.lease_expires_in_seconds.is_some_and(|left| left <= 30)));
        assert_eq!(status.shards[3].address, None, "no holder: a handover");
        assert_eq!(status.shards[usize::from(shard.index())].lag, 2, "lag is read whoever holds the lease");
    }

    #[test]
    fn an_age_is_never_negative() {
        let now = Timestamp::now();
        assert_eq!(age_seconds(now, now.as_unix_nanos() + 1_000_000_000), 0.0);
        assert!((age_seconds(now, now.as_unix_nanos() - 2_000_000_000) - 2.0).abs() < 1e-9);
    }
}
