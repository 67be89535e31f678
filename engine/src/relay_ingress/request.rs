//! Spec 003 §2.1 and §2.3: the webhook's headers and body as the ingress
//! reads them. Receivers ignore unknown fields (§2.3), so no struct here
//! denies them; every rule the ingress relies on is checked in `parse`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::channel::RelayPriority;

/// §2.1: equals the body's `delivery_id`.
pub const HEADER_DELIVERY: &str = "x-gim-delivery";

/// §2.3 `ttl`: "always 86400". A missing one takes it; a larger one is
/// capped, since it is also how long the delivery record is kept.
pub const DEFAULT_TTL: Duration = Duration::from_secs(86_400);
pub const MAX_TTL: Duration = Duration::from_secs(7 * 86_400);

/// Why a body is malformed (400). Messages name the rule, never a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, strum::VariantArray)]
pub enum Malformed {
    #[error("the body is not a JSON object of the webhook's shape")]
    Shape,
    #[error("unsupported webhook version (v must be 1)")]
    Version,
    #[error("delivery_id must be 32 lowercase hex characters")]
    DeliveryId,
    #[error("X-Gim-Delivery is missing or differs from the body's delivery_id")]
    DeliveryHeader,
    #[error("registration.provider must be 1 to 64 characters of a-z 0-9 . _ -")]
    Provider,
    #[error("registration.token must be 1 to 4096 bytes without control characters")]
    Token,
    #[error("registration.app_id must be 1 to 255 characters of A-Z a-z 0-9 . - _ :")]
    AppId,
    #[error("ttl must be positive")]
    Ttl,
}

impl Malformed {
    /// A bounded label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Shape => "malformed",
            Self::Version => "version",
            Self::DeliveryId | Self::DeliveryHeader => "delivery_id",
            Self::Provider | Self::Token | Self::AppId => "registration",
            Self::Ttl => "ttl",
        }
    }
}

/// Only `hub_id`, read before the signature is checked: it names the
/// secret. Nothing else of an unverified body is looked at.
#[derive(Deserialize)]
struct HubOnly {
    hub_id: String,
}

/// The hub that claims to have sent `body`.
pub fn hub_id(body: &[u8]) -> Result<String, Malformed> {
    serde_json::from_slice::<HubOnly>(body).map(|h| h.hub_id).map_err(|_| Malformed::Shape)
}

#[derive(Deserialize)]
struct Body {
    v: u64,
    hub_id: String,
    delivery_id: String,
    registration: Registration,
    priority: RelayPriority,
    #[serde(default)]
    collapse_id: Option<String>,
    #[serde(default)]
    ttl: Option<u64>,
    payload: Map<String, Value>,
}

/// §1's registration; `p256dh` and `auth` are Web Push keys (base64url,
/// padding optional), used by provider `webpush` only.
#[derive(Deserialize)]
struct Registration {
    provider: String,
    token: String,
    #[serde(default)]
    app_id: Option<String>,
    #[serde(default)]
    sandbox: Option<bool>,
    #[serde(default)]
    p256dh: Option<String>,
    #[serde(default)]
    auth: Option<String>,
}

/// A verified webhook's content. Debug prints no token or payload.
pub struct Webhook {
    pub hub_id: String,
    pub delivery_id: String,
    pub provider: String,
    pub token: String,
    pub app_id: Option<String>,
    pub sandbox: bool,
    pub priority: RelayPriority,
    pub collapse_id: Option<String>,
    pub ttl: Duration,
    pub payload: Map<String, Value>,
    /// `registration.p256dh` and `auth` as sent (base64url).
    pub p256dh: Option<String>,
    pub auth: Option<String>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("provider", &self.provider)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// §2.1/§2.3 after the signature passed: the shape, `v` = 1, `delivery_id`
/// (32 lowercase hex) equal to `X-Gim-Delivery`, and §1's rules on the
/// registration fields the ingress uses.
pub fn parse(body: &[u8], delivery_header: Option<&str>) -> Result<Webhook, Malformed> {
    let body: Body = serde_json::from_slice(body).map_err(|_| Malformed::Shape)?;
    if body.v != 1 {
        return Err(Malformed::Version);
    }
    let id = &body.delivery_id;
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(Malformed::DeliveryId);
    }
    if delivery_header != Some(id.as_str()) {
        return Err(Malformed::DeliveryHeader);
    }
    let r = body.registration;
    let provider_ok = (1..=64).contains(&r.provider.len())
        && r.provider.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !provider_ok {
        return Err(Malformed::Provider);
    }
    if !(1..=4096).contains(&r.token.len()) || r.token.chars().any(char::is_control) {
        return Err(Malformed::Token);
    }
    if let Some(app) = &r.app_id {
        let ok =
            (1..=255).contains(&app.len()) && app.bytes().all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b));
        if !ok {
            return Err(Malformed::AppId);
        }
    }
    let ttl = match body.ttl {
        None => DEFAULT_TTL,
        Some(0) => return Err(Malformed::Ttl),
        Some(s) => Duration::from_secs(s).min(MAX_TTL),
    };
    Ok(Webhook {
        hub_id: body.hub_id,
        delivery_id: body.delivery_id,
        provider: r.provider,
        token: r.token,
        app_id: r.app_id,
        sandbox: r.sandbox.unwrap_or(false),
        priority: body.priority,
        collapse_id: body.collapse_id,
        ttl,
        payload: body.payload,
        p256dh: r.p256dh,
        auth: r.auth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c";

    fn body() -> Value {
        serde_json::json!({"v": 1, "hub_id": "hubexample", "delivery_id": ID, "sent_at": 1760600000123u64,
            "registration": {"provider": "apns", "token": "00aa", "app_id": "im.g.apps", "sandbox": true,
                             "p256dh": "abc", "auth": "def"},
            "priority": "high", "collapse_id": "c1", "ttl": 86400,
            "payload": {"v": 1, "type": "wake", "collapse_id": "c1"},
            "unknown_top_level": {"ignored": true}})
    }

    fn parse_json(v: &Value, header: Option<&str>) -> Result<Webhook, Malformed> {
        parse(&serde_json::to_vec(v).unwrap(), header)
    }

    #[test]
    fn a_full_body_with_unknown_fields() {
        let w = parse_json(&body(), Some(ID)).unwrap();
        assert_eq!((w.hub_id.as_str(), w.delivery_id.as_str(), w.provider.as_str()), ("hubexample", ID, "apns"));
        assert_eq!((w.token.as_str(), w.app_id.as_deref(), w.sandbox), ("00aa", Some("im.g.apps"), true));
        assert_eq!((w.priority, w.collapse_id.as_deref(), w.ttl), (RelayPriority::High, Some("c1"), DEFAULT_TTL));
        assert_eq!(w.payload["type"], "wake");
        assert!(!format!("{w:?}").contains("00aa"));
    }

    #[test]
    fn each_rule() {
        let with = |path: &[&str], value: Value| {
            let mut b = body();
            let mut cur = &mut b;
            for p in &path[..path.len() - 1] {
                cur = &mut cur[*p];
            }
            cur[path[path.len() - 1]] = value;
            b
        };
        let refused =
            |b: Value, header: Option<&str>, e: Malformed| assert_eq!(parse_json(&b, header).err(), Some(e), "{b}");
        refused(body(), None, Malformed::DeliveryHeader);
        refused(body(), Some("3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7d"), Malformed::DeliveryHeader);
        refused(with(&["v"], 2.into()), Some(ID), Malformed::Version);
        refused(with(&["delivery_id"], ID.to_uppercase().into()), Some(&ID.to_uppercase()), Malformed::DeliveryId);
        refused(with(&["delivery_id"], "abc".into()), Some("abc"), Malformed::DeliveryId);
        refused(with(&["priority"], "urgent".into()), Some(ID), Malformed::Shape);
        refused(with(&["payload"], "text".into()), Some(ID), Malformed::Shape);
        refused(with(&["registration", "provider"], "APNS".into()), Some(ID), Malformed::Provider);
        refused(with(&["registration", "token"], "".into()), Some(ID), Malformed::Token);
        refused(with(&["registration", "token"], "a\nb".into()), Some(ID), Malformed::Token);
        refused(with(&["registration", "token"], "a".repeat(4097).into()), Some(ID), Malformed::Token);
        refused(with(&["registration", "app_id"], "a b".into()), Some(ID), Malformed::AppId);
        refused(with(&["ttl"], 0.into()), Some(ID), Malformed::Ttl);
        assert_eq!(parse(b"not json", Some(ID)).err(), Some(Malformed::Shape));
        // Capped ttl; absent optional fields.
        assert_eq!(parse_json(&with(&["ttl"], 10_000_000.into()), Some(ID)).unwrap().ttl, MAX_TTL);
        let mut b = body();
        b["registration"] = serde_json::json!({"provider": "fcm", "token": "t"});
        b.as_object_mut().unwrap().remove("collapse_id");
        b.as_object_mut().unwrap().remove("ttl");
        let w = parse_json(&b, Some(ID)).unwrap();
        assert_eq!((w.app_id, w.sandbox, w.collapse_id, w.ttl), (None, false, None, DEFAULT_TTL));
    }

    #[test]
    fn the_hub_is_read_alone() {
        assert_eq!(hub_id(br#"{"hub_id":"h1","anything":[1]}"#).unwrap(), "h1");
        assert_eq!(hub_id(b"[]"), Err(Malformed::Shape));
    }

    /// Webhook bodies from hubs, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;
        use strum::VariantArray as _;

        /// Field values near the rules, sometimes past them.
        fn body_fields() -> impl Strategy<Value = (u64, String, String, String, String, Option<String>, Option<u64>)> {
            (
                prop_oneof![4 => Just(1u64), 1 => any::<u64>()],
                "[0-9a-f]{32}|[0-9a-fA-F]{30,34}",
                "[a-z0-9._-]{1,64}|[a-zA-Z0-9._ -]{0,70}",
                "[ -~]{1,100}|\\PC{0,20}|[a-z\\n\\t]{0,5}",
                "[A-Za-z0-9.:_-]{1,20}|[!-~]{0,20}",
                proptest::option::of("[a-z]{1,10}"),
                proptest::option::of(prop_oneof![Just(0u64), 1u64..1_000_000, Just(u64::MAX)]),
            )
        }

        proptest! {
            /// Any bytes and any header: a verdict, never a panic; a verdict
            /// on a body names a rule only (one of the fixed rule texts,
            /// nothing of the input), and an accepted body is one whose
            /// delivery_id is the header's.
            #[test]
            fn any_bytes_are_parsed_or_refused(
                body in prop::collection::vec(any::<u8>(), 0..200),
                header in proptest::option::of("\\PC{0,40}"),
            ) {
                let rules: Vec<String> = Malformed::VARIANTS.iter().map(ToString::to_string).collect();
                match hub_id(&body) {
                    Ok(hub) => {
                        let value: Value = serde_json::from_slice(&body).expect("a body hub_id read is JSON");
                        prop_assert_eq!(value["hub_id"].as_str(), Some(hub.as_str()));
                    }
                    Err(e) => prop_assert_eq!(e, Malformed::Shape),
                }
                match parse(&body, header.as_deref()) {
                    Ok(w) => prop_assert_eq!(header.as_deref(), Some(w.delivery_id.as_str())),
                    Err(e) => prop_assert!(rules.contains(&e.to_string()), "{e}"),
                }
            }

            /// A body of the webhook's shape is accepted exactly when every
            /// section 2.3 rule holds, and then gives back what was sent.
            #[test]
            fn shaped_bodies_follow_the_rules(
                (v, delivery_id, provider, token, app_id, collapse_id, ttl) in body_fields(),
                header_matches: bool,
                with_app_id: bool,
                priority in prop_oneof![Just("high"), Just("normal"), Just("urgent")],
            ) {
                let mut json = serde_json::json!({
                    "v": v, "hub_id": "hub", "delivery_id": delivery_id,
                    "registration": {"provider": provider, "token": token, "sandbox": true},
                    "priority": priority, "payload": {"type": "wake"},
                });
                if with_app_id {
                    json["registration"]["app_id"] = Value::from(app_id.clone());
                }
                if let Some(c) = &collapse_id {
                    json["collapse_id"] = Value::from(c.clone());
                }
                if let Some(t) = ttl {
                    json["ttl"] = Value::from(t);
                }
                let header = if header_matches { delivery_id.clone() } else { format!("{delivery_id}0") };
                let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                let id_ok = delivery_id.len() == 32 && delivery_id.bytes().all(lower_hex);
                let provider_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
                let app_id_char = |b: u8| b.is_ascii_alphanumeric() || b".-_:".contains(&b);
                let expected = if priority == "urgent" {
                    Err(Malformed::Shape)
                } else if v != 1 {
                    Err(Malformed::Version)
                } else if !id_ok {
                    Err(Malformed::DeliveryId)
                } else if !header_matches {
                    Err(Malformed::DeliveryHeader)
                } else if !(1..=64).contains(&provider.len()) || !provider.bytes().all(provider_char) {
                    Err(Malformed::Provider)
                } else if token.is_empty() || token.chars().any(char::is_control) {
                    Err(Malformed::Token)
                } else if with_app_id && (app_id.is_empty() || !app_id.bytes().all(app_id_char)) {
                    Err(Malformed::AppId)
                } else if ttl == Some(0) {
                    Err(Malformed::Ttl)
                } else {
                    Ok(())
                };
                let got = parse(&serde_json::to_vec(&json).unwrap(), Some(&header));
                prop_assert_eq!(got.as_ref().map(|_| ()).map_err(|e| *e), expected);
                if let Ok(w) = got {
                    prop_assert_eq!(w.hub_id, "hub");
                    prop_assert_eq!(w.delivery_id, delivery_id);
                    prop_assert_eq!(w.provider, provider);
                    prop_assert_eq!(w.token, token);
                    prop_assert_eq!(w.app_id, with_app_id.then_some(app_id));
                    prop_assert!(w.sandbox);
                    prop_assert_eq!(w.collapse_id, collapse_id);
                    prop_assert_eq!(w.ttl, ttl.map_or(DEFAULT_TTL, |t| Duration::from_secs(t).min(MAX_TTL)));
                    prop_assert!(w.ttl <= MAX_TTL);
                }
            }

            /// Nesting deeper than the JSON reader's limit is a shape error,
            /// not a stack overflow.
            #[test]
            fn deep_nesting_is_refused(depth in 100usize..5000) {
                let body = format!("{{\"hub_id\":\"h\",\"payload\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
                prop_assert_eq!(parse(body.as_bytes(), None).map(|_| ()), Err(Malformed::Shape));
            }
        }
    }
}
