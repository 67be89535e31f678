//! The real `fanout` binary as the end-to-end tests run it: built once, with
//! the knobs the tests turn ([`EngineConfig`]), started by the shared
//! launcher of `fanout-testkit`.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fanout_testkit::launcher::{self, Engine, Launch};

/// The path of the `fanout` binary, built (once per test process) with the
/// same cargo and target directory as the tests, so it is never stale.
pub fn fanout_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| launcher::build_binary(false).expect("cargo build of the fanout binary"))
}

/// What a test changes from the defaults.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub allow_private_addresses: bool,
    pub allowed_domains: Vec<String>,
    pub dns_server: Option<SocketAddr>,
    pub ca_file: Option<PathBuf>,
    pub http_channel: bool,
    pub shard_count: u16,
    /// Extra TOML appended to the `[engine]` table (keys of that table only).
    pub engine_extra: String,
    /// Extra TOML tables appended at the end of the file.
    pub extra_tables: String,
    pub env: Vec<(String, String)>,
    /// With `[server.tls]` in `extra_tables`: the client configuration the
    /// launcher's readiness check and HTTP helpers use.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            allow_private_addresses: true,
            allowed_domains: Vec::new(),
            dns_server: None,
            ca_file: None,
            http_channel: true,
            shard_count: 16,
            engine_extra: String::new(),
            extra_tables: String::new(),
            env: Vec::new(),
            tls: None,
        }
    }
}

impl EngineConfig {
    /// The `[engine]` table and what follows it; the launcher adds the rest.
    fn config_text(&self) -> String {
        let quote = |s: &str| format!("{s:?}");
        let mut text = format!("[engine]\nshard_count = {}\n{}\n\n", self.shard_count, self.engine_extra);
        if self.http_channel {
            text.push_str(&format!(
                "[engine.channels.http]\nallow_private_addresses = {}\nallowed_domains = [{}]\ndns_servers = [{}]\nextra_ca_files = [{}]\n\n",
                self.allow_private_addresses,
                self.allowed_domains.iter().map(|d| quote(d)).collect::<Vec<_>>().join(", "),
                self.dns_server.map(|a| quote(&a.to_string())).unwrap_or_default(),
                self.ca_file.as_ref().map(|p| quote(&p.display().to_string())).unwrap_or_default(),
            ));
        } else {
            text.push_str("[engine.channels]\n\n");
        }
        text.push_str(&self.extra_tables);
        text
    }

    fn launch(&self) -> Launch {
        // Idle shards look for work every 100 ms, so tests need not wait a second.
        let mut env = vec![("FANOUT__ENGINE__DISPATCH__POLL_INTERVAL_MS".to_string(), "100".to_string())];
        env.extend(self.env.iter().cloned());
        Launch { env, tls: self.tls.clone(), ..Launch::new(fanout_binary(), self.config_text()) }
    }
}

/// A running engine started from an [`EngineConfig`]. Everything else (ports,
/// gRPC clients, log, kill -9, SIGTERM, restart) is the launcher's [`Engine`].
pub struct Fanout {
    engine: Engine,
    config: EngineConfig,
}

impl Fanout {
    pub async fn start(config: EngineConfig) -> anyhow::Result<Self> {
        let engine = Engine::start(config.launch()).await?;
        Ok(Self { engine, config })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Takes effect at the next `restart`.
    pub fn set_config(&mut self, config: EngineConfig) {
        self.engine.set_launch(config.launch());
        self.config = config;
    }
}

impl Deref for Fanout {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl DerefMut for Fanout {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
}
