//! 003 §5: the `log` test provider. Its pushes never reach the webhook: each
//! is a structured log line (target `gim_hub_push::log`, no token, no id) and
//! an entry in the context's `PushLog` ring, which `GET /v2/debug/push-log`
//! serves when `dangerous_push_log_endpoint` is on.

use super::coalesce::RelayPush;
use super::payload::{LOG_PAYLOAD_LIMIT, Payload};
use crate::channel::push_log::{LoggedPush, PushLog};

/// Logs and records one push of a `log` registration.
pub fn record(log: &PushLog, push: &RelayPush, token: &str, minimal: bool, sent_at_ms: i64) {
    let payload = Payload::new(&push.notification, minimal, LOG_PAYLOAD_LIMIT);
    tracing::info!(
        target: "gim_hub_push::log",
        r#type = push.notification.kind.as_str(),
        priority = push.priority.as_str(),
        delivery_id = %push.delivery_id,
        mls_message = payload.has_mls_message(),
        "push (log provider)"
    );
    let device = hex::encode(push.recipient.id.as_bytes());
    log.push(LoggedPush {
        user_id: device.clone(),
        device_id: device,
        token: token.to_owned(),
        payload: serde_json::to_value(&payload).unwrap_or_default(),
        sent_at: sent_at_ms,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::push_log::RING_SIZE;
    use crate::channel::relay::coalesce::tests::push;
    use crate::channel::relay::event::EventType;

    #[test]
    fn the_ring_keeps_the_last_256_oldest_first() {
        let log = PushLog::default();
        for seq in 0..300 {
            record(&log, &push((seq % 2) as u8, EventType::Message, seq), "tok", false, seq as i64);
        }
        let all = log.notifications(None);
        let all = all["notifications"].as_array().unwrap();
        assert_eq!(all.len(), RING_SIZE);
        assert_eq!(all[0]["payload"]["seq"], 44);
        assert_eq!(all[255]["payload"]["seq"], 299);
        assert_eq!(all[0]["token"], "tok");
        let one = log.notifications(Some(&hex::encode([1u8; 32])));
        let one = one["notifications"].as_array().unwrap();
        assert_eq!(one.len(), 128);
        assert!(one.iter().all(|e| e["payload"]["seq"].as_u64().unwrap() % 2 == 1));
    }

    #[test]
    fn minimal_mode_applies_to_the_log_provider_too() {
        let log = PushLog::default();
        record(&log, &push(1, EventType::Message, 1), "tok", true, 7);
        let v = log.notifications(None);
        assert_eq!(v["notifications"][0]["payload"], serde_json::json!({"v": 1, "type": "wake", "collapse_id": "m1"}));
        assert_eq!(v["notifications"][0]["sent_at"], 7);
    }
}
