//! §5.2 `rate_limited` (device, caller-retryable with `retry_after_ms`):
//! the per-device bound on accepted wake-ups that are stored and not yet
//! finished (reading 26, docs/GATEWAY.md).
//!
//! `accepted` is a durable takeover: every accepted wake-up is stored until
//! the provider took it, the token is found dead, or it is given up. When a
//! device's provider keeps failing, each notify for it would store one more
//! (the §4.5 threshold shapes a window, not a backlog that outlives many
//! windows). So per device the gateway keeps a small ledger of its
//! unfinished wake-ups; at `max_pending_wakeups_per_device` the device's
//! outcome is `rejected` / `rate_limited` and nothing is stored for it: the
//! queue stays bounded per device, and the caller, who still owns the
//! attempt, is told when to try again.
//!
//! The ledger is window state (compare-and-set, with an expiry), under a
//! hashed key: notify adds the wake-up it stores, the delivery worker moves
//! an entry's next attempt when it reschedules and removes it when the
//! wake-up is deleted. Wake-up ids are deterministic per request and device
//! (or per batch), so a request decided again after a lost claim adds the
//! same entry, not a second one. An entry whose wake-up expired is pruned.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::{AccountId, DeviceId};
use crate::transport::ATTEMPT_TIMEOUT;

/// The longest `retry_after_ms` a `rate_limited` outcome names: the
/// delivery worker's longest back-off.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The shortest: a caller retrying sooner would meet the same ledger.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One unfinished wake-up of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    /// The stored wake-up's id.
    id: String,
    /// When the worker tries it next (Unix ms).
    next_ms: i64,
    /// When it is given up at the latest (Unix ms): the entry goes then.
    expires_ms: i64,
}

/// The ledger of one device's unfinished wake-ups.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingWakeups {
    entries: Vec<Entry>,
}

/// Whether one more wake-up of a device may be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admit,
    /// The bound is reached: `rate_limited` with this `retry_after_ms`.
    Full {
        retry_after: Duration,
    },
}

impl PendingWakeups {
    /// §5.2 `rate_limited` as a pure decision: a wake-up already in the
    /// ledger (`id`: this request decided again) is always admitted; else
    /// one more is admitted below `bound` live entries. When full, the
    /// caller may try again once the device's next attempt has had its
    /// attempt bound to finish (the earliest moment an entry can leave),
    /// at least `MIN_RETRY_AFTER`, at most `MAX_RETRY_AFTER`.
    pub fn admit(&self, id: &str, bound: usize, now_ms: i64) -> Admission {
        let live: Vec<&Entry> = self.entries.iter().filter(|e| e.expires_ms > now_ms).collect();
        if live.len() < bound || live.iter().any(|e| e.id == id) {
            return Admission::Admit;
        }
        let next = live.iter().map(|e| e.next_ms).min().unwrap_or(now_ms);
        let wait_ms = (next - now_ms).max(0) as u64 + ATTEMPT_TIMEOUT.as_millis() as u64;
        let retry_after = Duration::from_millis(wait_ms).clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER);
        Admission::Full { retry_after }
    }

    /// Records a stored wake-up (once per id: the latest times stand) and
    /// drops expired entries.
    pub fn add(&mut self, id: &str, next_ms: i64, expires_ms: i64, now_ms: i64) {
        self.prune(now_ms);
        match self.entries.iter_mut().find(|e| e.id == id) {
            Some(e) => {
                e.next_ms = next_ms;
                e.expires_ms = e.expires_ms.max(expires_ms);
            }
            None => self.entries.push(Entry { id: id.to_owned(), next_ms, expires_ms }),
        }
    }

    /// The worker rescheduled a wake-up. Returns whether it was listed.
    pub fn reschedule(&mut self, id: &str, next_ms: i64, now_ms: i64) -> bool {
        self.prune(now_ms);
        self.entries.iter_mut().find(|e| e.id == id).map(|e| e.next_ms = next_ms).is_some()
    }

    /// The worker deleted a wake-up. Returns whether it was listed.
    pub fn remove(&mut self, id: &str, now_ms: i64) -> bool {
        self.prune(now_ms);
        let before = self.entries.len();
        self.entries.retain(|e| e.id != id);
        self.entries.len() != before
    }

    /// Live entries at `now_ms`.
    pub fn len(&self, now_ms: i64) -> usize {
        self.entries.iter().filter(|e| e.expires_ms > now_ms).count()
    }

    pub fn is_empty(&self, now_ms: i64) -> bool {
        self.len(now_ms) == 0
    }

    /// How long the stored ledger must be kept: until its last entry
    /// expires (at least until `now_ms`).
    pub fn keep_until(&self, now_ms: i64) -> i64 {
        self.entries.iter().map(|e| e.expires_ms).max().unwrap_or(now_ms).max(now_ms + 1)
    }

    fn prune(&mut self, now_ms: i64) {
        self.entries.retain(|e| e.expires_ms > now_ms);
    }
}

/// The state key of a device's ledger: `p` and a hash of (account, device),
/// so that no stored key spells either (the tenant is the store's
/// partition). Per device, not per route: a device has one current route,
/// and a wake-up only knows its device.
pub fn ledger_key(account_id: &AccountId, device_id: &DeviceId) -> Vec<u8> {
    let mut h = Sha256::new();
    for part in [account_id.as_str(), device_id.as_str()] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part.as_bytes());
    }
    [b"p".as_slice(), &h.finalize()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_555_296_000;
    const DAY: i64 = 86_400_000;

    fn ledger(ids: &[(&str, i64)]) -> PendingWakeups {
        let mut l = PendingWakeups::default();
        for (id, next) in ids {
            l.add(id, *next, NOW + DAY, NOW);
        }
        l
    }

    #[test]
    fn below_the_bound_a_wakeup_is_admitted_at_it_the_device_is_rate_limited() {
        let l = ledger(&[("a", NOW), ("b", NOW)]);
        assert_eq!(l.admit("c", 3, NOW), Admission::Admit);
        assert!(matches!(l.admit("c", 2, NOW), Admission::Full { .. }));
        // This request decided again (its claim was taken over): its own
        // wake-up is already counted.
        assert_eq!(l.admit("b", 2, NOW), Admission::Admit);
    }

    #[test]
    fn retry_after_is_the_next_attempt_plus_its_bound_within_limits() {
        // The earliest next attempt is in 20 s: retry after it had its 10 s.
        let l = ledger(&[("a", NOW + 60_000), ("b", NOW + 20_000)]);
        assert_eq!(l.admit("c", 2, NOW), Admission::Full { retry_after: Duration::from_secs(30) });
        // Due now (in flight or waiting for a slot): one attempt bound.
        let l = ledger(&[("a", NOW - 5_000), ("b", NOW + 20_000)]);
        assert_eq!(l.admit("c", 2, NOW), Admission::Full { retry_after: ATTEMPT_TIMEOUT });
        // A batch held for a long bucket: capped.
        let l = ledger(&[("a", NOW + DAY / 2)]);
        assert_eq!(l.admit("c", 1, NOW), Admission::Full { retry_after: MAX_RETRY_AFTER });
    }

    #[test]
    fn finished_or_expired_wakeups_free_their_place() {
        let mut l = ledger(&[("a", NOW), ("b", NOW)]);
        assert!(matches!(l.admit("c", 2, NOW), Admission::Full { .. }));
        assert!(l.remove("a", NOW));
        assert!(!l.remove("a", NOW), "removed once");
        assert_eq!(l.admit("c", 2, NOW), Admission::Admit);
        assert_eq!(l.len(NOW), 1);
        // Expired entries no longer count, and go at the next change.
        assert!(l.is_empty(NOW + DAY));
        assert_eq!(l.admit("c", 1, NOW + DAY), Admission::Admit);
        l.add("c", NOW + DAY, NOW + 2 * DAY, NOW + DAY);
        assert_eq!(l.entries.len(), 1);
    }

    #[test]
    fn an_id_is_listed_once_and_rescheduling_moves_its_next_attempt() {
        let mut l = ledger(&[("a", NOW)]);
        l.add("a", NOW + 1_000, NOW + DAY, NOW);
        assert_eq!(l.len(NOW), 1);
        assert!(l.reschedule("a", NOW + 40_000, NOW));
        assert!(!l.reschedule("unknown", NOW, NOW));
        assert_eq!(l.admit("b", 1, NOW), Admission::Full { retry_after: Duration::from_secs(50) });
        assert_eq!(l.keep_until(NOW), NOW + DAY);
        assert_eq!(PendingWakeups::default().keep_until(NOW), NOW + 1);
    }

    #[test]
    fn ledger_keys_hash_the_device_and_tell_devices_apart() {
        let account = |a: &str| AccountId::parse(a).unwrap();
        let device = |n: u8| DeviceId::parse(&format!("ak:device:01964137-0000-7000-8000-0000000000{n:02x}")).unwrap();
        let k = ledger_key(&account("ak:account:a"), &device(1));
        assert_eq!(k.len(), 33);
        assert_eq!(k[0], b'p');
        assert!(!k.windows(11).any(|w| w == b"ak:account:"));
        assert_ne!(k, ledger_key(&account("ak:account:a"), &device(2)));
        assert_ne!(k, ledger_key(&account("ak:account:b"), &device(1)));
    }
}
