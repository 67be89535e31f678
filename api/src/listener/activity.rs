//! What a connection is doing, for its idle timer: whether its first
//! request is in, how many requests (HTTP/2 streams) are open, and since
//! when none is. Written by the connection's IO and its requests, read by
//! the connection's own task.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Plain atomics, not a channel: a request costs two increments and never
/// wakes the connection's task; the idle timer looks when it is due. Only
/// the first request wakes it (`first_request`), once per connection.
pub struct Activity {
    /// When the connection was accepted; `quiet_since` counts from it.
    epoch: Instant,
    first_request_in: AtomicBool,
    first_in: Notify,
    open: AtomicUsize,
    /// Milliseconds from `epoch` to when the last request closed (or the
    /// first request came in).
    quiet_since: AtomicU64,
}

impl Activity {
    pub fn new() -> Self {
        Activity {
            epoch: Instant::now(),
            first_request_in: AtomicBool::new(false),
            first_in: Notify::new(),
            open: AtomicUsize::new(0),
            quiet_since: AtomicU64::new(0),
        }
    }

    pub fn first_request_in(&self) {
        self.quiet();
        self.first_request_in.store(true, Ordering::Release);
        self.first_in.notify_waiters();
    }

    /// Resolves once the first request is in (at once if it is).
    pub async fn first_request(&self) {
        let notified = self.first_in.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a request that comes in
        // between still wakes this waiter.
        notified.as_mut().enable();
        if !self.first_request_in.load(Ordering::Acquire) {
            notified.await;
        }
    }

    fn quiet(&self) {
        let since = Instant::now().saturating_duration_since(self.epoch).as_millis();
        self.quiet_since.store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// One request more until the guard is dropped: when its response has
    /// been sent whole, or the request was abandoned.
    pub fn open(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::AcqRel);
        Open(self.clone())
    }

    /// Resolves once the connection has had its first request and then no
    /// request open for `after` in a row; any request restarts the count.
    /// Before the first request, the first-request deadline governs.
    pub async fn idle_for(&self, after: Duration) {
        let mut check = Instant::now();
        loop {
            tokio::time::sleep_until(check).await;
            let now = Instant::now();
            if !self.first_request_in.load(Ordering::Acquire) || self.open.load(Ordering::Acquire) > 0 {
                check = now + after;
                continue;
            }
            let quiet_since = self.epoch + Duration::from_millis(self.quiet_since.load(Ordering::Acquire));
            if now >= quiet_since + after {
                return;
            }
            check = quiet_since + after;
        }
    }
}

pub struct Open(Arc<Activity>);

impl Drop for Open {
    fn drop(&mut self) {
        // Stamped before the count drops, so the timer never sees a
        // connection at zero with an older quiet time than its last request.
        self.0.quiet();
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_request_waits_for_it_and_answers_at_once_after_it() {
        let activity = Arc::new(Activity::new());
        let waiting = tokio::spawn({
            let activity = activity.clone();
            async move { activity.first_request().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "no request yet");
        activity.first_request_in();
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").unwrap();
        tokio::time::timeout(Duration::from_secs(5), activity.first_request()).await.expect("at once");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_request_and_never_while_one_is_open() {
        let activity = Arc::new(Activity::new());
        let idle = Duration::from_secs(10);
        let started = tokio::time::Instant::now();
        // Before the first request, no idle timer runs.
        assert!(tokio::time::timeout(Duration::from_secs(60), activity.idle_for(idle)).await.is_err());
        activity.first_request_in();
        let open = activity.open();
        // A request open for a minute (a busy stream) is never idle.
        assert!(tokio::time::timeout(Duration::from_secs(60), activity.idle_for(idle)).await.is_err());
        let waiting = tokio::spawn({
            let activity = activity.clone();
            async move { activity.idle_for(idle).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(open);
        let closed_at = started + Duration::from_secs(121);
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Another request 5 s into the idle time restarts it.
        drop(activity.open());
        waiting.await.unwrap();
        assert_eq!(tokio::time::Instant::now(), closed_at + Duration::from_secs(15));
    }
}
