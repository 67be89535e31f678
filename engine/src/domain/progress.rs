//! What a shard's running window has answered above its checkpoint, kept so
//! that the shard's next owner (after a handover, a kill or a pause past the
//! lease) skips it instead of sending it again.
//!
//! The checkpoint alone says "every first attempt at or below this id was
//! made" (PUSH-257); it can only move to just below the oldest envelope still
//! open, so on its own a handover repeats every answered delivery above that.
//! A mark adds what the checkpoint cannot say: an envelope above it had every
//! first attempt (`Whole`), or some of them (`Partly`): every one to a
//! subscriber at or below a recipient id (subscribers are paged in recipient
//! id order), and each one to the subscribers listed above it (the answered
//! deliveries of pages still in flight: workers answer a page out of order).
//!
//! Every mark is a fact about first attempts already made, whoever wrote it:
//! a late write by a former owner can lose marks (more repeats), never make
//! one wrong, and so can leaving any part of a mark out. Marks name
//! envelopes at or below a boundary the writer read, and ids at or below a
//! boundary are never given to another envelope.

use super::{ParseError, RecipientId};

/// Entries kept per shard, at most: what is left out is sent again, never lost.
pub const MAX_ENTRIES: usize = 1024;

/// Subscribers listed beyond the runs (`Partly::also`) per shard, at most:
/// 32 bytes each in the record written every progress interval.
pub const MAX_LISTED: usize = 1024;

/// How far one envelope above the checkpoint was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Every first attempt of the envelope was made.
    Whole,
    Partly(Partly),
}

/// Some first attempts of an envelope were made: to every subscriber at or
/// below `upto` (`None`: no such run), and to each one of `also`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partly {
    pub upto: Option<RecipientId>,
    /// Ascending, every one above `upto`.
    pub also: Vec<RecipientId>,
}

impl Partly {
    /// From a run and any answered subscribers (in any order, those at or
    /// below the run dropped); `None` when that names no one.
    pub fn new(upto: Option<RecipientId>, also: impl IntoIterator<Item = RecipientId>) -> Option<Self> {
        let mut also: Vec<RecipientId> = also.into_iter().filter(|r| upto.is_none_or(|u| *r > u)).collect();
        also.sort_unstable();
        also.dedup();
        (upto.is_some() || !also.is_empty()).then_some(Self { upto, also })
    }

    /// Every first attempt to a subscriber at or below `upto`.
    pub fn upto(upto: RecipientId) -> Self {
        Self { upto: Some(upto), also: Vec::new() }
    }

    /// Whether the first attempt to `recipient` is one this names.
    pub fn names(&self, recipient: RecipientId) -> bool {
        self.upto.is_some_and(|u| recipient <= u) || self.also.binary_search(&recipient).is_ok()
    }
}

/// A shard's marks, ascending by sequence id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardProgress {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Every envelope with an id in `first..=last`: the ids in between that
    /// the window did not hold are envelopes not pushed, with none to make.
    Whole {
        first: u64,
        last: u64,
    },
    Partly {
        sequence_id: u64,
        partly: Partly,
    },
}

impl Entry {
    fn first(&self) -> u64 {
        match *self {
            Self::Whole { first, .. } => first,
            Self::Partly { sequence_id, .. } => sequence_id,
        }
    }

    fn last(&self) -> u64 {
        match *self {
            Self::Whole { last, .. } => last,
            Self::Partly { sequence_id, .. } => sequence_id,
        }
    }
}

const WHOLE_RUN: u8 = 0;
/// A run alone: `sequence id, upto`.
const AFTER: u8 = 1;
/// `sequence id, 0 | 1 and upto, count (u16), count subscribers`.
const PARTLY: u8 = 2;
const VERSION: u8 = 1;

impl ShardProgress {
    /// From every envelope of a window in ascending order, each with what
    /// was answered of it (`None`: nothing to claim). `Whole` envelopes next
    /// to each other become one run; beyond `MAX_ENTRIES` the highest are
    /// left out, beyond `MAX_LISTED` listed subscribers the highest lists.
    pub fn of_window(envelopes: impl IntoIterator<Item = (u64, Option<Answered>)>) -> Self {
        let mut entries = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        let mut listed = 0;
        for (sequence_id, answered) in envelopes {
            match answered {
                Some(Answered::Whole) => {
                    run = Some(run.map_or((sequence_id, sequence_id), |(first, _)| (first, sequence_id)));
                    continue;
                }
                Some(Answered::Partly(mut partly)) => {
                    entries.extend(run.take().map(|(first, last)| Entry::Whole { first, last }));
                    partly.also.truncate(MAX_LISTED - listed);
                    listed += partly.also.len();
                    if partly.upto.is_some() || !partly.also.is_empty() {
                        entries.push(Entry::Partly { sequence_id, partly });
                    }
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
        match self.entries.get(at)? {
            Entry::Whole { first, .. } if *first <= sequence_id => Some(Answered::Whole),
            Entry::Partly { sequence_id: s, partly } if *s == sequence_id => Some(Answered::Partly(partly.clone())),
            _ => None,
        }
    }

    /// The stored form, the same on every backend: a version byte, then
    /// entries `0, first, last`, `1, sequence id, recipient id` or `2,
    /// sequence id, 0 | 1 recipient id, count, recipient ids`, integers
    /// big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.entries.len() * 41);
        out.push(VERSION);
        for entry in &self.entries {
            match entry {
                Entry::Whole { first, last } => {
                    out.push(WHOLE_RUN);
                    out.extend_from_slice(&first.to_be_bytes());
                    out.extend_from_slice(&last.to_be_bytes());
                }
                Entry::Partly { sequence_id, partly: Partly { upto: Some(upto), also } } if also.is_empty() => {
                    out.push(AFTER);
                    out.extend_from_slice(&sequence_id.to_be_bytes());
                    out.extend_from_slice(upto.as_bytes());
                }
                Entry::Partly { sequence_id, partly } => {
                    out.push(PARTLY);
                    out.extend_from_slice(&sequence_id.to_be_bytes());
                    match partly.upto {
                        Some(upto) => {
                            out.push(1);
                            out.extend_from_slice(upto.as_bytes());
                        }
                        None => out.push(0),
                    }
                    let count = u16::try_from(partly.also.len()).expect("at most MAX_LISTED");
                    out.extend_from_slice(&count.to_be_bytes());
                    for r in &partly.also {
                        out.extend_from_slice(r.as_bytes());
                    }
                }
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, ParseError> {
        let (&version, mut rest) = bytes.split_first().ok_or(CORRUPT)?;
        if version != VERSION {
            return Err(CORRUPT);
        }
        let mut entries = Vec::new();
        let mut listed = 0;
        while let Some((&tag, tail)) = rest.split_first() {
            let mut r = Reader(tail);
            let entry = match tag {
                WHOLE_RUN => {
                    let (first, last) = (r.u64()?, r.u64()?);
                    if first > last {
                        return Err(CORRUPT);
                    }
                    Entry::Whole { first, last }
                }
                AFTER => Entry::Partly { sequence_id: r.u64()?, partly: Partly::upto(r.recipient()?) },
                PARTLY => {
                    let sequence_id = r.u64()?;
                    let upto = match r.take(1)?[0] {
                        0 => None,
                        1 => Some(r.recipient()?),
                        _ => return Err(CORRUPT),
                    };
                    let count = usize::from(u16::from_be_bytes(r.take(2)?.try_into().expect("2 bytes")));
                    let also = (0..count).map(|_| r.recipient()).collect::<Result<Vec<_>, _>>()?;
                    listed += also.len();
                    // As written: ascending, above the run, naming someone.
                    if Partly::new(upto, also.iter().copied()).is_none_or(|p| p.also != also) {
                        return Err(CORRUPT);
                    }
                    Entry::Partly { sequence_id, partly: Partly { upto, also } }
                }
                _ => return Err(CORRUPT),
            };
            // Ascending, as written: `of` searches them.
            if entries.last().is_some_and(|e: &Entry| e.last() >= entry.first()) {
                return Err(CORRUPT);
            }
            entries.push(entry);
            rest = r.0;
        }
        if entries.len() > MAX_ENTRIES || listed > MAX_LISTED {
            return Err(CORRUPT);
        }
        Ok(Self { entries })
    }
}

const CORRUPT: ParseError = ParseError("shard progress is corrupt");

/// The stored form, read front to back.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        if self.0.len() < n {
            return Err(CORRUPT);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, ParseError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn recipient(&mut self) -> Result<RecipientId, ParseError> {
        RecipientId::parse(self.take(32)?).map_err(|_| CORRUPT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(b: u8) -> RecipientId {
        RecipientId::from_bytes([b; 32])
    }

    fn after(r: RecipientId) -> Answered {
        Answered::Partly(Partly::upto(r))
    }

    fn partly(upto: Option<u8>, also: &[u8]) -> Answered {
        Answered::Partly(Partly::new(upto.map(id), also.iter().map(|&b| id(b))).expect("names someone"))
    }

    #[test]
    fn a_partly_answered_envelope_names_its_run_and_the_answered_subscribers_above_it() {
        let p = ShardProgress::of_window([
            (2, Some(partly(None, &[9, 4, 4]))),
            (3, Some(partly(Some(5), &[3, 8, 6]))),
            (4, Partly::new(None, []).map(Answered::Partly)),
        ]);
        let Some(Answered::Partly(two)) = p.of(2) else { panic!("2 is partly answered") };
        assert_eq!(two, Partly { upto: None, also: vec![id(4), id(9)] }, "sorted, once each");
        assert!(two.names(id(4)) && two.names(id(9)) && !two.names(id(3)) && !two.names(id(5)));
        let Some(Answered::Partly(three)) = p.of(3) else { panic!("3 is partly answered") };
        assert_eq!(three.also, vec![id(6), id(8)], "3 is in the run");
        assert!(three.names(id(1)) && three.names(id(5)) && three.names(id(8)) && !three.names(id(7)));
        assert_eq!(p.of(4), None, "naming no one: no mark");
        assert_eq!(ShardProgress::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn past_the_bound_of_listed_subscribers_the_highest_lists_are_cut() {
        let many: Vec<u8> = (1..=200).collect();
        let p = ShardProgress::of_window((0..10).map(|s| (s, Some(partly(None, &many)))));
        let listed: Vec<usize> = (0..10)
            .map(|s| match p.of(s) {
                Some(Answered::Partly(p)) => p.also.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(listed.iter().sum::<usize>(), MAX_LISTED);
        assert_eq!(listed[..5], [200; 5]);
        assert_eq!(ShardProgress::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn a_damaged_list_is_refused() {
        let encoded = |upto: Option<u8>, also: &[u8]| {
            let mut out = vec![VERSION, PARTLY];
            out.extend_from_slice(&7u64.to_be_bytes());
            match upto {
                Some(b) => out.extend(std::iter::once(1).chain([b; 32])),
                None => out.push(0),
            }
            out.extend_from_slice(&(also.len() as u16).to_be_bytes());
            also.iter().for_each(|&b| out.extend_from_slice(&[b; 32]));
            out
        };
        assert!(ShardProgress::decode(&encoded(Some(2), &[3, 5])).is_ok());
        assert!(ShardProgress::decode(&encoded(None, &[5, 3])).is_err(), "not ascending");
        assert!(ShardProgress::decode(&encoded(None, &[3, 3])).is_err(), "twice");
        assert!(ShardProgress::decode(&encoded(Some(4), &[3, 5])).is_err(), "in the run");
        assert!(ShardProgress::decode(&encoded(None, &[])).is_err(), "naming no one");
        let good = encoded(None, &[3]);
        assert!(ShardProgress::decode(&good[..good.len() - 1]).is_err(), "cut short");
    }

    #[test]
    fn whole_envelopes_next_to_each_other_are_one_run_and_an_open_one_breaks_it() {
        let p = ShardProgress::of_window([
            (3, Some(Answered::Whole)),
            (5, Some(Answered::Whole)),
            (6, None),
            (8, Some(Answered::Whole)),
            (9, Some(after(id(7)))),
            (12, Some(Answered::Whole)),
        ]);
        assert_eq!(p.entries.len(), 4, "3..=5, 8, 9 after, 12");
        assert_eq!(p.of(4), Some(Answered::Whole), "an id inside a run: not pushed, nothing to make");
        assert_eq!(p.of(6), None, "open: no claim");
        assert_eq!(p.of(7), None);
        assert_eq!(p.of(9), Some(after(id(7))));
        assert_eq!((p.of(12), p.of(13), p.of(2)), (Some(Answered::Whole), None, None));
        assert_eq!(ShardProgress::decode(&p.encode()), Ok(p));
        assert_eq!(ShardProgress::decode(&ShardProgress::default().encode()), Ok(ShardProgress::default()));
    }

    #[test]
    fn past_the_bound_the_highest_are_left_out() {
        let p = ShardProgress::of_window((0..2 * MAX_ENTRIES as u64).map(|s| (s, Some(after(id(1))))));
        assert_eq!(p.entries.len(), MAX_ENTRIES);
        assert!(p.of(0).is_some() && p.of(MAX_ENTRIES as u64).is_none());
    }

    #[test]
    fn a_damaged_form_is_refused() {
        let good = ShardProgress::of_window([(1, Some(Answered::Whole)), (2, Some(after(id(2))))]).encode();
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
