//! Spec 003 §2.5: the relay ingress's idempotency records (`domain::relay`),
//! one per hub and `delivery_id`, claimed with a lease and settled with the
//! provider's answer.

use async_trait::async_trait;

use super::StoreError;
use crate::domain::{RelayClaim, RelayKey, RelaySettled};

/// The relay records of a backend: `Store::relay`.
#[async_trait]
pub trait RelayStore: Send + Sync {
    /// Spec 003 §2.5, in one atomic step: when `key` has a live record
    /// (`expires_at > now_ms`) that is settled, answer it; when it is a
    /// pending claim whose lease has not run out (`lease_until > now_ms`),
    /// answer `Busy`; otherwise (no record, an expired one, or a claim whose
    /// holder died) store a pending claim until `lease_until_ms`, kept until
    /// `expires_at_ms`, and answer `Claimed`. Of concurrent callers at most
    /// one gets `Claimed`.
    async fn claim(
        &self,
        key: &RelayKey,
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<RelayClaim, StoreError>;

    /// Settles the pending claim `claim` stored with `lease_until_ms`,
    /// kept until `expires_at_ms`. Changes nothing when the record is no
    /// longer that claim (another caller took it over after the lease ran out).
    async fn settle(
        &self,
        key: &RelayKey,
        lease_until_ms: i64,
        settled: RelaySettled,
        expires_at_ms: i64,
    ) -> Result<(), StoreError>;

    /// Deletes the pending claim stored with `lease_until_ms` (the provider
    /// request failed transiently: the hub's retry must send again). Changes
    /// nothing when the record is no longer that claim.
    async fn release(&self, key: &RelayKey, lease_until_ms: i64) -> Result<(), StoreError>;

    /// Retention: deletes relay records with `expires_at <= now_ms`. Returns
    /// how many it deleted; a backend whose records expire by themselves
    /// (ScyllaDB's TTL) answers 0.
    async fn delete_expired(&self, now_ms: i64) -> Result<u64, StoreError>;
}
