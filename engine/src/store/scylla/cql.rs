//! What every part of the ScyllaDB backend shares: statements
//! (`statements!`), the session's two ways of writing (`Execute`) and of
//! reading (`first_row`, `rows`), a conditional write's outcome (`Lwt`),
//! driver errors as `StoreError`, the retry of a conditional write, write
//! timestamps, TTLs and the limits of reads and writes. It imports no other
//! part of the backend.
//!
//! # Retried inside the engine
//!
//! At replication factor 3 a lost or stalled database node must cost a
//! publisher or a registrant nothing (DESIGN.md). The driver retries a
//! statement on another node when its connection broke (a killed node) and
//! sends it to the next node as well when the first has not answered after
//! `store.scylla.speculative_after_ms` (a stalled one), but only a statement
//! marked idempotent: one whose second execution, after a first whose
//! outcome is unknown (it may have applied), leaves what one execution
//! leaves. Each family here, and why:
//!
//! - **Reads**, serial reads included: change nothing. Retried.
//! - **Plain writes**: each replays the same values at the same key, so a
//!   second copy leaves the same row. Most carry their own write timestamp
//!   (`USING TIMESTAMP`: the dispatch index, copies, marks, index clocks,
//!   boundaries, checkpoints), so a late copy cannot overwrite a later
//!   write; the envelope rows are keyed by the writer's term (only their
//!   writer writes them, the same values each time); the rest are
//!   overwrites that state facts already true (progress marks, whose late
//!   copy costs repeats, never a skip; heartbeats) or deletes of what is
//!   never written again (rows below a checkpoint, spent terms). Retried:
//!   `prepare` marks every statement without a condition.
//! - **Conditional writes** (LWT) are not blindly idempotent: a second
//!   execution after a first that applied finds its condition false and
//!   answers "not applied", which a caller could take for a lost race. Only
//!   the families whose callers read that answer correctly are retried
//!   (marked with [`retried`] where they are declared):
//!   - the recipients' writes and batches are conditioned on the random
//!     `version` read before, and set a new random one: a repeat of one
//!     that applied answers "not applied" with the version it set itself,
//!     which [`Lwt::applied_as`] counts as applied; a delete's repeat finds
//!     the partition gone, which the delete counts as done. Any other "not
//!     applied" reads again and decides again, as after a concurrent change;
//!   - the shard leases (`IF NOT EXISTS` then `IF owner = <this node>`):
//!     a repeat of an acquisition that applied finds this node the owner,
//!     which the acquisition takes for its own; renewals and releases on
//!     `owner = <this node>` apply again or find the lease gone;
//!   - a shard term's claim (`IF NOT EXISTS`): a repeat of a claim that
//!     applied is not applied, and the claim takes the next term above an
//!     empty one (an unused term wastes nothing: its range holds no id);
//!   - the keyspace's shard count: the same value either way.
//!
//!   The relay ingress's and the gateway's records are not retried: their
//!   "not applied" answers are verdicts (a delivery or notify already
//!   claimed, a route superseded) that a repeat of a write that applied
//!   would turn against the caller. An unknown outcome there is an error,
//!   and their clients retry with the same idempotency key.
//! - **Batches** are marked where they are built, by the same rules: the
//!   envelope rows' unlogged batches (plain writes) and the recipients'
//!   conditional batches are retried.
//!
//! What the driver retries on ([`FaultRetry`]): a broken connection, an
//! overloaded or bootstrapping node, and one "unavailable", as its default
//! policy does; and, for an idempotent statement, one read or write
//! timeout of the coordinator, on the next node: the coordinator waited
//! for a replica that died or stalled before the cluster noticed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{self, Stream, StreamExt, TryStreamExt};
use scylla::client::session::Session;
use scylla::deserialize::row::DeserializeRow;
use scylla::errors::{DbError, RequestAttemptError};
use scylla::policies::retry::{DefaultRetrySession, RequestInfo, RetryDecision, RetryPolicy, RetrySession};
use scylla::response::query_result::QueryResult;
use scylla::serialize::row::SerializeRow;
use scylla::statement::Consistency;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};

use crate::domain::Timestamp;
use crate::store::StoreError;

/// How often a conditional write is tried against concurrent changes.
pub(super) const MAX_LWT_ATTEMPTS: u32 = 50;
/// Rows per page of every range read.
pub(super) const PAGE_ROWS: i32 = 1000;
/// Writes or reads of the dispatch index run at once.
pub(super) const JOIN_CONCURRENCY: usize = 32;

/// Maps a driver error to `Backend` with a fixed label.
pub(super) fn be<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Backend(format!("scylla: {what}: {e}"))
}

/// A conditional write whose outcome is read, and a plain write.
pub(super) trait Execute {
    async fn lwt(&self, st: &PreparedStatement, values: impl SerializeRow) -> Result<Lwt, StoreError>;
    async fn write(&self, st: &PreparedStatement, values: impl SerializeRow) -> Result<(), StoreError>;
}

impl Execute for Session {
    async fn lwt(&self, st: &PreparedStatement, values: impl SerializeRow) -> Result<Lwt, StoreError> {
        let result = self.execute_unpaged(st, values).await.map_err(be("conditional write"))?;
        Lwt::from_result(result)
    }

    async fn write(&self, st: &PreparedStatement, values: impl SerializeRow) -> Result<(), StoreError> {
        self.execute_unpaged(st, values).await.map_err(be("write"))?;
        Ok(())
    }
}

/// The driver's retry policy (module docs): its default one, plus one
/// retry on the next node of an idempotent statement that a coordinator
/// answered with a read or write timeout.
#[derive(Debug, Default)]
pub(super) struct FaultRetry;

impl RetryPolicy for FaultRetry {
    fn new_session(&self) -> Box<dyn RetrySession> {
        Box::new(FaultRetrySession { default: DefaultRetrySession::new(), timed_out: false })
    }
}

struct FaultRetrySession {
    default: DefaultRetrySession,
    /// A timeout was retried already.
    timed_out: bool,
}

impl RetrySession for FaultRetrySession {
    fn decide_should_retry(&mut self, info: RequestInfo) -> RetryDecision {
        let timeout = matches!(
            info.error,
            RequestAttemptError::DbError(DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. }, _)
        );
        if timeout && info.is_idempotent && !self.timed_out {
            self.timed_out = true;
            return RetryDecision::RetryNextTarget(None);
        }
        self.default.decide_should_retry(info)
    }

    fn reset(&mut self) {
        self.default.reset();
        self.timed_out = false;
    }
}

/// Declares a struct of prepared statements and its `prepare`. Each field is
/// the statement of its CQL text, formatted as by `format!` (so `{ks}` is the
/// keyspace), passed through `=> f` when given (`at` a consistency).
macro_rules! statements {
    (
        $(#[$meta:meta])*
        struct $name:ident;
        fn prepare($session:ident, $ks:ident $(, $param:ident: $param_ty:ty)*);
        $($(#[$field_meta:meta])* $field:ident: $cql:literal $(=> $tune:expr)?,)*
    ) => {
        $(#[$meta])*
        struct $name {
            $($(#[$field_meta])* $field: ::scylla::statement::prepared::PreparedStatement,)*
        }

        impl $name {
            async fn prepare(
                $session: &::scylla::client::session::Session,
                $ks: &str
                $(, $param: $param_ty)*
            ) -> Result<Self, $crate::store::StoreError> {
                $(
                    let $field = $crate::store::scylla::cql::prepare($session, format!($cql)).await?;
                    $(let $field = ($tune)($field);)?
                )*
                Ok(Self { $($field,)* })
            }
        }
    };
}

pub(super) use statements;

/// Prepares `cql`; a paged read of it pages by `PAGE_ROWS`. A statement
/// without a condition is idempotent (module docs, "Retried inside the
/// engine"); a conditional one only when declared [`retried`].
pub(super) async fn prepare(session: &Session, cql: String) -> Result<PreparedStatement, StoreError> {
    let mut st = session.prepare(cql.as_str()).await.map_err(be("preparing a statement"))?;
    st.set_page_size(PAGE_ROWS);
    st.set_is_idempotent(!is_conditional(&cql));
    Ok(st)
}

/// Whether a CQL statement is a conditional write (a lightweight transaction).
fn is_conditional(cql: &str) -> bool {
    cql.contains(" IF ")
}

/// A conditional statement's setting for `statements!`: its callers read a
/// repeat's "not applied" correctly, so the driver may retry it on another
/// node (module docs, "Retried inside the engine").
pub(super) fn retried(mut st: PreparedStatement) -> PreparedStatement {
    st.set_is_idempotent(true);
    st
}

/// A statement's setting for `statements!`: run at `consistency`.
pub(super) fn at(consistency: Consistency) -> impl Fn(PreparedStatement) -> PreparedStatement {
    move |mut st| {
        st.set_consistency(consistency);
        st
    }
}

/// A row as a read returns it, owned.
pub(super) trait OwnedRow: for<'f, 'm> DeserializeRow<'f, 'm> + Send + 'static {}

impl<R: for<'f, 'm> DeserializeRow<'f, 'm> + Send + 'static> OwnedRow for R {}

/// The first row of an unpaged read, if any; errors labelled `what`.
pub(super) async fn first_row<R: OwnedRow>(
    session: &Session,
    st: &PreparedStatement,
    values: impl SerializeRow,
    what: &'static str,
) -> Result<Option<R>, StoreError> {
    let rows = session.execute_unpaged(st, values).await.map_err(be(what))?.into_rows_result().map_err(be(what))?;
    rows.maybe_first_row::<R>().map_err(be(what))
}

/// The rows of a paged read, fetched as they are taken; errors labelled `what`.
pub(super) async fn rows<R: OwnedRow>(
    session: &Session,
    st: &PreparedStatement,
    values: impl SerializeRow,
    what: &'static str,
) -> Result<impl Stream<Item = Result<R, StoreError>> + Send + Unpin, StoreError> {
    let pager = session.execute_iter(st.clone(), values).await.map_err(be(what))?;
    Ok(pager.rows_stream::<R>().map_err(be(what))?.map_err(be(what)))
}

/// Every row of a paged read.
pub(super) async fn all_rows<R: OwnedRow>(
    session: &Session,
    st: &PreparedStatement,
    values: impl SerializeRow,
    what: &'static str,
) -> Result<Vec<R>, StoreError> {
    rows(session, st, values, what).await?.try_collect().await
}

/// Microsecond wall-clock write timestamps, strictly increasing in this
/// process: the local half of the dispatch index's timestamps.
#[derive(Default)]
pub(super) struct WriteClock {
    last: AtomicI64,
    /// Added to the wall clock: only tests set it, to play a skewed node.
    skew_micros: i64,
}

impl WriteClock {
    /// A clock `skew_micros` ahead of this node's.
    #[cfg(test)]
    pub(super) fn skewed(skew_micros: i64) -> Self {
        Self { skew_micros, ..Self::default() }
    }

    pub(super) fn next(&self) -> i64 {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
                + self.skew_micros;
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let ts = now.max(prev + 1);
            match self.last.compare_exchange_weak(prev, ts, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return ts,
                Err(p) => prev = p,
            }
        }
    }
}

/// The outcome of one conditional statement or batch.
pub(super) struct Lwt {
    pub(super) applied: bool,
    /// When not applied: the current values the server returned, by column name.
    current: HashMap<String, Option<CqlValue>>,
}

impl Lwt {
    pub(super) fn from_result(result: QueryResult) -> Result<Self, StoreError> {
        let rows = result.into_rows_result().map_err(be("reading a conditional write's result"))?;
        let names: Vec<String> = rows.column_specs().iter().map(|s| s.name().to_owned()).collect();
        let row: Row = rows.first_row().map_err(be("reading a conditional write's result"))?;
        let mut current: HashMap<String, Option<CqlValue>> = names.into_iter().zip(row.columns).collect();
        let applied = match current.remove("[applied]") {
            Some(Some(CqlValue::Boolean(b))) => b,
            _ => return Err(StoreError::Backend("scylla: a conditional write returned no [applied]".into())),
        };
        Ok(Self { applied, current })
    }

    /// Applied, or not applied because this very write applied before:
    /// the driver repeated it after an attempt whose answer was lost, and
    /// the repeat found the random `version` it sets (module docs).
    pub(super) fn applied_as(&self, version: i64) -> bool {
        self.applied || self.current_i64("version") == Some(version)
    }

    /// Not applied, and no `version` is stored any more: the partition a
    /// delete conditioned on its version is gone (module docs).
    pub(super) fn gone(&self) -> bool {
        !self.applied && self.current("version").is_none()
    }

    fn current(&self, column: &str) -> Option<&CqlValue> {
        self.current.get(column)?.as_ref()
    }

    pub(super) fn current_text(&self, column: &str) -> Option<&str> {
        self.current(column)?.as_text().map(String::as_str)
    }

    pub(super) fn current_i64(&self, column: &str) -> Option<i64> {
        self.current(column)?.as_bigint()
    }

    pub(super) fn current_i8(&self, column: &str) -> Option<i8> {
        self.current(column)?.as_tinyint()
    }

    pub(super) fn current_blob(&self, column: &str) -> Option<&[u8]> {
        self.current(column)?.as_blob().map(Vec::as_slice)
    }
}

pub(super) type Values = Box<dyn SerializeRow + Send + Sync>;

/// Runs `futures`, at most `concurrency` at once; the first error wins.
pub(super) async fn all_ok(
    futures: Vec<BoxFuture<'_, Result<(), StoreError>>>,
    concurrency: usize,
) -> Result<(), StoreError> {
    stream::iter(futures).buffer_unordered(concurrency).try_collect::<()>().await
}

/// A short random pause before trying a conditional write again.
pub(super) async fn backoff(attempt: u32) {
    let cap_ms = 1u64 << attempt.min(7);
    let ms = rand::random_range(0..=cap_ms);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Runs `attempt` until it gives a value (`None`: a conditional write lost
/// to a concurrent change), with a `backoff` between tries; `contention()`
/// after `MAX_LWT_ATTEMPTS`.
pub(super) async fn retry<T, F>(mut attempt: impl FnMut() -> F) -> Result<T, StoreError>
where
    F: Future<Output = Result<Option<T>, StoreError>>,
{
    for n in 0..MAX_LWT_ATTEMPTS {
        if let Some(done) = attempt().await? {
            return Ok(done);
        }
        backoff(n).await;
    }
    Err(contention())
}

fn contention() -> StoreError {
    StoreError::Backend("scylla: too many concurrent changes; the write was not applied".into())
}

/// Seconds from now to `expires_at_ms`, rounded up, at least one: the
/// record's TTL.
pub(super) fn ttl_until(expires_at_ms: i64) -> i32 {
    let now_ms = Timestamp::now().as_millis();
    let secs = (expires_at_ms.saturating_sub(now_ms) + 999) / 1000;
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditional_statements_are_told_from_plain_ones() {
        assert!(is_conditional("UPDATE ks.t SET a = ? WHERE k = ? IF a = ?"));
        assert!(is_conditional("INSERT INTO ks.t (k) VALUES (?) IF NOT EXISTS USING TTL ?"));
        assert!(!is_conditional("INSERT INTO ks.t (k, a) VALUES (?, ?) USING TIMESTAMP ?"));
        assert!(!is_conditional("SELECT a FROM ks.t WHERE k = ?"));
    }

    #[test]
    fn a_repeat_of_a_write_that_applied_counts_as_applied() {
        let lwt = |applied: bool, version: Option<i64>| Lwt {
            applied,
            current: HashMap::from([("version".to_owned(), version.map(CqlValue::BigInt))]),
        };
        assert!(lwt(true, None).applied_as(7));
        assert!(lwt(false, Some(7)).applied_as(7), "its own version: the first attempt applied");
        assert!(!lwt(false, Some(8)).applied_as(7), "another change's version");
        assert!(!lwt(false, None).applied_as(7));
        assert!(lwt(false, None).gone() && !lwt(false, Some(8)).gone() && !lwt(true, None).gone());
        let no_column = Lwt { applied: false, current: HashMap::new() };
        assert!(no_column.gone());
    }

    #[test]
    fn ttls_round_up_and_stay_positive() {
        let now_ms = Timestamp::now().as_millis();
        assert_eq!(ttl_until(now_ms - 5_000), 1);
        let t = ttl_until(now_ms + 86_400_000);
        assert!((86_399..=86_400).contains(&t), "{t}");
    }
}
