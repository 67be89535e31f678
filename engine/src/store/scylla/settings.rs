//! `[store.scylla]` and the types that carry its rules.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScyllaSettings {
    /// Contact points, "host:port". The driver discovers the rest of the cluster.
    pub nodes: Nodes,
    pub keyspace: Keyspace,
    /// The CQL replication map used when the keyspace is created.
    pub replication: String,
    /// Apply the CQL schema at start-up (else `fanout migrate` must have).
    pub migrate: bool,
    /// Client-side bound on every request.
    #[serde(rename = "request_timeout_ms", deserialize_with = "duration::millis")]
    pub request_timeout: Duration,
    /// How long an idempotent request waits for its node before it is sent
    /// to the next one as well (speculative execution): what a stalled
    /// node costs a request.
    #[serde(rename = "speculative_after_ms", deserialize_with = "duration::millis")]
    pub speculative_after: Duration,
    /// TLS to every node (Cassandra's client_encryption_options,
    /// ScyllaDB's client encryption). Absent: plaintext.
    pub tls: Option<ScyllaTls>,
    /// Password authentication (PasswordAuthenticator): the role
    /// name here, its password in `password_file` (never in the config).
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// The consistency of the shard log's writes and of dispatch's reads.
    pub consistency: LogConsistency,
}

/// `[store.scylla.consistency]`. Registration, leases and every conditional
/// write stay at LOCAL_QUORUM (LOCAL_SERIAL for the Paxos phase): their
/// rules need it. Nothing below a boundary is skipped only while a read sees
/// every acknowledged write, so the two levels must overlap (at replication
/// factor n: replicas written + replicas read > n): both quorums, or one of
/// them `all`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawLogConsistency")]
pub struct LogConsistency {
    /// Envelope rows, boundaries, checkpoints. Default `local_quorum`.
    pub writes: Level,
    /// Windows, envelope data, shard positions, subscriber pages. Default `local_quorum`.
    pub reads: Level,
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawLogConsistency {
    writes: Level,
    reads: Level,
}

impl TryFrom<RawLogConsistency> for LogConsistency {
    type Error = &'static str;

    fn try_from(raw: RawLogConsistency) -> Result<Self, Self::Error> {
        let overlap =
            raw.writes == Level::All || raw.reads == Level::All || (raw.writes.quorum() && raw.reads.quorum());
        if overlap {
            Ok(Self { writes: raw.writes, reads: raw.reads })
        } else {
            Err("writes and reads must overlap (both quorums, or one of them \"all\"), \
                 or a window could miss an acknowledged envelope")
        }
    }
}

/// A CQL consistency level, as the config names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    One,
    LocalOne,
    Quorum,
    #[default]
    LocalQuorum,
    EachQuorum,
    All,
}

impl Level {
    fn quorum(self) -> bool {
        matches!(self, Self::Quorum | Self::LocalQuorum | Self::EachQuorum)
    }

    pub(super) fn cql(self) -> scylla::statement::Consistency {
        use scylla::statement::Consistency as C;
        match self {
            Self::One => C::One,
            Self::LocalOne => C::LocalOne,
            Self::Quorum => C::Quorum,
            Self::LocalQuorum => C::LocalQuorum,
            Self::EachQuorum => C::EachQuorum,
            Self::All => C::All,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScyllaTls {
    /// PEM CAs the nodes' certificates are checked against (the system
    /// roots too). The certificates must name the addresses in `nodes`.
    #[serde(default)]
    pub ca_files: Vec<PathBuf>,
}

impl ScyllaSettings {
    /// The password, read from `password_file` (trailing whitespace
    /// dropped), when `username` is set.
    pub fn credentials(&self) -> Result<Option<(String, String)>, String> {
        let (Some(user), Some(file)) = (&self.username, &self.password_file) else {
            return match (&self.username, &self.password_file) {
                (None, None) => Ok(None),
                _ => Err("store.scylla: username and password_file go together".into()),
            };
        };
        let password = std::fs::read_to_string(file)
            .map_err(|e| format!("store.scylla.password_file: cannot read {}: {e}", file.display()))?;
        let password = password.trim_end();
        if password.is_empty() {
            return Err(format!("store.scylla.password_file: {} is empty", file.display()));
        }
        Ok(Some((user.clone(), password.to_owned())))
    }
}

impl Default for ScyllaSettings {
    fn default() -> Self {
        Self {
            nodes: Nodes(vec!["127.0.0.1:9042".into()]),
            keyspace: Keyspace("fanout".into()),
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            migrate: false,
            request_timeout: Duration::from_secs(10),
            speculative_after: Duration::from_millis(500),
            tls: None,
            username: None,
            password_file: None,
            consistency: LogConsistency::default(),
        }
    }
}

/// `nodes`: at least one contact point.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct Nodes(Vec<String>);

impl Nodes {
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }
}

impl TryFrom<Vec<String>> for Nodes {
    type Error = &'static str;

    fn try_from(nodes: Vec<String>) -> Result<Self, Self::Error> {
        if nodes.is_empty() { Err("must name at least one \"host:port\"") } else { Ok(Self(nodes)) }
    }
}

/// `keyspace`: a name CQL accepts unquoted (`check_keyspace`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Keyspace(String);

impl Keyspace {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Keyspace {
    type Error = &'static str;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        check_keyspace(&name)?;
        Ok(Self(name))
    }
}

/// A keyspace name CQL accepts unquoted: a letter, then letters, digits or
/// `_`, at most 48 characters. It is pasted into statements, so `Keyspace`
/// (the only way to name one) is built through this check.
fn check_keyspace(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    let ok = name.len() <= 48
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok { Ok(()) } else { Err("must be a letter followed by at most 47 letters, digits or '_'") }
}

impl fmt::Display for Keyspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspace_names_are_checked() {
        assert!(check_keyspace("fanout").is_ok());
        assert!(check_keyspace("fanout_test_0a").is_ok());
        assert!(check_keyspace("0fanout").is_err());
        assert!(check_keyspace("a-b").is_err());
        assert!(check_keyspace("").is_err());
        assert!(check_keyspace(&"a".repeat(49)).is_err());
    }

    fn parse(json: serde_json::Value) -> Result<ScyllaSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_rules() {
        let s = parse(serde_json::json!({})).unwrap();
        assert_eq!((s.nodes.as_slice(), s.keyspace.as_str()), (&["127.0.0.1:9042".to_owned()][..], "fanout"));
        assert_eq!(s.request_timeout, Duration::from_millis(10_000));
        assert_eq!(s.speculative_after, Duration::from_millis(500));
        let s = parse(serde_json::json!({"keyspace": "prod_1", "request_timeout_ms": 250})).unwrap();
        assert_eq!((s.keyspace.to_string(), s.request_timeout), ("prod_1".to_owned(), Duration::from_millis(250)));

        let err = parse(serde_json::json!({"keyspace": "bad-name"})).unwrap_err();
        assert!(err.contains("must be a letter followed by"), "{err}");
        let err = parse(serde_json::json!({"nodes": []})).unwrap_err();
        assert!(err.contains("must name at least one"), "{err}");
        let err = parse(serde_json::json!({"request_timeout_ms": 0})).unwrap_err();
        assert!(err.contains("positive number of milliseconds"), "{err}");
        let err = parse(serde_json::json!({"tls": {"ca_file": "/x"}})).unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }

    #[test]
    fn log_consistency_levels_must_overlap() {
        let s = parse(serde_json::json!({})).unwrap();
        assert_eq!(s.consistency, LogConsistency { writes: Level::LocalQuorum, reads: Level::LocalQuorum });
        let s = parse(serde_json::json!({"consistency": {"writes": "all", "reads": "local_one"}})).unwrap();
        assert_eq!((s.consistency.writes, s.consistency.reads), (Level::All, Level::LocalOne));
        assert!(parse(serde_json::json!({"consistency": {"writes": "one", "reads": "all"}})).is_ok());
        let err = parse(serde_json::json!({"consistency": {"writes": "one"}})).unwrap_err();
        assert!(err.contains("must overlap"), "{err}");
        let err = parse(serde_json::json!({"consistency": {"reads": "two"}})).unwrap_err();
        assert!(err.contains("unknown variant"), "{err}");
    }

    #[test]
    fn credentials_come_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\n").unwrap();
        let s = parse(serde_json::json!({"username": "fanout", "password_file": file})).unwrap();
        assert_eq!(s.credentials().unwrap(), Some(("fanout".into(), "s3cret".into())));
        assert_eq!(parse(serde_json::json!({})).unwrap().credentials().unwrap(), None);
        let half = parse(serde_json::json!({"username": "fanout"})).unwrap();
        assert!(half.credentials().unwrap_err().contains("go together"));
        std::fs::write(&file, "\n").unwrap();
        let empty = parse(serde_json::json!({"username": "fanout", "password_file": file})).unwrap();
        assert!(empty.credentials().unwrap_err().contains("is empty"));
    }
}
