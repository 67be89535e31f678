//! Issue 7: two `fanout serve` nodes on one Cassandra keyspace split the
//! shards by lease; `kill -9` one of them mid-window; the survivor takes its
//! shards after the lease TTL and replays from its checkpoint: zero missing
//! deliveries, duplicates counted. Needs a CQL server:
//!
//! ```text
//! bash scripts/cassandra.sh install && bash scripts/cassandra.sh start
//! FANOUT_TEST_CQL=127.0.0.1:9042 cargo test -p fanout-tests --test e2e multinode -- --nocapture
//! ```

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fanout_proto::v1 as pb;
use fanout_testkit::MockWebhookConfig;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::{EngineConfig, Fanout};

use crate::common::*;

const RECIPIENTS: usize = 30;
const TOPICS: usize = 12;
/// Envelopes per topic before the kill, and again after it.
const ROUNDS: usize = 2;
const LEASE_TTL_SECONDS: u64 = 3;

/// (recipient id hex, topic base64, sequence id)
type Push = (String, String, u64);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_one_of_two_nodes_and_the_survivor_delivers_everything() {
    let Ok(cql) = std::env::var("FANOUT_TEST_CQL") else {
        eprintln!(
            "skipped: FANOUT_TEST_CQL is not set (e.g. FANOUT_TEST_CQL=127.0.0.1:9042 after scripts/cassandra.sh start)"
        );
        return;
    };
    let keyspace = format!("fanout_e2e_{:016x}", rand::random::<u64>());
    let nodes = format!("[{}]", cql.split(',').map(|n| format!("{:?}", n.trim())).collect::<Vec<_>>().join(", "));
    let config = EngineConfig {
        engine_extra: "[engine.delivery]\nworkers = 2\nmax_in_flight_per_worker = 4".into(),
        env: vec![
            ("FANOUT__STORE__BACKEND".into(), "scylla".into()),
            ("FANOUT__STORE__SCYLLA__NODES".into(), nodes),
            ("FANOUT__STORE__SCYLLA__KEYSPACE".into(), keyspace.clone()),
            ("FANOUT__STORE__SCYLLA__MIGRATE".into(), "true".into()),
            ("FANOUT__ENGINE__LEASE__TTL_SECONDS".into(), LEASE_TTL_SECONDS.to_string()),
        ],
        ..EngineConfig::default()
    };
    // A slow receiver keeps windows open long enough to kill a node inside one.
    let receiver = MockWebhookConfig { latency: Duration::from_millis(150), ..MockWebhookConfig::default() };
    let setup = webhook_setup_with(config, receiver).await;
    // The second node shares the keyspace and trusts the same CA.
    let mut second = Fanout::start(setup.fanout.config().clone()).await.expect("start the second node");

    // Both nodes own shards once the first gave up the ones above its share.
    wait_for("both nodes to own shards", Duration::from_secs(30), || {
        second.log().contains("shard lease acquired")
            && setup.fanout.log().contains("releasing a shard above the fair share")
    })
    .await;

    // Recipients registered on either node: registration is not shard-bound.
    let key = [9u8; 32];
    let topics: Vec<Vec<u8>> = (0..TOPICS).map(|_| group_topic()).collect();
    let recipients: Vec<Recipient> = (0..RECIPIENTS).map(|_| Recipient::random()).collect();
    let subs: Vec<pb::Subscription> = topics.iter().map(|t| subscription(t)).collect();
    setup.receiver.set_signing_key("/hook", key.to_vec());
    for (i, r) in recipients.iter().enumerate() {
        let node = if i % 2 == 0 { &setup.fanout } else { &second };
        let mut client = node.notifications().await.expect("client");
        client.register(r.register_http(&setup.receiver.url("/hook"), &key)).await.expect("register");
        client.update_subscriptions(r.update(subs.clone(), vec![])).await.expect("subscribe");
    }

    // Publish to both, following redirects to the owner.
    let mut published: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut redirects = 0;
    for _ in 0..ROUNDS {
        for t in &topics {
            let (seq, r) = publish_following(&[&setup.fanout, &second], t).await;
            published.push((t.clone(), seq));
            redirects += r;
        }
    }
    assert!(redirects > 0, "with two owners some publishes must have been redirected");

    // Kill the second node once some, but far from all, deliveries arrived.
    let total_before = RECIPIENTS * published.len();
    setup.receiver.wait_for(total_before / 10, DELIVERY_WAIT).await;
    second.kill9();
    let at_kill = setup.receiver.received_count();
    let acquired_at_kill = setup.fanout.log().matches("shard lease acquired").count();
    eprintln!("killed the second node after {at_kill} of {total_before} deliveries");
    assert!(at_kill < total_before, "the kill came too late to test anything");

    // Keep publishing, to the survivor only: while the dead node's leases
    // live, its shards answer "owned by <dead>" or "no owner": retry.
    for _ in 0..ROUNDS {
        for t in &topics {
            let (seq, r) = publish_following(&[&setup.fanout], t).await;
            published.push((t.clone(), seq));
            redirects += r;
        }
    }

    let b64 = |t: &[u8]| base64::engine::general_purpose::STANDARD.encode(t);
    let expected: HashSet<Push> =
        recipients.iter().flat_map(|r| published.iter().map(move |(t, s)| (r.id_hex(), b64(t), *s))).collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let seen = pushes(&setup);
        let missing = expected.iter().filter(|p| !seen.contains_key(*p)).count();
        if missing == 0 {
            assert!(seen.keys().all(|p| expected.contains(p)), "nothing outside the expected pushes");
            let received: usize = seen.values().sum();
            eprintln!(
                "two nodes, one killed after {at_kill} deliveries: {} expected, 0 missing, {} duplicates, {redirects} redirects",
                expected.len(),
                received - expected.len()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} deliveries never arrived; survivor log:\n{}",
            expected.len(),
            setup.fanout.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        setup.fanout.log().matches("shard lease acquired").count() > acquired_at_kill,
        "the survivor took over the dead node's shards"
    );
}

/// Publishes one envelope, resending it where an UNAVAILABLE redirect says
/// (issue 7 contract) and retrying while a shard has no reachable owner.
/// Returns the sequence id and how many redirects were followed.
async fn publish_following(nodes: &[&Fanout], topic: &[u8]) -> (u64, usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut target = 0;
    let mut redirects = 0;
    loop {
        let env = envelope(topic, pb::EnvelopeKind::Application, true);
        let results = publish(nodes[target], vec![env]).await;
        match &results[0].result {
            Some(pb::publish_result::Result::SequenceId(s)) => return (*s, redirects),
            Some(pb::publish_result::Result::Error(e)) if e.code == tonic::Code::Unavailable as i32 => {
                let owner = e.message.split("owned by ").nth(1).and_then(|r| r.split(';').next());
                match owner.and_then(|a| nodes.iter().position(|n| n.grpc.to_string() == a)) {
                    Some(i) if i != target => {
                        target = i;
                        redirects += 1;
                        continue;
                    }
                    _ => {} // no owner, or a dead one: wait for the leases to move
                }
            }
            other => panic!("publish failed: {other:?}"),
        }
        assert!(Instant::now() < deadline, "a publish was not accepted within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pushes(setup: &WebhookSetup) -> HashMap<Push, usize> {
    let mut seen = HashMap::new();
    for r in setup.receiver.received() {
        if r.signature_valid != Some(true) {
            continue;
        }
        let Some(j) = r.json() else { continue };
        let push = (
            j["recipient_id"].as_str().unwrap_or_default().to_owned(),
            j["topic"].as_str().unwrap_or_default().to_owned(),
            j["sequence_id"].as_str().and_then(|s| s.parse().ok()).unwrap_or_default(),
        );
        *seen.entry(push).or_insert(0) += 1;
    }
    seen
}

async fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
