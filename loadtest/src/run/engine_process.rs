//! The engine under test as a subprocess: finds (or builds) the `fanout`
//! binary, writes its config into a temporary directory, starts it on free
//! 127.0.0.1 ports, waits for /readyz, samples its memory and CPU from /proc,
//! reads its /metrics, and kills it when dropped.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// A running `fanout serve`.
pub struct EngineProcess {
    child: Child,
    pub pid: u32,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub binary: PathBuf,
    dir: tempfile::TempDir,
}

/// The binary to run: `explicit`, else `$CARGO_TARGET_DIR` (or the
/// workspace's `target/`) `release/fanout`, then `debug/fanout`; else builds
/// the release binary with cargo.
pub fn find_binary(explicit: Option<&Path>, on_build: impl FnOnce()) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if !path.is_file() {
            bail!("--engine-bin {} is not a file", path.display());
        }
        return Ok(path.to_path_buf());
    }
    let target = target_dir();
    for profile in ["release", "debug"] {
        let candidate = target.join(profile).join("fanout");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    on_build();
    build_binary(true)
}

/// Builds `fanout` with cargo (`release` or debug) and returns its path.
pub fn build_binary(release: bool) -> anyhow::Result<PathBuf> {
    let workspace = workspace_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "fanout-api", "--bin", "fanout"]).current_dir(&workspace);
    if release {
        cmd.arg("--release");
    }
    eprintln!("building the fanout binary ({})...", if release { "release" } else { "debug" });
    let status = cmd.status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build of the fanout binary failed");
    }
    Ok(target_dir().join(if release { "release" } else { "debug" }).join("fanout"))
}

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("loadtest has a parent").to_path_buf()
}

fn target_dir() -> PathBuf {
    let workspace = workspace_dir();
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
    if target.is_absolute() { target } else { workspace.join(target) }
}

/// A free TCP port on 127.0.0.1 (released before use).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The engine's config: listen addresses, the store in `data_dir`, the
/// scenario's `[engine]` overrides, and the HTTPS channel allowed to reach
/// 127.0.0.1 and trusting `ca_file`.
pub fn config_text(
    grpc: SocketAddr,
    http: SocketAddr,
    data_dir: &Path,
    engine: &toml::Table,
    ca_file: &Path,
) -> anyhow::Result<String> {
    let mut engine = engine.clone();
    let channels = table_at(&mut engine, "channels")?;
    let http_channel = table_at(channels, "http")?;
    http_channel.insert("allow_private_addresses".into(), true.into());
    let ca = toml::Value::String(ca_file.display().to_string());
    match http_channel.get_mut("extra_ca_files").and_then(toml::Value::as_array_mut) {
        Some(files) => files.push(ca),
        None => {
            http_channel.insert("extra_ca_files".into(), toml::Value::Array(vec![ca]));
        }
    }
    let mut root = toml::Table::new();
    let mut server = toml::Table::new();
    server.insert("grpc_listen".into(), grpc.to_string().into());
    server.insert("http_listen".into(), http.to_string().into());
    server.insert("drain_timeout_seconds".into(), 2.into());
    let mut store = toml::Table::new();
    store.insert("path".into(), data_dir.display().to_string().into());
    let mut log = toml::Table::new();
    log.insert("level".into(), "warn".into());
    root.insert("server".into(), server.into());
    root.insert("store".into(), store.into());
    root.insert("log".into(), log.into());
    root.insert("engine".into(), engine.into());
    Ok(toml::to_string(&root)?)
}

/// The sub-table `key` of `table`, created when absent.
fn table_at<'a>(table: &'a mut toml::Table, key: &str) -> anyhow::Result<&'a mut toml::Table> {
    table
        .entry(key.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .with_context(|| format!("engine.{key} must be a table"))
}

impl EngineProcess {
    /// Starts `binary` with `engine` overrides; the store lives in `data_dir`
    /// or, by default, in the temporary directory.
    pub async fn start(
        binary: &Path,
        engine: &toml::Table,
        ca_file: &Path,
        data_dir: Option<&Path>,
        start_timeout: Duration,
    ) -> anyhow::Result<EngineProcess> {
        let dir = tempfile::Builder::new().prefix("fanout-loadtest-engine-").tempdir()?;
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let data = data_dir.map_or_else(|| dir.path().join("data"), Path::to_path_buf);
        let config_path = dir.path().join("fanout.toml");
        std::fs::write(&config_path, config_text(grpc, http, &data, engine, ca_file)?)?;
        let log = std::fs::File::create(dir.path().join("fanout.log"))?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut engine = EngineProcess { pid: child.id(), child, grpc, http, binary: binary.to_path_buf(), dir };
        engine.wait_ready(start_timeout).await?;
        Ok(engine)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("fanout exited during start ({status}); log:\n{}", self.log_tail());
            }
            if http_get(self.http, "/readyz").await.is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("fanout was not ready within {timeout:?}; log:\n{}", self.log_tail())
    }

    /// The last lines of the engine's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("fanout.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One reading of a process's memory and CPU time.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub rss_kib: u64,
    /// Peak resident set (VmHWM) so far.
    pub hwm_kib: u64,
    /// utime + stime, seconds.
    pub cpu_seconds: f64,
}

/// Reads /proc/<pid>/status and /proc/<pid>/stat (Linux only).
pub fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(ProcSample { rss_kib: kib("VmRSS:")?, hwm_kib: kib("VmHWM:")?, cpu_seconds: parse_stat_cpu(&stat)? })
}

/// utime + stime (fields 14 and 15 of /proc/<pid>/stat) in seconds.
fn parse_stat_cpu(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks() as f64)
}

/// `getconf CLK_TCK`, usually 100.
pub fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// The engine's `fanout_*` samples (histogram buckets left out), by
/// `name{labels}` as printed.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| l.starts_with("fanout_"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (!name.contains("_bucket{")).then_some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// GET /metrics on the engine's HTTP address.
pub async fn fetch_metrics(http: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let (status, body) = http_get(http, "/metrics").await?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    Ok(parse_metrics(&body))
}

/// A minimal HTTP/1.1 GET over plain TCP: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await??;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_merges_overrides_and_forces_the_test_channel() {
        let overrides: toml::Table =
            toml::from_str("shard_count = 32\n[delivery]\nworkers = 2\n[channels.http]\nallowed_domains = []").unwrap();
        let text = config_text(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            Path::new("/tmp/data"),
            &overrides,
            Path::new("/tmp/ca.pem"),
        )
        .unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(parsed["server"]["grpc_listen"].as_str(), Some("127.0.0.1:1"));
        assert_eq!(parsed["engine"]["shard_count"].as_integer(), Some(32));
        assert_eq!(parsed["engine"]["delivery"]["workers"].as_integer(), Some(2));
        let http = &parsed["engine"]["channels"]["http"];
        assert_eq!(http["allow_private_addresses"].as_bool(), Some(true));
        assert_eq!(http["extra_ca_files"][0].as_str(), Some("/tmp/ca.pem"));
    }

    #[test]
    fn parses_proc_stat_and_metrics() {
        let stat = "123 (fan out) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0";
        assert_eq!(parse_stat_cpu(stat), Some(300.0 / clock_ticks() as f64));
        let sample = proc_sample(std::process::id()).expect("/proc of this process");
        assert!(sample.rss_kib > 0 && sample.hwm_kib >= sample.rss_kib);
        let metrics = parse_metrics(
            "# HELP x\nfanout_deliveries_total{channel=\"http\",outcome=\"delivered\"} 42\n\
             fanout_window_duration_seconds_bucket{le=\"0.1\"} 3\nfanout_windows_total 7\nother 1\n",
        );
        assert_eq!(metrics.len(), 2);
        assert_eq!(metrics["fanout_deliveries_total{channel=\"http\",outcome=\"delivered\"}"], 42.0);
    }
}
