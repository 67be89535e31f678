//! Two `fanout serve` nodes on one Cassandra keyspace split the
//! shards by lease; `kill -9` one of them mid-window; the survivor takes its
//! shards after the lease TTL and replays from its checkpoint: zero missing
//! deliveries, duplicates counted. Fencing: one node is frozen (SIGSTOP)
//! while publishes to it are under way, for longer than the lease TTL, then
//! resumed: it must act on no lease it lost, and every acknowledged envelope
//! is delivered. Needs a CQL server:
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
use fanout_testkit::launcher::scylla_store_env;
use fanout_tests::client::{Recipient, envelope, group_topic, subscription};
use fanout_tests::{EngineConfig, Fanout};

use crate::common::*;

const RECIPIENTS: usize = 30;
const TOPICS: usize = 12;
/// Envelopes per topic before the kill, and again after it.
const ROUNDS: usize = 2;
const LEASE_TTL_SECONDS: u64 = 3;
/// Missing deliveries fail the test once none has arrived for this long.
const NO_PROGRESS: Duration = Duration::from_secs(30);
/// Between two rounds of the background publisher: a steady load, not a
/// flood the slow receiver needs minutes to drain.
const PUBLISH_PACE: Duration = Duration::from_millis(250);

/// (recipient id hex, topic base64, sequence id)
type Push = (String, String, u64);

/// Two nodes on a fresh keyspace, both owning shards, with recipients
/// registered on either node and subscribed to every topic.
struct TwoNodes {
    setup: WebhookSetup,
    second: Fanout,
    recipients: Vec<Recipient>,
    topics: Vec<Vec<u8>>,
}

impl TwoNodes {
    async fn start(cql: &str) -> Self {
        let keyspace = format!("fanout_e2e_{:016x}", rand::random::<u64>());
        let nodes: Vec<String> = cql.split(',').map(|n| n.trim().to_owned()).collect();
        let mut env = scylla_store_env(&nodes, &keyspace);
        env.push(("FANOUT__ENGINE__LEASE__TTL_SECONDS".into(), LEASE_TTL_SECONDS.to_string()));
        let config = EngineConfig {
            engine_extra: "[engine.delivery]\nworkers = 2\nmax_in_flight_per_worker = 4".into(),
            env,
            ..EngineConfig::default()
        };
        // A slow receiver keeps windows open long enough to act inside one.
        let receiver = MockWebhookConfig { latency: Duration::from_millis(150), ..MockWebhookConfig::default() };
        let setup = webhook_setup_with(config, receiver).await;
        // The second node shares the keyspace and trusts the same CA.
        let second = Fanout::start(setup.fanout.config().clone()).await.expect("start the second node");

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
        Self { setup, second, recipients, topics }
    }

    /// Every (recipient, topic, sequence id) the acknowledged publishes owe.
    fn expected(&self, published: &[(Vec<u8>, u64)]) -> HashSet<Push> {
        let b64 = |t: &[u8]| base64::engine::general_purpose::STANDARD.encode(t);
        self.recipients.iter().flat_map(|r| published.iter().map(move |(t, s)| (r.id_hex(), b64(t), *s))).collect()
    }

    /// Waits until every expected push arrived, for as long as deliveries
    /// keep arriving (liveness, not age: the backlog's size depends on how
    /// fast the publisher was acknowledged); returns (arrived, duplicates,
    /// pushes of envelopes that were stored but never acknowledged).
    async fn until_delivered(&self, expected: &HashSet<Push>) -> (usize, usize, usize) {
        let mut arrived = 0;
        let mut last_progress = Instant::now();
        loop {
            let seen = pushes(&self.setup);
            let missing = expected.iter().filter(|p| !seen.contains_key(*p)).count();
            if seen.len() > arrived {
                arrived = seen.len();
                last_progress = Instant::now();
            }
            if missing == 0 {
                let received: usize = seen.values().sum();
                let unacknowledged: usize = seen.iter().filter(|(p, _)| !expected.contains(*p)).map(|(_, n)| n).sum();
                let duplicates: usize = seen.iter().filter(|(p, _)| expected.contains(*p)).map(|(_, n)| n - 1).sum();
                return (received, duplicates, unacknowledged);
            }
            if last_progress.elapsed() > NO_PROGRESS {
                panic!(
                    "{missing} of {} deliveries never arrived, none for {NO_PROGRESS:?}; first node's log:\n{}\nits metrics:\n{}\n\
                     second node's log:\n{}\nits metrics:\n{}",
                    expected.len(),
                    self.setup.fanout.log_tail(80),
                    metrics_summary(&self.setup.fanout).await,
                    self.second.log_tail(80),
                    metrics_summary(&self.second).await,
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_one_of_two_nodes_and_the_survivor_delivers_everything() {
    let Some(cql) = test_cql() else { return };
    let mut nodes = TwoNodes::start(&cql).await;

    // Publish to both, following redirects to the owner.
    let mut published: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut redirects = 0;
    for _ in 0..ROUNDS {
        for t in &nodes.topics {
            let (seq, r) = publish_following(&[&nodes.setup.fanout, &nodes.second], t).await;
            published.push((t.clone(), seq));
            redirects += r;
        }
    }
    assert!(redirects > 0, "with two owners some publishes must have been redirected");

    // Kill the second node once some, but far from all, deliveries arrived.
    let total_before = RECIPIENTS * published.len();
    nodes.setup.receiver.wait_for(total_before / 10, DELIVERY_WAIT).await;
    nodes.second.kill9();
    let at_kill = nodes.setup.receiver.received_count();
    let acquired_at_kill = nodes.setup.fanout.log().matches("shard lease acquired").count();
    eprintln!("killed the second node after {at_kill} of {total_before} deliveries");
    assert!(at_kill < total_before, "the kill came too late to test anything");

    // Keep publishing, to the survivor only: while the dead node's leases
    // live, its shards answer "owned by <dead>" or "no owner": retry.
    for _ in 0..ROUNDS {
        for t in &nodes.topics {
            let (seq, r) = publish_following(&[&nodes.setup.fanout], t).await;
            published.push((t.clone(), seq));
            redirects += r;
        }
    }

    let expected = nodes.expected(&published);
    let (received, duplicates, unacknowledged) = nodes.until_delivered(&expected).await;
    assert_eq!(unacknowledged, 0, "nothing outside the expected pushes");
    eprintln!(
        "two nodes, one killed after {at_kill} deliveries: {} expected, {received} received, 0 missing, \
         {duplicates} duplicates, {redirects} redirects",
        expected.len()
    );
    assert!(
        nodes.setup.fanout.log().matches("shard lease acquired").count() > acquired_at_kill,
        "the survivor took over the dead node's shards"
    );
}

/// Fencing: the second node is frozen with SIGSTOP while a
/// publisher keeps sending it envelopes (so appends and windows are under
/// way), for three lease TTLs; the first node takes its shards. Resumed, the
/// second node must act on none of the leases it lost (its local deadlines
/// passed: fenced), and every envelope acknowledged by either node is
/// delivered to every recipient. Envelopes whose publish timed out while the
/// node was frozen are unacknowledged: they may arrive or not, and are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_longer_than_its_leases_is_fenced_and_nothing_acknowledged_is_lost() {
    let Some(cql) = test_cql() else { return };
    let nodes = TwoNodes::start(&cql).await;
    let addresses = [nodes.second.grpc.to_string(), nodes.setup.fanout.grpc.to_string()];

    // A publisher that prefers the second node, in the background.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (topics, addresses, stop) = (nodes.topics.clone(), addresses.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut timed_out = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for t in &topics {
                    match publish_with_timeouts(&addresses, t).await {
                        Some(seq) => acked.push((t.clone(), seq)),
                        None => timed_out += 1,
                    }
                }
                tokio::time::sleep(PUBLISH_PACE).await;
            }
            (acked, timed_out)
        })
    };

    nodes.setup.receiver.wait_for(RECIPIENTS * TOPICS / 2, DELIVERY_WAIT).await;
    let acquired_before = nodes.setup.fanout.log().matches("shard lease acquired").count();
    nodes.second.pause().expect("SIGSTOP the second node");
    let paused_for = Duration::from_secs(3 * LEASE_TTL_SECONDS);
    eprintln!("paused the second node for {paused_for:?}");
    tokio::time::sleep(paused_for).await;
    let taken = nodes.setup.fanout.log().matches("shard lease acquired").count();
    nodes.second.resume().expect("SIGCONT the second node");
    // Keep publishing a while after the resume: both nodes answer again.
    tokio::time::sleep(Duration::from_secs(2 * LEASE_TTL_SECONDS)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (acked, timed_out) = publisher.await.expect("publisher task");

    assert!(taken > acquired_before, "the first node took over shards while the second was frozen");
    let second_log = nodes.second.log();
    assert!(
        second_log.contains("shard lease lost") || second_log.contains("shard lease not renewed in time"),
        "the resumed node noticed it lost its leases:\n{}",
        nodes.second.log_tail(60)
    );
    let expected = nodes.expected(&acked);
    let (received, duplicates, unacknowledged) = nodes.until_delivered(&expected).await;
    // Every handoff (to the first node during the freeze, back to the second
    // by fair share after it) replays the shard's open window from its
    // checkpoint: that is where the duplicates come from.
    let handoffs = nodes.setup.fanout.log().matches("shard lease acquired").count() - acquired_before
        + nodes.second.log().matches("shard lease acquired").count()
        - second_log.matches("shard lease acquired").count();
    eprintln!(
        "second node frozen for {paused_for:?}: {} envelopes acknowledged, {timed_out} publishes never acknowledged, \
         {} pushes expected, {received} received, 0 missing, {duplicates} duplicates from {handoffs} shard \
         handoffs, {unacknowledged} pushes of unacknowledged envelopes",
        acked.len(),
        expected.len()
    );
}

/// The engine's own counters and gauges (no histogram buckets), to tell a
/// stuck queue from a fenced shard when deliveries are missing.
async fn metrics_summary(node: &Fanout) -> String {
    match node.http_get("/metrics").await {
        Ok((_, text)) => text
            .lines()
            .filter(|l| l.starts_with("fanout_") && !l.contains("_bucket{") && !l.ends_with(" 0"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(no metrics: {e})"),
    }
}

fn test_cql() -> Option<String> {
    let cql = std::env::var("FANOUT_TEST_CQL").ok();
    if cql.is_none() {
        eprintln!(
            "skipped: FANOUT_TEST_CQL is not set (e.g. FANOUT_TEST_CQL=127.0.0.1:9042 after scripts/cassandra.sh start)"
        );
    }
    cql
}

/// Publishes one envelope to the first of `addresses` that answers within a
/// second, following redirects among them. `None`: no node acknowledged it
/// within 30 s (a timed-out request's envelope may still have been stored).
async fn publish_with_timeouts(addresses: &[String], topic: &[u8]) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut target = 0;
    while Instant::now() < deadline {
        let env = envelope(topic, pb::EnvelopeKind::Application, true);
        let call = async {
            let mut client =
                pb::publish_service_client::PublishServiceClient::connect(format!("http://{}", addresses[target]))
                    .await
                    .ok()?;
            client.publish(pb::PublishRequest { envelopes: vec![env] }).await.ok().map(|r| r.into_inner().results)
        };
        match tokio::time::timeout(Duration::from_secs(1), call).await {
            Ok(Some(results)) => match &results[0].result {
                Some(pb::publish_result::Result::SequenceId(s)) => return Some(*s),
                Some(pb::publish_result::Result::Error(e)) if e.code == tonic::Code::Unavailable as i32 => {
                    let owner = redirect_owner(&e.message);
                    match owner.and_then(|a| addresses.iter().position(|n| n == a)) {
                        Some(i) if i != target => target = i,
                        _ => {
                            target = (target + 1) % addresses.len();
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                other => panic!("publish failed: {other:?}"),
            },
            // Frozen or unreachable: the outcome is unknown; try the other node.
            _ => target = (target + 1) % addresses.len(),
        }
    }
    None
}

/// Publishes one envelope, resending it where an UNAVAILABLE redirect says
/// (the redirect contract of several nodes) and retrying while a shard has no reachable owner.
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
                let owner = redirect_owner(&e.message);
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

/// The address an UNAVAILABLE redirect names ("shard N is owned by
/// HOST:PORT; publish there"), if it names one.
fn redirect_owner(message: &str) -> Option<&str> {
    message.split("owned by ").nth(1).and_then(|r| r.split(';').next())
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
