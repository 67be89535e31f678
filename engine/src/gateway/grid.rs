//! §5.1's closed count grid: the buckets a notify's count is told in.

use serde::Deserialize;

/// §5.1: the closed default grid.
pub const DEFAULT_COUNT_GRID: [&str; 4] = ["1", "2-5", "6-20", "21+"];

/// §5.1's closed bucket grid: ascending, contiguous finite buckets from 1 and
/// one open last bucket (`"21+"`), so every count ≥ 1 has exactly one bucket
/// and each boundary has finite neighbours for the hysteresis band.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct CountGrid {
    labels: Vec<String>,
    /// The lowest count of each bucket; the last bucket is open.
    lowers: Vec<u32>,
}

/// A bucket of the grid, by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketIndex(pub usize);

impl CountGrid {
    pub fn buckets(&self) -> usize {
        self.labels.len()
    }

    /// `None`: not a label of this grid (§5.1: not conformant, refused).
    pub fn parse_label(&self, label: &str) -> Option<BucketIndex> {
        self.labels.iter().position(|l| l == label).map(BucketIndex)
    }

    pub fn label(&self, bucket: BucketIndex) -> &str {
        &self.labels[bucket.0]
    }

    /// The bucket of a count; `None` for 0 (below the grid).
    pub fn bucket_of(&self, count: u32) -> Option<BucketIndex> {
        self.lowers.iter().rposition(|&lo| count >= lo).map(BucketIndex)
    }

    /// Lowest count of a bucket.
    pub fn lower(&self, bucket: BucketIndex) -> u32 {
        self.lowers[bucket.0]
    }

    /// Highest count of a bucket; `None` for the open last one.
    pub fn upper(&self, bucket: BucketIndex) -> Option<u32> {
        self.lowers.get(bucket.0 + 1).map(|next| next - 1)
    }

    /// §5.1 span, endpoints included (`upper − lower + 1`); the open bucket
    /// takes the span of the finite bucket before it.
    pub fn span(&self, bucket: BucketIndex) -> u32 {
        match self.upper(bucket) {
            Some(upper) => upper - self.lower(bucket) + 1,
            None if bucket.0 == 0 => 1,
            None => self.span(BucketIndex(bucket.0 - 1)),
        }
    }

    /// §5.1 default band of the boundary between `lower` and the bucket
    /// above it: `max(2, ceil(0.10 × smaller adjacent span))`.
    pub fn default_band(&self, lower: BucketIndex) -> u32 {
        let smaller = self.span(lower).min(self.span(BucketIndex(lower.0 + 1)));
        smaller.div_ceil(10).max(2)
    }
}

impl Default for CountGrid {
    fn default() -> Self {
        Self::try_from(DEFAULT_COUNT_GRID.map(String::from).to_vec()).expect("the default grid is valid")
    }
}

impl TryFrom<Vec<String>> for CountGrid {
    type Error = String;

    fn try_from(labels: Vec<String>) -> Result<Self, String> {
        const RULE: &str =
            "count_grid must be ascending contiguous buckets \"1\", \"a-b\" ..., ending with one open \"n+\"";
        if labels.len() < 2 {
            return Err(RULE.into());
        }
        let mut lowers = Vec::with_capacity(labels.len());
        let mut next = 1u32;
        for (i, label) in labels.iter().enumerate() {
            let last = i + 1 == labels.len();
            let (lo, hi) = if last {
                let lo = label.strip_suffix('+').ok_or(RULE)?;
                (lo, None)
            } else if let Some((lo, hi)) = label.split_once('-') {
                (lo, Some(hi))
            } else {
                (label.as_str(), Some(label.as_str()))
            };
            let number = |s: &str| -> Result<u32, String> {
                // Canonical decimal only: "01" would be a second label for 1.
                if s.is_empty()
                    || s.len() > 9
                    || !s.bytes().all(|b| b.is_ascii_digit())
                    || (s.len() > 1 && s.starts_with('0'))
                {
                    return Err(RULE.into());
                }
                s.parse().map_err(|_| RULE.to_string())
            };
            let lo = number(lo)?;
            if lo != next {
                return Err(RULE.into());
            }
            if let Some(hi) = hi {
                let hi = number(hi)?;
                // "a-a" is written "a".
                if hi < lo || (hi == lo && label.contains('-')) {
                    return Err(RULE.into());
                }
                next = hi + 1;
            }
            lowers.push(lo);
        }
        Ok(Self { labels, lowers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grid_and_its_bands() {
        let g = CountGrid::default();
        assert_eq!(g.buckets(), 4);
        assert_eq!(g.parse_label("2-5"), Some(BucketIndex(1)));
        assert_eq!(g.parse_label("2-6"), None);
        assert_eq!(g.parse_label("21"), None);
        assert_eq!(g.label(BucketIndex(3)), "21+");
        let buckets: Vec<_> = [0, 1, 2, 5, 6, 20, 21, 10_000].iter().map(|&n| g.bucket_of(n).map(|b| b.0)).collect();
        assert_eq!(buckets, [None, Some(0), Some(1), Some(1), Some(2), Some(2), Some(3), Some(3)]);
        // §5.1: spans 1, 4, 15 and the open bucket's reference 15.
        assert_eq!((0..4).map(|i| g.span(BucketIndex(i))).collect::<Vec<_>>(), [1, 4, 15, 15]);
        // "default grid bands are all 2".
        assert_eq!((0..3).map(|i| g.default_band(BucketIndex(i))).collect::<Vec<_>>(), [2, 2, 2]);
    }

    #[test]
    fn custom_grids_are_closed_and_contiguous() {
        let g = CountGrid::try_from(["1-10", "11-500", "501-2000", "2001+"].map(String::from).to_vec()).unwrap();
        // §5.1's example: "501-2000" spans 1500.
        assert_eq!(g.span(BucketIndex(2)), 1500);
        // Boundary 500|501: smaller span 490 → ceil(49) = 49.
        assert_eq!(g.default_band(BucketIndex(1)), 49);
        assert_eq!(g.default_band(BucketIndex(2)), 150);
        for bad in [
            vec!["1"],
            vec!["1", "2-5"],
            vec!["2-5", "6+"],
            vec!["1", "3-5", "6+"],
            vec!["1", "2-5", "5-9", "10+"],
            vec!["1", "2-2", "3+"],
            vec!["1", "02-5", "6+"],
            vec!["1", "5-2", "6+"],
            vec!["1", "2+", "3+"],
            vec!["1", "2-x", "6+"],
        ] {
            assert!(CountGrid::try_from(bad.iter().map(|s| s.to_string()).collect::<Vec<_>>()).is_err(), "{bad:?}");
        }
    }
}
