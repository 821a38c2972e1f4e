//! The control-plane store: sea-orm entities and repository functions.
//!
//! One module per table. Each module holds the entity (`Entity`, `Model`, `Column`,
//! `ActiveModel`) and repository functions generic over `C: ConnectionTrait` (so they
//! run on the [`DatabaseConnection`] or inside a transaction from `db.begin()`). The
//! exception: `environments`, `versions`, `deployments` and `phases` hold only their
//! entity; their one repository is [`crate::orchestrator::repo`], which reads and writes
//! them as the rows of [`crate::domain`] and checks every status move. Nothing here
//! knows the API's wire messages: [`crate::api::convert`] makes them from these rows.
//!
//! Conventions: ids are prefixed ULIDs from [`crate::ids::new_id`]; timestamps are
//! RFC 3339 UTC strings with milliseconds from [`now`] (`""` when unset); JSON documents
//! (environment endpoints, version spec, deployment params, phase evidence, event body)
//! are stored as JSON text; optional strings are `""`. Every row of a team-scoped table
//! carries `team_id`, and the lookups the API uses take the caller's team so another
//! team's object is simply not found.
//!
//! [`connect`] opens SQLite (a file path or `sqlite:` URL; WAL, 5 s busy timeout,
//! created if missing) or Postgres (`postgres://` / `postgresql://` DSN) and applies the
//! migrations of `denv-migration`.

use denv_migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};
use std::str::FromStr;
use std::time::Duration;

pub use sea_orm::{ConnectionTrait, DatabaseTransaction, TransactionTrait};

pub mod api_keys;
pub mod clouds;
pub mod commands;
pub mod deployments;
pub mod device_codes;
pub mod environments;
pub mod events;
pub mod hosts;
pub mod installations;
pub mod join_tokens;
pub mod memberships;
pub mod oauth_states;
pub mod phases;
pub mod projects;
pub mod sessions;
pub mod snapshot_copies;
pub mod sources;
pub mod teams;
pub mod users;
pub mod versions;
pub mod webhook_deliveries;

/// The current time as an RFC 3339 UTC string with milliseconds
/// (`2026-11-29T12:00:00.000Z`); such strings sort in time order.
pub fn now() -> String {
    fmt_time(chrono::Utc::now())
}

/// A time as the store's RFC 3339 string.
pub fn fmt_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Parse a stored timestamp (`None` for `""` or garbage).
pub fn parse_time(s: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// Parse a stored JSON document (`""` and invalid text give `null`).
pub fn parse_json(s: &str) -> serde_json::Value {
    if s.is_empty() {
        return serde_json::Value::Null;
    }
    serde_json::from_str(s).unwrap_or(serde_json::Value::Null)
}

/// A JSON value as stored text.
pub fn json_text(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Whether the error is a unique-constraint violation (duplicate name, used token).
pub fn is_unique_violation(e: &DbErr) -> bool {
    matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    )
}

/// Whether a `-db` value selects Postgres.
pub fn is_postgres(dsn: &str) -> bool {
    dsn.starts_with("postgres://") || dsn.starts_with("postgresql://")
}

/// Open the database named by `dsn` and apply every migration.
///
/// `dsn` is a SQLite file path (`denv.db`, `./x/denv.db`), a `sqlite:` URL, or a
/// `postgres://` DSN. SQLite files are created if missing and opened in WAL mode with a
/// 5 s busy timeout.
pub async fn connect(dsn: &str) -> Result<DatabaseConnection, DbErr> {
    let db = open(dsn).await?;
    Migrator::up(&db, None).await?;
    Ok(db)
}

/// Applies the migrations to an open store.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

/// On PostgreSQL, a transaction holding the start-up advisory lock: processes starting
/// at the same time on one database (replicas) migrate and bootstrap one after the
/// other. Commit it when done. `None` on SQLite.
pub async fn startup_lock(
    db: &DatabaseConnection,
) -> Result<Option<sea_orm::DatabaseTransaction>, DbErr> {
    use sea_orm::{ConnectionTrait, TransactionTrait};
    if db.get_database_backend() != sea_orm::DatabaseBackend::Postgres {
        return Ok(None);
    }
    let tx = db.begin().await?;
    tx.execute_unprepared("SELECT pg_advisory_xact_lock(7346617466)")
        .await?;
    Ok(Some(tx))
}

/// [`connect`] without applying the migrations (tests of a migration start from the
/// schema before it).
pub async fn open(dsn: &str) -> Result<DatabaseConnection, DbErr> {
    Ok(if is_postgres(dsn) {
        let mut opts = ConnectOptions::new(dsn.to_string());
        opts.max_connections(16)
            .min_connections(1)
            .connect_timeout(Duration::from_secs(10))
            .sqlx_logging(false);
        Database::connect(opts).await?
    } else {
        let opts = if dsn.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(dsn)
                .map_err(|e| DbErr::Conn(sea_orm::RuntimeErr::Internal(e.to_string())))?
        } else {
            SqliteConnectOptions::new().filename(dsn)
        };
        let opts = opts
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(opts)
            .await
            .map_err(|e| DbErr::Conn(sea_orm::RuntimeErr::Internal(e.to_string())))?;
        DatabaseConnection::from(pool)
    })
}

/// Redact the password of a Postgres DSN for logs (`postgres://u:•••@h/db`).
pub fn redact_dsn(dsn: &str) -> String {
    if !is_postgres(dsn) {
        return dsn.to_string();
    }
    let Some((scheme, rest)) = dsn.split_once("://") else {
        return dsn.to_string();
    };
    match rest.rfind('@') {
        Some(at) => {
            let (userinfo, host) = rest.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***{host}"),
                None => dsn.to_string(),
            }
        }
        None => dsn.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_dsn("postgres://denv:s3cr@t@db:5432/denv?sslmode=require"),
            "postgres://denv:***@db:5432/denv?sslmode=require"
        );
        assert_eq!(
            redact_dsn("postgres://denv@db/denv"),
            "postgres://denv@db/denv"
        );
        assert_eq!(redact_dsn("denv.db"), "denv.db");
    }

    #[test]
    fn times_sort_and_parse() {
        let a = now();
        assert!(a.ends_with('Z'));
        assert!(parse_time(&a).is_some());
        assert!(parse_time("").is_none());
    }
}
