//! What a connection is doing, for its idle timer: whether its first
//! request is in, and how many requests (HTTP/2 streams) are open. Written
//! by the connection's IO and its requests, read by its own task only.

use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, Default)]
struct State {
    first_request_in: bool,
    open: usize,
}

pub struct Activity(watch::Sender<State>);

impl Activity {
    pub fn new() -> Self {
        Activity(watch::Sender::new(State::default()))
    }

    pub fn first_request_in(&self) {
        self.0.send_modify(|s| s.first_request_in = true);
    }

    /// One request more until the guard is dropped: when its response has
    /// been sent whole, or the request was abandoned.
    pub fn open(self: &std::sync::Arc<Self>) -> Open {
        self.0.send_modify(|s| s.open += 1);
        Open(self.clone())
    }

    /// Resolves once the connection has had its first request and then no
    /// request open for `after` in a row; any request restarts the count.
    /// Before the first request, the first-request deadline governs.
    pub async fn idle_for(&self, after: Duration) {
        let mut state = self.0.subscribe();
        loop {
            let now = *state.borrow_and_update();
            if now.first_request_in && now.open == 0 {
                tokio::select! {
                    () = tokio::time::sleep(after) => return,
                    _ = state.changed() => {}
                }
            } else {
                // The sender lives in `self`: `changed` cannot fail here.
                let _ = state.changed().await;
            }
        }
    }
}

pub struct Open(std::sync::Arc<Activity>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.0.send_modify(|s| s.open -= 1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

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
