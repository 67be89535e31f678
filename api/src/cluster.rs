//! `fanout cluster status --config FILE [--json]`: the live nodes, each
//! shard's lease holder and term, and each shard's lag, read from the store
//! the configuration names (`fanout_engine::cluster_status`). For people, a
//! table; with `--json`, one JSON document for tools.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fanout_engine::cluster_status::{self, ClusterStatus};
use fanout_engine::domain::Timestamp;
use fanout_engine::store::{LiveNode, NodeId, RedbStore, ScyllaStore, Store};

use crate::config::{Config, StoreBackend};

/// The whole command's bound: connecting, then reading every shard.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Node ids in the shard table are cut to this many characters (the node
/// table shows them whole).
const SHORT_ID: usize = 12;

/// Reads the status and renders it: the table, or JSON with `json`.
pub async fn status(config: &Config, json: bool) -> anyhow::Result<String> {
    let status = tokio::time::timeout(TIMEOUT, read(config))
        .await
        .with_context(|| format!("the store did not answer within {} s", TIMEOUT.as_secs()))??;
    Ok(if json { serde_json::to_string_pretty(&status)? + "\n" } else { table(&status) })
}

async fn read(config: &Config) -> anyhow::Result<ClusterStatus> {
    let shard_count = config.engine.shard_count.get();
    let store: Arc<dyn Store> = match config.store.backend {
        StoreBackend::Redb => {
            let path = &config.store.path;
            // Reading must not create an empty store where none is.
            anyhow::ensure!(RedbStore::exists(path), "no embedded store in {} (store.path)", path.display());
            let cache = config.store.redb_cache_bytes();
            let store = RedbStore::open_with_cache(path, shard_count, cache)
                .with_context(|| format!("cannot open the embedded store in {}", path.display()))?;
            Arc::new(store)
        }
        StoreBackend::Scylla => {
            let s = &config.store.scylla;
            // Never migrates: the schema must be there.
            let settings = fanout_engine::store::ScyllaSettings { migrate: false, ..s.clone() };
            let store = ScyllaStore::connect(&settings, shard_count).await.with_context(|| {
                format!("cannot reach the ScyllaDB store (keyspace {} on {:?})", s.keyspace, s.nodes.as_slice())
            })?;
            Arc::new(store)
        }
    };
    // On the embedded store the one node is the one this file configures.
    let local = LiveNode { node: NodeId("embedded".into()), address: config.server.advertise_address() };
    let leases = store.clone().leases();
    cluster_status::read(store, leases, shard_count, local, Timestamp::now())
        .await
        .context("reading the cluster status from the store")
}

/// The status for people: nodes, then shards, then totals.
fn table(status: &ClusterStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "store: {}", status.backend);
    let _ = writeln!(out, "\nnodes: {} live", status.nodes.len());
    let rows: Vec<[String; 3]> =
        status.nodes.iter().map(|n| [n.node.clone(), n.address.clone(), n.shards.to_string()]).collect();
    write_table(&mut out, ["NODE", "ADDRESS", "SHARDS"], &rows);
    let _ = writeln!(out, "\nshards: {}", status.shards.len());
    let dash = || "-".to_string();
    let rows: Vec<[String; 9]> = status
        .shards
        .iter()
        .map(|s| {
            [
                s.shard.to_string(),
                s.owner.as_deref().map_or_else(|| "(none)".into(), |o| o.chars().take(SHORT_ID).collect()),
                s.address.clone().unwrap_or_else(dash),
                s.term.map_or_else(dash, |t| t.to_string()),
                s.lease_expires_in_seconds.map_or_else(dash, |t| format!("{t}s")),
                s.boundary.to_string(),
                s.checkpoint.to_string(),
                s.lag.to_string(),
                s.oldest_undelivered_age_seconds.map_or_else(dash, |a| format!("{a:.1}s")),
            ]
        })
        .collect();
    let head = ["SHARD", "OWNER", "ADDRESS", "TERM", "LEASE", "BOUNDARY", "CHECKPOINT", "LAG", "OLDEST"];
    write_table(&mut out, head, &rows);
    let unowned = status.shards.iter().filter(|s| s.owner.is_none()).count();
    let lag: u64 = status.shards.iter().map(|s| s.lag).sum();
    let oldest = status
        .shards
        .iter()
        .filter_map(|s| s.oldest_undelivered_age_seconds)
        .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
    let _ = writeln!(
        out,
        "\nshards without an owner: {unowned}; total lag: {lag}; oldest undelivered: {}",
        oldest.map_or_else(dash, |a| format!("{a:.1}s"))
    );
    out
}

/// Left-aligned columns, two spaces apart.
fn write_table<const N: usize>(out: &mut String, head: [&str; N], rows: &[[String; N]]) {
    let mut widths = head.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(head.to_vec()));
    for row in rows {
        let _ = writeln!(out, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

#[cfg(test)]
mod tests {
    use fanout_engine::cluster_status::{NodeStatus, ShardStatus};

    use super::*;

    fn shard(shard: u16, owner: Option<&str>, lag: u64, age: Option<f64>) -> ShardStatus {
        ShardStatus {
            shard,
            owner: owner.map(Into::into),
            address: owner.map(|o| format!("{o}:50051")),
            term: owner.map(|_| 3),
            lease_expires_in_seconds: owner.map(|_| 8),
            boundary: 10 + lag,
            checkpoint: 10,
            lag,
            oldest_undelivered_age_seconds: age,
        }
    }

    #[test]
    fn the_table_lists_nodes_then_shards_then_totals() {
        let status = ClusterStatus {
            backend: "scylla",
            nodes: vec![NodeStatus { node: "0123456789abcdef".into(), address: "n1:50051".into(), shards: 1 }],
            shards: vec![shard(0, Some("0123456789abcdef"), 2, Some(4.24)), shard(1, None, 0, None)],
        };
        let text = table(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "store: scylla");
        assert_eq!(lines[2], "nodes: 1 live");
        assert_eq!(lines[3], "NODE              ADDRESS   SHARDS");
        assert_eq!(lines[4], "0123456789abcdef  n1:50051  1");
        assert_eq!(lines[6], "shards: 2");
        assert_eq!(
            lines[7],
            "SHARD  OWNER         ADDRESS                 TERM  LEASE  BOUNDARY  CHECKPOINT  LAG  OLDEST"
        );
        assert_eq!(
            lines[8].split_whitespace().collect::<Vec<_>>(),
            ["0", "0123456789ab", "0123456789abcdef:50051", "3", "8s", "12", "10", "2", "4.2s"]
        );
        assert_eq!(
            lines[9].split_whitespace().collect::<Vec<_>>(),
            ["1", "(none)", "-", "-", "-", "10", "10", "0", "-"]
        );
        assert_eq!(lines[11], "shards without an owner: 1; total lag: 2; oldest undelivered: 4.2s");
    }
}
