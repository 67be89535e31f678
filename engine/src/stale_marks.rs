//! Dispatch copy marks that a failed or crashed change left behind
//! (ScyllaDB: `store::scylla`, "Dispatch copies"; docs/ARCHITECTURE.md,
//! "Marks a crash leaves"). A change deletes its own marks once its copies
//! are written; one that stopped half way leaves them, and each costs its
//! row a join per subscriber page for as long as it stands.
//!
//! The retention pass clears them: a mark seen by an earlier pass at least
//! [`SETTLE_AFTER`] before is cleared with `Store::clear_copy_marks`, which
//! fences the mark's recipient before it rewrites the marked rows, so that
//! even a change still running (a process paused past every timeout) can
//! no longer apply. The age only keeps running changes out of the way: a
//! change lasts at most its RPC's deadline (30 s by default) plus the
//! store's request timeouts of its few statements, far below the bound.
//! Ages are counted on this process's monotonic clock from the pass that
//! first saw a mark, so clocks of other nodes do not matter; a restart
//! starts counting again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{CopyMark, Store, StoreError};

/// How long a mark must have been seen before it is cleared.
pub const SETTLE_AFTER: Duration = Duration::from_secs(600);

/// Marks one pass reads at most: the rest wait for the next passes.
const MAX_PER_PASS: usize = 10_000;

/// The marks earlier passes saw, with when each was first seen.
#[derive(Debug, Default)]
pub struct StaleMarks {
    first_seen: HashMap<CopyMark, Instant>,
}

impl StaleMarks {
    /// One pass: reads the marks and clears those first seen at least
    /// `after` before `now`. Returns how many were cleared.
    pub async fn pass(&mut self, store: &dyn Store, after: Duration, now: Instant) -> Result<u64, StoreError> {
        let marks = store.copy_marks(MAX_PER_PASS).await?;
        let due = self.due(marks, after, now);
        if due.is_empty() {
            return Ok(0);
        }
        store.clear_copy_marks(&due).await
    }

    /// Remembers `marks` (the marks there are now) and returns those seen
    /// at least `after` before `now`. Marks no longer there are forgotten;
    /// those returned are kept until a later read no longer finds them, so
    /// that one whose clearing was put off stays due.
    fn due(&mut self, marks: Vec<CopyMark>, after: Duration, now: Instant) -> Vec<CopyMark> {
        let present: HashSet<&CopyMark> = marks.iter().collect();
        self.first_seen.retain(|m, _| present.contains(m));
        let mut due = Vec::new();
        for mark in marks {
            let seen = *self.first_seen.entry(mark.clone()).or_insert(now);
            if now.saturating_duration_since(seen) >= after && seen < now {
                due.push(mark);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{RecipientId, Topic};

    fn mark(n: u8) -> CopyMark {
        CopyMark { topic: Topic::parse(&[0, n]).unwrap(), recipient: RecipientId::from_bytes([n; 32]), mark: n.into() }
    }

    #[test]
    fn a_mark_is_due_once_a_pass_saw_it_long_enough_before() {
        let mut marks = StaleMarks::default();
        let start = Instant::now();
        let after = Duration::from_secs(600);
        assert_eq!(marks.due(vec![mark(1)], after, start), vec![], "first seen now");
        let later = start + Duration::from_secs(300);
        assert_eq!(marks.due(vec![mark(1), mark(2)], after, later), vec![], "neither is old enough");
        let much_later = start + after;
        assert_eq!(marks.due(vec![mark(1), mark(2)], after, much_later), vec![mark(1)], "seen 600 s ago");
        // Still there (its clearing was put off): still due.
        let then = much_later + Duration::from_secs(1);
        assert_eq!(marks.due(vec![mark(1), mark(2)], after, then), vec![mark(1)]);
        assert_eq!(marks.due(vec![mark(1), mark(2)], after, later + after), vec![mark(1), mark(2)]);
    }

    #[test]
    fn a_mark_that_went_is_forgotten_and_counted_again_if_it_comes_back() {
        let mut marks = StaleMarks::default();
        let start = Instant::now();
        let after = Duration::from_secs(600);
        marks.due(vec![mark(1)], after, start);
        marks.due(vec![], after, start + Duration::from_secs(1));
        assert!(marks.first_seen.is_empty(), "a mark no pass finds is forgotten");
        let back = start + after;
        assert_eq!(marks.due(vec![mark(1)], after, back), vec![], "seen anew");
        assert_eq!(marks.due(vec![mark(1)], after, back + after), vec![mark(1)]);
    }

    #[test]
    fn with_no_wait_a_mark_is_still_due_only_at_a_later_pass() {
        let mut marks = StaleMarks::default();
        let now = Instant::now();
        assert_eq!(marks.due(vec![mark(3)], Duration::ZERO, now), vec![], "never on the pass that first sees it");
        assert_eq!(marks.due(vec![mark(3)], Duration::ZERO, now + Duration::from_millis(1)), vec![mark(3)]);
    }
}
