//! The bodies of register-device (§3.1) and unregister-device (§3.2), and
//! the push key they carry.

use std::fmt;

use super::strict_json::{boolean, closed, device_id, required, strict_json, string, token};
use super::{Result, Rule, SchemaViolation};
use crate::domain::{DeviceId, PushRouteId, visible_ascii};

/// §3.1 `platform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "lowercase")]
pub enum Platform {
    Android,
    Ios,
    Web,
    Desktop,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

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
