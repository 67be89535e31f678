//! `fanout cluster status`: the real binary against the store a real
//! engine wrote. On the embedded store (one node owns every shard; redb
//! opens in one process at a time, so the command refuses while the engine
//! runs and reads once it stopped), against a ScyllaDB address where none
//! listens (a clear error), and on a CQL server with two nodes sharing a
//! keyspace when `FANOUT_TEST_CQL` is set.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use fanout_proto::v1 as pb;
use fanout_testkit::MockWebhookConfig;
use fanout_testkit::launcher::scylla_store_env;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::{EngineConfig, Fanout};
use serde_json::Value;

use crate::common::*;

/// Runs `fanout cluster status --config CONFIG ARGS` with only `env` from
/// the environment (no FANOUT_ variable of the test's own).
fn cluster_status(config: &Path, env: &[(String, String)], args: &[&str]) -> Output {
    let mut command = std::process::Command::new(fanout_tests::engine::fanout_binary());
    command.args(["cluster", "status", "--config"]).arg(config).args(args);
    for (name, _) in std::env::vars().filter(|(k, _)| k.starts_with("FANOUT")) {
        command.env_remove(name);
    }
    command.envs(env.iter().cloned()).output().expect("run fanout cluster status")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `--json` document of a run that succeeded.
fn json_status(config: &Path, env: &[(String, String)]) -> Value {
    let out = cluster_status(config, env, &["--json"]);
    assert!(out.status.success(), "cluster status failed: {}{}", text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cluster status --json prints JSON")
}

fn shards(status: &Value) -> &Vec<Value> {
    status["shards"].as_array().expect("shards")
}

#[tokio::test]
async fn on_the_embedded_store_one_node_owns_every_shard_and_the_lag_shows_once_the_engine_stopped() {
    // A receiver that answers after the test is done: the window stays
    // open, so the checkpoint stays below what was published.
    let slow = MockWebhookConfig { latency: Duration::from_secs(60), ..MockWebhookConfig::default() };
    let mut setup = webhook_setup_with(EngineConfig::default(), slow).await;
    let topic = group_topic();
    let recipient = Recipient::random();
    register_webhook(&setup, &recipient, "/hook", &[3; 32], vec![subscription(&topic)]).await;
    let published: Vec<u64> = publish(&setup.fanout, vec![envelope(&topic, pb::EnvelopeKind::Application, true); 3])
        .await
        .iter()
        .map(sequence_id)
        .collect();
    assert_eq!(published, vec![1, 2, 3]);
    let config = setup.fanout.dir.path().join("fanout.toml");

    // redb opens in one process at a time: a clear refusal while it serves.
    let out = cluster_status(&config, &[], &[]);
    assert!(!out.status.success(), "read a store another process has open: {}", text(&out.stdout));
    let error = text(&out.stderr);
    assert!(error.contains("another process has the database open"), "{error}");

    setup.fanout.kill9();
    let status = json_status(&config, &[]);
    assert_eq!(status["backend"], "redb");
    let address = setup.fanout.grpc.to_string();
    let node = serde_json::json!([{"node": "embedded", "address": address, "shards": 16}]);
    assert_eq!(status["nodes"], node, "one node, at its advertised (gRPC) address, owns every shard");
    assert_eq!(shards(&status).len(), 16);
    for s in shards(&status) {
        assert_eq!(
            (&s["owner"], &s["address"], &s["term"]),
            (&Value::from("embedded"), &Value::from(address.clone()), &Value::Null)
        );
        let (boundary, checkpoint) = (s["boundary"].as_u64().unwrap(), s["checkpoint"].as_u64().unwrap());
        assert_eq!(s["lag"].as_u64(), Some(boundary - checkpoint), "lag is boundary - checkpoint");
    }
    let lagging: Vec<&Value> = shards(&status).iter().filter(|s| s["boundary"] == 3).collect();
    assert_eq!(lagging.len(), 1, "the topic's shard holds the three envelopes");
    let lagging = lagging[0];
    assert!(lagging["lag"].as_u64().unwrap() > 0, "the window never finished: {lagging}");
    let age = lagging["oldest_undelivered_age_seconds"].as_f64().expect("an undelivered envelope is stored");
    assert!((0.0..120.0).contains(&age), "stored during this test: {age}");
    let others = shards(&status).iter().filter(|s| s["boundary"] != 3);
    assert!(others.clone().all(|s| s["lag"] == 0 && s["oldest_undelivered_age_seconds"].is_null()));

    // The table for people.
    let out = cluster_status(&config, &[], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.starts_with("store: redb\n"), "{table}");
    assert!(table.contains("nodes: 1 live") && table.contains("shards: 16"), "{table}");
    let node_line = table.lines().find(|l| l.starts_with("embedded")).expect("the node's row");
    assert_eq!(node_line.split_whitespace().collect::<Vec<_>>(), ["embedded", address.as_str(), "16"]);
    assert!(table.contains("shards without an owner: 0; total lag: "), "{table}");
}

#[tokio::test]
async fn a_store_that_cannot_be_reached_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No embedded store there: it is not created by reading.
    let config = dir.path().join("fanout.toml");
    let data = dir.path().join("data");
    std::fs::write(&config, format!("[store]\npath = {:?}\n", data.display().to_string())).expect("write");
    let out = cluster_status(&config, &[], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no embedded store in"), "{}", text(&out.stderr));
    assert!(!data.exists(), "reading created a store");

    // A ScyllaDB address where nothing listens.
    let port = fanout_testkit::launcher::free_port();
    let toml = format!("[store]\nbackend = \"scylla\"\n\n[store.scylla]\nnodes = [\"127.0.0.1:{port}\"]\n");
    std::fs::write(&config, toml).expect("write");
    let started = Instant::now();
    let out = cluster_status(&config, &[], &["--json"]);
    assert!(!out.status.success());
    let error = text(&out.stderr);
    assert!(error.contains("cannot reach the ScyllaDB store"), "{error}");
    assert!(out.stdout.is_empty(), "no JSON on failure");
    assert!(started.elapsed() < Duration::from_secs(70), "bounded by the command's timeout");
}

/// Two nodes sharing a keyspace: both listed with their addresses, every
/// shard held by one of them under a term, the lease counts adding up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_scylla_two_nodes_share_the_shards_and_each_shard_names_its_holder_and_term() {
    let Some(cql) = fanout_testkit::outside_service::cql_server() else { return };
    let keyspace = format!("fanout_e2e_{:016x}", rand::random::<u64>());
    let nodes: Vec<String> = cql.split(',').map(|n| n.trim().to_owned()).collect();
    let mut env = scylla_store_env(&nodes, &keyspace);
    env.push(("FANOUT__ENGINE__LEASE__TTL_SECONDS".into(), "3".into()));
    let config = EngineConfig { env: env.clone(), ..EngineConfig::default() };
    let first = Fanout::start(config.clone()).await.expect("first node");
    let second = Fanout::start(config).await.expect("second node");
    let file = first.dir.path().join("fanout.toml");

    // Until every shard is held and both nodes hold some.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status = json_status(&file, &env);
        let held = shards(&status).iter().all(|s| s["owner"].is_string());
        let counts: Vec<u64> =
            status["nodes"].as_array().unwrap().iter().map(|n| n["shards"].as_u64().unwrap()).collect();
        if held && counts.len() == 2 && counts.iter().all(|&c| c > 0) {
            break status;
        }
        assert!(Instant::now() < deadline, "the two nodes never split the shards: {status}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(status["backend"], "scylla");
    let mut addresses: Vec<&str> =
        status["nodes"].as_array().unwrap().iter().map(|n| n["address"].as_str().unwrap()).collect();
    addresses.sort();
    let mut expected = [first.grpc.to_string(), second.grpc.to_string()];
    expected.sort();
    assert_eq!(addresses, expected, "each node at its advertised address");
    let ids: Vec<&str> = status["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    let total: u64 = status["nodes"].as_array().unwrap().iter().map(|n| n["shards"].as_u64().unwrap()).sum();
    assert_eq!(total, 16, "every shard counted once");
    for s in shards(&status) {
        assert!(ids.contains(&s["owner"].as_str().unwrap()), "held by a live node: {s}");
        assert!(s["term"].as_u64().is_some_and(|t| t >= 1), "a holder appends under a term: {s}");
        assert!(s["lease_expires_in_seconds"].as_u64().is_some_and(|t| t <= 3), "{s}");
        let owner = &status["nodes"].as_array().unwrap().iter().find(|n| n["node"] == s["owner"]).unwrap();
        assert_eq!(s["address"], owner["address"]);
    }
    drop((first, second));
}
