//! Decoded recipients, each kept with the stored bytes it was decoded from.
//!
//! Dispatch reads a recipient again for every envelope of every topic it
//! subscribes to. Decoding the record (its strings, keys and parsed webhook
//! URL) and dropping it after the page was, with 10 subscribers per
//! envelope, about a tenth of the engine's CPU per delivery
//! (docs/BENCHMARKS-HISTORY.md, finding 7). A hit needs the stored bytes to be
//! exactly the ones the entry was decoded from, so an entry can never be
//! stale: any write to the record (Register, UpdateSubscriptions, a renewal)
//! changes its bytes, and the next read decodes it again. Nothing has to
//! invalidate entries, and an entry that was deleted is simply not asked for.
//!
//! Both backends use it: redb keys an entry by the record's encoded bytes,
//! ScyllaDB by a subscriber copy's own recipient columns or, for a row it
//! joins, by the recipient partition's `version`, a random value every
//! write of the partition replaces (its module doc, "Atomicity").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::domain::{Recipient, RecipientId};
use crate::store::StoreError;

/// Recipients kept at most: tens of MiB of decoded records.
pub const CAPACITY: usize = 65_536;

/// Independent locked parts, so that readers on different threads rarely
/// wait for each other.
const PARTS: usize = 16;

pub struct RecipientCache {
    parts: Box<[Mutex<HashMap<RecipientId, Entry>>]>,
    per_part: usize,
}

struct Entry {
    encoded: Box<[u8]>,
    recipient: Arc<Recipient>,
}

impl RecipientCache {
    /// A cache of at most about `capacity` recipients; 0 keeps none.
    pub fn new(capacity: usize) -> Self {
        let parts = (0..PARTS).map(|_| Mutex::new(HashMap::new())).collect();
        Self { parts, per_part: capacity.div_ceil(PARTS) }
    }

    /// The recipient `id` stored as `encoded`: the kept one if it was decoded
    /// from these very bytes, else `decode(encoded)`, kept for next time.
    pub fn get_or_decode(
        &self,
        id: &RecipientId,
        encoded: &[u8],
        decode: impl FnOnce(&[u8]) -> Result<Recipient, StoreError>,
    ) -> Result<Arc<Recipient>, StoreError> {
        if self.per_part == 0 {
            return decode(encoded).map(Arc::new);
        }
        let part = &self.parts[id.partition(PARTS)];
        if let Some(entry) = lock(part).get(id)
            && *entry.encoded == *encoded
        {
            return Ok(entry.recipient.clone());
        }
        // Decoded outside the lock; a concurrent reader may decode the same
        // bytes too, and either copy is right.
        let recipient = Arc::new(decode(encoded)?);
        let mut map = lock(part);
        if map.len() >= self.per_part && !map.contains_key(id) {
            // Full: start this part over. Simpler than an LRU and, for the
            // recipients that keep coming back, as good: they are decoded
            // once more.
            map.clear();
        }
        map.insert(*id, Entry { encoded: encoded.into(), recipient: recipient.clone() });
        Ok(recipient)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.parts.iter().map(|p| lock(p).len()).sum()
    }
}

/// A panic while a part was locked left it consistent (every change is one
/// `HashMap` call), so a poisoned lock is used as it is.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::DeliveryTarget;
    use crate::testing;

    fn recipient(byte: u8, token: &str) -> Recipient {
        let mut r = testing::recipient(DeliveryTarget::Apns { token: token.into() });
        r.id = RecipientId::from_bytes([byte; 32]);
        r
    }

    #[test]
    fn the_same_bytes_decode_once_and_changed_bytes_again() {
        let cache = RecipientCache::new(CAPACITY);
        let id = RecipientId::from_bytes([1; 32]);
        let mut decodes = 0;
        let mut get = |encoded: &[u8], token: &str| {
            cache
                .get_or_decode(&id, encoded, |_| {
                    decodes += 1;
                    Ok(recipient(1, token))
                })
                .unwrap()
        };
        let a = get(b"v1", "a");
        let again = get(b"v1", "ignored: not decoded");
        assert!(Arc::ptr_eq(&a, &again), "a hit is the kept recipient");
        let changed = get(b"v2", "b");
        assert_eq!(changed.target, DeliveryTarget::Apns { token: "b".into() }, "new bytes are decoded");
        assert_eq!(get(b"v2", "ignored").target, changed.target);
        assert_eq!(decodes, 2);
    }

    #[test]
    fn a_decoding_error_is_returned_and_not_kept() {
        let cache = RecipientCache::new(CAPACITY);
        let id = RecipientId::from_bytes([2; 32]);
        let failed = cache.get_or_decode(&id, b"bad", |_| Err(StoreError::Backend("corrupt recipient record".into())));
        assert!(failed.is_err());
        assert_eq!(cache.len(), 0);
        let decoded = cache.get_or_decode(&id, b"bad", |_| Ok(recipient(2, "t"))).unwrap();
        assert_eq!(decoded.id, id);
    }

    #[test]
    fn it_holds_at_most_its_capacity() {
        let cache = RecipientCache::new(64);
        for i in 0..=255u8 {
            let id = RecipientId::from_bytes([i; 32]);
            cache.get_or_decode(&id, &[i], |_| Ok(recipient(i, "t"))).unwrap();
            assert!(cache.len() <= 64, "{} kept", cache.len());
        }
        let off = RecipientCache::new(0);
        let id = RecipientId::from_bytes([9; 32]);
        let a = off.get_or_decode(&id, b"x", |_| Ok(recipient(9, "t"))).unwrap();
        let b = off.get_or_decode(&id, b"x", |_| Ok(recipient(9, "t"))).unwrap();
        assert!(!Arc::ptr_eq(&a, &b), "a cache of 0 keeps nothing");
        assert_eq!(off.len(), 0);
    }
}
