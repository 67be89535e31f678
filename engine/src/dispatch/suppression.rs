//! PUSH-230 for one page of deliveries: which of the page's keys make the
//! envelope the recipient's own.
//!
//! The HMAC input (`data`, up to `engine.ingest.max_data_bytes`)
//! stays out of windows, pages and deliveries. It cannot be hashed once at
//! ingest: the key is each subscription's (an inbox's key for the epoch), and
//! subscriptions change between ingest and dispatch. So a page that has keys
//! reads the data from the store once, hashes it once per distinct key (an
//! inbox's installations share one), and drops it. Hashing a large input
//! runs on a blocking thread, never on the shard actor's: a page of a
//! thousand inboxes over a 1 MiB payload is a gigabyte of SHA-256.

use std::collections::HashSet;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::domain::{HmacKey, SenderHmac, StoredEnvelope};
use crate::store::{Store, StoreError};

/// Above this many bytes to hash (data length × distinct keys), the page's
/// HMACs are computed on a blocking thread (about 100 µs of SHA-256 below it).
pub const INLINE_HASH_BYTES: usize = 64 * 1024;

/// The keys of `keys` under which `envelope` is the sender's own. Fails open
/// (an empty set: deliver) when the store kept no data for it.
pub async fn own_keys(
    store: &dyn Store,
    envelope: &StoredEnvelope,
    keys: HashSet<HmacKey>,
) -> Result<HashSet<HmacKey>, StoreError> {
    if keys.is_empty() {
        return Ok(HashSet::new());
    }
    let Some(sender_hmac) = envelope.sender_hmac else {
        return Ok(HashSet::new());
    };
    let Some(data) = store.envelope_data(envelope.shard, envelope.sequence_id).await? else {
        return Ok(HashSet::new());
    };
    if hashes_inline(data.len(), keys.len()) {
        return Ok(matching(&data, &sender_hmac, keys));
    }
    match tokio::task::spawn_blocking(move || matching(&data, &sender_hmac, keys)).await {
        Ok(own) => Ok(own),
        Err(e) => {
            // Only a runtime shutting down cancels it; PUSH-230 fails open.
            tracing::warn!(error = %e, "suppression hashing did not finish; delivering");
            Ok(HashSet::new())
        }
    }
}

/// Whether hashing `data_len` bytes under `keys` keys is cheap enough for
/// the shard actor's own thread.
pub fn hashes_inline(data_len: usize, keys: usize) -> bool {
    data_len.saturating_mul(keys) <= INLINE_HASH_BYTES
}

fn matching(data: &[u8], sender_hmac: &SenderHmac, keys: HashSet<HmacKey>) -> HashSet<HmacKey> {
    keys.into_iter().filter(|key| is_senders_own(data, sender_hmac, key)).collect()
}

/// HMAC-SHA256 of `data` under `key` equals `sender_hmac`, compared in
/// constant time (`verify_slice`).
pub fn is_senders_own(data: &[u8], sender_hmac: &SenderHmac, key: &HmacKey) -> bool {
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0) else {
        return false;
    };
    mac.update(data);
    mac.verify_slice(sender_hmac.as_bytes()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EnvelopeKind, NewEnvelope, ShardId, Topic};
    use crate::store::{Appended, RedbStore};

    fn hmac(key: &HmacKey, data: &[u8]) -> Vec<u8> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0).unwrap();
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    }

    /// A store holding one envelope with `data`, signed under `sender`.
    async fn stored(data: Vec<u8>, sender: &HmacKey) -> (RedbStore, StoredEnvelope, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), 1).unwrap();
        let topic = Topic::parse(&[0, 9]).unwrap();
        let mac = hmac(sender, &data);
        let new =
            NewEnvelope::new(topic, 1, EnvelopeKind::Application, true, SenderHmac::parse(&mac), data, None).unwrap();
        assert_eq!(store.append(&[new], 1).await.unwrap(), vec![Appended::Stored { sequence_id: 1 }]);
        let envelope = store.read_window(ShardId::FIRST, 0, 1, 1).await.unwrap().remove(0);
        (store, envelope, dir)
    }

    #[test]
    fn small_inputs_hash_inline_large_ones_off_the_actor() {
        assert!(hashes_inline(1024, 3));
        assert!(hashes_inline(INLINE_HASH_BYTES, 1));
        assert!(!hashes_inline(INLINE_HASH_BYTES + 1, 1));
        assert!(!hashes_inline(1 << 20, 1), "a 1 MiB payload never hashes on the actor thread");
        assert!(!hashes_inline(1024, 1000), "nor do a thousand keys over 1 KiB");
        assert!(!hashes_inline(usize::MAX, 2));
    }

    #[tokio::test]
    async fn only_the_senders_key_matches_inline_and_off_thread() {
        let (sender, other) = (HmacKey([1; 42]), HmacKey([2; 42]));
        for size in [16, INLINE_HASH_BYTES * 2] {
            let (store, envelope, _dir) = stored(vec![7; size], &sender).await;
            assert!(envelope.sender_hmac.is_some(), "the window carries the hmac");
            let keys = HashSet::from([sender.clone(), other.clone()]);
            let own = own_keys(&store, &envelope, keys).await.unwrap();
            assert_eq!(own, HashSet::from([sender.clone()]), "data of {size} bytes");
        }
    }

    #[tokio::test]
    async fn no_keys_reads_nothing_and_missing_data_fails_open() {
        let sender = HmacKey([1; 42]);
        let (store, envelope, _dir) = stored(b"ciphertext".to_vec(), &sender).await;
        assert!(own_keys(&store, &envelope, HashSet::new()).await.unwrap().is_empty());
        // Pruned below the checkpoint (or never kept): nothing is suppressed.
        store.advance_checkpoint(ShardId::FIRST, 1).await.unwrap();
        assert_eq!(store.envelope_data(ShardId::FIRST, 1).await.unwrap(), None);
        assert!(own_keys(&store, &envelope, HashSet::from([sender])).await.unwrap().is_empty());
    }
}
