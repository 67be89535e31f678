//! Throwaway keyspaces for ScyllaDB store tests, on the CQL server named by
//! `FANOUT_TEST_CQL` (e.g. "127.0.0.1:9042"; `.ci/run` starts one with
//! scripts/cassandra.sh). Unset: a test fails under CI and is a visible
//! skip elsewhere (`fanout_testkit::outside_service::cql_server`).
//!
//! One file for the store's unit tests (`src/store/scylla.rs`) and the
//! conformance tests here, included in both by `#[path]`: the including
//! module has `ScyllaSettings` and `ScyllaStore` in scope.

use std::time::Duration;

use futures::FutureExt as _;

use super::{ScyllaSettings, ScyllaStore};

/// The shard count of every test store (the conformance suite's).
pub const SHARD_COUNT: u16 = 16;

/// The CQL nodes to test against, or `None` (a visible skip, a failure
/// under CI) when unset.
pub fn test_nodes() -> Option<Vec<String>> {
    let nodes = fanout_testkit::outside_service::cql_server()?;
    Some(nodes.split(',').map(|s| s.trim().to_owned()).collect())
}

/// A server with client encryption and password authentication
/// (`scripts/cassandra.sh start-secure`): its CA file, and the role and
/// password file to log in with.
const TEST_CQL_CA_ENV: &str = "FANOUT_TEST_CQL_CA";
const TEST_CQL_USER_ENV: &str = "FANOUT_TEST_CQL_USER";
const TEST_CQL_PASSWORD_FILE_ENV: &str = fanout_testkit::outside_service::CQL_PASSWORD_FILE;

/// Settings for `keyspace` on `nodes`, creating the schema; over TLS and
/// with credentials when the environment names them.
pub fn settings(nodes: Vec<String>, keyspace: &str) -> ScyllaSettings {
    let mut settings = ScyllaSettings {
        nodes: nodes.try_into().expect("at least one CQL node"),
        keyspace: keyspace.to_owned().try_into().expect("a valid keyspace name"),
        migrate: true,
        request_timeout: Duration::from_secs(30),
        ..ScyllaSettings::default()
    };
    if let Ok(ca) = std::env::var(TEST_CQL_CA_ENV) {
        settings.tls = Some(serde_json::from_value(serde_json::json!({"ca_files": [ca]})).expect("TLS settings"));
    }
    settings.username = std::env::var(TEST_CQL_USER_ENV).ok();
    settings.password_file = std::env::var(TEST_CQL_PASSWORD_FILE_ENV).ok().map(Into::into);
    settings
}

/// A keyspace name no other test uses.
pub fn fresh_keyspace() -> String {
    format!("fanout_test_{:016x}", rand::random::<u64>())
}

/// Runs `body` on a store in a fresh keyspace, then drops the keyspace
/// (also when `body` panics). Does nothing when no CQL server is set.
pub async fn with_store<F, Fut>(body: F)
where
    F: FnOnce(ScyllaStore) -> Fut,
    Fut: std::future::Future<Output = ScyllaStore>,
{
    let Some(nodes) = test_nodes() else { return };
    let keyspace = fresh_keyspace();
    let store = ScyllaStore::connect(&settings(nodes.clone(), &keyspace), SHARD_COUNT).await.unwrap();
    let outcome = std::panic::AssertUnwindSafe(body(store)).catch_unwind().await;
    drop_keyspace_then_resume(nodes, &keyspace, outcome.map(drop)).await;
}

/// Drops a test keyspace, then re-raises the test's panic if it had one.
pub async fn drop_keyspace_then_resume(
    nodes: Vec<String>,
    keyspace: &str,
    outcome: Result<(), Box<dyn std::any::Any + Send>>,
) {
    let cleanup = ScyllaStore::connect(&settings(nodes, keyspace), SHARD_COUNT).await.unwrap();
    cleanup.drop_keyspace().await.unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
