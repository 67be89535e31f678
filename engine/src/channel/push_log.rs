//! 003 §5: the ring of the last 256 pushes a channel kept in-process (the
//! relay's `log` provider), served at `GET /v2/debug/push-log` only with
//! `dangerous_push_log_endpoint`. The engine owns it and hands it to the
//! channels in their `ChannelContext`.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// 003 §5: the ring keeps the last 256 pushes.
pub const RING_SIZE: usize = 256;

/// One ring entry as the endpoint shows it. fanout has no user above a
/// device: `user_id` and `device_id` are both the recipient id in hex.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedPush {
    pub user_id: String,
    pub device_id: String,
    pub token: String,
    pub payload: serde_json::Value,
    /// Unix milliseconds of the push's first attempt.
    pub sent_at: i64,
}

#[derive(Default)]
pub struct PushLog {
    ring: Mutex<VecDeque<LoggedPush>>,
}

impl PushLog {
    pub fn push(&self, entry: LoggedPush) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == RING_SIZE {
            ring.pop_front();
        }
        ring.push_back(entry);
    }

    /// `{"notifications": [...]}`, oldest first, of one device (its id in
    /// hex) or of all.
    pub fn notifications(&self, device_id: Option<&str>) -> serde_json::Value {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let entries: Vec<&LoggedPush> =
            ring.iter().filter(|e| device_id.is_none_or(|d| d.eq_ignore_ascii_case(&e.device_id))).collect();
        serde_json::json!({ "notifications": entries })
    }
}
