//! What a shard's running window has answered above its checkpoint, kept so
//! that the shard's next owner (after a handover, a kill or a pause past the
//! lease) skips it instead of sending it again.
//!
//! The checkpoint alone says "every first attempt at or below this id was
//! made" (PUSH-257); it can only move to just below the oldest envelope still
//! open, so on its own a handover repeats every answered delivery above that.
//! A mark adds what the checkpoint cannot say: an envelope above it had every
//! first attempt (`Whole`), or every one to a subscriber at or below a
//! recipient id (`After`, subscribers are paged in recipient id order).
//!
//! Every mark is a fact about first attempts already made, whoever wrote it:
//! a late write by a former owner can lose marks (more repeats), never make
//! one wrong. Marks name envelopes at or below a boundary the writer read,
//! and ids at or below a boundary are never given to another envelope.

use super::{ParseError, RecipientId};

/// Entries kept per shard, at most: what is left out is sent again, never lost.
pub const MAX_ENTRIES: usize = 1024;

/// How far one envelope above the checkpoint was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// Every first attempt of the envelope was made.
    Whole,
    /// Every first attempt to a subscriber at or below this recipient id.
    After(RecipientId),
}

/// A shard's marks, ascending by sequence id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardProgress {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// Every envelope with an id in `first..=last`: the ids in between that
    /// the window did not hold are envelopes not pushed, with none to make.
    Whole {
        first: u64,
        last: u64,
    },
    After {
        sequence_id: u64,
        recipient: RecipientId,
    },
}

impl Entry {
    fn first(&self) -> u64 {
        match *self {
            Self::Whole { first, .. } => first,
            Self::After { sequence_id, .. } => sequence_id,
        }
    }

    fn last(&self) -> u64 {
        match *self {
            Self::Whole { last, .. } => last,
            Self::After { sequence_id, .. } => sequence_id,
        }
    }
}

const WHOLE_RUN: u8 = 0;
const AFTER: u8 = 1;
const VERSION: u8 = 1;

impl ShardProgress {
    /// From every envelope of a window in ascending order, each with what
    /// was answered of it (`None`: nothing to claim). `Whole` envelopes next
    /// to each other become one run; beyond `MAX_ENTRIES` the highest are
    /// left out.
    pub fn of_window(envelopes: impl IntoIterator<Item = (u64, Option<Answered>)>) -> Self {
        let mut entries = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        for (sequence_id, answered) in envelopes {
            match answered {
                Some(Answered::Whole) => {
                    run = Some(run.map_or((sequence_id, sequence_id), |(first, _)| (first, sequence_id)));
                    continue;
                }
                Some(Answered::After(recipient)) => {
                    entries.extend(run.take().map(|(first, last)| Entry::Whole { first, last }));
                    entries.push(Entry::After { sequence_id, recipient });
                }
                None => entries.extend(run.take().map(|(first, last)| Entry::Whole { first, last })),
            }
        }
        entries.extend(run.map(|(first, last)| Entry::Whole { first, last }));
        entries.truncate(MAX_ENTRIES);
        Self { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What was answered of envelope `sequence_id`, if anything is known.
    pub fn of(&self, sequence_id: u64) -> Option<Answered> {
        let at = self.entries.partition_point(|e| e.last() < sequence_id);
        match *self.entries.get(at)? {
            Entry::Whole { first, .. } if first <= sequence_id => Some(Answered::Whole),
            Entry::After { sequence_id: s, recipient } if s == sequence_id => Some(Answered::After(recipient)),
            _ => None,
        }
    }

    /// The stored form, the same on every backend: a version byte, then
    /// entries `0, first, last` or `1, sequence id, recipient id`, integers
    /// big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.entries.len() * 41);
        out.push(VERSION);
        for entry in &self.entries {
            match *entry {
                Entry::Whole { first, last } => {
                    out.push(WHOLE_RUN);
                    out.extend_from_slice(&first.to_be_bytes());
                    out.extend_from_slice(&last.to_be_bytes());
                }
                Entry::After { sequence_id, recipient } => {
                    out.push(AFTER);
                    out.extend_from_slice(&sequence_id.to_be_bytes());
                    out.extend_from_slice(recipient.as_bytes());
                }
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ParseError> {
        const CORRUPT: ParseError = ParseError("shard progress is corrupt");
        let (&version, mut rest) = bytes.split_first().ok_or(CORRUPT)?;
        if version != VERSION {
            return Err(CORRUPT);
        }
        let be = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        let mut entries = Vec::new();
        while let Some((&tag, tail)) = rest.split_first() {
            let (entry, size) = match tag {
                WHOLE_RUN if tail.len() >= 16 => {
                    let (first, last) = (be(&tail[..8]), be(&tail[8..16]));
                    if first > last {
                        return Err(CORRUPT);
                    }
                    (Entry::Whole { first, last }, 16)
                }
                AFTER if tail.len() >= 40 => {
                    let recipient = RecipientId::parse(&tail[8..40]).map_err(|_| CORRUPT)?;
                    (Entry::After { sequence_id: be(&tail[..8]), recipient }, 40)
                }
                _ => return Err(CORRUPT),
            };
            // Ascending, as written: `of` searches them.
            if entries.last().is_some_and(|e: &Entry| e.last() >= entry.first()) {
                return Err(CORRUPT);
            }
            entries.push(entry);
            rest = &tail[size..];
        }
        if entries.len() > MAX_ENTRIES {
            return Err(CORRUPT);
        }
        Ok(Self { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> RecipientId {
        RecipientId::from_bytes([b; 32])
    }

    #[test]
    fn whole_envelopes_next_to_each_other_are_one_run_and_an_open_one_breaks_it() {
        let p = ShardProgress::of_window([
            (3, Some(Answered::Whole)),
            (5, Some(Answered::Whole)),
            (6, None),
            (8, Some(Answered::Whole)),
            (9, Some(Answered::After(id(7)))),
            (12, Some(Answered::Whole)),
        ]);
        assert_eq!(p.entries.len(), 4, "3..=5, 8, 9 after, 12");
        assert_eq!(p.of(4), Some(Answered::Whole), "an id inside a run: not pushed, nothing to make");
        assert_eq!(p.of(6), None, "open: no claim");
        assert_eq!(p.of(7), None);
        assert_eq!(p.of(9), Some(Answered::After(id(7))));
        assert_eq!((p.of(12), p.of(13), p.of(2)), (Some(Answered::Whole), None, None));
        assert_eq!(ShardProgress::decode(&p.encode()), Ok(p));
        assert_eq!(ShardProgress::decode(&ShardProgress::default().encode()), Ok(ShardProgress::default()));
    }

    #[test]
    fn past_the_bound_the_highest_are_left_out() {
        let p = ShardProgress::of_window((0..2 * MAX_ENTRIES as u64).map(|s| (s, Some(Answered::After(id(1))))));
        assert_eq!(p.entries.len(), MAX_ENTRIES);
        assert!(p.of(0).is_some() && p.of(MAX_ENTRIES as u64).is_none());
    }

    #[test]
    fn a_damaged_form_is_refused() {
        let good = ShardProgress::of_window([(1, Some(Answered::Whole)), (2, Some(Answered::After(id(2))))]).encode();
        assert!(ShardProgress::decode(&[]).is_err());
        assert!(ShardProgress::decode(&[9]).is_err(), "unknown version");
        assert!(ShardProgress::decode(&good[..good.len() - 1]).is_err(), "cut short");
        let mut backwards = vec![VERSION, WHOLE_RUN];
        backwards.extend_from_slice(&5u64.to_be_bytes());
        backwards.extend_from_slice(&4u64.to_be_bytes());
        assert!(ShardProgress::decode(&backwards).is_err(), "a run that ends before it starts");
        let mut swapped = vec![VERSION];
        swapped.extend_from_slice(&good[18..]);
        swapped.extend_from_slice(&good[1..18]);
        assert!(ShardProgress::decode(&swapped).is_err(), "out of order");
    }
}
