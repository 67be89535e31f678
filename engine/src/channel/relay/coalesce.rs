//! 003 §4's merge rules as pure functions: a new push replacing a pending
//! one, and a retry meeting a newer pending push.

use std::sync::Arc;

use super::event::{Notification, Priority};
use crate::domain::Recipient;
use crate::page::FirstAttempt;

/// One push to one device: the newest notification, its priority, and what
/// stays fixed across its retries (delivery_id, sent_at of the first attempt).
pub struct RelayPush {
    /// The recipient as dispatch loaded it: its registration goes in the
    /// body, and a 404/410 compare-and-deletes against it.
    pub recipient: Arc<Recipient>,
    pub notification: Notification,
    pub priority: Priority,
    /// 32 lowercase hex characters, unique per push, the same on every retry.
    pub delivery_id: String,
    /// Unix milliseconds of the first attempt; set when it is made.
    pub sent_at_ms: Option<i64>,
    pub attempts: u32,
    /// PUSH-257: settled when the first attempt has its answer, or when the
    /// push is coalesced away or dropped, so the window's checkpoint moves.
    pub first_attempt: Option<FirstAttempt>,
}

impl RelayPush {
    pub fn new(recipient: Arc<Recipient>, notification: Notification, first_attempt: Option<FirstAttempt>) -> Self {
        Self {
            recipient,
            priority: notification.kind.priority(),
            notification,
            delivery_id: new_delivery_id(),
            sent_at_ms: None,
            attempts: 0,
            first_attempt,
        }
    }

    /// Settles the push's place in its window's latch, if it still has one.
    pub fn settle(&mut self) {
        if let Some(first) = self.first_attempt.take() {
            first.settle();
        }
    }
}

/// 16 random bytes in lowercase hex.
pub fn new_delivery_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// What coalescing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalesced {
    /// A silent push was raised to alert (the `upgraded` counter): the new
    /// push was silent and the one it replaced an alert.
    pub upgraded: bool,
}

/// 003 §4: `new` replaces `pending` (notification, delivery_id and
/// registration from the newest), with priority = max(pending, new), so an
/// alert is never downgraded. Returns the replaced push, whose window latch
/// the caller settles.
pub fn coalesce(pending: &mut RelayPush, new: RelayPush) -> (RelayPush, Coalesced) {
    let priority = pending.priority.max(new.priority);
    let upgraded = new.priority < priority;
    let replaced = std::mem::replace(pending, new);
    pending.priority = priority;
    (replaced, Coalesced { upgraded })
}

/// 003 §4: a retry never replaces a newer pending push; it is dropped, but
/// an alert retry raises a silent pending push to alert (its payload kept).
/// True when it did.
pub fn retry_meets_pending(retry_priority: Priority, pending: &mut RelayPush) -> bool {
    if retry_priority > pending.priority {
        pending.priority = retry_priority;
        true
    } else {
        false
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::channel::relay::event::EventType;
    use crate::domain::{DeliveryTarget, RecipientId, RegistrationInput, RelayRegistration, SecretHash};

    pub fn recipient(id: u8, token: &str) -> Arc<Recipient> {
        let registration =
            RelayRegistration::parse(RegistrationInput { provider: "apns", token, ..Default::default() }).unwrap();
        Arc::new(Recipient {
            id: RecipientId::from_bytes([id; 32]),
            secret_hash: SecretHash([0; 32]),
            target: DeliveryTarget::Relay(Some(registration)),
            renewed_at_ns: 0,
            topic_count: 0,
        })
    }

    pub fn push(id: u8, kind: EventType, seq: u64) -> RelayPush {
        let n = Notification { kind, gid: "g".into(), seq, message_id: format!("m{seq}"), mls_message: None };
        RelayPush::new(recipient(id, "t"), n, None)
    }

    #[test]
    fn the_newest_wins_and_an_alert_is_never_downgraded() {
        let mut pending = push(1, EventType::Message, 1);
        let first_id = pending.delivery_id.clone();
        let (replaced, c) = coalesce(&mut pending, push(1, EventType::MemberAdded, 2));
        assert_eq!(replaced.notification.seq, 1);
        assert_eq!((pending.notification.kind, pending.notification.seq), (EventType::MemberAdded, 2));
        assert_eq!(pending.priority, Priority::High, "the membership payload is sent as an alert");
        assert!(c.upgraded, "a silent push raised to alert");
        assert_ne!(pending.delivery_id, first_id, "the newest push's delivery_id");

        let mut silent = push(1, EventType::MemberRemoved, 3);
        let (_, c) = coalesce(&mut silent, push(1, EventType::Message, 4));
        assert_eq!((silent.priority, c.upgraded), (Priority::High, false), "an alert replacing a silent push");
        let mut silent = push(1, EventType::MemberRemoved, 3);
        let (_, c) = coalesce(&mut silent, push(1, EventType::MemberAdded, 4));
        assert_eq!((silent.priority, c.upgraded), (Priority::Normal, false));
    }

    #[test]
    fn a_retry_only_raises_a_silent_pending_push() {
        let mut pending = push(1, EventType::MemberAdded, 5);
        assert!(retry_meets_pending(Priority::High, &mut pending));
        assert_eq!((pending.priority, pending.notification.seq), (Priority::High, 5), "payload kept");
        let mut pending = push(1, EventType::Message, 5);
        assert!(!retry_meets_pending(Priority::Normal, &mut pending));
        assert_eq!(pending.priority, Priority::High);
        let mut pending = push(1, EventType::MemberAdded, 5);
        assert!(!retry_meets_pending(Priority::Normal, &mut pending));
    }

    #[test]
    fn delivery_ids_are_32_lowercase_hex() {
        let id = new_delivery_id();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(id, new_delivery_id());
    }
}
