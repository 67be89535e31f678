//! Runs the real `fanout` binary for end-to-end tests: builds it once, writes a
//! config into a temporary directory, starts it on free 127.0.0.1 ports, waits
//! until it is ready, and kills or terminates it on demand.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_proto::v1::publish_service_client::PublishServiceClient;
use tonic::transport::Channel;

/// How long a started engine may take to answer /readyz.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The path of the `fanout` binary, built (once per test process) with the
/// same cargo and target directory as the tests, so it is never stale.
pub fn fanout_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "fanout-api", "--bin", "fanout"])
            .current_dir(&workspace)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build of the fanout binary failed");
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
        let target = if target.is_absolute() { target } else { workspace.join(target) };
        target.join("debug").join("fanout")
    })
}

/// A free TCP port on 127.0.0.1 (released before use; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
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
        }
    }
}

/// A running engine process.
pub struct Fanout {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub dir: tempfile::TempDir,
    config: EngineConfig,
    child: Option<Child>,
}

impl Fanout {
    pub async fn start(config: EngineConfig) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut fanout = Self {
            grpc: SocketAddr::from(([127, 0, 0, 1], free_port())),
            http: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir,
            config,
            child: None,
        };
        // A free port can be taken between our check and the engine's bind:
        // try again on new ports when that is why the start failed.
        for _ in 0..3 {
            match fanout.spawn().await {
                Err(e) if e.to_string().contains("cannot listen") => {
                    fanout.grpc.set_port(free_port());
                    fanout.http.set_port(free_port());
                }
                other => return other.map(|()| fanout),
            }
        }
        fanout.spawn().await?;
        Ok(fanout)
    }

    fn config_text(&self) -> String {
        let c = &self.config;
        let quote = |s: &str| format!("{s:?}");
        let mut text = format!(
            "[server]\ngrpc_listen = \"{}\"\nhttp_listen = \"{}\"\ndrain_timeout_seconds = 5\n\n\
             [store]\npath = {}\n\n[log]\nlevel = \"info\"\n\n\
             [engine]\nshard_count = {}\n{}\n\n",
            self.grpc,
            self.http,
            quote(&self.dir.path().join("data").display().to_string()),
            c.shard_count,
            c.engine_extra,
        );
        if c.http_channel {
            text.push_str(&format!(
                "[engine.channels.http]\nallow_private_addresses = {}\nallowed_domains = [{}]\ndns_servers = [{}]\nextra_ca_files = [{}]\n\n",
                c.allow_private_addresses,
                c.allowed_domains.iter().map(|d| quote(d)).collect::<Vec<_>>().join(", "),
                c.dns_server.map(|a| quote(&a.to_string())).unwrap_or_default(),
                c.ca_file.as_ref().map(|p| quote(&p.display().to_string())).unwrap_or_default(),
            ));
        } else {
            text.push_str("[engine.channels]\n\n");
        }
        text.push_str(&c.extra_tables);
        text
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let config_path = self.dir.path().join("fanout.toml");
        std::fs::write(&config_path, self.config_text())?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("fanout.log"))?;
        let child = Command::new(fanout_binary())
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            // Idle shards look for work every 100 ms, so tests need not wait a second.
            .env("FANOUT__ENGINE__DISPATCH__POLL_INTERVAL_MS", "100")
            .envs(self.config.env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start fanout")?;
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("fanout exited during start ({status}); log:\n{}", self.log());
            }
            if http_get(self.http, "/readyz").await.is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("fanout was not ready within {START_TIMEOUT:?}; log:\n{}", self.log())
    }

    /// The engine's log so far (for failure messages and log-privacy checks).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fanout.log")).unwrap_or_default()
    }

    pub async fn notifications(&self) -> anyhow::Result<NotificationServiceClient<Channel>> {
        Ok(NotificationServiceClient::connect(format!("http://{}", self.grpc)).await?)
    }

    pub async fn publisher(&self) -> anyhow::Result<PublishServiceClient<Channel>> {
        Ok(PublishServiceClient::connect(format!("http://{}", self.grpc)).await?)
    }

    /// GET on the engine's HTTP port: (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.http, path).await
    }

    /// SIGKILL: no drain, no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("not running")?;
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("fanout did not exit within 30 s of SIGTERM; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Takes effect at the next `restart`.
    pub fn set_config(&mut self, config: EngineConfig) {
        self.config = config;
    }

    /// Starts the process again on the same ports, config and data directory.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn().await
    }
}

impl Drop for Fanout {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A minimal HTTP/1.1 GET over a plain TCP socket.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await??;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}
