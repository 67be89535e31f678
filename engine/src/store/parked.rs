//! Deliveries parked while their channel cannot take them
//! (`domain::parked`), kept per (shard, channel) in key order until the
//! shard's owner has fed each to its channel again. They outlive a crash
//! and a shard's handover: the shard's next lease holder drains them.

use async_trait::async_trait;

use super::StoreError;
use crate::domain::{Channel, MAX_SEQUENCE_ID, ParkedDelivery, ParkedKey, ShardId};

/// The parked deliveries of a backend: `Store::parked`.
#[async_trait]
pub trait ParkedStore: Send + Sync {
    /// Stores these deliveries, replacing any with the same (shard, channel, key). Idempotent.
    async fn park(&self, deliveries: &[ParkedDelivery]) -> Result<(), StoreError>;

    /// The parked deliveries of (shard, channel) strictly after `after`
    /// (from the first when None), ascending by key, at most `limit`.
    async fn parked(
        &self,
        shard: ShardId,
        channel: Channel,
        after: Option<ParkedKey>,
        limit: usize,
    ) -> Result<Vec<ParkedDelivery>, StoreError>;

    /// Deletes those of (shard, channel) with these keys; a key with no row is ignored.
    async fn unpark(&self, shard: ShardId, channel: Channel, keys: &[ParkedKey]) -> Result<(), StoreError>;
}

/// What both backends refuse to park, before writing any of `deliveries`:
/// a shard of another shard count than the store's (no owner would ever
/// drain it), or a sequence id no envelope can have (above
/// `MAX_SEQUENCE_ID`, which ScyllaDB's signed bigint keys could not order).
pub(super) fn check_parkable(deliveries: &[ParkedDelivery], shard_count: u16) -> Result<(), StoreError> {
    for d in deliveries {
        if d.shard.index() >= shard_count {
            return Err(StoreError::Backend("shard id is out of range".into()));
        }
        if d.sequence_id > MAX_SEQUENCE_ID {
            return Err(StoreError::Backend("a parked delivery's sequence id is out of range".into()));
        }
    }
    Ok(())
}
