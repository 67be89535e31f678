//! The Pushy comparison: Pushy's validating `MockApnsServer` as
//! the APNs peer of an apns scenario (`--apns-server pushy`), and Pushy's
//! `ApnsClient` sending the same pushes into a fresh one of those servers, so
//! the engine's APNs channel is measured against an independent, widely used
//! APNs client (Java, Netty) into the same server.
//!
//! Both run from the Maven project in `loadtest/pushy` (built here with
//! `mvn -q -B package` when its jar is missing or older than its sources).
//! The server speaks a line protocol on stdout (`P <port>` first, then
//! `A <device token> <payload>` per accepted push and `R <reason>` per
//! rejected one, flushed in batches) and exits when its stdin closes; the
//! client prints one JSON line.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use fanout_testkit::TestPki;
use fanout_testkit::mock;
use fanout_testkit::mock::apns::{ApnsHook, ApnsReply, ApnsTestKey, MockApnsConfig};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;

use super::collector::Collector;
use super::engine_process::{APNS_BUNDLE_ID, APNS_KEY_ID, APNS_TEAM_ID};
use super::ids::RunIds;
use super::scenario::Plan;
use super::sources;

/// How long the server may take to print its port (JVM start, TLS setup).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the server's lines may lag behind the answers (it flushes every 20 ms).
const LINES_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server may take to flush and exit once its stdin closed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Maven's first build downloads Pushy and Netty.
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// Stderr kept from a Java process for an error message.
const STDERR_KEEP: usize = 8 * 1024;

/// The Maven project.
pub fn project_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pushy")
}

/// The runnable classpath once built: the jar and its dependencies.
#[derive(Debug, Clone)]
pub struct Classpath(String);

/// Builds the Maven project when its jar is missing or older than its
/// sources; a clear error when `mvn` or `java` is not installed.
pub fn ensure_built() -> anyhow::Result<Classpath> {
    // One build at a time in this process (tests run side by side).
    static BUILDING: Mutex<()> = Mutex::new(());
    let _building = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let dir = project_dir();
    let jar = dir.join("target/pushy-bench.jar");
    let lib = dir.join("target/lib");
    let classpath = Classpath(format!("{}:{}/*", jar.display(), lib.display()));
    if !tool_runs("java", "-version") {
        bail!("--apns-server pushy needs Java 17 or newer (`java` not found; Debian package openjdk-17-jre-headless)");
    }
    let sources = [dir.join("pom.xml"), dir.join("src")];
    if lib.is_dir()
        && sources::modified(&jar).is_some_and(|built| sources::newer_than(built, &sources, |_| true).is_none())
    {
        return Ok(classpath);
    }
    if !tool_runs("mvn", "-v") {
        bail!(
            "--apns-server pushy builds {} with Maven, which is not installed (Debian package maven; \
             or build it elsewhere with `mvn -q -B package`)",
            dir.display()
        );
    }
    eprintln!("building {} (mvn -q -B package)...", dir.display());
    let child = std::process::Command::new("mvn")
        .args(["-q", "-B", "package"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting mvn")?;
    // Its output is read while it runs (a full pipe would stall it), on a
    // thread bounded by the timeout.
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    let output = match finished.recv_timeout(BUILD_TIMEOUT) {
        Ok(output) => output.context("waiting for mvn")?,
        Err(_) => {
            let _ = std::process::Command::new("kill").arg(&pid).status();
            bail!("mvn package in {} took longer than {BUILD_TIMEOUT:?}", dir.display());
        }
    };
    let status = output.status;
    if !status.success() || !jar.is_file() {
        bail!(
            "mvn package in {} failed ({status}):\n{}{}",
            dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(classpath)
}

fn tool_runs(tool: &str, arg: &str) -> bool {
    std::process::Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The files the Java processes read, in a directory of their own: the
/// server's certificate chain and key, the CA, the provider key (.p8) and
/// its public half, the device tokens.
pub struct PushyFiles {
    dir: tempfile::TempDir,
}

impl PushyFiles {
    /// Writes them for `pki`, `key` and the devices of `plan`'s recipients
    /// under `ids` (their ids in hex).
    pub fn write(pki: &TestPki, key: &ApnsTestKey, plan: &Plan, ids: RunIds) -> anyhow::Result<PushyFiles> {
        let dir = tempfile::Builder::new().prefix("fanout-loadtest-pushy-").tempdir()?;
        let files = PushyFiles { dir };
        std::fs::write(files.path("chain.pem"), pki.server_cert_chain_pem())?;
        std::fs::write(files.path("server-key.pem"), pki.server_key_pkcs8_pem())?;
        pki.write_ca(&files.path("ca.pem"))?;
        key.write_p8(&files.path("apns-key.p8"))?;
        std::fs::write(files.path("apns-key.pub.pem"), &key.public_pem)?;
        let mut list = String::new();
        for recipient in 0..plan.recipients {
            list.push_str(&hex::encode(ids.recipient_id(recipient)));
            list.push('\n');
        }
        std::fs::write(files.path("tokens.txt"), list)?;
        Ok(files)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// One line of the server's stdout.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// `P <port>`: listening (the first line).
    Port(u16),
    /// `A <device token> <payload>`: accepted after Pushy's validation.
    Accepted { token: &'a str, payload: &'a str },
    /// `R <reason>`: rejected, with Pushy's `RejectionReason` name.
    Rejected(&'a str),
}

/// Parses one line (without its newline); `None` for anything else.
pub fn parse_line(line: &str) -> Option<Line<'_>> {
    let (kind, rest) = line.split_once(' ')?;
    match kind {
        "P" => rest.trim().parse().ok().map(Line::Port),
        "A" => {
            let (token, payload) = rest.split_once(' ')?;
            (!token.is_empty()).then_some(Line::Accepted { token, payload })
        }
        "R" if !rest.trim().is_empty() => Some(Line::Rejected(rest.trim())),
        _ => None,
    }
}

/// What a server's lines said.
#[derive(Debug, Default)]
pub struct ServerCounts {
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    /// Lines of no known form.
    pub garbled: AtomicU64,
    pub first_rejection: Mutex<Option<String>>,
}

/// A running Pushy `MockApnsServer` (validating) on 127.0.0.1.
pub struct PushyServer {
    child: Child,
    stdin: Option<ChildStdin>,
    port: u16,
    reader: JoinHandle<()>,
    stderr: JoinHandle<String>,
    pub counts: Arc<ServerCounts>,
    /// Lines go to the collector only from the end of the warm-up on.
    forward: Arc<AtomicBool>,
}

/// How Pushy's server runs, in every phase of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// Netty event-loop threads.
    pub threads: usize,
    /// Pushy's validating handler (device tokens, topics, every provider
    /// token's ES256 signature); `false`: its accept-all handler, whose
    /// per-push cost does not cap every client at the same rate.
    pub validate: bool,
}

impl PushyServer {
    /// Starts the server with `options`, trusting the provider key of
    /// `files` for the harness's team and key ids, with its devices
    /// registered for the bundle id. Every line is counted, and
    /// goes to `collector` when given (the engine's phase) once
    /// [`PushyServer::warm_up`] is done.
    pub async fn start(
        classpath: &Classpath,
        files: &PushyFiles,
        options: ServerOptions,
        collector: Option<Arc<Collector>>,
    ) -> anyhow::Result<PushyServer> {
        let mut command = java(classpath);
        command.arg("server").args(["--port", "0", "--threads", &options.threads.max(1).to_string()]);
        command.args(["--validate", if options.validate { "true" } else { "false" }]);
        for (flag, file) in [
            ("--cert-chain", "chain.pem"),
            ("--private-key", "server-key.pem"),
            ("--tokens", "tokens.txt"),
            ("--verification-key", "apns-key.pub.pem"),
        ] {
            command.arg(flag).arg(files.path(file));
        }
        command.args(["--team-id", APNS_TEAM_ID, "--key-id", APNS_KEY_ID, "--bundle-id", APNS_BUNDLE_ID]);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting Pushy's mock server (java)")?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::with_capacity(1 << 18, child.stdout.take().context("the server's stdout")?);
        let stderr = keep_stderr(child.stderr.take().context("the server's stderr")?);
        let mut first = String::new();
        let read = tokio::time::timeout(START_TIMEOUT, stdout.read_line(&mut first)).await;
        let port = match (read, parse_line(first.trim_end())) {
            (Ok(Ok(_)), Some(Line::Port(port))) => port,
            _ => {
                let _ = child.start_kill();
                let err = tokio::time::timeout(STOP_TIMEOUT, stderr).await.ok().and_then(Result::ok);
                bail!("Pushy's mock server did not start: {first:?}\n{}", err.unwrap_or_default());
            }
        };
        let counts = Arc::new(ServerCounts::default());
        let forward = Arc::new(AtomicBool::new(false));
        let reader = {
            let (counts, forward) = (counts.clone(), forward.clone());
            tokio::spawn(async move {
                let mut line = String::new();
                loop {
                    line.clear();
                    match stdout.read_line(&mut line).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let collector = collector.as_ref().filter(|_| forward.load(Ordering::Acquire));
                    match parse_line(line.trim_end_matches(['\n', '\r'])) {
                        Some(Line::Accepted { token, payload }) => {
                            counts.accepted.fetch_add(1, Ordering::Relaxed);
                            if let Some(c) = collector {
                                c.apns_accepted(token, payload.as_bytes());
                            }
                        }
                        Some(Line::Rejected(reason)) => {
                            counts.rejected.fetch_add(1, Ordering::Relaxed);
                            let mut first = counts.first_rejection.lock().unwrap_or_else(|p| p.into_inner());
                            first.get_or_insert_with(|| reason.to_owned());
                            if let Some(c) = collector {
                                c.apns_rejected(reason);
                            }
                        }
                        Some(Line::Port(_)) | None => {
                            // Unreadable: counted against the run, which then fails.
                            counts.garbled.fetch_add(1, Ordering::Relaxed);
                            if let Some(c) = collector {
                                c.apns_rejected("UNREADABLE_LINE");
                            }
                        }
                    }
                }
            })
        };
        Ok(PushyServer { child, stdin, port, reader, stderr, counts, forward })
    }

    /// Warms the server up before the measured traffic: Pushy's client
    /// sends `warmup` pushes of `pushes_file` (devices of this server) so
    /// the JVM has compiled the server's path, as in Pushy's own runs,
    /// where its warm-up goes to the same server. Their lines are counted,
    /// not given to the collector (nor any line before
    /// [`PushyServer::forward_to_collector`]). Fails when one was rejected.
    pub async fn warm_up(
        &self,
        classpath: &Classpath,
        files: &PushyFiles,
        pushes_file: &Path,
        warmup: u64,
    ) -> anyhow::Result<()> {
        if warmup > 0 {
            let config = ClientConfig { connections: 2, in_flight: 1000, warmup, threads: 2 };
            let result = run_client(classpath, files, self.port, pushes_file, config, false, START_TIMEOUT).await?;
            self.wait_for_lines(result.warmup_accepted).await;
            let (accepted, rejected) =
                (self.counts.accepted.load(Ordering::Relaxed), self.counts.rejected.load(Ordering::Relaxed));
            if result.warmup_accepted != warmup || accepted != warmup || rejected > 0 {
                let first = self.counts.first_rejection.lock().unwrap_or_else(|p| p.into_inner()).clone();
                bail!(
                    "warming Pushy's mock server up: {} of {warmup} pushes accepted by the client, {accepted} by \
                     the server, {rejected} rejected{}",
                    result.warmup_accepted,
                    first.map(|f| format!(" (first: {f})")).unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    /// Waits until the server's lines have counted `accepted` pushes (it
    /// flushes them every 20 ms), or `LINES_TIMEOUT`.
    pub async fn wait_for_lines(&self, accepted: u64) {
        let deadline = std::time::Instant::now() + LINES_TIMEOUT;
        while self.counts.accepted.load(Ordering::Relaxed) < accepted && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Gives every later line to the collector: the warm-up is over.
    pub fn forward_to_collector(&self) {
        self.forward.store(true, Ordering::Release);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://127.0.0.1:<port>`: its certificate names 127.0.0.1.
    pub fn base_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Closes its stdin: it flushes its last lines and exits; every line
    /// has been read when this returns (or it was killed after a timeout).
    pub async fn shutdown(mut self) {
        drop(self.stdin.take());
        if tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        let _ = tokio::time::timeout(STOP_TIMEOUT, &mut self.reader).await;
        self.reader.abort();
        self.stderr.abort();
    }
}

fn java(classpath: &Classpath) -> Command {
    let mut command = Command::new("java");
    command.arg("-cp").arg(&classpath.0).arg("fanout.pushy.PushyBench");
    command
}

/// Reads a child's stderr to its end, keeping the first `STDERR_KEEP` bytes.
fn keep_stderr(stderr: tokio::process::ChildStderr) -> JoinHandle<String> {
    tokio::spawn(async move {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        let mut stderr = stderr;
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let room = STDERR_KEEP.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

/// How Pushy's client is run: connections, pushes in flight, warm-up.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClientConfig {
    pub connections: usize,
    pub in_flight: usize,
    /// Pushes sent (and answered) before the measured ones: the JVM
    /// compiles the send path, the connections open.
    pub warmup: u64,
    /// Pushy's event-loop threads: min(connections, cores).
    pub threads: usize,
}

/// Pushy's client's result line, with what the server counted.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClientResult {
    pub pushy_version: String,
    pub java_version: String,
    pub connections: usize,
    pub in_flight: usize,
    pub threads: usize,
    pub warmup: u64,
    pub warmup_accepted: u64,
    /// Measured pushes.
    pub pushes: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub unanswered: u64,
    pub first_rejection: Option<String>,
    /// First send to last answer of the measured pushes.
    pub seconds: f64,
    pub pushes_per_second: f64,
    /// The client process's CPU over the measured pushes.
    pub cpu_seconds: f64,
    pub cpu_seconds_total: f64,
    /// Pushes the server accepted, warm-up included (its own count).
    #[serde(default)]
    pub server_accepted: u64,
    #[serde(default)]
    pub server_rejected: u64,
    /// Server lines of no known form.
    #[serde(default)]
    pub server_garbled: u64,
}

impl ClientResult {
    /// Every push accepted by the client's and by the server's count.
    pub fn clean(&self) -> bool {
        self.rejected == 0
            && self.unanswered == 0
            && self.server_garbled == 0
            && self.accepted == self.pushes
            && self.server_rejected == 0
            && self.server_accepted == self.warmup_accepted + self.accepted
    }
}

/// Writes the pushes file of the client: `<token> <collapse id> <body>`.
pub fn write_pushes(path: &Path, pushes: impl Iterator<Item = (String, String, String)>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (token, collapse_id, body) in pushes {
        writeln!(out, "{token} {collapse_id} {body}")?;
    }
    out.flush()?;
    Ok(())
}

/// The server Pushy's client is measured into: a fresh one of the kind the
/// engine's phase has as its APNs peer.
#[derive(Debug, Clone, Copy)]
pub enum ClientPeer {
    /// Pushy's `MockApnsServer` (`--apns-server pushy`).
    Pushy(ServerOptions),
    /// The harness's own mock APNs (`--apns-server rust`): Rust, verifying
    /// every provider token (each distinct one's signature once) and the
    /// request's other APNs rules, answering 200.
    HarnessMock,
}

/// Runs Pushy's client with `config` into a fresh `peer` (Pushy's from
/// `files`, or the harness's with the run's `pki` and provider `key`): the
/// pushes of `pushes_file`, after a warm-up (into the same server), bounded
/// by `timeout`; the result carries the server's own counts too.
#[allow(clippy::too_many_arguments)]
pub async fn measure_client(
    classpath: &Classpath,
    files: &PushyFiles,
    pushes_file: &Path,
    peer: ClientPeer,
    (pki, key): (&TestPki, &ApnsTestKey),
    config: ClientConfig,
    timeout: Duration,
) -> anyhow::Result<ClientResult> {
    let (result, counts) = match peer {
        ClientPeer::Pushy(options) => {
            let server = PushyServer::start(classpath, files, options, None).await?;
            let result = run_client(classpath, files, server.port(), pushes_file, config, true, timeout).await;
            // Every line is read once the server has exited.
            let counts = server.counts.clone();
            server.shutdown().await;
            (result, counts)
        }
        ClientPeer::HarnessMock => {
            let counts = Arc::new(ServerCounts::default());
            let mock = mock::apns::start(pki, harness_mock_config(key, counts.clone())).await?;
            let result = run_client(classpath, files, mock.addr().port(), pushes_file, config, true, timeout).await;
            mock.shutdown().await;
            (result, counts)
        }
    };
    let mut result = result?;
    result.server_accepted = counts.accepted.load(Ordering::Relaxed);
    result.server_rejected = counts.rejected.load(Ordering::Relaxed);
    result.server_garbled = counts.garbled.load(Ordering::Relaxed);
    if result.first_rejection.is_none() {
        result.first_rejection = counts.first_rejection.lock().unwrap_or_else(|p| p.into_inner()).clone();
    }
    Ok(result)
}

/// The harness's mock APNs for Pushy's client: the run's provider key, and a
/// hook counting what it accepted and refused as Pushy's server's lines do.
fn harness_mock_config(key: &ApnsTestKey, counts: Arc<ServerCounts>) -> MockApnsConfig {
    let hook = ApnsHook::new(move |req| match req.refusal {
        Some(refusal) => {
            counts.rejected.fetch_add(1, Ordering::Relaxed);
            let reason = refusal.reason.clone().unwrap_or_else(|| refusal.status.to_string());
            counts.first_rejection.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(reason);
            None
        }
        None => {
            counts.accepted.fetch_add(1, Ordering::Relaxed);
            Some(ApnsReply::ok())
        }
    });
    // Pushy signs with Java's `SHA256withECDSA` (DER), which APNs accepts.
    MockApnsConfig { accept_der_signatures: true, ..super::engine_process::harness_apns_config(key, hook) }
}

/// One run of Pushy's client into the server at `port`: the warm-up, then
/// (when `measure`) every push of `pushes_file`.
async fn run_client(
    classpath: &Classpath,
    files: &PushyFiles,
    port: u16,
    pushes_file: &Path,
    config: ClientConfig,
    measure: bool,
    timeout: Duration,
) -> anyhow::Result<ClientResult> {
    let mut command = java(classpath);
    command.arg("client").args(["--port", &port.to_string()]);
    command.arg("--ca").arg(files.path("ca.pem")).arg("--signing-key").arg(files.path("apns-key.p8"));
    command.args(["--team-id", APNS_TEAM_ID, "--key-id", APNS_KEY_ID, "--bundle-id", APNS_BUNDLE_ID]);
    command.arg("--pushes").arg(pushes_file);
    command.args([
        "--connections",
        &config.connections.to_string(),
        "--in-flight",
        &config.in_flight.to_string(),
        "--threads",
        &config.threads.to_string(),
        "--warmup",
        &config.warmup.to_string(),
        "--timeout-seconds",
        &timeout.as_secs().max(1).to_string(),
        "--measure",
        if measure { "1" } else { "0" },
    ]);
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting Pushy's client (java)")?;
    // The client bounds its own sends by `timeout`; this bounds the JVM.
    let output = tokio::time::timeout(timeout + START_TIMEOUT, child.wait_with_output())
        .await
        .context("Pushy's client did not finish in time")??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("Pushy's client failed ({}): {stdout}{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).context("no result line from Pushy's client")?;
    serde_json::from_str(line).with_context(|| format!("reading Pushy's client's result {line:?}"))
}

/// The comparison in the report: every configuration tried, and the best.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushyReport {
    pub runs: Vec<ClientResult>,
    /// Index in `runs` of the highest pushes/s.
    pub best: usize,
    /// The server's event-loop threads (the engine's phase used the same).
    pub server_threads: usize,
}

impl PushyReport {
    pub fn best(&self) -> Option<&ClientResult> {
        self.runs.get(self.best)
    }

    /// The summary's lines.
    pub fn lines(&self) -> Vec<String> {
        self.runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                format!(
                    "{:.0} pushes/s ({} pushes, {} connection(s), {} in flight, {} thread(s); {} rejected, {} unanswered; \
                     CPU {:.2} s = {:.0} pushes/CPU-s; Pushy {} on Java {}){}",
                    r.pushes_per_second,
                    r.pushes,
                    r.connections,
                    r.in_flight,
                    r.threads,
                    r.rejected + r.server_rejected,
                    r.unanswered,
                    r.cpu_seconds,
                    r.accepted as f64 / r.cpu_seconds.max(1e-9),
                    r.pushy_version,
                    r.java_version,
                    if i == self.best && self.runs.len() > 1 { " best" } else { "" }
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_servers_lines() {
        assert_eq!(parse_line("P 40123"), Some(Line::Port(40123)));
        let payload = r#"{"aps":{"content-available":1},"topic":"dG9w aWM=","sequence_id":"7"}"#;
        assert_eq!(parse_line(&format!("A 0a1b {payload}")), Some(Line::Accepted { token: "0a1b", payload }));
        assert_eq!(parse_line("R INVALID_PROVIDER_TOKEN"), Some(Line::Rejected("INVALID_PROVIDER_TOKEN")));
        for garbled in ["", "P", "P x", "A", "A token", "R ", "X 1", "SLF4J: warning"] {
            assert_eq!(parse_line(garbled), None, "{garbled:?}");
        }
    }

    #[test]
    fn a_client_run_is_clean_only_when_both_counts_agree() {
        let ok = ClientResult {
            warmup: 10,
            warmup_accepted: 10,
            pushes: 100,
            accepted: 100,
            server_accepted: 110,
            ..ClientResult::default()
        };
        assert!(ok.clean());
        assert!(!ClientResult { server_accepted: 109, ..ok.clone() }.clean());
        assert!(!ClientResult { server_rejected: 1, ..ok.clone() }.clean());
        assert!(!ClientResult { accepted: 99, unanswered: 1, ..ok.clone() }.clean());
        let parsed: ClientResult = serde_json::from_str(
            r#"{"pushy_version":"0.15.4","java_version":"17.0.15","connections":1,"in_flight":1000,"threads":1,
            "warmup":50,"warmup_accepted":50,"pushes":200,"accepted":200,"rejected":0,"unanswered":0,
            "first_rejection":null,"seconds":0.5,"pushes_per_second":400.0,"cpu_seconds":0.33,"cpu_seconds_total":1.84}"#,
        )
        .unwrap();
        assert_eq!((parsed.accepted, parsed.connections, parsed.pushes_per_second), (200, 1, 400.0));
    }

    #[test]
    fn summary_marks_the_best_run() {
        let run = |rate: f64| ClientResult {
            pushes_per_second: rate,
            pushes: 10,
            accepted: 10,
            cpu_seconds: 0.5,
            pushy_version: "0.15.4".into(),
            ..ClientResult::default()
        };
        let report = PushyReport { runs: vec![run(100.0), run(300.0)], best: 1, server_threads: 2 };
        let lines = report.lines();
        assert!(lines[1].starts_with("300 pushes/s") && lines[1].ends_with(" best"), "{lines:?}");
        assert!(!lines[0].ends_with(" best") && lines[0].contains("20 pushes/CPU-s"), "{lines:?}");
    }
}
