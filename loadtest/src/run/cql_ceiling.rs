//! `--with-cql-ceiling`: what the CQL server does for a plain client, in the
//! same run. The same Rust driver the engine uses sends the statement shapes
//! of the engine's ScyllaDB store (`engine/schema/scylla/`), with no engine in
//! between, into a keyspace of its own (dropped afterwards):
//!
//! - plain inserts of a subscription row, 64 in flight (registration's writes);
//! - conditional inserts of a recipient (`IF version = null`), 64 in flight
//!   (what one lightweight transaction per RPC costs);
//! - unlogged single-partition batches of 100 log rows, 4 in flight (publish);
//! - pages of 100 subscriber ids of one topic, 32 in flight (dispatch's reads);
//! - joins of 50 subscribers: one read of 50 recipient partitions
//!   (`recipient_id IN ? AND topic = ?`, their static columns and the topic's
//!   row), 32 in flight: what dispatch read per subscriber before the
//!   store kept subscriber copies in the topic's index, and still reads
//!   for a row a change has marked.
//!
//! The engine's registration, publish and delivery figures are reported as
//! ratios against these.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Statements of each kind, and how many are in flight.
const PLAIN_INSERTS: usize = 40_000;
const CONDITIONAL_INSERTS: usize = 10_000;
const REGISTRATION_IN_FLIGHT: usize = 64;
const BATCHES: usize = 400;
const BATCH_ROWS: usize = 100;
const BATCHES_IN_FLIGHT: usize = 4;
const PAGE_READS: usize = 4_000;
const PAGE_ROWS: usize = 100;
const PAGES_IN_FLIGHT: usize = 32;
/// Topics the page reads go round.
const PAGE_TOPICS: usize = 100;
const JOIN_READS: usize = 2_000;
const JOIN_IDS: usize = 50;
const JOINS_IN_FLIGHT: usize = 32;

/// One kind of statement, measured.
#[derive(Debug, Clone, Serialize)]
pub struct CqlRate {
    pub statements: u64,
    pub in_flight: usize,
    pub seconds: f64,
    pub per_second: f64,
    /// Rows per second (batches and pages: statements × rows each).
    pub rows_per_second: f64,
}

/// `--with-cql-ceiling`'s result.
#[derive(Debug, Clone, Serialize)]
pub struct CqlCeiling {
    pub keyspace: String,
    pub plain_inserts: CqlRate,
    pub conditional_inserts: CqlRate,
    pub batches: CqlRate,
    pub subscriber_pages: CqlRate,
    /// Join reads; `rows_per_second` is joined subscribers per second.
    pub subscriber_joins: CqlRate,
}

/// Measures every kind in turn against `nodes`.
pub async fn measure(nodes: &[String]) -> anyhow::Result<CqlCeiling> {
    let session = SessionBuilder::new()
        .known_nodes(nodes)
        .connection_timeout(Duration::from_secs(10))
        .build()
        .await
        .context("connecting to the CQL nodes for --with-cql-ceiling")?;
    let keyspace = format!("fanout_cqlceiling_{:016x}", rand::random::<u64>());
    let result = measure_in(&session, &keyspace).await;
    let _ = session.query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ()).await;
    result
}

async fn measure_in(session: &Session, ks: &str) -> anyhow::Result<CqlCeiling> {
    for ddl in [
        format!("CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"),
        format!(
            "CREATE TABLE {ks}.recipients (recipient_id blob, topic blob, version bigint static, \
             secret_hash blob static, channel tinyint static, target text static, renewed_at bigint static, \
             start_position bigint, include_commits boolean, PRIMARY KEY ((recipient_id), topic))"
        ),
        format!(
            "CREATE TABLE {ks}.shard_log (shard int, bucket bigint, pos int, term bigint, topic blob, kind tinyint, \
             server_ts bigint, data blob, PRIMARY KEY ((shard, bucket), pos, term))"
        ),
        format!(
            "CREATE TABLE {ks}.topic_subscriptions (topic blob, recipient_id blob, PRIMARY KEY ((topic), recipient_id))"
        ),
    ] {
        session.query_unpaged(ddl, ()).await.context("creating the ceiling's keyspace")?;
    }
    let prepare = |cql: String| async move { session.prepare(cql).await.context("preparing a ceiling statement") };
    let plain = prepare(format!(
        "INSERT INTO {ks}.recipients (recipient_id, topic, start_position, include_commits) VALUES (?, ?, ?, ?)"
    ))
    .await?;
    let conditional = prepare(format!(
        "UPDATE {ks}.recipients SET version = ?, secret_hash = ?, channel = ?, target = ?, renewed_at = ? \
         WHERE recipient_id = ? IF version = null"
    ))
    .await?;
    let row = prepare(format!(
        "INSERT INTO {ks}.shard_log (shard, bucket, pos, term, topic, kind, server_ts, data) \
         VALUES (?, ?, ?, 1, ?, 1, ?, ?)"
    ))
    .await?;
    let subscriber =
        prepare(format!("INSERT INTO {ks}.topic_subscriptions (topic, recipient_id) VALUES (?, ?)")).await?;
    let mut page = prepare(format!("SELECT recipient_id FROM {ks}.topic_subscriptions WHERE topic = ?")).await?;
    page.set_page_size(PAGE_ROWS as i32);

    // 32-byte ids spread over the token ring, as recipient ids are.
    let id = |i: usize| -> Vec<u8> { Sha256::digest((i as u64).to_be_bytes()).to_vec() };
    let plain_inserts = rate(PLAIN_INSERTS, REGISTRATION_IN_FLIGHT, 1, |i| {
        exec(session, &plain, (id(i), vec![0u8, (i % 251) as u8], 1i64, true))
    })
    .await?;
    let conditional_inserts = rate(CONDITIONAL_INSERTS, REGISTRATION_IN_FLIGHT, 1, |i| {
        let values = (rand::random::<i64>(), vec![7u8; 32], 1i8, "token".to_owned(), 1i64, id(PLAIN_INSERTS + i));
        exec(session, &conditional, values)
    })
    .await?;
    let batches = rate(BATCHES, BATCHES_IN_FLIGHT, BATCH_ROWS, |i| {
        let row = &row;
        async move {
            let mut batch = Batch::new(BatchType::Unlogged);
            let mut values = Vec::with_capacity(BATCH_ROWS);
            // One (shard, bucket) partition per batch, as one shard's append.
            let (shard, bucket) = ((i % 16) as i32, (i / 16) as i64);
            for pos in 0..BATCH_ROWS {
                batch.append_statement(row.clone());
                values.push((shard, bucket, pos as i32, vec![0u8, (pos % 251) as u8], 1i64, vec![0u8; 16]));
            }
            session.batch(&batch, values).await.map(|_| ()).context("a ceiling batch")
        }
    })
    .await?;
    // The subscriber lists first (not measured), then the page reads.
    rate(PAGE_TOPICS * PAGE_ROWS, REGISTRATION_IN_FLIGHT, 1, |i| {
        exec(session, &subscriber, (vec![0u8, (i / PAGE_ROWS) as u8], id(i)))
    })
    .await?;
    let page = Arc::new(page);
    let subscriber_pages = rate(PAGE_READS, PAGES_IN_FLIGHT, PAGE_ROWS, |i| {
        let page = page.clone();
        async move {
            let topic = vec![0u8, (i % PAGE_TOPICS) as u8];
            let rows: Vec<(Vec<u8>,)> = session
                .execute_iter((*page).clone(), (topic,))
                .await
                .context("a ceiling page")?
                .rows_stream::<(Vec<u8>,)>()
                .context("a ceiling page")?
                .try_collect()
                .await
                .context("a ceiling page")?;
            anyhow::ensure!(rows.len() == PAGE_ROWS, "a ceiling page had {} rows", rows.len());
            Ok(())
        }
    })
    .await?;
    // The recipients the conditional inserts made each get the joined
    // topic's row (not measured), then the joins.
    let joined_topic = vec![9u8, 9];
    rate(CONDITIONAL_INSERTS, REGISTRATION_IN_FLIGHT, 1, |i| {
        exec(session, &plain, (id(PLAIN_INSERTS + i), joined_topic.clone(), 1i64, true))
    })
    .await?;
    let join = Arc::new(
        prepare(format!(
            "SELECT recipient_id, version, secret_hash, channel, target, renewed_at, start_position, \
             include_commits FROM {ks}.recipients WHERE recipient_id IN ? AND topic = ?"
        ))
        .await?,
    );
    type Joined =
        (Vec<u8>, Option<i64>, Option<Vec<u8>>, Option<i8>, Option<String>, Option<i64>, Option<i64>, Option<bool>);
    let subscriber_joins = rate(JOIN_READS, JOINS_IN_FLIGHT, JOIN_IDS, |i| {
        let (join, topic) = (join.clone(), joined_topic.clone());
        async move {
            let first = (i * JOIN_IDS) % (CONDITIONAL_INSERTS - JOIN_IDS);
            let ids: Vec<Vec<u8>> = (first..first + JOIN_IDS).map(|j| id(PLAIN_INSERTS + j)).collect();
            let result = session.execute_unpaged(&join, (ids, topic)).await.context("a ceiling join")?;
            let rows = result.into_rows_result().context("a ceiling join")?;
            let n = rows.rows::<Joined>().context("a ceiling join")?.filter(Result::is_ok).count();
            anyhow::ensure!(n == JOIN_IDS, "a ceiling join had {n} rows");
            Ok(())
        }
    })
    .await?;
    Ok(CqlCeiling {
        keyspace: ks.to_owned(),
        plain_inserts,
        conditional_inserts,
        batches,
        subscriber_pages,
        subscriber_joins,
    })
}

async fn exec(session: &Session, st: &PreparedStatement, values: impl SerializeRow) -> anyhow::Result<()> {
    session.execute_unpaged(st, values).await.map(|_| ()).context("a ceiling statement")
}

/// Runs `count` statements made by `make`, `in_flight` at once.
async fn rate<F, Fut>(count: usize, in_flight: usize, rows_each: usize, make: F) -> anyhow::Result<CqlRate>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    stream::iter((0..count).map(make)).buffer_unordered(in_flight).try_collect::<()>().await?;
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    Ok(CqlRate {
        statements: count as u64,
        in_flight,
        seconds,
        per_second: count as f64 / seconds,
        rows_per_second: (count * rows_each) as f64 / seconds,
    })
}
