//! Group commit: one writer thread runs the writes that wait
//! together in one redb transaction, so one fsync makes a whole batch
//! durable instead of one fsync per caller.
//!
//! - Each caller is answered only after the transaction that holds its
//!   write committed (or with the commit's error): durability per caller is
//!   what it was with one transaction each.
//! - A write that fails (a refused secret, the topic limit, a backend error,
//!   a panic) never fails another's: the batch's transaction is aborted, the
//!   failed writes get their own errors and the others run again, without
//!   them, in a fresh transaction. The result is the one of running every
//!   write alone in queue order, the failed ones aborting. That is why a
//!   write is an `Fn`: it may run more than once, and only its last run
//!   counts.
//! - Batches form by themselves: the writer takes what is queued when it
//!   is free (at most [`MAX_BATCH`]), with no added wait, so a lone write
//!   costs what it did before.
//! - Bounded: at most [`QUEUE`] writes wait; callers beyond wait to queue.
//! - Every transaction first writes the changes staged in memory
//!   (`staged.rs`: the gateway's window state), so a write queued after a
//!   staged change commits with it or after it.
//! - A write is [`Sync::Now`] (answered once on disk) or
//!   [`Sync::WithNext`] (answered once committed in memory, on disk with the
//!   next `Now` commit; redb's `Durability::None`). redb commits in order, so
//!   what a crash leaves is always every commit up to some point: a state
//!   the process could have crashed in with every commit synced. A
//!   `WithNext` write is for a step whose result stays inside the process
//!   until a later `Now` write carries it out (a notify's claim before its
//!   answer is committed): one fsync then serves them all.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use redb::{Database, Durability, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::codec::OrBackend;
use super::staged::{self, StagedState};
use crate::store::StoreError;

/// Writes in one transaction at most.
pub(super) const MAX_BATCH: usize = 256;
/// Writes waiting for the writer at most.
const QUEUE: usize = 1024;

/// When a write is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sync {
    /// Synced before the caller is answered.
    Now,
    /// Committed (visible to every later read and write) before the caller
    /// is answered; synced with the next `Now` commit.
    WithNext,
}

/// Changes staged in memory that every transaction writes before its
/// batch (`staged.rs`), with `put`.
pub(super) struct Staging {
    pub(super) state: Arc<StagedState>,
    pub(super) put: fn(&WriteTransaction, &[u8], &staged::Value) -> Result<(), StoreError>,
}

/// The handle callers submit writes through. Dropping it lets the writer
/// finish what is queued and joins it, so the database is closed when the
/// store is gone (a reopen in the same process must not find it open).
pub(super) struct GroupCommit {
    jobs: Option<mpsc::Sender<Box<dyn Job>>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl GroupCommit {
    pub(super) fn start(db: Arc<Database>, staging: Option<Staging>) -> Result<Self, StoreError> {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let writer = std::thread::Builder::new()
            .name("fanout-redb-writer".into())
            .spawn(move || write_batches(&db, staging.as_ref(), queue))
            .map_err(|e| StoreError::Backend(format!("cannot start the storage writer: {e}")))?;
        Ok(Self { jobs: Some(jobs), writer: Some(writer) })
    }

    /// Runs `f` in a write transaction shared with other writes; answers
    /// once that transaction committed, and synced when `sync` is `Now`.
    /// `Err` from `f` discards its writes.
    pub(super) async fn write<T, F>(&self, sync: Sync, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Write { f, sync, outcome: None, reply });
        let stopped = || StoreError::Backend("the storage writer has stopped".into());
        self.jobs.as_ref().ok_or_else(stopped)?.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Asks for a transaction soon (it writes what is staged) without
    /// waiting for it. A full queue needs no asking: a transaction is near.
    pub(super) fn nudge(&self) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.try_send(nothing(Sync::WithNext));
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// One queued write, type-erased for the writer.
trait Job: Send {
    fn sync(&self) -> Sync;
    /// Runs the write in `txn`, keeping its outcome; `false` if it failed.
    fn run(&mut self, txn: &WriteTransaction) -> bool;
    /// Answers the caller: the kept outcome, or `commit`'s error for a write
    /// that succeeded in a transaction that then failed to commit.
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

struct Write<T, F> {
    f: F,
    sync: Sync,
    outcome: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Write<T, F>
where
    T: Send,
    F: Fn(&WriteTransaction) -> Result<T, StoreError> + Send,
{
    fn sync(&self) -> Sync {
        self.sync
    }

    fn run(&mut self, txn: &WriteTransaction) -> bool {
        // A panicking write fails alone, as it did on the blocking pool; the
        // writer thread goes on.
        let outcome = catch_unwind(AssertUnwindSafe(|| (self.f)(txn)))
            .unwrap_or_else(|_| Err(StoreError::Backend("a storage write panicked".into())));
        let ok = outcome.is_ok();
        self.outcome = Some(outcome);
        ok
    }

    fn answer(self: Box<Self>, commit: Result<(), &str>) {
        let outcome = match (self.outcome, commit) {
            (Some(Ok(_)), Err(e)) => Err(StoreError::Backend(e.to_owned())),
            (Some(outcome), _) => outcome,
            (None, Err(e)) => Err(StoreError::Backend(e.to_owned())),
            (None, Ok(())) => Err(StoreError::Backend("a storage write never ran".into())),
        };
        let _ = self.reply.send(outcome);
    }
}

/// The writer thread: until every handle is gone, takes what is queued and
/// commits it as one batch; then syncs.
fn write_batches(db: &Database, staging: Option<&Staging>, mut queue: mpsc::Receiver<Box<dyn Job>>) {
    while let Some(first) = queue.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit(db, staging, batch);
    }
    // Closing: what is staged, and every commit not yet synced, to disk.
    commit(db, staging, vec![nothing(Sync::Now)]);
}

/// A write of nothing that nobody waits for: its transaction writes what is
/// staged, and when `sync` is `Now` syncs every commit before it.
fn nothing(sync: Sync) -> Box<dyn Job> {
    let (reply, _) = oneshot::channel();
    Box::new(Write { f: |_: &WriteTransaction| Ok(()), sync, outcome: None, reply })
}

/// Commits `batch` in one transaction, after what is staged, leaving out
/// (and answering) the writes that fail, until the rest succeeds together.
fn commit(db: &Database, staging: Option<&Staging>, mut batch: Vec<Box<dyn Job>>) {
    while !batch.is_empty() {
        let mut txn = match db.begin_write().be() {
            Ok(txn) => txn,
            Err(e) => return answer_all(batch, Err(&e.to_string())),
        };
        if batch.iter().all(|job| job.sync() == Sync::WithNext)
            && let Err(e) = txn.set_durability(Durability::None)
        {
            return answer_all(batch, Err(&e.to_string()));
        }
        let staged = match staging.map(|s| s.state.write(|key, value| (s.put)(&txn, key, value))).transpose() {
            Ok(staged) => staged,
            Err(e) => {
                // Nothing of the batch is written without what was staged
                // before it; the staged changes wait for the next one.
                let _ = txn.abort();
                return answer_all(batch, Err(&e.to_string()));
            }
        };
        let ok: Vec<bool> = batch.iter_mut().map(|job| job.run(&txn)).collect();
        if ok.iter().all(|&ok| ok) {
            let committed = txn.commit().be().map_err(|e| e.to_string());
            if let (Ok(()), Some(staging), Some(staged)) = (&committed, staging, staged) {
                staging.state.committed(staged);
            }
            return answer_all(batch, committed.as_ref().map(|_| ()).map_err(String::as_str));
        }
        // The failed writes' partial changes go with the transaction.
        if let Err(e) = txn.abort().be() {
            return answer_all(batch, Err(&e.to_string()));
        }
        let (kept, failed): (Vec<_>, Vec<_>) = batch.into_iter().zip(ok).partition(|(_, ok)| *ok);
        for (job, _) in failed {
            job.answer(Ok(()));
        }
        batch = kept.into_iter().map(|(job, _)| job).collect();
    }
}

fn answer_all(batch: Vec<Box<dyn Job>>, commit: Result<(), &str>) {
    for job in batch {
        job.answer(commit);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use redb::{ReadableDatabase, ReadableTable, TableDefinition};

    use super::*;

    const T: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn open() -> (tempfile::TempDir, Arc<Database>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("t.redb")).unwrap();
        (dir, Arc::new(db))
    }

    fn read(db: &Database, key: u64) -> Option<u64> {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(T).ok()?;
        table.get(key).unwrap().map(|v| v.value())
    }

    fn put(key: u64) -> impl Fn(&WriteTransaction) -> Result<u64, StoreError> + Send + 'static {
        move |txn| {
            txn.open_table(T).be()?.insert(key, key * 10).be()?;
            Ok(key)
        }
    }

    /// A write that changes the table and then fails: its change must not commit.
    fn put_then_fail(key: u64) -> impl Fn(&WriteTransaction) -> Result<u64, StoreError> + Send + 'static {
        move |txn| {
            txn.open_table(T).be()?.insert(key, 0).be()?;
            Err(StoreError::TopicLimit)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_transactions_and_each_is_answered_after_its_commit() {
        let (_dir, db) = open();
        let writer = Arc::new(GroupCommit::start(db.clone(), None).unwrap());
        let tasks: Vec<_> = (0..500u64)
            .map(|k| {
                let writer = writer.clone();
                tokio::spawn(async move {
                    let got = writer.write(Sync::Now, put(k)).await.unwrap();
                    // Answered only once durable: visible to a fresh read.
                    (got, k)
                })
            })
            .collect();
        for task in tasks {
            let (got, k) = task.await.unwrap();
            assert_eq!(got, k);
            assert_eq!(read(&db, k), Some(k * 10));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_write_fails_alone_and_its_changes_are_discarded() {
        let (_dir, db) = open();
        let writer = Arc::new(GroupCommit::start(db.clone(), None).unwrap());
        let runs = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..200u64)
            .map(|k| {
                let (writer, runs) = (writer.clone(), runs.clone());
                tokio::spawn(async move {
                    match k % 3 {
                        0 => writer.write(Sync::Now, put_then_fail(k)).await.map(|_| ()),
                        1 => writer
                            .write(Sync::Now, move |_: &WriteTransaction| -> Result<u64, StoreError> {
                                runs.fetch_add(1, Ordering::SeqCst);
                                panic!("a write that panics")
                            })
                            .await
                            .map(|_| ()),
                        _ => writer.write(Sync::Now, put(k)).await.map(|_| ()),
                    }
                })
            })
            .collect();
        for (k, task) in (0..200u64).zip(tasks) {
            let result = task.await.unwrap();
            match k % 3 {
                0 => {
                    assert!(matches!(result, Err(StoreError::TopicLimit)));
                    assert_eq!(read(&db, k), None, "a failed write leaves nothing");
                }
                1 => assert!(matches!(result, Err(StoreError::Backend(_)))),
                _ => {
                    result.unwrap();
                    assert_eq!(read(&db, k), Some(k * 10));
                }
            }
        }
        assert!(runs.load(Ordering::SeqCst) >= 67, "every panicking write ran");
        // The writer survived the panics.
        assert_eq!(writer.write(Sync::Now, put(1000)).await.unwrap(), 1000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_synced_with_the_next_is_seen_at_once_and_kept_by_the_next_synced_commit() {
        let (dir, db) = open();
        let writer = GroupCommit::start(db.clone(), None).unwrap();
        writer.write(Sync::WithNext, put(1)).await.unwrap();
        assert_eq!(read(&db, 1), Some(10), "committed: every later read sees it");
        // A later write reads what it wrote (the notify's window state).
        let seen = writer
            .write(Sync::Now, |txn: &WriteTransaction| {
                let table = txn.open_table(T).be()?;
                let seen = table.get(1).be()?.map(|v| v.value());
                Ok(seen)
            })
            .await
            .unwrap();
        assert_eq!(seen, Some(10));
        drop(writer);
        drop(db);
        let db = Database::create(dir.path().join("t.redb")).unwrap();
        assert_eq!(read(&db, 1), Some(10), "synced with the write after it");
    }

    #[tokio::test]
    async fn dropping_the_handle_finishes_queued_writes_and_closes_the_database() {
        let (dir, db) = open();
        let writer = GroupCommit::start(db.clone(), None).unwrap();
        writer.write(Sync::Now, put(7)).await.unwrap();
        drop(writer);
        drop(db);
        // The writer held the last other reference: the file opens again.
        let db = Database::create(dir.path().join("t.redb")).unwrap();
        assert_eq!(read(&db, 7), Some(70));
    }
}
