//! A real HTTP CONNECT proxy for the outbound proxy tests: Debian's
//! tinyproxy (`FANOUT_TEST_TINYPROXY`), run in the foreground on a loopback
//! port with Basic authentication, logging each CONNECT request line, so a
//! test can read which destinations the engine asked it for.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// The user and password the proxy demands.
pub const USER: &str = "fanout-proxy";
pub const PASSWORD: &str = "proxy-s3cret-2f9c";

pub struct Tinyproxy {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    /// Starts `binary` on `port` (0: a free one) and waits until it accepts.
    pub async fn start(binary: &str, port: u16) -> anyhow::Result<Self> {
        let port = if port == 0 { free_port()? } else { port };
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("tinyproxy.log");
        // No ConnectPort line: CONNECT to any port (the mocks' are ephemeral).
        let config = format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 200\nLogFile {log:?}\nLogLevel Connect\n\
             BasicAuth {USER} {PASSWORD}\n"
        );
        let config_file = dir.path().join("tinyproxy.conf");
        std::fs::write(&config_file, config)?;
        let child = Command::new(binary)
            .arg("-d")
            .arg("-c")
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {binary}"))?;
        let proxy = Self { child, port, log, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "tinyproxy did not listen on {port}: {}", proxy.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(proxy)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`: the engine's `[engine.outbound_proxy] url`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The authorities (`host:port`) of every CONNECT request it was sent.
    pub fn connects(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter_map(|line| line.split_once("): CONNECT ").map(|(_, rest)| rest))
            .filter_map(|rest| rest.split_whitespace().next().map(str::to_owned))
            .collect()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
}
