//! A shard's log on CQL (schema 7, `007_shard_terms.cql`): terms, appends,
//! windows and checkpoints without a lightweight transaction per batch.
//!
//! A shard has one writer, the node holding its lease (DESIGN.md). The first
//! append of a process to a shard claims a new *term*: one conditional insert
//! of the term's row in `shard_terms`, whose `base` is the boundary the
//! previous term left. From then on this process allocates the shard's ids in
//! memory (API-203: strictly increasing, above `base`) and every append is
//! plain writes: the envelope rows (unlogged single-partition batches into
//! `shard_log`, keyed by term), then the term's `boundary`, written with the
//! boundary itself as the cell's write timestamp so that the largest value
//! wins whatever order writes land in.
//!
//! An append is answered once its rows are durable, not its boundary: the
//! boundary write follows on its own, beside the next appends, so a Publish
//! waits for one round trip. Until it lands the stored boundary lags what
//! this process has made durable: its own dispatcher (the shard's only one)
//! reads the boundary from memory, a subscription added meanwhile starts at
//! the stored one (an envelope above it is not yet settled, PUSH-216), and
//! the next term's claim takes as its base the highest row of the term
//! before it as well as that term's boundary, so an acknowledged envelope
//! is never left outside every term's range.
//!
//! Fencing. Readers take the boundary of the highest term only, and accept a
//! log row of term `t` at id `x` only while `base(t) < x <= base(next term)`.
//! A former owner that was paused or partitioned can still write (plain
//! writes cannot be refused), but what it writes after the next term was
//! claimed is outside its range and never read, and it can overwrite nothing
//! of the new term's (the term is part of the key). It must also not
//! *acknowledge* such writes: ingest checks the local lease deadline after
//! the append (`Fence`, `ownership.rs`), so an append is acknowledged only
//! when its rows were durable before the lease could have moved, and the
//! next term's claim, made after the lease moved, finds them.
//!
//! Appends to one shard take their ids one at a time (the term's mutex) but
//! write side by side, so a Publish does not wait behind the one before it.
//! The boundary moves over an append only once every append below it is
//! done (`Writing`): a window never passes ids whose rows may still land.
//!
//! Failures. An append that fails after its ids were taken, or whose caller
//! goes away while it writes (`Taken`), burns them: the boundary moves over
//! the gap once it is done (its rows, if any landed, were never
//! acknowledged: at worst a publisher's retry delivers twice). Ids are never
//! handed out twice within a term.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use futures::stream::TryStreamExt;
use futures::{FutureExt, StreamExt, future::BoxFuture};
use scylla::client::session::Session;
use scylla::statement::Consistency;
use scylla::statement::batch::{Batch, BatchType};

use super::codec::{self, BUCKET_SIZE, EnvelopeRow, bucket_of, from_db, pos_of, to_db};
use super::cql::{
    Execute, JOIN_CONCURRENCY, PAGE_ROWS, Values, all_ok, all_rows, at, backoff, be, first_row, retried, retry, rows,
    statements,
};
use super::settings::LogConsistency;
use crate::domain::{NewEnvelope, ShardId, ShardProgress, StoredEnvelope, next_sequence_id};
use crate::store::{Appended, ShardPosition, StoreError};

/// Envelope rows per unlogged (single-partition) batch.
const ENVELOPE_BATCH: usize = 64;

/// The shards' logs, with this process's term of each.
pub(super) struct ShardLog {
    session: Arc<Session>,
    st: LogStatements,
    /// This process's term of each shard.
    terms: Vec<TermSlot>,
}

/// This process's term of one shard: what it may append under.
#[derive(Debug, Clone, Copy)]
struct Term {
    term: i64,
    /// The largest id handed out (burnt ids of a failed append included).
    last: u64,
    /// The largest bucket whose index row this term wrote.
    indexed: Option<i64>,
}

/// One shard's term in this process. The mutex serialises the allocation of
/// the shard's ids here (and a term's claim), not the writes: an append
/// writes its rows after letting it go. `forgotten` is set, without waiting
/// for an append in flight, when the lease moved or may have (`ShardLeases`
/// on the `ScyllaStore`).
#[derive(Default)]
struct TermSlot {
    term: tokio::sync::Mutex<Option<Term>>,
    forgotten: AtomicBool,
    /// The term `durable` is of (0: none), and the largest id below which
    /// every append of it is done: the boundary before its write lands.
    durable_term: AtomicI64,
    durable: AtomicU64,
    /// The appends of the current term whose rows are being written.
    writing: std::sync::Mutex<Writing>,
}

/// The appends of one term whose rows are being written, and how far the
/// finished ones reach. Appends take ids in order but may finish in any
/// order: the boundary covers only ids below the lowest one still writing.
#[derive(Debug, Default)]
struct Writing {
    term: i64,
    /// First id → last id of each append in flight.
    open: BTreeMap<u64, u64>,
    /// The largest id of a finished append (or the term's base).
    finished: u64,
}

impl Writing {
    /// Starts `term` at `base`, forgetting a former term's appends.
    fn start(&mut self, term: i64, base: u64) {
        *self = Self { term, open: BTreeMap::new(), finished: base };
    }

    /// Ends the append of `term` at `first..=last` (written or failed: a
    /// failed one's ids are burnt), and returns the new durable boundary,
    /// if it is still this term's.
    fn finish(&mut self, term: i64, first: u64, last: u64) -> Option<u64> {
        if self.term != term {
            return None;
        }
        self.open.remove(&first);
        self.finished = self.finished.max(last);
        Some(self.open.keys().next().map_or(self.finished, |lowest| lowest - 1))
    }
}

/// An append whose ids are taken, done when dropped, written or not: a
/// failed append's ids are a gap (its rows, if some landed, were never
/// acknowledged), and so are those of an append whose caller went away
/// while it wrote (a cancelled Publish, or a sibling shard's failure ending
/// the Publish's join), which must not hold the boundary back for the rest
/// of the term.
struct Taken<'a> {
    log: &'a ShardLog,
    shard: ShardId,
    term: i64,
    first: u64,
    last: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.log.finish(self);
    }
}

/// One log row to write.
#[derive(Clone, Copy)]
struct Row<'a> {
    seq: u64,
    envelope: &'a NewEnvelope,
    now_ns: i64,
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A `shard_log` row as a window reads it: the legacy columns, then its term.
type LogRow = (i32, Vec<u8>, i8, i64, Option<Vec<u8>>, Option<Vec<u8>>, Option<String>, Option<i8>, i64);

const ENVELOPE_COLS: &str = "topic, kind, server_ts, sender_hmac, inline_data, message_id, membership";

statements! {
    /// The statements of the log: writes at `store.scylla.consistency.writes`,
    /// reads at `.reads`; the term's claim is a conditional write at LOCAL_QUORUM.
    struct LogStatements;
    fn prepare(session, ks, reads: Consistency, writes: Consistency);
    // Retried by the driver: a repeat of a claim that applied is not
    // applied, and the next claim takes the term above (cql.rs).
    claim: "INSERT INTO {ks}.shard_terms (shard, term, base) VALUES (?, ?, ?) IF NOT EXISTS"
        => |st| retried(at(Consistency::LocalQuorum)(st)),
    // The highest term first (CLUSTERING ORDER BY term DESC); a partition
    // holding only static cells answers one row with a null term.
    head: "SELECT term, base, boundary, checkpoint, legacy_boundary FROM {ks}.shard_terms WHERE shard = ? LIMIT 1"
        => at(reads),
    terms: "SELECT term, base, legacy_boundary FROM {ks}.shard_terms WHERE shard = ?" => at(reads),
    boundary: "UPDATE {ks}.shard_terms USING TIMESTAMP ? SET boundary = ? WHERE shard = ? AND term = ?" => at(writes),
    checkpoint: "UPDATE {ks}.shard_terms USING TIMESTAMP ? SET checkpoint = ? WHERE shard = ?" => at(writes),
    legacy_marks: "UPDATE {ks}.shard_terms USING TIMESTAMP ? SET checkpoint = ?, legacy_boundary = ? WHERE shard = ?"
        => at(writes),
    drop_term: "DELETE FROM {ks}.shard_terms WHERE shard = ? AND term = ?" => at(writes),
    legacy_shard: "SELECT boundary, checkpoint FROM {ks}.shards WHERE shard = ?" => at(reads),
    bucket_put: "INSERT INTO {ks}.envelope_buckets (shard, bucket) VALUES (?, ?)" => at(writes),
    bucket_list: "SELECT bucket FROM {ks}.envelope_buckets WHERE shard = ? AND bucket >= ? AND bucket <= ?"
        => at(reads),
    bucket_del: "DELETE FROM {ks}.envelope_buckets WHERE shard = ? AND bucket = ?" => at(writes),
    put: "INSERT INTO {ks}.shard_log (shard, bucket, pos, term, topic, kind, server_ts, sender_hmac, data, \
          inline_data, message_id, membership) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" => at(writes),
    // A window never reads the data; `data` does, per page (PUSH-230).
    read: "SELECT pos, {ENVELOPE_COLS}, term FROM {ks}.shard_log \
           WHERE shard = ? AND bucket = ? AND pos >= ? AND pos <= ?" => at(reads),
    data: "SELECT term, data FROM {ks}.shard_log WHERE shard = ? AND bucket = ? AND pos = ?" => at(reads),
    drop_bucket: "DELETE FROM {ks}.shard_log WHERE shard = ? AND bucket = ?" => at(writes),
    drop_upto: "DELETE FROM {ks}.shard_log WHERE shard = ? AND bucket = ? AND pos <= ?" => at(writes),
    legacy_read: "SELECT pos, {ENVELOPE_COLS} FROM {ks}.envelopes \
                  WHERE shard = ? AND bucket = ? AND pos >= ? AND pos <= ?" => at(reads),
    legacy_data: "SELECT data FROM {ks}.envelopes WHERE shard = ? AND bucket = ? AND pos = ?" => at(reads),
    legacy_drop_bucket: "DELETE FROM {ks}.envelopes WHERE shard = ? AND bucket = ?" => at(writes),
    legacy_drop_upto: "DELETE FROM {ks}.envelopes WHERE shard = ? AND bucket = ? AND pos <= ?" => at(writes),
    progress_put: "UPDATE {ks}.shard_progress SET progress = ? WHERE shard = ?" => at(writes),
    progress_get: "SELECT progress FROM {ks}.shard_progress WHERE shard = ?" => at(reads),
    last_rows: "SELECT pos, term FROM {ks}.shard_log WHERE shard = ? AND bucket = ? ORDER BY pos DESC, term DESC"
        => at(reads),
}

/// The head of `shard_terms`: the current term and the shard's marks.
#[derive(Debug, Clone, Copy, Default)]
struct Head {
    /// `None`: no term was ever claimed (an empty shard, or one last written
    /// by schema 6 and earlier).
    term: Option<i64>,
    boundary: u64,
    checkpoint: u64,
}

/// Every live term of a shard with its base, ascending, and the boundary of
/// the rows kept in the legacy table.
struct Terms {
    bases: Vec<(i64, u64)>,
    /// Ids at or below it are read from `envelopes` (schema 6 and earlier).
    legacy: u64,
}

impl Terms {
    /// Whether a log row of term `term` at `seq` was written inside its range.
    fn valid(&self, term: i64, seq: u64) -> bool {
        let Some(i) = self.bases.iter().position(|(t, _)| *t == term) else { return false };
        seq > self.bases[i].1 && self.bases.get(i + 1).is_none_or(|(_, next)| seq <= *next)
    }
}

impl ShardLog {
    /// Prepares the log's statements, with no term of any of `shard_count` shards yet.
    pub(super) async fn prepare(
        session: &Arc<Session>,
        ks: &str,
        consistency: LogConsistency,
        shard_count: u16,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            session: Arc::clone(session),
            st: LogStatements::prepare(session, ks, consistency.reads.cql(), consistency.writes.cql()).await?,
            terms: (0..shard_count).map(|_| TermSlot::default()).collect(),
        })
    }

    async fn head(&self, db_shard: i32) -> Result<Head, StoreError> {
        type HeadRow = (Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
        let row = first_row::<HeadRow>(&self.session, &self.st.head, (db_shard,), "reading a shard").await?;
        let (term, base, boundary, checkpoint, _) = row.unwrap_or_default();
        Ok(Head {
            term,
            boundary: from_db(base.unwrap_or(0)).max(from_db(boundary.unwrap_or(0))),
            checkpoint: from_db(checkpoint.unwrap_or(0)),
        })
    }

    /// The row a shard had in `shards` before schema 7: boundary and checkpoint.
    async fn legacy_marks(&self, db_shard: i32) -> Result<(u64, u64), StoreError> {
        let row = first_row(&self.session, &self.st.legacy_shard, (db_shard,), "reading a shard").await?;
        let (boundary, checkpoint): (Option<i64>, Option<i64>) = row.unwrap_or_default();
        Ok((from_db(boundary.unwrap_or(0)), from_db(checkpoint.unwrap_or(0))))
    }

    async fn terms(&self, db_shard: i32) -> Result<Terms, StoreError> {
        let rows: Vec<(Option<i64>, Option<i64>, Option<i64>)> =
            all_rows(&self.session, &self.st.terms, (db_shard,), "reading shard terms").await?;
        let legacy = rows.first().and_then(|r| r.2).map(from_db);
        let mut bases: Vec<(i64, u64)> =
            rows.iter().filter_map(|(term, base, _)| Some(((*term)?, from_db(base.unwrap_or(0))))).collect();
        bases.sort_unstable();
        // No term claimed yet: everything is still in the legacy table.
        let legacy = if bases.is_empty() { u64::MAX } else { legacy.unwrap_or(0) };
        Ok(Terms { bases, legacy })
    }

    /// A shard's boundary and checkpoint: those of its current term, or of
    /// its legacy row when no term was claimed yet.
    pub(super) async fn position(&self, shard: ShardId) -> Result<ShardPosition, StoreError> {
        let db_shard = i32::from(shard.index());
        let head = self.head(db_shard).await?;
        if let Some(term) = head.term {
            // This process's own term: what it made durable, written or not yet.
            let slot = &self.terms[usize::from(shard.index())];
            let durable = (slot.durable_term.load(Ordering::Acquire) == term
                && !slot.forgotten.load(Ordering::Acquire))
            .then(|| slot.durable.load(Ordering::Acquire));
            let boundary = head.boundary.max(durable.unwrap_or(0));
            return Ok(ShardPosition { boundary, checkpoint: head.checkpoint });
        }
        let (boundary, checkpoint) = self.legacy_marks(db_shard).await?;
        Ok(ShardPosition { boundary, checkpoint: checkpoint.max(head.checkpoint) })
    }

    /// The shard's current (highest) term; `None` when none was claimed yet.
    pub(super) async fn current_term(&self, shard: ShardId) -> Result<Option<u64>, StoreError> {
        Ok(self.head(i32::from(shard.index())).await?.term.map(from_db))
    }

    /// Claims the next term of `shard`: one conditional insert. Its base is
    /// the current term's boundary (or the legacy row's), read just before.
    async fn claim_term(&self, shard: ShardId) -> Result<Term, StoreError> {
        let db_shard = i32::from(shard.index());
        retry(|| async move {
            let head = self.head(db_shard).await?;
            let (term, base) = match head.term {
                // Its boundary may lag its answered appends (the module's doc).
                Some(t) => {
                    let written = head.boundary.max(head.checkpoint);
                    (t + 1, written.max(self.last_row(db_shard, t, written).await?.unwrap_or(0)))
                }
                None => {
                    // The first term after schema 6: carry its marks over
                    // (idempotent, before the claim makes the term visible).
                    let (boundary, checkpoint) = self.legacy_marks(db_shard).await?;
                    let checkpoint = checkpoint.max(head.checkpoint);
                    if boundary > 0 || checkpoint > 0 {
                        let ts = to_db(checkpoint.max(1));
                        self.session.write(&self.st.legacy_marks, (ts, ts, to_db(boundary), db_shard)).await?;
                    }
                    (1, boundary)
                }
            };
            if !self.session.lwt(&self.st.claim, (db_shard, term, to_db(base))).await?.applied {
                return Ok(None);
            }
            tracing::debug!(shard = shard.index(), term, base, "claimed a shard term");
            let slot = &self.terms[usize::from(shard.index())];
            let mut writing = lock(&slot.writing);
            writing.start(term, base);
            slot.durable.store(base, Ordering::Release);
            slot.durable_term.store(term, Ordering::Release);
            drop(writing);
            Ok(Some(Term { term, last: base, indexed: None }))
        })
        .await
    }

    /// Whether this process has a term of `shard` it has not forgotten:
    /// it most likely holds the shard's lease (a hint, never a proof).
    pub(super) fn has_term(&self, shard: ShardId) -> bool {
        let slot = &self.terms[usize::from(shard.index())];
        slot.durable_term.load(Ordering::Acquire) != 0 && !slot.forgotten.load(Ordering::Acquire)
    }

    /// Forgets this process's term of `shard`: its lease moved (or may have),
    /// so the next append claims a new one.
    pub(super) fn forget_term(&self, shard: ShardId) {
        self.terms[usize::from(shard.index())].forgotten.store(true, Ordering::Release);
    }

    /// Claims a term for a shard whose lease this process just acquired, so
    /// that its first publish does not wait for the claim. A failure leaves
    /// it to the first append.
    pub(super) async fn start_term(&self, shard: ShardId) {
        let slot = &self.terms[usize::from(shard.index())];
        let mut term = slot.term.lock().await;
        slot.forgotten.store(false, Ordering::Release);
        *term = None;
        match self.claim_term(shard).await {
            Ok(t) => *term = Some(t),
            Err(e) => {
                tracing::debug!(shard = shard.index(), error = %e, "no term claimed yet; the first append claims it")
            }
        }
    }

    /// Appends one shard's envelopes (`indices` into `envelopes`) under this
    /// process's term: ids taken in memory, then the rows written, then the
    /// boundary. Appends to one shard are written side by side (only the
    /// ids are taken one append at a time), and each is answered once its
    /// own rows are durable; the boundary moves over an append only once
    /// every append below it is done.
    pub(super) async fn append_shard(
        &self,
        shard: ShardId,
        envelopes: &[NewEnvelope],
        indices: &[usize],
        now_ns: i64,
    ) -> Result<Vec<(usize, Appended)>, StoreError> {
        let slot = &self.terms[usize::from(shard.index())];
        let mut results = Vec::with_capacity(indices.len());
        let mut rows: Vec<Row<'_>> = Vec::new();
        let (current, taken) = {
            let mut term = slot.term.lock().await;
            if slot.forgotten.swap(false, Ordering::AcqRel) {
                *term = None;
            }
            let current = match *term {
                Some(t) => t,
                None => *term.insert(self.claim_term(shard).await?),
            };
            let mut last = current.last;
            for &i in indices {
                let e = &envelopes[i];
                // A refused id fails its own envelope; the rest go on.
                let seq = match next_sequence_id(last, e.sequence_id) {
                    Ok(id) => id,
                    Err(refusal) => {
                        results.push((i, Appended::Refused(refusal)));
                        continue;
                    }
                };
                last = seq;
                // PUSH-219: only push-eligible envelopes are stored for dispatch.
                if e.is_push_eligible() {
                    rows.push(Row { seq, envelope: e, now_ns });
                }
                results.push((i, Appended::Stored { sequence_id: seq }));
            }
            if last == current.last {
                // Every envelope was refused: nothing to write.
                return Ok(results);
            }
            // Taken before any write: a failure below burns these ids, never reuses them.
            term.as_mut().expect("claimed above").last = last;
            lock(&slot.writing).open.insert(current.last + 1, last);
            (current, Taken { log: self, shard, term: current.term, first: current.last + 1, last })
        };
        let written = self.write_rows(shard, current, rows).await;
        if let Ok(indexed) = written {
            let mut term = slot.term.lock().await;
            if let Some(t) = term.as_mut().filter(|t| t.term == current.term) {
                t.indexed = t.indexed.max(indexed);
            }
        }
        drop(taken);
        written.map(|_| results)
    }

    /// Ends an append (`Taken`): the boundary may move over it, here at once
    /// and in the store once its write lands.
    fn finish(&self, taken: &Taken<'_>) {
        let slot = &self.terms[usize::from(taken.shard.index())];
        let moved = {
            // Under the lock a claim takes too: never a former term's boundary in a new term.
            let mut writing = lock(&slot.writing);
            let durable = writing.finish(taken.term, taken.first, taken.last);
            durable.filter(|&d| slot.durable.fetch_max(d, Ordering::AcqRel) < d)
        };
        if let Some(durable) = moved {
            self.write_boundary(taken.shard, taken.term, durable);
        }
    }

    /// Writes a term's boundary beside the next appends, a few times on
    /// failure. One that never lands costs only lag: a later append's
    /// boundary covers it, and the next term's claim finds the rows.
    fn write_boundary(&self, shard: ShardId, term: i64, boundary: u64) {
        const ATTEMPTS: u32 = 5;
        let (session, st) = (Arc::clone(&self.session), self.st.boundary.clone());
        let values = (to_db(boundary), to_db(boundary), i32::from(shard.index()), term);
        // Outside a runtime (an append dropped as it shuts down) the write is
        // left to the next term's claim, which finds the rows.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            for attempt in 1..=ATTEMPTS {
                match session.write(&st, values).await {
                    Ok(()) => return,
                    Err(e) if attempt == ATTEMPTS => {
                        tracing::warn!(shard = shard.index(), term, error = %e, "a shard boundary write failed")
                    }
                    Err(_) => backoff(attempt + 3).await,
                }
            }
        });
    }

    /// The highest id with a row of `term` above `floor`, if any: the
    /// buckets from the top down, each from its highest position.
    async fn last_row(&self, db_shard: i32, term: i64, floor: u64) -> Result<Option<u64>, StoreError> {
        const WHAT: &str = "reading a term's last envelope";
        let buckets = self.buckets(db_shard, bucket_of(floor.saturating_add(1)), i64::MAX).await?;
        for bucket in buckets.into_iter().rev() {
            let mut rows = rows::<(i32, i64)>(&self.session, &self.st.last_rows, (db_shard, bucket), WHAT).await?;
            while let Some((pos, t)) = rows.try_next().await? {
                let seq = codec::seq_of(bucket, pos);
                if seq <= floor {
                    return Ok(None);
                }
                if t == term {
                    return Ok(Some(seq));
                }
            }
        }
        Ok(None)
    }

    /// The bucket index rows this term has not written yet, then the rows in
    /// unlogged single-partition batches. Returns the highest bucket indexed.
    async fn write_rows(&self, shard: ShardId, term: Term, rows: Vec<Row<'_>>) -> Result<Option<i64>, StoreError> {
        let db_shard = i32::from(shard.index());
        let mut by_bucket: BTreeMap<i64, Vec<Row<'_>>> = BTreeMap::new();
        for row in rows {
            by_bucket.entry(bucket_of(row.seq)).or_default().push(row);
        }
        let new_buckets: Vec<i64> = by_bucket.keys().copied().filter(|b| term.indexed < Some(*b)).collect();
        let writes: Vec<BoxFuture<'_, Result<(), StoreError>>> =
            new_buckets.iter().map(|b| self.session.write(&self.st.bucket_put, (db_shard, *b)).boxed()).collect();
        all_ok(writes, JOIN_CONCURRENCY).await?;
        let mut batches: Vec<BoxFuture<'_, Result<(), StoreError>>> = Vec::new();
        for (bucket, rows) in &by_bucket {
            for chunk in rows.chunks(ENVELOPE_BATCH) {
                batches.push(self.write_envelopes(db_shard, *bucket, term.term, chunk).boxed());
            }
        }
        all_ok(batches, 8).await?;
        Ok(by_bucket.keys().next_back().copied().max(term.indexed))
    }

    /// One unlogged single-partition batch of log rows.
    async fn write_envelopes(&self, shard: i32, bucket: i64, term: i64, rows: &[Row<'_>]) -> Result<(), StoreError> {
        let mut batch = Batch::new(BatchType::Unlogged);
        // Plain writes of this term's own rows: the same values again (cql.rs).
        batch.set_is_idempotent(true);
        let mut values: Vec<Values> = Vec::with_capacity(rows.len());
        for &Row { seq, envelope: e, now_ns } in rows {
            // PUSH-230: keep the HMAC input only where suppression can use it.
            let (hmac, data) = e.suppression_data().map_or((&[][..], &[][..]), |(h, d)| (h.as_bytes(), d));
            batch.append_statement(self.st.put.clone());
            values.push(Box::new((
                shard,
                bucket,
                pos_of(seq),
                term,
                e.topic().as_bytes().to_vec(),
                e.kind() as u8 as i8,
                now_ns,
                hmac.to_vec(),
                data.to_vec(),
                e.inline_data().to_vec(),
                e.relay.message_id.as_ref().map(|m| m.as_str().to_owned()),
                e.relay.membership.map(|m| m as u8 as i8),
            )));
        }
        self.session.batch(&batch, values).await.map_err(be("writing envelopes"))?;
        Ok(())
    }

    async fn buckets(&self, db_shard: i32, first: i64, last: i64) -> Result<Vec<i64>, StoreError> {
        let rows = rows(&self.session, &self.st.bucket_list, (db_shard, first, last), "reading envelope buckets");
        rows.await?.map_ok(|(b,): (i64,)| b).try_collect().await
    }

    /// `Store::read_window`: the valid rows of `after < id <= up_to`.
    pub(super) async fn window(
        &self,
        shard: ShardId,
        after: u64,
        up_to: u64,
        limit: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        if after >= up_to || limit == 0 {
            return Ok(Vec::new());
        }
        let db_shard = i32::from(shard.index());
        let terms = self.terms(db_shard).await?;
        let first = after + 1;
        let mut out = Vec::new();
        for bucket in self.buckets(db_shard, bucket_of(first), bucket_of(up_to)).await? {
            let lo = first.max(codec::seq_of(bucket, 0));
            let hi = up_to.min(codec::seq_of(bucket, (BUCKET_SIZE - 1) as i32));
            // The legacy table holds the ids up to its boundary, the log the rest.
            if lo <= terms.legacy {
                let legacy_hi = hi.min(terms.legacy);
                self.read_rows(shard, bucket, lo, legacy_hi, None, limit, &mut out).await?;
            }
            if hi > terms.legacy && out.len() < limit {
                let log_lo = lo.max(terms.legacy.saturating_add(1));
                self.read_rows(shard, bucket, log_lo, hi, Some(&terms), limit, &mut out).await?;
            }
            if out.len() == limit {
                break;
            }
        }
        Ok(out)
    }

    /// Reads `lo..=hi` of one bucket into `out` (up to `limit` in all), from
    /// the log when `terms` is given (valid rows only), else the legacy table.
    #[allow(clippy::too_many_arguments)]
    async fn read_rows(
        &self,
        shard: ShardId,
        bucket: i64,
        lo: u64,
        hi: u64,
        terms: Option<&Terms>,
        limit: usize,
        out: &mut Vec<StoredEnvelope>,
    ) -> Result<(), StoreError> {
        let db_shard = i32::from(shard.index());
        let key = (db_shard, bucket, pos_of(lo), pos_of(hi));
        let page = i32::try_from(limit - out.len()).unwrap_or(PAGE_ROWS).min(PAGE_ROWS);
        let mut st = if terms.is_some() { self.st.read.clone() } else { self.st.legacy_read.clone() };
        st.set_page_size(page);
        let pager = self.session.execute_iter(st, key).await.map_err(be("reading envelopes"))?;
        // Legacy rows have no term; log rows carry theirs last.
        let mut rows: futures::stream::BoxStream<'_, Result<(EnvelopeRow, Option<i64>), StoreError>> =
            if terms.is_some() {
                let rows = pager.rows_stream::<LogRow>().map_err(be("reading envelopes"))?;
                rows.map_ok(|r| ((r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7), Some(r.8)))
                    .map_err(be("reading envelopes"))
                    .boxed()
            } else {
                let rows = pager.rows_stream::<EnvelopeRow>().map_err(be("reading envelopes"))?;
                rows.map_ok(|row| (row, None)).map_err(be("reading envelopes")).boxed()
            };
        while let Some((row, term)) = rows.try_next().await? {
            // A row of another term's range is skipped: a former owner's
            // unacknowledged write.
            if let (Some(terms), Some(term)) = (terms, term)
                && !terms.valid(term, codec::seq_of(bucket, row.0))
            {
                continue;
            }
            out.push(codec::decode_envelope(shard, bucket, row)?);
            if out.len() == limit {
                break;
            }
        }
        Ok(())
    }

    /// `Store::envelope_data`. Of several rows at one id the valid one is the
    /// highest term's: a term writes only above its base, which is at least
    /// every earlier term's range.
    pub(super) async fn data(&self, shard: ShardId, sequence_id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let db_shard = i32::from(shard.index());
        let key = (db_shard, bucket_of(sequence_id), pos_of(sequence_id));
        let terms = self.terms(db_shard).await?;
        let data = if sequence_id <= terms.legacy {
            let row = first_row(&self.session, &self.st.legacy_data, key, "reading envelope data").await?;
            row.and_then(|(d,): (Option<Vec<u8>>,)| d)
        } else {
            let rows = self
                .session
                .execute_unpaged(&self.st.data, key)
                .await
                .map_err(be("reading envelope data"))?
                .into_rows_result()
                .map_err(be("reading envelope data"))?;
            let mut best: Option<(i64, Option<Vec<u8>>)> = None;
            for row in rows.rows::<(i64, Option<Vec<u8>>)>().map_err(be("reading envelope data"))? {
                let (term, data) = row.map_err(be("reading envelope data"))?;
                if terms.valid(term, sequence_id) && best.as_ref().is_none_or(|(t, _)| term > *t) {
                    best = Some((term, data));
                }
            }
            best.and_then(|(_, d)| d)
        };
        Ok(data.filter(|d| !d.is_empty()))
    }

    /// `Store::record_progress`: a plain overwrite (every value states
    /// first attempts already made; schema 8).
    pub(super) async fn put_progress(&self, shard: ShardId, progress: &ShardProgress) -> Result<(), StoreError> {
        self.session.write(&self.st.progress_put, (progress.encode(), i32::from(shard.index()))).await
    }

    /// `Store::shard_progress`.
    pub(super) async fn progress(&self, shard: ShardId) -> Result<ShardProgress, StoreError> {
        let values = (i32::from(shard.index()),);
        let row = first_row(&self.session, &self.st.progress_get, values, "reading shard progress").await?;
        match row.and_then(|(bytes,): (Option<Vec<u8>>,)| bytes) {
            Some(bytes) => ShardProgress::decode(&bytes).map_err(|_| codec::corrupt("shard progress")),
            None => Ok(ShardProgress::default()),
        }
    }

    /// `Store::advance_checkpoint`: forward only (the value is its own write
    /// timestamp), never above the boundary; then drops what lies below it.
    pub(super) async fn checkpoint(&self, shard: ShardId, checkpoint: u64) -> Result<(), StoreError> {
        let db_shard = i32::from(shard.index());
        // The reads are independent: one round trip, not three.
        let (position, terms, buckets) = futures::try_join!(
            self.position(shard),
            self.terms(db_shard),
            self.buckets(db_shard, 0, bucket_of(checkpoint)),
        )?;
        let new = checkpoint.min(position.boundary);
        if new <= position.checkpoint {
            return Ok(());
        }
        self.session.write(&self.st.checkpoint, (to_db(new), to_db(new), db_shard)).await?;
        // Every delivery at or below the checkpoint had its first attempt: drop
        // whole buckets below it, then the rows at or below it in its bucket.
        let mut drops: Vec<BoxFuture<'_, Result<(), StoreError>>> = Vec::new();
        for bucket in buckets.into_iter().filter(|b| *b <= bucket_of(new)) {
            let legacy = terms.legacy > 0 && codec::seq_of(bucket, 0) <= terms.legacy;
            if codec::seq_of(bucket, (BUCKET_SIZE - 1) as i32) <= new {
                if legacy {
                    drops.push(self.session.write(&self.st.legacy_drop_bucket, (db_shard, bucket)).boxed());
                }
                drops.push(self.session.write(&self.st.drop_bucket, (db_shard, bucket)).boxed());
                drops.push(self.session.write(&self.st.bucket_del, (db_shard, bucket)).boxed());
            } else {
                if legacy {
                    drops.push(self.session.write(&self.st.legacy_drop_upto, (db_shard, bucket, pos_of(new))).boxed());
                }
                drops.push(self.session.write(&self.st.drop_upto, (db_shard, bucket, pos_of(new))).boxed());
            }
        }
        // A term whose whole range is at or below the checkpoint has nothing
        // left to read: its row goes (never the current term's). Any subset
        // of them may go first: a kept term's range then reaches up to the
        // base of the next kept one, which is at or below the checkpoint.
        let spent: BTreeSet<i64> = terms.bases.windows(2).filter(|w| w[1].1 <= new).map(|w| w[0].0).collect();
        for term in spent {
            drops.push(self.session.write(&self.st.drop_term, (db_shard, term)).boxed());
        }
        all_ok(drops, JOIN_CONCURRENCY).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boundary_stays_below_the_lowest_append_still_writing() {
        let mut w = Writing::default();
        w.start(3, 10);
        // Three appends of term 3: 11..=12, 13..=15, 16..=16.
        w.open.extend([(11, 12), (13, 15), (16, 16)]);
        assert_eq!(w.finish(3, 13, 15), Some(10), "11..=12 may still land");
        assert_eq!(w.finish(3, 16, 16), Some(10));
        assert_eq!(w.finish(3, 11, 12), Some(16), "all done: up to the last");
        w.open.insert(17, 20);
        w.open.insert(21, 22);
        assert_eq!(w.finish(3, 17, 20), Some(20), "done, failed or not: its ids are a gap");
        // A claim starts another term: a former term's append moves nothing.
        w.start(4, 22);
        assert_eq!(w.finish(3, 21, 22), None);
        assert_eq!(w.finished, 22);
    }

    #[test]
    fn a_row_is_valid_only_inside_its_terms_range() {
        let terms = Terms { bases: vec![(3, 10), (4, 20), (6, 20), (7, 35)], legacy: 10 };
        assert!(!terms.valid(3, 10), "at the base: the previous term's");
        assert!(terms.valid(3, 11));
        assert!(terms.valid(3, 20));
        assert!(!terms.valid(3, 21), "above the next term's base: a stale owner's late write");
        assert!(!terms.valid(4, 20) && !terms.valid(4, 21), "a term that took no id");
        assert!(terms.valid(6, 21) && terms.valid(6, 35) && !terms.valid(6, 36));
        assert!(terms.valid(7, 36) && terms.valid(7, u64::MAX), "the current term: up to its boundary");
        assert!(!terms.valid(5, 25), "an unknown (pruned or never claimed) term");
    }
}
