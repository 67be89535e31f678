//! What a mock received, kept in arrival order for the test to read and to
//! wait for.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

use crate::lock;

/// Requests of type `R` as a mock recorded them, and how many arrived.
pub struct Recorder<R> {
    requests: Mutex<Vec<R>>,
    /// Requests that arrived, recorded or only counted; wakes waiters.
    count: watch::Sender<usize>,
}

impl<R: Clone> Recorder<R> {
    pub fn new() -> Self {
        Recorder { requests: Mutex::new(Vec::new()), count: watch::Sender::new(0) }
    }

    /// Keeps `request`.
    pub fn record(&self, request: R) {
        let mut requests = lock(&self.requests);
        requests.push(request);
        self.count.send_modify(|count| *count += 1);
    }

    /// Counts a request without keeping it (load runs keep no requests).
    pub fn count_only(&self) {
        self.count.send_modify(|count| *count += 1);
    }

    /// Copies of every kept request, in arrival order.
    pub fn all(&self) -> Vec<R> {
        lock(&self.requests).clone()
    }

    /// Requests that arrived so far, kept or not (no copying).
    pub fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Forgets every request and resets the count.
    pub fn clear(&self) {
        let mut requests = lock(&self.requests);
        requests.clear();
        self.count.send_replace(0);
    }

    /// Waits until at least `n` requests arrived or `timeout` passed, then
    /// returns the kept ones (possibly fewer than `n`).
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<R> {
        let mut rx = self.count.subscribe();
        // The sender lives in `self`, so this cannot fail with "closed"; the
        // timeout bounds the wait either way.
        let _ = tokio::time::timeout(timeout, rx.wait_for(|count| *count >= n)).await;
        self.all()
    }

    /// Waits until `done` holds for the kept requests or `timeout` passed,
    /// then returns them.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&[R]) -> bool) -> Vec<R> {
        let mut rx = self.count.subscribe();
        let wait = async {
            loop {
                if done(&lock(&self.requests)) {
                    return;
                }
                // The sender lives in `self`, so this cannot fail while we wait.
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
        self.all()
    }
}

impl<R: Clone> Default for Recorder<R> {
    fn default() -> Self {
        Recorder::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_kept_and_counted_requests_and_wakes_waiters() {
        let recorder = std::sync::Arc::new(Recorder::<u32>::new());
        let waiter = tokio::spawn({
            let recorder = recorder.clone();
            async move { recorder.wait_for(3, Duration::from_secs(5)).await }
        });
        recorder.record(1);
        recorder.count_only();
        recorder.record(2);
        assert_eq!(waiter.await.unwrap(), vec![1, 2]);
        assert_eq!(recorder.count(), 3);
        let even = recorder.wait_until(Duration::from_secs(5), |r| r.iter().any(|n| n % 2 == 0)).await;
        assert_eq!(even, vec![1, 2]);
        recorder.clear();
        assert_eq!((recorder.count(), recorder.all()), (0, vec![]));
    }
}
