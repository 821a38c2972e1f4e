//! A fresh database of either backend.
//!
//! Postgres: tests read `DENV_TEST_POSTGRES_DSN` (e.g. from `e2e/lib/postgres.sh
//! start`); each test gets its own fresh database created through that DSN. The
//! Postgres variants are `#[ignore]`d (cargo lists them as ignored, with the reason);
//! run with `--include-ignored` (as `just unit` does) they fail when the DSN is unset,
//! never pass silently.

use sea_orm::ConnectionTrait;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in the test's temp dir.
    Sqlite,
    /// A fresh database on the server of `DENV_TEST_POSTGRES_DSN`.
    Postgres,
}

/// Why the Postgres variants are ignored by a plain `cargo test`.
pub const NEEDS_POSTGRES: &str = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)";

/// A fresh database: a DSN for `-db`, and the temp dir that holds SQLite files and logs.
pub struct TestDb {
    /// What `denv-cp -db` and `store::connect` take.
    pub dsn: String,
    /// The test's temp dir (the SQLite file, the logs); removed on drop.
    pub dir: tempfile::TempDir,
}

impl TestDb {
    /// A fresh database of `backend`.
    ///
    /// Panics when Postgres is asked for and `DENV_TEST_POSTGRES_DSN` is unset: the test
    /// was asked to run (`--include-ignored`) and cannot run its real subject.
    pub async fn fresh(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => TestDb::sqlite(),
            Backend::Postgres => {
                let dir = tempfile::tempdir().expect("tempdir");
                let admin = std::env::var("DENV_TEST_POSTGRES_DSN")
                    .unwrap_or_else(|_| panic!("cannot run: this test {NEEDS_POSTGRES}"));
                let name = format!("denv_t_{}", ulid::Ulid::new().to_string().to_lowercase());
                let conn = sea_orm::Database::connect(admin.as_str())
                    .await
                    .expect("connect to DENV_TEST_POSTGRES_DSN");
                conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create test database");
                let _ = conn.close().await;
                TestDb {
                    dsn: with_database(&admin, &name),
                    dir,
                }
            }
        }
    }

    /// A SQLite database (`cp.db`) in a new temp dir.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        TestDb {
            dsn: dir.path().join("cp.db").display().to_string(),
            dir,
        }
    }

    /// The temp dir's path.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// `dsn` with its database name replaced by `name`.
pub fn with_database(dsn: &str, name: &str) -> String {
    let (base, query) = match dsn.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (dsn, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let host_part = &base[scheme_end..];
    let prefix = match host_part.find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    format!("{prefix}/{name}{query}")
}

/// A TCP port on 127.0.0.1 that was free a moment ago (another process may take it
/// before the caller binds it: [`crate::CpBinary::start`] starts again when it does).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn with_database_replaces_the_name_and_keeps_the_query() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/denv?sslmode=disable", "t1"),
            "postgres://u:p@h:5432/t1?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "t1"), "postgres://h/t1");
    }
}
