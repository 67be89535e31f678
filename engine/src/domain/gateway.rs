//! The push gateway's durable records (spec 002): typed ids
//! (`gateway_ids.rs`), parsed at the edge and again when a store reads them
//! back; the provider's push key, platform and app id as registered.
//!
//! - **Registrations** (§3.1–3.3): one current route per (tenant, account,
//!   device); a new registration atomically supersedes the old one, so there
//!   are never two current routes. Found by (tenant, push_target_id) for
//!   notify. A registration counts only until its `expires_at`.
//! - **Notify records** (§5.2 idempotency): per (tenant, Idempotency-Key) the
//!   SHA-256 of the body and the stored response, claimed with a lease like
//!   the relay ingress's records, committed together with the request's
//!   wakeups.
//! - **Wakeups** (§5.2 `accepted` is a durable takeover): stored before the
//!   answer, leased by the delivery workers, rescheduled or deleted by the
//!   lease holder only.
//! - **Window state** (§2.4, §4.5, §5.1): small values under (tenant, key)
//!   with an expiry, changed by compare-and-set: the per-window dedup
//!   markers, the aggressive-wakeup counters and the count-bucket dwell.
//!
//! The tenant is the authenticated Source-Service-ID (§3.4 "以 authenticated
//! Source-Service-ID 为顶层 tenant partition"): every key starts with it.

use super::gateway_ids::{
    AccountId, DeviceId, IdempotencyKey, PushRouteId, PushTargetId, RegistrationId, SaltEpochId, ServiceId,
};

/// One registration. Debug shows no value: push keys, account and device ids
/// never reach a log line.
#[derive(Clone, PartialEq, Eq)]
pub struct GatewayRegistration {
    /// The Station service id the registration belongs to (tenant partition).
    pub tenant: ServiceId,
    /// The authenticated session's AccountId (never from a request body).
    pub account_id: AccountId,
    pub device_id: DeviceId,
    /// New for every registration.
    pub registration_id: RegistrationId,
    pub push_target_id: PushTargetId,
    /// The configured provider route the push key belongs to.
    pub push_route_id: PushRouteId,
    pub salt_epoch_id: SaltEpochId,
    /// The provider token as registered (`gateway::schema::PushKey`).
    pub push_key: String,
    pub platform: Option<String>,
    pub app_id: Option<String>,
    pub visible_opt_in: bool,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// The provider declared the token dead: notify answers
    /// `push_token_invalid` for this device until it registers again.
    pub token_invalid: bool,
}

impl std::fmt::Debug for GatewayRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayRegistration")
            .field("expires_at_ms", &self.expires_at_ms)
            .field("token_invalid", &self.token_invalid)
            .finish_non_exhaustive()
    }
}

/// The key of one current route. Debug shows nothing.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RouteKey {
    pub tenant: ServiceId,
    pub account_id: AccountId,
    pub device_id: DeviceId,
}

crate::domain::redacted_debug!(RouteKey);

impl GatewayRegistration {
    pub fn route_key(&self) -> RouteKey {
        RouteKey { tenant: self.tenant.clone(), account_id: self.account_id.clone(), device_id: self.device_id.clone() }
    }
}

/// Which current route an unregister removes (§3.2): the device's, narrowed
/// to a push key and app id when the request names them.
#[derive(Clone, PartialEq, Eq)]
pub struct Revoke {
    pub route: RouteKey,
    pub push_key: Option<String>,
    pub app_id: Option<String>,
}

crate::domain::redacted_debug!(Revoke);

/// A notify request's idempotency key, per tenant. Debug shows nothing.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NotifyKey {
    pub tenant: ServiceId,
    pub idempotency_key: IdempotencyKey,
}

crate::domain::redacted_debug!(NotifyKey);

/// The answer of `GatewayStore::notify_claim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyClaim {
    /// No live record: the caller holds a pending claim until its
    /// `lease_until_ms`, decides, and commits.
    Claimed,
    /// The same body is being handled by another request until `lease_until_ms`.
    Busy { lease_until_ms: i64 },
    /// Handled before with the same body: its stored response.
    Replay(Vec<u8>),
    /// The key was used with another body (`duplicate_conflict`).
    Conflict,
}

/// A stored wakeup: what the delivery worker sends to one device route.
/// The route itself (push key, provider) is read again at send time, so a
/// revoked or superseded registration is never used (§3.3).
#[derive(Clone, PartialEq, Eq)]
pub struct GatewayWakeup {
    /// 32 characters; the same id stored twice is one wakeup
    /// (a batch wakeup's id is its device and window's, so later wakeups of
    /// the window merge into it).
    pub id: String,
    pub route: RouteKey,
    /// The registration the wakeup was accepted for.
    pub registration_id: RegistrationId,
    /// The provider payload, rebuilt from allowed fields only (JSON object).
    pub payload: Vec<u8>,
    /// The collapse key (§2.4) of the window the wakeup was accepted in. A
    /// record, not what is sent: each attempt carries the key of the window
    /// it is sent in (`gateway::egress::CollapseKeys`).
    pub collapse_key: String,
    /// Not sent before (a batch wakeup waits for its window's end; a retry
    /// for its delay).
    pub not_before_ms: i64,
    /// Provider attempts made so far.
    pub attempts: u32,
    /// Given up after this.
    pub expires_at_ms: i64,
}

impl std::fmt::Debug for GatewayWakeup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayWakeup")
            .field("not_before_ms", &self.not_before_ms)
            .field("attempts", &self.attempts)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// A wakeup a worker leased: only this lease may reschedule or delete it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedWakeup {
    pub wakeup: GatewayWakeup,
    pub lease_until_ms: i64,
}
