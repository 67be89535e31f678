//! Time-keyed indexes of the embedded store: expiry indexes and wakeups
//! due, keyed by a time then the record's key.

use redb::ReadableTable;

use super::codec::OrBackend;
use crate::store::StoreError;

/// Expired records deleted per retention transaction, so one pass never
/// holds a huge write transaction.
pub(super) const PRUNE_BATCH: usize = 10_000;

pub(super) type BytesTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// A time in an index key: milliseconds as u64 big-endian, so that keys
/// sort by time.
pub(super) fn at(ms: i64) -> [u8; 8] {
    (ms.max(0) as u64).to_be_bytes()
}

/// The keys of a time index (a time as `at`, then the record's key) due
/// at `now_ms`, oldest first, at most `limit`: expiry indexes, wakeups due.
pub(super) fn due_keys(index: &BytesTable<'_>, now_ms: i64, limit: usize) -> Result<Vec<Vec<u8>>, StoreError> {
    let now = at(now_ms);
    let mut due = Vec::new();
    for row in index.range::<&[u8]>(..).be()?.take(limit) {
        let (k, _) = row.be()?;
        // `time <= now`: the first 8 bytes at or below now's.
        if k.value()[..8] > now[..] {
            break;
        }
        due.push(k.value().to_vec());
    }
    Ok(due)
}
