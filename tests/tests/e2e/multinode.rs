//! Two `fanout serve` nodes on one Cassandra keyspace split the
//! shards by lease; `kill -9` one of them mid-window; the survivor takes its
//! shards after the lease TTL and replays from its checkpoint: zero missing
//! deliveries, duplicates counted. Fencing: one node is frozen (SIGSTOP)
//! while publishes to it are under way, for longer than the lease TTL, then
//! resumed: it must act on no lease it lost, and every acknowledged envelope
//! is delivered. Forwarding: every envelope published to one node is stored
//! by its shard's owner, in order, with the owner's per-envelope answers; a
//! frozen or dead owner costs only its envelopes a per-envelope UNAVAILABLE
//! within the caller's deadline; the error detail and the shard map name the
//! owner. A rolling restart (each node SIGTERMed and started again in turn)
//! while publishes go to both: none is answered with an error. Needs a CQL
//! server:
//!
//! ```text
//! bash scripts/cassandra.sh install && bash scripts/cassandra.sh start
//! FANOUT_TEST_CQL=127.0.0.1:9042 cargo test -p fanout-tests --test e2e multinode -- --nocapture
//! ```

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fanout_proto::routing::{Reason, Routing, never_processed};
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

    // Publish to the first node only: it forwards the second's shards there.
    let mut published: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut redirects = 0;
    for _ in 0..ROUNDS {
        for t in &nodes.topics {
            let (seq, r) = publish_following(&[&nodes.setup.fanout, &nodes.second], t).await;
            published.push((t.clone(), seq));
            redirects += r;
        }
    }
    assert_eq!(redirects, 0, "any node takes any publish");
    let forwarded = metric(&nodes.setup.fanout, "fanout_forwarded_envelopes_total").await.unwrap_or(0.0);
    assert!(forwarded > 0.0, "with two owners some envelopes were forwarded");

    // Kill the second node once some, but far from all, deliveries arrived.
    let total_before = RECIPIENTS * published.len();
    nodes.setup.receiver.wait_for(total_before / 10, DELIVERY_WAIT).await;
    nodes.second.kill9();
    let at_kill = nodes.setup.receiver.received_count();
    let acquired_at_kill = nodes.setup.fanout.log().matches("shard lease acquired").count();
    eprintln!("killed the second node after {at_kill} of {total_before} deliveries");
    assert!(at_kill < total_before, "the kill came too late to test anything");

    // Keep publishing, to the survivor only: while the dead node's leases
    // live, its shards' envelopes answer "forwarding failed" or "no owner": retry.
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

/// Any node takes any publish: every envelope is published to the first
/// node, which forwards those of the second node's shards there. All are
/// stored at their first try, each with the answer its owner gave, in
/// request order, for Publish and PublishStream alike; and all are
/// delivered. A request already forwarded is never forwarded again: a node
/// that does not own the shard answers it with the owner, in the error
/// detail, as the shard map both nodes give also says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_takes_any_publish_in_order_and_the_detail_and_shard_map_name_the_owner() {
    let Some(cql) = test_cql() else { return };
    let nodes = TwoNodes::start(&cql).await;
    let (first, second) = (&nodes.setup.fanout, &nodes.second);
    let map = settled_shard_map(&[first, second]).await;
    let owner_of = |topic: &[u8]| map.owners[usize::from(shard_of(topic, 16))].address.clone();
    let theirs = nodes.topics.iter().find(|t| owner_of(t) == second.grpc.to_string()).expect("a topic of the second");
    let mine = nodes.topics.iter().find(|t| owner_of(t) == first.grpc.to_string()).expect("a topic of the first");

    // Marked as forwarded: answered, not sent on again, naming the owner.
    let results = publish_marked_forwarded(first, vec![envelope(theirs, pb::EnvelopeKind::Application, true)]).await;
    let Some(pb::publish_result::Result::Error(e)) = &results[0].result else { panic!("not stored here: {results:?}") };
    assert_eq!(e.code, tonic::Code::Unavailable as i32);
    let routing = Routing::of(e).expect("an ErrorInfo detail");
    assert_eq!(routing.reason, Reason::ShardOwnedElsewhere);
    assert_eq!((routing.shard, routing.owner), (u32::from(shard_of(theirs, 16)), Some(second.grpc.to_string())));
    assert!(!routing.outcome_unknown);
    assert!(e.message.contains("is owned by"), "the text stays for people: {}", e.message);

    // Every envelope to the first node: stored at the first try.
    let forwarded_before = metric(first, "fanout_forwarded_envelopes_total").await.expect("the forward counter");
    let mut published: Vec<(Vec<u8>, u64)> = Vec::new();
    for _ in 0..ROUNDS {
        let envelopes = nodes.topics.iter().map(|t| envelope(t, pb::EnvelopeKind::Application, true)).collect();
        let results = publish(first, envelopes).await;
        for (t, r) in nodes.topics.iter().zip(&results) {
            assert_eq!(r.shard, u32::from(shard_of(t, 16)));
            published.push((t.clone(), sequence_id(r)));
        }
    }
    let theirs_count = nodes.topics.iter().filter(|t| owner_of(t) == second.grpc.to_string()).count();
    let forwarded = metric(first, "fanout_forwarded_envelopes_total").await.unwrap() - forwarded_before;
    assert_eq!(forwarded, (ROUNDS * theirs_count) as f64, "the second node's envelopes were forwarded");

    // One batch mixing both owners and the owner's own refusals: each
    // envelope keeps its place and its answer, the owner's ids in order.
    let mut too_low = envelope(theirs, pb::EnvelopeKind::Application, true);
    too_low.sequence_id = 1; // the shard is past 1: the owner refuses it
    let batch = vec![
        envelope(theirs, pb::EnvelopeKind::Application, true),
        envelope(mine, pb::EnvelopeKind::Application, true),
        too_low,
        envelope(theirs, pb::EnvelopeKind::Welcome, true), // kind and topic do not match: refused here
        envelope(theirs, pb::EnvelopeKind::Application, true),
    ];
    let results = publish(first, batch).await;
    let code = |r: &pb::PublishResult| match &r.result {
        Some(pb::publish_result::Result::Error(e)) => e.code,
        other => panic!("an error: {other:?}"),
    };
    let (a, b) = (sequence_id(&results[0]), sequence_id(&results[4]));
    assert!(b > a, "the owner stored them in request order: {a} then {b}");
    published.extend([(theirs.clone(), a), (mine.clone(), sequence_id(&results[1])), (theirs.clone(), b)]);
    assert_eq!(code(&results[2]), tonic::Code::FailedPrecondition as i32, "the owner's answer, in its place");
    assert_eq!(code(&results[3]), tonic::Code::InvalidArgument as i32);

    // PublishStream through the first node: one acknowledgement per batch, in order.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut client = first.publisher().await.expect("publisher");
    let mut acks =
        client.publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("stream").into_inner();
    for _ in 0..2 {
        let envelopes = vec![
            envelope(theirs, pb::EnvelopeKind::Application, true),
            envelope(mine, pb::EnvelopeKind::Application, true),
        ];
        tx.send(pb::PublishRequest { envelopes }).await.expect("send a batch");
    }
    drop(tx);
    let mut last = a.max(b);
    for _ in 0..2 {
        let ack = acks.message().await.expect("an ack").expect("not the end");
        let seq = sequence_id(&ack.results[0]);
        assert!(seq > last, "stream batches stored in order: {seq} after {last}");
        last = seq;
        published.extend([(theirs.clone(), seq), (mine.clone(), sequence_id(&ack.results[1]))]);
    }
    assert!(acks.message().await.expect("the end").is_none());

    let expected = nodes.expected(&published);
    let (received, duplicates, unacknowledged) = nodes.until_delivered(&expected).await;
    assert_eq!(unacknowledged, 0, "nothing outside the expected pushes");
    eprintln!(
        "all published to one node: {} envelopes, {forwarded} forwarded, {} pushes expected, {received} received,          {duplicates} duplicates",
        published.len(),
        expected.len()
    );
}

/// A frozen owner answers nothing: its envelopes are answered UNAVAILABLE
/// ("forwarding failed", outcome unknown) within the caller's deadline,
/// and the rest of the batch is stored. A dead one refuses at once. Once
/// the survivor holds the shard, the retry is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_owner_costs_only_its_envelopes_unavailable_within_the_deadline() {
    let Some(cql) = test_cql() else { return };
    let mut nodes = TwoNodes::start(&cql).await;
    let deadline = Duration::from_secs(2);
    for fault in ["pause", "kill"] {
        let map = settled_shard_map(&[&nodes.setup.fanout, &nodes.second]).await;
        let second = nodes.second.grpc.to_string();
        let owner_of = |topic: &[u8]| map.owners[usize::from(shard_of(topic, 16))].address.clone();
        let theirs = nodes.topics.iter().find(|t| owner_of(t) == second).expect("a topic of the second").clone();
        let mine = nodes.topics.iter().find(|t| owner_of(t) != second).expect("a topic of the first").clone();
        match fault {
            "pause" => nodes.second.pause().expect("SIGSTOP the second node"),
            _ => nodes.second.kill9(),
        }
        let batch = [&theirs, &mine, &theirs].map(|t| envelope(t, pb::EnvelopeKind::Application, true)).to_vec();
        let mut request = tonic::Request::new(pb::PublishRequest { envelopes: batch });
        request.set_timeout(deadline);
        let started = Instant::now();
        let mut client = nodes.setup.fanout.publisher().await.expect("publisher");
        let results = client.publish(request).await.expect("answered within the deadline").into_inner().results;
        let took = started.elapsed();
        if fault == "pause" {
            nodes.second.resume().expect("SIGCONT the second node");
        }
        assert!(took < deadline, "{fault}: answered in {took:?}, not at the deadline of {deadline:?}");
        sequence_id(&results[1]);
        for r in [&results[0], &results[2]] {
            let Some(pb::publish_result::Result::Error(e)) = &r.result else { panic!("{fault}: not stored: {r:?}") };
            assert_eq!(e.code, tonic::Code::Unavailable as i32);
            let routing = Routing::of(e).expect("an ErrorInfo detail");
            assert_eq!((routing.reason, routing.owner.as_deref()), (Reason::ForwardFailed, Some(second.as_str())));
            // A connection refused (the dead node) proves nothing was sent:
            // routed again until the deadline, then answered "nothing stored".
            let refused = routing.failure.as_deref() == Some("not_connected");
            assert!(fault == "kill" || !refused, "a frozen node accepts connections");
            assert_eq!(routing.outcome_unknown, !refused, "{fault}: {:?}", routing.failure);
            eprintln!("{fault}: answered in {took:?}: {}", e.message);
        }
        if fault == "pause" {
            let timeouts = metric(&nodes.setup.fanout, r#"fanout_forward_failures_total{reason="timeout"}"#).await;
            assert_eq!(timeouts, Some(2.0), "a frozen owner's forward times out");
        }
    }
    // The survivor takes the dead node's shards: a retry is stored.
    let theirs = &nodes.topics[0];
    publish_following(&[&nodes.setup.fanout], theirs).await;
}

/// Publishes acknowledged after the last restart before the rolling
/// restart's publisher stops.
const AFTER_RESTARTS: usize = 5;

/// A rolling restart under load: a publisher sends to both nodes in turn
/// (as a load balancer would: an RPC the node never processed, its
/// connection or stream refused, goes to the other node) while each node in
/// turn gets SIGTERM, exits, and is started again on the same ports. A
/// stopping node refuses new calls unprocessed, answers those it took, then
/// hands its shards over, and forwards follow the moving owner, so every
/// envelope is acknowledged, none answered with an error or cut, all
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_answers_every_publish_and_delivers_everything() {
    let Some(cql) = test_cql() else { return };
    let mut nodes = TwoNodes::start(&cql).await;
    let addresses = [nodes.setup.fanout.grpc.to_string(), nodes.second.grpc.to_string()];
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let topics = nodes.topics.clone();
    // Publishes acknowledged so far: the test ends once the publisher has
    // gone on after both restarts, however long the machine took for them.
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let counted = acknowledged.clone();
    let publisher = tokio::spawn(async move {
        let channels: Vec<_> = addresses
            .iter()
            .map(|a| tonic::transport::Endpoint::from_shared(format!("http://{a}")).unwrap().connect_lazy())
            .collect();
        let (mut published, mut errors, mut unsent) = (Vec::new(), Vec::new(), 0);
        for i in 0.. {
            if *stopped.borrow() {
                break;
            }
            let topic = &topics[i % topics.len()];
            let mut node = i % channels.len();
            // A node that refuses the connection (stopped) never saw the call.
            for _ in 0..2 * channels.len() {
                let mut client = pb::publish_service_client::PublishServiceClient::new(channels[node].clone());
                let mut request = tonic::Request::new(pb::PublishRequest {
                    envelopes: vec![envelope(topic, pb::EnvelopeKind::Application, true)],
                });
                request.set_timeout(Duration::from_secs(5));
                match client.publish(request).await {
                    Err(status) if never_processed(&status) => {
                        unsent += 1;
                        node = (node + 1) % channels.len();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(status) => {
                        errors.push(format!("{status:?}"));
                        break;
                    }
                    Ok(response) => {
                        match &response.into_inner().results[0].result {
                            Some(pb::publish_result::Result::SequenceId(s)) => {
                                published.push((topic.clone(), *s));
                                counted.fetch_add(1, Ordering::SeqCst);
                            }
                            other => errors.push(format!("{other:?}")),
                        }
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        (published, errors, unsent)
    });

    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for which in ["second", "first"] {
        let node = if which == "second" { &mut nodes.second } else { &mut nodes.setup.fanout };
        let term = Instant::now();
        let status = node.stop(Duration::from_secs(30)).await.expect("SIGTERM");
        assert!(status.success(), "{which} node exited with {status}");
        let stopped_in = term.elapsed();
        node.restart().await.expect("start the node again");
        settled_shard_map(&[&nodes.setup.fanout, &nodes.second]).await;
        eprintln!(
            "{which} node: stopped in {stopped_in:?}, back and shards split again {:?} after SIGTERM",
            term.elapsed()
        );
    }
    let after_restarts = acknowledged.load(Ordering::SeqCst);
    let give_up = Instant::now() + Duration::from_secs(60);
    while acknowledged.load(Ordering::SeqCst) < after_restarts + AFTER_RESTARTS {
        assert!(Instant::now() < give_up, "the publisher did not go on after the restarts");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(true);
    let (published, errors, unsent) = publisher.await.expect("the publisher");
    assert!(
        errors.is_empty(),
        "{} of {} publishes answered with an error: {errors:?}",
        errors.len(),
        published.len() + errors.len()
    );
    let expected = nodes.expected(&published);
    let (received, duplicates, unacknowledged) = nodes.until_delivered(&expected).await;
    assert_eq!(unacknowledged, 0, "every envelope stored was acknowledged");
    let retries = metric_family(&nodes.setup.fanout, "fanout_forward_retries_total").await
        + metric_family(&nodes.second, "fanout_forward_retries_total").await;
    eprintln!(
        "rolling restart of two nodes in {:?}: {} envelopes acknowledged, 0 errors, {unsent} RPCs refused and sent \
         to the other node, {retries} envelopes routed again inside the engines (since the restarts); {} pushes \
         expected, {received} received, {duplicates} duplicates",
        started.elapsed(),
        published.len(),
        expected.len()
    );
}

/// Every series of a metric family on `node`, summed.
async fn metric_family(node: &Fanout, family: &str) -> f64 {
    let (_, text) = node.http_get("/metrics").await.expect("metrics");
    text.lines()
        .filter(|l| l.strip_prefix(family).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The nodes' shard map once they agree and each owns its fair share
/// (rebalancing is over), every shard owned.
async fn settled_shard_map(nodes: &[&Fanout]) -> pb::ShardMap {
    let deadline = Instant::now() + Duration::from_secs(30);
    // A map settles when every node reports it, split evenly, and it stays
    // so for longer than a lease round: a node's own view of another's
    // leases is re-read every TTL/3, so one agreeing read can still be
    // a round behind a shard that is changing hands.
    let mut seen: Option<(pb::ShardMap, Instant)> = None;
    loop {
        let mut maps = Vec::new();
        for node in nodes {
            let mut client = node.publisher().await.expect("publisher");
            maps.push(client.get_shard_map(pb::GetShardMapRequest {}).await.expect("shard map").into_inner());
        }
        let share = maps[0].owners.len() / nodes.len();
        let owned_by = |n: &Fanout| maps[0].owners.iter().filter(|o| o.address == n.grpc.to_string()).count();
        let settled = maps.iter().all(|m| *m == maps[0])
            && maps[0].owners.iter().enumerate().all(|(i, o)| o.shard as usize == i)
            && nodes.iter().all(|n| owned_by(n) == share);
        if settled {
            let map = maps.swap_remove(0);
            match &seen {
                Some((first, since)) if *first == map && since.elapsed() >= STABLE_FOR => return map,
                Some((first, _)) if *first == map => {}
                _ => seen = Some((map, Instant::now())),
            }
        } else {
            seen = None;
        }
        assert!(Instant::now() < deadline, "the shard maps did not settle: {maps:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long a settled shard map must stay the same: longer than a lease
/// round of the tests' nodes.
const STABLE_FOR: Duration = Duration::from_millis(LEASE_TTL_SECONDS * 500);

/// A topic's shard as docs/CLIENT.md tells publishers to compute it:
/// FNV-1a 64 of the topic bytes, modulo the shard count.
fn shard_of(topic: &[u8], shard_count: u16) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(shard_count)) as u16
}

/// A Publish marked as one node's forward to another.
async fn publish_marked_forwarded(node: &Fanout, envelopes: Vec<pb::Envelope>) -> Vec<pb::PublishResult> {
    let mut request = tonic::Request::new(pb::PublishRequest { envelopes });
    request.metadata_mut().insert("fanout-forwarded", tonic::metadata::MetadataValue::from_static("1"));
    let mut client = node.publisher().await.expect("publisher");
    client.publish(request).await.expect("publish").into_inner().results
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
    fanout_testkit::outside_service::cql_server()
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
                    let owner = redirect_owner(e);
                    match owner.and_then(|a| addresses.iter().position(|n| *n == a)) {
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

/// Publishes one envelope, resending it where an UNAVAILABLE answer's
/// detail says another node owns its shard, and retrying while the shard
/// has no reachable owner. Returns the sequence id and how many redirects
/// were followed (none while nodes forward to each other).
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
                let owner = redirect_owner(e);
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

/// The owner an UNAVAILABLE answer's detail says to publish to: one that
/// owns the shard (not one a forward failed to reach).
fn redirect_owner(error: &pb::PublishError) -> Option<String> {
    Routing::of(error).filter(|r| r.reason == Reason::ShardOwnedElsewhere).and_then(|r| r.owner)
}

async fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
