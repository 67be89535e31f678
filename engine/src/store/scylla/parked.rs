//! Parked deliveries on ScyllaDB (`store/parked.rs`) in `parked_deliveries`
//! (schema version 10): one partition per (shard, channel), rows clustered
//! by (sequence_id, recipient_id), so a page is one slice of one partition
//! in `ParkedKey` order.
//!
//! - **Writes.** A park writes each (shard, channel)'s rows as unlogged
//!   single-partition batches (one mutation each, side by side); an unpark
//!   deletes its keys, all of one partition, the same way. Both at the
//!   session's LOCAL_QUORUM, as the recipients' and the dispatch index's
//!   writes: a parked row is on 2 of 3 replicas before the park returns,
//!   so the window may count it settled and the checkpoint may pass it
//!   (PUSH-257), and the shard's next owner, reading at LOCAL_QUORUM, finds
//!   it. Every write carries this process's write clock (`WriteClock`,
//!   strictly increasing), so an unpark and a later park of the same key
//!   from one process land in that order whatever coordinator takes them.
//!   No TTL: a parked delivery waits as long as its channel's outage lasts.
//! - **Tombstones.** Rows are deleted as they are drained, each leaving a
//!   row tombstone until compaction purges it, at the earliest
//!   `gc_grace_seconds` (3 hours here) after the delete. A read after a key
//!   (`(sequence_id, recipient_id) > (?, ?)`) starts its slice there: the
//!   drained rows before it are not read, so a drain that keeps its cursor
//!   pays for the live rows only. A read from the start (`after` = None: a
//!   shard's first drain on a node, after a start or a handover) walks
//!   every tombstone ahead of the first live row that compaction has not
//!   purged yet: after a long outage, about every row the previous owner
//!   drained in the last 3 hours or more (one tombstone each, read and
//!   skipped). Past Cassandra's `tombstone_warn_threshold` (1,000 per
//!   read) it logs a warning; past `tombstone_failure_threshold` (100,000)
//!   the read fails, and succeeds again once compaction has purged them.
//!   The schema file says why 3 hours is safe (a row a repair brings back
//!   is attempted again: a repeat, never a loss).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, future::BoxFuture};
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;

use async_trait::async_trait;

use super::codec::{corrupt, from_db, to_db};
use super::cql::{Values, WriteClock, all_ok, all_rows, be, statements};
use crate::domain::{Channel, EnvelopeKind, MAX_SEQUENCE_ID, ParkedDelivery, ParkedKey, RecipientId, ShardId, Topic};
use crate::store::parked::check_parkable;
use crate::store::{ParkedStore, StoreError};

/// Rows per unlogged (single-partition) batch.
const PARK_BATCH: usize = 64;
/// Batches of one call written at once.
const BATCHES_AT_ONCE: usize = 8;

const COLS: &str = "sequence_id, recipient_id, topic, kind, server_ts, attempts, all_gone";

/// A row as read: the clustering key, then the delivery's columns.
type ParkedRow = (i64, Vec<u8>, Option<Vec<u8>>, Option<i8>, Option<i64>, Option<i32>, Option<bool>);

/// The parked deliveries' `ParkedStore` on ScyllaDB.
pub(super) struct ScyllaParked {
    session: Arc<Session>,
    st: ParkedStatements,
    shard_count: u16,
    /// Write timestamps (the store's one clock).
    clock: Arc<WriteClock>,
}

statements! {
    struct ParkedStatements;
    fn prepare(session, ks);
    put: "INSERT INTO {ks}.parked_deliveries (shard, channel, {COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
          USING TIMESTAMP ?",
    delete: "DELETE FROM {ks}.parked_deliveries USING TIMESTAMP ? \
             WHERE shard = ? AND channel = ? AND sequence_id = ? AND recipient_id = ?",
    first: "SELECT {COLS} FROM {ks}.parked_deliveries WHERE shard = ? AND channel = ? LIMIT ?",
    after: "SELECT {COLS} FROM {ks}.parked_deliveries \
            WHERE shard = ? AND channel = ? AND (sequence_id, recipient_id) > (?, ?) LIMIT ?",
}

impl ScyllaParked {
    pub(super) async fn prepare(
        session: &Arc<Session>,
        ks: &str,
        shard_count: u16,
        clock: Arc<WriteClock>,
    ) -> Result<Self, StoreError> {
        let st = ParkedStatements::prepare(session, ks).await?;
        Ok(Self { session: Arc::clone(session), st, shard_count, clock })
    }

    /// Runs `st` with each of `rows` in unlogged batches of `PARK_BATCH`,
    /// every row of one partition; the first error wins.
    async fn in_batches(
        &self,
        st: &PreparedStatement,
        rows: Vec<Values>,
        what: &'static str,
    ) -> Result<(), StoreError> {
        let mut writes: Vec<BoxFuture<'_, Result<(), StoreError>>> = Vec::new();
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            let chunk: Vec<Values> = rows.by_ref().take(PARK_BATCH).collect();
            let mut batch = Batch::new(BatchType::Unlogged);
            for _ in &chunk {
                batch.append_statement(st.clone());
            }
            writes.push(
                async move {
                    self.session.batch(&batch, chunk).await.map_err(be(what))?;
                    Ok(())
                }
                .boxed(),
            );
        }
        all_ok(writes, BATCHES_AT_ONCE).await
    }
}

/// The partition columns: the shard as `int`, the channel's storage tag as `tinyint`.
fn partition(shard: ShardId, channel: Channel) -> (i32, i8) {
    // Tags fit a tinyint (asserted beside the channel table).
    (i32::from(shard.index()), channel.storage_tag() as i8)
}

/// The values of `put` but its timestamp. Attempts are stored as the
/// `int` of the same bits.
fn encode(d: &ParkedDelivery, ts: i64) -> Values {
    let (shard, channel) = partition(d.shard, d.channel);
    Box::new((
        shard,
        channel,
        to_db(d.sequence_id),
        d.recipient.as_bytes().to_vec(),
        d.topic.as_bytes().to_vec(),
        d.kind as u8 as i8,
        d.server_ts_ns,
        d.attempts as i32,
        d.all_gone,
        ts,
    ))
}

fn decode(shard: ShardId, channel: Channel, row: ParkedRow) -> Result<ParkedDelivery, StoreError> {
    const WHAT: &str = "parked delivery";
    let (seq, recipient, topic, kind, server_ts, attempts, all_gone) = row;
    let (Some(topic), Some(kind), Some(server_ts_ns), Some(attempts), Some(all_gone)) =
        (topic, kind, server_ts, attempts, all_gone)
    else {
        return Err(corrupt(WHAT));
    };
    Ok(ParkedDelivery {
        shard,
        channel,
        sequence_id: from_db(seq),
        recipient: RecipientId::parse(&recipient).map_err(|_| corrupt(WHAT))?,
        topic: Topic::parse(&topic).map_err(|_| corrupt(WHAT))?,
        kind: u8::try_from(kind).ok().and_then(EnvelopeKind::from_u8).ok_or_else(|| corrupt(WHAT))?,
        server_ts_ns,
        attempts: attempts as u32,
        all_gone,
    })
}

#[async_trait]
impl ParkedStore for ScyllaParked {
    async fn park(&self, deliveries: &[ParkedDelivery]) -> Result<(), StoreError> {
        check_parkable(deliveries, self.shard_count)?;
        // Per partition; a key given twice keeps its last delivery, as
        // writing them in order would (one timestamp for all of them).
        let mut partitions: BTreeMap<(i32, i8), BTreeMap<ParkedKey, &ParkedDelivery>> = BTreeMap::new();
        for d in deliveries {
            partitions.entry(partition(d.shard, d.channel)).or_default().insert(d.key(), d);
        }
        let ts = self.clock.next();
        let writes = partitions.into_values().map(|rows| {
            let values = rows.into_values().map(|d| encode(d, ts)).collect();
            self.in_batches(&self.st.put, values, "parking deliveries")
        });
        futures::future::try_join_all(writes).await?;
        Ok(())
    }

    async fn parked(
        &self,
        shard: ShardId,
        channel: Channel,
        after: Option<ParkedKey>,
        limit: usize,
    ) -> Result<Vec<ParkedDelivery>, StoreError> {
        // No sequence id is above MAX_SEQUENCE_ID (`check_parkable`), and
        // CQL refuses LIMIT 0.
        if limit == 0 || after.is_some_and(|a| a.sequence_id > MAX_SEQUENCE_ID) {
            return Ok(Vec::new());
        }
        let (db_shard, db_channel) = partition(shard, channel);
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        const WHAT: &str = "reading parked deliveries";
        let rows: Vec<ParkedRow> = match after {
            None => all_rows(&self.session, &self.st.first, (db_shard, db_channel, limit), WHAT).await?,
            Some(a) => {
                let values = (db_shard, db_channel, to_db(a.sequence_id), a.recipient.as_bytes().as_slice(), limit);
                all_rows(&self.session, &self.st.after, values, WHAT).await?
            }
        };
        rows.into_iter().map(|row| decode(shard, channel, row)).collect()
    }

    async fn unpark(&self, shard: ShardId, channel: Channel, keys: &[ParkedKey]) -> Result<(), StoreError> {
        let (db_shard, db_channel) = partition(shard, channel);
        let ts = self.clock.next();
        let values: Vec<Values> = keys
            .iter()
            // None was parked above MAX_SEQUENCE_ID: nothing to delete there.
            .filter(|k| k.sequence_id <= MAX_SEQUENCE_ID)
            .map(|k| -> Values {
                Box::new((ts, db_shard, db_channel, to_db(k.sequence_id), k.recipient.as_bytes().to_vec()))
            })
            .collect();
        self.in_batches(&self.st.delete, values, "unparking deliveries").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(kind: EnvelopeKind, attempts: u32, all_gone: bool) -> ParkedDelivery {
        ParkedDelivery {
            shard: ShardId::parse(9, 16).unwrap(),
            channel: Channel::WebPush,
            sequence_id: MAX_SEQUENCE_ID,
            recipient: RecipientId::from_bytes([0xab; 32]),
            topic: Topic::parse(&[1; 65]).unwrap(),
            kind,
            server_ts_ns: i64::MIN,
            attempts,
            all_gone,
        }
    }

    /// What `encode` binds, as `decode` reads it back.
    fn as_row(d: &ParkedDelivery) -> ParkedRow {
        (
            to_db(d.sequence_id),
            d.recipient.as_bytes().to_vec(),
            Some(d.topic.as_bytes().to_vec()),
            Some(d.kind as u8 as i8),
            Some(d.server_ts_ns),
            Some(d.attempts as i32),
            Some(d.all_gone),
        )
    }

    #[test]
    fn rows_round_trip_every_field() {
        for (kind, attempts, all_gone) in [
            (EnvelopeKind::Application, 0, false),
            (EnvelopeKind::Welcome, 3, true),
            (EnvelopeKind::Commit, u32::MAX, true),
        ] {
            let d = delivery(kind, attempts, all_gone);
            assert_eq!(decode(d.shard, d.channel, as_row(&d)).unwrap(), d);
        }
        assert_eq!(partition(ShardId::parse(9, 16).unwrap(), Channel::Probe), (9, 100));
    }

    #[test]
    fn a_row_with_a_missing_or_invalid_column_is_corrupt() {
        let d = delivery(EnvelopeKind::Proposal, 1, false);
        let mut rows = vec![as_row(&d); 7];
        rows[0].2 = None;
        rows[1].3 = Some(0);
        rows[2].3 = Some(-1);
        rows[3].5 = None;
        rows[4].6 = None;
        rows[5].1 = vec![1; 31];
        rows[6].2 = Some(vec![9, 1]);
        for row in rows {
            assert!(decode(d.shard, d.channel, row).is_err());
        }
    }
}
