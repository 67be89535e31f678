//! A shard's dispatch window (docs/ARCHITECTURE.md, "Dispatch"): the
//! envelopes read above the checkpoint, the pages of their deliveries handed
//! to the workers and not yet answered, and what the window answered, which
//! its record of progress and its replay are made from. The shard actor
//! (`super::shard`) owns one at a time and moves it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::time::Instant;

use super::DispatchContext;
use super::routes::SinkIndex;
use super::window_pages::WindowPages;
use crate::delivery::{Delivery, FirstAttempt, FirstAttemptLatch};
use crate::domain::{Answered, Partly, Recipient, RecipientId, ShardProgress, StoredEnvelope};
use crate::page::{Batch, Handoff};

pub(super) struct Window {
    pub(super) id: u64,
    /// Tells the shard actor that the page with this id had every first
    /// attempt answered (`ShardMsg::PageDone`).
    pub(super) page_done: Arc<dyn Fn(u64) + Send + Sync>,
    /// Envelopes not yet fully paged, front first.
    pub(super) envelopes: VecDeque<Arc<StoredEnvelope>>,
    /// Last subscriber of the front envelope already paged.
    pub(super) cursor: Option<RecipientId>,
    /// Every envelope of the window, ascending: what a record of progress
    /// speaks of.
    pub(super) ids: Vec<u64>,
    /// Envelopes behind the front that a former owner answered up to a
    /// subscriber (`Partly::upto`): their paging starts after it.
    pub(super) resume: HashMap<u64, RecipientId>,
    /// The subscribers above that a former owner answered too
    /// (`Partly::also`, ascending): never handed out again.
    pub(super) skip: HashMap<u64, Vec<RecipientId>>,
    /// The progress as last recorded by this window.
    pub(super) recorded: ShardProgress,
    /// The reads of the next pages, and the pages of small topics.
    pub(super) pages_read: WindowPages,
    /// The checkpoint this window moves to when complete.
    pub(super) end: u64,
    /// The checkpoint as this window last wrote it (or found it), and when.
    pub(super) checkpoint: u64,
    pub(super) checkpoint_written: Instant,
    /// Pages handed to the workers whose first attempts are not all answered.
    pub(super) pages: HashMap<u64, Page>,
    pub(super) next_page_id: u64,
    pub(super) pump_queued: bool,
    pub(super) started: Instant,
    /// This read's open batches, by sink (`routes.rs`: the delivery workers,
    /// or a channel's own queue such as the relay's, spec 003 §4). The
    /// deliveries of this read coalesce in a queue's, released when the read
    /// ends or pauses (`release_queued`).
    pub(super) queued: HashMap<SinkIndex, Box<dyn Batch>>,
    /// First attempts settled in this window (counted by the latches), and
    /// when that count last moved: the liveness measure of the window.
    pub(super) progress: Arc<AtomicU64>,
    pub(super) seen_progress: u64,
    pub(super) last_progress: Instant,
}

/// One page's deliveries, kept until their first attempts are answered so
/// that a replay can re-send exactly the ones that never had one.
pub(super) struct Page {
    pub(super) envelope: Arc<StoredEnvelope>,
    /// The subscriber the page was read after: every delivery of the
    /// envelope to a subscriber at or below it was handed out earlier.
    pub(super) after: Option<RecipientId>,
    pub(super) recipients: Vec<Arc<Recipient>>,
    pub(super) latch: Arc<FirstAttemptLatch>,
}

/// A dropped window's deliveries that no worker has sent yet are dropped by
/// the workers too: the next window (here, or on the shard's next owner)
/// reads them again from the stored checkpoint, which is below every page
/// still here, and sends them. On `Drop`, not in the actor's `post_stop`:
/// a shard actor killed when its lease is lost, or when a release outlasts
/// its bound, runs no `post_stop`, and the first attempts its workers still
/// held would go out if this node took the shard again, after its next
/// owner had sent them. A window dropped complete has no page left.
impl Drop for Window {
    fn drop(&mut self) {
        for page in self.pages.values() {
            page.latch.drop_window();
        }
        self.release_queued();
    }
}

impl Window {
    /// Hands each delivery to this read's batch of its channel's sink: the
    /// channel's own queue, or the delivery workers. The hand-offs finish
    /// when awaited (backpressure).
    pub(super) fn route(&mut self, ctx: &DispatchContext, batch: Vec<Delivery>) -> Vec<Handoff> {
        let mut parts: Vec<(SinkIndex, Vec<Delivery>)> = Vec::new();
        for delivery in batch {
            let sink = ctx.routes.of(delivery.recipient.target.channel());
            match parts.iter_mut().find(|(s, _)| *s == sink) {
                Some((_, part)) => part.push(delivery),
                None => parts.push((sink, vec![delivery])),
            }
        }
        parts
            .into_iter()
            .map(|(sink, part)| self.queued.entry(sink).or_insert_with(|| ctx.routes.open(sink)).take(part))
            .collect()
    }

    /// Lets the queued deliveries of this read go. Called when the read has
    /// handed out every page, and whenever it pauses at
    /// `max_pages_in_flight`: those pages wait for first attempts, so held
    /// deliveries must be free to make them.
    pub(super) fn release_queued(&mut self) {
        self.queued.clear();
    }

    /// Records the next page and returns its deliveries, each with its place
    /// in the page's latch.
    pub(super) fn hand_out(
        &mut self,
        envelope: Arc<StoredEnvelope>,
        after: Option<RecipientId>,
        recipients: Vec<Arc<Recipient>>,
    ) -> Vec<Delivery> {
        let page = self.next_page_id;
        self.next_page_id += 1;
        let done = self.page_done.clone();
        let latch = Arc::new(FirstAttemptLatch::new(recipients.len(), self.progress.clone(), move || done(page)));
        let batch = recipients
            .iter()
            .enumerate()
            .map(|(index, r)| Delivery::new(envelope.clone(), r.clone(), FirstAttempt { latch: latch.clone(), index }))
            .collect();
        self.pages.insert(page, Page { envelope, after, recipients, latch });
        batch
    }

    /// What this window answered above its checkpoint. An envelope fully
    /// paged with no page in flight had every first attempt. One with pages
    /// in flight: every one below its lowest such page (pages are handed
    /// out in subscriber order, and one that left `pages` was answered, or
    /// under way when a replay took its missing deliveries) and the
    /// answered start of that page, then each answered delivery of its
    /// pages in flight (workers answer out of order). One still to page:
    /// every one up to where its paging starts. Both keep what a former
    /// owner answered above that (`skip`).
    pub(super) fn answered(&self) -> ShardProgress {
        let mut in_flight: HashMap<u64, Vec<&Page>> = HashMap::new();
        for page in self.pages.values() {
            in_flight.entry(page.envelope.sequence_id).or_default().push(page);
        }
        let mut to_page: HashMap<u64, Option<RecipientId>> =
            self.envelopes.iter().map(|e| (e.sequence_id, self.resume.get(&e.sequence_id).copied())).collect();
        if let Some(front) = self.envelopes.front() {
            to_page.insert(front.sequence_id, self.cursor);
        }
        ShardProgress::of_window(self.ids.iter().filter(|&&id| id > self.checkpoint).map(|&id| {
            let skipped = self.skip.get(&id).into_iter().flatten().copied();
            let answered = match (in_flight.get(&id), to_page.get(&id)) {
                (Some(pages), _) => {
                    let lowest = pages.iter().min_by_key(|p| p.after).expect("an envelope in flight has a page");
                    let upto = match lowest.latch.settled_prefix() {
                        0 => lowest.after,
                        n => Some(lowest.recipients[n - 1].id),
                    };
                    let settled = pages.iter().flat_map(|p| p.latch.settled().map(|i| p.recipients[i].id));
                    Partly::new(upto, settled.chain(skipped)).map(Answered::Partly)
                }
                (None, Some(after)) => Partly::new(*after, skipped).map(Answered::Partly),
                (None, None) => Some(Answered::Whole),
            };
            (id, answered)
        }))
    }
}
