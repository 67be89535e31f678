//! Database faults during a run (`--db-fault`): one node of the three-node
//! Cassandra cluster of `scripts/cassandra-cluster.sh` killed (SIGKILL)
//! and started again, or paused (SIGSTOP) past the driver's timeouts and
//! resumed (SIGCONT), once `--fault-after` of the deliveries arrived, while
//! publishing, delivery and registration go on. Registration goes on as
//! *churn*: recipients registered again with their own target and
//! resubscribed to a topic they hold, which changes nothing they are
//! delivered (a renewal, PUSH-255; a replaced subscription keeps its start
//! position, PUSH-216) but writes what a registration writes. At
//! replication factor 3 the engine must absorb the fault: no publisher or
//! registrant sees an error, nothing acknowledged is lost. The report gives
//! the fault's times and how long the delivery rate took to recover.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fanout_proto::v1 as pb;
use serde::Serialize;

use super::collector::Collector;
use super::driver::Grpc;
use super::ids::RunIds;
use super::scenario::Plan;

/// `--db-fault`: what happens to one database node.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DbFault {
    /// SIGKILL, then, `--db-fault-seconds` later, started again (its
    /// commit log replayed, the hints the others kept sent to it).
    Kill,
    /// SIGSTOP for `--db-fault-seconds` (past the driver's request timeout
    /// and keepalive), then SIGCONT: alive to TCP, answering nothing.
    Pause,
}

/// Drives the cluster's nodes through `scripts/cassandra-cluster.sh`.
#[derive(Debug, Clone)]
pub struct DbControl {
    script: PathBuf,
}

impl DbControl {
    /// The script at `FANOUT_CASSANDRA_CLUSTER_SCRIPT`, else the
    /// workspace's own.
    pub fn find() -> anyhow::Result<DbControl> {
        let script = std::env::var_os("FANOUT_CASSANDRA_CLUSTER_SCRIPT").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/cassandra-cluster.sh"),
            PathBuf::from,
        );
        if !script.is_file() {
            bail!("--db-fault drives the cluster with {}, which is not there", script.display());
        }
        Ok(DbControl { script })
    }

    /// Runs one command of the script (`kill 3`, `restart 3` ...).
    pub async fn run(&self, command: &str, node: u8) -> anyhow::Result<()> {
        let out = tokio::process::Command::new("bash")
            .arg(&self.script)
            .arg(command)
            .arg(node.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .with_context(|| format!("running {}", self.script.display()))?;
        if !out.status.success() {
            bail!(
                "cassandra-cluster.sh {command} {node} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// The fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct DbFaultReport {
    pub kind: DbFault,
    /// The cluster node (1-3).
    pub node: u8,
    /// Seconds after the first publish.
    pub at_seconds: f64,
    /// Distinct deliveries that had arrived then.
    pub delivered_before: u64,
    /// How long the node was down or frozen.
    pub held_seconds: f64,
    /// `kill`: how long the node took to answer CQL again once started.
    pub restart_seconds: Option<f64>,
    /// Seconds after the first publish when it was back (answering CQL, or resumed).
    pub back_at_seconds: f64,
    pub recovery: Option<Recovery>,
    pub churn: ChurnStats,
}

/// Waits until `threshold` distinct deliveries arrived, then applies
/// `kind` to database node `node` for `hold`. `None` when `gave_up` was set
/// first (the run ended without reaching the threshold).
#[allow(clippy::too_many_arguments)]
pub async fn inject(
    kind: DbFault,
    control: &DbControl,
    node: u8,
    collector: &Collector,
    threshold: u64,
    hold: Duration,
    started: Instant,
    gave_up: &AtomicBool,
) -> anyhow::Result<Option<DbFaultReport>> {
    while collector.counts().distinct < threshold {
        if gave_up.load(Ordering::Relaxed) {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let delivered_before = collector.counts().distinct;
    let at = started.elapsed();
    let restart_seconds = match kind {
        DbFault::Kill => {
            control.run("kill", node).await?;
            tokio::time::sleep(hold).await;
            let restarting = Instant::now();
            control.run("restart", node).await?;
            Some(restarting.elapsed().as_secs_f64())
        }
        DbFault::Pause => {
            control.run("pause", node).await?;
            tokio::time::sleep(hold).await;
            control.run("resume", node).await?;
            None
        }
    };
    let back = started.elapsed();
    Ok(Some(DbFaultReport {
        kind,
        node,
        at_seconds: at.as_secs_f64(),
        delivered_before,
        held_seconds: hold.as_secs_f64(),
        restart_seconds,
        back_at_seconds: back.as_secs_f64(),
        recovery: None,
        churn: ChurnStats::default(),
    }))
}

/// How the delivery rate (first deliveries per second) went through the fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recovery {
    /// Mean deliveries per second over the (up to) five seconds before the fault.
    pub baseline_per_second: f64,
    /// The slowest second from the fault until the node was back, ÷ the baseline.
    pub lowest_ratio: f64,
    /// From the fault until the rate was back at 80 % of the baseline for
    /// good (every three-second mean after it at or above): 0 when it never
    /// dipped below. `None`: not within the run.
    pub recovered_after_seconds: Option<f64>,
    /// The same, counted from when the node was back.
    pub recovered_after_back_seconds: Option<f64>,
}

/// The share of the baseline rate that counts as recovered.
const RECOVERED: f64 = 0.8;

impl Recovery {
    /// From `per_second` (first deliveries in each second since the first
    /// publish), the fault at `at` and the node back at `back` (seconds).
    /// The dip ends with the last three-second stretch whose mean is below
    /// 80 % of the baseline, among those before the run's last two seconds
    /// (the end of the work, not the fault); a stretch after it must be back.
    pub fn measure(per_second: &[u64], at: f64, back: f64) -> Option<Recovery> {
        let fault = at.floor() as usize;
        let before = &per_second[fault.saturating_sub(5).max(1).min(fault)..fault.min(per_second.len())];
        if before.is_empty() {
            return None;
        }
        let baseline = before.iter().sum::<u64>() as f64 / before.len() as f64;
        if baseline <= 0.0 {
            return None;
        }
        let back_second = (back.ceil() as usize).max(fault + 1).min(per_second.len());
        let lowest = per_second[fault.min(per_second.len())..back_second].iter().min().copied().unwrap_or(0);
        // Three-second stretches from the fault on, all before the run's last two seconds.
        let end = per_second.len().saturating_sub(2);
        let mean3 = |s: usize| per_second[s..s + 3].iter().sum::<u64>() as f64 / 3.0;
        let starts = fault..(end + 1).saturating_sub(3);
        let last_low = starts.clone().rev().find(|&s| mean3(s) < RECOVERED * baseline);
        let recovered_at = match last_low {
            None => Some(at),
            // Back from the second after it, if a stretch starts there.
            Some(s) if starts.contains(&(s + 1)) => Some((s + 1) as f64),
            Some(_) => None,
        };
        Some(Recovery {
            baseline_per_second: baseline,
            lowest_ratio: lowest as f64 / baseline,
            recovered_after_seconds: recovered_at.map(|r| (r - at).max(0.0)),
            recovered_after_back_seconds: recovered_at.map(|r| (r - back).max(0.0)),
        })
    }
}

/// Registration going on during the run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChurnStats {
    /// Register and UpdateSubscriptions calls made.
    pub rpcs: u64,
    /// Calls answered with an error or not at all within `CHURN_RPC_TIMEOUT`.
    pub errors: u64,
    pub first_error: Option<String>,
    /// The slowest call, in seconds.
    pub slowest_seconds: f64,
}

/// One call's bound: far above the engine's own (a store request is
/// bounded by 10 s); a call past it counts as an error.
const CHURN_RPC_TIMEOUT: Duration = Duration::from_secs(30);

/// Registers recipients again (their own webhook target) and resubscribes
/// them to their first topic, `per_second` calls a second round the nodes,
/// until stopped.
pub struct Churn {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<ChurnStats>,
}

impl Churn {
    pub fn start(nodes: Vec<Grpc>, plan: Arc<Plan>, ids: RunIds, urls: Vec<String>, per_second: u32) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut stats = ChurnStats::default();
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut r = 0u32;
            while !stopped.load(Ordering::Relaxed) {
                tick.tick().await;
                let recipient = r % plan.recipients;
                let grpc = &nodes[r as usize % nodes.len()];
                let (id, secret) = (ids.recipient_id(recipient).to_vec(), ids.secret(recipient).to_vec());
                let call = r % 2;
                r += 1;
                let sent = Instant::now();
                let answer = if call == 0 {
                    let request = pb::RegisterRequest {
                        recipient_id: id,
                        recipient_secret: secret,
                        delivery: Some(pb::register_request::Delivery::Http(pb::HttpDelivery {
                            url: urls[recipient as usize % urls.len()].clone(),
                            signing_key: ids.signing_key(recipient).to_vec(),
                        })),
                    };
                    let mut client = grpc.notifications();
                    tokio::time::timeout(CHURN_RPC_TIMEOUT, client.register(request)).await.map(|r| r.map(|_| ()))
                } else {
                    let Some(topic) = plan.topics_of(recipient).next() else { continue };
                    let request = pb::UpdateSubscriptionsRequest {
                        recipient_id: id,
                        recipient_secret: secret,
                        adds: vec![pb::Subscription {
                            topic: ids.topic(topic),
                            hmac_epoch_base: 0,
                            hmac_keys: vec![],
                            include_commits: false,
                        }],
                        removes: vec![],
                    };
                    let mut client = grpc.notifications();
                    tokio::time::timeout(CHURN_RPC_TIMEOUT, client.update_subscriptions(request))
                        .await
                        .map(|r| r.map(|_| ()))
                };
                stats.rpcs += 1;
                stats.slowest_seconds = stats.slowest_seconds.max(sent.elapsed().as_secs_f64());
                let error = match answer {
                    Ok(Ok(())) => continue,
                    Ok(Err(status)) => format!("{} {}", status.code(), status.message()),
                    Err(_) => format!("no answer within {CHURN_RPC_TIMEOUT:?}"),
                };
                stats.errors += 1;
                stats.first_error.get_or_insert(error);
            }
            stats
        });
        Churn { stop, task }
    }

    pub async fn finish(self) -> anyhow::Result<ChurnStats> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.task.await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_is_the_end_of_the_last_dip_below_80_percent() {
        // 100/s, the fault at 6.2 s, the node back at 12 s: down to 10/s, back from second 11.
        let mut rates = vec![100; 20];
        for r in &mut rates[6..11] {
            *r = 10;
        }
        let r = Recovery::measure(&rates, 6.2, 12.0).unwrap();
        assert_eq!(r.baseline_per_second, 100.0);
        assert!((r.lowest_ratio - 0.1).abs() < 1e-9);
        // The last three-second mean below 80 starts at second 10 (10+100+100 = 70/s): back from 11.
        assert!((r.recovered_after_seconds.unwrap() - 4.8).abs() < 1e-9, "{r:?}");
        assert_eq!(r.recovered_after_back_seconds, Some(0.0), "before the node was back");
        let late = Recovery::measure(&rates, 6.2, 9.5).unwrap();
        assert!((late.recovered_after_back_seconds.unwrap() - 1.5).abs() < 1e-9);

        let steady = Recovery::measure(&[100; 20], 6.0, 10.0).unwrap();
        assert_eq!((steady.recovered_after_seconds, steady.lowest_ratio), (Some(0.0), 1.0), "no dip");
        // Still low at the end of the run: not recovered within it.
        let mut never = vec![100; 20];
        for r in &mut never[6..] {
            *r = 10;
        }
        assert_eq!(Recovery::measure(&never, 6.0, 10.0).unwrap().recovered_after_seconds, None);
        assert_eq!(Recovery::measure(&[0; 20], 6.0, 10.0), None, "no baseline");
        assert_eq!(Recovery::measure(&[100; 3], 0.5, 1.0), None, "no second before the fault");
    }

    #[test]
    fn the_cluster_script_is_found() {
        let control = DbControl::find().unwrap();
        assert!(control.script.ends_with("scripts/cassandra-cluster.sh"));
    }
}
