//! `fanout`: the push delivery engine's binary.

mod auth;
mod cluster;
mod config;
mod expiry;
mod forward;
mod gateway;
mod grpc;
mod history;
mod http;
mod listener;
mod logging;
mod problem;
mod relay_ingress;
mod rest;
mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fanout_engine::domain::SystemClock;
use fanout_engine::store::{RedbStore, ScyllaStore, Store};
use fanout_engine::{Engine, EngineOptions};
use fanout_proto::v1::notification_service_server::NotificationServiceServer;
use fanout_proto::v1::publish_service_server::PublishServiceServer;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;

use crate::auth::Role;

/// jemalloc, not glibc malloc: redb's page cache allocates a page buffer on
/// every miss and frees one on every eviction, and under glibc those holes
/// were split for the engine's small allocations, so the process grew to
/// about twice `store.cache_size_mb` over a long window while its live heap
/// stayed flat (docs/OPERATIONS.md, "Memory"). jemalloc's size
/// classes reuse a freed page buffer for the next one.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use crate::config::{Config, StoreBackend};

#[derive(Parser)]
#[command(
    name = "fanout",
    version,
    about = "Push delivery engine: APNs, FCM, Web Push, signed HTTPS webhooks and the relay webhook; also a relay push server and a blind-wakeup push gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine. With no config file: embedded store in ./fanout-data,
    /// gRPC on 127.0.0.1:50051, HTTP on 127.0.0.1:9090, HTTPS channel only.
    Serve {
        /// TOML configuration file (see fanout.example.toml).
        #[arg(long, env = "FANOUT_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Apply the store's schema (ScyllaDB: the versioned CQL files, keyspace
    /// included; the shard count is recorded too), then exit. The embedded
    /// store is created if missing.
    Migrate {
        #[arg(long, env = "FANOUT_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Load the configuration (file, then FANOUT__ variables) and exit: 0 when
    /// it is valid, 1 with the error naming the key otherwise.
    CheckConfig {
        #[arg(long, env = "FANOUT_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Operators' view of the engine nodes that share the store.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Read a bearer token from standard input and print the line a
    /// `[server.auth] token_files` file holds for it (`sha256:<hex>`): the
    /// token itself is never stored.
    HashToken,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// List the live nodes, which node holds each shard's lease and under
    /// which term, and each shard's lag (boundary minus checkpoint, and the
    /// age of its oldest undelivered envelope), read from the store. On the
    /// embedded store, which one process opens at a time, run it while
    /// `fanout serve` is stopped; it reports one node owning every shard.
    Status {
        #[arg(long, env = "FANOUT_CONFIG")]
        config: Option<PathBuf>,
        /// One JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => match Config::load(config.as_deref()) {
            Ok(_) => {
                println!("configuration is valid");
                Ok(())
            }
            // The error alone, one line naming the key and the rule: CI and
            // the systemd unit show it as it is.
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        },
        Command::HashToken => {
            let mut token = String::new();
            std::io::stdin().read_line(&mut token).context("reading the token from standard input")?;
            let token = token.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(token.len() >= 32, "a token needs at least 32 characters (e.g. openssl rand -hex 32)");
            println!("{}", auth::hash_line(token));
            Ok(())
        }
        Command::Cluster { command: ClusterCommand::Status { config, json } } => {
            let config = Config::load(config.as_deref())?;
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            match runtime.block_on(cluster::status(&config, json)) {
                Ok(status) => {
                    print!("{status}");
                    Ok(())
                }
                // The error and its causes on one line, for people and scripts alike.
                Err(e) => {
                    eprintln!("error: {e:#}");
                    std::process::exit(1);
                }
            }
        }
        Command::Migrate { config } => {
            let config = Config::load(config.as_deref())?;
            logging::init(&config);
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(migrate(config))
        }
        Command::Serve { config } => {
            let config = Config::load(config.as_deref())?;
            logging::init(&config);
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let result = runtime.block_on(serve(config));
            // Do not wait on stray blocking tasks once everything has drained.
            runtime.shutdown_timeout(Duration::from_secs(1));
            result
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Certificates and token files are read before anything
    // listens; a bad file stops the start, naming it.
    let server_tls = config.server.tls.as_ref().map(tls::ServerTls::load).transpose()?;
    let authenticator = config.server.auth.as_ref().map(auth::Authenticator::load).transpose()?;
    let store: Arc<dyn Store> = match config.store.backend {
        StoreBackend::Redb => Arc::new(open_redb(&config)?),
        StoreBackend::Scylla => {
            let s = &config.store.scylla;
            let store = ScyllaStore::connect(s, config.engine.shard_count.get()).await.with_context(|| {
                format!("cannot open the ScyllaDB store (keyspace {} on {:?})", s.keyspace, s.nodes.as_slice())
            })?;
            Arc::new(store)
        }
    };
    let options = EngineOptions {
        dangerous_panic_after_pages: dangerous_count("FANOUT_DANGEROUS_PANIC_AFTER_PAGES"),
        dangerous_panic_attempts: dangerous_count("FANOUT_DANGEROUS_PANIC_ATTEMPTS"),
        advertise_address: config.server.advertise_address(),
    };
    let engine = Engine::start(config.engine.clone(), store.clone(), options, Arc::new(SystemClock)).await?;

    let limits = listener::Limits {
        max_connections: config.server.max_connections_per_listener.get(),
        first_request_timeout: config.server.first_request_timeout,
        tls_handshake_timeout: config.server.tls_handshake_timeout,
        header_read_timeout: config.server.http_header_read_timeout,
        idle_timeout: config.server.idle_timeout,
        http_request_timeout: config.server.http_request_timeout,
    };
    let grpc_listener = listener::bind(config.server.grpc_listen, "server.grpc_listen").await?;
    let http_listener = listener::bind(config.server.http_listen, "server.http_listen").await?;
    let api_listener = listener::bind(config.server.api_listen, "server.api_listen").await?;
    let [grpc_closes, http_closes, api_closes] =
        listener::Closes::register(&engine.metrics().registry, ["grpc", "http", "api"]);
    // The time left on every certificate the process holds, from start.
    expiry::CertificateExpiry::register(&config, &engine.metrics().registry)?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let tls_for = |pick: fn(&tls::ServerTls) -> Arc<rustls::ServerConfig>| {
        server_tls.clone().map(|t| Arc::new(move || pick(&t)) as listener::TlsSource)
    };
    // Forwards to other nodes carry the TLS and token files of
    // [server.forwarding], read here once (an unreadable one stops the start).
    let forwarder = config
        .server
        .forwarding
        .enabled
        .then(|| {
            forward::Forwarder::new(&config.server.forwarding, config.server.tls.as_ref(), &engine.metrics().registry)
        })
        .transpose()?
        .map(Arc::new);
    let mut reloadable: Vec<Arc<dyn tls::Reloadable>> = Vec::new();
    reloadable.extend(server_tls.clone().map(|t| t as _));
    reloadable.extend(authenticator.clone().map(|a| a as _));
    reloadable.extend(forwarder.as_ref().map(|f| f.reloadable()));
    let reload_interval = server_tls.as_ref().map_or(Duration::from_secs(60), |t| t.reload_interval());
    tokio::spawn(tls::watch_files(reloadable, reload_interval, shutdown_rx.clone()));

    let health_reporter = tonic_health::server::HealthReporter::new();
    health_reporter.set_serving::<NotificationServiceServer<grpc::NotificationApi>>().await;
    health_reporter.set_serving::<PublishServiceServer<grpc::PublishApi>>().await;
    let health_service = tonic_health::pb::health_server::HealthServer::new(grpc::StoppingHealth::new(
        tonic_health::server::HealthService::from_health_reporter(health_reporter),
        shutdown_rx.clone(),
    ));
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(fanout_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    grpc::initialise_metrics(&engine.metrics());
    let notification = grpc::NotificationApi { registry: engine.registry(), metrics: engine.metrics() };
    let publish = grpc::PublishApi { ingest: engine.ingest(), shutdown: shutdown_rx.clone(), forwarder };
    // Every service decodes at most this much per message.
    let max_message = config.server.grpc_max_message_bytes.get();
    let routes = tonic::service::Routes::new(health_service)
        .add_service(InterceptedService::new(reflection, grpc::Guard::new(authenticator.clone(), Role::Operator)))
        .add_service(InterceptedService::new(
            NotificationServiceServer::new(notification).max_decoding_message_size(max_message),
            grpc::Guard::new(authenticator.clone(), Role::Recipient),
        ))
        .add_service(InterceptedService::new(
            PublishServiceServer::new(publish).max_decoding_message_size(max_message),
            grpc::Guard::new(authenticator.clone(), Role::Publisher),
        ));
    let serve = |tcp, tls, router, protocol, closes| {
        listener::serve(listener::Listener { tcp, tls, router, protocol, closes }, limits, shutdown_rx.clone())
    };
    let grpc_server = serve(
        grpc_listener,
        tls_for(tls::ServerTls::grpc),
        grpc::router(routes, config.server.grpc_request_timeout),
        listener::Protocol::Grpc {
            max_concurrent_streams: config.server.grpc_max_concurrent_streams.get(),
            keepalive_interval: config.server.grpc_keepalive_interval,
        },
        grpc_closes,
    );
    let gateway = gateway_state(&config, &engine)?;
    let api_router = rest::router(
        rest::ApiState {
            push_log: engine.push_log(),
            registry: engine.registry(),
            metrics: engine.metrics(),
            relay_ingress: engine.relay_ingress(),
            gateway,
        },
        config.server.api_max_body_bytes.get(),
    );
    let api_server =
        serve(api_listener, tls_for(tls::ServerTls::http), api_router, listener::Protocol::Http, api_closes);
    let http_router = http::router(http::HttpState::new(
        engine.metrics(),
        engine.readiness(),
        authenticator.clone(),
        engine.history(),
        config.server.advertise_address(),
    ));
    let http_server =
        serve(http_listener, tls_for(tls::ServerTls::http), http_router, listener::Protocol::Http, http_closes);
    tracing::info!(
        grpc = %config.server.grpc_listen,
        http = %config.server.http_listen,
        api = %config.server.api_listen,
        tls = server_tls.is_some(),
        auth = authenticator.is_some(),
        store = store.backend_name(),
        "fanout is serving"
    );
    let grpc_task = tokio::spawn(grpc_server);
    let http_task = tokio::spawn(http_server);
    let api_task = tokio::spawn(api_server);

    shutdown_signal().await;
    let drain = config.server.drain_timeout;
    // First no new work: every listener closes its port, then says GOAWAY
    // on each connection (later streams are refused, never processed: safe
    // to send to another node), and open publish streams end after their
    // batch in progress. Every call already taken is answered, its
    // envelopes stored or forwarded, while this node still holds its
    // shards: none is cut, nor answered "outcome unknown" by a lease given
    // up under it. The other nodes' forwards here are refused meanwhile and
    // routed again.
    tracing::info!("shutting down: no new calls; answering the calls in progress");
    let _ = shutdown_tx.send(true);
    let listeners = async {
        let _ = tokio::join!(grpc_task, http_task, api_task);
    };
    if tokio::time::timeout(drain, listeners).await.is_err() {
        tracing::warn!("calls were still in progress at the drain timeout; they end with the process");
    }
    // Then, with several nodes, hand the shards over: the others take them
    // at their next lease round (not after the TTL).
    tracing::info!("shutting down: handing the shards over");
    engine.leave(drain).await;
    tracing::info!("shutting down: draining attempts in flight");
    engine.shutdown(drain).await;
    tracing::info!("stopped");
    Ok(())
}

/// Spec 002's routes on the engine's gateway service, with `[station]`
/// when it is set.
fn gateway_state(config: &Config, engine: &Engine) -> anyhow::Result<Option<gateway::GatewayState>> {
    let Some(service) = engine.gateway() else {
        anyhow::ensure!(config.station.is_none(), "[station] needs [engine.gateway]");
        return Ok(None);
    };
    let station = match &config.station {
        Some(s) => Some(Arc::new((s.clone(), gateway::Session::load(s).context("station.session_tokens_file")?))),
        None => None,
    };
    let scheme = if config.server.tls.is_some() { "https" } else { "http" };
    Ok(Some(gateway::GatewayState { service, station, metrics: engine.metrics(), scheme }))
}

/// A test hook's count from the environment; unset or not a number is 0 (off).
fn dangerous_count(var: &str) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The embedded store in `store.path`, created if missing.
fn open_redb(config: &Config) -> anyhow::Result<RedbStore> {
    let cache_bytes = config.store.redb_cache_bytes();
    RedbStore::open_with_cache(&config.store.path, config.engine.shard_count.get(), cache_bytes)
        .with_context(|| format!("cannot open the embedded store in {}", config.store.path.display()))
}

/// `fanout migrate`: applies the schema and records the shard count.
async fn migrate(config: Config) -> anyhow::Result<()> {
    match config.store.backend {
        StoreBackend::Redb => {
            open_redb(&config)?;
            println!("embedded store ready in {}", config.store.path.display());
        }
        StoreBackend::Scylla => {
            let settings = fanout_engine::store::ScyllaSettings { migrate: true, ..config.store.scylla.clone() };
            let store = ScyllaStore::connect(&settings, config.engine.shard_count.get()).await.with_context(|| {
                let (keyspace, nodes) = (&settings.keyspace, settings.nodes.as_slice());
                format!("cannot migrate the ScyllaDB store (keyspace {keyspace} on {nodes:?})")
            })?;
            println!(
                "keyspace {} is at schema version {} with {} shards",
                store.keyspace(),
                ScyllaStore::schema_version(),
                store.shard_count()
            );
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
