use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Counts down the first attempts of one page of deliveries, then calls its
/// completion once. A delivery dropped without an attempt (a shutdown, a crash)
/// never counts down, so its page is replayed rather than skipped.
///
/// It remembers which of the page's deliveries had their first attempt, so a
/// replay re-sends only the others, and it can be abandoned: a delivery of an
/// abandoned latch that has not been attempted yet is dropped by its worker,
/// because the replay sends it again.
pub struct FirstAttemptLatch {
    remaining: AtomicUsize,
    attempted: Vec<AtomicBool>,
    abandoned: AtomicBool,
    /// Shared by every page of a window: first attempts settled so far, the
    /// window's measure of progress.
    progress: Arc<AtomicU64>,
    on_done: Box<dyn Fn() + Send + Sync>,
}

impl FirstAttemptLatch {
    pub fn new(count: usize, progress: Arc<AtomicU64>, on_done: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            remaining: AtomicUsize::new(count),
            attempted: (0..count).map(|_| AtomicBool::new(false)).collect(),
            abandoned: AtomicBool::new(false),
            progress,
            on_done: Box::new(on_done),
        }
    }

    /// The first attempt of delivery `index` of the page has its answer.
    pub fn count_down(&self, index: usize) {
        if self.attempted.get(index).is_some_and(|a| a.swap(true, Ordering::AcqRel)) {
            return; // already counted
        }
        self.progress.fetch_add(1, Ordering::Relaxed);
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.on_done)();
        }
    }

    /// Marks the page replayed; returns the indices not attempted so far.
    pub fn abandon(&self) -> Vec<usize> {
        self.abandoned.store(true, Ordering::Release);
        (0..self.attempted.len()).filter(|&i| !self.attempted[i].load(Ordering::Acquire)).collect()
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }
}

/// A delivery's place in its page's latch.
#[derive(Clone)]
pub struct FirstAttempt {
    pub latch: Arc<FirstAttemptLatch>,
    pub index: usize,
}

impl FirstAttempt {
    pub fn settle(self) {
        self.latch.count_down(self.index);
    }

    pub fn is_abandoned(&self) -> bool {
        self.latch.is_abandoned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_at_zero_and_counts_progress() {
        let fired = Arc::new(AtomicUsize::new(0));
        let progress = Arc::new(AtomicU64::new(0));
        let f = fired.clone();
        let latch = FirstAttemptLatch::new(3, progress.clone(), move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        latch.count_down(0);
        latch.count_down(1);
        latch.count_down(1); // the same delivery twice counts once
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        assert_eq!(progress.load(Ordering::SeqCst), 2);
        latch.count_down(2);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        assert_eq!(progress.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn abandoning_names_the_deliveries_not_attempted() {
        let latch = FirstAttemptLatch::new(4, Arc::default(), || {});
        latch.count_down(1);
        latch.count_down(3);
        assert!(!latch.is_abandoned());
        assert_eq!(latch.abandon(), vec![0, 2]);
        assert!(latch.is_abandoned());
    }
}
