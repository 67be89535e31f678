//! A database node lost under load: one `fanout serve` on a keyspace at
//! replication factor 3 of a three-node Cassandra cluster, a publisher and
//! a registrant going on, one database node killed (SIGKILL) while windows
//! are open and started again. The replication factor covers the fault, so
//! the engine absorbs it (retries of idempotent statements, speculative
//! executions, lease renewals in doubt kept until their deadline): no
//! publish or registration is answered with an error, every acknowledged
//! envelope is delivered, duplicates stay at or below 1 %. Needs the cluster
//! of `scripts/cassandra-cluster.sh`, which the test also uses to kill the
//! node (it is left down, and started again by the next run):
//!
//! ```text
//! bash scripts/cassandra-cluster.sh start
//! FANOUT_TEST_CQL_CLUSTER=$(bash scripts/cassandra-cluster.sh nodes) \
//!     cargo test -p fanout-tests --test e2e db_faults -- --ignored --nocapture
//! ```
//!
//! Ignored in a plain `cargo test` (the single-node CI run has no
//! cluster); run with `--ignored`, it fails under CI (`CI=true`) when the
//! variable is missing, and says it skipped otherwise
//! (`fanout_testkit::outside_service`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_testkit::MockWebhookConfig;
use fanout_testkit::launcher::{build_binary, scylla_store_env, workspace_dir};
use fanout_tests::EngineConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};

use crate::common::*;

const RECIPIENTS: usize = 20;
const TOPICS: usize = 8;
/// Between two rounds of the publisher (one envelope per topic each).
const PUBLISH_PACE: Duration = Duration::from_millis(400);
/// Publishing before the kill, and with the node down (past the driver's
/// 10 s request timeout and 4 s keepalive).
const BEFORE_KILL: Duration = Duration::from_secs(5);
const NODE_DOWN: Duration = Duration::from_secs(12);
/// The killed node: the seed, which the engine's driver also holds its
/// control connection to.
const KILLED: &str = "1";
/// One call of the publisher or the registrant: far above the engine's own
/// bounds, so that only a hang counts.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Missing deliveries fail the test once none has arrived for this long.
const NO_PROGRESS: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the three-node cluster of scripts/cassandra-cluster.sh: FANOUT_TEST_CQL_CLUSTER, --ignored"]
async fn a_database_node_killed_mid_window_costs_publishers_and_registrants_nothing() {
    let Some(cluster) = test_cluster() else { return };
    let nodes: Vec<String> = cluster.split(',').map(|n| n.trim().to_owned()).collect();
    // The node to kill must run (a former run left it killed): started
    // again if not, nothing done if it does.
    cluster_script(&["restart", KILLED]).await;
    let keyspace = format!("fanout_e2e_{:016x}", rand::random::<u64>());
    // The schema first: on three nodes each statement waits for the
    // cluster to agree on it, longer than the engine's start is given.
    migrate(&nodes, &keyspace).await;
    let env = scylla_store_env(&nodes, &keyspace);
    let config = EngineConfig {
        engine_extra: "[engine.delivery]\nworkers = 2\nmax_in_flight_per_worker = 8".into(),
        env,
        ..EngineConfig::default()
    };
    // Receivers answer in 30 ms: windows stay open while the node dies.
    let receiver = MockWebhookConfig { latency: Duration::from_millis(30), ..MockWebhookConfig::default() };
    let setup = webhook_setup_with(config, receiver).await;
    let key = [7u8; 32];
    setup.receiver.set_signing_key("/hook", key.to_vec());
    let url = setup.receiver.url("/hook");
    let topics: Vec<Vec<u8>> = (0..TOPICS).map(|_| group_topic()).collect();
    let recipients: Vec<Recipient> = (0..RECIPIENTS).map(|_| Recipient::random()).collect();
    let subs: Vec<pb::Subscription> = topics.iter().map(|t| subscription(t)).collect();
    let mut client = setup.fanout.notifications().await.expect("client");
    for r in &recipients {
        client.register(r.register_http(&url, &key)).await.expect("register");
        client.update_subscriptions(r.update(subs.clone(), vec![])).await.expect("subscribe");
    }

    // A publisher and a registrant in the background; every answer that is
    // not a success is kept.
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (topics, stop) = (topics.clone(), stop.clone());
        let mut client = setup.fanout.publisher().await.expect("publisher");
        tokio::spawn(async move {
            let (mut acked, mut errors) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let envelopes = topics.iter().map(|t| envelope(t, pb::EnvelopeKind::Application, true)).collect();
                let call = client.publish(pb::PublishRequest { envelopes });
                match tokio::time::timeout(CALL_TIMEOUT, call).await {
                    Ok(Ok(answer)) => {
                        for (t, r) in topics.iter().zip(answer.into_inner().results) {
                            match r.result {
                                Some(pb::publish_result::Result::SequenceId(s)) => acked.push((t.clone(), s)),
                                other => errors.push(format!("{other:?}")),
                            }
                        }
                    }
                    Ok(Err(status)) => errors.push(format!("{} {}", status.code(), status.message())),
                    Err(_) => errors.push(format!("no answer within {CALL_TIMEOUT:?}")),
                }
                tokio::time::sleep(PUBLISH_PACE).await;
            }
            (acked, errors)
        })
    };
    let registrant = {
        let (recipients, stop, url) = (recipients.clone(), stop.clone(), url);
        let first_topic = subs[0].clone();
        let mut client = setup.fanout.notifications().await.expect("client");
        tokio::spawn(async move {
            let (mut calls, mut errors) = (0, Vec::new());
            let mut answered = |answer: Result<Result<(), tonic::Status>, tokio::time::error::Elapsed>| {
                calls += 1;
                match answer {
                    Ok(Ok(())) => {}
                    Ok(Err(status)) => errors.push(format!("{} {}", status.code(), status.message())),
                    Err(_) => errors.push(format!("no answer within {CALL_TIMEOUT:?}")),
                }
            };
            // Registered again with the same target, resubscribed to a
            // topic it holds: nothing it is delivered changes.
            for r in recipients.iter().cycle() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let register = client.register(r.register_http(&url, &key));
                answered(tokio::time::timeout(CALL_TIMEOUT, register).await.map(|a| a.map(|_| ())));
                let update = client.update_subscriptions(r.update(vec![first_topic.clone()], vec![]));
                answered(tokio::time::timeout(CALL_TIMEOUT, update).await.map(|a| a.map(|_| ())));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (calls, errors)
        })
    };

    // Kill a database node while deliveries are under way.
    tokio::time::sleep(BEFORE_KILL).await;
    let at_kill = setup.receiver.received_count();
    assert!(at_kill > 0, "deliveries were under way before the kill");
    cluster_script(&["kill", KILLED]).await;
    eprintln!("killed database node {KILLED} after {at_kill} deliveries");
    tokio::time::sleep(NODE_DOWN).await;
    stop.store(true, Ordering::SeqCst);
    let (acked, publish_errors) = publisher.await.expect("publisher task");
    let (calls, register_errors) = registrant.await.expect("registrant task");

    let expected = expected(&recipients, &acked);
    let (received, duplicates) = until_delivered(&setup, &expected).await;
    let lease_lines = setup.fanout.log().matches("shard lease lost").count();
    // The node stays down (CI stops the cluster next; the next run starts it).
    eprintln!(
        "database node {KILLED} killed for {NODE_DOWN:?} (left down; `cassandra-cluster.sh restart {KILLED}` \
         starts it): {} envelopes acknowledged, {} errors; {calls} registration calls, {} errors; {} pushes \
         expected, {received} received, 0 missing, {duplicates} duplicates; {lease_lines} shard leases lost",
        acked.len(),
        publish_errors.len(),
        register_errors.len(),
        expected.len()
    );
    assert!(publish_errors.is_empty(), "publishes answered with an error: {publish_errors:?}");
    assert!(register_errors.is_empty(), "registrations answered with an error: {register_errors:?}");
    assert!(
        duplicates * 100 <= expected.len(),
        "{duplicates} duplicates of {} expected pushes: above 1 %",
        expected.len()
    );
    assert_eq!(lease_lines, 0, "no shard lease lost:\n{}", setup.fanout.log_tail(60));
}

/// The cluster's contact points from FANOUT_TEST_CQL_CLUSTER; without it,
/// a failure under CI, a visible skip elsewhere.
fn test_cluster() -> Option<String> {
    fanout_testkit::outside_service::cql_cluster()
}

/// Creates `keyspace` at replication factor 3 with the engine's schema and
/// the shard count the engine starts with: `fanout migrate`.
async fn migrate(nodes: &[String], keyspace: &str) {
    let binary = tokio::task::spawn_blocking(|| build_binary(false)).await.unwrap().expect("build fanout");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("migrate.toml");
    let nodes: Vec<String> = nodes.iter().map(|n| format!("{n:?}")).collect();
    let text = format!(
        "[store]\nbackend = \"scylla\"\n[store.scylla]\nnodes = [{}]\nkeyspace = \"{keyspace}\"\n\
         replication = \"{{'class': 'SimpleStrategy', 'replication_factor': 3}}\"\n\
         [engine]\nshard_count = {}\n",
        nodes.join(", "),
        EngineConfig::default().shard_count
    );
    std::fs::write(&config, text).expect("write the migrate config");
    let started = Instant::now();
    let run = tokio::process::Command::new(binary).arg("migrate").arg("--config").arg(&config).output();
    let out = tokio::time::timeout(Duration::from_secs(600), run).await.expect("migrate within 10 min").unwrap();
    assert!(out.status.success(), "fanout migrate failed: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("schema applied at replication factor 3 in {:.0?}", started.elapsed());
}

/// Runs scripts/cassandra-cluster.sh with `args`; fails the test if it fails.
async fn cluster_script(args: &[&str]) {
    let script = workspace_dir().join("scripts/cassandra-cluster.sh");
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run scripts/cassandra-cluster.sh");
    assert!(out.status.success(), "cassandra-cluster.sh {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn expected(recipients: &[Recipient], published: &[(Vec<u8>, u64)]) -> HashSet<Push> {
    let b64 = |t: &[u8]| base64::engine::general_purpose::STANDARD.encode(t);
    recipients.iter().flat_map(|r| published.iter().map(move |(t, s)| (r.id_hex(), b64(t), *s))).collect()
}

/// Waits until every expected push arrived, for as long as deliveries keep
/// arriving; returns (pushes received, duplicates of expected ones).
async fn until_delivered(setup: &WebhookSetup, expected: &HashSet<Push>) -> (usize, usize) {
    let mut arrived = 0;
    let mut last_progress = Instant::now();
    loop {
        let seen = pushes(setup);
        let missing = expected.iter().filter(|p| !seen.contains_key(*p)).count();
        if seen.len() > arrived {
            arrived = seen.len();
            last_progress = Instant::now();
        }
        if missing == 0 {
            let unexpected: usize = seen.iter().filter(|(p, _)| !expected.contains(*p)).map(|(_, n)| n).sum();
            assert_eq!(unexpected, 0, "pushes of envelopes never acknowledged: every publish was answered");
            let duplicates = seen.values().map(|n| n - 1).sum();
            return (seen.values().sum(), duplicates);
        }
        assert!(
            last_progress.elapsed() < NO_PROGRESS,
            "{missing} of {} deliveries never arrived, none for {NO_PROGRESS:?}; the engine's log:\n{}",
            expected.len(),
            setup.fanout.log_tail(80)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
