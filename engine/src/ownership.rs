//! Shard ownership across several nodes: the lease actor.
//!
//! Only when the store coordinates (ScyllaDB). Every `ttl / 3` the lease
//! actor renews the shards it owns, heartbeats this node, computes its fair
//! share `ceil(shard_count / live nodes)` (a renewal that finds another
//! owner means the shard is lost: its shard actor is killed at once, the
//! checkpoint stays where it is), acquires unowned shards while below the
//! share, and releases shards above it (the shard actor stops at its pages
//! in flight and stores the checkpoint above them, then the lease is
//! released). The owned set is published in a `watch` channel that ingest
//! reads: only an owner appends to a shard, so appends stay single-writer.
//! Two owners can overlap only briefly (a lease lost while its shard actor
//! finishes a step): both deliver from the same checkpoint, so a delivery may
//! repeat, never be skipped.
//!
//! Fencing: every owned shard carries a *local* lease deadline,
//! counted on this node's monotonic clock from the moment the acquiring or
//! renewing request was sent, minus a margin (see [`local_deadline`]). Ingest
//! and dispatch check it ([`Fence`]) before every step, so a node whose lease
//! round is late (a paused process, a slow store) stops appending to and
//! dispatching a shard before another node can take it over; nothing waits
//! for the lease actor to notice.
//!
//! A slow but live database: every lease request is bounded by a quarter
//! of the TTL ([`request_timeout`]), so a round ends in time for the next
//! one's renewals. A renewal that fails or is not answered in time is *in
//! doubt*, not lost: the lease may well still be this node's, so the shard
//! is kept (the fence stops its appends and dispatch at its local deadline
//! meanwhile) and the renewal is tried again at once, then every round;
//! only when the deadline passes without a renewal is the shard given up.
//! Each renewal's outcome is counted (`fanout_lease_renewals_total`).
//!
//! Leaving (a graceful stop, [`LeaseMsg::Leave`]): the node stops
//! acquiring, removes its heartbeat (so the others' fair share grows at
//! their next round), drains every owned shard as a release above the fair
//! share does and releases its leases, all while it still answers publishes:
//! those of its shards go to their next owner once it has one.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::domain::ShardId;
use crate::metrics::{LeaseRenewal, Metrics};
use crate::shard_owners::ShardOwners;
use crate::store::{NodeId, ShardLeases, StoreError};
use crate::supervision::SupervisorMsg;
use crate::ticker::spawn_ticker;

/// `[engine.lease]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseSettings {
    /// How long a shard lease and a node heartbeat live unless renewed; they
    /// are renewed every third of it. A dead node's shards move after this.
    #[serde(rename = "ttl_seconds", deserialize_with = "crate::duration::seconds")]
    pub ttl: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self { ttl: Duration::from_secs(10) }
    }
}

/// Lease requests (renewals, acquisitions, releases) in flight at once.
const RENEW_CONCURRENCY: usize = 16;

/// The bound on one lease request (and on the round's heartbeat and reads):
/// a quarter of the TTL, so that a round whose requests all hang still ends
/// within the third of the TTL before the next round's renewals.
pub fn request_timeout(ttl: Duration) -> Duration {
    ttl / 4
}

/// A lease operation bounded by [`request_timeout`].
async fn bounded<T>(ttl: Duration, op: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
    match tokio::time::timeout(request_timeout(ttl), op).await {
        Ok(result) => result,
        Err(_) => Err(StoreError::Backend(format!("no answer within {:?}", request_timeout(ttl)))),
    }
}

/// The shards this node owns, as the lease actor last decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedShards {
    /// Each owned shard with its local lease deadline.
    pub shards: BTreeMap<ShardId, Instant>,
    /// Shards being released above the fair share, with the deadline of the
    /// lease this node still holds: nothing more is appended to them, but
    /// their dispatch answers its pages in flight and records how far it
    /// got, so the next owner repeats none of it.
    pub draining: BTreeMap<ShardId, Instant>,
    /// The lease actor has completed at least one round.
    pub settled: bool,
    /// The node is leaving: it acquires nothing more and hands its shards over.
    pub leaving: bool,
}

impl OwnedShards {
    /// Owned, and its lease is surely still this node's at `now`: ingest
    /// may append to it (fencing).
    pub fn holds(&self, shard: ShardId, now: Instant) -> bool {
        self.shards.get(&shard).is_some_and(|deadline| now < *deadline)
    }

    /// Owned or draining, and its lease is surely still this node's at
    /// `now`: dispatch may go on with it.
    pub fn dispatches(&self, shard: ShardId, now: Instant) -> bool {
        self.holds(shard, now) || self.draining.get(&shard).is_some_and(|deadline| now < *deadline)
    }
}

/// Until when a lease requested at `sent` is surely still this node's. The
/// store counts the TTL from when it received the write and in whole seconds
/// (Cassandra truncates its clock to the second), so the row may expire up to
/// a second before `sent + ttl`; a tenth of the TTL more covers clock-rate
/// drift between this node and the store. Never more than half the TTL off.
pub fn local_deadline(sent: Instant, ttl: Duration) -> Instant {
    let margin = (Duration::from_secs(1) + ttl / 10).min(ttl / 2);
    sent + ttl - margin
}

/// Whether this node may still dispatch a shard: owned or draining, within
/// its local lease deadline. With one node (no leases) every shard is always
/// held.
#[derive(Clone, Default)]
pub struct Fence(Option<watch::Receiver<OwnedShards>>);

impl Fence {
    pub fn leased(owned: watch::Receiver<OwnedShards>) -> Self {
        Self(Some(owned))
    }

    pub fn holds(&self, shard: ShardId) -> bool {
        self.0.as_ref().is_none_or(|owned| owned.borrow().dispatches(shard, Instant::now()))
    }
}

/// Who this node is and how it leases.
#[derive(Clone)]
pub struct LeaseConfig {
    pub leases: Arc<dyn ShardLeases>,
    pub node: NodeId,
    /// The gRPC address other nodes' redirects name.
    pub address: String,
    pub ttl: Duration,
    pub shard_count: u16,
    /// Written only by the lease actor; ingest and readiness read it.
    pub owned: Arc<watch::Sender<OwnedShards>>,
    pub metrics: Arc<Metrics>,
}

/// What ingest needs on a leasing node: the shards it owns, and who owns
/// the others (to forward their envelopes there, or name the owner).
#[derive(Clone)]
pub struct ShardOwnership {
    pub owned: watch::Receiver<OwnedShards>,
    pub owners: Arc<ShardOwners>,
}

pub enum LeaseMsg {
    Round,
    /// Hand every shard over and take none again; answered once the leases
    /// are released (or the attempt failed: the TTL then frees them).
    Leave(RpcReplyPort<()>),
}

pub struct LeaseActor;

pub struct LeaseState {
    config: LeaseConfig,
    supervisor: ActorRef<SupervisorMsg>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Actor for LeaseActor {
    type Msg = LeaseMsg;
    type State = LeaseState;
    type Arguments = (LeaseConfig, ActorRef<SupervisorMsg>);

    async fn pre_start(
        &self,
        myself: ActorRef<LeaseMsg>,
        (config, supervisor): Self::Arguments,
    ) -> Result<LeaseState, ActorProcessingErr> {
        let every = (config.ttl / 3).max(Duration::from_millis(100));
        let ticker = spawn_ticker(myself, every, || LeaseMsg::Round);
        // A restarted lease actor keeps the owned set: it lives in the watch.
        Ok(LeaseState { config, supervisor, ticker })
    }

    async fn post_stop(&self, _: ActorRef<LeaseMsg>, state: &mut LeaseState) -> Result<(), ActorProcessingErr> {
        state.ticker.abort();
        // Stopping (drain or shutdown): give every lease up so another node
        // takes the shards without waiting for the TTL. Best effort.
        let owned = state.owned();
        state.config.owned.send_modify(|o| {
            o.shards.clear();
            o.draining.clear();
        });
        let release = async {
            for shard in owned {
                let _ = state.config.leases.release_lease(shard, &state.config.node).await;
            }
        };
        let _ = tokio::time::timeout(state.config.ttl, release).await;
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<LeaseMsg>,
        msg: LeaseMsg,
        state: &mut LeaseState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            // A leaving node's rounds would take shards back: none run.
            LeaseMsg::Round if state.config.owned.borrow().leaving => {}
            LeaseMsg::Round => {
                if let Err(e) = state.round().await {
                    tracing::warn!(error = %e, "lease round failed; trying again next round");
                }
            }
            LeaseMsg::Leave(reply) => {
                state.leave().await;
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

impl LeaseState {
    fn owned(&self) -> BTreeSet<ShardId> {
        self.config.owned.borrow().shards.keys().copied().collect()
    }

    /// A lease requested at `sent` was granted: move the local deadline.
    fn granted(&self, shard: ShardId, sent: Instant) {
        let deadline = local_deadline(sent, self.config.ttl);
        self.config.owned.send_modify(|o| {
            o.shards.insert(shard, deadline);
        });
    }

    /// One round, kept within about a third of the TTL so that the next
    /// round's renewals come in time: renewals, acquisitions, drains and
    /// releases each run concurrently (never one shard after another), and
    /// acquiring stops when the round's budget is spent (the next round goes
    /// on). A round that took a whole TTL would let this node's own leases
    /// lapse, and the fence would stop their dispatch.
    async fn round(&mut self) -> Result<(), StoreError> {
        let c = self.config.clone();
        let started = Instant::now();
        let budget = c.ttl / 3;
        // Renew first: nothing else in the round, a failing
        // heartbeat included, may keep owned leases from being renewed.
        // A renewal that fails or errs means the lease may be gone.
        self.renew(started, budget).await;
        bounded(c.ttl, c.leases.heartbeat(&c.node, &c.address, c.ttl)).await?;
        let live = bounded(c.ttl, c.leases.live_nodes()).await?.len().max(1);
        let target = usize::from(c.shard_count).div_ceil(live);
        // Acquire unowned shards while below the fair share, from a random
        // start, a batch at a time.
        if self.owned().len() < target {
            let taken: HashSet<ShardId> =
                bounded(c.ttl, c.leases.lease_owners()).await?.into_iter().map(|(s, _)| s).collect();
            let start = rand::random_range(0..c.shard_count);
            let mut free = ShardId::all(c.shard_count)
                .cycle()
                .skip(usize::from(start))
                .take(usize::from(c.shard_count))
                .filter(|s| !taken.contains(s));
            while self.owned().len() < target && started.elapsed() < budget {
                let want = (target - self.owned().len()).min(RENEW_CONCURRENCY);
                let batch: Vec<ShardId> = free.by_ref().take(want).collect();
                if batch.is_empty() {
                    break;
                }
                for (shard, outcome) in self.request_leases(batch).await {
                    if outcome? {
                        tracing::info!(shard = shard.index(), node = %c.node, "shard lease acquired");
                        let _ = self.supervisor.cast(SupervisorMsg::Own(shard));
                    }
                }
            }
        }
        // Release shards above the fair share: drain them (together, within
        // a third of the TTL), then release their leases.
        let extra = self.owned().len().saturating_sub(target);
        let released: Vec<ShardId> = self.owned().into_iter().rev().take(extra).collect();
        for shard in &released {
            tracing::info!(shard = shard.index(), node = %c.node, "releasing a shard above the fair share");
        }
        self.disown_all(&released, true).await;
        let releases = stream::iter(released)
            .map(|shard| bounded(c.ttl, c.leases.release_lease(shard, &c.node)))
            .buffer_unordered(RENEW_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        releases.into_iter().collect::<Result<Vec<()>, _>>()?;
        c.owned.send_modify(|o| o.settled = true);
        Ok(())
    }

    /// Hands every owned shard over: no more acquiring, the heartbeat gone
    /// (the others' next round counts this node out and takes the shards),
    /// each shard drained as a release above the fair share is (within a
    /// third of the TTL), then its lease released. Best effort: a lease not
    /// released here runs out after the TTL.
    async fn leave(&mut self) {
        let c = self.config.clone();
        c.owned.send_modify(|o| o.leaving = true);
        // Renewed first, so that the drain below never runs into a lease
        // deadline the last round left close.
        self.renew(Instant::now(), c.ttl / 3).await;
        let owned: Vec<ShardId> = self.owned().into_iter().collect();
        tracing::info!(node = %c.node, shards = owned.len(), "leaving: handing every shard over");
        if let Err(e) = bounded(c.ttl, c.leases.forget_node(&c.node)).await {
            tracing::warn!(error = %e, "leaving: the heartbeat could not be removed; it runs out after the TTL");
        }
        self.disown_all(&owned, true).await;
        let released = stream::iter(owned)
            .map(|shard| {
                let c = &c;
                async move { (shard, bounded(c.ttl, c.leases.release_lease(shard, &c.node)).await) }
            })
            .buffer_unordered(RENEW_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        for (shard, outcome) in released {
            match outcome {
                Ok(()) => tracing::info!(shard = shard.index(), node = %c.node, "shard lease released on leaving"),
                Err(e) => {
                    tracing::warn!(shard = shard.index(), error = %e, "leaving: lease not released; it runs out after the TTL")
                }
            }
        }
    }

    /// Renews every owned shard. One found owned by another node is lost
    /// at once; one in doubt (an error, no answer in time) is tried again
    /// at once while the round's budget lasts, and kept until its local
    /// deadline: only then is it lost (module docs).
    async fn renew(&self, started: Instant, budget: Duration) {
        let mut pending: Vec<ShardId> = self.owned().into_iter().collect();
        let mut lost = Vec::new();
        // At most one retry at once: the next round tries again.
        for _ in 0..2 {
            if pending.is_empty() {
                break;
            }
            let mut in_doubt = Vec::new();
            for (shard, outcome) in self.request_leases(std::mem::take(&mut pending)).await {
                let counted = match outcome {
                    Ok(true) => LeaseRenewal::Renewed,
                    Ok(false) => {
                        tracing::warn!(shard = shard.index(), "shard lease lost; stopping its dispatch");
                        lost.push(shard);
                        LeaseRenewal::Lost
                    }
                    Err(e) => {
                        let deadline = self.config.owned.borrow().shards.get(&shard).copied();
                        if deadline.is_none_or(|d| Instant::now() >= d) {
                            tracing::warn!(shard = shard.index(), error = %e, "shard lease lost; not renewed before its deadline, stopping its dispatch");
                            lost.push(shard);
                            LeaseRenewal::Lost
                        } else {
                            tracing::info!(shard = shard.index(), error = %e, "shard lease renewal in doubt; kept until its deadline and tried again");
                            in_doubt.push(shard);
                            LeaseRenewal::InDoubt
                        }
                    }
                };
                self.config.metrics.lease_renewed(counted);
            }
            if started.elapsed() + request_timeout(self.config.ttl) <= budget {
                pending = in_doubt;
            }
        }
        self.disown_all(&lost, false).await;
    }

    /// Acquires or renews `shards` concurrently, each bounded by
    /// [`request_timeout`]; each one granted gets its local deadline from
    /// the moment its request was sent.
    async fn request_leases(&self, shards: Vec<ShardId>) -> Vec<(ShardId, Result<bool, StoreError>)> {
        let c = &self.config;
        let outcomes: Vec<_> = stream::iter(shards)
            .map(|shard| async move {
                let sent = Instant::now();
                (shard, sent, bounded(c.ttl, c.leases.acquire_lease(shard, &c.node, &c.address, c.ttl)).await)
            })
            .buffer_unordered(RENEW_CONCURRENCY)
            .collect()
            .await;
        outcomes
            .into_iter()
            .map(|(shard, sent, outcome)| {
                if matches!(outcome, Ok(true)) {
                    self.granted(shard, sent);
                }
                (shard, outcome)
            })
            .collect()
    }

    /// Stops publishing to and dispatching `shards` at once, then stops
    /// their shard actors together: released (each stops once its pages in
    /// flight are answered, storing the checkpoint above them, all within a
    /// third of the TTL) or killed.
    async fn disown_all(&self, shards: &[ShardId], drain: bool) {
        if shards.is_empty() {
            return;
        }
        // Appends stop now. A released shard's dispatch goes on while its
        // lease is still this node's, so that its pages in flight are
        // answered and recorded rather than left for the next owner to repeat.
        self.config.owned.send_modify(|o| {
            for shard in shards {
                if let Some(deadline) = o.shards.remove(shard)
                    && drain
                {
                    o.draining.insert(*shard, deadline);
                }
            }
        });
        let wait = self.config.ttl / 3;
        let stops = shards.iter().map(|&shard| async move {
            let reply =
                self.supervisor.call(|port| SupervisorMsg::Disown { shard, drain, reply: port }, Some(wait)).await;
            if let Ok(CallResult::Success(Some(cell))) = reply {
                stop_shard_actor(cell, drain, wait).await;
            }
        });
        futures::future::join_all(stops).await;
        self.config.owned.send_modify(|o| {
            for shard in shards {
                o.draining.remove(shard);
            }
        });
    }
}

async fn stop_shard_actor(cell: ActorCell, drain: bool, wait: Duration) {
    if drain && cell.wait(Some(wait)).await.is_ok() {
        return;
    }
    let _ = cell.kill_and_wait(Some(wait)).await;
}

#[cfg(test)]
mod tests {
    //! Lease rounds against an in-memory lease table with TTLs on tokio's
    //! paused clock, and a stand-in supervisor.

    use tokio::time::Instant;

    use super::*;
    use crate::testing::{MemoryLeases, StandIn};

    const TTL: Duration = Duration::from_secs(9);

    async fn node(leases: &Arc<MemoryLeases>, shard_count: u16) -> LeaseState {
        let (supervisor, _) = StandIn::start().await;
        let (owned, _) = watch::channel(OwnedShards::default());
        let config = LeaseConfig {
            leases: leases.clone(),
            node: NodeId::random(),
            address: "a:1".into(),
            ttl: TTL,
            shard_count,
            owned: Arc::new(owned),
            metrics: Arc::new(Metrics::new()),
        };
        LeaseState { config, supervisor, ticker: tokio::spawn(async {}) }
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_split_the_shards_by_fair_share_and_take_over_a_dead_one() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 10).await;
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 10, "alone: every shard");
        assert!(a.config.owned.borrow().settled);

        let mut b = node(&leases, 10).await;
        b.round().await.unwrap();
        assert_eq!(b.owned().len(), 0, "all taken");
        a.round().await.unwrap(); // two live nodes now: a releases down to 5
        assert_eq!(a.owned().len(), 5);
        b.round().await.unwrap();
        assert_eq!(b.owned().len(), 5);
        assert!(a.owned().is_disjoint(&b.owned()), "one owner per shard");

        // a stops renewing; after the TTL b takes its shards.
        tokio::time::advance(TTL + Duration::from_secs(1)).await;
        b.round().await.unwrap();
        assert_eq!(b.owned().len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_by_another_node_is_dropped_at_the_next_renewal() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 2).await;
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 2);
        // Another node holds shard 0 now (a's lease expired meanwhile).
        leases.leases.lock().unwrap().insert(ShardId::FIRST, (NodeId("other".into()), Instant::now() + TTL));
        a.round().await.unwrap();
        assert!(!a.owned().contains(&ShardId::FIRST), "lost, so disowned");
        assert!(a.owned().contains(&ShardId::parse(1, 2).unwrap()));
    }

    #[tokio::test(start_paused = true)]
    async fn leases_are_renewed_even_when_the_heartbeat_fails() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 2).await;
        a.round().await.unwrap();
        leases.failing_heartbeats.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::advance(TTL / 2).await;
        assert!(a.round().await.is_err(), "the heartbeat failed");
        // Past the first lease's TTL, within the renewal's: still a's.
        tokio::time::advance(TTL / 2 + Duration::from_secs(1)).await;
        let other = NodeId("other".into());
        assert!(!leases.acquire_lease(ShardId::FIRST, &other, "o:1", TTL).await.unwrap());
        assert_eq!(a.owned().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_is_held_only_until_its_local_deadline_unless_renewed() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 1).await;
        let fence = Fence::leased(a.config.owned.subscribe());
        a.round().await.unwrap();
        assert!(fence.holds(ShardId::FIRST));
        // The deadline is before the store's expiry: 9 s TTL, 1.9 s margin.
        let deadline = a.config.owned.borrow().shards[&ShardId::FIRST];
        assert_eq!(deadline - Instant::now(), Duration::from_millis(7100));
        // A round every third of the TTL keeps it held.
        for _ in 0..5 {
            tokio::time::advance(TTL / 3).await;
            a.round().await.unwrap();
            assert!(fence.holds(ShardId::FIRST));
        }
        // No round (a paused process, a hung store): fenced before the lease
        // can expire on the store and another node take the shard.
        tokio::time::advance(Duration::from_millis(7100)).await;
        assert!(!fence.holds(ShardId::FIRST));
        let other = NodeId("other".into());
        assert!(!leases.acquire_lease(ShardId::FIRST, &other, "o:1", TTL).await.unwrap(), "still a's on the store");
        assert!(Fence::default().holds(ShardId::FIRST), "one node: always held");
    }

    fn renewals(a: &LeaseState, outcome: &str) -> u64 {
        a.config.metrics.lease_renewals.with_label_values(&[outcome]).get()
    }

    /// A database that fails or stalls lease requests (a lost or paused
    /// node, a slow cluster): each renewal is in doubt, the shard kept and
    /// dispatched until its local deadline, and renewed again once the
    /// database answers; only a deadline passed unrenewed loses it.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_in_doubt_keeps_the_shard_until_its_deadline() {
        use std::sync::atomic::Ordering::SeqCst;
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 2).await;
        let fence = Fence::leased(a.config.owned.subscribe());
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 2);

        leases.failing_leases.store(true, SeqCst);
        tokio::time::advance(TTL / 3).await;
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 2, "in doubt: kept");
        assert!(fence.holds(ShardId::FIRST));
        assert_eq!(renewals(&a, "in_doubt"), 4, "each shard tried again at once");

        // Answering again before the deadline: renewed, never lost.
        leases.failing_leases.store(false, SeqCst);
        tokio::time::advance(TTL / 3).await;
        a.round().await.unwrap();
        assert_eq!((a.owned().len(), renewals(&a, "renewed"), renewals(&a, "lost")), (2, 2, 0));

        // Stalled: every request ends at a quarter of the TTL, the round within a third.
        leases.stalled_leases.store(true, SeqCst);
        tokio::time::advance(TTL / 3).await;
        let started = Instant::now();
        a.round().await.unwrap();
        let took = started.elapsed();
        assert!(took <= TTL / 3, "{took:?}");
        assert_eq!((a.owned().len(), renewals(&a, "lost")), (2, 0));
        leases.stalled_leases.store(false, SeqCst);
        tokio::time::advance(TTL / 3 - took).await;
        a.round().await.unwrap();
        assert_eq!((renewals(&a, "renewed"), renewals(&a, "lost")), (4, 0));

        // Failing past the deadline (7.1 s after the last renewal was sent): lost.
        leases.failing_leases.store(true, SeqCst);
        for _ in 0..3 {
            tokio::time::advance(TTL / 3).await;
            // The last round's acquisitions fail too.
            let _ = a.round().await;
        }
        assert_eq!((a.owned().len(), renewals(&a, "lost")), (0, 2));
        assert!(!fence.holds(ShardId::FIRST));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_shard_is_dispatched_while_it_drains_and_never_appended_to() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 2).await;
        a.supervisor = StandIn::with_stuck_shards().await;
        a.round().await.unwrap();
        let mut b = node(&leases, 2).await;
        b.round().await.unwrap(); // two live nodes: a's next round releases one shard
        let (fence, owned) = (Fence::leased(a.config.owned.subscribe()), a.config.owned.subscribe());
        let released = ShardId::parse(1, 2).unwrap();
        let round = tokio::spawn(async move { a.round().await });
        // The stuck shard actor drains for a third of the TTL, then is killed.
        tokio::time::sleep(TTL / 6).await;
        assert!(!owned.borrow().holds(released, Instant::now()), "no appends once it is being released");
        assert!(fence.holds(released), "its dispatch answers what it has in flight");
        assert!(fence.holds(ShardId::FIRST));
        round.await.unwrap().unwrap();
        assert!(!fence.holds(released), "released: no dispatch either");
        assert!(fence.holds(ShardId::FIRST), "the kept shard is untouched");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaving_node_hands_every_shard_over_at_once_and_takes_none_back() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 4).await;
        a.round().await.unwrap();
        let mut b = node(&leases, 4).await;
        b.round().await.unwrap();
        a.round().await.unwrap();
        b.round().await.unwrap();
        assert_eq!((a.owned().len(), b.owned().len()), (2, 2));

        a.leave().await;
        assert!(a.owned().is_empty() && a.config.owned.borrow().leaving);
        assert_eq!(leases.live_nodes().await.unwrap(), vec![b.config.node.clone()], "a's heartbeat is gone");
        // b's next round, well within the TTL: every shard is b's.
        b.round().await.unwrap();
        assert_eq!(b.owned().len(), 4, "taken without waiting for a's leases to run out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_that_releases_many_slow_shards_stays_within_a_third_of_the_ttl() {
        let leases = Arc::new(MemoryLeases::default());
        let mut a = node(&leases, 32).await;
        a.supervisor = StandIn::with_stuck_shards().await;
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 32);
        let mut b = node(&leases, 32).await;
        b.round().await.unwrap();
        // Two live nodes: a releases 16 shards whose actors never drain.
        let started = Instant::now();
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 16);
        let took = started.elapsed();
        assert!(
            took <= TTL / 3 + Duration::from_millis(100),
            "one drain bound for all of them, not one each: {took:?}"
        );
        // The shards a keeps are still its own on the store, renewed in time.
        tokio::time::advance(TTL / 3).await;
        a.round().await.unwrap();
        assert_eq!(a.owned().len(), 16, "nothing lapsed");
    }
}
