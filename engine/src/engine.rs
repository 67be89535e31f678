//! Wiring: builds the channels, the delivery workers and the dispatch tree
//! from settings and a store, and shuts them down in order.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::channel::push_log::PushLog;
use crate::channel::{ChannelContext, Channels};
use crate::delivery::{DeliveryWorkers, History, Parking, WorkerContext};
use crate::dispatch::{DispatchContext, PanicHook, Routes};
use crate::domain::{Clock, ShardId};
use crate::gateway::delivery::Delivery;
use crate::gateway::egress::CollapseKeys;
use crate::gateway::service::{DEFAULT_MAX_IN_FLIGHT, GatewayService};
use crate::gateway::{GatewaySettings, SaltSecrets};
use crate::ingest::Ingest;
use crate::metrics::Metrics;
use crate::ownership::{Fence, LeaseConfig, OwnedShards, ShardOwnership};
use crate::registry::Registry;
use crate::relay_ingress::RelayIngress;
use crate::retention::RetentionArgs;
use crate::settings::EngineSettings;
use crate::shard_owners::ShardOwners;
use crate::store::{Instrumented, NodeId, Store};
use crate::supervision::SupervisorMsg;
use crate::supervisor::{Supervisor, SupervisorArgs};
use crate::transport::proxy::OutboundProxy;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A channel could not be built from its (valid) settings: an unreadable
    /// key file, a bad CA file.
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot start the dispatch actors: {0}")]
    Actors(String),
}

/// Extra knobs that only tests and the load harness set.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    pub dangerous_panic_after_pages: u64,
    /// This many delivery attempts panic (`FANOUT_DANGEROUS_PANIC_ATTEMPTS`).
    pub dangerous_panic_attempts: u64,
    /// The gRPC address other nodes name in their publish redirects
    /// (`server.advertise_address`); used only when the store coordinates.
    pub advertise_address: String,
}

/// Why the engine is not ready to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("store unreachable")]
    StoreUnreachable,
    #[error("shard leases not settled yet")]
    LeasesNotSettled,
    #[error("leaving: handing its shards over before it stops")]
    Leaving,
}

/// A readiness probe must answer quickly even when the store hangs.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers whether the engine is ready: the store answers and, with several
/// nodes (shard leases), this node owns a shard or has finished a lease round.
#[derive(Clone)]
pub struct Readiness {
    store: Arc<dyn Store>,
    ownership: Option<watch::Receiver<OwnedShards>>,
}

impl Readiness {
    pub async fn check(&self) -> Result<(), NotReady> {
        let store = tokio::time::timeout(READY_TIMEOUT, self.store.shard_position(ShardId::FIRST)).await;
        if !matches!(store, Ok(Ok(_))) {
            return Err(NotReady::StoreUnreachable);
        }
        let Some(ownership) = &self.ownership else { return Ok(()) };
        let o = ownership.borrow();
        // A leaving node still answers, but a load balancer should send elsewhere.
        if o.leaving {
            Err(NotReady::Leaving)
        } else if o.settled || !o.shards.is_empty() {
            Ok(())
        } else {
            Err(NotReady::LeasesNotSettled)
        }
    }
}

/// Spec 002's service and its wakeup worker, with `[engine.gateway]`.
struct Gateway {
    service: Arc<GatewayService>,
    worker: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl Gateway {
    /// The service on the engine's store and channels, and its worker.
    fn start(
        settings: &GatewaySettings,
        store: Arc<dyn Store>,
        channels: Channels,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, EngineError> {
        let secrets = SaltSecrets::load(&settings.salt_epoch, settings.salt_secret_files())
            .map_err(|e| EngineError::Config(format!("engine.gateway.salt_secrets: {e}")))?;
        let secrets = Arc::new(secrets);
        let keys = CollapseKeys::new(secrets.clone(), settings.window);
        let delivery = Delivery::new(store.clone(), channels.clone(), settings.delivery, keys, metrics.clone(), clock);
        let (stop, stopped) = watch::channel(false);
        let worker = tokio::spawn(delivery.clone().run(stopped));
        let service =
            GatewayService::new(settings.clone(), secrets, store, channels, delivery, DEFAULT_MAX_IN_FLIGHT, metrics);
        Ok(Self { service: Arc::new(service), worker, stop })
    }
}

pub struct Engine {
    registry: Arc<Registry>,
    relay_ingress: Option<Arc<RelayIngress>>,
    gateway: Option<Gateway>,
    push_log: Option<Arc<PushLog>>,
    history: Option<History>,
    ingest: Arc<Ingest>,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_handle: JoinHandle<()>,
    worker_handles: Vec<JoinHandle<()>>,
}

impl Engine {
    /// `settings` are valid by construction (their types carry the rules);
    /// what can still fail is building the channels and spawning the actors.
    /// `clock` is the time every role's rules run on (renewal, server
    /// timestamps, retention, the gateway's windows and leases, the relay
    /// ingress's signature freshness and dedup): the system's in production.
    pub async fn start(
        settings: EngineSettings,
        store: Arc<dyn Store>,
        options: EngineOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, EngineError> {
        let shard_count = settings.shard_count.get();
        let metrics = Arc::new(Metrics::new());
        let store: Arc<dyn Store> = Arc::new(Instrumented::new(store, metrics.clone()));
        let proxy = settings.outbound_proxy.as_ref().map(OutboundProxy::new).transpose();
        let proxy = proxy.map_err(|e| EngineError::Config(e.to_string()))?.map(Arc::new);
        let ctx = ChannelContext { store: Some(store.clone()), proxy, ..ChannelContext::new(metrics.clone()) };
        // 003 §5: the relay's debug ring, served only when its endpoint is on.
        let push_log = settings.channels.relay.as_ref().filter(|r| r.dangerous_push_log_endpoint);
        let push_log = push_log.map(|_| ctx.push_log.clone());
        let channels = Channels::build(&settings.channels, &ctx).map_err(|e| EngineError::Config(e.to_string()))?;
        let relay_ingress = match &settings.relay_ingress {
            Some(s) => Some(Arc::new(
                RelayIngress::new(s, channels.clone(), store.clone(), metrics.clone(), clock.clone())
                    .map_err(|e| EngineError::Config(e.to_string()))?,
            )),
            None => None,
        };
        let gateway = settings
            .gateway
            .as_ref()
            .map(|s| Gateway::start(s, store.clone(), channels.clone(), metrics.clone(), clock.clone()))
            .transpose()?;
        // On a coordinating store, shards are leased, not all owned.
        let (lease, ownership) = match store.clone().leases() {
            Some(leases) => {
                let (tx, rx) = watch::channel(OwnedShards::default());
                let node = NodeId::random();
                tracing::info!(%node, address = %options.advertise_address, "leasing shards with other nodes");
                let config = LeaseConfig {
                    leases: leases.clone(),
                    node,
                    address: options.advertise_address.clone(),
                    ttl: settings.lease.ttl,
                    shard_count,
                    owned: Arc::new(tx),
                    metrics: metrics.clone(),
                };
                // Another node's address is read again after a lease round.
                let owners = ShardOwners::new(leases, options.advertise_address.clone(), settings.lease.ttl / 3);
                (Some(config), Some(ShardOwnership { owned: rx, owners: Arc::new(owners) }))
            }
            None => (None, None),
        };
        let fence = ownership.as_ref().map(|o| Fence::leased(o.owned.clone())).unwrap_or_default();
        let parking = Parking::new(
            settings.delivery.breaker(),
            &settings.channels.in_flight_by_channel(),
            shard_count,
            metrics.clone(),
        );
        let history = History::start(&settings.history);
        let (workers, worker_handles) = DeliveryWorkers::start(Arc::new(WorkerContext {
            max_in_flight: settings.delivery.in_flight_per_worker(settings.channels.max_in_flight()),
            parking: Arc::new(parking),
            settings: settings.delivery.clone(),
            max_attempts: settings.max_attempts.get(),
            channels: channels.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            fence: fence.clone(),
            history: history.clone(),
            dangerous_panic_attempts: options.dangerous_panic_attempts.into(),
        }));
        let ctx = Arc::new(DispatchContext {
            store: store.clone(),
            routes: Routes::new(Arc::new(workers.clone()), &channels),
            workers,
            channels: channels.clone(),
            settings: settings.dispatch.clone(),
            pages_ahead: settings.dispatch.pages_ahead(lease.is_some()),
            progress_interval: settings.dispatch.progress_interval(lease.is_some()),
            metrics: metrics.clone(),
            fence,
            panic_hook: PanicHook::new(options.dangerous_panic_after_pages),
        });
        let args = SupervisorArgs {
            ctx,
            shards: if lease.is_some() { Vec::new() } else { ShardId::all(shard_count).collect() },
            lease,
            retention: RetentionArgs {
                store: store.clone(),
                metrics: metrics.clone(),
                ttl: settings.recipient_ttl,
                interval: settings.retention.interval,
                ownership: ownership.as_ref().map(|o| o.owned.clone()),
                clock: clock.clone(),
            },
        };
        let (supervisor, supervisor_handle) =
            Actor::spawn(None, Supervisor, args).await.map_err(|e| EngineError::Actors(e.to_string()))?;
        let registry = Arc::new(Registry::new(
            store.clone(),
            channels,
            settings.max_push_topics,
            settings.max_subscription_changes,
            settings.recipient_ttl,
            metrics.clone(),
            clock.clone(),
        ));
        let ingest = Arc::new(Ingest {
            store: store.clone(),
            shard_count,
            dispatch: supervisor.clone(),
            metrics: metrics.clone(),
            settings: settings.ingest.clone(),
            ownership: ownership.clone(),
            advertise_address: options.advertise_address.clone(),
            clock,
        });
        let readiness = Readiness { store, ownership: ownership.map(|o| o.owned) };
        Ok(Self {
            registry,
            relay_ingress,
            gateway,
            push_log,
            history,
            ingest,
            metrics,
            readiness,
            supervisor,
            supervisor_handle,
            worker_handles,
        })
    }

    /// Registration, unregistration and subscriptions (spec 000 sections 1–3).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The spec 003 push-server endpoint, when `[engine.relay_ingress]` is set.
    pub fn relay_ingress(&self) -> Option<Arc<RelayIngress>> {
        self.relay_ingress.clone()
    }

    /// Spec 002's Station and Gateway roles, when `[engine.gateway]` is set.
    pub fn gateway(&self) -> Option<Arc<GatewayService>> {
        self.gateway.as_ref().map(|g| g.service.clone())
    }

    /// The relay's debug ring, only when `dangerous_push_log_endpoint` is on.
    pub fn push_log(&self) -> Option<Arc<PushLog>> {
        self.push_log.clone()
    }

    /// Publishing envelopes.
    pub fn ingest(&self) -> Arc<Ingest> {
        self.ingest.clone()
    }

    /// The engine's metric registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The readiness probe of `/readyz`.
    /// The delivery history of this node; `None` when it is off
    /// (`engine.history.max_records = 0`).
    pub fn history(&self) -> Option<History> {
        self.history.clone()
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// A graceful stop's step once the node takes no more calls and has
    /// answered those it had (`fanout serve` does both first, so no append
    /// in progress loses its lease): with shard leases, hand every shard
    /// over to the other nodes (each drained as a release above the fair
    /// share is, its lease released, none taken again), so they take them
    /// at their next lease round rather than after the TTL. Publishes of
    /// those shards meanwhile go to their next owner. Bounded by `bound`;
    /// at once with one node.
    pub async fn leave(&self, bound: Duration) {
        match self.supervisor.call(SupervisorMsg::Leave, Some(bound)).await {
            Ok(ractor::rpc::CallResult::Success(())) => {}
            _ => tracing::warn!("the shards were not all handed over in time; their leases run out after the TTL"),
        }
    }

    /// Graceful stop within `drain`: every shard finishes its current window
    /// (first attempts answered, checkpoint stored) and stops; then the workers
    /// finish what is in flight. Whatever does not finish in time stays above
    /// the checkpoint and is replayed at the next start. The gateway's
    /// wakeup worker stops leasing and finishes its attempts in flight
    /// meanwhile (their leases cover those that do not).
    pub async fn shutdown(self, drain: Duration) {
        let deadline = tokio::time::Instant::now() + drain;
        if let Some(g) = &self.gateway {
            let _ = g.stop.send(true);
        }
        let _ = self.supervisor.cast(SupervisorMsg::Drain);
        let mut supervisor = self.supervisor_handle;
        if tokio::time::timeout_at(deadline, &mut supervisor).await.is_err() {
            tracing::warn!("drain timeout reached with windows open; they will be replayed at next start");
            let _ = self.supervisor.cast(SupervisorMsg::Shutdown);
            let _ = tokio::time::timeout(Duration::from_secs(1), supervisor).await;
        }
        // The workers end once every queue sender (held by the stopped shard
        // actors) is gone and their attempts have answered.
        drop(self.ingest);
        let workers = futures::future::join_all(self.worker_handles);
        if tokio::time::timeout_at(deadline, workers).await.is_err() {
            tracing::warn!("drain timeout reached; unfinished deliveries will be replayed at next start");
        }
        if let Some(g) = self.gateway {
            let _ = tokio::time::timeout_at(deadline, g.worker).await;
        }
    }
}
