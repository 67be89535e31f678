//! A window's subscriber pages: read ahead of the pump, and a small topic's
//! page read once per window.
//!
//! A shard's pump hands out one page at a time. On redb a read costs
//! microseconds; on ScyllaDB it is a network round trip (the topic's index
//! rows, then the join of their recipients) and work for the database.
//! So, per window:
//!
//! - *Read ahead.* The reads of the next pages start before they are needed:
//!   the next page of the front envelope and the first pages of the
//!   envelopes behind it, at most `engine.dispatch.subscriber_pages_ahead`
//!   in flight per shard.
//! - *Read once.* A topic whose subscribers fit in one page is read once per
//!   window, however many of the window's envelopes are on it (a busy group
//!   sends many), as the window's boundary is read once. A page is kept
//!   only while envelopes of its topic are still to come, and kept pages
//!   hold at most [`KEPT_SUBSCRIBERS`] subscribers.
//!
//! A page read earlier holds what a later read would for the window's
//! envelopes, all stored before it began: a subscription added in between
//! starts at a boundary above them (PUSH-216), so it is not eligible for
//! them; a change or a removal in between takes effect from the next
//! window, as it would for a page read just before it.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::domain::{RecipientId, Subscriber, Topic};
use crate::store::{Store, StoreError};

/// Subscribers a window keeps in pages it reuses, at most.
pub(super) const KEPT_SUBSCRIBERS: usize = 1000;

/// A page: its topic and the subscriber it starts after.
type PageKey = (Topic, Option<RecipientId>);

/// A page as read: shared by the envelopes of its topic in one window.
pub(super) type PageOf = Arc<Vec<Subscriber>>;

type PageRead = JoinHandle<Result<Vec<Subscriber>, StoreError>>;

/// One window's page reads in flight and its kept pages. Dropping it
/// cancels the reads.
pub(super) struct WindowPages {
    ahead: usize,
    reads: HashMap<PageKey, PageRead>,
    /// The topics of more than one of the window's envelopes.
    repeats: HashMap<Topic, Repeat>,
    kept_subscribers: usize,
}

/// A topic the window holds several envelopes of.
struct Repeat {
    /// Its envelopes whose first page is still to be taken.
    left: usize,
    /// Its only page, once read (and while there was room for it).
    page: Option<PageOf>,
}

impl WindowPages {
    /// For a window of envelopes on `topics`, in order; up to `ahead` reads
    /// in flight (0 reads every page when it is needed).
    pub(super) fn new<'a>(ahead: usize, topics: impl Iterator<Item = &'a Topic>) -> Self {
        let mut counts: HashMap<&Topic, usize> = HashMap::new();
        for topic in topics {
            *counts.entry(topic).or_default() += 1;
        }
        let repeats = counts
            .into_iter()
            .filter(|&(_, n)| n > 1)
            .map(|(topic, left)| (topic.clone(), Repeat { left, page: None }))
            .collect();
        Self { ahead, reads: HashMap::new(), repeats, kept_subscribers: 0 }
    }

    /// The page of `topic` after `cursor`: kept, read ahead, or read now.
    pub(super) async fn take(
        &mut self,
        store: &Arc<dyn Store>,
        topic: &Topic,
        cursor: Option<RecipientId>,
        limit: usize,
    ) -> Result<PageOf, StoreError> {
        let repeat = if cursor.is_none() { self.repeats.get_mut(topic) } else { None };
        if let Some(r) = repeat {
            r.left = r.left.saturating_sub(1);
            if let Some(page) = r.page.clone() {
                if r.left == 0 {
                    // Its last envelope: the page is not needed any more.
                    self.kept_subscribers -= page.len();
                    self.repeats.remove(topic);
                }
                return Ok(page);
            }
        }
        let read = if self.reads.is_empty() { None } else { self.reads.remove(&(topic.clone(), cursor)) };
        let page = match read {
            Some(read) => match read.await {
                Ok(page) => page?,
                // The read panicked: read again here, where a panic is the pump's own.
                Err(e) => {
                    tracing::warn!(error = %e, "a subscriber page read ahead failed; reading it again");
                    store.subscribers(topic, cursor.as_ref(), limit).await?
                }
            },
            None => store.subscribers(topic, cursor.as_ref(), limit).await?,
        };
        let page = Arc::new(page);
        // The whole topic, wanted again, and room for it: keep it.
        if cursor.is_none()
            && page.len() < limit
            && self.kept_subscribers + page.len() <= KEPT_SUBSCRIBERS
            && let Some(r) = self.repeats.get_mut(topic).filter(|r| r.left > 0)
        {
            self.kept_subscribers += page.len();
            r.page = Some(page.clone());
        }
        Ok(page)
    }

    /// Starts the reads of the pages that come next, in order, while fewer
    /// than `ahead` are in flight. `next` yields the topic of each envelope
    /// still to page with the subscriber its next page starts after.
    pub(super) fn start<'a>(
        &mut self,
        store: &Arc<dyn Store>,
        next: impl Iterator<Item = (&'a Topic, Option<RecipientId>)>,
        limit: usize,
    ) {
        // Bounded: a window of one topic's envelopes must not walk them all.
        for (topic, cursor) in next.take(self.ahead.saturating_mul(4)) {
            if self.reads.len() >= self.ahead {
                return;
            }
            if cursor.is_none() && self.repeats.get(topic).is_some_and(|r| r.page.is_some()) {
                continue;
            }
            let key = (topic.clone(), cursor);
            if self.reads.contains_key(&key) {
                continue;
            }
            let (store, topic) = (store.clone(), topic.clone());
            let read = tokio::spawn(async move { store.subscribers(&topic, cursor.as_ref(), limit).await });
            self.reads.insert(key, read);
        }
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.reads.len()
    }
}

impl Drop for WindowPages {
    fn drop(&mut self) {
        for read in self.reads.values() {
            read.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DeliveryTarget, SecretHash, Subscription, SubscriptionUpdate};
    use crate::store::RedbStore;

    /// A store where topics `[0, 1]` … `[0, topics]` each have `subscribers`
    /// recipients.
    async fn store_with(topics: u8, subscribers: u8) -> (Arc<dyn Store>, Vec<Topic>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), 1).unwrap();
        let hash = SecretHash([2; 32]);
        let topics: Vec<Topic> = (1..=topics).map(|t| Topic::parse(&[0, t]).unwrap()).collect();
        let adds = topics.iter().map(|t| Subscription { topic: t.clone(), keys: None, include_commits: true });
        let update = SubscriptionUpdate::new(adds.collect(), vec![]).unwrap();
        for r in 1..=subscribers {
            let id = RecipientId::from_bytes([r; 32]);
            store.register(&id, &hash, &DeliveryTarget::Fcm { token: format!("t{r}") }, 1).await.unwrap();
            store.update_subscriptions(&id, &hash, &update, 1, 100).await.unwrap();
        }
        (Arc::new(store), topics, dir)
    }

    fn ids(page: &[Subscriber]) -> Vec<RecipientId> {
        page.iter().map(|s| s.recipient.id).collect()
    }

    async fn unregister(store: &Arc<dyn Store>, r: u8) {
        store.unregister(&RecipientId::from_bytes([r; 32]), &SecretHash([2; 32])).await.unwrap();
    }

    #[tokio::test]
    async fn a_page_read_ahead_is_the_page_read_now() {
        let (store, topics, _dir) = store_with(6, 5).await;
        let mut pages = WindowPages::new(3, topics.iter());
        pages.start(&store, topics.iter().map(|t| (t, None)), 2);
        assert_eq!(pages.in_flight(), 3, "at most `ahead` reads start");
        let first = pages.take(&store, &topics[0], None, 2).await.unwrap();
        let cursor = first.last().map(|s| s.recipient.id);
        // The next page of the first topic takes the freed slot.
        pages.start(&store, [(&topics[0], cursor)].into_iter(), 2);
        assert_eq!(pages.in_flight(), 3);
        for (topic, cursor) in [(&topics[0], cursor), (&topics[1], None), (&topics[2], None)] {
            let read = pages.take(&store, topic, cursor, 2).await.unwrap();
            let now = store.subscribers(topic, cursor.as_ref(), 2).await.unwrap();
            assert_eq!(read.len(), 2);
            assert_eq!(ids(&read), ids(&now));
        }
        assert_eq!(pages.in_flight(), 0);
        // Not read ahead: read when taken.
        assert_eq!(pages.take(&store, &topics[5], None, 10).await.unwrap().len(), 5);
    }

    #[tokio::test]
    async fn a_whole_topic_is_read_once_per_window() {
        let (store, topics, _dir) = store_with(3, 3).await;
        // Envelopes on topics 0, 1, 0, 1, 2, 0.
        let window = [0, 1, 0, 1, 2, 0].map(|t| &topics[t]);
        let mut pages = WindowPages::new(4, window.into_iter());
        let whole = pages.take(&store, &topics[0], None, 10).await.unwrap();
        assert_eq!(whole.len(), 3);
        // A full first page is not the whole topic: read again each time.
        let partial = pages.take(&store, &topics[1], None, 3).await.unwrap();
        assert_eq!(partial.len(), 3);
        unregister(&store, 1).await;
        let again = pages.take(&store, &topics[0], None, 10).await.unwrap();
        assert!(Arc::ptr_eq(&whole, &again), "the window's other envelopes of the topic reuse its page");
        pages.start(&store, [(&topics[0], None)].into_iter(), 10);
        assert_eq!(pages.in_flight(), 0, "a kept topic is not read ahead");
        assert_eq!(pages.take(&store, &topics[1], None, 3).await.unwrap().len(), 2, "read now");
        // A topic of one envelope is not kept.
        let single = pages.take(&store, &topics[2], None, 10).await.unwrap();
        assert_eq!(pages.kept_subscribers, 3, "only topic 0's page is kept");
        assert_eq!(single.len(), 2);
        // Its last envelope takes it and lets it go.
        assert!(Arc::ptr_eq(&whole, &pages.take(&store, &topics[0], None, 10).await.unwrap()));
        assert_eq!(pages.kept_subscribers, 0);
        // The next window reads it again.
        let mut next = WindowPages::new(4, [&topics[0]].into_iter());
        assert_eq!(next.take(&store, &topics[0], None, 10).await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn kept_pages_are_bounded() {
        let (store, topics, _dir) = store_with(2, 3).await;
        let window = [0, 1, 0, 1].map(|t| &topics[t]);
        let mut pages = WindowPages::new(0, window.into_iter());
        pages.kept_subscribers = KEPT_SUBSCRIBERS - 3;
        let kept = pages.take(&store, &topics[0], None, 10).await.unwrap();
        let over = pages.take(&store, &topics[1], None, 10).await.unwrap();
        assert!(Arc::ptr_eq(&kept, &pages.take(&store, &topics[0], None, 10).await.unwrap()));
        assert!(!Arc::ptr_eq(&over, &pages.take(&store, &topics[1], None, 10).await.unwrap()), "no room: read again");
    }

    #[tokio::test]
    async fn none_ahead_starts_no_read() {
        let (store, topics, _dir) = store_with(2, 1).await;
        let mut pages = WindowPages::new(0, topics.iter());
        pages.start(&store, topics.iter().map(|t| (t, None)), 10);
        assert_eq!(pages.in_flight(), 0);
        assert_eq!(pages.take(&store, &topics[1], None, 10).await.unwrap().len(), 1);
    }
}
