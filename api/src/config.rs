//! Configuration, layered: defaults → TOML file → environment, then one
//! deserialization into types that carry every rule (no validation pass after).
//! Environment overrides use `FANOUT__` and `__` between keys, e.g.
//! `FANOUT__ENGINE__MAX_PUSH_TOPICS=5000` or `FANOUT__SERVER__GRPC_LISTEN=0.0.0.0:50051`.
//! A bad value is reported with the dotted path of its key (`serde_path_to_error`).

use std::fmt;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fanout_engine::duration;
use fanout_engine::settings::EngineSettings;
use fanout_engine::store::ScyllaSettings;

use crate::auth::AuthSettings;
use crate::forward::ForwardSettings;
use crate::tls::TlsSettings;
use serde::Deserialize;

const ENV_PREFIX: &str = "FANOUT__";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub log: LogSettings,
    pub engine: EngineSettings,
    /// Spec 002's Station role (`gateway.rs`): its tenant and session
    /// verifier; needs `[engine.gateway]`.
    pub station: Option<crate::gateway::StationSettings>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// gRPC: notification and publish services, health, reflection.
    pub grpc_listen: SocketAddr,
    /// HTTP: /metrics, /healthz, /readyz.
    pub http_listen: SocketAddr,
    /// HTTP API: spec 003's `/v2/push/registration` and the debug push log.
    pub api_listen: SocketAddr,
    /// How long each of shutdown's waits lasts at most: for the calls in
    /// progress to be answered, for the shards to be handed over, for the
    /// attempts in flight.
    #[serde(rename = "drain_timeout_seconds", deserialize_with = "duration::seconds")]
    pub drain_timeout: Duration,
    /// The gRPC address other nodes forward publishes of this node's shards
    /// to, and name to publishers (several nodes on ScyllaDB); default:
    /// `grpc_listen`.
    pub advertise_address: Option<String>,
    /// How publishes of another node's shards are forwarded to it.
    pub forwarding: ForwardSettings,
    /// The deadline of a unary gRPC call (and of any call until its response
    /// starts). A PublishStream answers at once, so its batches are not cut
    /// by it.
    #[serde(rename = "grpc_request_timeout_seconds", deserialize_with = "duration::seconds")]
    pub grpc_request_timeout: Duration,
    /// The largest gRPC message a client may send. Tonic refuses a
    /// larger one before it is decoded (11 OUT_OF_RANGE, naming the limit).
    pub grpc_max_message_bytes: MessageBytes,
    /// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS of each gRPC
    /// connection: calls (a PublishStream is one for its whole life) one
    /// connection may have open at once. Clients queue the rest.
    pub grpc_max_concurrent_streams: NonZeroU32,
    /// How often the server pings each gRPC connection; one whose peer does
    /// not answer within 20 s is closed with its calls. This, not a timeout,
    /// ends a PublishStream whose publisher vanished.
    #[serde(rename = "grpc_keepalive_interval_seconds", deserialize_with = "duration::seconds")]
    pub grpc_keepalive_interval: Duration,
    /// TLS on all three listeners. Absent: plaintext, allowed only
    /// on loopback unless `dangerous_allow_plaintext`.
    pub tls: Option<TlsSettings>,
    /// Publishers and operators authenticate. Absent: nobody
    /// does, allowed only while gRPC listens on loopback unless
    /// `dangerous_allow_unauthenticated`.
    pub auth: Option<AuthSettings>,
    /// Open connections per listener; the next one waits in the
    /// kernel's backlog until one closes.
    pub max_connections_per_listener: NonZeroUsize,
    /// From accept to the first request (a complete HTTP/1 request head,
    /// or the HTTP/2 preface and first SETTINGS frame), the TLS handshake
    /// included: a connection that misses it is closed. Bounds idle and
    /// dripping connections before they have asked for anything.
    #[serde(rename = "first_request_timeout_seconds", deserialize_with = "duration::seconds")]
    pub first_request_timeout: Duration,
    /// A TLS handshake that takes longer is dropped (inside the
    /// first-request deadline; the shorter wins).
    #[serde(rename = "tls_handshake_timeout_seconds", deserialize_with = "duration::seconds")]
    pub tls_handshake_timeout: Duration,
    /// On a kept-alive HTTP/1.1 connection, a later request whose headers
    /// take longer is disconnected (slow-loris).
    #[serde(rename = "http_header_read_timeout_seconds", deserialize_with = "duration::seconds")]
    pub http_header_read_timeout: Duration,
    /// After its first request, a connection with no request open for this
    /// long is closed gracefully (GOAWAY on HTTP/2). An open stream, busy or
    /// not, keeps it open.
    #[serde(rename = "idle_timeout_seconds", deserialize_with = "duration::seconds")]
    pub idle_timeout: Duration,
    /// On the HTTP and API listeners, a request whose response has not
    /// started this long after its head arrived (a body that drips, a stuck
    /// handler) is answered 408 and its connection closed.
    #[serde(rename = "http_request_timeout_seconds", deserialize_with = "duration::seconds")]
    pub http_request_timeout: Duration,
    /// The largest request body the API listener reads (routes
    /// have smaller limits of their own).
    pub api_max_body_bytes: NonZeroUsize,
    /// Serve plaintext on a non-loopback address (a mesh or proxy terminates
    /// TLS in front). Off: such a configuration refuses to start.
    pub dangerous_allow_plaintext: bool,
    /// Serve gRPC on a non-loopback address with nobody authenticated. Off:
    /// such a configuration refuses to start.
    pub dangerous_allow_unauthenticated: bool,
}

/// `grpc_max_message_bytes`: 64 KiB to 64 MiB. A decoded message is held
/// whole while its call runs, so the bound is memory per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct MessageBytes(usize);

impl MessageBytes {
    pub const MIN: u64 = 64 << 10;
    pub const MAX: u64 = 64 << 20;
    /// tonic's own default: 4 MiB.
    pub const DEFAULT: MessageBytes = MessageBytes(4 << 20);

    pub fn get(self) -> usize {
        self.0
    }
}

impl TryFrom<u64> for MessageBytes {
    type Error = String;

    fn try_from(bytes: u64) -> Result<Self, String> {
        if (Self::MIN..=Self::MAX).contains(&bytes) {
            Ok(Self(bytes as usize))
        } else {
            Err(format!("must be between {} and {} (64 KiB to 64 MiB)", Self::MIN, Self::MAX))
        }
    }
}

impl ServerSettings {
    pub fn advertise_address(&self) -> String {
        self.advertise_address.clone().unwrap_or_else(|| self.grpc_listen.to_string())
    }

    /// Safe by default: what may listen beyond loopback. The
    /// error names the key to set.
    fn check_exposure(&self) -> Result<(), ConfigError> {
        let exposed: Vec<(&str, SocketAddr)> = [
            ("server.grpc_listen", self.grpc_listen),
            ("server.http_listen", self.http_listen),
            ("server.api_listen", self.api_listen),
        ]
        .into_iter()
        .filter(|(_, a)| !a.ip().is_loopback())
        .collect();
        let refuse = |key: &'static str, reason: String| Err(ConfigError::Unsafe { key, reason });
        if let Some((listener, _)) = exposed.first()
            && self.tls.is_none()
            && !self.dangerous_allow_plaintext
        {
            return refuse(
                "server.tls",
                format!(
                    "required because {listener} is not a loopback address (or set server.dangerous_allow_plaintext = true when a proxy terminates TLS)"
                ),
            );
        }
        if !self.grpc_listen.ip().is_loopback() && self.auth.is_none() && !self.dangerous_allow_unauthenticated {
            return refuse(
                "server.auth",
                "required because server.grpc_listen is not a loopback address: anyone who reaches it could publish (or set server.dangerous_allow_unauthenticated = true)".into(),
            );
        }
        if let Some(key) = self.forwarding.needs_tls()
            && self.tls.is_none()
        {
            return refuse(key, "needs [server.tls]: without it nodes forward to each other in plaintext".into());
        }
        if let Some(auth) = &self.auth
            && auth.certificate_identities.values().any(|ids| !ids.is_empty())
            && self.tls.as_ref().is_none_or(|t| t.client_ca_file.is_none())
        {
            return refuse(
                "server.auth.certificate_identities",
                "needs server.tls.client_ca_file: without it no client certificate is verified".into(),
            );
        }
        Ok(())
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            drain_timeout: Duration::from_secs(20),
            advertise_address: None,
            forwarding: ForwardSettings::default(),
            grpc_request_timeout: Duration::from_secs(30),
            grpc_max_message_bytes: MessageBytes::DEFAULT,
            // hyper's own default for HTTP/2 servers (tonic would leave it unlimited).
            grpc_max_concurrent_streams: NonZeroU32::new(200).unwrap(),
            grpc_keepalive_interval: Duration::from_secs(30),
            tls: None,
            auth: None,
            max_connections_per_listener: NonZeroUsize::new(4096).unwrap(),
            first_request_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            http_header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            http_request_timeout: Duration::from_secs(30),
            api_max_body_bytes: NonZeroUsize::new(1 << 20).unwrap(),
            dangerous_allow_plaintext: false,
            dangerous_allow_unauthenticated: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// Embedded redb in `path` (the default).
    Redb,
    /// ScyllaDB or Apache Cassandra, as `[store.scylla]` says.
    Scylla,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    pub backend: StoreBackend,
    /// Directory of the embedded store.
    pub path: PathBuf,
    /// Memory of the embedded store's page cache, in MiB: most of the
    /// engine's memory once the data outgrows it (`redb_cache_bytes`).
    pub cache_size_mb: NonZeroUsize,
    /// The ScyllaDB backend: nodes, keyspace, replication, migrate, request_timeout_ms.
    pub scylla: ScyllaSettings,
}

/// A page of redb's cache is a 4 KiB buffer behind a 16-byte `Arc` header,
/// which the `fanout` binary's allocator (jemalloc) serves from its 5 KiB
/// size class: each page takes 5 KiB of memory.
const REDB_PAGE_BYTES: usize = 4096;
const REDB_PAGE_MEMORY: usize = 5120;

impl StoreSettings {
    /// The page cache redb is given: `cache_size_mb` counts memory, redb
    /// counts the bytes of its pages, so it gets four fifths of it and the
    /// cache takes `cache_size_mb` once full.
    pub fn redb_cache_bytes(&self) -> usize {
        (self.cache_size_mb.get() << 20) / REDB_PAGE_MEMORY * REDB_PAGE_BYTES
    }
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Redb,
            path: PathBuf::from("./fanout-data"),
            cache_size_mb: NonZeroUsize::new(1024).unwrap(),
            scylla: ScyllaSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Whether text log lines carry ANSI colour codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogColor {
    /// Colour only when stderr is a terminal (not a file or a pipe).
    Auto,
    Always,
    Never,
}

impl LogColor {
    pub fn enabled(self, terminal: bool) -> bool {
        match self {
            Self::Auto => terminal,
            Self::Always => true,
            Self::Never => false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter, e.g. "info" or "fanout_engine=debug,info". RUST_LOG wins when set.
    pub level: String,
    pub format: LogFormat,
    pub color: LogColor,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self { level: "info".into(), format: LogFormat::Text, color: LogColor::Auto }
    }
}

impl Config {
    /// Reads the file (if any), applies the environment and deserializes.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let root = match file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        Self::layer(root, std::env::vars())
    }

    /// Applies the `FANOUT__` variables of `env` over `root`, then
    /// deserializes the result once.
    fn layer(mut root: toml::Table, env: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        let mut overrides = Vec::new();
        for (name, value) in env {
            if let Some(path) = name.strip_prefix(ENV_PREFIX) {
                overrides.push(apply_env(&mut root, path, &value)?);
            }
        }
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(root))
            .map_err(|e| ConfigError::Invalid(Invalid::new(e, &overrides)))?;
        config.server.check_exposure()?;
        Ok(config)
    }
}

/// Why the configuration cannot be used. Every message names the file, the
/// variable or the key at fault and the rule, never a configured value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error("config file {}: {error}", path.display())]
    Syntax { path: PathBuf, error: toml::de::Error },
    #[error("environment variable {variable}: {reason}")]
    Environment { variable: String, reason: String },
    #[error("invalid configuration: {0}")]
    Invalid(Invalid),
    #[error("unsafe configuration: {key}: {reason}")]
    Unsafe { key: &'static str, reason: String },
}

/// A value that does not deserialize into its key's type.
#[derive(Debug)]
pub struct Invalid {
    /// The dotted path, e.g. `engine.channels.apns.key_id`; empty for the
    /// top-level table.
    pub key: String,
    /// The rule it breaks, as the type's deserializer words it.
    pub message: String,
    /// The `FANOUT__` variable that set the key, when one did.
    pub variable: Option<String>,
}

impl Invalid {
    fn new(error: serde_path_to_error::Error<toml::de::Error>, overrides: &[EnvOverride]) -> Self {
        let path = error.path();
        let key = if path.iter().next().is_none() { String::new() } else { path.to_string() };
        let variable = overrides.iter().find(|o| o.covers(&key)).map(|o| o.variable.clone());
        Self { key, message: error.into_inner().message().trim_end().to_owned(), variable }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.key.is_empty() {
            f.write_str(&self.key)?;
            if let Some(variable) = &self.variable {
                write!(f, " (set by {variable})")?;
            }
            f.write_str(": ")?;
        }
        f.write_str(&self.message)
    }
}

fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.to_owned(), error })?;
    text.parse::<toml::Table>().map_err(|error| ConfigError::Syntax { path: path.to_owned(), error })
}

/// Which key one `FANOUT__` variable set, to name the variable in an error.
struct EnvOverride {
    /// Dotted, as `serde_path_to_error` prints paths.
    key: String,
    variable: String,
}

impl EnvOverride {
    /// True when an error at `key` is about this override's value (the key
    /// itself or an element of it, e.g. `allowed_domains[0]`).
    fn covers(&self, key: &str) -> bool {
        key.strip_prefix(self.key.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    }
}

/// Sets `a__b__c` in the table; the value is read as a TOML value when it
/// parses as one (numbers, booleans, arrays), else as a string.
fn apply_env(root: &mut toml::Table, path: &str, raw: &str) -> Result<EnvOverride, ConfigError> {
    let variable = format!("{ENV_PREFIX}{path}");
    let refuse = |reason: String| ConfigError::Environment { variable: variable.clone(), reason };
    let keys: Vec<String> = path.split("__").map(|k| k.to_ascii_lowercase()).collect();
    if keys.iter().any(String::is_empty) {
        return Err(refuse("names an empty key".into()));
    }
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()));
    let (last, parents) = keys.split_last().expect("at least one key");
    let mut table = root;
    for key in parents {
        let entry = table.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| refuse(format!("`{key}` is not a table")))?;
    }
    table.insert(last.clone(), value);
    Ok(EnvOverride { key: keys.join("."), variable })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::layer(toml.parse().unwrap(), env)
    }

    fn error(toml: &str, env: &[(&str, &str)]) -> String {
        layer(toml, env).unwrap_err().to_string()
    }

    #[test]
    fn defaults_need_no_file() {
        let c = layer("", &[]).unwrap();
        assert!(c.engine.channels.http.is_some(), "HTTPS channel on by default");
        assert!(!c.engine.channels.http.unwrap().allow_private_addresses);
        assert_eq!(c.engine.max_push_topics, 100_000);
        assert_eq!((c.server.drain_timeout, c.store.cache_size_mb.get()), (Duration::from_secs(20), 1024));
        // 1 GiB of memory: 209,715 pages of 4 KiB at 5 KiB each.
        assert_eq!(c.store.redb_cache_bytes(), 209_715 * 4096);
        assert_eq!(c.server.grpc_max_message_bytes.get(), 4 << 20);
        assert_eq!(c.server.grpc_max_concurrent_streams.get(), 200);
        assert_eq!(c.server.grpc_keepalive_interval, Duration::from_secs(30));
        assert_eq!(c.server.grpc_request_timeout, Duration::from_secs(30));
        assert_eq!(c.engine.ingest.max_data_bytes.get(), 1 << 20);
        let forwarding = &c.server.forwarding;
        assert!(forwarding.enabled && forwarding.token_file.is_none());
        assert_eq!((forwarding.max_in_flight_per_node.get(), forwarding.timeout), (64, Duration::from_secs(10)));
    }

    #[test]
    fn listening_beyond_loopback_needs_tls_and_auth() {
        let public = "[server]\ngrpc_listen = \"0.0.0.0:50051\"\n";
        let err = error(public, &[]);
        assert!(err.starts_with("unsafe configuration: server.tls: required because server.grpc_listen"), "{err}");
        let tls = "[server.tls]\ncert_file = \"/c.pem\"\nkey_file = \"/k.pem\"\n";
        let err = error(&format!("{public}{tls}"), &[]);
        assert!(err.starts_with("unsafe configuration: server.auth: required"), "{err}");
        let auth = "[server.auth]\ntoken_files = { publisher = \"/p\", operator = \"/o\" }\n";
        let c = layer(&format!("{public}{tls}{auth}"), &[]).unwrap();
        assert_eq!(c.server.tls.unwrap().reload_interval, Duration::from_secs(60));
        // The ops listener alone beyond loopback needs TLS, not auth.
        let err = error("", &[("FANOUT__SERVER__HTTP_LISTEN", "0.0.0.0:9090")]);
        assert!(err.contains("server.tls: required because server.http_listen"), "{err}");
        // The dangerous switches say so.
        layer(&format!("{public}dangerous_allow_plaintext = true\ndangerous_allow_unauthenticated = true\n"), &[])
            .unwrap();
        // Certificate identities need a client CA.
        let ids = "[server.auth]\ncertificate_identities = { publisher = [\"uri:spiffe://x/p\"] }\n";
        let err = error(&format!("{tls}{ids}"), &[]);
        assert!(err.contains("server.auth.certificate_identities: needs server.tls.client_ca_file"), "{err}");
        // Forwarding's TLS keys need TLS.
        let err = error("[server.forwarding]\nca_file = \"/ca.pem\"\n", &[]);
        assert!(err.contains("server.forwarding.ca_file: needs [server.tls]"), "{err}");
        let c = layer(&format!("{tls}[server.forwarding]\nca_file = \"/ca.pem\"\nclient_certificate = true\n"), &[])
            .unwrap();
        assert!(c.server.forwarding.client_certificate && c.server.forwarding.enabled);
        let err = error("[server.auth]\ncertificate_identities = { publisher = [\"spiffe://x\"] }\n", &[]);
        assert!(err.contains("server.auth.certificate_identities") && err.contains("must start with uri:"), "{err}");
    }

    #[test]
    fn limits_carry_their_rules() {
        let c = layer(
            "[server]\ngrpc_max_message_bytes = 65536\ngrpc_max_concurrent_streams = 1\n\
             grpc_keepalive_interval_seconds = 5\n[engine.ingest]\nmax_data_bytes = 100",
            &[],
        )
        .unwrap();
        assert_eq!(c.server.grpc_max_message_bytes.get(), 65536);
        assert_eq!(c.server.grpc_max_concurrent_streams.get(), 1);
        assert_eq!(c.server.grpc_keepalive_interval, Duration::from_secs(5));
        assert_eq!(c.engine.ingest.max_data_bytes.get(), 100);
        let err = error("[server]\ngrpc_max_message_bytes = 65535", &[]);
        assert!(err.contains("server.grpc_max_message_bytes: must be between 65536 and 67108864"), "{err}");
        let err = error("", &[("FANOUT__SERVER__GRPC_MAX_MESSAGE_BYTES", "100000000")]);
        assert!(err.contains("(set by FANOUT__SERVER__GRPC_MAX_MESSAGE_BYTES): must be between"), "{err}");
        let err = error("[server]\ngrpc_max_concurrent_streams = 0", &[]);
        assert!(err.starts_with("invalid configuration: server.grpc_max_concurrent_streams: "), "{err}");
        let err = error("[engine.ingest]\nmax_data_bytes = 0", &[]);
        assert!(err.starts_with("invalid configuration: engine.ingest.max_data_bytes: "), "{err}");
    }

    #[test]
    fn env_overrides_nested_keys() {
        let c = layer(
            "[engine]\nmax_push_topics = 7",
            &[
                ("FANOUT__ENGINE__MAX_PUSH_TOPICS", "9"),
                ("FANOUT__ENGINE__CHANNELS__HTTP__ALLOW_PRIVATE_ADDRESSES", "true"),
                ("FANOUT__STORE__PATH", "/tmp/x y"),
                ("FANOUT_CONFIG", "not an override"),
            ],
        )
        .unwrap();
        assert_eq!(c.engine.max_push_topics, 9);
        assert!(c.engine.channels.http.unwrap().allow_private_addresses);
        assert_eq!(c.store.path, PathBuf::from("/tmp/x y"));
    }

    #[test]
    fn durations_parse_from_the_existing_integer_keys() {
        let c = layer(
            "[server]\ndrain_timeout_seconds = 30\n\
             [engine]\nrecipient_ttl_seconds = 100\n\
             [engine.dispatch]\npoll_interval_ms = 250\nwindow_timeout_seconds = 120\n\
             [engine.retention]\ninterval_seconds = 60\n\
             [store.scylla]\nrequest_timeout_ms = 1500",
            &[("FANOUT__ENGINE__LEASE__TTL_SECONDS", "12")],
        )
        .unwrap();
        assert_eq!(c.server.drain_timeout, Duration::from_secs(30));
        assert_eq!(c.engine.recipient_ttl, Duration::from_secs(100));
        assert_eq!(c.engine.dispatch.poll_interval, Duration::from_millis(250));
        assert_eq!(c.engine.dispatch.window_timeout, Duration::from_secs(120));
        assert_eq!(c.engine.retention.interval.get(), Duration::from_secs(60));
        assert_eq!(c.engine.lease.ttl, Duration::from_secs(12));
        assert_eq!(c.store.scylla.request_timeout, Duration::from_millis(1500));
        let err = error("[server]\ndrain_timeout_seconds = 0", &[]);
        assert!(err.starts_with("invalid configuration: server.drain_timeout_seconds: "), "{err}");
    }

    #[test]
    fn errors_name_the_dotted_path_of_a_nested_key() {
        let apns = "[engine.channels.apns]\nkey_file = \"/k.p8\"\nkey_id = \"KEY1234567\"\n\
                    team_id = \"TEAM123456\"\nbundle_id = \"com.example.app\"\nenvironment = \"sandbox\"\n";
        layer(apns, &[]).unwrap();
        let err = error(&format!("{apns}sandbox_url = \"http://user:secret@mock.test/\""), &[]);
        assert_eq!(err, "invalid configuration: engine.channels.apns.sandbox_url: must be an https URL");
        let err = error(&apns.replace("KEY1234567", "KEY 123"), &[]);
        assert_eq!(err, "invalid configuration: engine.channels.apns.key_id: must be printable ASCII without spaces");

        let err = error("[engine.dispatch]\nwindow_envelopes = 0", &[]);
        assert!(err.starts_with("invalid configuration: engine.dispatch.window_envelopes: "), "{err}");
        assert!(err.contains("nonzero"), "{err}");

        let err = error("[store]\nbackend = \"scylla\"\n[store.scylla]\nkeyspace = \"bad-name\"", &[]);
        assert!(err.starts_with("invalid configuration: store.scylla.keyspace: must be a letter"), "{err}");

        let err = error("[engine.channels.http]\nallowed_domains = [\"ok.example\", \"*.\"]", &[]);
        assert!(err.starts_with("invalid configuration: engine.channels.http.allowed_domains[1]: "), "{err}");

        let err = error("[engine.retention]\ninterval_seconds = 7200", &[]);
        assert!(err.contains("engine.retention.interval_seconds: must be between 1 and 3600"), "{err}");
        let err = error("[engine.channels.fcm]\nservice_account_file = \"/sa.json\"\nconnections = 65", &[]);
        assert!(err.contains("engine.channels.fcm.connections: must be between 1 and 64"), "{err}");
        assert!(!error("[store]\ncache_size_mb = 0", &[]).contains("(set by"), "no variable set it");
    }

    #[test]
    fn an_env_override_with_a_bad_value_names_its_key_and_variable() {
        let err = error("", &[("FANOUT__ENGINE__DISPATCH__WINDOW_ENVELOPES", "0")]);
        assert!(
            err.starts_with(
                "invalid configuration: engine.dispatch.window_envelopes \
                 (set by FANOUT__ENGINE__DISPATCH__WINDOW_ENVELOPES): "
            ),
            "{err}"
        );
        let err = error("", &[("FANOUT__ENGINE__CHANNELS__HTTP__ALLOWED_DOMAINS", r#"["*."]"#)]);
        assert!(err.contains("allowed_domains[0] (set by FANOUT__ENGINE__CHANNELS__HTTP__ALLOWED_DOMAINS)"), "{err}");
        let err = error("", &[("FANOUT__STORE__SCYLLA__NODES", "[]")]);
        assert!(err.contains("store.scylla.nodes (set by FANOUT__STORE__SCYLLA__NODES): must name at least one"));
        let err = error("", &[("FANOUT__ENGINE__MAX_PUSH_TOPICS__X", "1")]);
        assert!(err.starts_with("invalid configuration: engine.max_push_topics"), "{err}");
        let err = error("[engine]\nmax_push_topics = 1", &[("FANOUT__ENGINE__MAX_PUSH_TOPICS__X", "1")]);
        assert_eq!(err, "environment variable FANOUT__ENGINE__MAX_PUSH_TOPICS__X: `max_push_topics` is not a table");
        let err = error("", &[("FANOUT__ENGINE____SHARD_COUNT", "1")]);
        assert_eq!(err, "environment variable FANOUT__ENGINE____SHARD_COUNT: names an empty key");
    }

    #[test]
    fn log_colour_only_on_a_terminal_by_default() {
        let c = layer("", &[]).unwrap();
        assert_eq!(c.log.color, LogColor::Auto);
        assert!(LogColor::Auto.enabled(true) && !LogColor::Auto.enabled(false));
        assert!(LogColor::Always.enabled(false) && !LogColor::Never.enabled(true));
        assert_eq!(layer("[log]\ncolor = \"never\"", &[]).unwrap().log.color, LogColor::Never);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = error("[engine]\nmax_push_topic = 7", &[]);
        assert!(err.starts_with("invalid configuration: engine.max_push_topic: unknown field"), "{err}");
        let err = error("[engine.dispatch]\nwindow_envelope = 7", &[]);
        assert!(err.starts_with("invalid configuration: engine.dispatch.window_envelope: unknown field"), "{err}");
        let err = error("[servr]", &[]);
        assert!(err.starts_with("invalid configuration: servr: unknown field `servr`"), "{err}");
        let err = error("", &[("FANOUT__ENGINE__MAX_PUSH_TOPIC", "7")]);
        assert!(err.contains("engine.max_push_topic (set by FANOUT__ENGINE__MAX_PUSH_TOPIC): unknown field"), "{err}");
    }

    #[test]
    fn scylla_settings_and_overrides() {
        let c = layer(
            "[store]\nbackend = \"scylla\"\n[store.scylla]\nkeyspace = \"prod\"",
            &[
                ("FANOUT__STORE__SCYLLA__NODES", r#"["10.0.0.1:9042", "10.0.0.2:9042"]"#),
                ("FANOUT__STORE__SCYLLA__MIGRATE", "true"),
            ],
        )
        .unwrap();
        assert!(matches!(c.store.backend, StoreBackend::Scylla));
        let s = &c.store.scylla;
        assert_eq!(s.nodes.as_slice(), ["10.0.0.1:9042", "10.0.0.2:9042"]);
        assert_eq!((s.keyspace.as_str(), s.migrate, s.request_timeout), ("prod", true, Duration::from_secs(10)));
        assert_eq!(s.replication, "{'class': 'SimpleStrategy', 'replication_factor': 1}");
    }

    /// A commented-out table of the example file, from its header to the
    /// next blank line, uncommented.
    fn example_block(header: &str) -> String {
        let example = include_str!("../../fanout.example.toml");
        let start = example.find(header).unwrap();
        let block = example[start..].split("\n\n").next().unwrap();
        block.lines().map(|l| l.strip_prefix("# ").unwrap_or(l)).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn the_relay_ingress_example_loads_and_bad_keys_are_named() {
        let c = layer(&example_block("# [engine.relay_ingress]"), &[]).unwrap();
        let ingress = c.engine.relay_ingress.unwrap();
        assert_eq!(ingress.path.as_str(), "/v1/relay/push");
        assert_eq!(ingress.signature_window, Duration::from_secs(300));
        let err = error("[engine.relay_ingress]\nhubs = {}", &[]);
        assert!(err.contains("engine.relay_ingress.hubs") && err.contains("at least one hub"), "{err}");
    }

    #[test]
    fn the_gateway_and_station_examples_load() {
        let block = format!("{}\n{}", example_block("# [engine.gateway]"), example_block("# [station]"));
        let c = layer(&block, &[]).unwrap();
        let station = c.station.unwrap();
        assert_eq!(station.service_id.as_str(), "did:web:station.example");
        assert_eq!(station.trusted_proxies, ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
        assert_eq!(c.engine.gateway.unwrap().delivery.max_in_flight.get(), 64);
        let err = error(&block.replace("max_in_flight = 64", "max_in_flight = 0"), &[]);
        assert!(err.starts_with("invalid configuration: engine.gateway.delivery.max_in_flight: "), "{err}");
        let err = error("[station]\nservice_id = \"s\"", &[]);
        assert!(err.contains("station") && err.contains("sessions need a verifier"), "{err}");
    }

    #[test]
    fn shipped_files_load() {
        for text in [
            include_str!("../../fanout.example.toml"),
            include_str!("../../deploy/fanout.toml"),
            include_str!("../../deploy/compose/fanout.toml"),
        ] {
            layer(text, &[]).unwrap();
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_or_parsed_is_named() {
        let missing = std::env::temp_dir().join(format!("fanout-missing-{}.toml", std::process::id()));
        let err = Config::load(Some(&missing)).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot read config file {}: ", missing.display())), "{err}");
        let broken = std::env::temp_dir().join(format!("fanout-broken-{}.toml", std::process::id()));
        std::fs::write(&broken, "[engine\n").unwrap();
        let err = Config::load(Some(&broken)).unwrap_err().to_string();
        std::fs::remove_file(&broken).unwrap();
        assert!(err.starts_with(&format!("config file {}: ", broken.display())), "{err}");
    }

    /// Config files and environment variables, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        use proptest::test_runner::{Config as Cases, TestRunner};

        const EXAMPLE: &str = include_str!("../../fanout.example.toml");

        /// The example file with every commented-out table block (`# [..]`
        /// followed by `# key = value` lines) that parses on its own merged
        /// in: every documented key.
        fn every_documented_table() -> toml::Table {
            let mut root: toml::Table = EXAMPLE.parse().unwrap();
            let lines: Vec<&str> = EXAMPLE.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if !line.starts_with("# [") {
                    continue;
                }
                let block: Vec<&str> = lines[i..]
                    .iter()
                    .take_while(|l| l.starts_with('#'))
                    .map(|l| l.strip_prefix("# ").unwrap_or(l))
                    .collect();
                if let Ok(table) = block.join("\n").parse::<toml::Table>() {
                    merge(&mut root, table);
                }
            }
            root
        }

        fn merge(into: &mut toml::Table, from: toml::Table) {
            for (key, value) in from {
                match (into.get_mut(&key), value) {
                    (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
                    (_, value) => {
                        into.insert(key, value);
                    }
                }
            }
        }

        /// Every leaf key, as its path of table names.
        fn leaves(table: &toml::Table, prefix: &[String], out: &mut Vec<Vec<String>>) {
            for (key, value) in table {
                let mut path = prefix.to_vec();
                path.push(key.clone());
                match value {
                    toml::Value::Table(t) => leaves(t, &path, out),
                    _ => out.push(path),
                }
            }
        }

        fn set(table: &mut toml::Table, path: &[String], value: toml::Value) {
            let (last, parents) = path.split_last().unwrap();
            let mut cur = table;
            for key in parents {
                let entry = cur.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if !entry.is_table() {
                    *entry = toml::Value::Table(toml::Table::new());
                }
                cur = entry.as_table_mut().unwrap();
            }
            cur.insert(last.clone(), value);
        }

        /// The keys of an error's dotted path, without element indices
        /// (`a.b[0]` is `a`, `b`).
        fn key_path(key: &str) -> Vec<&str> {
            key.split('.').map(|k| k.split('[').next().unwrap_or_default()).filter(|k| !k.is_empty()).collect()
        }

        /// Whether one path is a prefix of the other: an error about the key
        /// itself, a table above it, or a value inside it. `?` is a segment
        /// `serde_path_to_error` could not name (the key of a map whose keys
        /// are not strings, e.g. `certificate_identities`' roles).
        fn related(error_key: &[&str], path: &[String]) -> bool {
            error_key.iter().zip(path).all(|(a, b)| *a == "?" || a == b)
        }

        /// An invalid configuration names a key, and one that changed; no
        /// variable set anything.
        fn names_a_changed_key(
            result: Result<Config, ConfigError>,
            changed: &[Vec<String>],
        ) -> Result<(), TestCaseError> {
            match result {
                Ok(_) | Err(ConfigError::Unsafe { .. }) => {}
                Err(ConfigError::Invalid(invalid)) => {
                    let key = key_path(&invalid.key);
                    prop_assert!(!key.is_empty(), "no key named: {}", invalid);
                    prop_assert!(invalid.variable.is_none(), "{}", invalid);
                    prop_assert!(
                        changed.iter().any(|p| related(&key, p)),
                        "{} names no changed key: {:?}",
                        invalid,
                        changed
                    );
                }
                Err(e) => prop_assert!(false, "only a value can be wrong here: {}", e),
            }
            Ok(())
        }

        /// A variable's text as the environment layer reads it: a TOML
        /// value when it parses as one, else a string.
        fn env_value(raw: &str) -> toml::Value {
            format!("v = {raw}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
        }

        /// `FANOUT__` names: any, or a documented key's.
        fn env_name() -> impl Strategy<Value = String> {
            let mut paths = Vec::new();
            leaves(&every_documented_table(), &[], &mut paths);
            let documented: Vec<String> = paths.iter().map(|p| p.join("__").to_ascii_uppercase()).collect();
            prop_oneof!["[A-Za-z_]{0,12}(__[A-Za-z_]{0,12}){0,4}", prop::sample::select(documented),]
        }

        /// Any TOML value, edge numbers and address-like strings included.
        fn value() -> impl Strategy<Value = toml::Value> {
            let leaf = prop_oneof![
                any::<i64>().prop_map(toml::Value::Integer),
                prop_oneof![Just(-1i64), Just(0), Just(1), Just(65_536), Just(i64::from(u32::MAX) + 1), Just(i64::MAX)]
                    .prop_map(toml::Value::Integer),
                any::<f64>().prop_map(toml::Value::Float),
                any::<bool>().prop_map(toml::Value::Boolean),
                "\\PC{0,24}".prop_map(toml::Value::String),
                prop::sample::select(vec![
                    "0.0.0.0:0",
                    "127.0.0.1:99999",
                    "[::]:443",
                    "*.",
                    "/dev/null",
                    "production",
                    "scylla"
                ])
                .prop_map(|s| toml::Value::String(s.to_owned())),
            ];
            leaf.prop_recursive(2, 12, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(toml::Value::Array),
                    prop::collection::btree_map("[a-z_]{1,12}", inner, 0..4)
                        .prop_map(|m| toml::Value::Table(m.into_iter().collect())),
                ]
            })
        }

        /// Changing any documented keys to any values gives a configuration
        /// or an error naming a key that changed (or its table), never a panic.
        #[test]
        fn any_values_of_documented_keys_load_or_are_named() {
            let base = every_documented_table();
            let mut paths = Vec::new();
            leaves(&base, &[], &mut paths);
            assert!(paths.len() > 80, "the example documents {} keys", paths.len());
            let mut runner = TestRunner::new(Cases { failure_persistence: None, ..Cases::with_cases(512) });
            let changes = prop::collection::vec((any::<prop::sample::Index>(), value()), 1..6);
            runner
                .run(&changes, |changes| {
                    let mut table = base.clone();
                    let mut changed = Vec::new();
                    for (index, value) in changes {
                        let path = &paths[index.index(paths.len())];
                        set(&mut table, path, value);
                        changed.push(path.clone());
                    }
                    names_a_changed_key(Config::layer(table, std::iter::empty()), &changed)
                })
                .unwrap();
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Any text spliced into the example: a syntax error, or a
            /// configuration, or an error naming a key; never a panic.
            #[test]
            fn any_text_in_a_config_file_is_an_error_or_a_config(
                cut in any::<prop::sample::Index>(),
                len in 0usize..40,
                insert in "\\PC{0,30}|[\\[\\]=\"'{},.0-9a-z_ \\n]{0,30}",
            ) {
                let chars: Vec<char> = EXAMPLE.chars().collect();
                let at = cut.index(chars.len());
                let end = (at + len).min(chars.len());
                let text: String =
                    chars[..at].iter().copied().chain(insert.chars()).chain(chars[end..].iter().copied()).collect();
                for text in [text, insert] {
                    let Ok(table) = text.parse::<toml::Table>() else { continue };
                    // Any key may have changed: every top-level one is "changed".
                    let changed: Vec<Vec<String>> = table.keys().map(|k| vec![k.clone()]).collect();
                    names_a_changed_key(Config::layer(table, std::iter::empty()), &changed)?;
                }
            }

            /// Any FANOUT__ variable, name and value: applied (the same
            /// configuration as a file setting its key to its value), or
            /// refused naming the variable or the key it names (or a table
            /// above it: an unknown one).
            #[test]
            fn any_environment_variable_is_applied_or_refused(
                name in env_name(),
                value in "\\PC{0,30}|\\[[0-9, \"a-z]{0,20}\\]|\\{[a-z =0-9]{0,20}\\}",
            ) {
                let variable = format!("{ENV_PREFIX}{name}");
                let keys: Vec<String> = name.split("__").map(str::to_ascii_lowercase).collect();
                match Config::layer(toml::Table::new(), [(variable.clone(), value.clone())]) {
                    Ok(config) => {
                        let mut file = toml::Table::new();
                        set(&mut file, &keys, env_value(&value));
                        let from_file = Config::layer(file, std::iter::empty());
                        prop_assert!(from_file.is_ok(), "{:?}", from_file.err());
                        prop_assert_eq!(format!("{config:?}"), format!("{:?}", from_file.unwrap()));
                    }
                    Err(ConfigError::Environment { variable: named, .. }) => prop_assert_eq!(named, variable),
                    Err(ConfigError::Invalid(invalid)) => {
                        let key = key_path(&invalid.key);
                        let named = invalid.variable.as_deref() == Some(variable.as_str());
                        prop_assert!(named || (!key.is_empty() && related(&key, &keys)), "{} for {}", invalid, variable);
                    }
                    Err(e @ ConfigError::Unsafe { .. }) => {
                        prop_assert!(e.to_string().contains(&keys.join(".")), "{} for {}", e, variable);
                    }
                    Err(e) => prop_assert!(false, "{} for {}", e, variable),
                }
            }
        }
    }
}
