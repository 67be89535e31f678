//! What the client's integration tests share: the real `fanout` binary, a
//! host with conversations and keys the test changes, a clock the test
//! moves, and the tap: a gRPC server between the client and the engine that
//! records every notification request and answers a scripted status instead
//! of forwarding when told to (for statuses the engine cannot be made to
//! answer, and for hangs).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use fanout_client::host::BackgroundTask;
use fanout_client::{
    BackgroundRunner, ClientConfig, Clock, ConsentState, Conversation, ConversationKind, Conversations, DeliveryTarget,
    Error, GroupId, HostParts, Keys, NotificationClient, RootKey, StateStore, Topic,
};
use fanout_proto::v1 as pb;
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_proto::v1::notification_service_server::{NotificationService, NotificationServiceServer};
use fanout_testkit::launcher::{self, Engine, Launch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

pub fn fanout_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| launcher::build_binary(false).expect("cargo build of the fanout binary"))
}

/// The real engine with the HTTPS channel (private addresses allowed: every
/// receiver is on 127.0.0.1), `engine_extra` appended to `[engine]`, and
/// `ca` trusted for webhooks.
pub async fn start_engine(engine_extra: &str, ca: Option<&Path>) -> Engine {
    let ca = ca.map(|p| format!("{:?}", p.display().to_string())).unwrap_or_default();
    let config = format!(
        "[engine]\nshard_count = 16\n{engine_extra}\n\n[engine.channels.http]\nallow_private_addresses = true\nextra_ca_files = [{ca}]\n"
    );
    let env = vec![("FANOUT__ENGINE__DISPATCH__POLL_INTERVAL_MS".to_string(), "100".to_string())];
    Engine::start(Launch { env, ..Launch::new(fanout_binary(), config) }).await.expect("start fanout")
}

/// A webhook target the engine accepts at Register (nothing listens there:
/// these tests look at subscriptions, not deliveries).
pub fn webhook_target() -> DeliveryTarget {
    DeliveryTarget::Http { url: "https://127.0.0.1:9/hook".into(), signing_key: vec![7; 32] }
}

/// The app's side: conversations and keys the test changes at will.
pub struct TestHost {
    conversations: Mutex<Vec<Conversation>>,
    root: Mutex<Option<RootKey>>,
    welcome: Topic,
}

impl TestHost {
    pub fn new(installation: u8) -> Arc<TestHost> {
        Arc::new(TestHost {
            conversations: Mutex::new(Vec::new()),
            root: Mutex::new(Some(RootKey::new(&[0x2a; 42]).unwrap())),
            welcome: Topic::welcome(&[0xee, installation]).unwrap(),
        })
    }

    pub fn welcome(&self) -> Topic {
        self.welcome.clone()
    }

    pub fn join(&self, id: &GroupId, kind: ConversationKind, consent: ConsentState) {
        let mut all = self.conversations.lock().unwrap();
        all.retain(|c| &c.group_id != id);
        all.push(Conversation { group_id: id.clone(), kind, active_member: true, consent });
    }

    pub fn leave(&self, id: &GroupId) {
        for c in self.conversations.lock().unwrap().iter_mut().filter(|c| &c.group_id == id) {
            c.active_member = false;
        }
    }

    pub fn set_consent(&self, id: &GroupId, consent: ConsentState) {
        for c in self.conversations.lock().unwrap().iter_mut().filter(|c| &c.group_id == id) {
            c.consent = consent;
        }
    }

    pub fn set_root(&self, root: Option<RootKey>) {
        *self.root.lock().unwrap() = root;
    }
}

impl Conversations for TestHost {
    fn conversations(&self) -> Result<Vec<Conversation>, Error> {
        Ok(self.conversations.lock().unwrap().clone())
    }
}

impl Keys for TestHost {
    fn root_key(&self) -> Result<Option<RootKey>, Error> {
        Ok(self.root.lock().unwrap().clone())
    }

    fn welcome_topic(&self) -> Result<Topic, Error> {
        Ok(self.welcome.clone())
    }
}

/// The system clock moved by an offset the test sets.
#[derive(Default)]
pub struct TestClock {
    offset_secs: AtomicI64,
}

impl TestClock {
    pub fn advance(&self, secs: i64) {
        self.offset_secs.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        let offset = self.offset_secs.load(Ordering::SeqCst);
        if offset >= 0 {
            SystemTime::now() + Duration::from_secs(offset as u64)
        } else {
            SystemTime::now() - Duration::from_secs(offset.unsigned_abs())
        }
    }
}

pub fn group(n: u8) -> GroupId {
    GroupId::new(vec![0xc0, n, 0x5e, 0xed]).unwrap()
}

/// A client of the tap at `addr`, on the test's runtime.
pub struct ClientSetup {
    pub client: NotificationClient,
    pub host: Arc<TestHost>,
    pub clock: Arc<TestClock>,
    pub store: Arc<dyn StateStore>,
}

pub fn client_with(
    addr: SocketAddr,
    host: Arc<TestHost>,
    store: Arc<dyn StateStore>,
    runner: Arc<dyn BackgroundRunner>,
    tune: impl FnOnce(&mut ClientConfig),
) -> ClientSetup {
    let clock = Arc::new(TestClock::default());
    let mut config = ClientConfig::new(format!("http://{addr}"));
    // Generous for a loaded machine; the hang tests shorten it.
    config.backend.request_timeout = Duration::from_secs(10);
    tune(&mut config);
    let parts = HostParts {
        store: store.clone(),
        conversations: host.clone(),
        keys: host.clone(),
        runner,
        clock: clock.clone(),
    };
    let client = NotificationClient::new(config, parts).expect("client");
    ClientSetup { client, host, clock, store }
}

/// A host whose OS has not scheduled its background work (as a mobile OS
/// runs it when it decides): enabled, it keeps the tasks and runs none. The
/// tests that drive runs with `sync_now` use it so no background run races
/// them; the background tests use `TokioRunner`.
#[derive(Default)]
pub struct HeldRunner {
    tasks: Mutex<Vec<BackgroundTask>>,
}

impl BackgroundRunner for HeldRunner {
    fn is_enabled(&self) -> bool {
        true
    }

    fn spawn(&self, task: BackgroundTask) {
        self.tasks.lock().unwrap().push(task);
    }
}

pub fn held() -> Arc<HeldRunner> {
    Arc::new(HeldRunner::default())
}

pub fn client(addr: SocketAddr) -> ClientSetup {
    client_with(addr, TestHost::new(1), Arc::new(fanout_client::MemoryStore::new()), held(), |_| {})
}

/// One notification request as the tap saw it, with what it answered.
#[derive(Clone, Debug)]
pub enum Call {
    Register { recipient_id: Vec<u8>, delivery: Option<pb::register_request::Delivery> },
    Unregister { recipient_id: Vec<u8> },
    Update { recipient_id: Vec<u8>, adds: Vec<pb::Subscription>, removes: Vec<Vec<u8>> },
}

#[derive(Clone, Debug)]
pub struct Recorded {
    pub call: Call,
    /// topic_count on success (0 for Unregister), else the status code.
    pub answer: Result<u64, tonic::Code>,
}

impl Recorded {
    pub fn is_register(&self) -> bool {
        matches!(self.call, Call::Register { .. })
    }

    /// (adds, removes) of an UpdateSubscriptions.
    pub fn update(&self) -> Option<(&[pb::Subscription], &[Vec<u8>])> {
        match &self.call {
            Call::Update { adds, removes, .. } => Some((adds, removes)),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Fault {
    Status(tonic::Code),
    /// Never answers (the client's bound must end the wait).
    Hang,
}

#[derive(Default)]
struct TapState {
    calls: Mutex<Vec<Recorded>>,
    faults: Mutex<HashMap<&'static str, VecDeque<Fault>>>,
}

#[derive(Clone)]
struct TapService {
    upstream: NotificationServiceClient<Channel>,
    state: Arc<TapState>,
}

impl TapService {
    async fn answer<T>(
        &self,
        rpc: &'static str,
        call: Call,
        forward: impl Future<Output = Result<Response<T>, Status>>,
        count: impl Fn(&T) -> u64,
    ) -> Result<Response<T>, Status> {
        let fault = self.state.faults.lock().unwrap().get_mut(rpc).and_then(VecDeque::pop_front);
        let result = match fault {
            Some(Fault::Status(code)) => Err(Status::new(code, "injected by the test")),
            Some(Fault::Hang) => {
                tokio::time::sleep(Duration::from_secs(600)).await;
                Err(Status::unavailable("hang ended"))
            }
            None => forward.await,
        };
        let answer = match &result {
            Ok(r) => Ok(count(r.get_ref())),
            Err(s) => Err(s.code()),
        };
        self.state.calls.lock().unwrap().push(Recorded { call, answer });
        result
    }
}

#[tonic::async_trait]
impl NotificationService for TapService {
    async fn register(&self, request: Request<pb::RegisterRequest>) -> Result<Response<pb::RecipientState>, Status> {
        let r = request.into_inner();
        let call = Call::Register { recipient_id: r.recipient_id.clone(), delivery: r.delivery.clone() };
        let mut upstream = self.upstream.clone();
        self.answer("register", call, upstream.register(r), |s| s.topic_count).await
    }

    async fn unregister(
        &self,
        request: Request<pb::UnregisterRequest>,
    ) -> Result<Response<pb::UnregisterResponse>, Status> {
        let r = request.into_inner();
        let call = Call::Unregister { recipient_id: r.recipient_id.clone() };
        let mut upstream = self.upstream.clone();
        self.answer("unregister", call, upstream.unregister(r), |_| 0).await
    }

    async fn update_subscriptions(
        &self,
        request: Request<pb::UpdateSubscriptionsRequest>,
    ) -> Result<Response<pb::RecipientState>, Status> {
        let r = request.into_inner();
        let call =
            Call::Update { recipient_id: r.recipient_id.clone(), adds: r.adds.clone(), removes: r.removes.clone() };
        let mut upstream = self.upstream.clone();
        self.answer("update", call, upstream.update_subscriptions(r), |s| s.topic_count).await
    }
}

/// The tap in front of an engine. Stops when dropped.
pub struct Tap {
    pub addr: SocketAddr,
    state: Arc<TapState>,
    server: tokio::task::JoinHandle<()>,
}

impl Tap {
    pub async fn start(engine: &Engine) -> Tap {
        let upstream = engine.notifications().await.expect("engine client");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind tap");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(TapState::default());
        let service = TapService { upstream, state: state.clone() };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(NotificationServiceServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Tap { addr, state, server }
    }

    /// The next `rpc` ("register", "unregister", "update") answers `fault`.
    pub fn inject(&self, rpc: &'static str, fault: Fault) {
        self.state.faults.lock().unwrap().entry(rpc).or_default().push_back(fault);
    }

    pub fn calls(&self) -> Vec<Recorded> {
        self.state.calls.lock().unwrap().clone()
    }

    /// Calls recorded since `from` calls had been.
    pub fn calls_since(&self, from: usize) -> Vec<Recorded> {
        self.calls().split_off(from)
    }

    pub fn count(&self) -> usize {
        self.state.calls.lock().unwrap().len()
    }

    /// Waits until at least `n` calls were recorded (at most `timeout`).
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.count() < n && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.calls()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A raw engine client acting for the same recipient behind the client's
/// back (a server-side deletion, a lost topic).
pub async fn raw(engine: &Engine) -> NotificationServiceClient<Channel> {
    engine.notifications().await.expect("engine client")
}

/// The backend loses the client's recipient (expiry, a restore from backup):
/// an Unregister behind the client's back.
pub async fn delete_behind_the_back(engine: &Engine, client: &NotificationClient) {
    let identity = client.stored().identity.expect("an identity");
    raw(engine)
        .await
        .unregister(pb::UnregisterRequest {
            recipient_id: identity.id().to_vec(),
            recipient_secret: identity.secret().to_vec(),
        })
        .await
        .expect("raw unregister");
}

/// The engine (with `engine_extra` in `[engine]`) and a tap in front of it.
pub async fn engine_and_tap(engine_extra: &str) -> (Engine, Tap) {
    let engine = start_engine(engine_extra, None).await;
    let tap = Tap::start(&engine).await;
    (engine, tap)
}

pub fn topics_of(adds: &[pb::Subscription]) -> Vec<Vec<u8>> {
    let mut t: Vec<Vec<u8>> = adds.iter().map(|s| s.topic.clone()).collect();
    t.sort();
    t
}

pub fn sorted(mut v: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    v.sort();
    v
}
