//! Services a test needs from outside its process (a CQL server, a
//! Prometheus binary, a database cluster), named by environment variables.
//!
//! A test without its service returns early, and a test that returns
//! passes: left at that, a renamed variable or a service that failed to
//! start would hide every such test behind a green run. So under CI
//! (`CI=true`), which provides every service, a missing variable fails the
//! test; on a developer's machine the test is skipped and says so.
//!
//! The skip is one line per test on the process's stderr, written to the
//! stream itself: libtest captures what a passing test prints with
//! `eprintln!` and throws it away, so the line would never be seen. Not one
//! summary line for the run: libtest has no hook at the end of a run, and
//! `cargo test` runs each test target as its own process, so no process
//! sees every skip. `grep SKIPPED` on the output counts them.

use std::io::Write as _;

/// A CQL server's contact points, comma-separated (e.g. `127.0.0.1:9042`):
/// the ScyllaDB store's unit and conformance tests, the e2e tests of
/// several nodes, the load harness's node test.
pub const CQL: &str = "FANOUT_TEST_CQL";
/// The password file of the secure CQL node (`.ci/run` also sets
/// `FANOUT_TEST_CQL_CA` and `FANOUT_TEST_CQL_USER` with it).
pub const CQL_PASSWORD_FILE: &str = "FANOUT_TEST_CQL_PASSWORD_FILE";
/// The three-node cluster's contact points (the database fault e2e test).
pub const CQL_CLUSTER: &str = "FANOUT_TEST_CQL_CLUSTER";
/// A Prometheus binary (the dashboards and alerts e2e test).
pub const PROMETHEUS: &str = "FANOUT_TEST_PROMETHEUS";
/// A tinyproxy binary (the outbound proxy e2e tests).
pub const TINYPROXY: &str = "FANOUT_TEST_TINYPROXY";

/// [`CQL`]'s value.
pub fn cql_server() -> Option<String> {
    service(CQL, "a CQL server: bash scripts/cassandra.sh start, then FANOUT_TEST_CQL=127.0.0.1:9042")
}

/// [`CQL_PASSWORD_FILE`]'s value.
pub fn secure_cql_password_file() -> Option<String> {
    service(
        CQL_PASSWORD_FILE,
        "the secure CQL node: bash scripts/cassandra.sh start-secure, then the variables .ci/run sets for it",
    )
}

/// [`CQL_CLUSTER`]'s value.
pub fn cql_cluster() -> Option<String> {
    service(
        CQL_CLUSTER,
        "the cluster: bash scripts/cassandra-cluster.sh start, then FANOUT_TEST_CQL_CLUSTER=$(bash scripts/cassandra-cluster.sh nodes)",
    )
}

/// [`PROMETHEUS`]'s value.
pub fn prometheus_binary() -> Option<String> {
    service(PROMETHEUS, "Prometheus: apt-get install prometheus, then FANOUT_TEST_PROMETHEUS=$(command -v prometheus)")
}

/// [`TINYPROXY`]'s value.
pub fn tinyproxy_binary() -> Option<String> {
    service(
        TINYPROXY,
        "an HTTP CONNECT proxy: apt-get install tinyproxy-bin, then FANOUT_TEST_TINYPROXY=$(command -v tinyproxy)",
    )
}

/// The value of `variable`, trimmed and never empty: the service a test
/// needs. Unset or blank: under CI the calling test fails; otherwise it
/// writes one `SKIPPED` line naming the test, the variable and `how`
/// (how to provide the service), and returns `None`.
pub fn service(variable: &str, how: &str) -> Option<String> {
    if let Ok(value) = std::env::var(variable)
        && !value.trim().is_empty()
    {
        return Some(value.trim().to_owned());
    }
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    assert!(!under_ci(), "{test}: {variable} is not set, and CI (CI=true) provides every service ({how})");
    // Failing to write a notice is no reason to fail the test.
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {variable} is not set ({how})");
    None
}

/// Whether the tests run under CI: `CI=true`, as CI services and `.ci/run`
/// set it.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A variable no environment sets, so the case does not depend on
    /// where it runs.
    const UNSET: &str = "FANOUT_TESTKIT_NEVER_SET_0b1f";

    #[test]
    fn an_unset_service_skips_locally_and_fails_under_ci() {
        let outcome = std::panic::catch_unwind(|| service(UNSET, "nothing to start"));
        match outcome {
            Ok(value) => {
                assert!(!under_ci());
                assert_eq!(value, None);
            }
            Err(panic) => {
                assert!(under_ci(), "only CI fails a test for a missing service");
                let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(message.contains(UNSET) && message.contains("nothing to start"), "{message}");
            }
        }
    }

    #[test]
    fn a_set_service_is_its_trimmed_value() {
        // PATH is set wherever tests run.
        let path = std::env::var("PATH").unwrap();
        assert_eq!(service("PATH", "a shell"), Some(path.trim().to_owned()));
    }
}
