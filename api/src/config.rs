//! Configuration, layered: defaults → TOML file → environment, validated once.
//! Environment overrides use `FANOUT__` and `__` between keys, e.g.
//! `FANOUT__ENGINE__MAX_PUSH_TOPICS=5000` or `FANOUT__SERVER__GRPC_LISTEN=0.0.0.0:50051`.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fanout_engine::settings::{EngineSettings, duration};
use fanout_engine::store::ScyllaSettings;
use serde::Deserialize;

const ENV_PREFIX: &str = "FANOUT__";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub log: LogSettings,
    pub engine: EngineSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// gRPC: notification and publish services, health, reflection.
    pub grpc_listen: SocketAddr,
    /// HTTP: /metrics, /healthz, /readyz.
    pub http_listen: SocketAddr,
    /// How long shutdown waits for attempts in flight.
    #[serde(rename = "drain_timeout_seconds", deserialize_with = "duration::seconds")]
    pub drain_timeout: Duration,
    /// The gRPC address other nodes name when they redirect a publish here
    /// (issue 7, several nodes on ScyllaDB); default: `grpc_listen`.
    pub advertise_address: Option<String>,
}

impl ServerSettings {
    pub fn advertise_address(&self) -> String {
        self.advertise_address.clone().unwrap_or_else(|| self.grpc_listen.to_string())
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            drain_timeout: Duration::from_secs(20),
            advertise_address: None,
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
    /// Page cache of the embedded store, in MiB: most of its memory once the
    /// data outgrows it.
    pub cache_size_mb: NonZeroUsize,
    /// The ScyllaDB backend: nodes, keyspace, replication, migrate, request_timeout_ms.
    pub scylla: ScyllaSettings,
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
    /// Reads the file (if any), applies the environment, deserializes and validates.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut root = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
                text.parse::<toml::Table>()
                    .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?
            }
            None => toml::Table::new(),
        };
        for (name, value) in std::env::vars() {
            if let Some(path) = name.strip_prefix(ENV_PREFIX) {
                apply_env(&mut root, path, &value)?;
            }
        }
        toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("invalid configuration: {e}"))
    }
}

/// Sets `a__b__c` in the table; the value is read as a TOML value when it
/// parses as one (numbers, booleans, arrays), else as a string.
fn apply_env(root: &mut toml::Table, path: &str, raw: &str) -> anyhow::Result<()> {
    let keys: Vec<String> = path.split("__").map(|k| k.to_ascii_lowercase()).collect();
    if keys.iter().any(String::is_empty) {
        anyhow::bail!("environment variable {ENV_PREFIX}{path} names an empty key");
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
        table = entry
            .as_table_mut()
            .ok_or_else(|| anyhow::anyhow!("environment variable {ENV_PREFIX}{path}: `{key}` is not a table"))?;
    }
    table.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_need_no_file() {
        let c: Config = toml::Value::Table(toml::Table::new()).try_into().unwrap();
        assert!(c.engine.channels.http.is_some(), "HTTPS channel on by default");
        assert!(!c.engine.channels.http.unwrap().allow_private_addresses);
        assert_eq!(c.engine.max_push_topics, 100_000);
    }

    #[test]
    fn env_overrides_nested_keys() {
        let mut t = "[engine]\nmax_push_topics = 7".parse::<toml::Table>().unwrap();
        apply_env(&mut t, "ENGINE__MAX_PUSH_TOPICS", "9").unwrap();
        apply_env(&mut t, "ENGINE__CHANNELS__HTTP__ALLOW_PRIVATE_ADDRESSES", "true").unwrap();
        apply_env(&mut t, "STORE__PATH", "/tmp/x y").unwrap();
        let c: Config = toml::Value::Table(t).try_into().unwrap();
        assert_eq!(c.engine.max_push_topics, 9);
        assert!(c.engine.channels.http.unwrap().allow_private_addresses);
        assert_eq!(c.store.path, PathBuf::from("/tmp/x y"));
    }

    #[test]
    fn log_colour_only_on_a_terminal_by_default() {
        let c: Config = toml::Value::Table(toml::Table::new()).try_into().unwrap();
        assert_eq!(c.log.color, LogColor::Auto);
        assert!(LogColor::Auto.enabled(true) && !LogColor::Auto.enabled(false));
        assert!(LogColor::Always.enabled(false) && !LogColor::Never.enabled(true));
        let t = "[log]\ncolor = \"never\"".parse::<toml::Table>().unwrap();
        let c: Config = toml::Value::Table(t).try_into().unwrap();
        assert_eq!(c.log.color, LogColor::Never);
    }

    #[test]
    fn unknown_keys_are_named() {
        let t = "[engine]\nmax_push_topic = 7".parse::<toml::Table>().unwrap();
        let err = toml::Value::Table(t).try_into::<Config>().unwrap_err().to_string();
        assert!(err.contains("max_push_topic"), "{err}");
    }

    #[test]
    fn scylla_settings_and_overrides() {
        let mut t = "[store]\nbackend = \"scylla\"\n[store.scylla]\nkeyspace = \"prod\"".parse::<toml::Table>().unwrap();
        apply_env(&mut t, "STORE__SCYLLA__NODES", r#"["10.0.0.1:9042", "10.0.0.2:9042"]"#).unwrap();
        apply_env(&mut t, "STORE__SCYLLA__MIGRATE", "true").unwrap();
        let c: Config = toml::Value::Table(t).try_into().unwrap();
        assert!(matches!(c.store.backend, StoreBackend::Scylla));
        let s = &c.store.scylla;
        assert_eq!(s.nodes.as_slice(), ["10.0.0.1:9042", "10.0.0.2:9042"]);
        assert_eq!((s.keyspace.as_str(), s.migrate, s.request_timeout), ("prod", true, Duration::from_secs(10)));
        assert_eq!(s.replication, "{'class': 'SimpleStrategy', 'replication_factor': 1}");

        let t = "[store]\nbackend = \"scylla\"\n[store.scylla]\nkeyspace = \"bad-name\"".parse::<toml::Table>().unwrap();
        let err = toml::Value::Table(t).try_into::<Config>().unwrap_err().to_string();
        assert!(err.contains("must be a letter"), "{err}");
    }

    #[test]
    fn example_file_parses() {
        let text = include_str!("../../fanout.example.toml");
        let _: Config = toml::Value::Table(text.parse().unwrap()).try_into().unwrap();
    }
}
