use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts down the first attempts of one page of deliveries, then calls its
/// completion once. A delivery dropped without an attempt (a shutdown, a crash)
/// never counts down, so its window is replayed rather than skipped.
pub struct FirstAttemptLatch {
    remaining: AtomicUsize,
    on_done: Box<dyn Fn() + Send + Sync>,
}

impl FirstAttemptLatch {
    pub fn new(count: usize, on_done: impl Fn() + Send + Sync + 'static) -> Self {
        Self { remaining: AtomicUsize::new(count), on_done: Box::new(on_done) }
    }

    pub fn count_down(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.on_done)();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn fires_once_at_zero() {
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let latch = FirstAttemptLatch::new(3, move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        latch.count_down();
        latch.count_down();
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        latch.count_down();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }
}
