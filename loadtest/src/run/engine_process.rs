//! The harness's side of the engine under test, around the shared launcher
//! of `fanout-testkit`: which binary to run (building it when there is
//! none), the scenario's `[engine]` table, memory and CPU samples from
//! /proc, and the engine's /metrics.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context as _, bail};
use fanout_testkit::launcher::{build_binary, http_get, scylla_store_env, target_dir, workspace_dir};
use fanout_testkit::mock::apns::{ApnsHook, ApnsTestKey, MockApnsConfig};

use super::sources;

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
            if let Some(source) = newer_source(&candidate, &workspace_dir()) {
                eprintln!(
                    "warning: {} is older than {}: this run measures a stale engine; rebuild it \
                     (cargo build --release -p fanout-api, with the same CARGO_TARGET_DIR) or pass --engine-bin",
                    candidate.display(),
                    source.display()
                );
            }
            return Ok(candidate);
        }
    }
    on_build();
    eprintln!("building the fanout binary (release)...");
    build_binary(true)
}

/// A source of the engine (`*.rs`, `Cargo.toml`, `*.proto` under the
/// workspace's `engine`, `api` and `proto`) changed after `binary` was built,
/// if any: the harness then warns that it is about to measure a stale
/// engine (the binary it found is whatever that target directory last built).
fn newer_source(binary: &Path, workspace: &Path) -> Option<PathBuf> {
    let built = sources::modified(binary)?;
    let roots: Vec<PathBuf> = ["engine", "api", "proto"].iter().map(|d| workspace.join(d)).collect();
    sources::newer_than(built, &roots, |path| {
        path.extension().is_some_and(|e| e == "rs" || e == "proto")
            || path.file_name().is_some_and(|n| n == "Cargo.toml")
    })
}

/// The APNs identities of an apns scenario: the mock expects them in the
/// provider token, the engine sends the bundle id as `apns-topic`.
pub const APNS_KEY_ID: &str = "KEY1234567";
pub const APNS_TEAM_ID: &str = "TEAM123456";
pub const APNS_BUNDLE_ID: &str = "com.example.fanout";

/// The VAPID `sub` the engine signs in webpush scenarios (RFC 8292 section 2.1).
pub const WEBPUSH_SUBJECT: &str = "mailto:loadtest@fanout.test";

/// Where a scenario's pushes go, besides the HTTPS channel every config has.
#[derive(Debug, Clone, Copy)]
pub enum PushTarget<'a> {
    /// Signed webhooks to the mock receivers.
    Webhooks,
    /// `[engine.channels.relay]` posting to `url` (the mock push server)
    /// with the secret in `secret_file`.
    Relay { url: &'a str, secret_file: &'a Path },
    /// `[engine.channels.apns]`, sandbox, both hosts at `url` (the mock
    /// APNs), signing with the `.p8` in `key_file`.
    Apns { url: &'a str, key_file: &'a Path },
    /// `[engine.channels.webpush]` signing VAPID tokens with the PEM in
    /// `vapid_key_file`, allowed to reach the mock push service on 127.0.0.1.
    WebPush { vapid_key_file: &'a Path },
}

/// The store the started engine runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// The embedded redb store, in the launcher's data directory (or `--data-dir`).
    Redb,
    /// ScyllaDB or Cassandra at `nodes`, in `keyspace`: a fresh one per run,
    /// so runs never see each other's recipients, envelopes or shard leases;
    /// created with `replication_factor` (SimpleStrategy).
    Scylla { nodes: Vec<String>, keyspace: String, replication_factor: u8 },
}

impl Store {
    /// `--scylla-nodes`: none is the embedded store; else ScyllaDB with a
    /// keyspace of its own (`fanout_loadtest_` and 16 random hex digits),
    /// `replication_factor` copies of each row.
    pub fn from_nodes(nodes: &[String], replication_factor: u8) -> anyhow::Result<Store> {
        if nodes.is_empty() {
            return Ok(Store::Redb);
        }
        let nodes: Vec<String> = nodes.iter().map(|n| n.trim().to_string()).collect();
        if nodes.iter().any(|n| n.is_empty() || !n.contains(':')) {
            bail!("--scylla-nodes takes host:port contact points, comma-separated");
        }
        let keyspace = format!("fanout_loadtest_{:016x}", rand::random::<u64>());
        Ok(Store::Scylla { nodes, keyspace, replication_factor })
    }

    /// The contact points that are socket addresses (`host:port` with an IP
    /// host); none for the embedded store.
    pub fn contact_points(&self) -> Vec<std::net::SocketAddr> {
        match self {
            Store::Redb => Vec::new(),
            Store::Scylla { nodes, .. } => nodes.iter().filter_map(|n| n.parse().ok()).collect(),
        }
    }

    /// `FANOUT__STORE__*` overrides: the launcher writes `[store]` itself
    /// (redb at its data directory), so the backend is switched the way the
    /// e2e tests do. `migrate`: the fresh keyspace gets its schema at start.
    pub fn env(&self) -> Vec<(String, String)> {
        match self {
            Store::Redb => vec![],
            Store::Scylla { nodes, keyspace, replication_factor } => {
                let mut env = scylla_store_env(nodes, keyspace);
                // A TOML string: the engine reads the variable as TOML.
                let replication =
                    format!("\"{{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}\"");
                env.push(("FANOUT__STORE__SCYLLA__REPLICATION".into(), replication));
                env
            }
        }
    }

    /// Drops a ScyllaDB run's keyspace (the run's engines stopped first).
    pub async fn drop_keyspace(&self) -> anyhow::Result<()> {
        let Store::Scylla { nodes, keyspace, .. } = self else { return Ok(()) };
        let session = scylla::client::session_builder::SessionBuilder::new()
            .known_nodes(nodes)
            .connection_timeout(std::time::Duration::from_secs(10))
            .build()
            .await
            .context("connecting to drop the run's keyspace")?;
        session.query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ()).await?;
        Ok(())
    }

    /// For the report: `redb`, or `scylla keyspace K at N1,N2`.
    pub fn describe(&self) -> String {
        match self {
            Store::Redb => "redb".into(),
            Store::Scylla { nodes, keyspace, replication_factor } => {
                format!("scylla keyspace {keyspace} (replication factor {replication_factor}) at {}", nodes.join(","))
            }
        }
    }
}

/// The engine's `[engine]` table: the scenario's overrides, with the HTTPS
/// channel allowed to reach 127.0.0.1 and trusting `ca_file` (the mocks' CA).
/// The launcher writes the listen addresses, the store and the log level.
pub fn engine_config(engine: &toml::Table, ca_file: &Path) -> anyhow::Result<String> {
    engine_config_for(engine, ca_file, PushTarget::Webhooks)
}

/// `engine_config`, plus the channel table `target` needs, trusting
/// `ca_file`. Its other keys (relay `senders`, APNs `expiration_seconds`,
/// `connections` ...) come from the scenario's table of that channel.
pub fn engine_config_for(engine: &toml::Table, ca_file: &Path, target: PushTarget<'_>) -> anyhow::Result<String> {
    let mut engine = engine.clone();
    let ca_files = || toml::Value::Array(vec![ca_file.display().to_string().into()]);
    match target {
        PushTarget::Webhooks => {}
        PushTarget::Relay { url, secret_file } => {
            let relay = table_at(table_at(&mut engine, "channels")?, "relay")?;
            relay.insert("url".into(), url.into());
            relay.insert("secret_file".into(), secret_file.display().to_string().into());
            relay.insert("extra_ca_files".into(), ca_files());
        }
        PushTarget::Apns { url, key_file } => {
            let apns = table_at(table_at(&mut engine, "channels")?, "apns")?;
            for (key, value) in [
                ("key_file", key_file.display().to_string()),
                ("key_id", APNS_KEY_ID.into()),
                ("team_id", APNS_TEAM_ID.into()),
                ("bundle_id", APNS_BUNDLE_ID.into()),
                ("environment", "sandbox".into()),
                ("sandbox_url", url.into()),
                ("production_url", url.into()),
            ] {
                apns.insert(key.into(), value.into());
            }
            apns.insert("extra_ca_files".into(), ca_files());
        }
        PushTarget::WebPush { vapid_key_file } => {
            let webpush = table_at(table_at(&mut engine, "channels")?, "webpush")?;
            webpush.insert("vapid_key_file".into(), vapid_key_file.display().to_string().into());
            webpush.insert("subject".into(), WEBPUSH_SUBJECT.into());
            webpush.insert("allow_private_addresses".into(), true.into());
            webpush.insert("extra_ca_files".into(), ca_files());
        }
    }
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

/// This process's own CPU time (user + system, seconds).
pub fn own_cpu_seconds() -> Option<f64> {
    parse_stat_cpu(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// The CPU time of this process's children that have been waited for
/// (user + system, seconds, clock-tick resolution): what a child that has
/// ended cost, such as an h2load run.
pub fn children_cpu_seconds() -> Option<f64> {
    parse_stat_children_cpu(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// utime + stime (fields 14 and 15 of /proc/<pid>/stat) in seconds.
fn parse_stat_cpu(stat: &str) -> Option<f64> {
    stat_seconds(stat, 14)
}

/// cutime + cstime (fields 16 and 17 of /proc/<pid>/stat) in seconds.
fn parse_stat_children_cpu(stat: &str) -> Option<f64> {
    stat_seconds(stat, 16)
}

/// Fields `field` and `field + 1` of /proc/<pid>/stat (1-based, as
/// proc(5) numbers them), clock ticks summed and turned into seconds.
fn stat_seconds(stat: &str, field: usize) -> Option<f64> {
    // The command name (field 2) may hold spaces: count from the last ')',
    // after which comes field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(field - 3);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / clock_ticks() as f64)
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

/// The harness's mock APNs of a run: the run's provider key (for the
/// harness's team and key ids), requests counted not kept, `hook` answering.
pub fn harness_apns_config(key: &ApnsTestKey, hook: ApnsHook) -> MockApnsConfig {
    MockApnsConfig {
        team_id: APNS_TEAM_ID.into(),
        key_id: APNS_KEY_ID.into(),
        public_key_pem: Some(key.public_pem.clone()),
        record_requests: false,
        on_request: Some(hook),
        ..MockApnsConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_newer_than_the_binary_is_reported() {
        use std::time::{Duration, SystemTime};
        let workspace = tempfile::tempdir().unwrap();
        let source = workspace.path().join("engine/src/channel/x.rs");
        std::fs::create_dir_all(source.parent().unwrap()).unwrap();
        std::fs::write(&source, "// x").unwrap();
        let binary = workspace.path().join("fanout");
        std::fs::write(&binary, "").unwrap();
        let now = SystemTime::now();
        let set = |path: &Path, at: SystemTime| {
            std::fs::File::options().write(true).open(path).unwrap().set_modified(at).unwrap()
        };
        set(&binary, now);
        set(&source, now - Duration::from_secs(10));
        assert_eq!(newer_source(&binary, workspace.path()), None);
        set(&source, now + Duration::from_secs(10));
        assert_eq!(newer_source(&binary, workspace.path()), Some(source));
        assert_eq!(newer_source(&workspace.path().join("missing"), workspace.path()), None);
    }

    #[test]
    fn config_merges_overrides_and_forces_the_test_channel() {
        let overrides: toml::Table =
            toml::from_str("shard_count = 32\n[delivery]\nworkers = 2\n[channels.http]\nallowed_domains = []").unwrap();
        let text = engine_config(&overrides, Path::new("/tmp/ca.pem")).unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(parsed["engine"]["shard_count"].as_integer(), Some(32));
        assert_eq!(parsed["engine"]["delivery"]["workers"].as_integer(), Some(2));
        let http = &parsed["engine"]["channels"]["http"];
        assert_eq!(http["allow_private_addresses"].as_bool(), Some(true));
        assert_eq!(http["extra_ca_files"][0].as_str(), Some("/tmp/ca.pem"));
        assert_eq!(parsed.len(), 1, "only [engine]: the launcher writes the rest");

        // An apns scenario: the channel at the mock, the scenario's own keys kept.
        let overrides: toml::Table = toml::from_str("[channels.apns]\nexpiration_seconds = 60").unwrap();
        let target = PushTarget::Apns { url: "https://127.0.0.1:8444", key_file: Path::new("/tmp/k.p8") };
        let parsed: toml::Table =
            toml::from_str(&engine_config_for(&overrides, Path::new("/tmp/ca.pem"), target).unwrap()).unwrap();
        let apns = &parsed["engine"]["channels"]["apns"];
        assert_eq!(apns["expiration_seconds"].as_integer(), Some(60));
        assert_eq!(
            (apns["sandbox_url"].as_str(), apns["environment"].as_str()),
            (Some("https://127.0.0.1:8444"), Some("sandbox"))
        );
        assert_eq!(
            (apns["key_file"].as_str(), apns["extra_ca_files"][0].as_str()),
            (Some("/tmp/k.p8"), Some("/tmp/ca.pem"))
        );
        assert_eq!(apns["bundle_id"].as_str(), Some(APNS_BUNDLE_ID));

        // A webpush scenario: the VAPID key, loopback allowed, the mock's CA.
        let overrides: toml::Table = toml::from_str("[channels.webpush]\nttl_seconds = 60").unwrap();
        let target = PushTarget::WebPush { vapid_key_file: Path::new("/tmp/vapid.pem") };
        let parsed: toml::Table =
            toml::from_str(&engine_config_for(&overrides, Path::new("/tmp/ca.pem"), target).unwrap()).unwrap();
        let webpush = &parsed["engine"]["channels"]["webpush"];
        assert_eq!(webpush["ttl_seconds"].as_integer(), Some(60));
        assert_eq!(
            (webpush["vapid_key_file"].as_str(), webpush["subject"].as_str()),
            (Some("/tmp/vapid.pem"), Some(WEBPUSH_SUBJECT))
        );
        assert_eq!(
            (webpush["allow_private_addresses"].as_bool(), webpush["extra_ca_files"][0].as_str()),
            (Some(true), Some("/tmp/ca.pem"))
        );
    }

    #[test]
    fn scylla_store_is_switched_by_environment_with_a_keyspace_per_run() {
        assert_eq!(Store::from_nodes(&[], 1).unwrap(), Store::Redb);
        assert!(Store::Redb.env().is_empty());
        assert_eq!(Store::Redb.describe(), "redb");
        let nodes = vec!["127.0.0.1:9042".to_string(), " 10.0.0.2:9042".to_string()];
        let store = Store::from_nodes(&nodes, 3).unwrap();
        let Store::Scylla { nodes: kept, keyspace, .. } = &store else { panic!("{store:?}") };
        assert_eq!(kept, &["127.0.0.1:9042", "10.0.0.2:9042"]);
        // A valid CQL identifier (letters, digits, underscores; at most 48).
        assert!(keyspace.starts_with("fanout_loadtest_") && keyspace.len() <= 48, "{keyspace}");
        assert!(keyspace.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{keyspace}");
        let Store::Scylla { keyspace: other, .. } = Store::from_nodes(&nodes, 1).unwrap() else { unreachable!() };
        assert_ne!(keyspace, &other, "each run has its own keyspace");
        let env: BTreeMap<String, String> = store.env().into_iter().collect();
        assert_eq!(env["FANOUT__STORE__BACKEND"], "scylla");
        assert_eq!(env["FANOUT__STORE__SCYLLA__KEYSPACE"], *keyspace);
        assert_eq!(env["FANOUT__STORE__SCYLLA__MIGRATE"], "true");
        let replication: toml::Table =
            toml::from_str(&format!("v = {}", env["FANOUT__STORE__SCYLLA__REPLICATION"])).unwrap();
        assert_eq!(replication["v"].as_str(), Some("{'class': 'SimpleStrategy', 'replication_factor': 3}"));
        // The engine reads the value as TOML: an array of the contact points.
        let parsed: toml::Table = toml::from_str(&format!("v = {}", env["FANOUT__STORE__SCYLLA__NODES"])).unwrap();
        let parsed: Vec<&str> = parsed["v"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(parsed, ["127.0.0.1:9042", "10.0.0.2:9042"]);
        assert_eq!(
            store.describe(),
            format!("scylla keyspace {keyspace} (replication factor 3) at 127.0.0.1:9042,10.0.0.2:9042")
        );
        assert!(Store::from_nodes(&["localhost".to_string()], 1).is_err());
        assert!(Store::from_nodes(&[String::new()], 1).is_err());
    }

    #[test]
    fn parses_proc_stat_and_metrics() {
        let stat = "123 (fan out) S 1 2 3 4 5 6 7 8 9 10 250 50 70 30 20 0 4 0";
        assert_eq!(parse_stat_cpu(stat), Some(300.0 / clock_ticks() as f64));
        assert_eq!(parse_stat_children_cpu(stat), Some(100.0 / clock_ticks() as f64));
        assert!(children_cpu_seconds().is_some());
        assert!(own_cpu_seconds().is_some_and(|cpu| cpu >= 0.0));
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
