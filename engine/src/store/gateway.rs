//! Spec 002: the push gateway's records (`domain::gateway` says what each
//! is), every key under its tenant.

use async_trait::async_trait;

use super::StoreError;
use crate::domain::{
    GatewayRegistration, GatewayWakeup, LeasedWakeup, NotifyClaim, NotifyKey, PushTargetId, RegistrationId, Revoke,
    RouteKey, ServiceId,
};

/// The gateway records of a backend: `Store::gateway`.
#[async_trait]
pub trait GatewayStore: Send + Sync {
    /// §3.1: stores `registration` as the current route of its (tenant,
    /// account, device) in one atomic step, superseding the previous one,
    /// whose push_target_id then no longer finds it: never two current
    /// routes. Returns the superseded registration's id.
    async fn register(&self, registration: &GatewayRegistration) -> Result<Option<RegistrationId>, StoreError>;

    /// §3.2: deletes the current route of `revoke.route` when it has the
    /// push key and app id the request names (either may be left out).
    /// Returns whether it deleted one.
    async fn unregister(&self, revoke: &Revoke) -> Result<bool, StoreError>;

    /// The current route of a device while `expires_at > now_ms`.
    async fn route(&self, route: &RouteKey, now_ms: i64) -> Result<Option<GatewayRegistration>, StoreError>;

    /// Every current registration of `push_target_id` in `tenant` with
    /// `expires_at > now_ms`, dead-token marks included, in device id order.
    async fn target(
        &self,
        tenant: &ServiceId,
        push_target_id: &PushTargetId,
        now_ms: i64,
    ) -> Result<Vec<GatewayRegistration>, StoreError>;

    /// Marks the route's token dead when its current registration is still
    /// `registration_id` (a device that registered again keeps its new
    /// route). Returns whether it marked.
    async fn mark_token_invalid(&self, route: &RouteKey, registration_id: &RegistrationId) -> Result<bool, StoreError>;

    /// §5.2 idempotency, in one atomic step: a live record (`expires_at >
    /// now_ms`) with another digest answers `Conflict`; with this digest, its
    /// response when committed (`Replay`) or `Busy` while its claim's lease
    /// runs; otherwise (none, expired, or a dead claimant's) the caller gets
    /// a pending claim until `lease_until_ms`, kept until `expires_at_ms`.
    /// Of concurrent callers at most one gets `Claimed`.
    async fn notify_claim(
        &self,
        key: &NotifyKey,
        digest: &[u8; 32],
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<NotifyClaim, StoreError>;

    /// Stores `wakeups` (a wakeup whose id is already stored is kept as it
    /// is: the merge) and the claim's response, kept until `expires_at_ms`.
    /// False, and the response not stored, when the record is no longer the
    /// claim with `lease_until_ms`.
    async fn notify_commit(
        &self,
        key: &NotifyKey,
        lease_until_ms: i64,
        response: &[u8],
        wakeups: &[GatewayWakeup],
        expires_at_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Deletes the pending claim with `lease_until_ms` (nothing was decided:
    /// a retry of the request starts again). Nothing when it is not that claim.
    async fn notify_release(&self, key: &NotifyKey, lease_until_ms: i64) -> Result<(), StoreError>;

    /// Leases at most `limit` wakeups that are due (`not_before <= now_ms`)
    /// and not leased (a lease that ran out is taken over: its worker died),
    /// until `lease_until_ms`. Of concurrent callers one gets each wakeup.
    async fn wakeups_due(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<LeasedWakeup>, StoreError>;

    /// Gives a leased wakeup back for a later attempt. False, changing
    /// nothing, when the lease is no longer the holder's.
    async fn wakeup_reschedule(
        &self,
        leased: &LeasedWakeup,
        not_before_ms: i64,
        attempts: u32,
    ) -> Result<bool, StoreError>;

    /// Deletes a leased wakeup (sent, or given up). False, changing
    /// nothing, when the lease is no longer the holder's.
    async fn wakeup_delete(&self, leased: &LeasedWakeup) -> Result<bool, StoreError>;

    /// A window state value while its `expires_at > now_ms`.
    async fn state(&self, tenant: &ServiceId, key: &[u8], now_ms: i64) -> Result<Option<Vec<u8>>, StoreError>;

    /// Compare-and-set of a window state value: sets `new` until
    /// `expires_at_ms` when the live value is `expected` (`None`: absent or
    /// expired). Returns whether it set.
    async fn state_cas(
        &self,
        tenant: &ServiceId,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Retention: deletes expired registrations, notify records and window
    /// state. Returns how many it deleted; 0 on a backend whose records
    /// expire by themselves (ScyllaDB's TTL).
    async fn delete_expired(&self, now_ms: i64) -> Result<u64, StoreError>;
}

/// §3.2: whether `revoke` names `reg`, the current route of its device: the
/// push key and app id it names (either may be left out) are `reg`'s.
pub fn revokes(revoke: &Revoke, reg: &GatewayRegistration) -> bool {
    revoke.push_key.as_ref().is_none_or(|k| *k == reg.push_key)
        && revoke.app_id.as_ref().is_none_or(|a| reg.app_id.as_ref() == Some(a))
}

/// Most bytes of a window-state key or wakeup id the stores accept (the
/// gateway's own are 33 and 32); every id of a record is bounded by its type.
pub const MAX_GATEWAY_TEXT: usize = 1024;

/// The number of wakeup queues: ScyllaDB partitions the wakeups by queue.
pub const WAKEUP_QUEUES: u16 = 16;

/// The queue of a wakeup id: a stable hash of it.
pub fn wakeup_queue(id: &str) -> u16 {
    // FNV-1a: stable across builds and processes.
    let mut h: u32 = 0x811c_9dc5;
    for b in id.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % u32::from(WAKEUP_QUEUES)) as u16
}
