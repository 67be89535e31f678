//! The embedded backend: one redb file in a local directory (DESIGN.md, storage).
//!
//! redb is synchronous: reads run on tokio's blocking pool, each in its own
//! read transaction; writes run on one writer thread that commits the writes
//! waiting together in one transaction (group commit, `commit.rs`), each
//! trait method's writes all or nothing. Records use a small hand-written
//! binary encoding, version byte first (see `codec`).
//!
//! Tables:
//! - `meta`: `"shard_count"` → u16, fixed at first open.
//! - `recipients`: id → secret hash, target, renewal time, topic count.
//! - `recipient_subs`: id ‖ topic → subscription (a recipient's topics, in topic order).
//! - `topic_subs`: topic_len ‖ topic ‖ id → subscription (a topic's subscribers, by id).
//! - `shards`: shard → boundary, checkpoint, last id.
//! - `envelopes`: (shard, sequence id) → push-eligible envelope.
//! - `relay_deliveries`, `relay_expiry`: spec 003 §2.5 records (`relay.rs`).
//! - `parked`: (shard, channel, sequence id, recipient) → a parked delivery (`parked.rs`).
//! - `gw_*`: spec 002's push gateway records (`gateway.rs`).
//!
//! The gateway's window state and notify claims and the relay ingress's
//! claims are staged in memory until the next transaction (`staged.rs`).

mod codec;
mod commit;
mod gateway;
mod parked;
mod relay;
mod staged;
mod time_index;

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use self::codec::{OrBackend, ShardRow, corrupt};
use self::staged::{Asks, Cas, StagedState, Update};
use self::time_index::{BytesTable, PRUNE_BATCH};
use super::recipient_cache::{self, RecipientCache};
use super::{Appended, CopyMark, RegistrationRemoval, ShardLeases, ShardPosition, Store, StoreError};
use crate::domain::{
    Channel, DeliveryTarget, GatewayRegistration, GatewayWakeup, LeasedWakeup, NewEnvelope, NotifyClaim, NotifyKey,
    ParkedDelivery, ParkedKey, PushTargetId, Recipient, RecipientId, RecipientSummary, RegistrationId, RelayClaim,
    RelayKey, RelaySettled, Revoke, RouteKey, SecretHash, ServiceId, ShardId, ShardProgress, StoredEnvelope,
    StoredSubscription, Subscriber, SubscriptionUpdate, Topic, next_sequence_id,
};

/// The database file inside the configured directory.
const DB_FILE_NAME: &str = "fanout.redb";

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const RECIPIENTS: TableDefinition<&[u8; 32], &[u8]> = TableDefinition::new("recipients");
const RECIPIENT_SUBS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("recipient_subs");
const TOPIC_SUBS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("topic_subs");
const SHARDS: TableDefinition<u16, &[u8]> = TableDefinition::new("shards");
const ENVELOPES: TableDefinition<(u16, u64), &[u8]> = TableDefinition::new("envelopes");
/// A shard's `ShardProgress`, in its stored form.
const PROGRESS: TableDefinition<u16, &[u8]> = TableDefinition::new("shard_progress");

const META_SHARD_COUNT: &str = "shard_count";

type RecipientsTable<'t> = redb::Table<'t, &'static [u8; 32], &'static [u8]>;

/// The embedded `Store` on redb.
pub struct RedbStore {
    db: Arc<Database>,
    writer: commit::GroupCommit,
    shard_count: u16,
    /// Dispatch's decoded recipients (`recipient_cache`).
    recipients: Arc<RecipientCache>,
    /// The gateway's window state and the notify and relay claims between
    /// commits (`staged.rs`), each key behind its kind (`STAGED_*`).
    staged: Arc<StagedState>,
}

/// redb's own default page cache: 1 GiB.
pub const DEFAULT_CACHE_BYTES: usize = 1024 * 1024 * 1024;

impl RedbStore {
    /// Opens (or creates) `<dir>/fanout.redb`. The shard count is recorded on
    /// first open; opening later with another count fails, since every stored
    /// shard id and start position depends on it.
    pub fn open(dir: &Path, shard_count: u16) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, shard_count, DEFAULT_CACHE_BYTES)
    }

    /// Whether `dir` holds a store (`open` would open it rather than create one).
    pub fn exists(dir: &Path) -> bool {
        dir.join(DB_FILE_NAME).is_file()
    }

    /// As `open`, with redb's page cache bounded to `cache_bytes`: the cache is
    /// most of the embedded store's memory once the data outgrows it.
    pub fn open_with_cache(dir: &Path, shard_count: u16, cache_bytes: usize) -> Result<Self, StoreError> {
        if shard_count == 0 {
            return Err(StoreError::Backend("shard count must be at least 1".into()));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Backend(format!("cannot create the storage directory: {e}")))?;
        let db =
            redb::Builder::new().set_cache_size(cache_bytes).create(dir.join(DB_FILE_NAME)).map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(
                    "another process has the database open (one fanout process per store.path; stop it first)".into(),
                ),
                e => StoreError::Backend(e.to_string()),
            })?;

        let txn = db.begin_write().be()?;
        // Create every table up front, so read transactions can always open them.
        txn.open_table(RECIPIENTS).be()?;
        txn.open_table(SHARDS).be()?;
        txn.open_table(ENVELOPES).be()?;
        txn.open_table(PROGRESS).be()?;
        txn.open_table(parked::PARKED).be()?;
        let byte_tables = [RECIPIENT_SUBS, TOPIC_SUBS, relay::RELAY, relay::RELAY_EXPIRY];
        for table in byte_tables.into_iter().chain(gateway::TABLES) {
            txn.open_table(table).be()?;
        }
        let stored = {
            let mut meta = txn.open_table(META).be()?;
            let stored = meta.get(META_SHARD_COUNT).be()?.map(|g| g.value().to_vec());
            if stored.is_none() {
                meta.insert(META_SHARD_COUNT, shard_count.to_be_bytes().as_slice()).be()?;
            }
            stored.map(|bytes| <[u8; 2]>::try_from(bytes.as_slice()).map(u16::from_be_bytes)).transpose()
        };
        if let Some(existing) = stored.map_err(|_| corrupt("meta"))?.filter(|&n| n != shard_count) {
            txn.abort().be()?;
            return Err(StoreError::Backend(format!(
                "the database was created with {existing} shards but {shard_count} are configured; \
                 the shard count cannot change"
            )));
        }
        txn.commit().be()?;
        let db = Arc::new(db);
        let recipients = Arc::new(RecipientCache::new(recipient_cache::CAPACITY));
        let staged = Arc::new(StagedState::default());
        let staging = commit::Staging { state: staged.clone(), put: put_staged };
        Ok(Self { writer: commit::GroupCommit::start(db.clone(), Some(staging))?, db, shard_count, recipients, staged })
    }

    /// Runs `f` in a read transaction on the blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<T, StoreError> + Send + 'static,
    {
        let db = self.db.clone();
        let task = tokio::task::spawn_blocking(move || f(&db.begin_read().be()?));
        task.await.map_err(|e| StoreError::Backend(format!("storage task failed: {e}")))?
    }

    /// Runs `f` in a read transaction on the calling task: for point reads
    /// of a few records, where the blocking pool's hand-off (a thread woken,
    /// the task woken back) costs more than the read (see INLINE_SUBSCRIBERS).
    async fn read_here<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    {
        f(&self.db.begin_read().be()?)
    }

    /// A staged key's record as stored (not as staged), on the calling
    /// task: a point read.
    fn stored_staged(&self, key: &[u8]) -> Result<Option<staged::Value>, StoreError> {
        let txn = self.db.begin_read().be()?;
        match key.split_first() {
            Some((&STAGED_STATE, k)) => gateway::stored_state(&txn, k),
            Some((&STAGED_RELAY, k)) => relay::stored(&txn, k),
            Some((&STAGED_NOTIFY, k)) => gateway::stored_notify(&txn, k),
            _ => Err(unknown_staged()),
        }
    }

    /// A claim decided by `decide` against the current record of staged key
    /// `key` and staged (`staged.rs`) without asking for a commit: the
    /// claimer's own commit or release, a write, carries it.
    async fn stage<R>(
        &self,
        key: &[u8],
        decide: impl Fn(Option<&staged::Value>) -> Result<(Option<staged::Value>, R), StoreError>,
    ) -> Result<R, StoreError> {
        loop {
            match self.staged.update(key, Asks::Nothing, || self.stored_staged(key), &decide)? {
                Update::Set { decided, .. } | Update::Kept(decided) => return Ok(decided),
                // A transaction writes (and then forgets) what is staged.
                Update::Full => self.write_with_next(|_| Ok(())).await?,
            }
        }
    }

    /// Runs `f` in a write transaction, shared with the writes queued with
    /// it (group commit): answers once that transaction committed; `Err`
    /// from `f` discards its writes and fails it alone. `f` may run more
    /// than once (see `commit.rs`); only its last run counts.
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    {
        self.writer.write(commit::Sync::Now, f).await
    }

    /// `write`, answered once committed and synced with the next `write`
    /// (`commit::Sync::WithNext`): for a step whose result reaches no one
    /// outside the process before a later `write` does.
    async fn write_with_next<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    {
        self.writer.write(commit::Sync::WithNext, f).await
    }

    /// Retention: `prune_batch` in write transactions, until one deletes
    /// fewer than `PRUNE_BATCH`. Returns how many were deleted.
    async fn prune(
        &self,
        prune_batch: fn(&WriteTransaction, i64) -> Result<usize, StoreError>,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0u64;
        loop {
            let n = self.write(move |txn| prune_batch(txn, now_ms)).await?;
            deleted += n as u64;
            if n < PRUNE_BATCH {
                return Ok(deleted);
            }
        }
    }
}

fn summary(r: &Recipient) -> RecipientSummary {
    RecipientSummary { topic_count: r.topic_count, channel: r.target.channel(), renewed_at_ns: r.renewed_at_ns }
}

fn get_recipient(
    table: &impl ReadableTable<&'static [u8; 32], &'static [u8]>,
    id: &RecipientId,
) -> Result<Option<Recipient>, StoreError> {
    table.get(id.as_bytes()).be()?.map(|g| codec::decode_recipient(*id, g.value())).transpose()
}

fn put_recipient(table: &mut RecipientsTable<'_>, r: &Recipient) -> Result<(), StoreError> {
    table.insert(r.id.as_bytes(), codec::encode_recipient(r).as_slice()).be()?;
    Ok(())
}

/// PUSH-253 check 3 as the store sees it: the recipient must exist and its
/// hash must match (constant-time, `SecretHash`'s ==).
fn authorized(table: &RecipientsTable<'_>, id: &RecipientId, hash: &SecretHash) -> Result<Recipient, StoreError> {
    let r = get_recipient(table, id)?.ok_or(StoreError::NotFound)?;
    if r.secret_hash != *hash {
        return Err(StoreError::SecretMismatch);
    }
    Ok(r)
}

fn get_shard(table: &impl ReadableTable<u16, &'static [u8]>, shard: ShardId) -> Result<ShardRow, StoreError> {
    table.get(shard.index()).be()?.map(|g| codec::decode_shard(g.value())).transpose().map(Option::unwrap_or_default)
}

// ---- keys ----

fn recipient_sub_key(id: &RecipientId, topic: &[u8]) -> Vec<u8> {
    [id.as_bytes().as_slice(), topic].concat()
}

/// Bounds covering every `recipient_subs` key of `id`: a topic is at most 65
/// bytes and starts with a kind byte below 0xff.
fn recipient_sub_bounds(id: &RecipientId) -> (Vec<u8>, Vec<u8>) {
    (id.as_bytes().to_vec(), [id.as_bytes().as_slice(), &[0xff; 66]].concat())
}

fn topic_sub_prefix(topic: &[u8]) -> Vec<u8> {
    let len = u8::try_from(topic.len()).expect("a topic is at most 65 bytes");
    [&[len], topic].concat()
}

fn topic_sub_key(topic: &[u8], id: &RecipientId) -> Vec<u8> {
    [topic_sub_prefix(topic).as_slice(), id.as_bytes()].concat()
}

/// Both subscription tables of a write transaction, kept in step.
struct Subs<'t> {
    by_recipient: BytesTable<'t>,
    by_topic: BytesTable<'t>,
}

impl<'t> Subs<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Self { by_recipient: txn.open_table(RECIPIENT_SUBS).be()?, by_topic: txn.open_table(TOPIC_SUBS).be()? })
    }

    fn get(&self, id: &RecipientId, topic: &Topic) -> Result<Option<StoredSubscription>, StoreError> {
        let key = recipient_sub_key(id, topic.as_bytes());
        self.by_recipient
            .get(key.as_slice())
            .be()?
            .map(|g| codec::decode_subscription(topic.clone(), g.value()))
            .transpose()
    }

    fn contains(&self, id: &RecipientId, topic: &Topic) -> Result<bool, StoreError> {
        let key = recipient_sub_key(id, topic.as_bytes());
        Ok(self.by_recipient.get(key.as_slice()).be()?.is_some())
    }

    fn put(&mut self, id: &RecipientId, sub: &StoredSubscription) -> Result<(), StoreError> {
        let topic = sub.subscription.topic.as_bytes();
        let value = codec::encode_subscription(sub);
        self.by_recipient.insert(recipient_sub_key(id, topic).as_slice(), value.as_slice()).be()?;
        self.by_topic.insert(topic_sub_key(topic, id).as_slice(), value.as_slice()).be()?;
        Ok(())
    }

    /// Returns whether the subscription was stored.
    fn remove(&mut self, id: &RecipientId, topic: &[u8]) -> Result<bool, StoreError> {
        let existed = self.by_recipient.remove(recipient_sub_key(id, topic).as_slice()).be()?.is_some();
        self.by_topic.remove(topic_sub_key(topic, id).as_slice()).be()?;
        Ok(existed)
    }

    fn remove_all(&mut self, id: &RecipientId) -> Result<(), StoreError> {
        let (lo, hi) = recipient_sub_bounds(id);
        let topics = self
            .by_recipient
            .range(lo.as_slice()..=hi.as_slice())
            .be()?
            .map(|row| row.map(|(k, _)| k.value()[32..].to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .be()?;
        for topic in topics {
            self.remove(id, &topic)?;
        }
        Ok(())
    }
}

/// Deletes a recipient and every subscription it holds (PUSH-207/226/234).
fn delete_recipient(txn: &WriteTransaction, id: &RecipientId) -> Result<(), StoreError> {
    txn.open_table(RECIPIENTS).be()?.remove(id.as_bytes()).be()?;
    Subs::open(txn)?.remove_all(id)
}

#[async_trait]
impl Store for RedbStore {
    fn backend_name(&self) -> &'static str {
        "redb"
    }

    fn relay(&self) -> &dyn super::RelayStore {
        self
    }

    fn gateway(&self) -> &dyn super::GatewayStore {
        self
    }

    fn parked(&self) -> &dyn super::ParkedStore {
        self
    }

    /// One process opens a redb directory: it owns every shard.
    fn leases(self: Arc<Self>) -> Option<Arc<dyn ShardLeases>> {
        None
    }

    /// One transaction changes a subscription and the topic index together:
    /// there are no copies to mark.
    async fn copy_marks(&self, _limit: usize) -> Result<Vec<CopyMark>, StoreError> {
        Ok(Vec::new())
    }

    async fn clear_copy_marks(&self, _marks: &[CopyMark]) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn recipient(&self, id: &RecipientId) -> Result<Option<Recipient>, StoreError> {
        let id = *id;
        self.read(move |txn| get_recipient(&txn.open_table(RECIPIENTS).be()?, &id)).await
    }

    async fn register(
        &self,
        id: &RecipientId,
        secret_hash: &SecretHash,
        target: &DeliveryTarget,
        now_ns: i64,
    ) -> Result<RecipientSummary, StoreError> {
        let (id, secret_hash, target) = (*id, *secret_hash, target.clone());
        self.write(move |txn| {
            let mut recipients = txn.open_table(RECIPIENTS).be()?;
            // PUSH-255: create with no subscriptions, or replace the target and keep them.
            let topic_count = match get_recipient(&recipients, &id)? {
                Some(existing) if existing.secret_hash != secret_hash => {
                    return Err(StoreError::SecretMismatch);
                }
                Some(existing) => existing.topic_count,
                None => 0,
            };
            let r = Recipient { id, secret_hash, target: target.clone(), renewed_at_ns: now_ns, topic_count };
            put_recipient(&mut recipients, &r)?;
            Ok(summary(&r))
        })
        .await
    }

    async fn unregister(&self, id: &RecipientId, secret_hash: &SecretHash) -> Result<(), StoreError> {
        let (id, secret_hash) = (*id, *secret_hash);
        self.write(move |txn| {
            authorized(&txn.open_table(RECIPIENTS).be()?, &id, &secret_hash)?;
            // PUSH-207: the recipient and every subscription it holds.
            delete_recipient(txn, &id)
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
        let (id, secret_hash, update) = (*id, *secret_hash, update.clone());
        let shard_count = self.shard_count;
        self.write(move |txn| {
            let mut recipients = txn.open_table(RECIPIENTS).be()?;
            let mut r = authorized(&recipients, &id, &secret_hash)?;
            let shards = txn.open_table(SHARDS).be()?;
            let mut subs = Subs::open(txn)?;

            // First read what the update would do, then write: PUSH-217 is
            // decided before any write, so a refused update costs
            // reads only. PUSH-215 keeps a topic out of both lists.
            let mut count = r.topic_count;
            let mut removed = Vec::with_capacity(update.removes.len());
            for topic in &update.removes {
                // PUSH-216: a removed topic that is not stored changes nothing.
                if subs.contains(&id, topic)? {
                    removed.push(topic);
                    count = count.saturating_sub(1);
                }
            }
            let mut stored = Vec::with_capacity(update.adds.len());
            for sub in &update.adds {
                let start_position = match subs.get(&id, &sub.topic)? {
                    // PUSH-216: a replaced topic keeps its start position.
                    Some(existing) => existing.start_position,
                    // PUSH-216: a new topic starts at its shard's boundary, read in this txn.
                    None => {
                        count += 1;
                        get_shard(&shards, sub.topic.shard(shard_count))?.boundary
                    }
                };
                stored.push(StoredSubscription { subscription: sub.clone(), start_position });
            }
            // PUSH-217: over the limit, nothing is written.
            if count > max_topics {
                return Err(StoreError::TopicLimit);
            }
            for topic in removed {
                subs.remove(&id, topic.as_bytes())?;
            }
            for sub in &stored {
                subs.put(&id, sub)?;
            }
            // PUSH-255: set the renewal time in the same transaction.
            r.topic_count = count;
            r.renewed_at_ns = now_ns;
            put_recipient(&mut recipients, &r)?;
            Ok(summary(&r))
        })
        .await
    }

    async fn subscriptions(&self, id: &RecipientId) -> Result<Vec<StoredSubscription>, StoreError> {
        let id = *id;
        self.read(move |txn| {
            let table = txn.open_table(RECIPIENT_SUBS).be()?;
            let (lo, hi) = recipient_sub_bounds(&id);
            let rows = table.range(lo.as_slice()..=hi.as_slice()).be()?;
            rows.map(|row| {
                let (k, v) = row.be()?;
                codec::decode_subscription(Topic::from_stored(k.value()[32..].to_vec()), v.value())
            })
            .collect()
        })
        .await
    }

    async fn delete_recipient_if_unchanged(&self, expected: &Recipient) -> Result<bool, StoreError> {
        let expected = expected.clone();
        self.write(move |txn| {
            let stored = get_recipient(&txn.open_table(RECIPIENTS).be()?, &expected.id)?;
            // PUSH-234: the target (for a relay registration its provider and
            // token, 003 §2.4) and the secret hash must still match.
            let unchanged =
                stored.is_some_and(|s| s.target.still_names(&expected.target) && s.secret_hash == expected.secret_hash);
            if unchanged {
                delete_recipient(txn, &expected.id)?;
            }
            Ok(unchanged)
        })
        .await
    }

    async fn remove_relay_registration(&self, removal: &RegistrationRemoval) -> Result<bool, StoreError> {
        let removal = removal.clone();
        self.write(move |txn| {
            let mut recipients = txn.open_table(RECIPIENTS).be()?;
            let stored = get_recipient(&recipients, removal.id())?;
            // 003 §1: the registration goes, the recipient and its subscriptions stay.
            match removal.apply(stored)? {
                Some(r) => put_recipient(&mut recipients, &r).map(|()| true),
                None => Ok(false),
            }
        })
        .await
    }

    async fn delete_expired(&self, renewed_before_ns: i64) -> Result<u64, StoreError> {
        self.write(move |txn| {
            // PUSH-226: strictly older than the cutoff.
            let mut expired = Vec::new();
            for row in txn.open_table(RECIPIENTS).be()?.iter().be()? {
                let (k, v) = row.be()?;
                let id = RecipientId::from_bytes(*k.value());
                if codec::decode_recipient(id, v.value())?.renewed_at_ns < renewed_before_ns {
                    expired.push(id);
                }
            }
            for id in &expired {
                delete_recipient(txn, id)?;
            }
            Ok(expired.len() as u64)
        })
        .await
    }

    async fn append(&self, envelopes: &[NewEnvelope], now_ns: i64) -> Result<Vec<Appended>, StoreError> {
        for e in envelopes {
            if e.shard() != e.topic().shard(self.shard_count) {
                return Err(StoreError::Backend("envelope shard does not match the store's shard count".into()));
            }
        }
        let envelopes = envelopes.to_vec();
        self.write(move |txn| {
            let mut shards = txn.open_table(SHARDS).be()?;
            let mut stored = txn.open_table(ENVELOPES).be()?;
            let mut touched: BTreeMap<u16, ShardRow> = BTreeMap::new();
            let mut results = Vec::with_capacity(envelopes.len());
            for e in &envelopes {
                let row = match touched.entry(e.shard().index()) {
                    Entry::Occupied(row) => row.into_mut(),
                    Entry::Vacant(slot) => slot.insert(get_shard(&shards, e.shard())?),
                };
                // A refused id fails its own envelope; the rest of the batch goes on.
                let sequence_id = match next_sequence_id(row.last, e.sequence_id) {
                    Ok(id) => id,
                    Err(refusal) => {
                        results.push(Appended::Refused(refusal));
                        continue;
                    }
                };
                row.last = sequence_id;
                // PUSH-219: only push-eligible envelopes are stored for dispatch.
                if e.is_push_eligible() {
                    // PUSH-230 and 003 §3: see `stored_hmac_and_data`.
                    let (sender_hmac, data) = e.stored_hmac_and_data();
                    let envelope = StoredEnvelope {
                        shard: e.shard(),
                        sequence_id,
                        topic: e.topic().clone(),
                        kind: e.kind(),
                        server_ts_ns: now_ns,
                        sender_hmac,
                        data: e.inline_data().to_vec(),
                        relay: e.relay.clone(),
                    };
                    stored
                        .insert((e.shard().index(), sequence_id), codec::encode_envelope(&envelope, &data).as_slice())
                        .be()?;
                }
                results.push(Appended::Stored { sequence_id });
            }
            // The whole batch commits together, so each touched shard's boundary
            // (API-203) is its last id; ids only grow, so it never decreases (API-291).
            for (shard, mut row) in touched {
                row.boundary = row.boundary.max(row.last);
                shards.insert(shard, codec::encode_shard(&row).as_slice()).be()?;
            }
            Ok(results)
        })
        .await
    }

    async fn shard_position(&self, shard: ShardId) -> Result<ShardPosition, StoreError> {
        self.read(move |txn| {
            let row = get_shard(&txn.open_table(SHARDS).be()?, shard)?;
            Ok(ShardPosition { boundary: row.boundary, checkpoint: row.checkpoint })
        })
        .await
    }

    async fn read_window(
        &self,
        shard: ShardId,
        after: u64,
        up_to: u64,
        limit: usize,
    ) -> Result<Vec<StoredEnvelope>, StoreError> {
        if after >= up_to || limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |txn| {
            let table = txn.open_table(ENVELOPES).be()?;
            let range = (Bound::Excluded((shard.index(), after)), Bound::Included((shard.index(), up_to)));
            let rows = table.range(range).be()?.take(limit);
            rows.map(|row| row.be().and_then(|(k, v)| codec::decode_envelope(shard, k.value().1, v.value()))).collect()
        })
        .await
    }

    async fn envelope_data(&self, shard: ShardId, sequence_id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(move |txn| {
            let table = txn.open_table(ENVELOPES).be()?;
            let Some(value) = table.get((shard.index(), sequence_id)).be()? else {
                return Ok(None);
            };
            let data = codec::decode_envelope_data(value.value())?;
            Ok((!data.is_empty()).then(|| data.to_vec()))
        })
        .await
    }

    async fn advance_checkpoint(&self, shard: ShardId, checkpoint: u64) -> Result<(), StoreError> {
        super::check_shard(shard, self.shard_count)?;
        self.write(move |txn| {
            let mut shards = txn.open_table(SHARDS).be()?;
            let mut row = get_shard(&shards, shard)?;
            // Never back, never above the boundary.
            let new = row.checkpoint.max(checkpoint.min(row.boundary));
            if new != row.checkpoint {
                row.checkpoint = new;
                shards.insert(shard.index(), codec::encode_shard(&row).as_slice()).be()?;
            }
            // Every delivery at or below the checkpoint had its first attempt: drop them.
            let mut envelopes = txn.open_table(ENVELOPES).be()?;
            envelopes.retain_in((shard.index(), 0)..=(shard.index(), new), |_, _| false).be()?;
            Ok(())
        })
        .await
    }

    async fn record_progress(&self, shard: ShardId, progress: &ShardProgress) -> Result<(), StoreError> {
        super::check_shard(shard, self.shard_count)?;
        let bytes = progress.encode();
        self.write(move |txn| {
            txn.open_table(PROGRESS).be()?.insert(shard.index(), bytes.as_slice()).be()?;
            Ok(())
        })
        .await
    }

    async fn shard_progress(&self, shard: ShardId) -> Result<ShardProgress, StoreError> {
        super::check_shard(shard, self.shard_count)?;
        self.read(move |txn| {
            let table = txn.open_table(PROGRESS).be()?;
            let Some(value) = table.get(shard.index()).be()? else { return Ok(ShardProgress::default()) };
            ShardProgress::decode(value.value()).map_err(|_| codec::corrupt("shard progress"))
        })
        .await
    }

    async fn subscribers(
        &self,
        topic: &Topic,
        after: Option<&RecipientId>,
        limit: usize,
    ) -> Result<Vec<Subscriber>, StoreError> {
        // The head of the page is read here, the rest (if the topic has more)
        // on the blocking pool: see INLINE_SUBSCRIBERS.
        let head_limit = limit.min(INLINE_SUBSCRIBERS);
        let cache = &self.recipients;
        let mut page = read_subscribers(&self.db.begin_read().be()?, cache, topic, after, head_limit)?;
        if page.len() < head_limit || limit == head_limit {
            return Ok(page);
        }
        let (topic, after, cache) = (topic.clone(), page.last().map(|s| s.recipient.id), cache.clone());
        let rest = limit - head_limit;
        let tail = self.read(move |txn| read_subscribers(txn, &cache, &topic, after.as_ref(), rest)).await?;
        page.extend(tail);
        Ok(page)
    }
}

/// An argument of a `RedbStore` method as its transaction's closure holds
/// it: owned, since the closure outlives the call, and lent back to the
/// function the closure calls.
trait Arg<'a> {
    type Owned: Send + 'static;
    fn own(self) -> Self::Owned;
    fn lend(owned: &'a Self::Owned) -> Self;
}

impl<'a, T: ToOwned<Owned: Send + 'static> + ?Sized> Arg<'a> for &'a T {
    type Owned = T::Owned;
    fn own(self) -> T::Owned {
        self.to_owned()
    }
    fn lend(owned: &'a T::Owned) -> &'a T {
        owned.borrow()
    }
}

impl<'a> Arg<'a> for Option<&'a [u8]> {
    type Owned = Option<Vec<u8>>;
    fn own(self) -> Option<Vec<u8>> {
        self.map(<[u8]>::to_vec)
    }
    fn lend(owned: &'a Option<Vec<u8>>) -> Self {
        owned.as_deref()
    }
}

macro_rules! copied_args {
    ($($t:ty),*) => {$(
        impl Arg<'_> for $t {
            type Owned = $t;
            fn own(self) -> $t {
                self
            }
            fn lend(owned: &$t) -> $t {
                *owned
            }
        }
    )*};
}

copied_args!(i64, u32, usize, RelaySettled, ShardId, Channel, Option<ParkedKey>);

/// Implements `$trait` for `RedbStore`: each listed method runs the function
/// of its name in `$module` in a `read` or a `write` transaction, with its
/// arguments (`Arg`); what follows the list is the trait's other methods.
/// (The traits are named by path: imported, their `register`,
/// `delete_expired` ... would be ambiguous with `Store`'s here.)
macro_rules! in_transactions {
    (
        $trait:path, $module:ident {
            $($mode:ident fn $name:ident($($arg:ident: $ty:ty),*) -> $ok:ty;)*
        }
        $($other:tt)*
    ) => {
        #[async_trait]
        impl $trait for RedbStore {
            $(async fn $name(&self, $($arg: $ty),*) -> Result<$ok, StoreError> {
                $(let $arg = Arg::own($arg);)*
                self.$mode(move |txn| $module::$name(txn, $(Arg::lend(&$arg)),*)).await
            })*
            $($other)*
        }
    };
}

in_transactions! {
    super::RelayStore, relay {
        // The settlement, which answers later retries, is synced.
        write fn settle(key: &RelayKey, lease_until_ms: i64, settled: RelaySettled, expires_at_ms: i64) -> ();
        write_with_next fn release(key: &RelayKey, lease_until_ms: i64) -> ();
    }

    // Staged in memory (`staged.rs`) and written by the next transaction, at
    // the latest its own settlement's or release's. A claim lost in a crash
    // lets the hub's retry send again, as its lease running out would.
    async fn claim(
        &self,
        key: &RelayKey,
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<RelayClaim, StoreError> {
        let key = staged_key(STAGED_RELAY, &relay::key_bytes(key)?);
        self.stage(&key, |current| relay::decide_claim(current, now_ms, lease_until_ms, expires_at_ms)).await
    }

    async fn delete_expired(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.prune(relay::prune_batch, now_ms).await
    }
}

/// The kinds of staged keys: their first byte.
const STAGED_STATE: u8 = 0;
const STAGED_RELAY: u8 = 1;
const STAGED_NOTIFY: u8 = 2;

fn staged_key(kind: u8, key: &[u8]) -> Vec<u8> {
    [&[kind], key].concat()
}

fn unknown_staged() -> StoreError {
    StoreError::Backend("a staged record of an unknown kind".into())
}

/// Writes a staged record (`commit::Staging::put`) to its table.
fn put_staged(txn: &WriteTransaction, key: &[u8], value: &staged::Value) -> Result<(), StoreError> {
    match key.split_first() {
        Some((&STAGED_STATE, k)) => gateway::put_state(txn, k, value),
        Some((&STAGED_RELAY, k)) => relay::put_staged(txn, k, value),
        Some((&STAGED_NOTIFY, k)) => gateway::put_staged_notify(txn, k, value),
        _ => Err(unknown_staged()),
    }
}

in_transactions! {
    super::GatewayStore, gateway {
        write fn register(registration: &GatewayRegistration) -> Option<RegistrationId>;
        write fn unregister(revoke: &Revoke) -> bool;
        // The reads (`read_here`) are point reads of a few records, several
        // per notify: on the calling task.
        read_here fn route(route: &RouteKey, now_ms: i64) -> Option<GatewayRegistration>;
        read_here fn target(tenant: &ServiceId, push_target_id: &PushTargetId, now_ms: i64) -> Vec<GatewayRegistration>;
        write fn mark_token_invalid(route: &RouteKey, registration_id: &RegistrationId) -> bool;
        // A notify's claim (staged, below) reaches the caller only through
        // its answer, committed (and synced) by `notify_commit`; a lease or
        // a reschedule lost in a crash makes a wakeup due again, as an
        // expired lease does. A delivered wakeup's delete is synced: it is
        // not sent again.
        write fn notify_commit(key: &NotifyKey, lease_until_ms: i64, response: &[u8], wakeups: &[GatewayWakeup],
            expires_at_ms: i64) -> bool;
        write_with_next fn notify_release(key: &NotifyKey, lease_until_ms: i64) -> ();
        write_with_next fn wakeups_due(now_ms: i64, lease_until_ms: i64, limit: usize) -> Vec<LeasedWakeup>;
        write_with_next fn wakeup_reschedule(leased: &LeasedWakeup, not_before_ms: i64, attempts: u32) -> bool;
        write fn wakeup_delete(leased: &LeasedWakeup) -> bool;
    }

    // Staged in memory (`staged.rs`), written by the next transaction, at the
    // latest the one of its own commit or release.
    async fn notify_claim(
        &self,
        key: &NotifyKey,
        digest: &[u8; 32],
        now_ms: i64,
        lease_until_ms: i64,
        expires_at_ms: i64,
    ) -> Result<NotifyClaim, StoreError> {
        let key = staged_key(STAGED_NOTIFY, &gateway::notify_key(key)?);
        self.stage(&key, |current| {
            gateway::decide_notify_claim(current, digest, now_ms, lease_until_ms, expires_at_ms)
        })
        .await
    }

    // Window state: staged in memory, written by the next transaction
    // (`staged.rs`).
    async fn state(&self, tenant: &ServiceId, key: &[u8], now_ms: i64) -> Result<Option<Vec<u8>>, StoreError> {
        let key = staged_key(STAGED_STATE, &gateway::state_key(tenant, key)?);
        let found = match self.staged.get(&key) {
            Some(staged) => Some(staged),
            None => self.stored_staged(&key)?,
        };
        Ok(staged::live(found.as_ref(), now_ms).map(<[u8]>::to_vec))
    }

    async fn state_cas(
        &self,
        tenant: &ServiceId,
        key: &[u8],
        expected: Option<&[u8]>,
        new: &[u8],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let key = staged_key(STAGED_STATE, &gateway::state_key(tenant, key)?);
        loop {
            match self.staged.cas(&key, expected, new, now_ms, expires_at_ms, || self.stored_staged(&key))? {
                Cas::Set { ask_commit } => {
                    if ask_commit {
                        self.writer.nudge();
                    }
                    return Ok(true);
                }
                Cas::Refused => return Ok(false),
                // A transaction writes (and then forgets) what is staged.
                Cas::Full => self.write_with_next(|_| Ok(())).await?,
            }
        }
    }

    async fn delete_expired(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.prune(gateway::prune_batch, now_ms).await
    }
}

in_transactions! {
    super::ParkedStore, parked {
        read fn parked(shard: ShardId, channel: Channel, after: Option<ParkedKey>, limit: usize) -> Vec<ParkedDelivery>;
        write fn unpark(shard: ShardId, channel: Channel, keys: &[ParkedKey]) -> ();
    }

    async fn park(&self, deliveries: &[ParkedDelivery]) -> Result<(), StoreError> {
        super::parked::check_parkable(deliveries, self.shard_count)?;
        if deliveries.is_empty() {
            return Ok(());
        }
        let deliveries = deliveries.to_vec();
        self.write(move |txn| parked::park(txn, &deliveries)).await
    }
}

/// Subscribers of a page read on the calling task before the rest goes to
/// the blocking pool. Most topics of a messaging network have a few
/// subscribers, and for them the pool's hand-off (a thread woken, a task
/// woken back) cost more than the read: about a sixth of the engine's CPU
/// per delivery with 10 subscribers per envelope (docs/BENCHMARKS-HISTORY.md,
/// finding 6). The bound keeps such a read short on the runtime's thread: a
/// large topic's page (1,000 subscribers) still goes to the pool.
const INLINE_SUBSCRIBERS: usize = 32;

/// Up to `limit` subscribers of `topic` after `after`, in recipient id
/// order, each joined with its recipient (decoded once while unchanged).
fn read_subscribers(
    txn: &redb::ReadTransaction,
    cache: &RecipientCache,
    topic: &Topic,
    after: Option<&RecipientId>,
    limit: usize,
) -> Result<Vec<Subscriber>, StoreError> {
    if super::nothing_after(after, limit) {
        return Ok(Vec::new());
    }
    let subs = txn.open_table(TOPIC_SUBS).be()?;
    let recipients = txn.open_table(RECIPIENTS).be()?;
    let prefix = topic_sub_prefix(topic.as_bytes());
    let lo = match after {
        Some(a) => Bound::Excluded([prefix.as_slice(), a.as_bytes()].concat()),
        None => Bound::Included(prefix.clone()),
    };
    let hi = [prefix.as_slice(), &[0xff; 32]].concat();
    let range = (lo.as_ref().map(Vec::as_slice), Bound::Included(hi.as_slice()));
    let mut out = Vec::new();
    for row in subs.range::<&[u8]>(range).be()? {
        if out.len() == limit {
            break;
        }
        let (k, v) = row.be()?;
        let id = RecipientId::parse(&k.value()[prefix.len()..]).map_err(|_| corrupt("topic subscription"))?;
        // A row without its recipient should not exist; skip it if it does.
        let Some(encoded) = recipients.get(id.as_bytes()).be()? else {
            continue;
        };
        let recipient = cache.get_or_decode(&id, encoded.value(), |bytes| codec::decode_recipient(id, bytes))?;
        let subscription = codec::decode_subscription(topic.clone(), v.value())?;
        out.push(Subscriber { recipient, subscription });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{RecipientSecret, Subscription};

    // The conformance suite runs on this backend in tests/store_conformance.
    const SHARD_COUNT: u16 = 16;

    #[tokio::test]
    async fn data_survives_reopen_and_shard_count_is_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let id = RecipientId::from_bytes([9; 32]);
        let hash = RecipientSecret::parse(&[1; 32]).unwrap().hash();
        let topic = Topic::parse(&[0, 42]).unwrap();
        let target = DeliveryTarget::Fcm { token: "tok".into() };
        let sub = Subscription { topic: topic.clone(), keys: None, include_commits: true };
        let envelope = NewEnvelope::new(
            topic.clone(),
            SHARD_COUNT,
            crate::domain::EnvelopeKind::Commit,
            false,
            None,
            vec![],
            None,
        )
        .unwrap();
        let shard = envelope.shard();
        {
            let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
            store.register(&id, &hash, &target, 5).await.unwrap();
            store.append(&[envelope.clone(), envelope.clone()], 7).await.unwrap();
            let update = SubscriptionUpdate::new(vec![sub.clone()], vec![]).unwrap();
            store.update_subscriptions(&id, &hash, &update, 6, 10).await.unwrap();
            store.advance_checkpoint(shard, 1).await.unwrap();
        }

        let err = RedbStore::open(dir.path(), SHARD_COUNT + 1).err().expect("another shard count must fail");
        assert!(matches!(&err, StoreError::Backend(m) if m.contains("shard count")), "{err}");

        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        let r = store.recipient(&id).await.unwrap().expect("recipient persisted");
        assert_eq!((r.target, r.renewed_at_ns, r.topic_count), (target, 6, 1));
        assert!(r.secret_hash == hash);
        let subs = store.subscriptions(&id).await.unwrap();
        assert_eq!(subs, vec![StoredSubscription { subscription: sub, start_position: 2 }]);
        assert_eq!(store.shard_position(shard).await.unwrap(), ShardPosition { boundary: 2, checkpoint: 1 });
        let window = store.read_window(shard, 0, 2, 10).await.unwrap();
        assert_eq!(window.iter().map(|e| e.sequence_id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(window[0].server_ts_ns, 7);
        assert_eq!(store.append(&[envelope], 8).await.unwrap(), vec![Appended::Stored { sequence_id: 3 }]);
    }

    /// A parked delivery is durable: it is there after the store reopens.
    #[tokio::test]
    async fn parked_deliveries_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let d = ParkedDelivery {
            shard: ShardId::parse(3, SHARD_COUNT).unwrap(),
            channel: Channel::Apns,
            sequence_id: 7,
            recipient: RecipientId::from_bytes([4; 32]),
            topic: Topic::parse(&[1, 9]).unwrap(),
            kind: crate::domain::EnvelopeKind::Welcome,
            server_ts_ns: 11,
            attempts: 2,
            all_gone: true,
        };
        {
            let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
            let drained = ParkedDelivery { sequence_id: 6, ..d.clone() };
            store.parked().park(&[drained.clone(), d.clone()]).await.unwrap();
            store.parked().unpark(d.shard, d.channel, &[drained.key()]).await.unwrap();
        }
        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        assert_eq!(store.parked().parked(d.shard, d.channel, None, 10).await.unwrap(), vec![d]);
    }

    /// Rows in `table`.
    async fn rows(store: &RedbStore, table: TableDefinition<'static, &'static [u8], &'static [u8]>) -> u64 {
        use redb::ReadableTableMetadata as _;
        store.read(move |txn| txn.open_table(table).be()?.len().be()).await.unwrap()
    }

    /// Gateway retention deletes each expired record and its index rows
    /// from the tables, counts each once, and keeps the live ones. The
    /// conformance suite sees only that reads skip them.
    #[tokio::test]
    async fn gateway_retention_deletes_expired_rows() {
        use crate::domain::{AccountId, DeviceId, IdempotencyKey, PushRouteId, SaltEpochId};
        use gateway::{EXPIRY, NOTIFY, ROUTES, STATE, TARGETS};

        const HOUR: i64 = 3_600_000;
        let (now, short, long) = (1_000_000_000, 1_000_000_000 + HOUR, 1_000_000_000 + 24 * HOUR);
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        let tenant = ServiceId::parse("station").unwrap();
        let registration = |n: u8, expires_at_ms: i64| GatewayRegistration {
            tenant: tenant.clone(),
            account_id: AccountId::parse("ak:account:a").unwrap(),
            device_id: DeviceId::parse(&format!("ak:device:01964137-0000-7000-8000-0000000000{n:02x}")).unwrap(),
            registration_id: RegistrationId::parse(&format!("registration-{n:03}-00001")).unwrap(),
            push_target_id: PushTargetId::from_bytes([n; 32]),
            push_route_id: PushRouteId::FcmMain,
            salt_epoch_id: SaltEpochId::parse("e1").unwrap(),
            push_key: format!("token-{n}"),
            platform: None,
            app_id: None,
            visible_opt_in: false,
            created_at_ms: now,
            expires_at_ms,
            token_invalid: false,
        };
        let notify = |n: u8| NotifyKey {
            tenant: tenant.clone(),
            idempotency_key: IdempotencyKey::parse(&format!("idem-{n}")).unwrap(),
        };
        let gw = store.gateway();
        for (n, expires) in [(1, short), (2, long)] {
            gw.register(&registration(n, expires)).await.unwrap();
            assert_eq!(
                gw.notify_claim(&notify(n), &[n; 32], now, now + 1, expires).await.unwrap(),
                NotifyClaim::Claimed
            );
            assert!(gw.notify_commit(&notify(n), now + 1, b"{}", &[], expires).await.unwrap());
            assert!(gw.state_cas(&tenant, &[n], None, b"v", now, expires).await.unwrap());
        }
        // What is staged is written by the next transaction.
        store.write(|_| Ok(())).await.unwrap();
        let tables = [("routes", ROUTES), ("targets", TARGETS), ("notify", NOTIFY), ("state", STATE)];
        for (name, table) in tables {
            assert_eq!(rows(&store, table).await, 2, "{name}");
        }
        assert_eq!(rows(&store, EXPIRY).await, 6);

        assert_eq!(gw.delete_expired(short - 1).await.unwrap(), 0, "nothing expired yet");
        assert_eq!(gw.delete_expired(short).await.unwrap(), 3, "a route, a notify record, a state value");
        for (name, table) in tables {
            assert_eq!(rows(&store, table).await, 1, "{name}");
        }
        assert_eq!(rows(&store, EXPIRY).await, 3);
        assert_eq!(gw.route(&registration(2, long).route_key(), now).await.unwrap(), Some(registration(2, long)));
        assert_eq!(gw.delete_expired(short).await.unwrap(), 0, "each counted once");
    }

    /// The gateway's window state is staged in memory (`staged.rs`): seen
    /// at once, decided against, written by the next transaction even when
    /// no other write follows, and in the file after a synced one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn staged_window_state_is_seen_at_once_and_written_by_the_next_transaction() {
        use gateway::{EXPIRY, STATE};

        let dir = tempfile::tempdir().unwrap();
        let tenant = ServiceId::parse("station").unwrap();
        {
            let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
            let gw = store.gateway();
            assert!(gw.state_cas(&tenant, b"k", None, b"1", 0, i64::MAX).await.unwrap());
            assert_eq!(gw.state(&tenant, b"k", 0).await.unwrap(), Some(b"1".to_vec()));
            assert!(!gw.state_cas(&tenant, b"k", None, b"2", 0, i64::MAX).await.unwrap(), "against the staged value");
            let mut waited = 0;
            while rows(&store, STATE).await == 0 && waited < 500 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                waited += 1;
            }
            assert_eq!(rows(&store, STATE).await, 1, "written with no other write to carry it");
            assert!(gw.state_cas(&tenant, b"k", Some(b"1"), b"2", 0, i64::MAX).await.unwrap());
            store.write(|_| Ok(())).await.unwrap();
        }
        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        assert_eq!(store.gateway().state(&tenant, b"k", 0).await.unwrap(), Some(b"2".to_vec()));
        assert_eq!(rows(&store, EXPIRY).await, 1, "one expiry entry: the old one moved");
    }

    /// A relay claim is staged: decided against at once, in no table until
    /// a write carries it, and its own settlement (a write) does, so that a
    /// reopened store answers the delivery as settled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_staged_relay_claim_is_written_by_its_settlement() {
        use relay::{RELAY, RELAY_EXPIRY};

        let (now, lease, expires) = (1_000, 2_000, 10_000);
        let dir = tempfile::tempdir().unwrap();
        let key = RelayKey { hub_id: "hub".into(), delivery_id: "d1".into() };
        {
            let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
            let relay = store.relay();
            assert_eq!(relay.claim(&key, now, lease, expires).await.unwrap(), RelayClaim::Claimed);
            assert_eq!(rows(&store, RELAY).await, 0, "staged, not yet written");
            let again = relay.claim(&key, now + 1, lease + 1, expires).await.unwrap();
            assert_eq!(again, RelayClaim::Busy { lease_until_ms: lease }, "decided against the staged claim");
            relay.settle(&key, lease, RelaySettled::Delivered, expires).await.unwrap();
            assert_eq!((rows(&store, RELAY).await, rows(&store, RELAY_EXPIRY).await), (1, 1));
        }
        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        let replay = store.relay().claim(&key, now + 2, lease + 2, expires).await.unwrap();
        assert_eq!(replay, RelayClaim::Settled(RelaySettled::Delivered));
        // The settlement kept its claim's expiry entry, which retention finds.
        assert_eq!(store.relay().delete_expired(expires).await.unwrap(), 1);
        assert_eq!((rows(&store, RELAY).await, rows(&store, RELAY_EXPIRY).await), (0, 0));
    }

    /// Relay retention deletes every expired record, past one transaction's
    /// batch, and keeps the live one.
    #[tokio::test]
    async fn relay_retention_deletes_expired_rows_in_batches() {
        use relay::{RELAY, RELAY_EXPIRY};

        let (now, short, long) = (1_000_000_000, 1_000_003_600, 1_000_086_400);
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        let key = |n: usize| RelayKey { hub_id: "hub".into(), delivery_id: format!("{n:032x}") };
        let expired = PRUNE_BATCH + 1;
        // One transaction: claims one by one would take minutes.
        store
            .write(move |txn| {
                for n in 0..expired {
                    relay::claim(txn, &key(n), now, now + 1, short)?;
                }
                relay::claim(txn, &key(expired), now, now + 1, long).map(drop)
            })
            .await
            .unwrap();
        assert_eq!(rows(&store, RELAY).await, expired as u64 + 1);
        assert_eq!(store.relay().delete_expired(short - 1).await.unwrap(), 0, "nothing expired yet");
        assert_eq!(store.relay().delete_expired(short).await.unwrap(), expired as u64);
        assert_eq!((rows(&store, RELAY).await, rows(&store, RELAY_EXPIRY).await), (1, 1));
        let live = store.relay().claim(&key(expired), now, now + 3, long).await.unwrap();
        assert_eq!(live, RelayClaim::Busy { lease_until_ms: now + 1 });
    }

    #[test]
    fn zero_shards_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(RedbStore::open(dir.path(), 0).is_err());
    }
}
