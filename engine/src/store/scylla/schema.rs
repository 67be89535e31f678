//! The versioned CQL schema (`engine/schema/scylla/NNN_*.cql`) and its application.

use scylla::client::session::Session;
use scylla::serialize::row::SerializeRow;
use scylla::statement::Statement;

use super::cql::{OwnedRow, be};
use super::settings::Keyspace;
use crate::store::StoreError;

/// Every schema version this binary knows, in order. Each file's statements
/// are idempotent; a version is recorded in `schema_version` after all of its
/// statements ran.
pub(super) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "001_init", include_str!("../../../schema/scylla/001_init.cql")),
    (2, "002_leases", include_str!("../../../schema/scylla/002_leases.cql")),
    (3, "003_index_clocks", include_str!("../../../schema/scylla/003_index_clocks.cql")),
    (4, "004_relay", include_str!("../../../schema/scylla/004_relay.cql")),
    (5, "005_relay_deliveries", include_str!("../../../schema/scylla/005_relay_deliveries.cql")),
    (6, "006_gateway", include_str!("../../../schema/scylla/006_gateway.cql")),
    (7, "007_shard_terms", include_str!("../../../schema/scylla/007_shard_terms.cql")),
    (8, "008_shard_progress", include_str!("../../../schema/scylla/008_shard_progress.cql")),
    (9, "009_dispatch_copies", include_str!("../../../schema/scylla/009_dispatch_copies.cql")),
    (10, "010_parked_deliveries", include_str!("../../../schema/scylla/010_parked_deliveries.cql")),
];

/// The version a store of this binary needs.
pub(super) fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// The replication map is operator configuration pasted into CREATE KEYSPACE:
/// it must at least look like one CQL map.
fn check_replication(replication: &str) -> Result<(), StoreError> {
    let r = replication.trim();
    let ok = r.starts_with('{')
        && r.ends_with('}')
        && r.matches('{').count() == 1
        && r.matches('}').count() == 1
        && !r.contains(';');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Backend(
            "store.scylla.replication must be one CQL map, e.g. {'class': 'NetworkTopologyStrategy', 'dc1': 3}".into(),
        ))
    }
}

/// Splits a migration file into statements: `--` comments dropped, each
/// statement ending with `;` at the end of a line, placeholders replaced.
pub(super) fn statements(file: &str, keyspace: &str, replication: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in file.lines() {
        let line = match line.find("--") {
            Some(i) => &line[..i],
            None => line,
        };
        let line = line.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if line.ends_with(';') {
            let stmt = current.trim().trim_end_matches(';').to_owned();
            out.push(stmt.replace("${keyspace}", keyspace).replace("${replication}", replication.trim()));
            current.clear();
        }
    }
    debug_assert!(current.trim().is_empty(), "a statement without ';'");
    out
}

/// The versions recorded in the keyspace; empty when the keyspace or the
/// table does not exist yet.
async fn applied_versions(session: &Session, keyspace: &str) -> Result<Vec<i32>, StoreError> {
    let cql = "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = 'schema_version'";
    let tables: Vec<(String,)> = query(session, cql, (keyspace,), "reading the schema tables").await?;
    if tables.is_empty() {
        return Ok(Vec::new());
    }
    let cql = format!("SELECT version FROM {keyspace}.schema_version");
    let rows: Vec<(i32,)> = query(session, cql, (), "reading the schema version").await?;
    let mut versions: Vec<i32> = rows.into_iter().map(|(v,)| v).collect();
    versions.sort_unstable();
    Ok(versions)
}

/// The rows of an unprepared, unpaged read.
async fn query<R: OwnedRow>(
    session: &Session,
    cql: impl Into<Statement>,
    values: impl SerializeRow,
    what: &'static str,
) -> Result<Vec<R>, StoreError> {
    let rows = session.query_unpaged(cql, values).await.map_err(be(what))?.into_rows_result().map_err(be(what))?;
    rows.rows::<R>().map_err(be(what))?.collect::<Result<_, _>>().map_err(be(what))
}

/// Applies every migration not yet recorded, in order. Returns the schema
/// version now in place.
pub(super) async fn migrate(session: &Session, keyspace: &Keyspace, replication: &str) -> Result<i32, StoreError> {
    let keyspace = keyspace.as_str();
    check_replication(replication)?;
    let applied = applied_versions(session, keyspace).await?;
    refuse_newer(&applied)?;
    for &(version, name, file) in MIGRATIONS {
        if applied.contains(&version) {
            continue;
        }
        tracing::info!(keyspace, version, name, "applying the CQL schema");
        for stmt in statements(file, keyspace, replication) {
            // CQL has no `ADD IF NOT EXISTS` on every server: a column an
            // earlier, partial run added is skipped here.
            if let Some((table, column)) = added_column(&stmt, keyspace)
                && column_exists(session, keyspace, table, column).await?
            {
                continue;
            }
            // DDL waits for schema agreement (the driver's default) before the next one.
            session.query_unpaged(Statement::new(stmt), ()).await.map_err(be("applying the schema"))?;
        }
        session
            .query_unpaged(
                format!(
                    "INSERT INTO {keyspace}.schema_version (version, name, applied_at) \
                     VALUES (?, ?, toTimestamp(now()))"
                ),
                (version, name),
            )
            .await
            .map_err(be("recording the schema version"))?;
    }
    Ok(latest())
}

/// The table and column of `ALTER TABLE <keyspace>.<table> ADD <column> <type>`.
fn added_column<'a>(stmt: &'a str, keyspace: &str) -> Option<(&'a str, &'a str)> {
    let words: Vec<&'a str> = stmt.split_whitespace().collect();
    let [alter, table_word, name, add, column, ..] = words.as_slice() else { return None };
    let table = name.strip_prefix(keyspace)?.strip_prefix('.')?;
    let is_add = alter.eq_ignore_ascii_case("ALTER")
        && table_word.eq_ignore_ascii_case("TABLE")
        && add.eq_ignore_ascii_case("ADD");
    is_add.then_some((table, *column))
}

async fn column_exists(session: &Session, keyspace: &str, table: &str, column: &str) -> Result<bool, StoreError> {
    let cql = "SELECT column_name FROM system_schema.columns \
               WHERE keyspace_name = ? AND table_name = ? AND column_name = ?";
    let rows: Vec<(String,)> = query(session, cql, (keyspace, table, column), "reading the schema columns").await?;
    Ok(!rows.is_empty())
}

/// Without `migrate`, the schema must already be exactly the one this binary knows.
pub(super) async fn check(session: &Session, keyspace: &Keyspace) -> Result<(), StoreError> {
    let keyspace = keyspace.as_str();
    let applied = applied_versions(session, keyspace).await?;
    refuse_newer(&applied)?;
    match applied.last() {
        Some(&v) if v == latest() => Ok(()),
        Some(&v) => Err(StoreError::Backend(format!(
            "keyspace {keyspace} has schema version {v}, this binary needs {}: run `fanout migrate` \
             or set store.scylla.migrate = true",
            latest()
        ))),
        None => Err(StoreError::Backend(format!(
            "keyspace {keyspace} has no fanout schema: run `fanout migrate` or set store.scylla.migrate = true"
        ))),
    }
}

fn refuse_newer(applied: &[i32]) -> Result<(), StoreError> {
    match applied.last() {
        Some(&v) if v > latest() => Err(StoreError::Backend(format!(
            "the keyspace has schema version {v}, newer than this binary's {}: upgrade fanout",
            latest()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_file_splits_into_statements() {
        let stmts = statements(MIGRATIONS[0].2, "ks", "{'class': 'SimpleStrategy', 'replication_factor': 1}");
        assert!(stmts[0].starts_with("CREATE KEYSPACE IF NOT EXISTS ks"));
        assert!(stmts[0].ends_with("{'class': 'SimpleStrategy', 'replication_factor': 1}"));
        assert!(stmts.iter().all(|s| !s.contains("${") && !s.contains("--") && !s.ends_with(';')));
        let tables: Vec<_> = stmts
            .iter()
            .filter_map(|s| s.strip_prefix("CREATE TABLE IF NOT EXISTS ks."))
            .map(|s| s.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            tables,
            [
                "schema_version",
                "settings",
                "recipients",
                "topic_subscriptions",
                "shards",
                "envelopes",
                "envelope_buckets",
                "shard_leases"
            ]
        );
    }

    #[test]
    fn leases_file_adds_the_nodes_table() {
        let stmts = statements(MIGRATIONS[1].2, "ks", "{}");
        assert_eq!(stmts.len(), 1);
        assert!(stmts[0].starts_with("CREATE TABLE IF NOT EXISTS ks.nodes"));
    }

    #[test]
    fn shard_terms_file_adds_the_terms_and_the_log() {
        let stmts = statements(MIGRATIONS[6].2, "ks", "{}");
        assert_eq!(stmts.len(), 2);
        assert!(stmts[0].starts_with("CREATE TABLE IF NOT EXISTS ks.shard_terms"));
        assert!(stmts[1].starts_with("CREATE TABLE IF NOT EXISTS ks.shard_log"));
    }

    #[test]
    fn shard_progress_file_adds_its_table() {
        let stmts = statements(MIGRATIONS[7].2, "ks", "{}");
        assert_eq!(stmts.len(), 1);
        assert!(stmts[0].starts_with("CREATE TABLE IF NOT EXISTS ks.shard_progress"));
    }

    #[test]
    fn dispatch_copies_file_adds_columns_one_by_one_and_the_marks() {
        let stmts = statements(MIGRATIONS[8].2, "ks", "{}");
        let added: Vec<_> = stmts.iter().filter_map(|s| added_column(s, "ks")).collect();
        assert_eq!(added.len(), 10);
        assert!(added.iter().all(|(table, _)| *table == "topic_subscriptions"));
        assert_eq!(added[0].1, "secret_hash");
        assert!(stmts.last().unwrap().starts_with("CREATE TABLE IF NOT EXISTS ks.topic_pending"));
        assert_eq!(added_column("ALTER TABLE other.t ADD c int", "ks"), None, "another keyspace");
        assert_eq!(added_column("CREATE TABLE IF NOT EXISTS ks.t (a int PRIMARY KEY)", "ks"), None);
    }

    #[test]
    fn parked_deliveries_file_adds_its_table() {
        let stmts = statements(MIGRATIONS[9].2, "ks", "{}");
        assert_eq!(stmts.len(), 1);
        assert!(stmts[0].starts_with("CREATE TABLE IF NOT EXISTS ks.parked_deliveries"));
        assert!(stmts[0].contains("PRIMARY KEY ((shard, channel), sequence_id, recipient_id)"));
    }

    #[test]
    fn replication_is_checked() {
        assert!(check_replication("{'class': 'SimpleStrategy', 'replication_factor': 1}").is_ok());
        assert!(check_replication("{'class': 'X'}; DROP KEYSPACE x").is_err());
        assert!(check_replication("'class'").is_err());
    }
}
