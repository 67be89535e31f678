//! Per-shard sequence ids: what a publisher may ask for, and what is allocated.
//!
//! A publisher-supplied id must not make a shard unusable. Ids are
//! kept at or below `MAX_SEQUENCE_ID` (so they also fit CQL's signed bigint),
//! and a publisher id may jump at most `MAX_SEQUENCE_GAP` above the shard's
//! last id, so that no publisher can push a shard near the end of its ids.
//! A refused id fails only its own envelope.

/// The largest sequence id of any shard: 2^63 − 1.
pub const MAX_SEQUENCE_ID: u64 = i64::MAX as u64;
/// The most a publisher-supplied id may exceed its shard's last id: 2^32.
pub const MAX_SEQUENCE_GAP: u64 = 1 << 32;

/// Why an envelope got no sequence id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceRefusal {
    /// A publisher id that is not above the shard's last id.
    NotIncreasing { last: u64 },
    /// A publisher id more than `MAX_SEQUENCE_GAP` above the shard's last id,
    /// or above `MAX_SEQUENCE_ID`.
    TooFarAhead { last: u64 },
    /// The shard has used every id up to `MAX_SEQUENCE_ID`.
    Exhausted,
}

/// The id of the next envelope of a shard whose last id is `last`: the
/// publisher's `requested` id, or `last + 1`.
pub fn next_sequence_id(last: u64, requested: Option<u64>) -> Result<u64, SequenceRefusal> {
    match requested {
        Some(id) if id <= last => Err(SequenceRefusal::NotIncreasing { last }),
        Some(id) if id - last > MAX_SEQUENCE_GAP || id > MAX_SEQUENCE_ID => Err(SequenceRefusal::TooFarAhead { last }),
        Some(id) => Ok(id),
        None if last >= MAX_SEQUENCE_ID => Err(SequenceRefusal::Exhausted),
        None => Ok(last + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publisher_ids_increase_within_the_gap_and_the_bound() {
        assert_eq!(next_sequence_id(0, None), Ok(1));
        assert_eq!(next_sequence_id(5, Some(6)), Ok(6));
        assert_eq!(next_sequence_id(5, Some(5)), Err(SequenceRefusal::NotIncreasing { last: 5 }));
        assert_eq!(next_sequence_id(5, Some(1)), Err(SequenceRefusal::NotIncreasing { last: 5 }));
        assert_eq!(next_sequence_id(5, Some(5 + MAX_SEQUENCE_GAP)), Ok(5 + MAX_SEQUENCE_GAP));
        assert_eq!(next_sequence_id(5, Some(6 + MAX_SEQUENCE_GAP)), Err(SequenceRefusal::TooFarAhead { last: 5 }));
        assert_eq!(next_sequence_id(0, Some(u64::MAX)), Err(SequenceRefusal::TooFarAhead { last: 0 }));
        let near = MAX_SEQUENCE_ID - 3;
        assert_eq!(next_sequence_id(near, Some(MAX_SEQUENCE_ID)), Ok(MAX_SEQUENCE_ID));
        assert_eq!(next_sequence_id(near, Some(MAX_SEQUENCE_ID + 1)), Err(SequenceRefusal::TooFarAhead { last: near }));
        assert_eq!(next_sequence_id(MAX_SEQUENCE_ID, None), Err(SequenceRefusal::Exhausted));
    }
}
