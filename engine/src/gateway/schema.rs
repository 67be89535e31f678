//! The closed JSON bodies and the headers of spec 002's three operations,
//! parsed into typed requests (§3.1 register-device, §3.2 unregister-device,
//! §5.1 notify). Anything the tables do not define is refused with
//! `schema_violation`, naming where and which rule, never the value.
//!
//! Bodies are read as strict JSON first (a repeated member name is refused:
//! RFC 8785 needs I-JSON, and two readings of one body must not exist), then
//! walked by hand so that each refusal can say precisely what was wrong.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::grid::{BucketIndex, CountGrid};
use super::identity::{DeviceId, IdError, PushRouteId, PushTargetId, ServiceId, visible_ascii};
use super::jcs;

pub const HEADER_OPERATION: &str = "arkret-operation";
pub const HEADER_IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const HEADER_SOURCE_SERVICE: &str = "source-service-id";
pub const HEADER_DESTINATION_SERVICE: &str = "destination-service-id";

/// The operations and their paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    RegisterDevice,
    UnregisterDevice,
    Notify,
}

impl Operation {
    /// The exact `Arkret-Operation` selector. §3.1 names register's; the
    /// unregister one follows the same pattern (reading).
    pub fn selector(self) -> &'static str {
        match self {
            Self::RegisterDevice => "ak.edge.push.command.register_device.v1",
            Self::UnregisterDevice => "ak.edge.push.command.unregister_device.v1",
            Self::Notify => "ak.edge.push.command.notify.v1",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Self::RegisterDevice => "/_arkret/edge/push/register-device",
            Self::UnregisterDevice => "/_arkret/edge/push/unregister-device",
            Self::Notify => "/_arkret/edge/push/notify",
        }
    }

    /// §5.1: notify MUST carry the selector. Reading: register/unregister
    /// may omit it, but a present one must be theirs.
    pub fn selector_required(self) -> bool {
        matches!(self, Self::Notify)
    }
}

/// Where a violation is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A JSON pointer into the body ("" is the whole body).
    Body(String),
    /// A header, by its canonical name.
    Header(&'static str),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Body(p) if p.is_empty() => f.write_str("the body"),
            Self::Body(p) => write!(f, "body {p}"),
            Self::Header(h) => write!(f, "header {h}"),
        }
    }
}

/// Which rule a request broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    #[error("the body is not a single JSON value")]
    NotJson,
    #[error("a member name is repeated")]
    DuplicateMember,
    #[error("must be a JSON object")]
    NotObject,
    #[error("is required")]
    Missing,
    #[error("is not a field of this operation")]
    UnknownField,
    #[error("is forbidden in every push request (content, payloads, provider fields, rules, timing hints)")]
    ForbiddenField,
    #[error("is a visible-notification field; this gateway serves the blind_wakeup profile only")]
    VisibleOnlyField,
    #[error("is a service header and must not be carried in the body")]
    ServiceHeaderInBody,
    #[error("the account comes from the authenticated session, never the body")]
    AccountInBody,
    #[error("a device item carries device_id only; routes come from the registration")]
    RoutingFieldInDevice,
    #[error("must be a string")]
    NotString,
    #[error("must be a boolean")]
    NotBool,
    #[error("must be an array")]
    NotArray,
    #[error("is not one of the allowed values")]
    NotInEnum,
    #[error("is too long or holds characters outside the allowed set")]
    BadText,
    #[error("push_target_id must be \"ak:pseudonym:push:\" and the canonical unpadded base64url of 32 octets")]
    BadPushTargetId,
    #[error("device_id must be \"ak:device:\" and a lowercase UUIDv7")]
    BadDeviceId,
    #[error("push_hint_l10n_key is present exactly when push_hint is \"l10n_key\"")]
    L10nKeyPairing,
    #[error("must be a boolean or a bucket of the grid, never an absolute count")]
    AbsoluteCount,
    #[error("is not a bucket of the grid")]
    BucketNotInGrid,
    #[error("must be a whole number from 1 to the configured maximum")]
    IncrementOutOfRange,
    #[error("must name at least one device")]
    NoDevices,
    #[error("names more devices than this gateway accepts in one request")]
    TooManyDevices,
    #[error("names a device twice")]
    DuplicateDevice,
    #[error(
        "push_key names no provider this gateway delivers (prefix fcm:, apns:, apns-sandbox:, or platform android/ios)"
    )]
    UnroutablePushKey,
    #[error("is required")]
    MissingHeader,
    #[error("must appear once")]
    RepeatedHeader,
    #[error("does not select this operation")]
    WrongOperation,
    #[error("must be 1 to 255 visible ASCII characters")]
    BadHeaderValue,
}

/// `schema_violation` (§5.1): the request is refused whole and changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {rule}")]
pub struct SchemaViolation {
    pub at: Location,
    pub rule: Rule,
}

impl SchemaViolation {
    /// The problem code of every such refusal.
    pub const CODE: &'static str = "schema_violation";

    fn body(pointer: impl Into<String>, rule: Rule) -> Self {
        Self { at: Location::Body(pointer.into()), rule }
    }

    fn header(name: &'static str, rule: Rule) -> Self {
        Self { at: Location::Header(name), rule }
    }
}

type Result<T> = std::result::Result<T, SchemaViolation>;

// ---------------------------------------------------------------- headers

fn header_once<'h>(headers: &'h http::HeaderMap, name: &'static str, shown: &'static str) -> Result<Option<&'h str>> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(SchemaViolation::header(shown, Rule::RepeatedHeader));
    }
    match first.to_str() {
        Ok(v) if visible_ascii(v, 255) => Ok(Some(v)),
        _ => Err(SchemaViolation::header(shown, Rule::BadHeaderValue)),
    }
}

/// `Arkret-Operation` against `op` (§5.1: exact selector).
pub fn check_operation(headers: &http::HeaderMap, op: Operation) -> Result<()> {
    const SHOWN: &str = "Arkret-Operation";
    match header_once(headers, HEADER_OPERATION, SHOWN) {
        Ok(None) if op.selector_required() => Err(SchemaViolation::header(SHOWN, Rule::MissingHeader)),
        Ok(None) => Ok(()),
        Ok(Some(v)) if v == op.selector() => Ok(()),
        Ok(Some(_)) | Err(SchemaViolation { rule: Rule::BadHeaderValue, .. }) => {
            Err(SchemaViolation::header(SHOWN, Rule::WrongOperation))
        }
        Err(e) => Err(e),
    }
}

/// An `Idempotency-Key` (§5.2). Reading: an opaque value of 1 to 255
/// visible ASCII characters, compared byte for byte (a structured-field
/// string's quotes are part of it).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(s: &str) -> Option<Self> {
        visible_ascii(s, 255).then(|| Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdempotencyKey(..)")
    }
}

/// The transport headers of notify (§5.1), each exactly once. Their
/// authenticity is `signature.rs`'s; that `source` is a configured Station
/// and `destination` this gateway is the service's to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyHeaders {
    pub idempotency_key: IdempotencyKey,
    pub source: ServiceId,
    pub destination: ServiceId,
}

impl NotifyHeaders {
    pub fn parse(headers: &http::HeaderMap) -> Result<Self> {
        check_operation(headers, Operation::Notify)?;
        let required = |name: &'static str, shown: &'static str| {
            header_once(headers, name, shown)?.ok_or(SchemaViolation::header(shown, Rule::MissingHeader))
        };
        let key = required(HEADER_IDEMPOTENCY_KEY, "Idempotency-Key")?;
        let source = required(HEADER_SOURCE_SERVICE, "Source-Service-ID")?;
        let destination = required(HEADER_DESTINATION_SERVICE, "Destination-Service-ID")?;
        Ok(Self {
            idempotency_key: IdempotencyKey::parse(key).expect("checked by header_once"),
            source: ServiceId::parse(source)
                .map_err(|_| SchemaViolation::header("Source-Service-ID", Rule::BadHeaderValue))?,
            destination: ServiceId::parse(destination)
                .map_err(|_| SchemaViolation::header("Destination-Service-ID", Rule::BadHeaderValue))?,
        })
    }
}

// ---------------------------------------------------------- strict JSON

/// A JSON value read with repeated member names refused.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

const DUPLICATE: &str = "duplicate member name";

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if members.insert(name, value).is_some() {
                return Err(de::Error::custom(DUPLICATE));
            }
        }
        Ok(Value::Object(members))
    }
}

fn strict_json(body: &[u8]) -> Result<Value> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = Strict::deserialize(&mut de).map_err(|e| {
        let rule = if e.to_string().starts_with(DUPLICATE) { Rule::DuplicateMember } else { Rule::NotJson };
        SchemaViolation::body("", rule)
    })?;
    de.end().map_err(|_| SchemaViolation::body("", Rule::NotJson))?;
    Ok(value.0)
}

// ------------------------------------------------------ field classifiers

/// Names forbidden in every request, whatever the object (§5.1 three-layer
/// boundary, §6.2, checklist rule 7): content and payload containers,
/// provider-private fields, rule/DND plaintext and timing hints.
fn is_forbidden(name: &str) -> bool {
    #[rustfmt::skip]
    const FORBIDDEN: &[&str] = &[
        "content", "body", "preview", "summary", "extra", "payload", "data", "provider_payload", "kind",
        // provider-private bodies and raw provider fields
        "aps", "apns", "fcm", "android", "webpush", "alert", "sound", "badge_count", "collapse_key",
        "collapse_id", "apns_collapse_id", "apns_topic", "apns_priority", "apns_push_type", "token",
        "provider", "provider_token", "provider_message_id", "message",
        // rule / DND plaintext
        "rules", "push_rules", "rule", "rule_id", "matched_rule", "matched_keyword", "keywords", "dnd",
        "dnd_schedule", "snooze", "quiet_hours",
        // timing hints (§8: notify carries none)
        "timing", "timing_hint", "delay", "delay_ms", "send_at", "deliver_at", "not_before", "ttl",
        "expiration", "push_wakeup_mode",
        // mention routing (§4.5: any mention routing wire input is refused)
        "mention_token", "mention_recipients", "audience",
    ];
    FORBIDDEN.contains(&name) || name.starts_with("content_") || name.starts_with("encrypted_")
}

/// §5.1's visible-only rows.
fn is_visible_only(name: &str) -> bool {
    const VISIBLE: &[&str] = &[
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
    ];
    VISIBLE.contains(&name)
}

/// §5.1: the service headers are never repeated in the body, in whatever
/// spelling.
fn is_service_header(name: &str) -> bool {
    let folded = name.to_ascii_lowercase().replace('-', "_");
    matches!(
        folded.as_str(),
        "arkret_operation" | "idempotency_key" | "source_service_id" | "destination_service_id" | "operation"
    )
}

/// §3.1: identity is the session's.
fn is_account_field(name: &str) -> bool {
    matches!(name, "account_id" | "principal_id" | "recipient_id")
}

/// Walks an object whose allowed members are `allowed`: every other member is
/// refused with the most precise rule.
fn closed<'v>(value: &'v Value, pointer: &str, allowed: &[&str]) -> Result<&'v Map<String, Value>> {
    let object = value.as_object().ok_or_else(|| SchemaViolation::body(pointer, Rule::NotObject))?;
    for name in object.keys() {
        if allowed.contains(&name.as_str()) {
            continue;
        }
        let rule = if is_service_header(name) {
            Rule::ServiceHeaderInBody
        } else if is_account_field(name) {
            Rule::AccountInBody
        } else if is_visible_only(name) {
            Rule::VisibleOnlyField
        } else if is_forbidden(name) {
            Rule::ForbiddenField
        } else {
            Rule::UnknownField
        };
        return Err(SchemaViolation::body(member(pointer, name), rule));
    }
    Ok(object)
}

/// RFC 6901: `~` → `~0`, `/` → `~1`.
fn member(pointer: &str, name: &str) -> String {
    format!("{pointer}/{}", name.replace('~', "~0").replace('/', "~1"))
}

fn required<'v>(object: &'v Map<String, Value>, pointer: &str, name: &str) -> Result<&'v Value> {
    object.get(name).ok_or_else(|| SchemaViolation::body(member(pointer, name), Rule::Missing))
}

fn string<'v>(value: &'v Value, pointer: &str) -> Result<&'v str> {
    value.as_str().ok_or_else(|| SchemaViolation::body(pointer, Rule::NotString))
}

/// A string of 1 to `max` visible ASCII characters.
fn token(value: &Value, pointer: &str, max: usize) -> Result<String> {
    let s = string(value, pointer)?;
    if visible_ascii(s, max) { Ok(s.to_owned()) } else { Err(SchemaViolation::body(pointer, Rule::BadText)) }
}

fn boolean(value: &Value, pointer: &str) -> Result<bool> {
    value.as_bool().ok_or_else(|| SchemaViolation::body(pointer, Rule::NotBool))
}

fn device_id(value: &Value, pointer: &str) -> Result<DeviceId> {
    DeviceId::parse(string(value, pointer)?).map_err(|_| SchemaViolation::body(pointer, Rule::BadDeviceId))
}

// ------------------------------------------------------------ register

/// §3.1 `platform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    Android,
    Ios,
    Web,
    Desktop,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Android => "android",
            Self::Ios => "ios",
            Self::Web => "web",
            Self::Desktop => "desktop",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Android, Self::Ios, Self::Web, Self::Desktop].into_iter().find(|p| p.as_str() == s)
    }
}

/// §3.1 `push_key`: the device's token on its push platform. Reading (the
/// spec's example is `"fcm:eJx9k2..."`): a `fcm:`, `apns:` or
/// `apns-sandbox:` prefix names the route; a bare token is routed by
/// `platform` (android → FCM, ios → APNs production). Debug shows nothing
/// of it, and nothing derived from it ever leaves the gateway (§5.2).
#[derive(Clone, PartialEq, Eq)]
pub struct PushKey {
    raw: String,
    route: PushRouteId,
    token_start: usize,
}

/// Provider tokens are far shorter; the bound keeps a body small.
const MAX_PUSH_KEY: usize = 4096;

impl PushKey {
    pub fn parse(raw: &str, platform: Option<Platform>) -> std::result::Result<Self, Rule> {
        if !visible_ascii(raw, MAX_PUSH_KEY) {
            return Err(Rule::BadText);
        }
        let prefixed = [
            ("fcm:", PushRouteId::FcmMain),
            ("apns:", PushRouteId::ApnsMain),
            ("apns-sandbox:", PushRouteId::ApnsSandbox),
        ]
        .into_iter()
        .find(|(prefix, _)| raw.starts_with(prefix));
        let (route, token_start) = match (prefixed, platform) {
            (Some((prefix, route)), _) => (route, prefix.len()),
            (None, Some(Platform::Android)) => (PushRouteId::FcmMain, 0),
            (None, Some(Platform::Ios)) => (PushRouteId::ApnsMain, 0),
            (None, _) => return Err(Rule::UnroutablePushKey),
        };
        if token_start == raw.len() {
            return Err(Rule::BadText);
        }
        Ok(Self { raw: raw.to_owned(), route, token_start })
    }

    /// The route this key is delivered on (an input of the pseudonym).
    pub fn route(&self) -> PushRouteId {
        self.route
    }

    /// The provider's device token (APNs device token, FCM registration token).
    pub fn provider_token(&self) -> &str {
        &self.raw[self.token_start..]
    }

    /// The key as registered, for storage and for §3.2's exact match.
    pub fn as_registered(&self) -> &str {
        &self.raw
    }
}

impl fmt::Debug for PushKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PushKey({}, ..)", self.route.as_str())
    }
}

/// `POST /_arkret/edge/push/register-device` (§3.1). The account is the
/// authenticated session's; the body never names one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterDevice {
    pub device_id: DeviceId,
    /// Matched byte for byte against the onboarded gateways by the service.
    pub push_gateway_url: String,
    pub push_key: PushKey,
    pub platform: Option<Platform>,
    pub app_id: Option<String>,
    pub display_name: Option<String>,
    pub visible_notification_opt_in: bool,
}

impl RegisterDevice {
    const FIELDS: &[&str] = &[
        "device_id",
        "push_gateway_url",
        "push_key",
        "platform",
        "app_id",
        "display_name",
        "visible_notification_opt_in",
    ];

    pub fn parse(body: &[u8]) -> Result<Self> {
        let value = strict_json(body)?;
        let o = closed(&value, "", Self::FIELDS)?;
        let device_id = device_id(required(o, "", "device_id")?, "/device_id")?;
        let push_gateway_url = token(required(o, "", "push_gateway_url")?, "/push_gateway_url", 2048)?;
        let platform = match o.get("platform") {
            None => None,
            Some(v) => Some(
                Platform::parse(string(v, "/platform")?).ok_or(SchemaViolation::body("/platform", Rule::NotInEnum))?,
            ),
        };
        let push_key = string(required(o, "", "push_key")?, "/push_key")?;
        let push_key = PushKey::parse(push_key, platform).map_err(|rule| SchemaViolation::body("/push_key", rule))?;
        let app_id = o.get("app_id").map(|v| token(v, "/app_id", 255)).transpose()?;
        let display_name = match o.get("display_name") {
            None => None,
            Some(v) => {
                let s = string(v, "/display_name")?;
                if s.is_empty() || s.len() > 256 || s.chars().any(char::is_control) {
                    return Err(SchemaViolation::body("/display_name", Rule::BadText));
                }
                Some(s.to_owned())
            }
        };
        let visible_notification_opt_in = o
            .get("visible_notification_opt_in")
            .map(|v| boolean(v, "/visible_notification_opt_in"))
            .transpose()?
            .unwrap_or(false);
        Ok(Self { device_id, push_gateway_url, push_key, platform, app_id, display_name, visible_notification_opt_in })
    }
}

/// `POST /_arkret/edge/push/unregister-device` (§3.2): `device_id` byte for
/// byte as registered; `push_key` / `app_id` narrow what is revoked and are
/// compared byte for byte with the registration's.
#[derive(Clone, PartialEq, Eq)]
pub struct UnregisterDevice {
    pub device_id: DeviceId,
    pub push_key: Option<String>,
    pub app_id: Option<String>,
}

impl fmt::Debug for UnregisterDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnregisterDevice")
            .field("push_key", &self.push_key.as_ref().map(|_| ".."))
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl UnregisterDevice {
    pub fn parse(body: &[u8]) -> Result<Self> {
        let value = strict_json(body)?;
        let o = closed(&value, "", &["device_id", "push_key", "app_id"])?;
        Ok(Self {
            device_id: device_id(required(o, "", "device_id")?, "/device_id")?,
            push_key: o.get("push_key").map(|v| token(v, "/push_key", MAX_PUSH_KEY)).transpose()?,
            app_id: o.get("app_id").map(|v| token(v, "/app_id", 255)).transpose()?,
        })
    }
}

// -------------------------------------------------------------- notify

/// §5.1 `wakeup_kind`: a coarse class, never Realm or sender information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    pub const ALL: [Self; 9] = [
        Self::Message,
        Self::Mention,
        Self::Assignment,
        Self::Schedule,
        Self::Reaction,
        Self::CallInvite,
        Self::Reminder,
        Self::ScheduledSend,
        Self::ExpiryInvalidation,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::Mention => "mention",
            Self::Assignment => "assignment",
            Self::Schedule => "schedule",
            Self::Reaction => "reaction",
            Self::CallInvite => "call_invite",
            Self::Reminder => "reminder",
            Self::ScheduledSend => "scheduled_send",
            Self::ExpiryInvalidation => "expiry_invalidation",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
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

impl fmt::Debug for RouteTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RouteTokens(..)")
    }
}

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
        for kind in WakeupKind::ALL {
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

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, http::HeaderValue::from_str(value).unwrap());
        }
        h
    }

    const NOTIFY_HEADERS: [(&str, &str); 4] = [
        ("arkret-operation", "ak.edge.push.command.notify.v1"),
        ("idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("source-service-id", "did:web:station.example"),
        ("destination-service-id", "did:web:push.example"),
    ];

    #[test]
    fn notify_headers() {
        let h = NotifyHeaders::parse(&headers(&NOTIFY_HEADERS)).unwrap();
        assert_eq!(h.idempotency_key.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        assert_eq!((h.source.as_str(), h.destination.as_str()), ("did:web:station.example", "did:web:push.example"));

        let without = |name: &str| -> Vec<_> { NOTIFY_HEADERS.iter().copied().filter(|(n, _)| *n != name).collect() };
        let err = |pairs: &[(&'static str, &str)]| NotifyHeaders::parse(&headers(pairs)).unwrap_err();
        assert_eq!(err(&without("arkret-operation")), SchemaViolation::header("Arkret-Operation", Rule::MissingHeader));
        assert_eq!(err(&without("idempotency-key")), SchemaViolation::header("Idempotency-Key", Rule::MissingHeader));
        assert_eq!(
            err(&without("source-service-id")),
            SchemaViolation::header("Source-Service-ID", Rule::MissingHeader)
        );
        assert_eq!(
            err(&without("destination-service-id")),
            SchemaViolation::header("Destination-Service-ID", Rule::MissingHeader)
        );
        let mut wrong = without("arkret-operation");
        wrong.push(("arkret-operation", "ak.edge.push.command.register_device.v1"));
        assert_eq!(err(&wrong), SchemaViolation::header("Arkret-Operation", Rule::WrongOperation));
        let mut twice = NOTIFY_HEADERS.to_vec();
        twice.push(("idempotency-key", "other"));
        assert_eq!(err(&twice), SchemaViolation::header("Idempotency-Key", Rule::RepeatedHeader));
        let mut spaced = without("source-service-id");
        spaced.push(("source-service-id", "did:web:a b"));
        assert_eq!(err(&spaced), SchemaViolation::header("Source-Service-ID", Rule::BadHeaderValue));
        let mut long = without("idempotency-key");
        let key = "k".repeat(256);
        long.push(("idempotency-key", &key));
        assert_eq!(err(&long), SchemaViolation::header("Idempotency-Key", Rule::BadHeaderValue));
    }

    #[test]
    fn station_operations_may_omit_their_selector() {
        assert!(check_operation(&headers(&[]), Operation::RegisterDevice).is_ok());
        let register = headers(&[("arkret-operation", "ak.edge.push.command.register_device.v1")]);
        assert!(check_operation(&register, Operation::RegisterDevice).is_ok());
        assert_eq!(
            check_operation(&register, Operation::UnregisterDevice).unwrap_err(),
            SchemaViolation::header("Arkret-Operation", Rule::WrongOperation)
        );
        assert_eq!(Operation::Notify.path(), "/_arkret/edge/push/notify");
    }

    /// §3.1's example body.
    fn register_example() -> Value {
        json!({
            "device_id": "ak:device:01964137-0000-7000-8000-000000000000",
            "push_gateway_url": "https://push.example.com/_arkret/edge/push/notify",
            "push_key": "fcm:eJx9k2...",
            "platform": "android",
            "app_id": "com.arkret.client",
            "display_name": "Alice's Pixel 9"
        })
    }

    fn register(value: &Value) -> Result<RegisterDevice> {
        RegisterDevice::parse(value.to_string().as_bytes())
    }

    #[test]
    fn register_device_parses_the_spec_example() {
        let r = register(&register_example()).unwrap();
        assert_eq!(r.device_id.as_str(), "ak:device:01964137-0000-7000-8000-000000000000");
        assert_eq!(r.push_key.route(), PushRouteId::FcmMain);
        assert_eq!(r.push_key.provider_token(), "eJx9k2...");
        assert_eq!(r.push_key.as_registered(), "fcm:eJx9k2...");
        assert_eq!(r.platform, Some(Platform::Android));
        assert_eq!(r.app_id.as_deref(), Some("com.arkret.client"));
        assert_eq!(r.display_name.as_deref(), Some("Alice's Pixel 9"));
        assert!(!r.visible_notification_opt_in);
        assert!(!format!("{r:?}").contains("eJx9k2"), "Debug hides the push key");
    }

    #[test]
    fn push_keys_name_their_route() {
        let key =
            |raw: &str, platform| PushKey::parse(raw, platform).map(|k| (k.route(), k.provider_token().to_owned()));
        assert_eq!(key("apns:abcd", None), Ok((PushRouteId::ApnsMain, "abcd".into())));
        assert_eq!(key("apns-sandbox:abcd", Some(Platform::Ios)), Ok((PushRouteId::ApnsSandbox, "abcd".into())));
        assert_eq!(key("abcd", Some(Platform::Ios)), Ok((PushRouteId::ApnsMain, "abcd".into())));
        assert_eq!(key("abcd", Some(Platform::Android)), Ok((PushRouteId::FcmMain, "abcd".into())));
        assert_eq!(key("abcd", Some(Platform::Web)), Err(Rule::UnroutablePushKey));
        assert_eq!(key("abcd", None), Err(Rule::UnroutablePushKey));
        assert_eq!(key("fcm:", None), Err(Rule::BadText));
        assert_eq!(key("fcm:a b", None), Err(Rule::BadText));
        assert_eq!(key(&"a".repeat(4097), Some(Platform::Ios)), Err(Rule::BadText));
    }

    #[test]
    fn register_device_refusals() {
        let refused = |f: &dyn Fn(&mut Value), pointer: &str, rule: Rule| {
            let mut v = register_example();
            f(&mut v);
            assert_eq!(register(&v).unwrap_err(), SchemaViolation::body(pointer, rule), "{v}");
        };
        for name in ["account_id", "principal_id", "recipient_id"] {
            refused(&|v| v[name] = "ak:account:x".into(), &format!("/{name}"), Rule::AccountInBody);
        }
        refused(&|v| v["source_service_id"] = "x".into(), "/source_service_id", Rule::ServiceHeaderInBody);
        refused(&|v| v["extra"] = json!({}), "/extra", Rule::ForbiddenField);
        refused(&|v| v["sandbox"] = json!(true), "/sandbox", Rule::UnknownField);
        for name in ["device_id", "push_gateway_url", "push_key"] {
            refused(&|v| drop(v.as_object_mut().unwrap().remove(name)), &format!("/{name}"), Rule::Missing);
        }
        refused(&|v| v["device_id"] = "ak:device:1".into(), "/device_id", Rule::BadDeviceId);
        refused(&|v| v["platform"] = "symbian".into(), "/platform", Rule::NotInEnum);
        refused(
            &|v| {
                v["push_key"] = "eJx9k2".into();
                v["platform"] = "web".into();
            },
            "/push_key",
            Rule::UnroutablePushKey,
        );
        refused(&|v| v["push_key"] = json!(1), "/push_key", Rule::NotString);
        refused(&|v| v["display_name"] = "a\nb".into(), "/display_name", Rule::BadText);
        refused(&|v| v["display_name"] = "x".repeat(257).into(), "/display_name", Rule::BadText);
        refused(&|v| v["visible_notification_opt_in"] = "yes".into(), "/visible_notification_opt_in", Rule::NotBool);
        refused(&|v| v["app_id"] = "".into(), "/app_id", Rule::BadText);
        let mut v = register_example();
        v["visible_notification_opt_in"] = true.into();
        v["push_key"] = "raw-apns-token".into();
        v["platform"] = "ios".into();
        let r = register(&v).unwrap();
        assert!(r.visible_notification_opt_in);
        assert_eq!(r.push_key.route(), PushRouteId::ApnsMain);
    }

    #[test]
    fn unregister_device() {
        let u = UnregisterDevice::parse(br#"{"device_id":"ak:device:01964137-0000-7000-8000-000000000000"}"#).unwrap();
        assert_eq!((u.push_key, u.app_id), (None, None));
        let u = UnregisterDevice::parse(
            br#"{"device_id":"ak:device:01964137-0000-7000-8000-000000000000","push_key":"fcm:tok","app_id":"com.a"}"#,
        )
        .unwrap();
        assert_eq!((u.push_key.as_deref(), u.app_id.as_deref()), (Some("fcm:tok"), Some("com.a")));
        assert!(!format!("{u:?}").contains("tok"));
        let err = |body: &[u8]| UnregisterDevice::parse(body).unwrap_err();
        assert_eq!(err(b"{}"), SchemaViolation::body("/device_id", Rule::Missing));
        assert_eq!(
            err(br#"{"device_id":"ak:device:01964137-0000-7000-8000-000000000000","account_id":"x"}"#),
            SchemaViolation::body("/account_id", Rule::AccountInBody)
        );
        assert_eq!(
            err(br#"{"device_id":"AK:DEVICE:01964137-0000-7000-8000-000000000000"}"#),
            SchemaViolation::body("/device_id", Rule::BadDeviceId)
        );
    }
}
