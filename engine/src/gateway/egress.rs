//! Provider egress (§2.4, §4.5, §5.1): what a provider may see of a
//! wake-up, and when.
//!
//! - `WakeupPayload` is rebuilt from a verified notify and has a field for
//!   each allowed item only (push_target_id, wakeup_kind, push_hint and its
//!   key, minimised counts, §4.5's evaluation_locus_unresolved): nothing else
//!   can pass, because nothing else can be put in it. The collapse key rides
//!   beside it as the provider's header (`ProviderWakeup`).
//! - `DedupKey` (§2.4): one wake-up per (account, device, route,
//!   source_event_digest) per window; it never leaves the server (no
//!   Serialize, no Display).
//! - `RateWindow` (§4.5): above the aggressive threshold, or on a hardened
//!   route, wake-ups wait for the end of their bucket and merge into one
//!   batch wake-up.
//! - `BucketHysteresis` / `BucketDwell` (§5.1): bucket outputs switch only
//!   past the band and after the dwell.

use std::sync::Arc;
use std::time::Duration;

use hmac::Mac;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::grid::{BucketIndex, CountGrid};
use super::identity::{CollapseKey, DeliveryWindowId, PushSecret, SaltSecrets};
use super::jcs;
use super::schema::{CountValue, L10nKey, Notification, PushHint, RequestDigest, WakeupKind};
use crate::domain::{AccountId, DeviceId, PushRouteId, PushTargetId, SaltEpochId};

/// A count as a provider may see it: a flag or a bucket label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EgressCount {
    Flag(bool),
    Bucket(String),
}

impl EgressCount {
    fn from_value(value: CountValue, grid: &CountGrid) -> Self {
        match value {
            CountValue::Flag(b) => Self::Flag(b),
            CountValue::Bucket(i) => Self::Bucket(grid.label(i).to_owned()),
        }
    }
}

/// §5.1 minimised counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressCounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub badge: Option<EgressCount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed_call: Option<EgressCount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread_increment: Option<u32>,
}

impl EgressCounts {
    fn is_empty(&self) -> bool {
        self.badge.is_none() && self.missed_call.is_none() && self.unread_increment.is_none()
    }
}

/// The provider-visible wake-up (§5.1 "provider payload 的允许集合"). Its
/// serde form is the provider payload itself, and the form it is stored in
/// while it waits; reading it back refuses any other member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "StoredPayload", into = "StoredPayload")]
pub struct WakeupPayload {
    push_target_id: PushTargetId,
    wakeup_kind: WakeupKind,
    push_hint: Option<PushHint>,
    evaluation_locus_unresolved: bool,
    counts: EgressCounts,
}

impl WakeupPayload {
    /// Rebuilds the payload from the allowed fields of a verified
    /// notification; `route_tokens`, `devices` and everything at the top
    /// level (event_kind, reason_code, audit_envelope) stay behind.
    pub fn rebuild(notification: &Notification, grid: &CountGrid) -> Self {
        let counts = notification.counts.map(|c| EgressCounts {
            badge: c.badge.map(|v| EgressCount::from_value(v, grid)),
            missed_call: c.missed_call.map(|v| EgressCount::from_value(v, grid)),
            unread_increment: c.unread_increment,
        });
        Self {
            push_target_id: notification.push_target_id,
            wakeup_kind: notification.wakeup_kind,
            push_hint: notification.push_hint.clone(),
            evaluation_locus_unresolved: notification.evaluation_locus_unresolved,
            counts: counts.unwrap_or_default(),
        }
    }

    pub fn counts(&self) -> &EgressCounts {
        &self.counts
    }

    /// Replaces the badge with the bucket the route's dwell allows.
    pub fn set_badge(&mut self, badge: Option<EgressCount>) {
        self.counts.badge = badge;
    }

    /// §4.5: wake-ups waiting in one bucket become one batch wake-up. The
    /// latest kind and counts stand (the device syncs everything anyway), a
    /// hint survives only if every merged wake-up had it, increments add up
    /// (capped at `max_increment`), and the batch is marked
    /// `evaluation_locus_unresolved` ("仍携带 evaluation_locus_unresolved=true").
    pub fn merge(self, newer: Self, max_increment: u32) -> Self {
        let increment = match (self.counts.unread_increment, newer.counts.unread_increment) {
            (Some(a), Some(b)) => Some(a.saturating_add(b).min(max_increment)),
            (a, b) => a.or(b),
        };
        let push_hint = if self.push_hint == newer.push_hint { newer.push_hint } else { None };
        Self {
            push_target_id: newer.push_target_id,
            wakeup_kind: newer.wakeup_kind,
            push_hint,
            evaluation_locus_unresolved: true,
            counts: EgressCounts {
                badge: newer.counts.badge.or(self.counts.badge),
                missed_call: newer.counts.missed_call.or(self.counts.missed_call),
                unread_increment: increment,
            },
        }
    }

    /// The provider payload object (the APNs custom keys / FCM `data`).
    pub fn to_json(&self) -> Map<String, Value> {
        match serde_json::to_value(self).expect("a payload serializes") {
            Value::Object(map) => map,
            _ => unreachable!("a payload is an object"),
        }
    }

    /// Its encoded length, for §5.2 `push_payload_too_large`.
    pub fn encoded_len(&self) -> usize {
        serde_json::to_vec(self).expect("a payload serializes").len()
    }
}

/// The serde form of `WakeupPayload`: the provider payload's members.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredPayload {
    push_target_id: PushTargetId,
    wakeup_kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    push_hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    push_hint_l10n_key: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    evaluation_locus_unresolved: bool,
    #[serde(default, skip_serializing_if = "EgressCounts::is_empty")]
    counts: EgressCounts,
}

impl From<WakeupPayload> for StoredPayload {
    fn from(p: WakeupPayload) -> Self {
        Self {
            push_target_id: p.push_target_id,
            wakeup_kind: p.wakeup_kind.as_str().to_owned(),
            push_hint: p.push_hint.as_ref().map(|h| h.as_str().to_owned()),
            push_hint_l10n_key: p.push_hint.as_ref().and_then(PushHint::l10n_key).map(|k| k.as_str().to_owned()),
            evaluation_locus_unresolved: p.evaluation_locus_unresolved,
            counts: p.counts,
        }
    }
}

impl TryFrom<StoredPayload> for WakeupPayload {
    type Error = &'static str;

    fn try_from(s: StoredPayload) -> Result<Self, &'static str> {
        let wakeup_kind = WakeupKind::parse(&s.wakeup_kind).ok_or("unknown wakeup_kind")?;
        let push_hint = match (s.push_hint.as_deref(), s.push_hint_l10n_key) {
            (None, None) => None,
            (Some("new_message"), None) => Some(PushHint::NewMessage),
            (Some("incoming_call"), None) => Some(PushHint::IncomingCall),
            (Some("mention_self"), None) => Some(PushHint::MentionSelf),
            (Some("l10n_key"), Some(key)) => Some(PushHint::L10nKey(L10nKey::parse(&key).ok_or("bad l10n key")?)),
            _ => return Err("bad push_hint"),
        };
        Ok(Self {
            push_target_id: s.push_target_id,
            wakeup_kind,
            push_hint,
            evaluation_locus_unresolved: s.evaluation_locus_unresolved,
            counts: s.counts,
        })
    }
}

/// A wake-up as handed to a provider: the payload and its §2.4 collapse key
/// (APNs `apns-collapse-id`, FCM `collapse_key`) for the window it is sent in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderWakeup {
    pub payload: WakeupPayload,
    pub collapse_key: CollapseKey,
}

impl ProviderWakeup {
    /// `secret` is the one of the registration's salt epoch; `window` the
    /// delivery window of the send.
    pub fn new(payload: WakeupPayload, secret: &PushSecret, window: DeliveryWindowId) -> Self {
        let collapse_key = CollapseKey::derive(secret, &payload.push_target_id, window);
        Self { payload, collapse_key }
    }
}

/// §2.4: the collapse key a wake-up carries is the one of the window it is
/// *sent* in (docs/GATEWAY.md reading 3). A wake-up accepted near a window's
/// end and retried in the next one takes the next window's key, so the
/// delivery worker derives it at each attempt rather than storing it.
#[derive(Clone)]
pub struct CollapseKeys {
    secrets: Arc<SaltSecrets>,
    window_secs: u64,
}

impl CollapseKeys {
    pub fn new(secrets: Arc<SaltSecrets>, window: Duration) -> Self {
        Self { secrets, window_secs: window.as_secs().max(1) }
    }

    /// The key of a wake-up for `push_target_id` (of salt epoch
    /// `salt_epoch_id`) sent at `now_ms`; `None` when the epoch was retired
    /// from the configuration (its registrations no longer resolve).
    pub fn at(&self, salt_epoch_id: &SaltEpochId, push_target_id: &PushTargetId, now_ms: u64) -> Option<CollapseKey> {
        let secret = self.secrets.get(salt_epoch_id)?;
        Some(CollapseKey::derive(secret, push_target_id, DeliveryWindowId::at(now_ms, self.window_secs)))
    }
}

/// §2.4's dedup key: at most one wake-up per (account_id, device_id,
/// push_route_id, source_event_digest) per delivery window. A keyed hash
/// (under the epoch's secret) so that a stored key reveals nothing even to
/// someone holding the store; it has no Serialize or Display and leaves the
/// server in no payload, log or header.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DedupKey([u8; 32]);

#[derive(Serialize)]
struct DedupInput<'a> {
    account_id: &'a str,
    delivery_window_id: u64,
    device_id: &'a str,
    push_route_id: &'a str,
    salt_epoch_id: &'a str,
    source_event_digest: String,
}

/// The inputs of a `DedupKey`.
#[derive(Debug, Clone, Copy)]
pub struct DedupScope<'a> {
    pub account: &'a AccountId,
    pub device: &'a DeviceId,
    pub route: PushRouteId,
    pub epoch: &'a SaltEpochId,
    /// The gateway's `source_event_digest` (`NotifyRequest::wakeup_digest`).
    pub source_event: &'a RequestDigest,
}

impl DedupKey {
    pub fn derive(secret: &PushSecret, scope: DedupScope<'_>, window: DeliveryWindowId) -> Self {
        let input = DedupInput {
            account_id: scope.account.as_str(),
            delivery_window_id: window.get(),
            device_id: scope.device.as_str(),
            push_route_id: scope.route.as_str(),
            salt_epoch_id: scope.epoch.as_str(),
            source_event_digest: hex::encode(scope.source_event.0),
        };
        let mut mac = secret.mac();
        mac.update(&jcs::to_vec(&input));
        Self(mac.finalize().into_bytes().into())
    }

    /// For the store's key only.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

crate::domain::redacted_debug!(DedupKey);

/// When a wake-up goes to its provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// Send now.
    Now,
    /// Hold until `flush_at_ms` (Unix ms), merged with the other wake-ups of
    /// the route held for the same instant into one batch wake-up.
    Batch { flush_at_ms: u64 },
}

/// A route's egress timing policy (from `GatewaySettings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressPolicy {
    /// §2.4 delivery window.
    pub window: Duration,
    /// §4.5 wake-ups per window sent at once.
    pub aggressive_threshold: u32,
    /// §4.5 / §8: `Some(bucket ≥ 300 s)` on a `traffic_metadata_hardened`
    /// route: batch only.
    pub hardened_bucket: Option<Duration>,
}

/// End of the epoch-aligned bucket of `len` holding `now_ms`.
fn bucket_end_ms(now_ms: u64, len: Duration) -> u64 {
    let len_ms = u64::try_from(len.as_millis()).unwrap_or(u64::MAX).max(1);
    (now_ms / len_ms + 1).saturating_mul(len_ms)
}

/// One route's wake-up count in the current window (§4.5). A pure state
/// machine: the caller keeps it per route and feeds it the time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateWindow {
    window: u64,
    sent: u32,
}

impl RateWindow {
    /// Decides how the next wake-up of the route leaves and counts it if
    /// it leaves now. Hardened routes always batch into their bucket; other
    /// routes send at once up to the threshold per window, then batch to the
    /// window's end.
    pub fn admit(&mut self, policy: &EgressPolicy, now_ms: u64) -> Egress {
        if let Some(bucket) = policy.hardened_bucket {
            return Egress::Batch { flush_at_ms: bucket_end_ms(now_ms, bucket) };
        }
        let window_secs = policy.window.as_secs().max(1);
        let window = DeliveryWindowId::at(now_ms, window_secs).get();
        if window != self.window {
            *self = Self { window, sent: 0 };
        }
        if self.sent < policy.aggressive_threshold {
            self.sent += 1;
            Egress::Now
        } else {
            Egress::Batch { flush_at_ms: bucket_end_ms(now_ms, policy.window) }
        }
    }

    /// Counts a batch wake-up sent at `now_ms` (it is a wake-up too).
    pub fn record_batch(&mut self, policy: &EgressPolicy, now_ms: u64) {
        let window = DeliveryWindowId::at(now_ms, policy.window.as_secs().max(1)).get();
        if window != self.window {
            *self = Self { window, sent: 0 };
        }
        self.sent = self.sent.saturating_add(1);
    }
}

/// §5.1 hysteresis over a true count (the caller that knows counts, e.g. a
/// Station): the output bucket switches only when the count is past the
/// boundary by at least the band, `max(2, ceil(0.10 × smaller adjacent
/// span))`, and only once the dwell since the last switch has passed.
/// Count 0 is "nothing", not a bucket: reaching or leaving it is not held
/// back (reading: a boolean badge shows the same, and §5.1 exempts booleans).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketHysteresis {
    current: Option<usize>,
    since_ms: u64,
}

impl BucketHysteresis {
    pub fn observe(&mut self, grid: &CountGrid, dwell: Duration, count: u32, now_ms: u64) -> Option<BucketIndex> {
        let Some(raw) = grid.bucket_of(count) else {
            self.switch(None, now_ms);
            return None;
        };
        let Some(current) = self.current else {
            self.switch(Some(raw.0), now_ms);
            return Some(raw);
        };
        let dwelt = now_ms.saturating_sub(self.since_ms) >= u64::try_from(dwell.as_millis()).unwrap_or(u64::MAX);
        if raw.0 == current || !dwelt {
            return Some(BucketIndex(current));
        }
        let next = if raw.0 > current {
            // The highest bucket whose lower boundary the count passed by the band.
            (current + 1..=raw.0).rev().find(|&b| {
                let boundary = BucketIndex(b - 1);
                let upper = grid.upper(boundary).expect("a bucket below another is finite");
                count - upper >= grid.default_band(boundary)
            })
        } else {
            // The lowest bucket whose upper boundary the count passed by the band.
            (raw.0..current).find(|&b| grid.lower(BucketIndex(b + 1)) - count >= grid.default_band(BucketIndex(b)))
        };
        if let Some(next) = next {
            self.switch(Some(next), now_ms);
        }
        self.current.map(BucketIndex)
    }

    fn switch(&mut self, to: Option<usize>, now_ms: u64) {
        if self.current != to {
            *self = Self { current: to, since_ms: now_ms };
        }
    }
}

/// §5.1 minimum dwell over bucket inputs (the gateway sees buckets, not
/// counts): once a route's egress bucket changes, it stays for `dwell`;
/// an input bucket that differs is adopted only after that.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketDwell {
    current: Option<String>,
    since_ms: u64,
}

impl BucketDwell {
    pub fn observe(&mut self, input: &str, dwell: Duration, now_ms: u64) -> String {
        let dwell_ms = u64::try_from(dwell.as_millis()).unwrap_or(u64::MAX);
        match &self.current {
            Some(current) if current == input => {}
            Some(_) if now_ms.saturating_sub(self.since_ms) < dwell_ms => {}
            _ => *self = Self { current: Some(input.to_owned()), since_ms: now_ms },
        }
        self.current.clone().expect("set above")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::gateway::schema::{NotifyLimits, NotifyRequest};

    const TARGET: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
    const D1: &str = "ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f";

    fn notify(value: serde_json::Value) -> NotifyRequest {
        let grid = CountGrid::default();
        let limits = NotifyLimits { grid: &grid, max_unread_increment: 20, max_devices: 10 };
        NotifyRequest::parse(value.to_string().as_bytes(), &limits).unwrap()
    }

    /// Every member a notify may carry, with marker values.
    fn everything() -> NotifyRequest {
        notify(json!({
            "notification": {
                "push_target_id": TARGET, "wakeup_kind": "mention", "push_hint": "l10n_key",
                "push_hint_l10n_key": "push.mention", "evaluation_locus_unresolved": true,
                "counts": {"badge": "6-20", "missed_call": true, "unread_increment": 3},
                "devices": [{"device_id": D1}],
                "route_tokens": {"realm_route_token": "REALM-TOKEN-MARK", "scope_route_token": "SCOPE-TOKEN-MARK"}
            },
            "event_kind": "ak.message.create",
            "reason_code": "historical_only",
            "audit_envelope": {"access_kind": "audit-mark", "late_recovery_original_event_id": "ak:event:EVENT-MARK"}
        }))
    }

    #[test]
    fn the_payload_holds_the_allowed_fields_only() {
        let payload = WakeupPayload::rebuild(&everything().notification, &CountGrid::default());
        let json = serde_json::Value::Object(payload.to_json());
        assert_eq!(
            json,
            json!({
                "push_target_id": TARGET,
                "wakeup_kind": "mention",
                "push_hint": "l10n_key",
                "push_hint_l10n_key": "push.mention",
                "evaluation_locus_unresolved": true,
                "counts": {"badge": "6-20", "missed_call": true, "unread_increment": 3}
            })
        );
        let text = json.to_string();
        for leaked in [D1, "TOKEN-MARK", "ak.message.create", "historical_only", "audit-mark", "EVENT-MARK"] {
            assert!(!text.contains(leaked), "{leaked} reached the provider payload");
        }
    }

    #[test]
    fn a_minimal_payload_has_no_empty_members() {
        let n = notify(json!({"notification": {"push_target_id": TARGET, "wakeup_kind": "message",
            "counts": {}, "devices": [{"device_id": D1}]}}));
        let payload = WakeupPayload::rebuild(&n.notification, &CountGrid::default());
        assert_eq!(
            serde_json::Value::Object(payload.to_json()),
            json!({"push_target_id": TARGET, "wakeup_kind": "message"})
        );
        assert_eq!(payload.encoded_len(), format!(r#"{{"push_target_id":"{TARGET}","wakeup_kind":"message"}}"#).len());
    }

    #[test]
    fn a_stored_payload_reads_back_and_refuses_anything_else() {
        let payload = WakeupPayload::rebuild(&everything().notification, &CountGrid::default());
        let stored = serde_json::to_vec(&payload).unwrap();
        assert_eq!(serde_json::from_slice::<WakeupPayload>(&stored).unwrap(), payload);
        for extra in [
            json!({"push_target_id": TARGET, "wakeup_kind": "message", "route_tokens": {}}),
            json!({"push_target_id": TARGET, "wakeup_kind": "message", "event_id": "x"}),
            json!({"push_target_id": TARGET, "wakeup_kind": "message", "counts": {"unread": 4}}),
            json!({"push_target_id": TARGET, "wakeup_kind": "chat"}),
            json!({"push_target_id": TARGET, "wakeup_kind": "message", "push_hint": "l10n_key"}),
            json!({"push_target_id": TARGET, "wakeup_kind": "message", "push_hint": "new_message", "push_hint_l10n_key": "k"}),
            json!({"push_target_id": "ak:account:x", "wakeup_kind": "message"}),
        ] {
            assert!(serde_json::from_value::<WakeupPayload>(extra.clone()).is_err(), "{extra}");
        }
    }

    #[test]
    fn batches_merge_into_one_unresolved_wakeup() {
        let grid = CountGrid::default();
        let first = WakeupPayload::rebuild(
            &notify(
                json!({"notification": {"push_target_id": TARGET, "wakeup_kind": "message", "push_hint": "new_message",
                "counts": {"badge": "2-5", "unread_increment": 15}, "devices": [{"device_id": D1}]}}),
            )
            .notification,
            &grid,
        );
        let second = WakeupPayload::rebuild(
            &notify(
                json!({"notification": {"push_target_id": TARGET, "wakeup_kind": "mention", "push_hint": "mention_self",
                "counts": {"missed_call": false, "unread_increment": 10}, "devices": [{"device_id": D1}]}}),
            )
            .notification,
            &grid,
        );
        let merged = first.clone().merge(second, 20);
        assert_eq!(
            serde_json::Value::Object(merged.to_json()),
            json!({"push_target_id": TARGET, "wakeup_kind": "mention", "evaluation_locus_unresolved": true,
                "counts": {"badge": "2-5", "missed_call": false, "unread_increment": 20}})
        );
        let same_hint = first.clone().merge(first.clone(), 20);
        assert_eq!(same_hint.to_json()["push_hint"], json!("new_message"));
    }

    #[test]
    fn provider_wakeups_carry_the_windows_collapse_key() {
        let secret = PushSecret::new(vec![0x11; 32]).unwrap();
        let target = "ak:pseudonym:push:t4HdMLcxrKLBBUctAnf0JllNzR_ofUKouLhxnri6FOQ";
        let n = notify(
            json!({"notification": {"push_target_id": target, "wakeup_kind": "message", "devices": [{"device_id": D1}]}}),
        );
        let payload = WakeupPayload::rebuild(&n.notification, &CountGrid::default());
        let w = ProviderWakeup::new(payload.clone(), &secret, DeliveryWindowId::new(29343333));
        assert_eq!(w.collapse_key.as_str(), "fFwYmh5Rc70O2MAFM35hPg");
        // The key is not in the payload, and the payload does not vary by window.
        assert!(!serde_json::to_string(&w.payload).unwrap().contains("fFwYmh5Rc70O2MAFM35hPg"));
        let next = ProviderWakeup::new(payload, &secret, DeliveryWindowId::new(29343334));
        assert_eq!(next.collapse_key.as_str(), "TQ5V0QZi6HlP6G0bujZ0lg");
        assert_eq!(next.payload, w.payload);
    }

    #[test]
    fn dedup_keys_separate_every_component_and_window() {
        let secret = PushSecret::new(vec![0x11; 32]).unwrap();
        let account = AccountId::parse("ak:account:example").unwrap();
        let other_account = AccountId::parse("ak:account:other").unwrap();
        let device = DeviceId::parse(D1).unwrap();
        let other_device = DeviceId::parse("ak:device:01964137-0000-7000-8000-000000000000").unwrap();
        let epoch = SaltEpochId::parse("e1").unwrap();
        let digest = RequestDigest([1; 32]);
        let other_digest = RequestDigest([2; 32]);
        let scope = DedupScope {
            account: &account,
            device: &device,
            route: PushRouteId::FcmMain,
            epoch: &epoch,
            source_event: &digest,
        };
        let w = DeliveryWindowId::new(7);
        let key = DedupKey::derive(&secret, scope, w);
        assert_eq!(DedupKey::derive(&secret, scope, w), key, "same inputs, same window: one wake-up");
        for other in [
            DedupKey::derive(&secret, scope, DeliveryWindowId::new(8)),
            DedupKey::derive(&secret, DedupScope { account: &other_account, ..scope }, w),
            DedupKey::derive(&secret, DedupScope { device: &other_device, ..scope }, w),
            DedupKey::derive(&secret, DedupScope { route: PushRouteId::ApnsMain, ..scope }, w),
            DedupKey::derive(&secret, DedupScope { source_event: &other_digest, ..scope }, w),
        ] {
            assert_ne!(other, key);
        }
        assert_eq!(format!("{key:?}"), "DedupKey(..)");
    }

    fn policy(threshold: u32) -> EgressPolicy {
        EgressPolicy { window: Duration::from_secs(60), aggressive_threshold: threshold, hardened_bucket: None }
    }

    #[test]
    fn wakeups_beyond_the_threshold_batch_to_the_windows_end() {
        let p = policy(30);
        let mut rate = RateWindow::default();
        let start = 1_760_599_980_000; // a window boundary
        let plans: Vec<_> = (0..32).map(|i| rate.admit(&p, start + i * 1000)).collect();
        assert!(plans[..30].iter().all(|e| *e == Egress::Now));
        assert_eq!(plans[30], Egress::Batch { flush_at_ms: start + 60_000 });
        assert_eq!(plans[31], Egress::Batch { flush_at_ms: start + 60_000 });
        // The next window starts afresh.
        assert_eq!(rate.admit(&p, start + 60_000), Egress::Now);
        // A batch counts as a wake-up of its window.
        let mut rate = RateWindow::default();
        rate.record_batch(&policy(1), start);
        assert_eq!(rate.admit(&policy(1), start + 1), Egress::Batch { flush_at_ms: start + 60_000 });
    }

    #[test]
    fn hardened_routes_always_batch_to_their_bucket() {
        let p = EgressPolicy { hardened_bucket: Some(Duration::from_secs(300)), ..policy(30) };
        let mut rate = RateWindow::default();
        let start = 1_760_599_800_000; // a 300 s boundary
        assert_eq!(start % 300_000, 0);
        for offset in [0, 1, 299_999] {
            assert_eq!(rate.admit(&p, start + offset), Egress::Batch { flush_at_ms: start + 300_000 });
        }
        assert_eq!(rate.admit(&p, start + 300_000), Egress::Batch { flush_at_ms: start + 600_000 });
    }

    #[test]
    fn bucket_hysteresis_needs_the_band_and_the_dwell() {
        let grid = CountGrid::default();
        let dwell = Duration::from_secs(60);
        let mut h = BucketHysteresis::default();
        let label = |b: Option<BucketIndex>| b.map(|b| grid.label(b).to_owned());
        let mut t = 0;
        let mut step = |h: &mut BucketHysteresis, count: u32, advance_ms: u64| {
            t += advance_ms;
            label(h.observe(&grid, dwell, count, t))
        };
        assert_eq!(step(&mut h, 4, 0).as_deref(), Some("2-5"));
        // 6 crosses 5|6 by 1 < band 2: held, even after the dwell.
        assert_eq!(step(&mut h, 6, 120_000).as_deref(), Some("2-5"));
        // 7 crosses by 2: switches.
        assert_eq!(step(&mut h, 7, 0).as_deref(), Some("6-20"));
        // Back to 4 (2 below 6) within the dwell: held.
        assert_eq!(step(&mut h, 4, 59_999).as_deref(), Some("6-20"));
        // After the dwell: switches down.
        assert_eq!(step(&mut h, 4, 1).as_deref(), Some("2-5"));
        // Oscillating 5/6 around the boundary never flips it.
        for i in 0..10 {
            assert_eq!(step(&mut h, if i % 2 == 0 { 6 } else { 5 }, 120_000).as_deref(), Some("2-5"));
        }
        // A jump far up lands in the highest bucket passed by the band:
        // 21 passes 5|6 but not 20|21 (needs 22).
        assert_eq!(step(&mut h, 21, 120_000).as_deref(), Some("6-20"));
        assert_eq!(step(&mut h, 22, 120_000).as_deref(), Some("21+"));
        // Down from 21+: 3 passes 6 by 3, not 2 by the band: "2-5".
        let mut down = h;
        assert_eq!(step(&mut down, 3, 120_000).as_deref(), Some("2-5"));
        // Zero is nothing, at once.
        assert_eq!(step(&mut down, 0, 0), None);
        assert_eq!(step(&mut down, 1, 0).as_deref(), Some("1"));
    }

    #[test]
    fn bucket_dwell_holds_a_switched_bucket() {
        let dwell = Duration::from_secs(60);
        let mut d = BucketDwell::default();
        assert_eq!(d.observe("2-5", dwell, 0), "2-5");
        assert_eq!(d.observe("6-20", dwell, 10_000), "2-5");
        assert_eq!(d.observe("6-20", dwell, 59_999), "2-5");
        assert_eq!(d.observe("6-20", dwell, 60_000), "6-20");
        assert_eq!(d.observe("2-5", dwell, 100_000), "6-20");
        assert_eq!(d.observe("2-5", dwell, 120_000), "2-5");
        assert_eq!(d.observe("2-5", dwell, 120_001), "2-5");
    }
}
