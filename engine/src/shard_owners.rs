//! Who owns the shards this node does not: the advertised gRPC address of
//! each shard's lease holder, as this node last read it. Ingest forwards an
//! envelope of another node's shard there (or names it in its answer), and
//! the shard map that smart publishers ask for is built from it.
//!
//! A read per envelope would cost a lease read per shard per Publish behind
//! a load balancer, so an owner read is kept for `fresh_for` (a lease round,
//! a third of the TTL). Only another node's address is kept: "no owner" and
//! "this node's own address" (a dead predecessor's lease) are read again at
//! every ask, as they last only while leases move. A stale address costs no
//! safety: the node it names checks its own lease before appending and
//! answers the envelope "owned by ..." if the shard moved; a forward that
//! fails forgets the address at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ShardId;
use crate::store::{ShardLeases, StoreError};

pub struct ShardOwners {
    leases: Arc<dyn ShardLeases>,
    /// This node's own advertised address: a lease naming it that this node
    /// does not hold is a dead predecessor's, never a place to send to.
    address: String,
    fresh_for: Duration,
    known: Mutex<HashMap<ShardId, (String, Instant)>>,
}

impl ShardOwners {
    pub fn new(leases: Arc<dyn ShardLeases>, address: String, fresh_for: Duration) -> Self {
        Self { leases, address, fresh_for, known: Mutex::new(HashMap::new()) }
    }

    /// The address of the other node that holds `shard`'s lease; `None`
    /// when no node does, or only this node's own address does (which
    /// this node's caller knows it does not hold).
    pub async fn other_owner(&self, shard: ShardId) -> Result<Option<String>, StoreError> {
        let now = Instant::now();
        if let Some((address, read)) = self.lock().get(&shard)
            && now.duration_since(*read) < self.fresh_for
        {
            return Ok(Some(address.clone()));
        }
        let owner = match self.leases.lease_owner(shard).await? {
            Some((_, address)) if !address.is_empty() && address != self.address => Some(address),
            _ => None,
        };
        let mut known = self.lock();
        match &owner {
            Some(address) => known.insert(shard, (address.clone(), now)),
            None => known.remove(&shard),
        };
        Ok(owner)
    }

    /// A forward to `address` for `shard` failed: read the lease again next
    /// time rather than keep sending to a node that may be gone.
    pub fn forget(&self, shard: ShardId, address: &str) {
        let mut known = self.lock();
        if known.get(&shard).is_some_and(|(a, _)| a == address) {
            known.remove(&shard);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ShardId, (String, Instant)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeId;
    use crate::testing::MemoryLeases;

    const TTL: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn another_nodes_address_is_kept_for_a_round_and_the_rest_read_every_time() {
        let leases = Arc::new(MemoryLeases::default());
        let owners = ShardOwners::new(leases.clone(), "me:1".into(), Duration::from_secs(3));
        let shard = ShardId::FIRST;
        assert_eq!(owners.other_owner(shard).await.unwrap(), None, "no lease");
        // A dead predecessor's lease at this node's own address is no owner.
        assert!(leases.acquire_lease(shard, &NodeId("old".into()), "me:1", TTL).await.unwrap());
        assert_eq!(owners.other_owner(shard).await.unwrap(), None);
        leases.release_lease(shard, &NodeId("old".into())).await.unwrap();
        // Neither was kept: the next owner shows at once.
        assert!(leases.acquire_lease(shard, &NodeId("b".into()), "b:1", TTL).await.unwrap());
        assert_eq!(owners.other_owner(shard).await.unwrap().as_deref(), Some("b:1"));

        // The shard moves to c: b is still named for the rest of the round.
        leases.release_lease(shard, &NodeId("b".into())).await.unwrap();
        assert!(leases.acquire_lease(shard, &NodeId("c".into()), "c:1", TTL).await.unwrap());
        assert_eq!(owners.other_owner(shard).await.unwrap().as_deref(), Some("b:1"));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(owners.other_owner(shard).await.unwrap().as_deref(), Some("c:1"), "read again after a round");

        // A failed forward forgets the address it went to, not another.
        leases.release_lease(shard, &NodeId("c".into())).await.unwrap();
        assert!(leases.acquire_lease(shard, &NodeId("d".into()), "d:1", TTL).await.unwrap());
        owners.forget(shard, "b:1");
        assert_eq!(owners.other_owner(shard).await.unwrap().as_deref(), Some("c:1"));
        owners.forget(shard, "c:1");
        assert_eq!(owners.other_owner(shard).await.unwrap().as_deref(), Some("d:1"));
    }
}
