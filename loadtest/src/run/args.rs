//! The command lines of `fanout-loadtest run` and `ceiling`.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{db_fault, driver, nodes};

/// `fanout-loadtest run`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RunArgs {
    /// Scenario file, e.g. loadtest/scenarios/smoke.toml.
    #[arg(long)]
    pub scenario: PathBuf,
    /// The `fanout` binary to start (default: $CARGO_TARGET_DIR/release/fanout,
    /// then debug/fanout, else it is built).
    #[arg(long, conflicts_with = "engine_grpc")]
    pub engine_bin: Option<PathBuf>,
    /// Use an engine that is already running at this gRPC address instead of
    /// starting one. It must allow private addresses and trust the mock CA:
    /// give --pki-dir and start the engine with `<pki-dir>/ca.pem` in
    /// `engine.channels.http.extra_ca_files`.
    #[arg(long, requires = "pki_dir")]
    pub engine_grpc: Option<SocketAddr>,
    /// Keep the mocks' CA and server certificate in this directory and reuse
    /// them on later runs (default: a fresh PKI per run).
    #[arg(long)]
    pub pki_dir: Option<PathBuf>,
    /// With --engine-grpc: its HTTP address, to read /metrics at the end.
    #[arg(long, requires = "engine_grpc")]
    pub engine_http: Option<SocketAddr>,
    /// With --engine-grpc: its process id, to sample memory and CPU.
    #[arg(long, requires = "engine_grpc")]
    pub engine_pid: Option<u32>,
    /// Where to write the mock receivers' CA certificate (default: a temporary file).
    #[arg(long)]
    pub ca_out: Option<PathBuf>,
    /// Directory for the started engine's store (default: a temporary directory).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Also measure the ceiling (before the engine starts) and report the ratio.
    #[arg(long)]
    pub with_ceiling: bool,
    /// Also measure the independent ceiling with nghttp2's h2load (Debian
    /// package nghttp2-client) and report the ratio against it.
    #[arg(long)]
    pub with_h2load: bool,
    /// With --with-h2load: HTTP/2 connections per receiver (the engine opens
    /// one per receiver host); the scenario's ceiling concurrency is split
    /// over them as streams.
    #[arg(long, default_value_t = 1)]
    pub h2load_connections: usize,
    /// Write the JSON report here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Write the SVG report here.
    #[arg(long)]
    pub svg_out: Option<PathBuf>,
    /// Steady scenarios: override rate_per_second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Steady scenarios: override duration_seconds.
    #[arg(long)]
    pub duration_seconds: Option<f64>,
    /// Override setup.concurrency: recipients registered at once (e.g.
    /// registration at 16 and 64 clients from one scenario).
    #[arg(long)]
    pub setup_concurrency: Option<usize>,
    /// Override envelopes.batch_size: envelopes per Publish RPC (e.g.
    /// ingest in batches of 1 and of 100 from one scenario).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Start the engine on the ScyllaDB/Cassandra backend at these contact
    /// points (host:port, comma-separated) instead of the embedded store, in
    /// a keyspace made for the run (fanout_loadtest_<random>), dropped once
    /// the engines stopped.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["engine_grpc", "data_dir"])]
    pub scylla_nodes: Vec<String>,
    /// Sample the engine with `perf` from the first publish to the end of
    /// the drain: PATH.perf.data, the flat profile (self time by binary and
    /// symbol) in PATH.txt, its top lines in the report. Needs an engine the
    /// harness starts.
    #[arg(long, value_name = "PATH", conflicts_with = "engine_grpc")]
    pub profile: Option<PathBuf>,
    /// Fail the run when the engine's peak RSS (VmHWM) exceeds this many
    /// MiB; overrides the scenario's `max_peak_rss_mib`. Needs an engine the
    /// harness starts (its /proc is read).
    #[arg(long, conflicts_with = "engine_grpc")]
    pub max_rss_mib: Option<f64>,
    /// With --scylla-nodes: leave the run's keyspace behind, to look into
    /// (drop it with `DROP KEYSPACE`). Kept keyspaces slow the server's later
    /// runs: its join reads ran at half the rate with 65 of them.
    #[arg(long, requires = "scylla_nodes")]
    pub keep_keyspace: bool,
    /// With --scylla-nodes: before the engine starts, measure what the CQL
    /// server does for a plain client (the engine's statement shapes sent by
    /// the same Rust driver: plain and conditional inserts, batches of 100
    /// log rows, pages of 100 subscribers, joins of 50 recipient partitions)
    /// and report the engine's registration, publish and delivery rates
    /// against it.
    #[arg(long, requires = "scylla_nodes")]
    pub with_cql_ceiling: bool,
    /// With --scylla-nodes: start this many engine processes on the run's
    /// keyspace. They split the shards by lease before setup starts;
    /// registration goes to node r mod N, publish batches are spread over
    /// the nodes and an envelope another node owns is resent there. The
    /// report gives each node's rates, CPU and shard ownership changes,
    /// and the total.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub engine_nodes: u16,
    /// With --engine-nodes 2 or more: once --fault-after of the expected
    /// deliveries arrived, `kill` sends the last node SIGKILL; `pause`
    /// freezes it (SIGSTOP) for twice the lease TTL, past its leases, then
    /// resumes it (SIGCONT). The run fails on any missing delivery; the
    /// duplicates, the shard handoffs and the duplicates per handoff are
    /// reported. Publishes whose outcome the fault left unknown are resent
    /// to another node, and deliveries of such a copy are counted apart.
    /// `roll` restarts every node in turn: SIGTERM, wait for its exit,
    /// start it again on the same ports, wait until the nodes have split
    /// the shards again, then the next; an RPC that cannot connect goes to
    /// the next node, and the run also fails above 1 % duplicates or on any
    /// envelope answered with an error (give a --duration-seconds long
    /// enough for every node's restart).
    #[arg(long, value_enum)]
    pub node_fault: Option<nodes::NodeFault>,
    /// With --engine-nodes: how Publish RPCs choose their node.
    /// `round-robin`: as a load balancer would, every RPC (resends
    /// included) to the next node, with no routing knowledge; each node
    /// forwards the envelopes of shards another owns. `owner`: as a
    /// publisher that routes by itself, each batch split by the shard map
    /// (GetShardMap) and each part sent to its owner.
    #[arg(long, value_enum, default_value_t = driver::PublishVia::RoundRobin)]
    pub publish_via: driver::PublishVia,
    /// With --node-fault or --db-fault: the fraction of the expected
    /// deliveries that must have arrived before the fault.
    #[arg(long, default_value_t = 0.3)]
    pub fault_after: f64,
    /// With --scylla-nodes: the replication factor of the run's keyspace
    /// (SimpleStrategy; default 1). 3 on the cluster of
    /// scripts/cassandra-cluster.sh, so that one node down leaves a quorum.
    #[arg(long, requires = "scylla_nodes", value_parser = clap::value_parser!(u8).range(1..=9))]
    pub scylla_replication_factor: Option<u8>,
    /// With --scylla-nodes on the cluster of scripts/cassandra-cluster.sh:
    /// once --fault-after of the expected deliveries arrived, `kill` sends
    /// database node --db-fault-node SIGKILL and starts it again
    /// --db-fault-seconds later; `pause` freezes it (SIGSTOP) that long,
    /// then resumes it (SIGCONT). Registration goes on meanwhile (the
    /// recipients registered and resubscribed again, delivering nothing
    /// new). The run fails on a missing delivery, on any error answered to
    /// a publisher or a registrant, and above 1 % duplicates; it reports
    /// the fault's times and how long the delivery rate took to recover.
    #[arg(long, value_enum, requires = "scylla_nodes")]
    pub db_fault: Option<db_fault::DbFault>,
    /// With --db-fault: the database node (1-3; default 1, the seed, which
    /// the engines' driver also keeps its control connection to).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub db_fault_node: Option<u8>,
    /// With --db-fault: how long the node stays down or frozen (default
    /// 15 s: past the driver's 10 s request timeout and 4 s keepalive).
    #[arg(long)]
    pub db_fault_seconds: Option<u64>,
    /// apns scenarios: the APNs peer. `rust` is the harness's own mock;
    /// `pushy` is Pushy's validating MockApnsServer (Java, built from
    /// loadtest/pushy with Maven when needed), used by every phase of the
    /// run, and Pushy's own APNs client is measured into a fresh one of them
    /// before the engine starts (see docs/BENCHMARKS.md).
    #[arg(long, value_enum, default_value_t = ApnsServer::Rust)]
    pub apns_server: ApnsServer,
    /// With --apns-server pushy: skip Pushy's client (only the engine into Pushy's server).
    #[arg(long)]
    pub no_pushy_client: bool,
    /// With --apns-server rust: measure Pushy's client too (Java + Maven),
    /// into a fresh instance of the harness's mock APNs, before the engine
    /// starts: the same comparison into a native peer that needs no JIT
    /// warm-up of its own (see docs/BENCHMARKS.md).
    #[arg(long)]
    pub with_pushy_client: bool,
    /// With --apns-server pushy or --with-pushy-client: the connection
    /// counts Pushy's client is run with, one measurement each; the report
    /// compares against the best.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub pushy_connections: Vec<usize>,
    /// With --apns-server pushy or --with-pushy-client: pushes Pushy's
    /// client keeps in flight (a semaphore; default the engine's
    /// `max_in_flight` default).
    #[arg(long, default_value_t = DEFAULT_PUSHY_IN_FLIGHT)]
    pub pushy_in_flight: usize,
    /// With --apns-server pushy or --with-pushy-client: pushes Pushy's
    /// client sends before the measured ones (JIT warm-up), going round
    /// them again when there are more; into Pushy's server, as many again
    /// from h2 (the engine's encoding). Default 300,000, or 20,000 into
    /// the validating server (docs/BENCHMARKS.md says why).
    #[arg(long)]
    pub pushy_warmup: Option<u64>,
    /// With --apns-server pushy: the server's Netty event-loop threads, in
    /// every phase.
    #[arg(long, default_value_t = DEFAULT_PUSHY_SERVER_THREADS)]
    pub pushy_server_threads: usize,
    /// With --apns-server pushy: Pushy's accept-all handler instead of its
    /// validating one, in every phase. The validating server spends about
    /// a millisecond of CPU per push verifying the provider token's ES256
    /// signature, which caps every client at the same rate; accept-all
    /// measures the clients (validation is shown by the default mode).
    #[arg(long)]
    pub pushy_accept_all: bool,
    /// Scenarios with an [outage] table: the mock APNs's outage, in place
    /// of the scenario's: `hang` (requests never answered), `refuse`
    /// (connections refused), `tls-stall` (the TLS handshake never
    /// completes), `slow` (answers after the scenario's slow_ms),
    /// `slow=<ms>`, `503` (every request answered 503).
    #[arg(long)]
    pub outage: Option<String>,
    /// Scenarios with an [outage] table: seconds after the first publish
    /// at which the outage starts (0: before publishing).
    #[arg(long)]
    pub outage_start_seconds: Option<f64>,
    /// Scenarios with an [outage] table: how long the outage lasts, seconds.
    #[arg(long)]
    pub outage_seconds: Option<f64>,
}

/// The APNs peer of an apns scenario (`--apns-server`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApnsServer {
    /// The harness's mock APNs (fanout-testkit, Rust).
    #[default]
    Rust,
    /// Pushy's MockApnsServer (Java): validating, or accept-all with --pushy-accept-all.
    Pushy,
}

/// The engine's default `max_in_flight` for APNs.
pub(super) const DEFAULT_PUSHY_IN_FLIGHT: usize = 1000;
/// Pushy's client was still compiling after 10,000 and 100,000 pushes
/// (20–27k pushes/s, against 47–54k/s after 300,000 and 600,000).
const DEFAULT_PUSHY_WARMUP: u64 = 300_000;
/// The validating server verifies every push's ES256 signature, which caps
/// every client at 1–2k pushes/s, far below where the JIT matters; 300,000
/// pushes would take it minutes per server.
const DEFAULT_PUSHY_WARMUP_VALIDATING: u64 = 20_000;

impl RunArgs {
    pub(super) fn pushy_warmup(&self) -> u64 {
        let validating = matches!(self.apns_server, ApnsServer::Pushy) && !self.pushy_accept_all;
        self.pushy_warmup.unwrap_or(if validating { DEFAULT_PUSHY_WARMUP_VALIDATING } else { DEFAULT_PUSHY_WARMUP })
    }
}

/// The machine's cores (2 here): the Rust mock's runtime uses them all too.
pub(super) const DEFAULT_PUSHY_SERVER_THREADS: usize = 2;

/// `fanout-loadtest ceiling`.
#[derive(clap::Args, Debug, Clone)]
pub struct CeilingArgs {
    /// Scenario file: the requests are its deliveries.
    #[arg(long)]
    pub scenario: PathBuf,
    /// Number of requests (default: the scenario's deliveries, capped by ceiling.max_requests).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Requests in flight (default: the scenario's ceiling.concurrency).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}
