//! The storage conformance suite ([`cases`]) on every backend: redb in a
//! temporary directory always, ScyllaDB in a throwaway keyspace when
//! `FANOUT_TEST_CQL` names a CQL server (otherwise a failure under CI and a
//! visible skip elsewhere, `fanout_testkit::outside_service`).

mod cases;
mod test_keyspace;

// What `test_keyspace` expects in scope.
use fanout_engine::store::{ScyllaSettings, ScyllaStore};

// The scylla stores of `test_keyspace` are made for the suite.
const _: () = assert!(test_keyspace::SHARD_COUNT == cases::SHARD_COUNT);

mod redb {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use fanout_engine::store::RedbStore;

    use crate::cases::{self, SHARD_COUNT};

    fn temp_store() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(dir.path(), SHARD_COUNT).unwrap();
        (dir, store)
    }

    macro_rules! conformance_cases {
        ($($case:ident),* $(,)?) => {$(
            #[tokio::test]
            async fn $case() {
                let (_dir, store) = temp_store();
                cases::$case(&store).await;
            }
        )*};
    }

    cases::for_each_case!(conformance_cases);

    #[tokio::test]
    async fn run_all_on_fresh_stores() {
        let root = tempfile::tempdir().unwrap();
        let n = AtomicUsize::new(0);
        cases::run_all(|| {
            let dir = root.path().join(n.fetch_add(1, Ordering::Relaxed).to_string());
            async move { RedbStore::open(&dir, SHARD_COUNT).unwrap() }
        })
        .await;
    }
}

mod scylla {
    use crate::cases;
    use crate::test_keyspace::with_store;

    macro_rules! conformance_cases {
        ($($case:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                with_store(|store| async move {
                    cases::$case(&store).await;
                    store
                })
                .await;
            }
        )*};
    }

    cases::for_each_case!(conformance_cases);
}

/// Only against a secure server (`scripts/cassandra.sh
/// start-secure`): without TLS, or without the right password, the store
/// does not connect, and says so. Ignored in a plain run, whose server
/// takes plaintext without a password; `.ci/run` runs it with
/// `--include-ignored` against the secure node, where both variables must
/// be set.
mod secure {
    use fanout_engine::store::{ScyllaSettings, ScyllaStore};

    use crate::test_keyspace::{SHARD_COUNT, fresh_keyspace, settings, test_nodes};

    #[tokio::test]
    #[ignore = "needs the secure node of scripts/cassandra.sh start-secure (FANOUT_TEST_CQL, FANOUT_TEST_CQL_CA, \
                FANOUT_TEST_CQL_USER, FANOUT_TEST_CQL_PASSWORD_FILE): --include-ignored"]
    async fn plaintext_or_a_wrong_password_does_not_connect() {
        let (Some(nodes), Some(_)) = (test_nodes(), fanout_testkit::outside_service::secure_cql_password_file()) else {
            return;
        };
        let secure = settings(nodes, &fresh_keyspace());
        let plaintext = ScyllaSettings { tls: None, ..secure.clone() };
        assert!(ScyllaStore::connect(&plaintext, SHARD_COUNT).await.is_err(), "plaintext connected");
        let dir = tempfile::tempdir().unwrap();
        let wrong = dir.path().join("wrong");
        std::fs::write(&wrong, "not-the-password").unwrap();
        let guessed = ScyllaSettings { password_file: Some(wrong), ..secure.clone() };
        let error = ScyllaStore::connect(&guessed, SHARD_COUNT).await.err().expect("a wrong password connected");
        assert!(!error.to_string().contains("not-the-password"), "the password reached an error: {error}");
        let anonymous = ScyllaSettings { username: None, password_file: None, ..secure };
        assert!(ScyllaStore::connect(&anonymous, SHARD_COUNT).await.is_err(), "no credentials connected");
    }
}
