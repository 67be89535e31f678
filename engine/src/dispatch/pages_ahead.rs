//! Subscriber pages read ahead of the pump.
//!
//! A shard's pump reads one page at a time and hands it out before reading
//! the next. On redb a read costs microseconds; on ScyllaDB it is a network
//! round trip (the topic's index rows, then the join of their recipients),
//! so a pump that waits for each read leaves the engine idle while the
//! database has room. These reads start as soon as the next pages are known:
//! the next page of the front envelope and the first pages of the envelopes
//! behind it, at most `engine.dispatch.subscriber_pages_ahead` per shard.
//!
//! A page read ahead is the same read made earlier, so it holds the same
//! subscribers a read made later would, with one difference the rules
//! allow: a subscription added in between starts at a boundary above every
//! envelope of the window (PUSH-216), so it is not eligible for them anyway,
//! and one removed in between may get a delivery it would also have got had
//! the removal come just after the read.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::domain::{RecipientId, StoredEnvelope, Subscriber};
use crate::store::{Store, StoreError};

/// A page: its envelope (by sequence id) and the subscriber it starts after.
type PageKey = (u64, Option<RecipientId>);

type PageRead = JoinHandle<Result<Vec<Subscriber>, StoreError>>;

/// The reads in flight of one window's next pages. Dropping it cancels them.
pub(super) struct PagesAhead {
    ahead: usize,
    reads: HashMap<PageKey, PageRead>,
}

impl PagesAhead {
    /// Up to `ahead` reads in flight; 0 reads every page when it is needed.
    pub(super) fn new(ahead: usize) -> Self {
        Self { ahead, reads: HashMap::new() }
    }

    /// The page of `envelope` after `cursor`: the read started earlier, or
    /// one made now.
    pub(super) async fn take(
        &mut self,
        store: &Arc<dyn Store>,
        envelope: &StoredEnvelope,
        cursor: Option<RecipientId>,
        limit: usize,
    ) -> Result<Vec<Subscriber>, StoreError> {
        if let Some(read) = self.reads.remove(&(envelope.sequence_id, cursor)) {
            match read.await {
                Ok(page) => return page,
                // The read panicked: read again here, where a panic is the pump's own.
                Err(e) => tracing::warn!(error = %e, "a subscriber page read ahead failed; reading it again"),
            }
        }
        store.subscribers(&envelope.topic, cursor.as_ref(), limit).await
    }

    /// Starts the reads of the pages that come next, in order, while fewer
    /// than `ahead` are in flight. `next` yields each envelope still to page
    /// with the subscriber its next page starts after.
    pub(super) fn start<'a>(
        &mut self,
        store: &Arc<dyn Store>,
        next: impl Iterator<Item = (&'a Arc<StoredEnvelope>, Option<RecipientId>)>,
        limit: usize,
    ) {
        for (envelope, cursor) in next.take(self.ahead) {
            if self.reads.len() >= self.ahead {
                return;
            }
            let key = (envelope.sequence_id, cursor);
            if self.reads.contains_key(&key) {
                continue;
            }
            let (store, envelope) = (store.clone(), envelope.clone());
            let read = tokio::spawn(async move { store.subscribers(&envelope.topic, cursor.as_ref(), limit).await });
            self.reads.insert(key, read);
        }
    }

    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.reads.len()
    }
}

impl Drop for PagesAhead {
    fn drop(&mut self) {
        for read in self.reads.values() {
            read.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DeliveryTarget, SecretHash, Subscription, SubscriptionUpdate, Topic};
    use crate::store::RedbStore;
    use crate::testing;

    /// A store where topic `[0, t]` has `subscribers` recipients, and an
    /// envelope of that topic at sequence id `t`.
    async fn store_with(topics: u8, subscribers: u8) -> (Arc<dyn Store>, Vec<Arc<StoredEnvelope>>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), 1).unwrap();
        let hash = SecretHash([2; 32]);
        let adds: Vec<Subscription> = (1..=topics)
            .map(|t| Subscription { topic: Topic::parse(&[0, t]).unwrap(), keys: None, include_commits: true })
            .collect();
        let update = SubscriptionUpdate::new(adds, vec![]).unwrap();
        for r in 1..=subscribers {
            let id = RecipientId::from_bytes([r; 32]);
            store.register(&id, &hash, &DeliveryTarget::Fcm { token: format!("t{r}") }, 1).await.unwrap();
            store.update_subscriptions(&id, &hash, &update, 1, 100).await.unwrap();
        }
        let envelopes = (1..=topics)
            .map(|t| {
                let mut e = testing::envelope(u64::from(t));
                e.topic = Topic::parse(&[0, t]).unwrap();
                Arc::new(e)
            })
            .collect();
        (Arc::new(store), envelopes, dir)
    }

    fn ids(page: &[Subscriber]) -> Vec<RecipientId> {
        page.iter().map(|s| s.recipient.id).collect()
    }

    #[tokio::test]
    async fn a_page_read_ahead_is_the_page_read_now() {
        let (store, envelopes, _dir) = store_with(6, 5).await;
        let mut ahead = PagesAhead::new(3);
        ahead.start(&store, envelopes.iter().map(|e| (e, None)), 2);
        assert_eq!(ahead.in_flight(), 3, "at most `ahead` reads start");
        // The next page of the first envelope, after its first two subscribers.
        let first = ahead.take(&store, &envelopes[0], None, 2).await.unwrap();
        let cursor = first.last().map(|s| s.recipient.id);
        ahead.start(&store, envelopes.iter().map(|e| (e, cursor)).take(1), 2);
        assert_eq!(ahead.in_flight(), 3, "a freed slot is taken by the next page");
        for (envelope, cursor) in [(&envelopes[0], cursor), (&envelopes[1], None), (&envelopes[2], None)] {
            let read = ahead.take(&store, envelope, cursor, 2).await.unwrap();
            let now = store.subscribers(&envelope.topic, cursor.as_ref(), 2).await.unwrap();
            assert_eq!(ids(&read), ids(&now));
            assert_eq!(read.len(), 2);
        }
        assert_eq!(ahead.in_flight(), 0);
        // Not read ahead: read when taken.
        let late = ahead.take(&store, &envelopes[5], None, 10).await.unwrap();
        assert_eq!(late.len(), 5);
    }

    #[tokio::test]
    async fn none_ahead_starts_no_read() {
        let (store, envelopes, _dir) = store_with(2, 1).await;
        let mut ahead = PagesAhead::new(0);
        ahead.start(&store, envelopes.iter().map(|e| (e, None)), 10);
        assert_eq!(ahead.in_flight(), 0);
        assert_eq!(ahead.take(&store, &envelopes[1], None, 10).await.unwrap().len(), 1);
    }
}
