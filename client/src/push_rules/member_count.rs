//! The `member_count` condition (§4.3): a numeric predicate checked against
//! the Realm's bucket grid when the rule is saved, so that on a bucketed
//! count every bucket is wholly inside or wholly outside the predicate.
//!
//! The spec names only the grid's first bucket ("1-10": `<= 5` is invalid
//! on it, `<= 10` valid). The default grid continues in decades, 1-10,
//! 11-100, 101-1000, 1001+; a host with the Realm's own grid passes it.

use std::ops::RangeInclusive;

/// `op value`, as an integer set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberCountPredicate {
    Eq(u64),
    Lt(u64),
    Le(u64),
    Gt(u64),
    Ge(u64),
}

impl MemberCountPredicate {
    pub fn new(op: &str, value: u64) -> Result<MemberCountPredicate, String> {
        Ok(match op {
            "==" => MemberCountPredicate::Eq(value),
            "<" => MemberCountPredicate::Lt(value),
            "<=" => MemberCountPredicate::Le(value),
            ">" => MemberCountPredicate::Gt(value),
            ">=" => MemberCountPredicate::Ge(value),
            other => return Err(format!("member_count op {other:?} is not one of == < <= > >=")),
        })
    }

    pub fn holds(self, n: u64) -> bool {
        match self {
            MemberCountPredicate::Eq(v) => n == v,
            MemberCountPredicate::Lt(v) => n < v,
            MemberCountPredicate::Le(v) => n <= v,
            MemberCountPredicate::Gt(v) => n > v,
            MemberCountPredicate::Ge(v) => n >= v,
        }
    }

    /// The predicate on a bucket: `Some(true)` when every count in it holds,
    /// `Some(false)` when none does, `None` when it splits the bucket. The
    /// predicate is an interval, so the two ends decide.
    pub fn on_bucket(self, bucket: &Bucket) -> Option<bool> {
        let (lo, hi) = (*bucket.range.start(), *bucket.range.end());
        // An open bucket's upper end: any count above every finite bound the
        // predicate names behaves the same as u64::MAX.
        let (at_lo, at_hi) = (self.holds(lo), self.holds(hi));
        let inside_changes = match self {
            // An equality inside a bucket of several counts splits it.
            MemberCountPredicate::Eq(v) => lo != hi && (lo..=hi).contains(&v),
            _ => false,
        };
        (at_lo == at_hi && !inside_changes).then_some(at_lo)
    }
}

/// One bucket of the grid: an inclusive range, the last one open-ended
/// (`u64::MAX` as its end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub range: RangeInclusive<u64>,
}

/// A Realm's member-count grid: consecutive buckets from 1 upwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketGrid {
    buckets: Vec<Bucket>,
}

impl Default for BucketGrid {
    fn default() -> BucketGrid {
        BucketGrid::from_lower_bounds(&[1, 11, 101, 1001]).expect("a valid grid")
    }
}

impl BucketGrid {
    /// From each bucket's lowest count, ascending; the last bucket is open.
    pub fn from_lower_bounds(lows: &[u64]) -> Result<BucketGrid, String> {
        if lows.is_empty() || lows.windows(2).any(|w| w[0] >= w[1]) {
            return Err("bucket lower bounds must be strictly ascending and not empty".into());
        }
        let mut buckets: Vec<Bucket> = lows.windows(2).map(|w| Bucket { range: w[0]..=w[1] - 1 }).collect();
        buckets.push(Bucket { range: lows[lows.len() - 1]..=u64::MAX });
        Ok(BucketGrid { buckets })
    }

    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The save-time check: the predicate splits no bucket.
    pub fn check(&self, predicate: &MemberCountPredicate) -> Result<(), String> {
        match self.buckets.iter().find(|b| predicate.on_bucket(b).is_none()) {
            Some(b) => Err(format!(
                "member_count {predicate:?} splits the bucket {}..={}: align it to the bucket bounds",
                b.range.start(),
                b.range.end()
            )),
            None => Ok(()),
        }
    }
}

/// What the client knows of a conversation's member count from its own
/// authorised roster reads (§4.3: never fetched for rule matching).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberCount {
    Exact(u64),
    Bucket(Bucket),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> BucketGrid {
        BucketGrid::default()
    }

    fn p(op: &str, v: u64) -> MemberCountPredicate {
        MemberCountPredicate::new(op, v).unwrap()
    }

    #[test]
    fn le_5_splits_1_to_10_and_le_10_does_not() {
        assert!(grid().check(&p("<=", 5)).is_err());
        assert!(grid().check(&p("<=", 10)).is_ok());
        assert!(grid().check(&p("<", 11)).is_ok());
        assert!(grid().check(&p(">", 10)).is_ok());
        assert!(grid().check(&p(">=", 101)).is_ok());
        assert!(grid().check(&p(">=", 1000)).is_err());
    }

    #[test]
    fn equality_is_valid_only_on_a_single_count_bucket() {
        assert!(grid().check(&p("==", 5)).is_err());
        assert!(grid().check(&p("==", 0)).is_ok(), "no bucket holds 0: false on every bucket");
        let pairs = BucketGrid::from_lower_bounds(&[1, 2, 3]).unwrap();
        assert!(pairs.check(&p("==", 2)).is_ok());
        assert!(pairs.check(&p("==", 3)).is_err(), "3+ is open-ended");
    }

    #[test]
    fn the_open_bucket_is_an_interval_too() {
        let last = grid().buckets().last().unwrap().clone();
        assert_eq!(p(">", 1000).on_bucket(&last), Some(true));
        assert_eq!(p("<=", 1000).on_bucket(&last), Some(false));
        assert_eq!(p(">", 5000).on_bucket(&last), None);
    }

    #[test]
    fn grids_must_ascend() {
        assert!(BucketGrid::from_lower_bounds(&[]).is_err());
        assert!(BucketGrid::from_lower_bounds(&[1, 1]).is_err());
        assert!(BucketGrid::from_lower_bounds(&[5, 2]).is_err());
    }
}
