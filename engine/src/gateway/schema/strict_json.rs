//! Bodies are read as strict JSON first (a repeated member name is refused:
//! RFC 8785 needs I-JSON, and two readings of one body must not exist), then
//! walked by hand with these helpers so that each refusal can say precisely
//! what was wrong.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::{Result, Rule, SchemaViolation};
use crate::domain::{DeviceId, visible_ascii};

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

pub(super) fn strict_json(body: &[u8]) -> Result<Value> {
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
pub(super) fn closed<'v>(value: &'v Value, pointer: &str, allowed: &[&str]) -> Result<&'v Map<String, Value>> {
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
pub(super) fn member(pointer: &str, name: &str) -> String {
    format!("{pointer}/{}", name.replace('~', "~0").replace('/', "~1"))
}

pub(super) fn required<'v>(object: &'v Map<String, Value>, pointer: &str, name: &str) -> Result<&'v Value> {
    object.get(name).ok_or_else(|| SchemaViolation::body(member(pointer, name), Rule::Missing))
}

pub(super) fn string<'v>(value: &'v Value, pointer: &str) -> Result<&'v str> {
    value.as_str().ok_or_else(|| SchemaViolation::body(pointer, Rule::NotString))
}

/// A string of 1 to `max` visible ASCII characters.
pub(super) fn token(value: &Value, pointer: &str, max: usize) -> Result<String> {
    let s = string(value, pointer)?;
    if visible_ascii(s, max) { Ok(s.to_owned()) } else { Err(SchemaViolation::body(pointer, Rule::BadText)) }
}

pub(super) fn boolean(value: &Value, pointer: &str) -> Result<bool> {
    value.as_bool().ok_or_else(|| SchemaViolation::body(pointer, Rule::NotBool))
}

pub(super) fn device_id(value: &Value, pointer: &str) -> Result<DeviceId> {
    DeviceId::parse(string(value, pointer)?).map_err(|_| SchemaViolation::body(pointer, Rule::BadDeviceId))
}
