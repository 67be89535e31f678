//! The ScyllaDB backend (DESIGN.md, storage): the `scylla` driver against
//! ScyllaDB or Apache Cassandra, which speak the same CQL protocol.
//!
//! Schema: `engine/schema/scylla/NNN_*.cql` (001 to 010), applied
//! in order (`schema.rs`) by [`ScyllaStore::connect`] when `migrate` is set, or
//! by `fanout migrate`. Every statement is
//! prepared once at connect; the driver's default load balancing is token
//! aware, so each goes to a replica of its partition. Range reads page.
//!
//! # Parts
//!
//! [`ScyllaStore`] keeps the recipients, their subscriptions and the shard
//! leases itself, and holds one store per other concern, each with its own
//! statements over the one session: the shard log (`log.rs`, `ShardLog`),
//! the relay ingress's records (`relay.rs`, `ScyllaRelay`, handed out by
//! `Store::relay`), the push gateway's (`gateway.rs`, `ScyllaGateway`,
//! handed out by `Store::gateway`) and the parked deliveries (`parked.rs`,
//! `ScyllaParked`, handed out by `Store::parked`). What they share sits below them all in
//! `cql.rs` (the retried conditional write, errors, write timestamps, TTLs);
//! rows become domain values in `codec.rs`. None of them imports this file.
//!
//! # Atomicity
//!
//! CQL has no multi-partition transactions, so each `Store` call is built from
//! at most one single-partition lightweight transaction (LWT, Paxos) plus
//! ordering rules; the shard log has none per append:
//!
//! - **Recipients** (PUSH-207/216/217/234/255): a recipient and all of its
//!   subscriptions share one partition of `recipients` (static columns for the
//!   recipient). Each mutating call reads the partition's random `version`
//!   at LOCAL_QUORUM, decides (existence, secret hash, topic limit, start
//!   positions), and writes everything in ONE conditional batch
//!   `IF version = <read>` that also sets a new random version: one LWT per
//!   RPC. A concurrent change (or a stale read) makes the batch not apply;
//!   the call then reads again and starts over, so nothing is ever half
//!   applied and a failed check (`SecretMismatch`, `TopicLimit`) writes
//!   nothing to the partition.
//! - **Dispatch index** (`topic_subscriptions`, one partition per topic): it
//!   cannot join the LWT, being another partition. Its rows are only an
//!   index: dispatch joins every row with the recipient partition (the truth)
//!   and skips a row whose recipient or subscription is gone. The order makes
//!   a crash harmless: an add writes its topic row *before* the batch that
//!   stores the subscription, and a remove (or a recipient delete) deletes the
//!   topic row *after* its batch, with a write timestamp taken before that
//!   batch, so it can never erase the row of a later re-add (whose row is
//!   written after it read the newer version). A crash in between leaves at
//!   worst a dangling row, which dispatch skips; a stored subscription is
//!   never invisible to dispatch. The timestamps are not any node's wall
//!   clock alone: each change takes max(wall clock, the
//!   recipient's `index_clocks` value + 1) and writes it back before its
//!   batch, so a later change of the same recipient on a node whose clock
//!   runs behind still writes with a later timestamp (`index_timestamp`).
//! - **Dispatch copies** (schema 9): an index row also carries a copy of
//!   its subscriber as `subscribers` returns it (the recipient's secret
//!   hash, target, renewal time and topic count, the subscription's start
//!   position, key window and include_commits), so a page of subscribers
//!   is one read of the topic's partition instead of one read of every
//!   subscriber's. The recipient
//!   partition stays the truth, and a copy is trusted only when nothing can
//!   have made it stale:
//!   1. A change that makes copies stale (a replaced or removed
//!      subscription, a new target, a recipient delete) first writes a
//!      *mark* per affected row to `topic_pending`, then runs its
//!      conditional batch, then writes the rows' copies (or deletes the
//!      rows) with its index timestamp, and only then deletes its marks. A
//!      batch that did not apply deletes them at once; a failure or a
//!      crash in between leaves them. A new subscription needs no mark: its
//!      row has no copy until the change writes one after its batch.
//!   2. Dispatch reads the topic's marks after its cursor *before* the
//!      page, and joins every marked row, and every row without a copy,
//!      with its recipient partition as before. A change whose mark that
//!      read missed had not started its batch when the read began.
//!   3. Of the copies written to one row, the one of the latest batch
//!      wins: every change reads the recipient's index clock only after
//!      the version its batch is conditioned on (`read_index_clock`) and
//!      writes its timestamp back before that batch, so a change whose
//!      batch applies after another's has the larger timestamp.
//!
//!   So a trusted copy is the truth as of the marks read, or a change that
//!   was still running then. The renewal time and topic count, which every
//!   Register and UpdateSubscriptions changes, are rewritten in all of the
//!   recipient's rows after the batch but not marked: dispatch decides
//!   nothing on them, and a change that fails after its batch leaves them
//!   one change behind. A mark left behind costs its row a join per
//!   page, nothing else; rows written before schema 9 have no copy and are
//!   joined.
//!   4. A mark left behind is cleared (`clear_copy_marks`, run by the
//!      retention pass for marks seen long before) by a change with
//!      nothing to change: its recipient's version is bumped in a
//!      conditional write on the version read, after the subscriptions
//!      and the index clock were read and its timestamp written back, so
//!      the interrupted change can no longer apply; the marked rows are
//!      set from what was read at that timestamp; the marks go last.
//! - **PUSH-216 start position**: a new topic's start position is its shard's
//!   boundary read at LOCAL_QUORUM after the recipient read (beside the read
//!   of the topics already stored) and before the conditional batch. On this
//!   backend "read in the transaction" holds up to the LWT: an envelope whose
//!   append settles between that read and the batch may be missed by the new
//!   subscription — the spec's known limitation for an envelope settled
//!   while the subscription's transaction was open. It is never delivered
//!   an envelope settled before it subscribed.
//! - **Sequence ids, boundary, checkpoint** (`log.rs`, schema 7): the lease
//!   holder claims a term per shard (one conditional insert per term), then
//!   allocates ids and moves the boundary in memory and writes plain
//!   per-partition batches, side by side, fenced by the term (readers
//!   ignore a former owner's writes) and by ingest's lease-deadline check
//!   before acknowledging. The checkpoint is a plain write whose value is its
//!   own write timestamp, so it never moves back.
//! - **Shard leases**: `shard_leases` rows live for a TTL; acquire
//!   is `INSERT … IF NOT EXISTS USING TTL`, renewal `UPDATE … USING TTL …
//!   IF owner = ?`, release `DELETE … IF owner = ?`, so at most one node holds
//!   a shard's lease at a time. Node heartbeats go to `nodes` with a TTL.
//!   Only the lease holder appends (ingest checks), which keeps the
//!   single-writer rule above; a lease newly acquired, lost or in doubt makes
//!   this process claim a new term at its next append.
//!
//! Driver and server errors become `StoreError::Backend` with a fixed label;
//! CQL error texts name statements and tables, not bound values.

mod codec;
mod cql;
mod gateway;
mod log;
mod parked;
mod relay;
mod schema;
mod settings;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::{self, TryStreamExt};
use futures::{FutureExt, StreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session::TlsContext;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::speculative_execution::SimpleSpeculativeExecutionPolicy;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};

pub use self::settings::{Keyspace, LogConsistency, Nodes, ScyllaSettings};

use self::codec::{Versioned, corrupt, from_db, to_db};
use self::cql::{
    Execute, FaultRetry, JOIN_CONCURRENCY, Lwt, PAGE_ROWS, Values, WriteClock, all_ok, all_rows, at, backoff, be,
    first_row, retried, retry, rows, statements,
};
use self::gateway::ScyllaGateway;
use self::log::ShardLog;
use self::parked::ScyllaParked;
use self::relay::ScyllaRelay;
use super::recipient_cache::{self, RecipientCache};
use super::{
    Appended, CopyMark, LeaseHolder, LiveNode, NodeId, RegistrationRemoval, ShardLeases, ShardPosition, Store,
    StoreError,
};
use crate::domain::{
    DeliveryTarget, NewEnvelope, Recipient, RecipientId, RecipientSummary, SecretHash, ShardId, ShardProgress,
    StoredEnvelope, StoredSubscription, Subscriber, SubscriptionUpdate, Topic,
};

/// Tries of the fence that clears a recipient's marks (`clear_marks_of`)
/// before they are left for the next call: a recipient that keeps changing
/// has live marks of its own anyway.
const FENCE_ATTEMPTS: u32 = 3;
/// How far past this node's clock a cleared mark's tombstone is dated: a
/// mark row is written at the clock of the node that ran its change, which
/// may run ahead of this one, and a tombstone dated before the row would
/// not delete it. Marks are random per change and never written again.
const MARK_DELETE_MARGIN_MICROS: i64 = 24 * 3600 * 1_000_000;
/// How often the driver checks each connection with a CQL keepalive, and
/// how long one may go unanswered before the connection is closed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(4);
/// Recipient partitions one join read names (`recipient_id IN ?`).
const JOIN_IN: usize = 50;
/// Join reads of one page at once.
const JOIN_READS: usize = 4;
/// Marks one subscriber page reads at most; beyond, it joins every row.
const MAX_MARKS: usize = 10_000;
/// Most adds plus removes one UpdateSubscriptions can apply: all of them go in
/// one conditional batch, and the CQL protocol counts a batch's statements in
/// 16 bits (one statement is the recipient's own update).
pub const MAX_SUBSCRIPTION_CHANGES: usize = u16::MAX as usize - 1;

/// The ScyllaDB / Cassandra `Store`, in parts (module docs, "Parts").
pub struct ScyllaStore {
    session: Arc<Session>,
    keyspace: String,
    shard_count: u16,
    st: Statements,
    log: ShardLog,
    relay: ScyllaRelay,
    gateway: ScyllaGateway,
    parked: ScyllaParked,
    /// The dispatch index's write timestamps, shared with the gateway's
    /// target index and the parked deliveries.
    clock: Arc<WriteClock>,
    /// Dispatch's decoded recipients, by a copy's recipient columns or a
    /// joined row's partition version.
    recipients: RecipientCache,
}

const STATIC_COLS: &str = "version, secret_hash, channel, target, signing_key, renewed_at, topic_count";
const SUB_COLS: &str = "start_position, include_commits, hmac_epoch_base, hmac_keys";
/// A dispatch index row's copy of its subscriber (schema 9).
const COPY_COLS: &str = "secret_hash, channel, target, signing_key, start_position, include_commits, \
                         hmac_epoch_base, hmac_keys, renewed_at, topic_count";

// Dispatch's reads of subscribers run at `store.scylla.consistency.reads`.
// The recipients' conditional writes decide on the session's LOCAL_QUORUM
// reads: a stale one fails its condition and reads again.
statements! {
    /// Every prepared statement.
    struct Statements;
    fn prepare(session, ks, consistency: LogConsistency);
    // DISTINCT reads only the static row: no walk over the row tombstones
    // that removed subscriptions leave behind.
    static_read: "SELECT DISTINCT {STATIC_COLS} FROM {ks}.recipients WHERE recipient_id = ?",
    topics_read: "SELECT topic FROM {ks}.recipients WHERE recipient_id = ?",
    subs_read: "SELECT topic, {SUB_COLS} FROM {ks}.recipients WHERE recipient_id = ?",
    starts_read: "SELECT topic, start_position FROM {ks}.recipients WHERE recipient_id = ?",
    join_read: "SELECT recipient_id, {STATIC_COLS}, {SUB_COLS} FROM {ks}.recipients \
                WHERE recipient_id IN ? AND topic = ?" => at(consistency.reads.cql()),
    expired_scan: "SELECT DISTINCT recipient_id, renewed_at FROM {ks}.recipients",
    // Conditional on the version read, setting a new one: retried by the
    // driver (cql.rs, "Retried inside the engine").
    create_recipient: "UPDATE {ks}.recipients SET version = ?, secret_hash = ?, channel = ?, target = ?, \
                       signing_key = ?, renewed_at = ?, topic_count = 0 WHERE recipient_id = ? IF version = null"
        => retried,
    renew_recipient: "UPDATE {ks}.recipients SET version = ?, channel = ?, target = ?, signing_key = ?, \
                      renewed_at = ? WHERE recipient_id = ? IF version = ?" => retried,
    update_statics: "UPDATE {ks}.recipients SET version = ?, renewed_at = ?, topic_count = ? \
                     WHERE recipient_id = ? IF version = ?",
    put_sub: "INSERT INTO {ks}.recipients (recipient_id, topic, start_position, include_commits, \
              hmac_epoch_base, hmac_keys) VALUES (?, ?, ?, ?, ?, ?)",
    del_sub: "DELETE FROM {ks}.recipients WHERE recipient_id = ? AND topic = ?",
    // CQL refuses a conditional delete of a whole partition: the statics
    // go with the condition, the rows with a range delete in the same batch.
    delete_statics: "DELETE {STATIC_COLS} FROM {ks}.recipients WHERE recipient_id = ? IF version = ?",
    delete_rows: "DELETE FROM {ks}.recipients WHERE recipient_id = ?",
    topic_row_put: "INSERT INTO {ks}.topic_subscriptions (topic, recipient_id) VALUES (?, ?) USING TIMESTAMP ?",
    topic_row_del: "DELETE FROM {ks}.topic_subscriptions USING TIMESTAMP ? WHERE topic = ? AND recipient_id = ?",
    topic_page: "SELECT recipient_id, {COPY_COLS} FROM {ks}.topic_subscriptions WHERE topic = ?"
        => at(consistency.reads.cql()),
    clock_read: "SELECT clock FROM {ks}.index_clocks WHERE recipient_id = ?",
    // The value is its own write timestamp: last-write-wins keeps the largest.
    clock_put: "INSERT INTO {ks}.index_clocks (recipient_id, clock) VALUES (?, ?) USING TIMESTAMP ?",
    topic_page_after: "SELECT recipient_id, {COPY_COLS} FROM {ks}.topic_subscriptions \
                       WHERE topic = ? AND recipient_id > ?" => at(consistency.reads.cql()),
    // Dispatch copies and their marks (module docs, "Dispatch copies").
    copy_put: "INSERT INTO {ks}.topic_subscriptions (topic, recipient_id, {COPY_COLS}) \
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?",
    copy_renew: "UPDATE {ks}.topic_subscriptions USING TIMESTAMP ? SET renewed_at = ?, topic_count = ? \
                 WHERE topic = ? AND recipient_id = ?",
    mark_put: "INSERT INTO {ks}.topic_pending (topic, recipient_id, mark) VALUES (?, ?, ?) USING TIMESTAMP ?",
    mark_del: "DELETE FROM {ks}.topic_pending USING TIMESTAMP ? WHERE topic = ? AND recipient_id = ? AND mark = ?",
    marks_read: "SELECT recipient_id FROM {ks}.topic_pending WHERE topic = ? AND recipient_id > ?"
        => at(consistency.reads.cql()),
    // Clearing marks a change left behind (`clear_copy_marks`): every mark,
    // then a fence on the recipient's version (or on its absence).
    marks_all: "SELECT topic, recipient_id, mark FROM {ks}.topic_pending",
    fence: "UPDATE {ks}.recipients SET version = ? WHERE recipient_id = ? IF version = ?",
    fence_absent: "UPDATE {ks}.recipients SET version = null WHERE recipient_id = ? IF version = null",
    // Shard leases: a lease is a row that lives for its TTL; every change is
    // an LWT on its owner, retried by the driver (cql.rs).
    lease_insert: "INSERT INTO {ks}.shard_leases (shard, owner, owner_address, acquired_at) \
                   VALUES (?, ?, ?, toTimestamp(now())) IF NOT EXISTS USING TTL ?" => retried,
    lease_renew: "UPDATE {ks}.shard_leases USING TTL ? SET owner = ?, owner_address = ?, \
                  acquired_at = toTimestamp(now()) WHERE shard = ? IF owner = ?" => retried,
    lease_release: "DELETE FROM {ks}.shard_leases WHERE shard = ? IF owner = ?" => retried,
    lease_read: "SELECT owner, owner_address FROM {ks}.shard_leases WHERE shard = ?" => at(Consistency::LocalSerial),
    lease_all: "SELECT shard, owner FROM {ks}.shard_leases",
    node_put: "INSERT INTO {ks}.nodes (node, address, seen_at) VALUES (?, ?, toTimestamp(now())) USING TTL ?",
    node_all: "SELECT node FROM {ks}.nodes",
    node_delete: "DELETE FROM {ks}.nodes WHERE node = ?",
    // For operators (`fanout cluster status`).
    lease_details: "SELECT shard, owner, owner_address, TTL(owner) FROM {ks}.shard_leases",
    node_details: "SELECT node, address FROM {ks}.nodes",
}

/// A lease or heartbeat TTL in whole seconds, at least one.
fn ttl_secs(ttl: Duration) -> i32 {
    i32::try_from(ttl.as_secs().max(1)).unwrap_or(i32::MAX)
}

fn new_version() -> i64 {
    rand::random()
}

/// A logged batch for one recipient's conditional change, retried by the
/// driver: conditioned on the version read, it sets a new one (cql.rs,
/// "Retried inside the engine").
fn conditional_batch() -> Batch {
    let mut batch = Batch::new(BatchType::Logged);
    batch.set_is_idempotent(true);
    batch
}

impl ScyllaStore {
    /// Connects to the cluster, applies the schema when `settings.migrate` is
    /// set (else requires it to be in place), records the shard count on first
    /// use and refuses another one later, and prepares every statement.
    pub async fn connect(settings: &ScyllaSettings, shard_count: u16) -> Result<Self, StoreError> {
        if shard_count == 0 {
            return Err(StoreError::Backend("shard count must be at least 1".into()));
        }
        let timeout = settings.request_timeout;
        // A lost or stalled node (cql.rs, "Retried inside the engine"): an
        // idempotent request is retried on the next node when its
        // connection breaks or its coordinator times out, and sent to the
        // next one as well when its node is silent for `speculative_after`
        // (up to every replica of three).
        let speculative =
            SimpleSpeculativeExecutionPolicy { max_retry_count: 2, retry_interval: settings.speculative_after };
        let profile = ExecutionProfile::builder()
            .consistency(Consistency::LocalQuorum)
            .serial_consistency(Some(SerialConsistency::LocalSerial))
            .request_timeout(Some(timeout))
            .retry_policy(Arc::new(FaultRetry))
            .speculative_execution_policy(Some(Arc::new(speculative)))
            .build()
            .into_handle();
        let mut builder = SessionBuilder::new()
            .known_nodes(settings.nodes.as_slice())
            .default_execution_profile_handle(profile)
            .connection_timeout(timeout.min(Duration::from_secs(10)))
            // A stalled node (SIGSTOP, a long GC pause, a partition) keeps
            // its connections open: a keepalive unanswered for
            // KEEPALIVE_TIMEOUT closes them, and requests go to the other
            // nodes first until it answers again.
            .keepalive_interval(KEEPALIVE_INTERVAL)
            .keepalive_timeout(KEEPALIVE_TIMEOUT);
        // TLS and password authentication to the nodes.
        if let Some(tls) = &settings.tls {
            let config = crate::transport::client_tls_config(&tls.ca_files).map_err(StoreError::Backend)?;
            builder = builder.tls_context(Some(TlsContext::Rustls023(Arc::new(config))));
        }
        if let Some((user, password)) = settings.credentials().map_err(StoreError::Backend)? {
            builder = builder.user(user, password);
        }
        let session = Arc::new(builder.build().await.map_err(be("cannot connect"))?);
        if settings.migrate {
            schema::migrate(&session, &settings.keyspace, &settings.replication).await?;
        } else {
            schema::check(&session, &settings.keyspace).await?;
        }
        let keyspace = settings.keyspace.to_string();
        check_shard_count(&session, &keyspace, shard_count).await?;
        let st = Statements::prepare(&session, &keyspace, settings.consistency).await?;
        let log = ShardLog::prepare(&session, &keyspace, settings.consistency, shard_count).await?;
        let relay = ScyllaRelay::prepare(&session, &keyspace).await?;
        let clock = Arc::new(WriteClock::default());
        let gateway = ScyllaGateway::prepare(&session, &keyspace, Arc::clone(&clock)).await?;
        let parked = ScyllaParked::prepare(&session, &keyspace, shard_count, Arc::clone(&clock)).await?;
        let recipients = RecipientCache::new(recipient_cache::CAPACITY);
        Ok(Self { session, keyspace, shard_count, st, log, relay, gateway, parked, clock, recipients })
    }

    pub fn shard_count(&self) -> u16 {
        self.shard_count
    }

    pub fn keyspace(&self) -> &str {
        &self.keyspace
    }

    /// The schema version this binary applies and needs.
    pub fn schema_version() -> i32 {
        schema::latest()
    }

    /// Drops this store's keyspace and everything in it. For tests.
    pub async fn drop_keyspace(&self) -> Result<(), StoreError> {
        self.session
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {}", self.keyspace), ())
            .await
            .map_err(be("dropping the keyspace"))?;
        Ok(())
    }

    fn check_shard(&self, shard: ShardId) -> Result<(), StoreError> {
        super::check_shard(shard, self.shard_count)
    }

    // ---- recipients ----

    async fn read_static(&self, id: &RecipientId) -> Result<Option<Versioned>, StoreError> {
        let row = first_row(&self.session, &self.st.static_read, (id.as_bytes().as_slice(),), "reading a recipient");
        let Some(row) = row.await? else { return Ok(None) };
        codec::decode_static(*id, row)
    }

    /// Every topic stored in a recipient's partition.
    async fn read_topics(&self, id: &RecipientId) -> Result<Vec<Vec<u8>>, StoreError> {
        let rows = rows(&self.session, &self.st.topics_read, (id.as_bytes().as_slice(),), "reading subscriptions");
        rows.await?.try_filter_map(|(topic,)| async move { Ok(topic) }).try_collect().await
    }

    /// Every topic stored in a recipient's partition, with its start position.
    async fn read_starts(&self, id: &RecipientId) -> Result<HashMap<Vec<u8>, u64>, StoreError> {
        let rows = rows(&self.session, &self.st.starts_read, (id.as_bytes().as_slice(),), "reading subscriptions");
        let stored = |(topic, start): (Option<Vec<u8>>, Option<i64>)| async move {
            Ok(topic.zip(start).map(|(topic, start)| (topic, from_db(start))))
        };
        rows.await?.try_filter_map(stored).try_collect().await
    }

    /// The write timestamp of one change of `id`'s dispatch index rows:
    /// later than this node's last one and than any earlier change of `id`
    /// on any node, whatever their clocks say. Written back before the
    /// change's conditional batch, so every change whose batch applies after
    /// this one's reads it (quorum write, then quorum read).
    async fn index_timestamp(&self, id: &RecipientId) -> Result<i64, StoreError> {
        let ts = self.next_index_timestamp(self.read_index_clock(id).await?);
        self.put_index_clock(id, ts).await?;
        Ok(ts)
    }

    /// The index clock of `id` as stored. Read once the version it guards
    /// has been read, never beside it: a change whose batch applied before
    /// the version read wrote its clock before that batch, so this read sees
    /// it; one that applies after fails the version check. Read beside the
    /// version, this read could be answered before such a change wrote its
    /// clock while the version read saw its batch, and on a node whose clock
    /// runs behind a re-add could then take a timestamp below the earlier
    /// remove's, which would erase its index row.
    async fn read_index_clock(&self, id: &RecipientId) -> Result<Option<i64>, StoreError> {
        let values = (id.as_bytes().as_slice(),);
        let row = first_row(&self.session, &self.st.clock_read, values, "reading an index clock").await?;
        Ok(row.and_then(|(clock,): (Option<i64>,)| clock))
    }

    fn next_index_timestamp(&self, stored: Option<i64>) -> i64 {
        self.clock.next().max(stored.map_or(i64::MIN, |c| c.saturating_add(1)))
    }

    async fn put_index_clock(&self, id: &RecipientId, ts: i64) -> Result<(), StoreError> {
        self.session.write(&self.st.clock_put, (id.as_bytes().as_slice(), ts, ts)).await
    }

    /// The boundaries of `shards`, read concurrently.
    async fn boundaries(&self, shards: BTreeSet<ShardId>) -> Result<HashMap<ShardId, u64>, StoreError> {
        let reads =
            shards.into_iter().map(|shard| async move { Ok((shard, self.log.position(shard).await?.boundary)) });
        stream::iter(reads).buffer_unordered(JOIN_CONCURRENCY).try_collect().await
    }

    /// Writes the dispatch index rows of `topics` (before the batch that stores them).
    async fn put_topic_rows(&self, id: &RecipientId, topics: &[&[u8]], ts: i64) -> Result<(), StoreError> {
        self.write_each(&self.st.topic_row_put, topics.iter().map(|t| (*t, id.as_bytes().as_slice(), ts))).await
    }

    /// Runs `st` once with each of `values`, [`JOIN_CONCURRENCY`] at once;
    /// the first error wins.
    async fn write_each<'a, V: SerializeRow + Send + 'a>(
        &'a self,
        st: &'a PreparedStatement,
        values: impl IntoIterator<Item = V>,
    ) -> Result<(), StoreError> {
        let writes: Vec<BoxFuture<'a, Result<(), StoreError>>> =
            values.into_iter().map(|v| self.session.write(st, v).boxed()).collect();
        all_ok(writes, JOIN_CONCURRENCY).await
    }

    /// Deletes the dispatch index rows of `topics` (after the batch that removed
    /// them), with a timestamp taken before that batch. A failure leaves
    /// dangling rows, marked (`mark`), which dispatch joins and skips: the
    /// change itself stands. Returns whether every row went.
    async fn del_topic_rows(&self, id: &RecipientId, topics: &[&[u8]], ts: i64) -> bool {
        let values = topics.iter().map(|t| (ts, *t, id.as_bytes().as_slice()));
        let result = self.write_each(&self.st.topic_row_del, values).await;
        if let Err(e) = &result {
            tracing::warn!(error = %e, "could not delete dispatch index rows; dispatch skips them");
        }
        result.is_ok()
    }

    /// Marks the dispatch index rows of `topics` as about to change, before
    /// the batch that changes them: dispatch joins a marked row with the
    /// recipient partition instead of trusting its copy (module docs,
    /// "Dispatch copies"). Returns this change's mark.
    async fn mark(&self, id: &RecipientId, topics: &[&[u8]]) -> Result<i64, StoreError> {
        let (mark, ts) = (new_version(), self.clock.next());
        let values = topics.iter().map(|t| (*t, id.as_bytes().as_slice(), mark, ts));
        self.write_each(&self.st.mark_put, values).await?;
        Ok(mark)
    }

    /// Deletes this change's marks: its copies are written, or its batch
    /// did not apply. Later than their writes on this node's clock. A
    /// failure keeps them, which costs those rows a join per dispatch.
    async fn unmark(&self, id: &RecipientId, topics: &[&[u8]], mark: i64) {
        let ts = self.clock.next();
        let values = topics.iter().map(|t| (ts, *t, id.as_bytes().as_slice(), mark));
        if let Err(e) = self.write_each(&self.st.mark_del, values).await {
            tracing::warn!(error = %e, "could not delete dispatch copy marks; dispatch joins those rows");
        }
    }

    /// Writes the dispatch copies of `subs` with their recipient `r` as the
    /// change left it (after the batch that made them true), at the
    /// change's index timestamp.
    async fn put_copies(&self, r: &Recipient, subs: &[StoredSubscription], ts: i64) -> Result<(), StoreError> {
        let (channel, text, signing_key) = codec::encode_target(&r.target);
        let (text, signing_key) = (text.as_ref(), signing_key.as_deref());
        let (hash, renewed, count) = (r.secret_hash.0.as_slice(), r.renewed_at_ns, to_db(r.topic_count));
        let values = subs.iter().map(|s| {
            let (start, include_commits, base, keys) = codec::encode_subscription(s);
            let key = (s.subscription.topic.as_bytes(), r.id.as_bytes().as_slice());
            let copy = (hash, channel, text, signing_key, start, include_commits, base, keys, renewed, count);
            (key.0, key.1, copy.0, copy.1, copy.2, copy.3, copy.4, copy.5, copy.6, copy.7, copy.8, copy.9, ts)
        });
        self.write_each(&self.st.copy_put, values).await
    }

    /// Sets the renewal time and topic count of `r` in its rows of `topics`
    /// whose copies the change did not rewrite, after its batch. Without
    /// marks: dispatch decides nothing on them, so a failure leaves them
    /// one change behind (logged).
    async fn renew_copies(&self, r: &Recipient, topics: &[&[u8]], ts: i64) {
        let (renewed, count, id) = (r.renewed_at_ns, to_db(r.topic_count), r.id.as_bytes().as_slice());
        let values = topics.iter().map(|t| (ts, renewed, count, *t, id));
        if let Err(e) = self.write_each(&self.st.copy_renew, values).await {
            tracing::warn!(error = %e, "could not renew dispatch copies");
        }
    }

    /// The copies a change wrote and the rows it deleted are in place: its
    /// marks can go. Otherwise they stay and dispatch joins those rows.
    async fn settle(&self, id: &RecipientId, topics: &[&[u8]], mark: i64, written: Result<(), StoreError>) {
        match written {
            Ok(()) => self.unmark(id, topics, mark).await,
            Err(e) => tracing::warn!(error = %e, "could not write dispatch copies; dispatch joins those rows"),
        }
    }

    /// Deletes the recipient read as `v` with all its subscriptions, if it is
    /// still at that version. Returns whether it deleted.
    async fn delete_versioned(&self, v: &Versioned) -> Result<bool, StoreError> {
        let id = &v.recipient.id;
        // Both after the version read (`read_index_clock`).
        let (topics, ts) = futures::try_join!(self.read_topics(id), self.index_timestamp(id))?;
        let topics: Vec<&[u8]> = topics.iter().map(Vec::as_slice).collect();
        let mark = self.mark(id, &topics).await?;
        let mut batch = conditional_batch();
        batch.append_statement(self.st.delete_statics.clone());
        batch.append_statement(self.st.delete_rows.clone());
        let values: Vec<Values> =
            vec![Box::new((id.as_bytes().to_vec(), v.version)), Box::new((id.as_bytes().to_vec(),))];
        let result = self.session.batch(&batch, values).await.map_err(be("conditional batch"))?;
        // Gone: deleted by this batch's first attempt (a repeat's answer),
        // or by a concurrent delete; either way what was asked holds.
        let lwt = Lwt::from_result(result)?;
        if !(lwt.applied || lwt.gone()) {
            self.unmark(id, &topics, mark).await;
            return Ok(false);
        }
        if self.del_topic_rows(id, &topics, ts).await {
            self.unmark(id, &topics, mark).await;
        }
        Ok(true)
    }

    /// Replaces the target of the recipient read as `v` (Register, PUSH-255,
    /// and the removal of a relay registration, 003 §1) in one conditional
    /// batch on that version, keeping its subscriptions. A changed target
    /// rewrites their dispatch copies, marked while it changes.
    async fn replace_target(
        &self,
        v: &Versioned,
        target: &DeliveryTarget,
        renewed_at_ns: i64,
    ) -> Result<bool, StoreError> {
        let id = &v.recipient.id;
        let (channel, text, signing_key) = codec::encode_target(target);
        let unchanged = codec::encode_target(&v.recipient.target) == (channel, text.clone(), signing_key.clone());
        let (text, signing_key, key) = (text.as_ref(), signing_key.as_deref(), id.as_bytes().as_slice());
        let version = new_version();
        let values = (version, channel, text, signing_key, renewed_at_ns, key, v.version);
        if v.recipient.topic_count == 0 {
            return Ok(self.session.lwt(&self.st.renew_recipient, values).await?.applied_as(version));
        }
        let after = Recipient { target: target.clone(), renewed_at_ns, ..v.recipient.clone() };
        // Both after the version read (`read_index_clock`).
        let (subs, ts) = futures::try_join!(self.subscriptions(id), self.index_timestamp(id))?;
        let topics: Vec<&[u8]> = subs.iter().map(|s| s.subscription.topic.as_bytes()).collect();
        if unchanged {
            // Only the renewal time changes.
            if !self.session.lwt(&self.st.renew_recipient, values).await?.applied_as(version) {
                return Ok(false);
            }
            self.renew_copies(&after, &topics, ts).await;
            return Ok(true);
        }
        let mark = self.mark(id, &topics).await?;
        if !self.session.lwt(&self.st.renew_recipient, values).await?.applied_as(version) {
            self.unmark(id, &topics, mark).await;
            return Ok(false);
        }
        let written = self.put_copies(&after, &subs, ts).await;
        self.settle(id, &topics, mark, written).await;
        Ok(true)
    }

    /// Clears `marks`, all of recipient `id` (`Store::clear_copy_marks`; the
    /// rule in the module docs, "Dispatch copies"). The clearing is itself a
    /// change of the recipient with nothing to change: it reads the version
    /// and, after it, the subscriptions and the index clock, writes its
    /// index timestamp back, and bumps the version in a conditional write on
    /// the version read (on its absence, for a recipient that is gone). Once
    /// that applied, no change that read an earlier version can apply its
    /// batch, and every change that applies later writes with a later
    /// timestamp. Then each marked row takes its copy from the subscriptions
    /// read, or is deleted when the subscription is gone, at this timestamp,
    /// and only then the marks go. Returns how many went: none when the
    /// recipient changed under every try.
    async fn clear_marks_of(&self, id: &RecipientId, marks: &[&CopyMark]) -> Result<u64, StoreError> {
        let key = id.as_bytes().as_slice();
        let mut fenced = None;
        for attempt in 0..FENCE_ATTEMPTS {
            let current = self.read_static(id).await?;
            let subs = if current.is_some() { self.subscriptions(id).await? } else { Vec::new() };
            let ts = self.index_timestamp(id).await?;
            let applied = match &current {
                Some(v) => self.session.lwt(&self.st.fence, (new_version(), key, v.version)).await?.applied,
                None => self.session.lwt(&self.st.fence_absent, (key,)).await?.applied,
            };
            if applied {
                fenced = Some((current, subs, ts));
                break;
            }
            backoff(attempt).await;
        }
        let Some((current, subs, ts)) = fenced else {
            tracing::debug!("a recipient kept changing; its dispatch copy marks stay for the next pass");
            return Ok(0);
        };
        let topics: Vec<&[u8]> = marks.iter().map(|m| m.topic.as_bytes()).collect();
        let kept: Vec<StoredSubscription> =
            subs.into_iter().filter(|s| topics.contains(&s.subscription.topic.as_bytes())).collect();
        let gone: Vec<&[u8]> =
            topics.iter().copied().filter(|t| !kept.iter().any(|s| s.subscription.topic.as_bytes() == *t)).collect();
        if let Some(v) = &current {
            self.put_copies(&v.recipient, &kept, ts).await?;
        }
        let deletes = gone.iter().map(|t| (ts, *t, key));
        self.write_each(&self.st.topic_row_del, deletes).await?;
        let dated = self.clock.next().saturating_add(MARK_DELETE_MARGIN_MICROS);
        let values = marks.iter().map(|m| (dated, m.topic.as_bytes(), key, m.mark));
        self.write_each(&self.st.mark_del, values).await?;
        Ok(marks.len() as u64)
    }

    /// Joins dispatch index rows with their recipient partitions, in the
    /// order given, skipping those whose recipient or subscription is gone
    /// (dangling index rows). One multi-partition read per chunk of
    /// [`JOIN_IN`] ids: a read per subscriber cost the server most of its
    /// work per delivery.
    async fn join(&self, topic: &Topic, ids: Vec<RecipientId>) -> Result<Vec<Subscriber>, StoreError> {
        let reads: Vec<BoxFuture<'_, Result<Vec<Subscriber>, StoreError>>> =
            ids.chunks(JOIN_IN).map(|chunk| self.join_chunk(topic, chunk.to_vec()).boxed()).collect();
        let pages: Vec<Vec<Subscriber>> = stream::iter(reads).buffered(JOIN_READS).try_collect().await?;
        Ok(pages.into_iter().flatten().collect())
    }

    /// The recipients with a mark on `topic` after `after`; `None` when
    /// there are more than [`MAX_MARKS`], and every row is joined.
    async fn marked(
        &self,
        topic: &Topic,
        after: Option<&RecipientId>,
    ) -> Result<Option<HashSet<RecipientId>>, StoreError> {
        let from: &[u8] = after.map_or(&[], |a| a.as_bytes());
        let values = (topic.as_bytes(), from);
        let mut marks = rows::<(Vec<u8>,)>(&self.session, &self.st.marks_read, values, "reading marks").await?;
        let mut out = HashSet::new();
        while let Some((id,)) = marks.try_next().await? {
            if out.len() == MAX_MARKS {
                return Ok(None);
            }
            out.insert(RecipientId::parse(&id).map_err(|_| corrupt("mark"))?);
        }
        Ok(Some(out))
    }

    /// An unmarked index row's copy as its subscriber; `None` for a row
    /// without one (written before schema 9, or by a change not done yet).
    fn decode_copy(&self, topic: &Topic, id: RecipientId, row: IndexRow) -> Result<Option<Subscriber>, StoreError> {
        let (_, hash, channel, target, signing_key, start, include_commits, base, keys, renewed, count) = row;
        let (Some(tag), Some(text), Some(renewed), Some(count)) = (channel, target.as_deref(), renewed, count) else {
            return Ok(None);
        };
        let Some(subscription) = codec::decode_subscription(topic.clone(), (start, include_commits, base, keys))?
        else {
            return Ok(None);
        };
        // Kept by the copy's own recipient columns: an entry is exactly what they say.
        let hash_bytes = hash.as_deref().unwrap_or_default();
        let key_bytes = signing_key.as_deref().unwrap_or_default();
        let text_len = (text.len() as u32).to_be_bytes();
        let (renewed_bytes, count_bytes) = (renewed.to_be_bytes(), count.to_be_bytes());
        let encoded =
            [hash_bytes, &[tag as u8], &renewed_bytes, &count_bytes, &text_len, text.as_bytes(), key_bytes].concat();
        let recipient = self.recipients.get_or_decode(&id, &encoded, |_| {
            // No version: a copy is not written back.
            let row = (Some(0), hash, channel, target, signing_key, Some(renewed), Some(count));
            Ok(codec::decode_static(id, row)?.ok_or_else(|| corrupt("subscriber copy"))?.recipient)
        })?;
        Ok(Some(Subscriber { recipient, subscription }))
    }

    /// One join read of at most [`JOIN_IN`] ids (`join`).
    async fn join_chunk(&self, topic: &Topic, chunk: Vec<RecipientId>) -> Result<Vec<Subscriber>, StoreError> {
        let list: Vec<&[u8]> = chunk.iter().map(|id| id.as_bytes().as_slice()).collect();
        let rows = self
            .session
            .execute_unpaged(&self.st.join_read, (list, topic.as_bytes()))
            .await
            .map_err(be("reading subscribers"))?
            .into_rows_result()
            .map_err(be("reading subscribers"))?;
        let mut found: HashMap<RecipientId, Subscriber> = HashMap::new();
        for row in rows.rows::<JoinRow>().map_err(be("reading subscribers"))? {
            let r = row.map_err(be("reading subscribers"))?;
            let id = RecipientId::parse(&r.0).map_err(|_| corrupt("recipient"))?;
            // No version: no recipient (a dangling index row).
            let Some(version) = r.1 else { continue };
            let Some(subscription) = codec::decode_subscription(topic.clone(), (r.8, r.9, r.10, r.11))? else {
                continue;
            };
            // Every write of the partition sets a new version: a kept recipient of this one is current.
            let recipient = self.recipients.get_or_decode(&id, &version.to_be_bytes(), |_| {
                let decoded = codec::decode_static(id, (r.1, r.2, r.3, r.4, r.5, r.6, r.7))?;
                Ok(decoded.ok_or_else(|| corrupt("recipient"))?.recipient)
            })?;
            found.insert(id, Subscriber { recipient, subscription });
        }
        Ok(chunk.iter().filter_map(|id| found.remove(id)).collect())
    }
}

/// A dispatch index row: recipient id, then its copy (`COPY_COLS`).
type IndexRow = (
    Vec<u8>,
    Option<Vec<u8>>,
    Option<i8>,
    Option<String>,
    Option<Vec<u8>>,
    Option<i64>,
    Option<bool>,
    Option<i64>,
    Option<Vec<Vec<u8>>>,
    Option<i64>,
    Option<i64>,
);

/// A joined subscriber row: recipient id, the static columns, the subscription's.
type JoinRow = (
    Vec<u8>,
    Option<i64>,
    Option<Vec<u8>>,
    Option<i8>,
    Option<String>,
    Option<Vec<u8>>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<bool>,
    Option<i64>,
    Option<Vec<Vec<u8>>>,
);

/// Records the shard count at first use; refuses another one later.
async fn check_shard_count(session: &Session, keyspace: &str, shard_count: u16) -> Result<(), StoreError> {
    let result = session
        .query_unpaged(
            format!("INSERT INTO {keyspace}.settings (name, value) VALUES ('shard_count', ?) IF NOT EXISTS"),
            (i64::from(shard_count),),
        )
        .await
        .map_err(be("recording the shard count"))?;
    let lwt = Lwt::from_result(result)?;
    if lwt.applied {
        return Ok(());
    }
    match lwt.current_i64("value").map(from_db) {
        Some(existing) if existing == u64::from(shard_count) => Ok(()),
        Some(existing) => Err(StoreError::Backend(format!(
            "the keyspace was created with {existing} shards but {shard_count} are configured; \
             the shard count cannot change"
        ))),
        None => Err(corrupt("settings")),
    }
}

#[async_trait]
impl Store for ScyllaStore {
    fn backend_name(&self) -> &'static str {
        "scylla"
    }

    fn relay(&self) -> &dyn super::RelayStore {
        &self.relay
    }

    fn gateway(&self) -> &dyn super::GatewayStore {
        &self.gateway
    }

    fn parked(&self) -> &dyn super::ParkedStore {
        &self.parked
    }

    fn leases(self: Arc<Self>) -> Option<Arc<dyn ShardLeases>> {
        Some(self)
    }

    async fn copy_marks(&self, limit: usize) -> Result<Vec<CopyMark>, StoreError> {
        let mut marks = rows::<(Vec<u8>, Vec<u8>, i64)>(&self.session, &self.st.marks_all, (), "reading marks").await?;
        let mut out = Vec::new();
        while out.len() < limit
            && let Some((topic, id, mark)) = marks.try_next().await?
        {
            let topic = Topic::parse(&topic).map_err(|_| corrupt("mark"))?;
            let recipient = RecipientId::parse(&id).map_err(|_| corrupt("mark"))?;
            out.push(CopyMark { topic, recipient, mark });
        }
        Ok(out)
    }

    async fn clear_copy_marks(&self, marks: &[CopyMark]) -> Result<u64, StoreError> {
        let mut by_recipient: BTreeMap<RecipientId, Vec<&CopyMark>> = BTreeMap::new();
        for m in marks {
            by_recipient.entry(m.recipient).or_default().push(m);
        }
        let clears: Vec<BoxFuture<'_, Result<u64, StoreError>>> =
            by_recipient.iter().map(|(id, marks)| self.clear_marks_of(id, marks).boxed()).collect();
        let cleared: Vec<u64> = stream::iter(clears).buffer_unordered(JOIN_CONCURRENCY).try_collect().await?;
        Ok(cleared.into_iter().sum())
    }

    async fn recipient(&self, id: &RecipientId) -> Result<Option<Recipient>, StoreError> {
        Ok(self.read_static(id).await?.map(|v| v.recipient))
    }

    async fn register(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        target: &DeliveryTarget,
        now_ns: i64,
    ) -> Result<RecipientSummary, StoreError> {
        let (channel, text, signing_key) = codec::encode_target(target);
        let text = text.as_ref();
        let signing_key = signing_key.as_deref();
        let (hash, key) = (secret_hash.0.as_slice(), id.as_bytes().as_slice());
        retry(|| async move {
            let current = self.read_static(id).await?;
            // PUSH-255: create with no subscriptions, or replace the target and keep them.
            let (done, topic_count) = match &current {
                None => {
                    let version = new_version();
                    let values = (version, hash, channel, text, signing_key, now_ns, key);
                    (self.session.lwt(&self.st.create_recipient, values).await?.applied_as(version), 0)
                }
                Some(v) if v.recipient.secret_hash != *secret_hash => return Err(StoreError::SecretMismatch),
                Some(v) => (self.replace_target(v, target, now_ns).await?, v.recipient.topic_count),
            };
            Ok(done.then(|| RecipientSummary { topic_count, channel: target.channel(), renewed_at_ns: now_ns }))
        })
        .await
    }

    async fn unregister(&self, id: &RecipientId, secret_hash: &SecretHash) -> Result<(), StoreError> {
        retry(|| async move {
            let v = self.read_static(id).await?.ok_or(StoreError::NotFound)?;
            if v.recipient.secret_hash != *secret_hash {
                return Err(StoreError::SecretMismatch);
            }
            // PUSH-207: the recipient and every subscription it holds, in one partition delete.
            Ok(self.delete_versioned(&v).await?.then_some(()))
        })
        .await
    }

    async fn update_subscriptions(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        update: &SubscriptionUpdate,
        now_ns: i64,
        max_topics: u64,
    ) -> Result<RecipientSummary, StoreError> {
        let asked: &Vec<&Topic> = &update.adds.iter().map(|s| &s.topic).chain(update.removes.iter()).collect();
        if asked.len() > MAX_SUBSCRIPTION_CHANGES {
            return Err(StoreError::Backend(format!(
                "scylla: one update may carry at most {MAX_SUBSCRIPTION_CHANGES} adds and removes; send them in batches"
            )));
        }
        retry(|| async move {
            let v = self.read_static(id).await?.ok_or(StoreError::NotFound)?;
            if v.recipient.secret_hash != *secret_hash {
                return Err(StoreError::SecretMismatch);
            }
            // Read after the version: a change after this read changes the version too.
            // PUSH-216: a new topic starts at its shard's boundary, read beside
            // them, after the recipient read and before the conditional batch
            // (which adds are new is known only then: every added topic's shard).
            // The index clock too (`read_index_clock`). Every stored topic:
            // a replaced one keeps its start, the others' copies take the new
            // renewal time and count.
            let add_shards = update.adds.iter().map(|s| s.topic.shard(self.shard_count)).collect();
            let existing =
                async { if v.recipient.topic_count == 0 { Ok(HashMap::new()) } else { self.read_starts(id).await } };
            let (existing, boundaries, clock) =
                futures::try_join!(existing, self.boundaries(add_shards), self.read_index_clock(id))?;
            let mut count = v.recipient.topic_count;

            // PUSH-216: a removed topic that is not stored changes nothing.
            let removed: Vec<Vec<u8>> = update
                .removes
                .iter()
                .filter(|t| existing.contains_key(t.as_bytes()))
                .map(|t| t.as_bytes().to_vec())
                .collect();
            let new_topics = update.adds.iter().filter(|s| !existing.contains_key(s.topic.as_bytes())).count();
            count = count.saturating_sub(removed.len() as u64) + new_topics as u64;
            // PUSH-217: over the limit, nothing is written.
            if count > max_topics {
                return Err(StoreError::TopicLimit);
            }

            let stored: Vec<StoredSubscription> = update
                .adds
                .iter()
                .map(|sub| StoredSubscription {
                    subscription: sub.clone(),
                    start_position: match existing.get(sub.topic.as_bytes()) {
                        // PUSH-216: a replaced topic keeps its start position.
                        Some(&start) => start,
                        None => boundaries[&sub.topic.shard(self.shard_count)],
                    },
                })
                .collect();

            // Dispatch index rows first, so a stored subscription is never invisible,
            // and the marks of every row whose copy changes (module docs, "Dispatch copies").
            // One timestamp for both: a topic is never both added and removed.
            let ts = self.next_index_timestamp(clock);
            let added: Vec<&[u8]> = update.adds.iter().map(|s| s.topic.as_bytes()).collect();
            let removed_rows: Vec<&[u8]> = removed.iter().map(Vec::as_slice).collect();
            // A new topic's row has no copy yet to make stale: it is joined
            // until its copy is written. (A copy left on it by a remove
            // whose row delete failed is still under that remove's mark.)
            let replaced = added.iter().filter(|t| existing.contains_key(**t));
            let changed: Vec<&[u8]> = replaced.chain(&removed_rows).copied().collect();
            let (_, _, mark) = futures::try_join!(
                self.put_index_clock(id, ts),
                self.put_topic_rows(id, &added, ts),
                self.mark(id, &changed)
            )?;

            let mut batch = conditional_batch();
            let mut values: Vec<Values> = Vec::with_capacity(1 + removed.len() + stored.len());
            let version = new_version();
            batch.append_statement(self.st.update_statics.clone());
            values.push(Box::new((version, now_ns, to_db(count), id.as_bytes().to_vec(), v.version)));
            for topic in &removed {
                batch.append_statement(self.st.del_sub.clone());
                values.push(Box::new((id.as_bytes().to_vec(), topic.clone())));
            }
            for s in &stored {
                let (start, include_commits, base, keys) = codec::encode_subscription(s);
                batch.append_statement(self.st.put_sub.clone());
                values.push(Box::new((
                    id.as_bytes().to_vec(),
                    s.subscription.topic.as_bytes().to_vec(),
                    start,
                    include_commits,
                    base,
                    keys,
                )));
            }
            let result = self.session.batch(&batch, values).await.map_err(be("conditional batch"))?;
            if !Lwt::from_result(result)?.applied_as(version) {
                self.unmark(id, &changed, mark).await;
                return Ok(None);
            }
            let after = Recipient { renewed_at_ns: now_ns, topic_count: count, ..v.recipient.clone() };
            let rewritten: HashSet<&[u8]> = added.iter().chain(&removed_rows).copied().collect();
            let untouched: Vec<&[u8]> = existing.keys().map(Vec::as_slice).filter(|t| !rewritten.contains(t)).collect();
            let (copied, deleted, ()) = futures::join!(
                self.put_copies(&after, &stored, ts),
                self.del_topic_rows(id, &removed_rows, ts),
                self.renew_copies(&after, &untouched, ts)
            );
            if deleted {
                self.settle(id, &changed, mark, copied).await;
            }
            // PUSH-255: the renewal time is set in the same batch.
            Ok(Some(RecipientSummary {
                topic_count: count,
                channel: v.recipient.target.channel(),
                renewed_at_ns: now_ns,
            }))
        })
        .await
    }

    async fn subscriptions(&self, id: &RecipientId) -> Result<Vec<StoredSubscription>, StoreError> {
        type Row = (Option<Vec<u8>>, Option<i64>, Option<bool>, Option<i64>, Option<Vec<Vec<u8>>>);
        let values = (id.as_bytes().as_slice(),);
        let mut rows = rows::<Row>(&self.session, &self.st.subs_read, values, "reading subscriptions").await?;
        let mut out = Vec::new();
        while let Some((topic, start, ic, base, keys)) = rows.try_next().await? {
            // The row of a recipient without subscriptions carries only the static columns.
            let Some(topic) = topic else { continue };
            let topic = Topic::parse(&topic).map_err(|_| corrupt("subscription"))?;
            if let Some(s) = codec::decode_subscription(topic, (start, ic, base, keys))? {
                out.push(s);
            }
        }
        Ok(out)
    }

    async fn delete_recipient_if_unchanged(&self, expected: &Recipient) -> Result<bool, StoreError> {
        retry(|| async move {
            let Some(v) = self.read_static(&expected.id).await? else {
                return Ok(Some(false));
            };
            // PUSH-234: the target (for a relay registration its provider and
            // token, 003 §2.4) and the secret hash must still match.
            if !v.recipient.target.still_names(&expected.target) || v.recipient.secret_hash != expected.secret_hash {
                return Ok(Some(false));
            }
            Ok(self.delete_versioned(&v).await?.then_some(true))
        })
        .await
    }

    async fn remove_relay_registration(&self, removal: &RegistrationRemoval) -> Result<bool, StoreError> {
        let id = removal.id();
        retry(|| async move {
            let stored = self.read_static(id).await?;
            // 003 §1: the registration goes, the recipient and its subscriptions
            // stay. One LWT on the version read: a registration in between
            // changes the version, and the removal is decided again.
            let (Some(r), Some(v)) = (removal.apply(stored.as_ref().map(|v| v.recipient.clone()))?, stored) else {
                return Ok(Some(false));
            };
            Ok(self.replace_target(&v, &r.target, r.renewed_at_ns).await?.then_some(true))
        })
        .await
    }

    async fn delete_expired(&self, renewed_before_ns: i64) -> Result<u64, StoreError> {
        // A paged scan of the recipients' static columns (one row per partition).
        let candidates: Vec<RecipientId> = rows(&self.session, &self.st.expired_scan, (), "scanning recipients")
            .await?
            .try_filter_map(|(id, renewed_at): (Vec<u8>, Option<i64>)| async move {
                // PUSH-226: strictly older than the cutoff.
                if renewed_at.is_some_and(|t| t < renewed_before_ns) {
                    RecipientId::parse(&id).map(Some).map_err(|_| corrupt("recipient"))
                } else {
                    Ok(None)
                }
            })
            .try_collect()
            .await?;
        let mut deleted = 0;
        for id in candidates {
            deleted += retry(|| async move {
                // Re-checked on the serial read: a renewal since the scan keeps it.
                let Some(v) = self.read_static(&id).await? else { return Ok(Some(0)) };
                if v.recipient.renewed_at_ns >= renewed_before_ns {
                    return Ok(Some(0));
                }
                Ok(self.delete_versioned(&v).await?.then_some(1))
            })
            .await?;
        }
        Ok(deleted)
    }

    async fn append(&self, envelopes: &[NewEnvelope], now_ns: i64) -> Result<Vec<Appended>, StoreError> {
        let mut by_shard: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        for (i, e) in envelopes.iter().enumerate() {
            if e.shard() != e.topic().shard(self.shard_count) {
                return Err(StoreError::Backend("envelope shard does not match the store's shard count".into()));
            }
            by_shard.entry(e.shard()).or_default().push(i);
        }
        let per_shard = futures::future::try_join_all(
            by_shard.iter().map(|(shard, indices)| self.log.append_shard(*shard, envelopes, indices, now_ns)),
        )
        .await?;
        let mut results: Vec<Option<Appended>> = vec![None; envelopes.len()];
        for (i, r) in per_shard.into_iter().flatten() {
            results[i] = Some(r);
        }
        Ok(results.into_iter().map(|r| r.expect("every envelope has a result")).collect())
    }

    async fn shard_position(&self, shard: ShardId) -> Result<ShardPosition, StoreError> {
        self.check_shard(shard)?;
        self.log.position(shard).await
    }

    async fn read_window(
        &self,
        shard: ShardId,
        after: u64,
        up_to: u64,
        limit: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        self.check_shard(shard)?;
        self.log.window(shard, after, up_to, limit).await
    }

    async fn envelope_data(&self, shard: ShardId, sequence_id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.check_shard(shard)?;
        self.log.data(shard, sequence_id).await
    }

    async fn advance_checkpoint(&self, shard: ShardId, checkpoint: u64) -> Result<(), StoreError> {
        self.check_shard(shard)?;
        self.log.checkpoint(shard, checkpoint).await
    }

    async fn record_progress(&self, shard: ShardId, progress: &ShardProgress) -> Result<(), StoreError> {
        self.check_shard(shard)?;
        self.log.put_progress(shard, progress).await
    }

    async fn shard_progress(&self, shard: ShardId) -> Result<ShardProgress, StoreError> {
        self.check_shard(shard)?;
        self.log.progress(shard).await
    }

    async fn subscribers(
        &self,
        topic: &Topic,
        after: Option<&RecipientId>,
        limit: usize,
    ) -> Result<Vec<Subscriber>, StoreError> {
        if super::nothing_after(after, limit) {
            return Ok(Vec::new());
        }
        // The marks first (module docs, "Dispatch copies").
        let marked = self.marked(topic, after).await?;
        let page_rows = i32::try_from(limit).unwrap_or(PAGE_ROWS).min(PAGE_ROWS);
        let (st, values) = match after {
            Some(a) => (&self.st.topic_page_after, vec![topic.as_bytes(), a.as_bytes().as_slice()]),
            None => (&self.st.topic_page, vec![topic.as_bytes()]),
        };
        let mut st = st.clone();
        st.set_page_size(page_rows);
        let mut index = rows::<IndexRow>(&self.session, &st, values, "reading subscribers").await?;
        let mut out = Vec::with_capacity(limit.min(PAGE_ROWS as usize));
        // Keep reading index rows until the page is full: dangling rows are
        // skipped, and a short page tells dispatch the topic is done.
        loop {
            let need = limit - out.len();
            // Each row's subscriber from its copy, or `None`: joined below.
            let mut chunk: Vec<(RecipientId, Option<Subscriber>)> = Vec::with_capacity(need);
            while chunk.len() < need
                && let Some(row) = index.try_next().await?
            {
                let id = RecipientId::parse(&row.0).map_err(|_| corrupt("topic subscription"))?;
                let trusted = marked.as_ref().is_some_and(|m| !m.contains(&id));
                chunk.push((id, if trusted { self.decode_copy(topic, id, row)? } else { None }));
            }
            let exhausted = chunk.len() < need;
            let to_join = chunk.iter().filter(|(_, copy)| copy.is_none()).map(|(id, _)| *id).collect();
            let mut joined: HashMap<RecipientId, Subscriber> =
                self.join(topic, to_join).await?.into_iter().map(|s| (s.recipient.id, s)).collect();
            out.extend(chunk.into_iter().filter_map(|(id, copy)| copy.or_else(|| joined.remove(&id))));
            if exhausted || out.len() == limit {
                return Ok(out);
            }
        }
    }
}

#[async_trait]
impl ShardLeases for ScyllaStore {
    async fn acquire_lease(
        &self,
        shard: ShardId,
        node: &NodeId,
        address: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.check_shard(shard)?;
        let ttl = ttl_secs(ttl);
        let key = i32::from(shard.index());
        // A lease newly acquired, lost, or in doubt after an error: this
        // process's term of the shard may be stale, so its next append
        // claims a new one (`log.rs`).
        let renew = (ttl, &node.0, address, key, &node.0);
        let held = async {
            // Most calls renew a lease this process holds: one conditional
            // write, not two. Not applied (taken or expired): acquire it.
            if self.log.has_term(shard) && self.session.lwt(&self.st.lease_renew, renew).await?.applied {
                return Ok((true, false));
            }
            let insert = self.session.lwt(&self.st.lease_insert, (key, &node.0, address, ttl)).await?;
            if insert.applied {
                return Ok((true, true));
            }
            if insert.current_text("owner") != Some(node.0.as_str()) {
                return Ok((false, true));
            }
            // Ours already: renew the TTL, still only while it is ours.
            let renewed = self.session.lwt(&self.st.lease_renew, renew).await?.applied;
            Ok((renewed, !renewed))
        }
        .await;
        match held {
            // Newly ours: a term now, so the first publish does not wait for it.
            Ok((true, true)) => self.log.start_term(shard).await,
            Ok((_, false)) => {}
            _ => self.log.forget_term(shard),
        }
        held.map(|(held, _)| held)
    }

    async fn release_lease(&self, shard: ShardId, node: &NodeId) -> Result<(), StoreError> {
        self.check_shard(shard)?;
        self.log.forget_term(shard);
        self.session.lwt(&self.st.lease_release, (i32::from(shard.index()), &node.0)).await?;
        Ok(())
    }

    async fn lease_owner(&self, shard: ShardId) -> Result<Option<(NodeId, String)>, StoreError> {
        self.check_shard(shard)?;
        let row = first_row(&self.session, &self.st.lease_read, (i32::from(shard.index()),), "reading a lease").await?;
        Ok(row.and_then(|(owner, address): (Option<String>, Option<String>)| {
            Some((NodeId(owner?), address.unwrap_or_default()))
        }))
    }

    async fn lease_owners(&self) -> Result<Vec<(ShardId, NodeId)>, StoreError> {
        let rows: Vec<(i32, Option<String>)> =
            all_rows(&self.session, &self.st.lease_all, (), "reading the leases").await?;
        Ok(rows
            .into_iter()
            .filter_map(|(shard, owner)| {
                Some((ShardId::parse(u16::try_from(shard).ok()?, self.shard_count).ok()?, NodeId(owner?)))
            })
            .collect())
    }

    async fn heartbeat(&self, node: &NodeId, address: &str, ttl: Duration) -> Result<(), StoreError> {
        self.session.write(&self.st.node_put, (&node.0, address, ttl_secs(ttl))).await
    }

    async fn live_nodes(&self) -> Result<Vec<NodeId>, StoreError> {
        let rows: Vec<(String,)> = all_rows(&self.session, &self.st.node_all, (), "reading the nodes").await?;
        Ok(rows.into_iter().map(|(n,)| NodeId(n)).collect())
    }

    async fn forget_node(&self, node: &NodeId) -> Result<(), StoreError> {
        self.session.write(&self.st.node_delete, (&node.0,)).await
    }

    async fn lease_holders(&self) -> Result<Vec<LeaseHolder>, StoreError> {
        type Row = (i32, Option<String>, Option<String>, Option<i32>);
        let rows: Vec<Row> = all_rows(&self.session, &self.st.lease_details, (), "reading the leases").await?;
        let held = rows.into_iter().filter_map(|(shard, owner, address, ttl)| {
            let shard = ShardId::parse(u16::try_from(shard).ok()?, self.shard_count).ok()?;
            let expires_in = ttl.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs);
            Some((shard, NodeId(owner?), address.unwrap_or_default(), expires_in))
        });
        // The term is the shard's, in its log: the one its owner appends under.
        let reads: Vec<BoxFuture<'_, Result<LeaseHolder, StoreError>>> = held
            .map(|(shard, node, address, expires_in)| {
                async move {
                    let term = self.log.current_term(shard).await?;
                    Ok(LeaseHolder { shard, node, address, term, expires_in })
                }
                .boxed()
            })
            .collect();
        let mut out: Vec<LeaseHolder> = stream::iter(reads).buffer_unordered(JOIN_CONCURRENCY).try_collect().await?;
        out.sort_by_key(|h| h.shard);
        Ok(out)
    }

    async fn node_addresses(&self) -> Result<Vec<LiveNode>, StoreError> {
        let rows: Vec<(String, Option<String>)> =
            all_rows(&self.session, &self.st.node_details, (), "reading the nodes").await?;
        let mut out: Vec<LiveNode> = rows
            .into_iter()
            .map(|(node, address)| LiveNode { node: NodeId(node), address: address.unwrap_or_default() })
            .collect();
        out.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(out)
    }
}

/// Throwaway keyspaces, shared with the conformance tests in tests/store_conformance.
#[cfg(test)]
#[path = "../../tests/store_conformance/test_keyspace.rs"]
mod test_keyspace;

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::codec::BUCKET_SIZE;
    use super::test_keyspace::{
        SHARD_COUNT, drop_keyspace_then_resume, fresh_keyspace, settings, test_nodes, with_store,
    };
    use super::*;
    use crate::domain::{EnvelopeKind, RecipientSecret, Subscription};

    // The conformance suite runs on this backend in tests/store_conformance.

    /// Shard leases: two nodes contend for one shard; exactly one wins, the loser
    /// cannot renew, and once the winner's TTL runs out the other acquires.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shard_leases_are_exclusive_and_expire() {
        with_store(|store| async move {
            let (a, b) = (NodeId::random(), NodeId::random());
            let shard = ShardId::parse(1, SHARD_COUNT).unwrap();
            let ttl = Duration::from_secs(2);
            assert_eq!(store.lease_owner(shard).await.unwrap(), None);
            let (won_a, won_b) =
                tokio::join!(store.acquire_lease(shard, &a, "a:1", ttl), store.acquire_lease(shard, &b, "b:1", ttl));
            let (won_a, won_b) = (won_a.unwrap(), won_b.unwrap());
            assert!(won_a ^ won_b, "exactly one wins: a {won_a}, b {won_b}");
            let (winner, loser, addr) =
                if won_a { (a.clone(), b.clone(), "a:1") } else { (b.clone(), a.clone(), "b:1") };
            assert_eq!(store.lease_owner(shard).await.unwrap(), Some((winner.clone(), addr.to_owned())));
            assert!(store.acquire_lease(shard, &winner, addr, ttl).await.unwrap(), "the owner renews");
            assert!(!store.acquire_lease(shard, &loser, "x:1", ttl).await.unwrap(), "the loser cannot");
            store.release_lease(shard, &loser).await.unwrap(); // not its own: no effect
            assert_eq!(store.lease_owners().await.unwrap(), vec![(shard, winner.clone())]);
            // As operators read it: the owner, its address, the term its
            // acquisition claimed, what is left of the lease.
            let holds = |h: &LeaseHolder, node: &NodeId, address: &str, term: u64| {
                (h.shard, &h.node, h.address.as_str(), h.term) == (shard, node, address, Some(term))
                    && h.expires_in.is_some_and(|left| left <= ttl)
            };
            let holders = store.lease_holders().await.unwrap();
            assert!(holders.len() == 1 && holds(&holders[0], &winner, addr, 1), "{holders:?}");
            tokio::time::sleep(Duration::from_millis(3500)).await;
            assert_eq!(store.lease_owner(shard).await.unwrap(), None, "expired");
            assert_eq!(store.lease_holders().await.unwrap(), vec![], "an expired lease is not listed");
            assert!(store.acquire_lease(shard, &loser, "x:1", ttl).await.unwrap(), "taken over after the TTL");
            let holders = store.lease_holders().await.unwrap();
            assert!(holders.len() == 1 && holds(&holders[0], &loser, "x:1", 2), "a new term: {holders:?}");
            assert!(!store.acquire_lease(shard, &winner, addr, ttl).await.unwrap());
            store.release_lease(shard, &loser).await.unwrap();
            assert!(store.acquire_lease(shard, &winner, addr, ttl).await.unwrap(), "free after release");
            store.heartbeat(&a, "a:1", ttl).await.unwrap();
            store.heartbeat(&b, "b:1", ttl).await.unwrap();
            let mut live = store.live_nodes().await.unwrap();
            live.sort();
            let mut both = vec![a.clone(), b.clone()];
            both.sort();
            assert_eq!(live, both);
            let mut addressed = vec![
                LiveNode { node: a.clone(), address: "a:1".into() },
                LiveNode { node: b.clone(), address: "b:1".into() },
            ];
            addressed.sort_by(|x, y| x.node.cmp(&y.node));
            assert_eq!(store.node_addresses().await.unwrap(), addressed);
            store
        })
        .await;
    }

    /// Parked deliveries outlive the node that parked them: another node on
    /// the keyspace (the shard's next owner) reads them all, paged, in key
    /// order, and what it drains is gone for the first too. A park of more
    /// rows than one batch holds lands whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parked_deliveries_are_drained_by_the_next_owner() {
        use crate::domain::{Channel, ParkedDelivery};
        with_store(|first| async move {
            let shard = ShardId::parse(6, SHARD_COUNT).unwrap();
            let delivery = |n: u32| ParkedDelivery {
                shard,
                channel: Channel::Apns,
                sequence_id: u64::from(n / 3) + 1,
                recipient: RecipientId::from_bytes([(n % 3) as u8; 32]),
                topic: Topic::parse(&[0, 1]).unwrap(),
                kind: EnvelopeKind::Application,
                server_ts_ns: 5,
                attempts: n % 4,
                all_gone: false,
            };
            let parked: Vec<ParkedDelivery> = (0..300).map(delivery).collect();
            let backwards: Vec<ParkedDelivery> = parked.iter().rev().cloned().collect();
            first.parked().park(&backwards).await.unwrap();

            let next = ScyllaStore::connect(&settings(test_nodes().unwrap(), first.keyspace()), SHARD_COUNT).await;
            let next = next.unwrap();
            let mut read = Vec::new();
            let mut after = None;
            loop {
                let page = next.parked().parked(shard, Channel::Apns, after, 128).await.unwrap();
                read.extend(page.iter().cloned());
                match page.last() {
                    Some(last) if page.len() == 128 => after = Some(last.key()),
                    _ => break,
                }
            }
            assert_eq!(read, parked, "every row, in key order");

            // The next owner drains the first 200; the first node sees the rest only.
            let drained: Vec<_> = parked[..200].iter().map(ParkedDelivery::key).collect();
            next.parked().unpark(shard, Channel::Apns, &drained).await.unwrap();
            assert_eq!(first.parked().parked(shard, Channel::Apns, None, 1000).await.unwrap(), parked[200..]);
            // Drained, then parked again by the same node: the park lands after the delete.
            next.parked().park(&parked[..1]).await.unwrap();
            let page = first.parked().parked(shard, Channel::Apns, None, 1).await.unwrap();
            assert_eq!(page, parked[..1]);
            first
        })
        .await;
    }

    /// Clock skew: two nodes whose clocks are an hour apart change one
    /// recipient's subscriptions in turn. The node ahead removes a topic (or
    /// deletes the recipient), the node behind adds it back right after: the
    /// dispatch index must still list it, or a stored, counted subscription
    /// would never be dispatched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_dispatch_index_is_immune_to_clock_skew_between_nodes() {
        with_store(|behind| async move {
            let nodes = test_nodes().unwrap();
            let mut ahead = ScyllaStore::connect(&settings(nodes, behind.keyspace()), SHARD_COUNT).await.unwrap();
            ahead.clock = Arc::new(WriteClock::skewed(3_600_000_000));
            let id = RecipientId::from_bytes([3; 32]);
            let hash = RecipientSecret::parse(&[4; 32]).unwrap().hash();
            let target = DeliveryTarget::Fcm { token: "tok".into() };
            let topic = Topic::parse(&[0, 9]).unwrap();
            let sub = Subscription { topic: topic.clone(), keys: None, include_commits: false };
            let add = SubscriptionUpdate::new(vec![sub], vec![]).unwrap();
            let remove = SubscriptionUpdate::new(vec![], vec![topic.clone()]).unwrap();
            async fn listed(store: &ScyllaStore, topic: &Topic) -> Vec<RecipientId> {
                let page = store.subscribers(topic, None, 10).await.unwrap();
                page.iter().map(|s| s.recipient.id).collect()
            }

            behind.register(&id, &hash, &target, 1).await.unwrap();
            behind.update_subscriptions(&id, &hash, &add, 1, 10).await.unwrap();
            ahead.update_subscriptions(&id, &hash, &remove, 2, 10).await.unwrap();
            assert_eq!(listed(&behind, &topic).await, vec![], "removed");
            behind.update_subscriptions(&id, &hash, &add, 3, 10).await.unwrap();
            assert_eq!(
                listed(&behind, &topic).await,
                vec![id],
                "re-added behind the remover's clock: still dispatched"
            );

            // A new target ahead, then another behind: the copy of the later change wins.
            ahead.register(&id, &hash, &DeliveryTarget::Fcm { token: "ahead".into() }, 3).await.unwrap();
            behind.register(&id, &hash, &target, 3).await.unwrap();
            let page = behind.subscribers(&topic, None, 10).await.unwrap();
            assert_eq!(page[0].recipient.target, target, "the later target, behind the earlier one's clock");

            ahead.unregister(&id, &hash).await.unwrap();
            behind.register(&id, &hash, &target, 4).await.unwrap();
            behind.update_subscriptions(&id, &hash, &add, 4, 10).await.unwrap();
            assert_eq!(listed(&behind, &topic).await, vec![id], "re-registered after a delete ahead: still dispatched");
            behind
        })
        .await;
    }

    /// Dispatch copies (module docs): an unmarked row's copy is what a page
    /// returns, without reading the recipient; a marked row is joined with
    /// the recipient partition, as is a change stopped after its batch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_is_trusted_only_while_no_change_has_marked_its_row() {
        with_store(|store| async move {
            let id = RecipientId::from_bytes([5; 32]);
            let hash = RecipientSecret::parse(&[6; 32]).unwrap().hash();
            let topic = Topic::parse(&[0, 12]).unwrap();
            let sub = Subscription { topic: topic.clone(), keys: None, include_commits: true };
            let token = |t: &str| DeliveryTarget::Fcm { token: t.into() };
            let target = || async { store.subscribers(&topic, None, 10).await.unwrap()[0].recipient.target.clone() };
            store.register(&id, &hash, &token("real"), 1).await.unwrap();
            let add = SubscriptionUpdate::new(vec![sub.clone()], vec![]).unwrap();
            store.update_subscriptions(&id, &hash, &add, 1, 10).await.unwrap();
            let page = store.subscribers(&topic, None, 10).await.unwrap();
            assert_eq!(
                (page[0].recipient.target.clone(), page[0].subscription.subscription.clone()),
                (token("real"), sub)
            );

            // A copy that is not the truth (written here, later than any change): trusted as it is.
            let stored = store.subscriptions(&id).await.unwrap();
            let later = store.clock.next() + 1_000_000;
            let copy = Recipient { target: token("copy"), ..store.recipient(&id).await.unwrap().unwrap() };
            store.put_copies(&copy, &stored, later).await.unwrap();
            assert_eq!(target().await, token("copy"), "an unmarked copy is read, not the recipient");
            // Marked: joined with the recipient partition.
            let row = [topic.as_bytes()];
            let mark = store.mark(&id, &row).await.unwrap();
            assert_eq!(target().await, token("real"), "a marked row is joined");
            store.unmark(&id, &row, mark).await;
            assert_eq!(target().await, token("copy"));

            // A change that stops after its batch (a crash): marked, batch
            // applied, no copy written. Its mark keeps the stale copy out.
            let v = store.read_static(&id).await.unwrap().unwrap();
            let _left = store.mark(&id, &row).await.unwrap();
            let new = token("new");
            let (channel, text, key) = codec::encode_target(&new);
            let values =
                (new_version(), channel, text.as_ref(), key.as_deref(), 2i64, id.as_bytes().as_slice(), v.version);
            assert!(store.session.lwt(&store.st.renew_recipient, values).await.unwrap().applied);
            assert_eq!(target().await, token("new"), "the truth, not the stale copy");
            // The next change writes its copy and deletes only its own mark: still joined, still right.
            store.register(&id, &hash, &token("newer"), 3).await.unwrap();
            assert_eq!(target().await, token("newer"));
            assert_eq!(store.marked(&topic, None).await.unwrap().map(|m| m.len()), Some(1), "the crashed one's mark");
            store
        })
        .await;
    }

    /// Marks that changes stopped after their batch left behind (module
    /// docs, "Dispatch copies"): clearing them first fences the recipient,
    /// so a change that read it before can no longer apply; then each row
    /// takes its copy from the recipient as stored (a replaced target), or
    /// goes with its subscription (a remove, a deleted recipient), and a
    /// later change still wins over what the clearing wrote.
    #[tokio::test]
    async fn marks_a_crash_left_are_cleared_with_their_rows_set_from_the_recipient() {
        with_store(|store| async move {
            let id = RecipientId::from_bytes([7; 32]);
            let hash = RecipientSecret::parse(&[8; 32]).unwrap().hash();
            let token = |t: &str| DeliveryTarget::Fcm { token: t.into() };
            let topics: Vec<Topic> = (20..23).map(|n| Topic::parse(&[0, n]).unwrap()).collect();
            let subs: Vec<Subscription> =
                topics.iter().map(|t| Subscription { topic: t.clone(), keys: None, include_commits: false }).collect();
            store.register(&id, &hash, &token("real"), 1).await.unwrap();
            let add = SubscriptionUpdate::new(subs.clone(), vec![]).unwrap();
            store.update_subscriptions(&id, &hash, &add, 1, 10).await.unwrap();
            let ks = store.keyspace().to_owned();
            // The copy's target in the row of (topic, recipient): `None`
            // when there is no row.
            let copied = |topic: &Topic, who: RecipientId| {
                let (topic, store, ks) = (topic.clone(), &store, &ks);
                async move {
                    let cql =
                        format!("SELECT target FROM {ks}.topic_subscriptions WHERE topic = ? AND recipient_id = ?");
                    let rows = store.session.query_unpaged(cql, (topic.as_bytes(), who.as_bytes().as_slice()));
                    let rows = rows.await.unwrap().into_rows_result().unwrap();
                    rows.maybe_first_row::<(Option<String>,)>().unwrap().map(|(t,)| t.unwrap_or_default())
                }
            };
            let listed = |topic: &Topic| {
                let (topic, store) = (topic.clone(), &store);
                async move {
                    let page = store.subscribers(&topic, None, 10).await.unwrap();
                    page.into_iter().map(|s| s.recipient.target.clone()).collect::<Vec<_>>()
                }
            };
            let replace = |v: &Versioned, to: &str, at: i64| {
                let target = token(to);
                let (channel, text, key) = codec::encode_target(&target);
                let (text, key) = (text.into_owned(), key.map(|k| k.into_owned()));
                let (store, version) = (&store, v.version);
                async move {
                    let values = (new_version(), channel, text, key, at, id.as_bytes().to_vec(), version);
                    store.session.lwt(&store.st.renew_recipient, values).await.unwrap().applied
                }
            };

            // A target change that stopped after its batch: both rows
            // marked, the target replaced, no copy written.
            let v = store.read_static(&id).await.unwrap().unwrap();
            let rows: Vec<&[u8]> = topics[..2].iter().map(Topic::as_bytes).collect();
            store.mark(&id, &rows).await.unwrap();
            assert!(replace(&v, "new", 2).await);
            // A remove that stopped after its batch: its row and copy stay.
            store.mark(&id, &[topics[2].as_bytes()]).await.unwrap();
            let cql = format!("DELETE FROM {ks}.recipients WHERE recipient_id = ? AND topic = ?");
            store.session.query_unpaged(cql, (id.as_bytes().as_slice(), topics[2].as_bytes())).await.unwrap();
            assert_eq!(copied(&topics[0], id).await.as_deref(), Some("real"), "the stale copy");
            assert_eq!(listed(&topics[0]).await, vec![token("new")], "a marked row is joined");
            assert_eq!(listed(&topics[2]).await, vec![], "a dangling row is skipped");

            // A change that read the recipient before the marks are cleared.
            let before = store.read_static(&id).await.unwrap().unwrap();
            let marks = store.copy_marks(100).await.unwrap();
            assert_eq!(marks.len(), 3, "{marks:?}");
            assert!(marks.iter().all(|m| m.recipient == id));
            assert_eq!(store.clear_copy_marks(&marks).await.unwrap(), 3);
            assert_eq!(store.copy_marks(100).await.unwrap(), vec![], "every mark went");
            assert!(!replace(&before, "late", 3).await, "a change that read the recipient before cannot apply");
            for topic in &topics[..2] {
                assert_eq!(copied(topic, id).await.as_deref(), Some("new"), "the copy is set from the recipient");
                assert_eq!(listed(topic).await, vec![token("new")], "and trusted");
            }
            assert_eq!(copied(&topics[2], id).await, None, "the removed subscription's row is gone");

            // A later change wins over what the clearing wrote.
            store.register(&id, &hash, &token("newer"), 4).await.unwrap();
            assert_eq!(copied(&topics[0], id).await.as_deref(), Some("newer"));
            assert_eq!(listed(&topics[0]).await, vec![token("newer")]);

            // A delete that stopped after its batch: the row stays, marked;
            // cleared, it goes, and a new registration's subscription is listed.
            let gone = RecipientId::from_bytes([9; 32]);
            store.register(&gone, &hash, &token("gone"), 1).await.unwrap();
            let one = SubscriptionUpdate::new(vec![subs[0].clone()], vec![]).unwrap();
            store.update_subscriptions(&gone, &hash, &one, 1, 10).await.unwrap();
            store.mark(&gone, &[topics[0].as_bytes()]).await.unwrap();
            let cql = format!("DELETE FROM {ks}.recipients WHERE recipient_id = ?");
            store.session.query_unpaged(cql, (gone.as_bytes().as_slice(),)).await.unwrap();
            let marks = store.copy_marks(100).await.unwrap();
            assert_eq!(store.clear_copy_marks(&marks).await.unwrap(), 1);
            assert_eq!(copied(&topics[0], gone).await, None, "the deleted recipient's row is gone");
            assert_eq!(listed(&topics[0]).await, vec![token("newer")]);
            store.register(&gone, &hash, &token("back"), 5).await.unwrap();
            store.update_subscriptions(&gone, &hash, &one, 5, 10).await.unwrap();
            let mut back = listed(&topics[0]).await;
            back.sort_by_key(|t| format!("{t:?}"));
            assert_eq!(back.len(), 2, "subscribed again after the clearing: listed ({back:?})");
            store
        })
        .await;
    }

    /// Schema 9 adds columns one by one; applied again after a run that
    /// stopped before recording it, it skips those already there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_schema_version_that_adds_columns_applies_again_after_a_partial_run() {
        with_store(|store| async move {
            let ks = store.keyspace().to_owned();
            let forget = format!("DELETE FROM {ks}.schema_version WHERE version = 9");
            store.session.query_unpaged(forget, ()).await.unwrap();
            let keyspace = Keyspace::try_from(ks.clone()).unwrap();
            let replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}";
            assert_eq!(schema::migrate(&store.session, &keyspace, replication).await.unwrap(), schema::latest());
            schema::check(&store.session, &keyspace).await.unwrap();
            store
        })
        .await;
    }

    /// A former owner that keeps appending after the next owner claimed
    /// the shard's term (a node paused past its lease, then resumed): its
    /// plain writes land, but readers never see them, its boundary never
    /// moves the shard's, and it overwrites none of the new owner's rows at
    /// the same ids. (It does not acknowledge them either: ingest checks the
    /// lease deadline after the append, tested in `ingest.rs`.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_former_owners_late_appends_are_never_read() {
        with_store(|owner| async move {
            let nodes = test_nodes().unwrap();
            let stale = ScyllaStore::connect(&settings(nodes, owner.keyspace()), SHARD_COUNT).await.unwrap();
            let envelope = |id: u8| {
                let topic = Topic::parse(&[0, 5]).unwrap();
                NewEnvelope::new(topic, SHARD_COUNT, EnvelopeKind::Application, true, None, vec![id], None).unwrap()
            };
            let shard = envelope(0).shard();
            let ids = |appended: Vec<Appended>| {
                appended
                    .into_iter()
                    .map(|a| match a {
                        Appended::Stored { sequence_id } => sequence_id,
                        other => panic!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
            };
            // The former owner's term: ids 1 and 2, acknowledged.
            assert_eq!(ids(stale.append(&[envelope(1), envelope(2)], 1).await.unwrap()), vec![1, 2]);
            // The next owner claims a term from boundary 2 and appends 3..=4.
            assert_eq!(ids(owner.append(&[envelope(3), envelope(4)], 2).await.unwrap()), vec![3, 4]);
            // The former owner, resumed, still allocates from its own memory:
            // ids 3..=5, rows and boundary written under its old term.
            let late = [envelope(13), envelope(14), envelope(15)];
            assert_eq!(ids(stale.append(&late, 3).await.unwrap()), vec![3, 4, 5]);

            let position = owner.shard_position(shard).await.unwrap();
            assert_eq!(position.boundary, 4, "the former owner's boundary 5 is not the shard's");
            let window = owner.read_window(shard, 0, 10, 10).await.unwrap();
            assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
            // The new owner's rows are its own: the former owner's ids 3 and 4
            // went under its old term, beside them.
            let with_hmac = |id: u8| {
                let topic = Topic::parse(&[0, 5]).unwrap();
                let hmac = crate::domain::SenderHmac::parse(&[id; 32]);
                NewEnvelope::new(topic, SHARD_COUNT, EnvelopeKind::Application, true, hmac, vec![id], None).unwrap()
            };
            assert_eq!(ids(owner.append(&[with_hmac(6)], 4).await.unwrap()), vec![5]);
            assert_eq!(ids(stale.append(&[with_hmac(16)], 5).await.unwrap()), vec![6]);
            assert_eq!(owner.envelope_data(shard, 5).await.unwrap(), Some(vec![6]), "not overwritten");
            assert_eq!(owner.envelope_data(shard, 6).await.unwrap(), None, "a stale row is never read");
            assert_eq!(owner.shard_position(shard).await.unwrap().boundary, 5);
            let window = owner.read_window(shard, 4, 10, 10).await.unwrap();
            assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), vec![5]);

            // Checkpoints never move back, and a checkpoint past a term's
            // whole range prunes it; the current term stays readable.
            owner.advance_checkpoint(shard, 4).await.unwrap();
            owner.advance_checkpoint(shard, 2).await.unwrap();
            assert_eq!(owner.shard_position(shard).await.unwrap(), ShardPosition { boundary: 5, checkpoint: 4 });
            let window = owner.read_window(shard, 4, 10, 10).await.unwrap();
            assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), vec![5]);
            owner
        })
        .await;
    }

    /// Dispatch keeps decoded recipients by what they were decoded from (a
    /// copy's recipient columns; a joined row's partition version): a
    /// re-registration (a new token) is seen on the next page, the same
    /// recipient unchanged is the kept one, and a deleted one is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscriber_pages_see_every_change_of_a_kept_recipient() {
        with_store(|store| async move {
            let id = RecipientId::from_bytes([7; 32]);
            let hash = RecipientSecret::parse(&[8; 32]).unwrap().hash();
            let topic = Topic::parse(&[0, 11]).unwrap();
            let sub = Subscription { topic: topic.clone(), keys: None, include_commits: false };
            let token = |t: &str| DeliveryTarget::Fcm { token: t.into() };
            let page = || async { store.subscribers(&topic, None, 10).await.unwrap() };
            store.register(&id, &hash, &token("first"), 1).await.unwrap();
            store
                .update_subscriptions(&id, &hash, &SubscriptionUpdate::new(vec![sub], vec![]).unwrap(), 1, 10)
                .await
                .unwrap();
            let first = page().await;
            assert_eq!(first[0].recipient.target, token("first"));
            assert!(Arc::ptr_eq(&first[0].recipient, &page().await[0].recipient), "unchanged: the kept one");
            store.register(&id, &hash, &token("second"), 2).await.unwrap();
            assert_eq!(page().await[0].recipient.target, token("second"), "re-registered: read anew");
            store.unregister(&id, &hash).await.unwrap();
            assert!(page().await.is_empty(), "deleted");
            store
        })
        .await;
    }

    /// Appends to one shard written side by side: publishes over every
    /// shard at once, each envelope stored once under its own id with none
    /// skipped, read back whole, and every shard's boundary landing at its
    /// last id (for another node's reads) without another append.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_publishes_over_every_shard_take_every_id_once_and_their_boundaries_land() {
        with_store(|store| async move {
            const PUBLISHES: usize = 8;
            const PER_PUBLISH: usize = 64;
            let envelope = |p: usize, i: usize| {
                let topic = Topic::parse(&[0, (p * PER_PUBLISH + i) as u8, p as u8]).unwrap();
                let hmac = crate::domain::SenderHmac::parse(&[i as u8; 32]);
                // 1,000 bytes: several batches per shard.
                let data = [vec![p as u8, i as u8], vec![7; 998]].concat();
                NewEnvelope::new(topic, SHARD_COUNT, EnvelopeKind::Application, true, hmac, data, None).unwrap()
            };
            let batches: Vec<Vec<NewEnvelope>> =
                (0..PUBLISHES).map(|p| (0..PER_PUBLISH).map(|i| envelope(p, i)).collect()).collect();
            let results = futures::future::join_all(batches.iter().map(|b| store.append(b, 1))).await;
            // Another node's view: the stored boundary, not this one's memory.
            let other =
                ScyllaStore::connect(&settings(test_nodes().unwrap(), store.keyspace()), SHARD_COUNT).await.unwrap();
            let mut stored: BTreeMap<ShardId, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
            for (batch, appended) in batches.iter().zip(results) {
                for (e, a) in batch.iter().zip(appended.unwrap()) {
                    let Appended::Stored { sequence_id } = a else { panic!("{a:?}") };
                    stored.entry(e.shard()).or_default().push((sequence_id, e.suppression_data().unwrap().1.to_vec()));
                }
            }
            assert!(stored.len() > 8, "the publishes touch most shards");
            for (shard, mut rows) in stored {
                rows.sort();
                let ids: Vec<u64> = rows.iter().map(|(id, _)| *id).collect();
                assert_eq!(ids, (1..=rows.len() as u64).collect::<Vec<_>>(), "each id once, none skipped");
                let window = store.read_window(shard, 0, u64::MAX, 1000).await.unwrap();
                assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), ids);
                for (id, data) in &rows {
                    assert_eq!(store.envelope_data(shard, *id).await.unwrap().as_ref(), Some(data));
                }
                let want = rows.len() as u64;
                let mut stored_boundary = 0;
                for _ in 0..100 {
                    stored_boundary = other.shard_position(shard).await.unwrap().boundary;
                    if stored_boundary == want {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(stored_boundary, want, "the stored boundary of shard {}", shard.index());
            }
            store
        })
        .await;
    }

    /// An append whose caller goes away while its rows are being written
    /// (a cancelled Publish, or a sibling shard's failure ending the
    /// Publish's join) is done all the same: its ids are a gap, and the
    /// boundary moves over them with the next append instead of stopping
    /// below them for the rest of the term.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_append_dropped_while_writing_does_not_hold_the_boundary_back() {
        with_store(|store| async move {
            let envelope = |id: u8| {
                let topic = Topic::parse(&[0, 5]).unwrap();
                NewEnvelope::new(topic, SHARD_COUNT, EnvelopeKind::Application, true, None, vec![id], None).unwrap()
            };
            let shard = envelope(0).shard();
            store.append(&[envelope(1)], 1).await.unwrap();
            // One poll takes its ids (the term is claimed, the mutex free) and
            // starts the write; then the caller goes away.
            let batch = [envelope(2), envelope(3)];
            let mut dropped = Box::pin(store.append(&batch, 2));
            assert!(futures::poll!(dropped.as_mut()).is_pending(), "the write is under way");
            drop(dropped);
            let appended = store.append(&[envelope(4)], 3).await.unwrap();
            assert_eq!(appended, vec![Appended::Stored { sequence_id: 4 }], "ids 2 and 3 are burnt");
            assert_eq!(store.shard_position(shard).await.unwrap().boundary, 4, "over the dropped append's ids");
            store
        })
        .await;
    }

    /// An append is answered once its rows are durable; its boundary write
    /// follows. When that write never lands (the node died first), the next
    /// term's claim still takes the answered rows into the old term's range
    /// (PUSH-257: nothing acknowledged is left unread).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answered_append_whose_boundary_never_landed_is_read_after_a_handover() {
        with_store(|former| async move {
            let nodes = test_nodes().unwrap();
            let next = ScyllaStore::connect(&settings(nodes, former.keyspace()), SHARD_COUNT).await.unwrap();
            let topic = Topic::parse(&[0, 6]).unwrap();
            let e = NewEnvelope::new(topic, SHARD_COUNT, EnvelopeKind::Application, true, None, vec![], None).unwrap();
            let shard = e.shard();
            let stored = |n| vec![Appended::Stored { sequence_id: n }];
            assert_eq!(former.append(std::slice::from_ref(&e), 1).await.unwrap(), stored(1));
            assert_eq!(former.append(std::slice::from_ref(&e), 2).await.unwrap(), stored(2));
            assert_eq!(former.shard_position(shard).await.unwrap().boundary, 2, "its own: from memory");
            // Its boundary write, landed or not, is undone: a newer cell of 0.
            let (ks, db_shard) = (former.keyspace().to_owned(), i32::from(shard.index()));
            let q = |cql: String| {
                let session = &former.session;
                async move { session.query_unpaged(cql, ()).await.unwrap() }
            };
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let head = q(format!("SELECT term FROM {ks}.shard_terms WHERE shard = {db_shard} LIMIT 1")).await;
            let (term,) = head.into_rows_result().unwrap().first_row::<(i64,)>().unwrap();
            q(format!(
                "UPDATE {ks}.shard_terms USING TIMESTAMP 1000000 SET boundary = 0 WHERE shard = {db_shard} AND term = {term}"
            ))
            .await;
            assert_eq!(next.shard_position(shard).await.unwrap().boundary, 0, "the stored boundary lags");

            assert_eq!(next.append(std::slice::from_ref(&e), 3).await.unwrap(), stored(3), "above the rows");
            let window = next.read_window(shard, 0, 10, 10).await.unwrap();
            assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), vec![1, 2, 3]);
            next
        })
        .await;
    }

    /// A keyspace last written by schema 6 (`shards` and `envelopes`): the
    /// first term carries its boundary and checkpoint over, windows read the
    /// envelopes it kept, and new ones follow in the log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shard_written_before_schema_7_is_carried_over() {
        with_store(|store| async move {
            let topic = Topic::parse(&[0, 5]).unwrap();
            let e = NewEnvelope::new(topic.clone(), SHARD_COUNT, EnvelopeKind::Application, true, None, vec![], None)
                .unwrap();
            let shard = e.shard();
            let ks = store.keyspace().to_owned();
            let db_shard = i32::from(shard.index());
            // What schema 6 left: ids 1..=3 allocated, 3 stored, checkpoint 1.
            let q = |cql: String| {
                let session = &store.session;
                async move { session.query_unpaged(cql, ()).await.unwrap() }
            };
            q(format!("INSERT INTO {ks}.shards (shard, last_id, boundary, checkpoint) VALUES ({db_shard}, 3, 3, 1)"))
                .await;
            q(format!("INSERT INTO {ks}.envelope_buckets (shard, bucket) VALUES ({db_shard}, 0)")).await;
            for pos in [2, 3] {
                q(format!(
                    "INSERT INTO {ks}.envelopes (shard, bucket, pos, topic, kind, server_ts) \
                     VALUES ({db_shard}, 0, {pos}, 0x0005, 1, 7)"
                ))
                .await;
            }
            assert_eq!(store.shard_position(shard).await.unwrap(), ShardPosition { boundary: 3, checkpoint: 1 });
            let ids = |w: Vec<StoredEnvelope>| w.into_iter().map(|e| e.sequence_id).collect::<Vec<_>>();
            assert_eq!(ids(store.read_window(shard, 1, 3, 10).await.unwrap()), vec![2, 3]);
            assert_eq!(
                store.append(std::slice::from_ref(&e), 8).await.unwrap(),
                vec![Appended::Stored { sequence_id: 4 }]
            );
            assert_eq!(store.shard_position(shard).await.unwrap(), ShardPosition { boundary: 4, checkpoint: 1 });
            assert_eq!(ids(store.read_window(shard, 1, 4, 10).await.unwrap()), vec![2, 3, 4]);
            assert_eq!(ids(store.read_window(shard, 2, 4, 1).await.unwrap()), vec![3]);
            store.advance_checkpoint(shard, 3).await.unwrap();
            assert_eq!(ids(store.read_window(shard, 0, 4, 10).await.unwrap()), vec![4]);
            store
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn data_survives_reconnect_and_shard_count_is_fixed() {
        let Some(nodes) = test_nodes() else { return };
        let keyspace = fresh_keyspace();
        let id = RecipientId::from_bytes([9; 32]);
        let hash = RecipientSecret::parse(&[1; 32]).unwrap().hash();
        let topic = Topic::parse(&[0, 42]).unwrap();
        let target = DeliveryTarget::Fcm { token: "tok".into() };
        let sub = Subscription { topic: topic.clone(), keys: None, include_commits: true };
        let envelope =
            NewEnvelope::new(topic.clone(), SHARD_COUNT, EnvelopeKind::Commit, false, None, vec![], None).unwrap();
        let shard = envelope.shard();

        // Without migrate, a keyspace with no schema is refused.
        let no_migrate = ScyllaSettings { migrate: false, ..settings(nodes.clone(), &keyspace) };
        let err = ScyllaStore::connect(&no_migrate, SHARD_COUNT).await.err().expect("no schema yet");
        assert!(matches!(&err, StoreError::Backend(m) if m.contains("fanout migrate")), "{err}");

        let outcome = std::panic::AssertUnwindSafe(async {
            {
                let store = ScyllaStore::connect(&settings(nodes.clone(), &keyspace), SHARD_COUNT).await.unwrap();
                store.register(&id, &hash, &target, 5).await.unwrap();
                store.append(&[envelope.clone(), envelope.clone()], 7).await.unwrap();
                let update = SubscriptionUpdate::new(vec![sub.clone()], vec![]).unwrap();
                store.update_subscriptions(&id, &hash, &update, 6, 10).await.unwrap();
                store.advance_checkpoint(shard, 1).await.unwrap();
            }

            let err = ScyllaStore::connect(&no_migrate, SHARD_COUNT + 1).await.err().expect("another shard count");
            assert!(matches!(&err, StoreError::Backend(m) if m.contains("shard count")), "{err}");

            // A second connect, without migrate, sees everything.
            let store = ScyllaStore::connect(&no_migrate, SHARD_COUNT).await.unwrap();
            let r = store.recipient(&id).await.unwrap().expect("recipient persisted");
            assert_eq!((r.target, r.renewed_at_ns, r.topic_count), (target, 6, 1));
            assert!(r.secret_hash == hash);
            assert_eq!(
                store.subscriptions(&id).await.unwrap(),
                vec![StoredSubscription { subscription: sub, start_position: 2 }]
            );
            assert_eq!(store.shard_position(shard).await.unwrap(), ShardPosition { boundary: 2, checkpoint: 1 });
            let window = store.read_window(shard, 0, 2, 10).await.unwrap();
            assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), vec![2]);
            assert_eq!(window[0].server_ts_ns, 7);
            assert_eq!(store.append(&[envelope], 8).await.unwrap(), vec![Appended::Stored { sequence_id: 3 }]);
        })
        .catch_unwind()
        .await;
        drop_keyspace_then_resume(nodes, &keyspace, outcome).await;
    }

    /// Envelopes across bucket boundaries and far-apart publisher ids: windows
    /// read through the bucket index, and the checkpoint drops whole buckets.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn buckets_are_read_and_pruned_across_boundaries() {
        with_store(|store| async move {
            let topic = Topic::parse(&[0, 7]).unwrap();
            let e = |seq: Option<u64>| {
                NewEnvelope::new(topic.clone(), SHARD_COUNT, EnvelopeKind::Application, true, None, vec![], seq)
                    .unwrap()
            };
            let shard = e(None).shard();
            let far = 5 * BUCKET_SIZE + 17;
            let ids = [BUCKET_SIZE - 2, BUCKET_SIZE - 1, BUCKET_SIZE, BUCKET_SIZE + 1, far, far + 1];
            let r = store.append(&ids.iter().map(|&s| e(Some(s))).collect::<Vec<_>>(), 1).await.unwrap();
            assert_eq!(r, ids.iter().map(|&s| Appended::Stored { sequence_id: s }).collect::<Vec<_>>());
            let all = |w: Vec<StoredEnvelope>| w.into_iter().map(|e| e.sequence_id).collect::<Vec<_>>();
            assert_eq!(all(store.read_window(shard, 0, u64::MAX, 100).await.unwrap()), ids.to_vec());
            assert_eq!(all(store.read_window(shard, BUCKET_SIZE - 2, far, 3).await.unwrap()), ids[1..4].to_vec());
            assert_eq!(all(store.read_window(shard, BUCKET_SIZE + 1, far, 10).await.unwrap()), vec![far]);

            store.advance_checkpoint(shard, BUCKET_SIZE).await.unwrap();
            assert_eq!(all(store.read_window(shard, 0, u64::MAX, 100).await.unwrap()), ids[3..].to_vec());
            store.advance_checkpoint(shard, far).await.unwrap();
            assert_eq!(all(store.read_window(shard, 0, u64::MAX, 100).await.unwrap()), vec![far + 1]);
            store
        })
        .await;
    }

    /// A large UpdateSubscriptions is still one conditional batch: a single
    /// partition's batch is not bound by the server's batch size limits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_update_applies_in_one_batch() {
        with_store(|store| async move {
            let (id, hash) = (RecipientId::from_bytes([3; 32]), RecipientSecret::parse(&[3; 32]).unwrap().hash());
            store.register(&id, &hash, &DeliveryTarget::Fcm { token: "t".into() }, 1).await.unwrap();
            let window = crate::domain::KeyWindow::parse(9, &[vec![1; 42], vec![2; 42], vec![3; 42]]).unwrap();
            let adds: Vec<Subscription> = (0..3000u32)
                .map(|i| Subscription {
                    topic: Topic::parse(&[&[0u8][..], &i.to_be_bytes()].concat()).unwrap(),
                    keys: window.clone(),
                    include_commits: i % 2 == 0,
                })
                .collect();
            let update = SubscriptionUpdate::new(adds.clone(), vec![]).unwrap();
            let s = store.update_subscriptions(&id, &hash, &update, 2, 100_000).await.unwrap();
            assert_eq!(s.topic_count, 3000);
            let stored = store.subscriptions(&id).await.unwrap();
            assert_eq!(stored.into_iter().map(|s| s.subscription).collect::<Vec<_>>(), adds);
            // And all 3000 removed again in one batch.
            let removes = adds.iter().map(|s| s.topic.clone()).collect();
            let update = SubscriptionUpdate::new(vec![], removes).unwrap();
            store.update_subscriptions(&id, &hash, &update, 3, 100_000).await.unwrap();
            assert!(store.subscriptions(&id).await.unwrap().is_empty());
            assert_eq!(store.recipient(&id).await.unwrap().unwrap().topic_count, 0);
            store
        })
        .await;
    }

    /// Concurrent updates of one recipient all apply, one after another: a
    /// batch that lost the race (its version changed) is read and tried again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_updates_of_one_recipient_all_apply() {
        with_store(|store| async move {
            let (id, hash) = (RecipientId::from_bytes([4; 32]), RecipientSecret::parse(&[4; 32]).unwrap().hash());
            store.register(&id, &hash, &DeliveryTarget::Fcm { token: "t".into() }, 1).await.unwrap();
            let updates: Vec<SubscriptionUpdate> = (0..8u8)
                .map(|i| {
                    let sub =
                        Subscription { topic: Topic::parse(&[0, i]).unwrap(), keys: None, include_commits: false };
                    SubscriptionUpdate::new(vec![sub], vec![]).unwrap()
                })
                .collect();
            let results = futures::future::join_all(
                updates.iter().enumerate().map(|(i, u)| store.update_subscriptions(&id, &hash, u, 10 + i as i64, 100)),
            )
            .await;
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            let r = store.recipient(&id).await.unwrap().unwrap();
            assert_eq!(r.topic_count, 8);
            assert_eq!(store.subscriptions(&id).await.unwrap().len(), 8);
            for i in 0..8u8 {
                let page = store.subscribers(&Topic::parse(&[0, i]).unwrap(), None, 10).await.unwrap();
                assert_eq!(page.len(), 1);
            }
            store
        })
        .await;
    }

    /// A dispatch index row whose subscription is gone (a crash between the
    /// index write and the batch) is skipped, and the page is still filled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dangling_index_rows_are_skipped() {
        with_store(|store| async move {
            let topic = Topic::parse(&[0, 5]).unwrap();
            let hash = RecipientSecret::parse(&[1; 32]).unwrap().hash();
            let target = DeliveryTarget::Apns { token: "t".into() };
            let sub = Subscription { topic: topic.clone(), keys: None, include_commits: false };
            for n in [2u8, 4, 6] {
                store.register(&RecipientId::from_bytes([n; 32]), &hash, &target, 1).await.unwrap();
                let update = SubscriptionUpdate::new(vec![sub.clone()], vec![]).unwrap();
                store.update_subscriptions(&RecipientId::from_bytes([n; 32]), &hash, &update, 1, 10).await.unwrap();
            }
            // Index rows with no subscription behind them: no recipient (1, 3),
            // a recipient without that subscription (5).
            store.register(&RecipientId::from_bytes([5; 32]), &hash, &target, 1).await.unwrap();
            for n in [1u8, 3, 5] {
                store
                    .session
                    .write(&store.st.topic_row_put, (topic.as_bytes(), [n; 32].as_slice(), store.clock.next()))
                    .await
                    .unwrap();
            }
            let ids =
                |page: Vec<Subscriber>| page.into_iter().map(|s| s.recipient.id.as_bytes()[0]).collect::<Vec<_>>();
            assert_eq!(ids(store.subscribers(&topic, None, 2).await.unwrap()), vec![2, 4]);
            assert_eq!(
                ids(store.subscribers(&topic, Some(&RecipientId::from_bytes([4; 32])), 2).await.unwrap()),
                vec![6]
            );
            assert_eq!(ids(store.subscribers(&topic, None, 10).await.unwrap()), vec![2, 4, 6]);
            store
        })
        .await;
    }

    /// Concurrent appends to one shard (written side by side) never share an id,
    /// each append's ids increase in its order, every envelope is readable,
    /// and the boundary ends at the last id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_get_distinct_ids() {
        with_store(|store| async move {
            let topic = Topic::parse(&[0, 9]).unwrap();
            let e = NewEnvelope::new(topic, SHARD_COUNT, EnvelopeKind::Application, true, None, vec![], None).unwrap();
            let shard = e.shard();
            let three = [e.clone(), e.clone(), e.clone()];
            let batches = futures::future::join_all((0..64).map(|_| store.append(&three, 1))).await;
            let mut ids = Vec::new();
            for batch in batches {
                let mine: Vec<u64> = batch
                    .unwrap()
                    .into_iter()
                    .map(|a| match a {
                        Appended::Stored { sequence_id } => sequence_id,
                        other => panic!("{other:?}"),
                    })
                    .collect();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
                ids.extend(mine);
            }
            ids.sort_unstable();
            assert_eq!(ids, (1..=192).collect::<Vec<_>>());
            assert_eq!(store.shard_position(shard).await.unwrap().boundary, 192);
            assert_eq!(store.read_window(shard, 0, 192, 1000).await.unwrap().len(), 192);
            store
        })
        .await;
    }
}
