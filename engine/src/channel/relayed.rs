//! Spec 003 §2–3, push-server side: a push another hub relayed to fanout's
//! ingress (`crate::relay_ingress`), as a channel sends it. Unlike a
//! spec 000 wake-up, it carries its own payload, collapse id and priority;
//! the channels whose row takes it (APNs, FCM, Web Push) send it as
//! `Push::Relayed`.

use std::time::Duration;

use serde_json::{Map, Value};

use crate::domain::WebPushKeys;

/// The payload key a platform limit may drop (§3: "A push server whose
/// platform limit is still exceeded drops `mls_message` and keeps the rest").
pub const DROPPABLE_KEY: &str = "mls_message";

/// §2.3 `priority`: exactly two levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayPriority {
    High,
    Normal,
}

/// One relayed push. The ingress has verified the webhook and checked the
/// provider and `app_id` before a channel sees it.
#[derive(Debug, Clone, Copy)]
pub struct RelayedPush<'a> {
    /// `registration.token`.
    pub token: &'a str,
    /// `registration.app_id` when set (already allowed by the ingress): the
    /// APNs topic. `None`: the channel's own (APNs `bundle_id`).
    pub app_id: Option<&'a str>,
    /// `registration.sandbox`: the APNs sandbox host.
    pub sandbox: bool,
    pub collapse_id: Option<&'a str>,
    pub priority: RelayPriority,
    /// §3: the object the device receives.
    pub payload: &'a Map<String, Value>,
    /// §2.3 `ttl`: how long the platform may keep trying.
    pub ttl: Duration,
    /// §1 `p256dh` and `auth` of a Web Push registration, when present and
    /// valid keys; the Web Push channel refuses a push without them.
    pub web_push_keys: Option<&'a WebPushKeys>,
}

/// Why a channel sends nothing for a push. Both are permanent for this
/// push: a hub should not retry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The channel's row does not take this kind of push (`Channel::takes`).
    #[error("this channel does not take this kind of push")]
    Unsupported,
    /// Over the platform's limit even without `mls_message`.
    #[error("the payload exceeds the platform's limit")]
    TooLarge,
}

/// A request body built for a relayed push, and whether `mls_message` was
/// dropped to fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    pub body: String,
    pub dropped_mls_message: bool,
}

/// §3: builds with the whole payload; when the measured part exceeds
/// `limit` bytes, builds again without `mls_message`. `build` returns the
/// body and the size the platform counts against its limit.
pub fn fit(
    payload: &Map<String, Value>,
    limit: usize,
    build: impl Fn(&Map<String, Value>) -> (String, usize),
) -> Result<Fitted, Refusal> {
    let (body, size) = build(payload);
    if size <= limit {
        return Ok(Fitted { body, dropped_mls_message: false });
    }
    if !payload.contains_key(DROPPABLE_KEY) {
        return Err(Refusal::TooLarge);
    }
    let mut smaller = payload.clone();
    smaller.remove(DROPPABLE_KEY);
    let (body, size) = build(&smaller);
    if size <= limit { Ok(Fitted { body, dropped_mls_message: true }) } else { Err(Refusal::TooLarge) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn measured(p: &Map<String, Value>) -> (String, usize) {
        let s = serde_json::to_string(p).unwrap();
        let n = s.len();
        (s, n)
    }

    #[test]
    fn mls_message_is_dropped_only_when_over_the_limit() {
        let p = object(serde_json::json!({"v": 1, "type": "message", "mls_message": "A".repeat(100)}));
        let whole = fit(&p, 4096, measured).unwrap();
        assert!(!whole.dropped_mls_message && whole.body.contains("mls_message"));
        let small = fit(&p, 60, measured).unwrap();
        assert!(small.dropped_mls_message);
        assert_eq!(serde_json::from_str::<Value>(&small.body).unwrap(), serde_json::json!({"v": 1, "type": "message"}));
        assert_eq!(fit(&p, 10, measured), Err(Refusal::TooLarge));
        let no_mls = object(serde_json::json!({"v": 1, "type": "wake", "collapse_id": "x".repeat(100)}));
        assert_eq!(fit(&no_mls, 60, measured), Err(Refusal::TooLarge));
    }
}
