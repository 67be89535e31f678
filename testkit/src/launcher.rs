//! Runs the real `fanout` binary, for the end-to-end tests and the load
//! harness alike: writes its config into a temporary directory, starts it on
//! free 127.0.0.1 ports, waits until /readyz answers, and kills (SIGKILL),
//! terminates (SIGTERM) or restarts it on demand. Its log is kept in the
//! directory for failure messages and log checks.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_proto::v1::publish_service_client::PublishServiceClient;
use tonic::transport::Channel;

/// Log lines quoted in an error when the engine does not start.
const LOG_TAIL_LINES: usize = 100;

/// What to start, and how.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The `fanout` binary ([`build_binary`] makes one).
    pub binary: PathBuf,
    /// TOML written after the launcher's own `[server]`, `[store]` and
    /// `[log]` tables: `[engine]` and its sub-tables.
    pub config: String,
    /// Extra environment, e.g. `FANOUT__<TABLE>__<KEY>` overrides.
    pub env: Vec<(String, String)>,
    /// `log.level`.
    pub log_level: String,
    /// `server.drain_timeout_seconds`.
    pub drain_timeout_seconds: u64,
    /// The store's directory; by default `data/` in the engine's temporary
    /// directory, so it survives a restart but not the [`Engine`].
    pub data_dir: Option<PathBuf>,
    /// How long the engine may take to answer /readyz.
    pub start_timeout: Duration,
    /// When the engine's listeners speak TLS (`[server.tls]`): the client
    /// configuration the launcher's own HTTP requests use.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Launch {
    /// `binary` with `config`, logging at info, draining for 5 s, 30 s to start.
    pub fn new(binary: impl Into<PathBuf>, config: impl Into<String>) -> Launch {
        Launch {
            binary: binary.into(),
            config: config.into(),
            env: Vec::new(),
            log_level: "info".into(),
            drain_timeout_seconds: 5,
            data_dir: None,
            start_timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

/// A running `fanout serve`. Killed when dropped.
pub struct Engine {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The HTTP API listener (spec 003's registration endpoints).
    pub api: SocketAddr,
    /// Holds the config file, the log and, by default, the store.
    pub dir: tempfile::TempDir,
    launch: Launch,
    child: Option<Child>,
}

impl Engine {
    /// Starts the engine on free ports and waits until it is ready.
    pub async fn start(launch: Launch) -> anyhow::Result<Engine> {
        let mut engine = Engine {
            grpc: SocketAddr::from(([127, 0, 0, 1], free_port())),
            http: SocketAddr::from(([127, 0, 0, 1], free_port())),
            api: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::Builder::new().prefix("fanout-engine-").tempdir()?,
            launch,
            child: None,
        };
        // A free port can be taken between our check and the engine's bind:
        // try again on new ports when that is why the start failed.
        for _ in 0..3 {
            match engine.spawn().await {
                Err(e) if e.to_string().contains("cannot listen") => {
                    engine.grpc.set_port(free_port());
                    engine.http.set_port(free_port());
                    engine.api.set_port(free_port());
                }
                other => return other.map(|()| engine),
            }
        }
        engine.spawn().await?;
        Ok(engine)
    }

    /// The config file's text: the launcher's tables, then the caller's.
    fn config_text(&self) -> String {
        let data = self.launch.data_dir.clone().unwrap_or_else(|| self.dir.path().join("data"));
        format!(
            "[server]\ngrpc_listen = \"{}\"\nhttp_listen = \"{}\"\napi_listen = \"{}\"\ndrain_timeout_seconds = {}\n\n\
             [store]\npath = {:?}\n\n[log]\nlevel = {:?}\n\n{}",
            self.grpc,
            self.http,
            self.api,
            self.launch.drain_timeout_seconds,
            data.display().to_string(),
            self.launch.log_level,
            self.launch.config,
        )
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let config_path = self.dir.path().join("fanout.toml");
        std::fs::write(&config_path, self.config_text())?;
        // Appended, so a restarted engine's log follows the earlier one's.
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("fanout.log"))?;
        let child = Command::new(&self.launch.binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .envs(self.launch.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.launch.binary.display()))?;
        self.child = Some(child);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let timeout = self.launch.start_timeout;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("fanout exited during start ({status}); log:\n{}", self.log_tail(LOG_TAIL_LINES));
            }
            if self.http_get("/readyz").await.is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("fanout was not ready within {timeout:?}; log:\n{}", self.log_tail(LOG_TAIL_LINES))
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn binary(&self) -> &Path {
        &self.launch.binary
    }

    pub fn launch(&self) -> &Launch {
        &self.launch
    }

    /// Takes effect at the next [`restart`](Engine::restart).
    pub fn set_launch(&mut self, launch: Launch) {
        self.launch = launch;
    }

    /// The engine's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fanout.log")).unwrap_or_default()
    }

    /// The last `lines` lines of the engine's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// GET on the engine's HTTP port: (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        match &self.launch.tls {
            Some(tls) => crate::tls_client::https_request(self.http, tls, "GET", path, &[], b"").await,
            None => http_get(self.http, path).await,
        }
    }

    /// A request to the engine's HTTP API port: (status, body).
    pub async fn api_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<(u16, String)> {
        match &self.launch.tls {
            Some(tls) => crate::tls_client::https_request(self.api, tls, method, path, headers, body).await,
            None => http_request(self.api, method, path, headers, body).await,
        }
    }

    pub async fn notifications(&self) -> anyhow::Result<NotificationServiceClient<Channel>> {
        Ok(NotificationServiceClient::connect(format!("http://{}", self.grpc)).await?)
    }

    pub async fn publisher(&self) -> anyhow::Result<PublishServiceClient<Channel>> {
        Ok(PublishServiceClient::connect(format!("http://{}", self.grpc)).await?)
    }

    /// SIGKILL: no drain, no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the process freezes mid-whatever (its sockets stay open, its
    /// timers stop), as a long stall would freeze it.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal("-STOP")
    }

    /// SIGCONT after [`Engine::pause`].
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid().context("not running")?;
        let status = Command::new("kill").args([signal, &pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill {signal} {pid} failed");
        Ok(())
    }

    /// SIGTERM, and the exit status once it exited (SIGKILL after 30 s).
    pub fn terminate(&mut self) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("not running")?;
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("fanout did not exit within 30 s of SIGTERM; log:\n{}", self.log_tail(LOG_TAIL_LINES));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and the exit status once it exited, without blocking the
    /// runtime: a graceful stop (SIGKILL after `within`).
    pub async fn stop(&mut self, within: Duration) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("not running")?;
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("fanout did not exit within {within:?} of SIGTERM; log:\n{}", self.log_tail(LOG_TAIL_LINES));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the process again (SIGKILL first if it runs) on the same ports,
    /// directory and store, with the current [`Launch`].
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn().await
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A free TCP port on 127.0.0.1 (released before use; good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Builds the `fanout` binary with cargo (release or debug), with the same
/// cargo and target directory as the caller, and returns its path.
pub fn build_binary(release: bool) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["build", "--quiet", "-p", "fanout-api", "--bin", "fanout"]).current_dir(workspace_dir());
    if release {
        command.arg("--release");
    }
    let status = command.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build of the fanout binary failed");
    }
    // A private hard link (a copy across devices): another build into the
    // same target directory (a second checkout sharing CARGO_TARGET_DIR)
    // replaces the file, not this process's link, so engines started later
    // in this process still run what this process built. Links of processes
    // that are gone are removed.
    let built = target_dir().join(if release { "release" } else { "debug" }).join("fanout");
    let links = target_dir().join("private-bin");
    if let Ok(entries) = std::fs::read_dir(&links) {
        for entry in entries.flatten() {
            let alive = entry.file_name().to_str().is_some_and(|pid| Path::new("/proc").join(pid).exists());
            if !alive {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = links.join(std::process::id().to_string()).join(if release { "release" } else { "debug" });
    std::fs::create_dir_all(&dir)?;
    // Linked (or copied) under a name of its own, then renamed over
    // `private`: tests of one process call this at once, and a copy onto a
    // `private` that another call had just linked to `built` truncated the
    // build's own binary to 0 bytes, which cargo then took as up to date.
    static STAGED: AtomicU64 = AtomicU64::new(0);
    let staged = dir.join(format!("fanout.{}", STAGED.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_file(&staged);
    if std::fs::hard_link(&built, &staged).is_err() {
        std::fs::copy(&built, &staged).with_context(|| format!("copying {}", built.display()))?;
    }
    let private = dir.join("fanout");
    std::fs::rename(&staged, &private)
        .with_context(|| format!("renaming {} over {}", staged.display(), private.display()))?;
    Ok(private)
}

/// `FANOUT__STORE__*` overrides ([`Launch::env`]) that start an engine on
/// the ScyllaDB backend at `nodes` (host:port contact points) in `keyspace`,
/// creating its schema there: the launcher's own `[store]` table is redb's.
pub fn scylla_store_env(nodes: &[String], keyspace: &str) -> Vec<(String, String)> {
    let nodes = toml::Value::Array(nodes.iter().map(|n| toml::Value::String(n.clone())).collect());
    vec![
        ("FANOUT__STORE__BACKEND".into(), "scylla".into()),
        ("FANOUT__STORE__SCYLLA__NODES".into(), nodes.to_string()),
        ("FANOUT__STORE__SCYLLA__KEYSPACE".into(), keyspace.to_owned()),
        ("FANOUT__STORE__SCYLLA__MIGRATE".into(), "true".into()),
    ]
}

/// `$CARGO_TARGET_DIR` (relative to the workspace when relative), else the
/// workspace's `target/`.
pub fn target_dir() -> PathBuf {
    let workspace = workspace_dir();
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
    if target.is_absolute() { target } else { workspace.join(target) }
}

/// The workspace: the parent of the running crate's manifest directory as
/// cargo sets it at run time (every member lies one level down), else of
/// testkit's at build time. Run time first: a target directory shared by
/// several checkouts may hold a testkit built in one that is gone since.
pub fn workspace_dir() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let manifest = manifest.filter(|m| m.join("Cargo.toml").is_file());
    let manifest = manifest.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().expect("a workspace member lies in the workspace").to_path_buf()
}

/// A minimal HTTP/1.1 request over plain TCP: (status, body).
pub async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<(u16, String)> {
    let stream = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await??;
    crate::tls_client::exchange(stream, addr, method, path, headers, body).await
}

/// A minimal HTTP/1.1 GET over plain TCP: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(addr, "GET", path, &[], b"").await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped_engine(launch: Launch) -> Engine {
        Engine {
            grpc: "127.0.0.1:1".parse().unwrap(),
            http: "127.0.0.1:2".parse().unwrap(),
            api: "127.0.0.1:3".parse().unwrap(),
            dir: tempfile::tempdir().unwrap(),
            launch,
            child: None,
        }
    }

    #[test]
    fn the_config_has_the_launchers_tables_then_the_callers() {
        let launch = Launch {
            log_level: "warn".into(),
            drain_timeout_seconds: 2,
            ..Launch::new("/bin/false", "[engine]\nshard_count = 32\n[engine.delivery]\nworkers = 2\n")
        };
        let engine = stopped_engine(launch);
        let parsed: toml::Table = toml::from_str(&engine.config_text()).unwrap();
        assert_eq!(parsed["server"]["grpc_listen"].as_str(), Some("127.0.0.1:1"));
        assert_eq!(parsed["server"]["http_listen"].as_str(), Some("127.0.0.1:2"));
        assert_eq!(parsed["server"]["drain_timeout_seconds"].as_integer(), Some(2));
        let data = engine.dir.path().join("data").display().to_string();
        assert_eq!(parsed["store"]["path"].as_str(), Some(data.as_str()));
        assert_eq!(parsed["log"]["level"].as_str(), Some("warn"));
        assert_eq!(parsed["engine"]["shard_count"].as_integer(), Some(32));
        assert_eq!(parsed["engine"]["delivery"]["workers"].as_integer(), Some(2));

        let kept = stopped_engine(Launch { data_dir: Some("/tmp/kept".into()), ..Launch::new("/bin/false", "") });
        let parsed: toml::Table = toml::from_str(&kept.config_text()).unwrap();
        assert_eq!(parsed["store"]["path"].as_str(), Some("/tmp/kept"));
    }

    #[tokio::test]
    async fn a_binary_that_exits_at_once_fails_the_start_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fanout");
        std::fs::write(&script, "#!/bin/sh\necho 'config error: engine.nope is unknown' >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let err = Engine::start(Launch::new(&script, "")).await.err().expect("must not start");
        let text = format!("{err:#}");
        assert!(text.contains("exited during start"), "{text}");
        assert!(text.contains("engine.nope is unknown"), "{text}");
    }
}
