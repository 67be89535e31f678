//! Test doubles and fixtures shared by the engine's unit tests: an in-memory
//! lease table, a stand-in for the root supervisor, an envelope and a
//! recipient, a scripted FCM provider, the gateway's salt secrets and a
//! controlled clock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::channel::{Outcome, Provider, Push, Refusal};
use crate::domain::{Channel, Clock, Recipient, SaltEpochId, Timestamp};
use crate::domain::{DeliveryTarget, EnvelopeKind, RecipientId, SecretHash, ShardId, StoredEnvelope, Topic};
use crate::gateway::identity::{PushSecret, SaltSecrets};
use crate::store::{LeaseHolder, LiveNode, NodeId, ShardLeases, StoreError};

/// The commented-out `[<path>]` block of `fanout.example.toml`, uncommented
/// and parsed: the table at `path` (dotted), for the settings tests that
/// check the example against the defaults and rules.
pub fn example_block(path: &str) -> toml::Value {
    let example = include_str!("../../fanout.example.toml");
    let start = example.find(&format!("# [{path}]")).expect("the table is in the example");
    let block: Vec<&str> =
        example[start..].lines().take_while(|l| !l.is_empty()).map(|l| l.strip_prefix("# ").unwrap_or(l)).collect();
    let parsed: toml::Value = toml::from_str(&block.join("\n")).expect("the example block is TOML");
    path.split('.').fold(parsed, |table, key| table[key].clone())
}

/// A resolver for destinations reached by IP literal: it never resolves.
pub struct NoDns;

#[async_trait]
impl crate::transport::destination::HostResolver for NoDns {
    async fn resolve(&self, _host: &str) -> Result<Vec<std::net::IpAddr>, crate::transport::destination::ResolveError> {
        Err(crate::transport::destination::ResolveError::NoRecords)
    }
}

/// An application envelope on topic `00 01 02 03` (base64 `AAECAw==`).
pub fn envelope(sequence_id: u64) -> StoredEnvelope {
    StoredEnvelope {
        shard: ShardId::FIRST,
        sequence_id,
        topic: Topic::parse(&[0, 1, 2, 3]).expect("a group topic"),
        kind: EnvelopeKind::Application,
        server_ts_ns: 0,
        sender_hmac: None,
        data: b"secret payload".to_vec(),
        relay: Default::default(),
    }
}

/// A stored recipient reached at `target`.
pub fn recipient(target: DeliveryTarget) -> Recipient {
    Recipient {
        id: RecipientId::from_bytes([1u8; 32]),
        secret_hash: SecretHash([2u8; 32]),
        target,
        renewed_at_ns: 0,
        topic_count: 1,
    }
}
use crate::supervision::SupervisorMsg;

/// Leases and heartbeats that expire, like ScyllaDB's TTL'd rows. A shard's
/// term counts the times its lease changed hands, as ScyllaDB's owners claim
/// a term at each acquisition.
#[derive(Default)]
pub struct MemoryLeases {
    pub leases: Mutex<HashMap<ShardId, (NodeId, Instant)>>,
    nodes: Mutex<HashMap<String, Instant>>,
    addresses: Mutex<HashMap<String, String>>,
    terms: Mutex<HashMap<ShardId, u64>>,
    /// Heartbeats fail while set.
    pub failing_heartbeats: std::sync::atomic::AtomicBool,
    /// Lease requests fail without an answer while set (a lost database node).
    pub failing_leases: std::sync::atomic::AtomicBool,
    /// Lease requests hang while set (a stalled database node).
    pub stalled_leases: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl ShardLeases for MemoryLeases {
    async fn acquire_lease(
        &self,
        shard: ShardId,
        node: &NodeId,
        address: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        if self.stalled_leases.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        if self.failing_leases.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Backend("no answer (test)".into()));
        }
        self.addresses.lock().unwrap().insert(node.0.clone(), address.to_owned());
        let mut leases = self.leases.lock().unwrap();
        let now = Instant::now();
        match leases.get(&shard) {
            Some((owner, until)) if *until > now && owner != node => Ok(false),
            held => {
                if !held.is_some_and(|(owner, until)| *until > now && owner == node) {
                    *self.terms.lock().unwrap().entry(shard).or_default() += 1;
                }
                leases.insert(shard, (node.clone(), now + ttl));
                Ok(true)
            }
        }
    }
    async fn release_lease(&self, shard: ShardId, node: &NodeId) -> Result<(), StoreError> {
        let mut leases = self.leases.lock().unwrap();
        if leases.get(&shard).is_some_and(|(owner, _)| owner == node) {
            leases.remove(&shard);
        }
        Ok(())
    }
    async fn lease_owner(&self, shard: ShardId) -> Result<Option<(NodeId, String)>, StoreError> {
        let leases = self.leases.lock().unwrap();
        let owner = leases.get(&shard).filter(|(_, until)| *until > Instant::now());
        let address = |n: &NodeId| self.addresses.lock().unwrap().get(&n.0).cloned().unwrap_or_default();
        Ok(owner.map(|(n, _)| (n.clone(), address(n))))
    }
    async fn lease_owners(&self) -> Result<Vec<(ShardId, NodeId)>, StoreError> {
        let now = Instant::now();
        let leases = self.leases.lock().unwrap();
        Ok(leases.iter().filter(|(_, (_, until))| *until > now).map(|(s, (n, _))| (*s, n.clone())).collect())
    }
    async fn heartbeat(&self, node: &NodeId, address: &str, ttl: Duration) -> Result<(), StoreError> {
        if self.failing_heartbeats.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Backend("heartbeat refused (test)".into()));
        }
        self.addresses.lock().unwrap().insert(node.0.clone(), address.to_owned());
        self.nodes.lock().unwrap().insert(node.0.clone(), Instant::now() + ttl);
        Ok(())
    }
    async fn live_nodes(&self) -> Result<Vec<NodeId>, StoreError> {
        let now = Instant::now();
        let nodes = self.nodes.lock().unwrap();
        Ok(nodes.iter().filter(|(_, until)| **until > now).map(|(n, _)| NodeId(n.clone())).collect())
    }
    async fn forget_node(&self, node: &NodeId) -> Result<(), StoreError> {
        self.nodes.lock().unwrap().remove(&node.0);
        Ok(())
    }
    async fn lease_holders(&self) -> Result<Vec<LeaseHolder>, StoreError> {
        let now = Instant::now();
        let (leases, terms, addresses) =
            (self.leases.lock().unwrap(), self.terms.lock().unwrap(), self.addresses.lock().unwrap());
        let mut out: Vec<LeaseHolder> = leases
            .iter()
            .filter(|(_, (_, until))| *until > now)
            .map(|(shard, (node, until))| LeaseHolder {
                shard: *shard,
                node: node.clone(),
                address: addresses.get(&node.0).cloned().unwrap_or_default(),
                term: terms.get(shard).copied(),
                expires_in: Some(*until - now),
            })
            .collect();
        out.sort_by_key(|h| h.shard);
        Ok(out)
    }
    async fn node_addresses(&self) -> Result<Vec<LiveNode>, StoreError> {
        let mut nodes = self.live_nodes().await?;
        nodes.sort();
        let addresses = self.addresses.lock().unwrap();
        Ok(nodes
            .into_iter()
            .map(|node| LiveNode { address: addresses.get(&node.0).cloned().unwrap_or_default(), node })
            .collect())
    }
}

/// Stands in for the root supervisor: records Wake, accepts Own, answers
/// Disown with "no actor", or with a shard actor that never drains.
pub struct StandIn {
    pub wakes: Arc<Mutex<Vec<ShardId>>>,
    stuck_shards: bool,
}

impl StandIn {
    /// A running stand-in and the shards it was asked to wake.
    pub async fn start() -> (ActorRef<SupervisorMsg>, Arc<Mutex<Vec<ShardId>>>) {
        let wakes = Arc::new(Mutex::new(Vec::new()));
        let (actor, _) = Actor::spawn(None, StandIn { wakes: wakes.clone(), stuck_shards: false }, ())
            .await
            .expect("spawn the stand-in");
        (actor, wakes)
    }

    /// One whose shard actors never finish a drain: they stop only when killed.
    pub async fn with_stuck_shards() -> ActorRef<SupervisorMsg> {
        let stand_in = StandIn { wakes: Arc::default(), stuck_shards: true };
        Actor::spawn(None, stand_in, ()).await.expect("spawn the stand-in").0
    }
}

/// A shard actor that ignores everything (see [`StandIn::with_stuck_shards`]).
struct Stuck;

impl Actor for Stuck {
    type Msg = ();
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

impl Actor for StandIn {
    type Msg = SupervisorMsg;
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, _: ActorRef<SupervisorMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
    async fn handle(
        &self,
        _: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Disown { reply, .. } if self.stuck_shards => {
                let (stuck, _) = Actor::spawn(None, Stuck, ()).await?;
                let _ = reply.send(Some(stuck.get_cell()));
            }
            SupervisorMsg::Disown { reply, .. } => {
                let _ = reply.send(None);
            }
            SupervisorMsg::Wake(shards) => self.wakes.lock().unwrap().extend(shards),
            _ => {}
        }
        Ok(())
    }
}

/// FCM answering from a script; records what it was asked to send.
pub struct Scripted {
    answers: Mutex<VecDeque<Outcome>>,
    pub sent: Mutex<Vec<(String, Map<String, Value>, Option<String>)>>,
}

impl Scripted {
    pub fn new(answers: Vec<Outcome>) -> Arc<Self> {
        Arc::new(Self { answers: Mutex::new(answers.into()), sent: Mutex::default() })
    }
}

#[async_trait]
impl Provider for Scripted {
    fn channel(&self) -> Channel {
        Channel::Fcm
    }

    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        let Push::Relayed(push) = push else { unreachable!("the gateway sends relayed pushes only") };
        let sent = (push.token.to_owned(), push.payload.clone(), push.collapse_id.map(str::to_owned));
        self.sent.lock().unwrap().push(sent);
        Ok(self.answers.lock().unwrap().pop_front().unwrap_or(Outcome::Delivered))
    }

    fn timed_out(&self) -> Outcome {
        Outcome::transient(Duration::from_secs(10))
    }
}

/// The gateway's salt secrets: epoch `e1`, 32 bytes of 0x11.
pub fn salt_secrets() -> Arc<SaltSecrets> {
    let epoch = SaltEpochId::parse("e1").unwrap();
    let secret = PushSecret::new(vec![0x11; 32]).unwrap();
    Arc::new(SaltSecrets::new(epoch.clone(), HashMap::from([(epoch, secret)])).unwrap())
}

/// A clock that moves only when a test moves it, in Unix ms.
pub struct TestClock(AtomicI64);

impl TestClock {
    pub fn at(ms: i64) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(ms)))
    }

    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(i64::try_from(by.as_millis()).unwrap_or(i64::MAX), Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_nanos(self.0.load(Ordering::SeqCst).saturating_mul(1_000_000))
    }
}
