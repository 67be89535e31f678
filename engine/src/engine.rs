//! Wiring: builds the channels, the delivery workers and the dispatch tree
//! from settings and a store, and shuts them down in order.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::channel::{ApnsProvider, Channels, FcmProvider, WebhookProvider, client_tls_config};
use crate::delivery::{DeliveryWorkers, WorkerContext};
use crate::dispatch::{DispatchContext, DispatchSupervisor, LeaseConfig, OwnedShards, SupervisorArgs, SupervisorMsg};
use crate::domain::ShardId;
use crate::ingest::Ingest;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::retention::RetentionArgs;
use crate::settings::EngineSettings;
use crate::store::{Instrumented, NodeId, Store};
use crate::webhook::{DomainPattern, HickoryResolver, HostResolver, WebhookPolicy};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot start the dispatch actors: {0}")]
    Actors(String),
}

/// Extra knobs that only tests and the load harness set.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    pub dangerous_panic_after_pages: u64,
    /// The gRPC address other nodes name in their publish redirects
    /// (`server.advertise_address`); used only when the store coordinates.
    pub advertise_address: String,
}

pub struct Engine {
    pub registry: Arc<Registry>,
    pub ingest: Arc<Ingest>,
    pub metrics: Arc<Metrics>,
    pub store: Arc<dyn Store>,
    /// This node's shards; `None` on a single node, which owns them all.
    pub ownership: Option<watch::Receiver<OwnedShards>>,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_handle: JoinHandle<()>,
    worker_handles: Vec<JoinHandle<()>>,
}

impl Engine {
    pub async fn start(settings: EngineSettings, store: Arc<dyn Store>, options: EngineOptions) -> Result<Self, EngineError> {
        settings.validate().map_err(EngineError::Config)?;
        let metrics = Arc::new(Metrics::new());
        let store: Arc<dyn Store> = Arc::new(Instrumented::new(store, metrics.clone()));
        let http = settings.channels.http.clone().unwrap_or_default();
        let resolver: Arc<dyn HostResolver> =
            Arc::new(HickoryResolver::new(&http.dns_servers).map_err(|e| EngineError::Config(e.to_string()))?);
        let policy = Arc::new(WebhookPolicy {
            allowed_domains: http
                .allowed_domains
                .iter()
                .map(|d| DomainPattern::parse(d))
                .collect::<Result<_, _>>()
                .map_err(EngineError::Config)?,
            allow_private_addresses: http.allow_private_addresses,
        });
        let mut channels = Channels::default();
        if settings.channels.http.is_some() {
            let tls = client_tls_config(&http.extra_ca_files).map_err(EngineError::Config)?;
            channels.http = Some(Arc::new(WebhookProvider::new(policy.clone(), resolver.clone(), tls, metrics.clone())));
        }
        if let Some(apns) = &settings.channels.apns {
            channels.apns = Some(Arc::new(ApnsProvider::from_settings(apns, metrics.clone()).map_err(EngineError::Config)?));
        }
        if let Some(fcm) = &settings.channels.fcm {
            channels.fcm = Some(Arc::new(FcmProvider::from_settings(fcm, metrics.clone()).map_err(EngineError::Config)?));
        }
        let (workers, worker_handles) = DeliveryWorkers::start(Arc::new(WorkerContext {
            settings: settings.delivery.clone(),
            max_attempts: settings.max_attempts,
            channels: channels.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
        }));
        let ctx = Arc::new(DispatchContext {
            store: store.clone(),
            workers,
            channels: channels.clone(),
            settings: settings.dispatch.clone(),
            metrics: metrics.clone(),
            dangerous_panic_after_pages: options.dangerous_panic_after_pages,
        });
        // Issue 7: on a coordinating store, shards are leased, not all owned.
        let (lease, ownership) = if store.coordinates() {
            let (tx, rx) = watch::channel(OwnedShards::default());
            let node = NodeId::random();
            tracing::info!(%node, address = %options.advertise_address, "leasing shards with other nodes");
            let config = LeaseConfig {
                store: store.clone(),
                node,
                address: options.advertise_address.clone(),
                ttl: Duration::from_secs(settings.lease.ttl_seconds),
                shard_count: settings.shard_count,
                owned: Arc::new(tx),
            };
            (Some(config), Some(rx))
        } else {
            (None, None)
        };
        let args = SupervisorArgs {
            ctx,
            shards: if lease.is_some() { Vec::new() } else { (0..settings.shard_count).map(ShardId).collect() },
            lease,
            retention: RetentionArgs {
                store: store.clone(),
                metrics: metrics.clone(),
                ttl_seconds: settings.recipient_ttl_seconds,
                interval_seconds: settings.retention.interval_seconds,
            },
        };
        let (supervisor, supervisor_handle) = Actor::spawn(None, DispatchSupervisor, args)
            .await
            .map_err(|e| EngineError::Actors(e.to_string()))?;
        let registry = Arc::new(Registry {
            store: store.clone(),
            channels,
            webhook_policy: policy,
            resolver,
            max_push_topics: settings.max_push_topics,
            recipient_ttl_seconds: settings.recipient_ttl_seconds,
            metrics: metrics.clone(),
        });
        let ingest = Arc::new(Ingest {
            store: store.clone(),
            shard_count: settings.shard_count,
            dispatch: supervisor.clone(),
            metrics: metrics.clone(),
            ownership: ownership.clone(),
            advertise_address: options.advertise_address.clone(),
        });
        Ok(Self { registry, ingest, metrics, store, ownership, supervisor, supervisor_handle, worker_handles })
    }

    /// Graceful stop within `drain`: every shard finishes its current window
    /// (first attempts answered, checkpoint stored) and stops; then the workers
    /// finish what is in flight. Whatever does not finish in time stays above
    /// the checkpoint and is replayed at the next start.
    pub async fn shutdown(self, drain: Duration) {
        let deadline = tokio::time::Instant::now() + drain;
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
    }
}
