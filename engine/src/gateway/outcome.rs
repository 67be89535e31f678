//! §5.2: the notify answer. One outcome per requested device, in request
//! order, none extra, none repeated; target-level failures expanded to every
//! device; `reason_code` exactly on `rejected`; `retry_after_ms` only on the
//! caller-retryable reasons. The types make any other answer unbuildable:
//! a `NotifyResponse` comes only from the constructors below, each of which
//! conserves the requested devices.
//!
//! The body never carries push_key, app_id, provider ids, provider bodies or
//! provider states (§5.2): there is no field for them.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::schema::{CallerReason, Devices, NotifyRequest};
use crate::domain::{DeviceId, PushTargetId};

/// §5.2 `gateway_status`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum GatewayStatus {
    /// This request durably took over the device's route.
    Accepted,
    /// An earlier request took it over, or a no-fanout ack: nothing new.
    Duplicate,
    /// Not taken over.
    Rejected,
}

impl GatewayStatus {
    /// The wire value (also the metric label).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// §5.2's closed reason codes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::IntoStaticStr, strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ReasonCode {
    PushTargetUnknown,
    PushPayloadTooLarge,
    UnsupportedProfile,
    PushTokenUnknown,
    PushTokenInvalid,
    PushGatewayUnreachable,
    RateLimited,
}

/// Whether a reason concerns the whole target (expanded to every device) or
/// one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Target,
    Device,
}

impl ReasonCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn scope(self) -> Scope {
        match self {
            Self::PushTargetUnknown | Self::PushPayloadTooLarge => Scope::Target,
            _ => Scope::Device,
        }
    }

    /// §5.2: only these may carry `retry_after_ms`; the rest are terminal.
    pub fn retryable(self) -> bool {
        matches!(self, Self::PushGatewayUnreachable | Self::RateLimited)
    }
}

/// A `rejected` outcome's reason, with the caller's back-off when the reason
/// is retryable (and only then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    reason: ReasonCode,
    retry_after: Option<Duration>,
}

impl Rejection {
    /// A terminal reason. Panics on a retryable one: those need a back-off
    /// (`retry`), and mixing them up is a bug, not input.
    pub fn terminal(reason: ReasonCode) -> Self {
        assert!(!reason.retryable(), "{} needs a retry_after", reason.as_str());
        Self { reason, retry_after: None }
    }

    /// A caller-retryable reason with its back-off; `None` for a terminal
    /// reason.
    pub fn retry(reason: ReasonCode, after: Duration) -> Option<Self> {
        reason.retryable().then_some(Self { reason, retry_after: Some(after) })
    }

    pub fn reason(&self) -> ReasonCode {
        self.reason
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

/// What the gateway decided for one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceOutcome {
    Accepted,
    Duplicate,
    Rejected(Rejection),
}

impl DeviceOutcome {
    pub fn status(&self) -> GatewayStatus {
        match self {
            Self::Accepted => GatewayStatus::Accepted,
            Self::Duplicate => GatewayStatus::Duplicate,
            Self::Rejected(_) => GatewayStatus::Rejected,
        }
    }
}

/// §5.2 `outcomes[]` item, as serialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    pub device_id: DeviceId,
    pub gateway_status: GatewayStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<ReasonCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl Outcome {
    fn new(device_id: DeviceId, outcome: DeviceOutcome) -> Self {
        let (reason_code, retry_after_ms) = match outcome {
            DeviceOutcome::Rejected(r) => {
                (Some(r.reason), r.retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
            }
            _ => (None, None),
        };
        Self { device_id, gateway_status: outcome.status(), reason_code, retry_after_ms }
    }

    /// The item's own rules: `reason_code` iff rejected; `retry_after_ms`
    /// only with a retryable reason.
    fn well_formed(&self) -> bool {
        let reason_ok = (self.gateway_status == GatewayStatus::Rejected) == self.reason_code.is_some();
        let retry_ok = self.retry_after_ms.is_none() || self.reason_code.is_some_and(ReasonCode::retryable);
        reason_ok && retry_ok
    }
}

/// A target-level failure (§5.2 "target 级失败 MUST 展开").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetFailure {
    /// Unknown, expired or revoked `push_target_id`.
    Unknown,
    /// The rebuilt provider payload exceeds the limit.
    PayloadTooLarge,
}

impl TargetFailure {
    pub fn reason(self) -> ReasonCode {
        match self {
            Self::Unknown => ReasonCode::PushTargetUnknown,
            Self::PayloadTooLarge => ReasonCode::PushPayloadTooLarge,
        }
    }
}

/// Why a notify is answered without any provider call (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoFanout {
    /// `audit_envelope` present: an audit pipeline event, not a push.
    Audit,
    /// `reason_code: historical_only`: a diagnostic replay.
    HistoricalOnly,
    /// `event_kind` in the configured no-fanout set.
    EventKind,
}

impl NoFanout {
    /// Which branch a request takes, if any. The audit envelope wins (it
    /// skips the whole push pipeline), then `historical_only`, then the
    /// event_kind set.
    pub fn of(request: &NotifyRequest, no_fanout_event_kinds: &std::collections::BTreeSet<String>) -> Option<Self> {
        if request.audit_envelope.is_some() {
            Some(Self::Audit)
        } else if request.reason_code == Some(CallerReason::HistoricalOnly) {
            Some(Self::HistoricalOnly)
        } else if request.event_kind.as_ref().is_some_and(|k| no_fanout_event_kinds.contains(k)) {
            Some(Self::EventKind)
        } else {
            None
        }
    }
}

/// §5.2's response body. Built only by the conserving constructors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotifyResponse {
    push_target_id: PushTargetId,
    outcomes: Vec<Outcome>,
}

/// A response that does not answer its request (§5.2's four negative
/// vectors: omitted, repeated, unrequested device, echo mismatch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConservationError {
    #[error("push_target_id is not the request's")]
    TargetMismatch,
    #[error("a requested device has no outcome")]
    Missing,
    #[error("a device has more than one outcome")]
    Repeated,
    #[error("an outcome names a device that was not requested")]
    Unrequested,
    #[error("outcomes are not in request order")]
    Order,
    #[error("an outcome breaks the reason_code / retry_after_ms rules")]
    Malformed,
}

impl NotifyResponse {
    /// One outcome per device, decided by `decide`, in request order.
    pub fn per_device(
        target: PushTargetId,
        devices: &Devices,
        mut decide: impl FnMut(&DeviceId) -> DeviceOutcome,
    ) -> Self {
        let outcomes = devices.iter().map(|d| Outcome::new(d.clone(), decide(d))).collect();
        Self { push_target_id: target, outcomes }
    }

    /// A target-level failure, expanded: every device rejected with the
    /// same reason (both are terminal).
    pub fn whole_target(target: PushTargetId, devices: &Devices, failure: TargetFailure) -> Self {
        let rejection = Rejection::terminal(failure.reason());
        Self::per_device(target, devices, |_| DeviceOutcome::Rejected(rejection))
    }

    /// The no-fanout ack: every device `duplicate`, never an empty list.
    pub fn no_fanout(target: PushTargetId, devices: &Devices) -> Self {
        Self::per_device(target, devices, |_| DeviceOutcome::Duplicate)
    }

    /// A stored answer read back (an idempotent replay returns it as it
    /// was), checked against the request it answers.
    pub fn restore(target: PushTargetId, devices: &Devices, outcomes: Vec<Outcome>) -> Result<Self, ConservationError> {
        let response = Self { push_target_id: target, outcomes };
        response.check(&target, devices.as_slice())?;
        Ok(response)
    }

    /// §5.2 conservation, as a verifier would check any response.
    pub fn check(&self, target: &PushTargetId, requested: &[DeviceId]) -> Result<(), ConservationError> {
        check_conservation(target, requested, &self.push_target_id, &self.outcomes)
    }

    pub fn outcomes(&self) -> &[Outcome] {
        &self.outcomes
    }

    /// Devices this answer accepted (the ones to deliver to).
    pub fn accepted(&self) -> impl Iterator<Item = &DeviceId> {
        self.outcomes.iter().filter(|o| o.gateway_status == GatewayStatus::Accepted).map(|o| &o.device_id)
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a response serializes")
    }
}

/// §5.2's conservation rules over any (parsed) response: echoed target, one
/// outcome per requested device in request order, no extras, no repeats,
/// and each item's own rules.
pub fn check_conservation(
    requested_target: &PushTargetId,
    requested: &[DeviceId],
    answered_target: &PushTargetId,
    outcomes: &[Outcome],
) -> Result<(), ConservationError> {
    if answered_target != requested_target {
        return Err(ConservationError::TargetMismatch);
    }
    let position: HashMap<&DeviceId, usize> = requested.iter().enumerate().map(|(i, d)| (d, i)).collect();
    let mut seen = vec![false; requested.len()];
    for (i, outcome) in outcomes.iter().enumerate() {
        let Some(&at) = position.get(&outcome.device_id) else { return Err(ConservationError::Unrequested) };
        if std::mem::replace(&mut seen[at], true) {
            return Err(ConservationError::Repeated);
        }
        if at != i {
            return Err(ConservationError::Order);
        }
        if !outcome.well_formed() {
            return Err(ConservationError::Malformed);
        }
    }
    if seen.iter().any(|s| !s) {
        return Err(ConservationError::Missing);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::json;

    use strum::VariantArray;

    use super::*;
    use crate::gateway::grid::CountGrid;
    use crate::gateway::schema::NotifyLimits;

    const TARGET: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
    const D1: &str = "ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f";
    const D2: &str = "ak:device:0192f3a1-4c2b-7d5e-b021-3c4d5e6f7a8b";
    const D3: &str = "ak:device:01964137-0000-7000-8000-000000000000";

    fn target() -> PushTargetId {
        PushTargetId::parse(TARGET).unwrap()
    }

    fn device(s: &str) -> DeviceId {
        DeviceId::parse(s).unwrap()
    }

    fn devices(ids: &[&str]) -> Devices {
        Devices::new(ids.iter().map(|s| device(s)).collect()).unwrap()
    }

    #[test]
    fn reason_codes_have_their_scope_and_retryability() {
        let table: Vec<_> = ReasonCode::VARIANTS.iter().map(|r| (r.as_str(), r.scope(), r.retryable())).collect();
        assert_eq!(
            table,
            [
                ("push_target_unknown", Scope::Target, false),
                ("push_payload_too_large", Scope::Target, false),
                ("unsupported_profile", Scope::Device, false),
                ("push_token_unknown", Scope::Device, false),
                ("push_token_invalid", Scope::Device, false),
                ("push_gateway_unreachable", Scope::Device, true),
                ("rate_limited", Scope::Device, true),
            ]
        );
        for &r in ReasonCode::VARIANTS {
            assert_eq!(serde_json::to_value(r).unwrap(), json!(r.as_str()));
            assert_eq!(Rejection::retry(r, Duration::from_secs(1)).is_some(), r.retryable());
        }
    }

    #[test]
    #[should_panic(expected = "rate_limited needs a retry_after")]
    fn a_retryable_reason_is_never_terminal() {
        Rejection::terminal(ReasonCode::RateLimited);
    }

    /// The §5.2 example answer.
    #[test]
    fn the_spec_example_serializes_exactly() {
        let r = NotifyResponse::per_device(target(), &devices(&[D1, D2]), |d| {
            if d.as_str() == D1 {
                DeviceOutcome::Accepted
            } else {
                DeviceOutcome::Rejected(Rejection::terminal(ReasonCode::PushTokenUnknown))
            }
        });
        let body: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(
            body,
            json!({
                "push_target_id": TARGET,
                "outcomes": [
                    {"device_id": D1, "gateway_status": "accepted"},
                    {"device_id": D2, "gateway_status": "rejected", "reason_code": "push_token_unknown"}
                ]
            })
        );
        assert_eq!(r.accepted().map(DeviceId::as_str).collect::<Vec<_>>(), [D1]);
    }

    #[test]
    fn retry_after_ms_only_on_retryable_rejections() {
        let r = NotifyResponse::per_device(target(), &devices(&[D1, D2, D3]), |d| match d.as_str() {
            D1 => {
                DeviceOutcome::Rejected(Rejection::retry(ReasonCode::RateLimited, Duration::from_millis(1500)).unwrap())
            }
            D2 => DeviceOutcome::Rejected(Rejection::terminal(ReasonCode::PushTokenInvalid)),
            _ => DeviceOutcome::Duplicate,
        });
        let body: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(
            body["outcomes"],
            json!([
                {"device_id": D1, "gateway_status": "rejected", "reason_code": "rate_limited", "retry_after_ms": 1500},
                {"device_id": D2, "gateway_status": "rejected", "reason_code": "push_token_invalid"},
                {"device_id": D3, "gateway_status": "duplicate"}
            ])
        );
        assert_eq!(r.check(&target(), devices(&[D1, D2, D3]).as_slice()), Ok(()));
    }

    #[test]
    fn target_failures_expand_to_every_device() {
        for failure in [TargetFailure::Unknown, TargetFailure::PayloadTooLarge] {
            let r = NotifyResponse::whole_target(target(), &devices(&[D2, D1, D3]), failure);
            let got: Vec<_> =
                r.outcomes().iter().map(|o| (o.device_id.as_str(), o.gateway_status, o.reason_code)).collect();
            let reason = Some(failure.reason());
            assert_eq!(
                got,
                [
                    (D2, GatewayStatus::Rejected, reason),
                    (D1, GatewayStatus::Rejected, reason),
                    (D3, GatewayStatus::Rejected, reason)
                ]
            );
            assert!(r.outcomes().iter().all(|o| o.retry_after_ms.is_none()));
            assert_eq!(failure.reason().scope(), Scope::Target);
        }
    }

    #[test]
    fn no_fanout_answers_duplicate_for_every_device() {
        let grid = CountGrid::default();
        let limits = NotifyLimits { grid: &grid, max_unread_increment: 20, max_devices: 10 };
        let body = |extra: serde_json::Value| {
            let mut v = json!({"notification": {"push_target_id": TARGET, "wakeup_kind": "message",
                "devices": [{"device_id": D1}, {"device_id": D2}]}});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            NotifyRequest::parse(v.to_string().as_bytes(), &limits).unwrap()
        };
        let set: BTreeSet<String> = ["ak.agent.lifecycle".to_owned()].into();
        let cases = [
            (json!({}), None),
            (json!({"event_kind": "ak.message.create"}), None),
            (json!({"event_kind": "ak.agent.lifecycle"}), Some(NoFanout::EventKind)),
            (json!({"reason_code": "historical_only"}), Some(NoFanout::HistoricalOnly)),
            (json!({"audit_envelope": {"access_kind": "e2ee_late_recovery"}}), Some(NoFanout::Audit)),
            (
                json!({"audit_envelope": {"access_kind": "x"}, "reason_code": "historical_only", "event_kind": "ak.agent.lifecycle"}),
                Some(NoFanout::Audit),
            ),
        ];
        for (extra, expected) in cases {
            let request = body(extra.clone());
            assert_eq!(NoFanout::of(&request, &set), expected, "{extra}");
        }
        let request = body(json!({"reason_code": "historical_only"}));
        let r = NotifyResponse::no_fanout(request.notification.push_target_id, &request.notification.devices);
        let statuses: Vec<_> = r.outcomes().iter().map(|o| o.gateway_status).collect();
        assert_eq!(statuses, [GatewayStatus::Duplicate, GatewayStatus::Duplicate]);
        assert_eq!(r.accepted().count(), 0);
    }

    /// §5.2's negative vectors: each passes JSON Schema but breaks
    /// conservation.
    #[test]
    fn conservation_catches_omitted_repeated_unrequested_and_mismatched() {
        let requested = devices(&[D1, D2]);
        let ok = |d: &str| Outcome {
            device_id: device(d),
            gateway_status: GatewayStatus::Accepted,
            reason_code: None,
            retry_after_ms: None,
        };
        let restore = |outcomes: Vec<Outcome>| NotifyResponse::restore(target(), &requested, outcomes).map(|_| ());
        assert_eq!(restore(vec![ok(D1), ok(D2)]), Ok(()));
        assert_eq!(restore(vec![ok(D1)]), Err(ConservationError::Missing));
        assert_eq!(restore(vec![]), Err(ConservationError::Missing));
        assert_eq!(restore(vec![ok(D1), ok(D1), ok(D2)]), Err(ConservationError::Repeated));
        assert_eq!(restore(vec![ok(D1), ok(D2), ok(D3)]), Err(ConservationError::Unrequested));
        assert_eq!(restore(vec![ok(D2), ok(D1)]), Err(ConservationError::Order));
        let other = PushTargetId::parse("ak:pseudonym:push:t4HdMLcxrKLBBUctAnf0JllNzR_ofUKouLhxnri6FOQ").unwrap();
        assert_eq!(
            check_conservation(&target(), requested.as_slice(), &other, &[ok(D1), ok(D2)]),
            Err(ConservationError::TargetMismatch)
        );
        let mut no_reason = ok(D2);
        no_reason.gateway_status = GatewayStatus::Rejected;
        assert_eq!(restore(vec![ok(D1), no_reason]), Err(ConservationError::Malformed));
        let mut reason_on_accept = ok(D2);
        reason_on_accept.reason_code = Some(ReasonCode::PushTokenUnknown);
        assert_eq!(restore(vec![ok(D1), reason_on_accept]), Err(ConservationError::Malformed));
        let mut terminal_retry = ok(D2);
        terminal_retry.gateway_status = GatewayStatus::Rejected;
        terminal_retry.reason_code = Some(ReasonCode::PushTokenInvalid);
        terminal_retry.retry_after_ms = Some(10);
        assert_eq!(restore(vec![ok(D1), terminal_retry]), Err(ConservationError::Malformed));
    }

    #[test]
    fn a_stored_answer_round_trips_identically() {
        let r = NotifyResponse::per_device(target(), &devices(&[D1, D2]), |d| match d.as_str() {
            D1 => DeviceOutcome::Accepted,
            _ => DeviceOutcome::Rejected(
                Rejection::retry(ReasonCode::PushGatewayUnreachable, Duration::from_secs(2)).unwrap(),
            ),
        });
        let stored = serde_json::to_vec(r.outcomes()).unwrap();
        let outcomes: Vec<Outcome> = serde_json::from_slice(&stored).unwrap();
        let again = NotifyResponse::restore(target(), &devices(&[D1, D2]), outcomes).unwrap();
        assert_eq!(again, r);
        assert_eq!(again.to_json(), r.to_json());
        // Unknown members in a stored item are refused.
        let bad = br#"[{"device_id":"ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f","gateway_status":"accepted","push_key":"x"}]"#;
        assert!(serde_json::from_slice::<Vec<Outcome>>(bad).is_err());
    }

    #[test]
    fn the_body_has_no_room_for_provider_material() {
        let r = NotifyResponse::per_device(target(), &devices(&[D1]), |_| DeviceOutcome::Accepted);
        let body: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        let keys: Vec<_> = body.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["outcomes", "push_target_id"]);
        let item: Vec<_> = body["outcomes"][0].as_object().unwrap().keys().cloned().collect();
        assert_eq!(item, ["device_id", "gateway_status"]);
    }
}
