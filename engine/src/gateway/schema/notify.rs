//! The body of notify (§5.1), default blind_wakeup profile, and the digests
//! that tell its replays apart.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value};

use super::strict_json::{boolean, closed, device_id, member, required, strict_json, string, token};
use super::{Result, Rule, SchemaViolation};
use crate::domain::{DeviceId, IdError, PushTargetId};
use crate::gateway::grid::{BucketIndex, CountGrid};
use crate::gateway::jcs;

/// §5.1 `wakeup_kind`: a coarse class, never Realm or sender information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum WakeupKind {
    Message,
    Mention,
    Assignment,
    Schedule,
    Reaction,
    CallInvite,
    Reminder,
    ScheduledSend,
    ExpiryInvalidation,
}

impl WakeupKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

/// §5.1 `push_hint_l10n_key`: a localisation key token such as
/// `push.new_message`. Reading: 1 to 128 characters of A-Z a-z 0-9 . _ -,
/// so no free text (body, names) can ride in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct L10nKey(String);

impl L10nKey {
    pub fn parse(s: &str) -> Option<Self> {
        let ok = (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        ok.then(|| Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// §5.1 `push_hint`, with the key it selects when `l10n_key`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PushHint {
    NewMessage,
    IncomingCall,
    MentionSelf,
    L10nKey(L10nKey),
}

impl PushHint {
    /// The wire value of `push_hint`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::NewMessage => "new_message",
            Self::IncomingCall => "incoming_call",
            Self::MentionSelf => "mention_self",
            Self::L10nKey(_) => "l10n_key",
        }
    }

    /// `push_hint_l10n_key`, when `push_hint` is `l10n_key`.
    pub fn l10n_key(&self) -> Option<&L10nKey> {
        match self {
            Self::L10nKey(k) => Some(k),
            _ => None,
        }
    }
}

/// A `badge` or `missed_call` (§5.1): a presence flag or a bucket of the
/// grid, never an absolute count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CountValue {
    Flag(bool),
    Bucket(BucketIndex),
}

/// §5.1 `counts` under blind_wakeup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counts {
    pub badge: Option<CountValue>,
    pub missed_call: Option<CountValue>,
    /// The one bounded increment form; not a running total.
    pub unread_increment: Option<u32>,
}

impl Counts {
    pub fn is_empty(&self) -> bool {
        self.badge.is_none() && self.missed_call.is_none() && self.unread_increment.is_none()
    }
}

/// §5.1 `route_tokens`: opaque tokens for routing, dedup and breakers only;
/// stripped before any provider (the egress payload has no place for them).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct RouteTokens {
    pub realm_route_token: Option<String>,
    pub scope_route_token: Option<String>,
}

crate::domain::redacted_debug!(RouteTokens);

/// §5.1 `notification.devices`: non-empty, unique, in request order (the
/// order of the response's outcomes, §5.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices(Vec<DeviceId>);

impl Devices {
    pub fn new(devices: Vec<DeviceId>) -> std::result::Result<Self, Rule> {
        if devices.is_empty() {
            return Err(Rule::NoDevices);
        }
        let mut seen = HashSet::with_capacity(devices.len());
        if !devices.iter().all(|d| seen.insert(d)) {
            return Err(Rule::DuplicateDevice);
        }
        Ok(Self(devices))
    }

    pub fn as_slice(&self) -> &[DeviceId] {
        &self.0
    }

    pub fn iter(&self) -> std::slice::Iter<'_, DeviceId> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true (the type is non-empty); for clippy's len-without-is-empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// §5.1 `notification`, default blind_wakeup profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub push_target_id: PushTargetId,
    pub wakeup_kind: WakeupKind,
    pub push_hint: Option<PushHint>,
    /// §4.5 step 3: the rule chain is still to be evaluated on the client.
    pub evaluation_locus_unresolved: bool,
    pub counts: Option<Counts>,
    pub devices: Devices,
    pub route_tokens: Option<RouteTokens>,
}

/// §5.1 top-level `reason_code`. Only `historical_only` is defined for
/// notify; "其它取值仅在操作显式定义处被接受" (others are refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerReason {
    HistoricalOnly,
}

/// §5.1 `audit_envelope`: `{access_kind, late_recovery_original_event_id?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEnvelope {
    pub access_kind: String,
    pub late_recovery_original_event_id: Option<String>,
}

/// SHA-256 of the JCS of a body: an exact replay has the same digest, and
/// so has the same body re-serialized (§5.2 idempotency compares bodies).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestDigest(pub [u8; 32]);

impl fmt::Debug for RequestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestDigest({})", hex::encode(&self.0[..8]))
    }
}

/// `POST /_arkret/edge/push/notify` (§5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyRequest {
    pub notification: Notification,
    pub event_kind: Option<String>,
    pub reason_code: Option<CallerReason>,
    pub audit_envelope: Option<AuditEnvelope>,
    /// Of the whole body.
    pub digest: RequestDigest,
    /// Of `notification` without `devices`: what a wake-up says, the
    /// gateway's `source_event_digest` for §2.4 dedup (reading: the gateway
    /// sees no event id; two requests asking the same wake-up of a device
    /// within a window are one wake-up).
    pub wakeup_digest: RequestDigest,
}

/// The limits notify is parsed under (from `GatewaySettings`).
#[derive(Debug, Clone, Copy)]
pub struct NotifyLimits<'a> {
    pub grid: &'a CountGrid,
    pub max_unread_increment: u32,
    pub max_devices: usize,
}

impl NotifyRequest {
    const FIELDS: &[&str] = &["notification", "event_kind", "reason_code", "audit_envelope"];
    const NOTIFICATION: &[&str] = &[
        "push_target_id",
        "wakeup_kind",
        "push_hint",
        "push_hint_l10n_key",
        "evaluation_locus_unresolved",
        "counts",
        "devices",
        "route_tokens",
    ];

    pub fn parse(body: &[u8], limits: &NotifyLimits<'_>) -> Result<Self> {
        let value = strict_json(body)?;
        let o = closed(&value, "", Self::FIELDS)?;
        let notification = Self::notification(required(o, "", "notification")?, limits)?;
        let event_kind = match o.get("event_kind") {
            None => None,
            Some(v) => {
                let s = string(v, "/event_kind")?;
                if !is_event_kind(s) {
                    return Err(SchemaViolation::body("/event_kind", Rule::BadText));
                }
                Some(s.to_owned())
            }
        };
        let reason_code = match o.get("reason_code") {
            None => None,
            Some(v) => match string(v, "/reason_code")? {
                "historical_only" => Some(CallerReason::HistoricalOnly),
                _ => return Err(SchemaViolation::body("/reason_code", Rule::NotInEnum)),
            },
        };
        let audit_envelope = o.get("audit_envelope").map(Self::audit_envelope).transpose()?;
        let mut wakeup = value["notification"].as_object().expect("checked").clone();
        wakeup.remove("devices");
        Ok(Self {
            notification,
            event_kind,
            reason_code,
            audit_envelope,
            digest: RequestDigest(jcs::sha256(&value)),
            wakeup_digest: RequestDigest(jcs::sha256(&wakeup)),
        })
    }

    fn notification(value: &Value, limits: &NotifyLimits<'_>) -> Result<Notification> {
        const AT: &str = "/notification";
        let o = closed(value, AT, Self::NOTIFICATION)?;
        let target = string(required(o, AT, "push_target_id")?, "/notification/push_target_id")?;
        let push_target_id = PushTargetId::parse(target).map_err(|e| {
            debug_assert_eq!(e, IdError::PushTarget);
            SchemaViolation::body("/notification/push_target_id", Rule::BadPushTargetId)
        })?;
        let kind = string(required(o, AT, "wakeup_kind")?, "/notification/wakeup_kind")?;
        let wakeup_kind =
            WakeupKind::parse(kind).ok_or(SchemaViolation::body("/notification/wakeup_kind", Rule::NotInEnum))?;
        let push_hint = Self::push_hint(o)?;
        let evaluation_locus_unresolved = o
            .get("evaluation_locus_unresolved")
            .map(|v| boolean(v, "/notification/evaluation_locus_unresolved"))
            .transpose()?
            .unwrap_or(false);
        let counts = o.get("counts").map(|v| Self::counts(v, limits)).transpose()?;
        let devices = Self::devices(required(o, AT, "devices")?, limits)?;
        let route_tokens = o.get("route_tokens").map(Self::route_tokens).transpose()?;
        Ok(Notification {
            push_target_id,
            wakeup_kind,
            push_hint,
            evaluation_locus_unresolved,
            counts,
            devices,
            route_tokens,
        })
    }

    /// `push_hint_l10n_key` present exactly when `push_hint == "l10n_key"`.
    fn push_hint(o: &Map<String, Value>) -> Result<Option<PushHint>> {
        const HINT: &str = "/notification/push_hint";
        const KEY: &str = "/notification/push_hint_l10n_key";
        let hint = o.get("push_hint").map(|v| string(v, HINT)).transpose()?;
        let key = o.get("push_hint_l10n_key");
        let hint = match hint {
            None if key.is_some() => return Err(SchemaViolation::body(KEY, Rule::L10nKeyPairing)),
            None => return Ok(None),
            Some("new_message") => PushHint::NewMessage,
            Some("incoming_call") => PushHint::IncomingCall,
            Some("mention_self") => PushHint::MentionSelf,
            Some("l10n_key") => {
                let key = key.ok_or(SchemaViolation::body(KEY, Rule::L10nKeyPairing))?;
                let key = L10nKey::parse(string(key, KEY)?).ok_or(SchemaViolation::body(KEY, Rule::BadText))?;
                return Ok(Some(PushHint::L10nKey(key)));
            }
            Some(_) => return Err(SchemaViolation::body(HINT, Rule::NotInEnum)),
        };
        if key.is_some() {
            return Err(SchemaViolation::body(KEY, Rule::L10nKeyPairing));
        }
        Ok(Some(hint))
    }

    fn counts(value: &Value, limits: &NotifyLimits<'_>) -> Result<Counts> {
        const AT: &str = "/notification/counts";
        let o = closed(value, AT, &["badge", "missed_call", "unread_increment"])?;
        let flag_or_bucket = |name: &str| -> Result<Option<CountValue>> {
            let pointer = member(AT, name);
            match o.get(name) {
                None => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(CountValue::Flag(*b))),
                Some(Value::String(s)) => limits
                    .grid
                    .parse_label(s)
                    .map(|b| Some(CountValue::Bucket(b)))
                    .ok_or(SchemaViolation::body(pointer, Rule::BucketNotInGrid)),
                Some(_) => Err(SchemaViolation::body(pointer, Rule::AbsoluteCount)),
            }
        };
        let badge = flag_or_bucket("badge")?;
        let missed_call = flag_or_bucket("missed_call")?;
        let unread_increment = match o.get("unread_increment") {
            None => None,
            Some(v) => {
                let n = v.as_u64().filter(|n| (1..=u64::from(limits.max_unread_increment)).contains(n));
                let n = n.ok_or(SchemaViolation::body(member(AT, "unread_increment"), Rule::IncrementOutOfRange))?;
                Some(n as u32)
            }
        };
        Ok(Counts { badge, missed_call, unread_increment })
    }

    fn devices(value: &Value, limits: &NotifyLimits<'_>) -> Result<Devices> {
        const AT: &str = "/notification/devices";
        let items = value.as_array().ok_or(SchemaViolation::body(AT, Rule::NotArray))?;
        if items.len() > limits.max_devices {
            return Err(SchemaViolation::body(AT, Rule::TooManyDevices));
        }
        let mut devices = Vec::with_capacity(items.len());
        let mut seen = HashSet::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("{AT}/{i}");
            let object = item.as_object().ok_or_else(|| SchemaViolation::body(&at, Rule::NotObject))?;
            // A routing or opt-in field here is the precise error (§3.3: "不得恢复
            // provider token、app id、注册身份或 opt-in 镜像").
            const ROUTING: &[&str] =
                &["push_key", "app_id", "platform", "visible_notification_opt_in", "registration_id", "push_route_id"];
            if let Some(name) = object.keys().find(|k| ROUTING.contains(&k.as_str())) {
                return Err(SchemaViolation::body(member(&at, name), Rule::RoutingFieldInDevice));
            }
            let object = closed(item, &at, &["device_id"])?;
            let id = device_id(required(object, &at, "device_id")?, &format!("{at}/device_id"))?;
            if !seen.insert(id.clone()) {
                return Err(SchemaViolation::body(format!("{at}/device_id"), Rule::DuplicateDevice));
            }
            devices.push(id);
        }
        Devices::new(devices).map_err(|rule| SchemaViolation::body(AT, rule))
    }

    fn route_tokens(value: &Value) -> Result<RouteTokens> {
        const AT: &str = "/notification/route_tokens";
        let o = closed(value, AT, &["realm_route_token", "scope_route_token"])?;
        let opaque = |name: &str| o.get(name).map(|v| token(v, &member(AT, name), 512)).transpose();
        Ok(RouteTokens {
            realm_route_token: opaque("realm_route_token")?,
            scope_route_token: opaque("scope_route_token")?,
        })
    }

    fn audit_envelope(value: &Value) -> Result<AuditEnvelope> {
        const AT: &str = "/audit_envelope";
        let o = closed(value, AT, &["access_kind", "late_recovery_original_event_id"])?;
        let kind = string(required(o, AT, "access_kind")?, "/audit_envelope/access_kind")?;
        if !is_event_kind(kind) {
            return Err(SchemaViolation::body("/audit_envelope/access_kind", Rule::BadText));
        }
        let original = o
            .get("late_recovery_original_event_id")
            .map(|v| token(v, "/audit_envelope/late_recovery_original_event_id", 255))
            .transpose()?;
        Ok(AuditEnvelope { access_kind: kind.to_owned(), late_recovery_original_event_id: original })
    }
}

/// An `event_kind` (§5.1): a coarse routing selector such as
/// `ak.message.create`. Reading: 1 to 128 characters of a-z 0-9 . _ -.
pub fn is_event_kind(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const TARGET: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
    const D1: &str = "ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f";
    const D2: &str = "ak:device:0192f3a1-4c2b-7d5e-b021-3c4d5e6f7a8b";

    /// The spec's §5.1 example request.
    fn example() -> Value {
        json!({"notification": {
            "push_target_id": TARGET,
            "wakeup_kind": "message",
            "counts": {"badge": "2-5", "missed_call": false},
            "devices": [{"device_id": D1}, {"device_id": D2}]
        }})
    }

    fn parse(value: &Value) -> Result<NotifyRequest> {
        let grid = CountGrid::default();
        let limits = NotifyLimits { grid: &grid, max_unread_increment: 20, max_devices: 3 };
        NotifyRequest::parse(value.to_string().as_bytes(), &limits)
    }

    /// `example()` with `f` applied.
    fn edited(f: impl FnOnce(&mut Value)) -> Value {
        let mut v = example();
        f(&mut v);
        v
    }

    fn refused(value: Value, pointer: &str, rule: Rule) {
        let err = parse(&value).unwrap_err();
        assert_eq!(err, SchemaViolation::body(pointer, rule), "{value}");
        // The message names the place and the rule, never a value.
        assert!(!err.to_string().contains("ak:device:0192") && !err.to_string().contains("kosc9"), "{err}");
    }

    #[test]
    fn the_spec_example_parses() {
        let r = parse(&example()).unwrap();
        let n = &r.notification;
        assert_eq!(n.push_target_id.to_string(), TARGET);
        assert_eq!(n.wakeup_kind, WakeupKind::Message);
        assert_eq!(n.push_hint, None);
        assert!(!n.evaluation_locus_unresolved);
        let counts = n.counts.unwrap();
        assert_eq!(counts.badge, Some(CountValue::Bucket(BucketIndex(1))));
        assert_eq!(counts.missed_call, Some(CountValue::Flag(false)));
        assert_eq!(counts.unread_increment, None);
        let devices: Vec<_> = n.devices.iter().map(DeviceId::as_str).collect();
        assert_eq!(devices, [D1, D2]);
        assert_eq!((r.event_kind.as_deref(), r.reason_code, r.audit_envelope.as_ref()), (None, None, None));
    }

    #[test]
    fn every_optional_field_parses() {
        let v = json!({
            "notification": {
                "push_target_id": TARGET, "wakeup_kind": "call_invite", "push_hint": "l10n_key",
                "push_hint_l10n_key": "push.incoming_call", "evaluation_locus_unresolved": true,
                "counts": {"badge": true, "missed_call": "21+", "unread_increment": 20},
                "devices": [{"device_id": D1}],
                "route_tokens": {"realm_route_token": "rt-1", "scope_route_token": "st-1"}
            },
            "event_kind": "ak.message.create",
            "reason_code": "historical_only",
            "audit_envelope": {"access_kind": "e2ee_late_recovery", "late_recovery_original_event_id": "ak:event:x"}
        });
        let r = parse(&v).unwrap();
        let n = &r.notification;
        assert_eq!(n.push_hint.as_ref().unwrap().l10n_key().unwrap().as_str(), "push.incoming_call");
        assert_eq!(n.push_hint.as_ref().unwrap().as_str(), "l10n_key");
        assert!(n.evaluation_locus_unresolved);
        assert_eq!(n.counts.unwrap().missed_call, Some(CountValue::Bucket(BucketIndex(3))));
        assert_eq!(n.counts.unwrap().unread_increment, Some(20));
        assert_eq!(n.route_tokens.as_ref().unwrap().realm_route_token.as_deref(), Some("rt-1"));
        assert_eq!(r.event_kind.as_deref(), Some("ak.message.create"));
        assert_eq!(r.reason_code, Some(CallerReason::HistoricalOnly));
        assert_eq!(r.audit_envelope.unwrap().access_kind, "e2ee_late_recovery");
        for &kind in <WakeupKind as strum::VariantArray>::VARIANTS {
            let v = edited(|v| v["notification"]["wakeup_kind"] = kind.as_str().into());
            assert_eq!(parse(&v).unwrap().notification.wakeup_kind, kind);
        }
        for hint in ["new_message", "incoming_call", "mention_self"] {
            let v = edited(|v| v["notification"]["push_hint"] = hint.into());
            assert_eq!(parse(&v).unwrap().notification.push_hint.unwrap().as_str(), hint);
        }
    }

    #[test]
    fn digests_tell_replays_from_other_bodies() {
        let a = parse(&example()).unwrap();
        // The same body with other whitespace and member order: same digest.
        let text = format!(
            r#"{{ "notification" : {{ "devices": [{{"device_id":"{D1}"}}, {{"device_id":"{D2}"}}],
                "counts": {{"missed_call": false, "badge": "2-5"}}, "wakeup_kind": "message",
                "push_target_id": "{TARGET}" }} }}"#
        );
        let grid = CountGrid::default();
        let limits = NotifyLimits { grid: &grid, max_unread_increment: 20, max_devices: 3 };
        let b = NotifyRequest::parse(text.as_bytes(), &limits).unwrap();
        assert_eq!(a.digest, b.digest);
        let c = parse(&edited(|v| v["notification"]["wakeup_kind"] = "mention".into())).unwrap();
        assert_ne!(a.digest, c.digest);
        assert_ne!(a.wakeup_digest, c.wakeup_digest);
        // Other devices, same wake-up: the wake-up digest is the same.
        let d = parse(&edited(|v| v["notification"]["devices"] = json!([{"device_id": D2}]))).unwrap();
        assert_ne!(a.digest, d.digest);
        assert_eq!(a.wakeup_digest, d.wakeup_digest);
    }

    #[test]
    fn not_json_and_repeated_members() {
        let grid = CountGrid::default();
        let limits = NotifyLimits { grid: &grid, max_unread_increment: 20, max_devices: 3 };
        for (body, rule) in [
            (&b"not json"[..], Rule::NotJson),
            (b"", Rule::NotJson),
            (b"{} {}", Rule::NotJson),
            (b"{\"notification\":{},\"notification\":{}}", Rule::DuplicateMember),
        ] {
            assert_eq!(NotifyRequest::parse(body, &limits).unwrap_err(), SchemaViolation::body("", rule));
        }
        let dup = format!(
            r#"{{"notification":{{"push_target_id":"{TARGET}","wakeup_kind":"message","wakeup_kind":"mention","devices":[{{"device_id":"{D1}"}}]}}}}"#
        );
        assert_eq!(NotifyRequest::parse(dup.as_bytes(), &limits).unwrap_err().rule, Rule::DuplicateMember);
        refused(json!([]), "", Rule::NotObject);
        refused(json!({}), "/notification", Rule::Missing);
        refused(json!({"notification": []}), "/notification", Rule::NotObject);
    }

    #[test]
    fn service_headers_in_the_body_are_refused() {
        for name in
            ["idempotency_key", "Idempotency-Key", "source_service_id", "Destination-Service-ID", "arkret_operation"]
        {
            refused(edited(|v| v[name] = "x".into()), &format!("/{name}"), Rule::ServiceHeaderInBody);
            refused(
                edited(|v| v["notification"][name] = "x".into()),
                &format!("/notification/{name}"),
                Rule::ServiceHeaderInBody,
            );
        }
    }

    #[test]
    fn forbidden_fields_are_refused_everywhere() {
        for name in [
            "content",
            "body",
            "preview",
            "summary",
            "extra",
            "payload",
            "data",
            "provider_payload",
            "kind",
            "content_preview",
            "content_title",
            "encrypted_content",
            "encrypted_metadata",
            "encrypted_payload",
            "aps",
            "rules",
            "dnd",
            "send_at",
            "delay_ms",
            "collapse_key",
            "token",
        ] {
            refused(edited(|v| v[name] = json!("x")), &format!("/{name}"), Rule::ForbiddenField);
            refused(
                edited(|v| v["notification"][name] = json!("x")),
                &format!("/notification/{name}"),
                Rule::ForbiddenField,
            );
        }
        refused(
            edited(|v| v["notification"]["counts"]["body"] = json!(1)),
            "/notification/counts/body",
            Rule::ForbiddenField,
        );
        refused(
            edited(|v| v["notification"]["route_tokens"] = json!({"realm_id": "ak:realm:x"})),
            "/notification/route_tokens/realm_id",
            Rule::VisibleOnlyField,
        );
        refused(edited(|v| v["account_id"] = "ak:account:x".into()), "/account_id", Rule::AccountInBody);
        refused(edited(|v| v["notification"]["other"] = json!(1)), "/notification/other", Rule::UnknownField);
        refused(edited(|v| v["x/y~z"] = json!(1)), "/x~1y~0z", Rule::UnknownField);
    }

    #[test]
    fn visible_only_fields_are_refused_in_blind_requests() {
        for name in [
            "event_id",
            "realm_id",
            "sender_actor_id",
            "strand_id",
            "message_id",
            "sender_actor_display_name",
            "strand_title",
            "realm_title",
            "user_is_target",
            "priority",
            "membership",
        ] {
            refused(
                edited(|v| v["notification"][name] = json!("x")),
                &format!("/notification/{name}"),
                Rule::VisibleOnlyField,
            );
        }
    }

    #[test]
    fn devices_are_non_empty_unique_and_device_id_only() {
        refused(edited(|v| v["notification"]["devices"] = json!([])), "/notification/devices", Rule::NoDevices);
        refused(
            edited(|v| v["notification"]["devices"] = json!([{"device_id": D1}, {"device_id": D1}])),
            "/notification/devices/1/device_id",
            Rule::DuplicateDevice,
        );
        refused(
            edited(|v| v["notification"]["devices"] = json!({"device_id": D1})),
            "/notification/devices",
            Rule::NotArray,
        );
        refused(edited(|v| v["notification"]["devices"] = json!([D1])), "/notification/devices/0", Rule::NotObject);
        refused(
            edited(|v| v["notification"]["devices"] = json!([{}])),
            "/notification/devices/0/device_id",
            Rule::Missing,
        );
        for name in ["push_key", "app_id", "platform", "visible_notification_opt_in"] {
            refused(
                edited(|v| v["notification"]["devices"][1][name] = json!("x")),
                &format!("/notification/devices/1/{name}"),
                Rule::RoutingFieldInDevice,
            );
        }
        refused(
            edited(|v| v["notification"]["devices"][0]["extra"] = json!("x")),
            "/notification/devices/0/extra",
            Rule::ForbiddenField,
        );
        let four: Vec<_> =
            (0..4).map(|i| json!({"device_id": format!("ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7{i}")})).collect();
        refused(edited(|v| v["notification"]["devices"] = json!(four)), "/notification/devices", Rule::TooManyDevices);
        for bad in [
            "ak:device:0192f3a1-4c2b-4d5e-9f10-2a3b4c5d6e7f", // v4
            "ak:device:0192F3A1-4C2B-7D5E-9F10-2A3B4C5D6E7F", // uppercase
            "device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f",
            "ak:device:0192f3a14c2b7d5e9f102a3b4c5d6e7f",
        ] {
            refused(
                edited(|v| v["notification"]["devices"][0]["device_id"] = bad.into()),
                "/notification/devices/0/device_id",
                Rule::BadDeviceId,
            );
        }
        refused(
            edited(|v| v["notification"]["devices"][0]["device_id"] = json!(7)),
            "/notification/devices/0/device_id",
            Rule::NotString,
        );
    }

    #[test]
    fn enums_are_closed() {
        refused(
            edited(|v| v["notification"]["wakeup_kind"] = "chat".into()),
            "/notification/wakeup_kind",
            Rule::NotInEnum,
        );
        refused(
            edited(|v| v["notification"]["wakeup_kind"] = "Message".into()),
            "/notification/wakeup_kind",
            Rule::NotInEnum,
        );
        refused(
            edited(|v| v["notification"].as_object_mut().unwrap().remove("wakeup_kind").map(drop).unwrap()),
            "/notification/wakeup_kind",
            Rule::Missing,
        );
        refused(
            edited(|v| v["notification"]["push_hint"] = "matched_keyword".into()),
            "/notification/push_hint",
            Rule::NotInEnum,
        );
        refused(edited(|v| v["reason_code"] = "replay".into()), "/reason_code", Rule::NotInEnum);
        refused(edited(|v| v["event_kind"] = "Ak.Message".into()), "/event_kind", Rule::BadText);
        refused(edited(|v| v["event_kind"] = json!(1)), "/event_kind", Rule::NotString);
        refused(
            edited(|v| v["notification"]["evaluation_locus_unresolved"] = "true".into()),
            "/notification/evaluation_locus_unresolved",
            Rule::NotBool,
        );
    }

    #[test]
    fn push_hint_and_its_l10n_key_come_in_pairs() {
        const KEY: &str = "/notification/push_hint_l10n_key";
        refused(edited(|v| v["notification"]["push_hint"] = "l10n_key".into()), KEY, Rule::L10nKeyPairing);
        refused(edited(|v| v["notification"]["push_hint_l10n_key"] = "push.x".into()), KEY, Rule::L10nKeyPairing);
        refused(
            edited(|v| {
                v["notification"]["push_hint"] = "new_message".into();
                v["notification"]["push_hint_l10n_key"] = "push.x".into();
            }),
            KEY,
            Rule::L10nKeyPairing,
        );
        refused(
            edited(|v| {
                v["notification"]["push_hint"] = "l10n_key".into();
                v["notification"]["push_hint_l10n_key"] = "Alice says hi".into();
            }),
            KEY,
            Rule::BadText,
        );
    }

    #[test]
    fn counts_are_flags_buckets_or_a_bounded_increment() {
        const C: &str = "/notification/counts";
        refused(
            edited(|v| v["notification"]["counts"]["badge"] = json!(3)),
            &format!("{C}/badge"),
            Rule::AbsoluteCount,
        );
        refused(
            edited(|v| v["notification"]["counts"]["missed_call"] = json!(1)),
            &format!("{C}/missed_call"),
            Rule::AbsoluteCount,
        );
        refused(
            edited(|v| v["notification"]["counts"]["badge"] = json!(null)),
            &format!("{C}/badge"),
            Rule::AbsoluteCount,
        );
        for bucket in ["3", "2-6", "21", "0", "22+", ""] {
            refused(
                edited(|v| v["notification"]["counts"]["badge"] = bucket.into()),
                &format!("{C}/badge"),
                Rule::BucketNotInGrid,
            );
        }
        for n in [json!(0), json!(21), json!(-1), json!(1.5), json!("3")] {
            refused(
                edited(|v| v["notification"]["counts"]["unread_increment"] = n.clone()),
                &format!("{C}/unread_increment"),
                Rule::IncrementOutOfRange,
            );
        }
        refused(
            edited(|v| v["notification"]["counts"]["unread"] = json!(5)),
            &format!("{C}/unread"),
            Rule::UnknownField,
        );
        refused(edited(|v| v["notification"]["counts"] = json!(5)), C, Rule::NotObject);
    }

    #[test]
    fn push_target_ids_are_strict() {
        const AT: &str = "/notification/push_target_id";
        for bad in [
            format!("{TARGET}="),
            TARGET.replace("sm8", "sm9"),
            TARGET.replace('-', "+"),
            TARGET.replace("b6X364", "b6X/64"),
            TARGET[..TARGET.len() - 1].to_owned(),
            format!("{TARGET}A"),
            "ak:account:example".to_owned(),
        ] {
            refused(edited(|v| v["notification"]["push_target_id"] = bad.clone().into()), AT, Rule::BadPushTargetId);
        }
        refused(
            edited(|v| v["notification"].as_object_mut().unwrap().remove("push_target_id").map(drop).unwrap()),
            AT,
            Rule::Missing,
        );
    }

    #[test]
    fn route_tokens_and_audit_envelopes_are_closed() {
        refused(
            edited(|v| v["notification"]["route_tokens"] = json!({"realm_route_token": "a b"})),
            "/notification/route_tokens/realm_route_token",
            Rule::BadText,
        );
        refused(
            edited(|v| v["notification"]["route_tokens"] = json!({"mention_token": "x"})),
            "/notification/route_tokens/mention_token",
            Rule::ForbiddenField,
        );
        refused(edited(|v| v["audit_envelope"] = json!({})), "/audit_envelope/access_kind", Rule::Missing);
        refused(
            edited(|v| v["audit_envelope"] = json!({"access_kind": "x", "note": "y"})),
            "/audit_envelope/note",
            Rule::UnknownField,
        );
    }
}
