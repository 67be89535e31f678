//! The publisher side of a run, over gRPC: registers the scenario's webhook
//! recipients and their subscriptions with bounded concurrency, then
//! publishes its envelopes (a burst, or a steady rate) and tells the
//! collector each envelope's sequence id as its Publish RPC returns.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fanout_engine::domain::Topic;
use fanout_proto::routing::{Reason, Routing, never_processed};
use fanout_proto::v1 as pb;
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_proto::v1::publish_service_client::PublishServiceClient;
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::collector::{Collector, Percentiles, latency_histogram, webpush_endpoint};
use super::ids::RunIds;
use super::progress::Progress;
use super::scenario::{Envelopes, Plan, ScenarioChannel, Setup};

/// A few gRPC connections to the engine, used round-robin.
#[derive(Clone)]
pub struct Grpc {
    channels: Vec<Channel>,
    next: Arc<AtomicUsize>,
}

impl Grpc {
    /// Connects `connections` channels, retrying until `timeout`.
    pub async fn connect(addr: SocketAddr, connections: usize, timeout: Duration) -> anyhow::Result<Grpc> {
        let deadline = Instant::now() + timeout;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(60));
        let mut channels = Vec::new();
        while channels.len() < connections.max(1) {
            match endpoint.connect().await {
                Ok(channel) => channels.push(channel),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("connecting to the engine's gRPC at {addr}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        Ok(Grpc { channels, next: Arc::new(AtomicUsize::new(0)) })
    }

    fn channel(&self) -> Channel {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    pub(super) fn notifications(&self) -> NotificationServiceClient<Channel> {
        NotificationServiceClient::new(self.channel())
    }

    fn publisher(&self) -> PublishServiceClient<Channel> {
        PublishServiceClient::new(self.channel())
    }
}

/// How publishes reach several engine nodes (`--publish-via`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishVia {
    /// As a load balancer would: every Publish RPC, resends included, to the
    /// next node in turn, with no routing knowledge; the node forwards the
    /// envelopes of shards another node owns.
    #[default]
    RoundRobin,
    /// As a publisher that routes by itself: each batch split by the shard
    /// map (GetShardMap) and each part sent to its shard's owner, an
    /// envelope answered SHARD_OWNED_ELSEWHERE resent to the owner its
    /// error detail names.
    Owner,
}

/// The engine nodes of a run, each with its connections: registration is
/// spread over them (recipient r on node r mod N), and publishes go as
/// `via` says.
#[derive(Clone)]
pub struct Cluster {
    nodes: Vec<Grpc>,
    /// Each node's advertised gRPC address, as an error detail names it.
    addresses: Vec<String>,
    via: PublishVia,
    /// The next node of `RoundRobin`.
    turn: Arc<AtomicUsize>,
    /// Several nodes with a fault: a Publish RPC that timed out or failed in
    /// transport, or an envelope whose outcome its error detail says is
    /// unknown, is resent to another node (it may then be stored twice: the
    /// copy never acknowledged is counted apart). With one node such an
    /// envelope is an error, as before.
    retry_unknown: bool,
    /// Each RPC's own deadline with `retry_unknown` (a paused node never answers).
    rpc_timeout: Duration,
}

impl Cluster {
    /// One node, as every single-engine run has.
    pub fn single(grpc: Grpc, address: SocketAddr) -> Cluster {
        Cluster {
            nodes: vec![grpc],
            addresses: vec![address.to_string()],
            via: PublishVia::RoundRobin,
            turn: Arc::new(AtomicUsize::new(0)),
            retry_unknown: false,
            rpc_timeout: Duration::from_secs(60),
        }
    }

    /// `connections` to each of `addresses`; `via` and `retry_unknown` as the fields say.
    pub async fn connect(
        addresses: &[SocketAddr],
        connections: usize,
        timeout: Duration,
        via: PublishVia,
        retry_unknown: bool,
    ) -> anyhow::Result<Cluster> {
        let mut nodes = Vec::new();
        for addr in addresses {
            nodes.push(Grpc::connect(*addr, connections, timeout).await?);
        }
        Ok(Cluster {
            nodes,
            addresses: addresses.iter().map(ToString::to_string).collect(),
            via,
            turn: Arc::new(AtomicUsize::new(0)),
            retry_unknown,
            rpc_timeout: Duration::from_secs(5),
        })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn node(&self, index: usize) -> &Grpc {
        &self.nodes[index % self.nodes.len()]
    }

    /// The node of the next `RoundRobin` RPC.
    fn next_node(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed) % self.nodes.len()
    }

    /// The run's node at `address`, if it is one of them.
    fn node_at(&self, address: &str) -> Option<usize> {
        self.addresses.iter().position(|a| a == address)
    }

    /// The shard map as the first node gives it: each shard's owner among
    /// the run's nodes (`None`: no owner, or one not of the run), and the
    /// shard count.
    async fn shard_map(&self) -> anyhow::Result<ShardMap> {
        let map = self.node(0).publisher().get_shard_map(pb::GetShardMapRequest {}).await?.into_inner();
        let owners = map.owners.iter().map(|o| self.node_at(&o.address)).collect();
        Ok(ShardMap { shard_count: u16::try_from(map.shard_count)?, owners: Mutex::new(owners) })
    }
}

/// `PublishVia::Owner`'s routing table, corrected as error details name owners.
struct ShardMap {
    shard_count: u16,
    owners: Mutex<Vec<Option<usize>>>,
}

impl ShardMap {
    /// The node that owns `topic`'s shard, as far as the map knows.
    fn owner(&self, topic: &[u8]) -> Option<usize> {
        let shard = Topic::parse(topic).ok()?.shard(self.shard_count);
        self.owners.lock().unwrap_or_else(|p| p.into_inner()).get(usize::from(shard.index())).copied().flatten()
    }

    fn moved(&self, shard: u32, node: usize) {
        if let Some(owner) = self.owners.lock().unwrap_or_else(|p| p.into_inner()).get_mut(shard as usize) {
            *owner = Some(node);
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SetupStats {
    pub recipients: u64,
    pub subscriptions: u64,
    /// Register and UpdateSubscriptions calls.
    pub rpcs: u64,
    pub seconds: f64,
    pub recipients_per_second: f64,
    pub rpcs_per_second: f64,
    /// Register and UpdateSubscriptions calls answered by each node (one
    /// entry per engine node, recipient r on node r mod N).
    pub rpcs_per_node: Vec<u64>,
}

/// Calls `f` up to three times (with a short pause) before giving up.
async fn with_retries<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
        }
        match f().await {
            Ok(v) => return Ok(v),
            Err(status) => last = Some(status),
        }
    }
    let status = last.expect("three attempts were made");
    bail!("{what} failed: {} {}", status.code(), status.message())
}

/// Registers every recipient (webhook URL `urls[r % urls.len()]`, its derived
/// signing key; or its device token, or its Web Push subscription) and
/// subscribes it to its topics, on node r mod N of `cluster`.
pub async fn setup(
    cluster: &Cluster,
    plan: &Arc<Plan>,
    ids: RunIds,
    urls: &[String],
    settings: &Setup,
    progress: &Progress,
    timeout: Duration,
) -> anyhow::Result<SetupStats> {
    progress.phase("register", u64::from(plan.recipients));
    let started = Instant::now();
    let rpcs = Arc::new(AtomicUsize::new(0));
    let per_node: Arc<Vec<AtomicUsize>> = Arc::new((0..cluster.len()).map(|_| AtomicUsize::new(0)).collect());
    let per_request = settings.subscriptions_per_request;
    let work = futures::stream::iter(0..plan.recipients)
        .map(|r| {
            let node = r as usize % cluster.len();
            let (grpc, plan, rpcs, per_node) =
                (cluster.node(node).clone(), plan.clone(), rpcs.clone(), per_node.clone());
            let url = urls[r as usize % urls.len()].clone();
            async move {
                let (id, secret) = (ids.recipient_id(r).to_vec(), ids.secret(r).to_vec());
                // Relay and APNs scenarios: the device token is the recipient
                // id in hex, so the collector knows the device from the request.
                let delivery = match plan.channel_of(r) {
                    ScenarioChannel::Relay => pb::register_request::Delivery::Relay(pb::RelayDelivery {
                        provider: "apns".into(),
                        token: hex::encode(&id),
                        ..Default::default()
                    }),
                    ScenarioChannel::Apns => {
                        pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: hex::encode(&id) })
                    }
                    // Web Push: the endpoint names the recipient, and the keys
                    // are derived from the run's ids so the receiver decrypts.
                    ScenarioChannel::WebPush => {
                        let subscriber = ids.webpush_subscriber(r);
                        pb::register_request::Delivery::Webpush(pb::WebPushDelivery {
                            endpoint: webpush_endpoint(&url, &id),
                            p256dh: subscriber.p256dh(),
                            auth: subscriber.auth().to_vec(),
                        })
                    }
                    // `channel_of` names one recipient's channel, never `Mixed`.
                    ScenarioChannel::Http | ScenarioChannel::Mixed => {
                        pb::register_request::Delivery::Http(pb::HttpDelivery {
                            url,
                            signing_key: ids.signing_key(r).to_vec(),
                        })
                    }
                };
                let register = pb::RegisterRequest {
                    recipient_id: id.clone(),
                    recipient_secret: secret.clone(),
                    delivery: Some(delivery),
                };
                with_retries("Register", || {
                    let (mut client, request) = (grpc.notifications(), register.clone());
                    async move { client.register(request).await }
                })
                .await?;
                rpcs.fetch_add(1, Ordering::Relaxed);
                per_node[node].fetch_add(1, Ordering::Relaxed);
                let topics: Vec<u32> = plan.topics_of(r).collect();
                for chunk in topics.chunks(per_request) {
                    let update = pb::UpdateSubscriptionsRequest {
                        recipient_id: id.clone(),
                        recipient_secret: secret.clone(),
                        adds: chunk
                            .iter()
                            .map(|t| pb::Subscription {
                                topic: ids.topic(*t),
                                hmac_epoch_base: 0,
                                hmac_keys: vec![],
                                include_commits: false,
                            })
                            .collect(),
                        removes: vec![],
                    };
                    with_retries("UpdateSubscriptions", || {
                        let (mut client, request) = (grpc.notifications(), update.clone());
                        async move { client.update_subscriptions(request).await }
                    })
                    .await?;
                    rpcs.fetch_add(1, Ordering::Relaxed);
                    per_node[node].fetch_add(1, Ordering::Relaxed);
                }
                progress.add(1);
                anyhow::Ok(topics.len() as u64)
            }
        })
        .buffer_unordered(settings.concurrency);
    let subscriptions = tokio::time::timeout(timeout, async move {
        let mut work = std::pin::pin!(work);
        let mut subscriptions = 0;
        while let Some(result) = work.next().await {
            subscriptions += result?;
        }
        anyhow::Ok(subscriptions)
    })
    .await
    .with_context(|| format!("setup did not finish within {timeout:?} (timeouts.setup_seconds)"))??;
    let seconds = started.elapsed().as_secs_f64();
    let rpcs = rpcs.load(Ordering::Relaxed) as u64;
    Ok(SetupStats {
        recipients: u64::from(plan.recipients),
        subscriptions,
        rpcs,
        seconds,
        recipients_per_second: f64::from(plan.recipients) / seconds.max(1e-9),
        rpcs_per_second: rpcs as f64 / seconds.max(1e-9),
        rpcs_per_node: per_node.iter().map(|n| n.load(Ordering::Relaxed) as u64).collect(),
    })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PublishStats {
    pub envelopes: u64,
    pub stored: u64,
    /// Envelopes refused, or lost with a failed RPC (never retried: that could publish twice).
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first Publish RPC sent to the last one answered.
    pub seconds: f64,
    /// Envelopes stored per second of `seconds`: the ingest rate of a burst,
    /// the achieved rate of a steady run.
    pub envelopes_per_second: f64,
    /// Envelopes per Publish RPC, and RPCs in flight at once.
    pub batch_size: usize,
    pub concurrency: usize,
    /// Duration of the Publish RPCs themselves.
    pub rpc_latency: Percentiles,
    /// Envelopes acknowledged by each engine node.
    pub stored_per_node: Vec<u64>,
    /// How the RPCs chose their node.
    pub via: PublishVia,
    /// Envelopes stored by the first RPC that carried them: all of them
    /// when no node fails, whichever node each RPC reached.
    pub first_try: u64,
    /// Envelopes answered SHARD_OWNED_ELSEWHERE (resent to that owner with
    /// `--publish-via owner`, to the next node otherwise).
    pub redirects: u64,
    /// Envelopes resent after another answer that stored nothing (no owner
    /// yet, a forward never sent).
    pub retries: u64,
    /// Several nodes with a fault: envelopes whose RPC timed out or failed,
    /// or that were answered "lease ran out while storing", then resent:
    /// each may have been stored twice (its deliveries are counted as
    /// `unacknowledged`). Those a node answered so; `lost_in_transport`
    /// counts the rest.
    pub unknown_outcome: u64,
    /// Of `unknown_outcome`: envelopes whose RPC was sent but failed in
    /// transport or had no answer in time (no node answered them).
    pub lost_in_transport: u64,
    /// The error of the first envelope of unknown outcome that was resent
    /// (the status, or what the node answered), to tell why.
    pub first_resent: Option<String>,
    /// Envelopes whose RPC could not connect to its node, whose stream the
    /// node refused as it shut down, or that the client cancelled before
    /// sending it (never processed), sent to the next node, as a load
    /// balancer with health checks does.
    pub unsent: u64,
}

/// What the publish tasks share.
struct Shared {
    stored: u64,
    first_try: u64,
    errors: u64,
    first_error: Option<String>,
    rpc_us: Histogram<u64>,
    stored_per_node: Vec<u64>,
    redirects: u64,
    retries: u64,
    unknown_outcome: u64,
    lost_in_transport: u64,
    first_resent: Option<String>,
    unsent: u64,
}

/// How long an envelope is resent for (redirects, no owner, unknown
/// outcomes) before it counts as an error: a few lease TTLs.
const RESEND_FOR: Duration = Duration::from_secs(60);
/// Between rounds of resending what had no owner or no answer.
const RESEND_PAUSE: Duration = Duration::from_millis(200);

/// What to do with one envelope's answer, as its error detail says (the
/// message text is for people).
enum Answer {
    Stored(u64),
    /// Nothing was stored: this node of the run owns the shard.
    Redirect {
        node: usize,
        shard: u32,
    },
    /// Nothing was stored: send it again after a pause.
    Retry,
    /// Perhaps stored: send it again (several nodes with a fault) or count an error.
    Unknown(String),
    /// The RPC was sent but no node answered it (a transport failure, no
    /// answer in time): perhaps stored, as `Unknown`.
    Lost(String),
    /// The RPC could not connect, or its stream was refused by the node's
    /// GOAWAY: never processed; the next node takes it.
    Unsent,
    Error(String),
}

fn answer_of(cluster: &Cluster, result: Option<pb::publish_result::Result>) -> Answer {
    match result {
        Some(pb::publish_result::Result::SequenceId(seq)) => Answer::Stored(seq),
        Some(pb::publish_result::Result::Error(e)) if e.code == tonic::Code::Unavailable as i32 => {
            match Routing::of(&e) {
                None => Answer::Unknown(e.message),
                Some(r) if r.outcome_unknown => Answer::Unknown(e.message),
                Some(Routing { reason: Reason::ShardOwnedElsewhere, owner: Some(owner), shard, .. }) => {
                    match cluster.node_at(&owner) {
                        Some(node) => Answer::Redirect { node, shard },
                        None => Answer::Retry,
                    }
                }
                Some(_) => Answer::Retry,
            }
        }
        other => Answer::Error(format!("{other:?}")),
    }
}

/// Publishes envelopes `start..end` and reports them to the collector:
/// in one RPC to the next node (`RoundRobin`), or split by the shard map,
/// one RPC per owner (`Owner`). Envelopes that were not stored are resent
/// (to the owner an error detail names, with `Owner`), those that found no
/// owner (or, with `retry_unknown`, no answer) after a pause, for up to
/// `RESEND_FOR`.
#[allow(clippy::too_many_arguments)]
async fn publish_batch(
    cluster: Cluster,
    map: Option<Arc<ShardMap>>,
    plan: Arc<Plan>,
    ids: RunIds,
    collector: Arc<Collector>,
    shared: Arc<Mutex<Shared>>,
    progress: Arc<Progress>,
    (start, end): (u64, u64),
) {
    let envelope = |e: u64| pb::Envelope {
        topic: ids.topic(plan.topic_of_envelope(e)),
        kind: pb::EnvelopeKind::Application as i32,
        should_push: true,
        sender_hmac: vec![],
        data: b"loadtest ciphertext".to_vec(),
        ..pb::Envelope::default()
    };
    // The owner of an envelope's shard, as far as the map knows (`Owner` only).
    let mapped_owner = |e: u64| map.as_ref().and_then(|m| m.owner(&ids.topic(plan.topic_of_envelope(e))));
    let resend_until = Instant::now() + RESEND_FOR;
    // (node, envelopes) still to send.
    let mut todo: Vec<(usize, Vec<u64>)> = Vec::new();
    let add = |todo: &mut Vec<(usize, Vec<u64>)>, node: usize, e: u64| match todo.iter_mut().find(|(n, _)| *n == node) {
        Some((_, v)) => v.push(e),
        None => todo.push((node, vec![e])),
    };
    match cluster.via {
        PublishVia::RoundRobin => todo.push((cluster.next_node(), (start..end).collect())),
        PublishVia::Owner => {
            let anywhere = cluster.next_node();
            for e in start..end {
                add(&mut todo, mapped_owner(e).unwrap_or(anywhere), e);
            }
        }
    }
    let mut round = 0u32;
    // Only RPCs that could not connect are left: the next node takes them at once.
    let mut only_unsent = false;
    while !todo.is_empty() {
        if round > 0 && !only_unsent {
            tokio::time::sleep(RESEND_PAUSE).await;
        }
        round += 1;
        only_unsent = true;
        let out_of_time = Instant::now() >= resend_until;
        let mut next: Vec<(usize, Vec<u64>)> = Vec::new();
        for (node, batch) in std::mem::take(&mut todo) {
            // Resends with no routing knowledge go to the node after the
            // one that answered, as a load balancer retries elsewhere. (Not
            // the next turn: taking a turn per round as well as per batch
            // sent every first RPC to the same node of two.)
            let anywhere = (node + 1) % cluster.len();
            let mut request =
                tonic::Request::new(pb::PublishRequest { envelopes: batch.iter().map(|e| envelope(*e)).collect() });
            // The node's deadline too: its forwards and retries end within it.
            request.set_timeout(cluster.rpc_timeout);
            let sent = Instant::now();
            let mut client = cluster.node(node).publisher();
            let result = match tokio::time::timeout(cluster.rpc_timeout, client.publish(request)).await {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(s)) if never_processed(&s) => Err(None),
                // With the transport's cause, which says how it was lost.
                Ok(Err(s)) => Err(Some(match std::error::Error::source(&s) {
                    Some(cause) => format!("{} {}: {cause:?}", s.code(), s.message()),
                    None => format!("{} {}", s.code(), s.message()),
                })),
                Err(_) => Err(Some(format!("no answer within {:?}", cluster.rpc_timeout))),
            };
            let returned = Instant::now();
            let mut shared = shared.lock().unwrap_or_else(|p| p.into_inner());
            shared.rpc_us.saturating_record(returned.duration_since(sent).as_micros() as u64);
            let answers: Vec<Answer> = match result {
                Ok(response) => {
                    let mut results = response.into_inner().results.into_iter().map(|r| r.result);
                    batch.iter().map(|_| answer_of(&cluster, results.next().flatten())).collect()
                }
                Err(None) => batch.iter().map(|_| Answer::Unsent).collect(),
                Err(Some(e)) => batch.iter().map(|_| Answer::Lost(e.clone())).collect(),
            };
            for (&e, answer) in batch.iter().zip(answers) {
                let error = match answer {
                    Answer::Stored(seq) => {
                        collector.envelope_published(plan.topic_of_envelope(e), seq, returned);
                        shared.stored += 1;
                        shared.first_try += u64::from(round == 1);
                        shared.stored_per_node[node] += 1;
                        progress.add(1);
                        continue;
                    }
                    Answer::Redirect { node: owner, shard } if !out_of_time => {
                        shared.redirects += 1;
                        only_unsent = false;
                        match &map {
                            Some(map) => {
                                map.moved(shard, owner);
                                add(&mut next, owner, e);
                            }
                            None => add(&mut next, anywhere, e),
                        }
                        continue;
                    }
                    Answer::Retry if !out_of_time => {
                        shared.retries += 1;
                        only_unsent = false;
                        add(&mut next, mapped_owner(e).unwrap_or(anywhere), e);
                        continue;
                    }
                    Answer::Unsent if !out_of_time => {
                        shared.unsent += 1;
                        add(&mut next, (node + 1) % cluster.len(), e);
                        continue;
                    }
                    Answer::Unknown(ref error) | Answer::Lost(ref error) if cluster.retry_unknown && !out_of_time => {
                        shared.unknown_outcome += 1;
                        only_unsent = false;
                        if matches!(answer, Answer::Lost(_)) {
                            shared.lost_in_transport += 1;
                        }
                        shared.first_resent.get_or_insert_with(|| error.clone());
                        add(&mut next, anywhere, e);
                        continue;
                    }
                    Answer::Redirect { .. } | Answer::Retry => "no node took it in time".to_string(),
                    Answer::Unsent => "no node could be reached in time".to_string(),
                    Answer::Unknown(e) | Answer::Lost(e) | Answer::Error(e) => e,
                };
                shared.errors += 1;
                shared.first_error.get_or_insert(error);
                progress.add(1);
            }
        }
        todo = next;
    }
}

/// Publishes the plan's envelopes: all at once with `concurrency` RPCs in
/// flight (burst), or at `rate` per second in small batches (steady).
pub async fn publish(
    cluster: &Cluster,
    plan: &Arc<Plan>,
    ids: RunIds,
    settings: &Envelopes,
    collector: &Arc<Collector>,
    progress: &Arc<Progress>,
    timeout: Duration,
) -> anyhow::Result<PublishStats> {
    progress.phase("publish", plan.envelopes);
    let map = match cluster.via {
        PublishVia::Owner => Some(Arc::new(cluster.shard_map().await.context("GetShardMap")?)),
        PublishVia::RoundRobin => None,
    };
    let shared = Arc::new(Mutex::new(Shared {
        stored: 0,
        first_try: 0,
        errors: 0,
        first_error: None,
        rpc_us: latency_histogram(),
        stored_per_node: vec![0; cluster.len()],
        redirects: 0,
        retries: 0,
        unknown_outcome: 0,
        lost_in_transport: 0,
        first_resent: None,
        unsent: 0,
    }));
    let started = Instant::now();
    collector.mark_start(started);
    let size = settings.batch_size as u64;
    let batch = |(start, end): (u64, u64)| {
        let (cluster, map, plan, collector) = (cluster.clone(), map.clone(), plan.clone(), collector.clone());
        publish_batch(cluster, map, plan, ids, collector, shared.clone(), progress.clone(), (start, end))
    };
    let run = async {
        match plan.rate {
            None => {
                let ranges =
                    (0..plan.envelopes.div_ceil(size)).map(|b| (b * size, ((b + 1) * size).min(plan.envelopes)));
                futures::stream::iter(ranges).map(batch).buffer_unordered(settings.concurrency).collect::<()>().await;
            }
            Some(rate) => {
                // Every 5 ms, publish what the schedule says is due; at most
                // `concurrency` RPCs in flight (the schedule slips if the engine is slower).
                let permits = Arc::new(tokio::sync::Semaphore::new(settings.concurrency));
                let mut tasks = tokio::task::JoinSet::new();
                let mut next = 0u64;
                let mut ticker = tokio::time::interval(Duration::from_millis(5));
                while next < plan.envelopes {
                    ticker.tick().await;
                    let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(plan.envelopes);
                    while next < due {
                        let end = (next + size).min(due);
                        let permit = permits.clone().acquire_owned().await.expect("semaphore is never closed");
                        let work = batch((next, end));
                        tasks.spawn(async move {
                            work.await;
                            drop(permit);
                        });
                        next = end;
                    }
                    while tasks.try_join_next().is_some() {}
                }
                while tasks.join_next().await.is_some() {}
            }
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .with_context(|| format!("publishing did not finish within {timeout:?}"))?;
    let seconds = started.elapsed().as_secs_f64();
    let shared = shared.lock().unwrap_or_else(|p| p.into_inner());
    Ok(PublishStats {
        envelopes: plan.envelopes,
        stored: shared.stored,
        errors: shared.errors,
        first_error: shared.first_error.clone(),
        seconds,
        envelopes_per_second: shared.stored as f64 / seconds.max(1e-9),
        batch_size: settings.batch_size,
        concurrency: settings.concurrency,
        rpc_latency: Percentiles::from_histogram_us(&shared.rpc_us),
        stored_per_node: shared.stored_per_node.clone(),
        via: cluster.via,
        first_try: shared.first_try,
        redirects: shared.redirects,
        retries: shared.retries,
        unknown_outcome: shared.unknown_outcome,
        lost_in_transport: shared.lost_in_transport,
        first_resent: shared.first_resent.clone(),
        unsent: shared.unsent,
    })
}

impl PublishStats {
    /// The summary's publish line.
    pub fn line(&self) -> String {
        format!(
            "{} stored, {} errors in {:.2} s: {:.0} envelopes/s (batches of {}, {} RPCs in flight); Publish RPC p50 {:.1} ms p99 {:.1} ms",
            self.stored,
            self.errors,
            self.seconds,
            self.envelopes_per_second,
            self.batch_size,
            self.concurrency,
            self.rpc_latency.p50_ms,
            self.rpc_latency.p99_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn publish_answers_are_read_from_their_error_detail_not_their_text() {
        let channel = Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let node = Grpc { channels: vec![channel], next: Arc::new(AtomicUsize::new(0)) };
        let cluster = Cluster {
            nodes: vec![node.clone(), node],
            addresses: vec!["127.0.0.1:7001".into(), "127.0.0.1:7002".into()],
            via: PublishVia::Owner,
            turn: Arc::new(AtomicUsize::new(0)),
            retry_unknown: true,
            rpc_timeout: Duration::from_secs(1),
        };
        let error = |reason: Reason, owner: Option<&str>, outcome_unknown: bool| {
            let routing = Routing { reason, shard: 3, owner: owner.map(str::to_owned), outcome_unknown, failure: None };
            Some(pb::publish_result::Result::Error(pb::PublishError {
                code: tonic::Code::Unavailable as i32,
                // The text says nothing a program reads.
                message: "for people".into(),
                details: vec![routing.to_any()],
            }))
        };
        let answer = |r| answer_of(&cluster, r);
        assert!(matches!(answer(Some(pb::publish_result::Result::SequenceId(7))), Answer::Stored(7)));
        let owned = error(Reason::ShardOwnedElsewhere, Some("127.0.0.1:7002"), false);
        assert!(matches!(answer(owned), Answer::Redirect { node: 1, shard: 3 }));
        let stranger = error(Reason::ShardOwnedElsewhere, Some("10.1.1.1:50051"), false);
        assert!(matches!(answer(stranger), Answer::Retry));
        assert!(matches!(answer(error(Reason::ShardHasNoOwner, None, false)), Answer::Retry));
        assert!(matches!(answer(error(Reason::LeaseLostWhileStoring, None, true)), Answer::Unknown(_)));
        let failed = error(Reason::ForwardFailed, Some("127.0.0.1:7002"), true);
        assert!(matches!(answer(failed), Answer::Unknown(_)), "a forward that may have arrived");
        assert!(matches!(answer(error(Reason::ForwardFailed, Some("127.0.0.1:7002"), false)), Answer::Retry));
        let bare = pb::PublishError { code: tonic::Code::Unavailable as i32, ..Default::default() };
        assert!(matches!(answer(Some(pb::publish_result::Result::Error(bare))), Answer::Unknown(_)), "no detail");
        let invalid = pb::PublishError { code: tonic::Code::InvalidArgument as i32, ..Default::default() };
        assert!(matches!(answer(Some(pb::publish_result::Result::Error(invalid))), Answer::Error(_)));
        assert!(matches!(answer(None), Answer::Error(_)));
        // Round-robin turns over the nodes.
        assert_eq!([cluster.next_node(), cluster.next_node(), cluster.next_node()], [0, 1, 0]);
    }

    #[test]
    fn only_a_refused_connection_counts_as_never_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(never_processed(&tonic::Status::from_error(Box::new(refused))));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!never_processed(&tonic::Status::from_error(Box::new(reset))), "perhaps received");
        assert!(!never_processed(&tonic::Status::unavailable("answered by a node")));
    }

    #[test]
    fn publish_line_gives_the_ingest_rate_and_batching() {
        let stats = PublishStats {
            envelopes: 100_000,
            stored: 100_000,
            seconds: 2.5,
            envelopes_per_second: 40_000.0,
            batch_size: 100,
            concurrency: 64,
            rpc_latency: Percentiles { p50_ms: 3.3, p99_ms: 12.0, ..Percentiles::default() },
            ..PublishStats::default()
        };
        assert_eq!(
            stats.line(),
            "100000 stored, 0 errors in 2.50 s: 40000 envelopes/s (batches of 100, 64 RPCs in flight); \
             Publish RPC p50 3.3 ms p99 12.0 ms"
        );
        let json = serde_json::to_value(&stats).unwrap();
        assert_eq!(json["envelopes_per_second"], 40_000.0);
        assert_eq!((json["batch_size"].as_u64(), json["concurrency"].as_u64()), (Some(100), Some(64)));
    }
}
