//! The control plane's test kit: what integration tests need to run `denv-cp` against
//! its real store, in one line each.
//!
//! - [`TestDb`]: a fresh database, SQLite in a temp dir or PostgreSQL from
//!   `DENV_TEST_POSTGRES_DSN` ([`Backend`]).
//! - [`CpBinary`]: the real `denv-cp` binary on a free port, with REST and gRPC helpers.
//! - [`CpInProcess`]: the hub and TargetService on a tonic server inside the test.
//! - [`FakeSidecar`]: a sidecar that speaks the real host stream without Docker.
//! - [`Denvd`]: the real `denvd` binary joined to a control plane.
//! - [`TestTls`]: a throwaway CA and a server certificate, for `denv-cp` over TLS.
//!
//! ```text
//! let db = TestDb::fresh(Backend::Sqlite).await;
//! let cp = CpBinary::start(Start::new(env!("CARGO_BIN_EXE_denv-cp"), &db).key(KEY)).await;
//! let sc = cp.sidecar(FakeOptions::default()).await;
//! ```
#![warn(missing_docs)]

mod binary;
mod db;
mod denvd;
mod inprocess;
pub mod sidecar;
mod tls;

pub use binary::{CpBinary, Start};
pub use db::{free_port, with_database, Backend, TestDb, NEEDS_POSTGRES};
pub use denvd::{require_docker, sibling_binary, Denvd};
pub use inprocess::CpInProcess;
pub use sidecar::{FakeOptions, FakeSidecar, Identity};
pub use tls::TestTls;

/// The phase `name` of a `{deployment, phases}` body (as `GET /v1/deployments/{id}` and
/// [`CpBinary::wait`] answer); panics with the body when it has none.
pub fn phase<'a>(d: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    d["phases"]
        .as_array()
        .unwrap_or_else(|| panic!("no phases in {d}"))
        .iter()
        .find(|p| p["Name"] == name)
        .unwrap_or_else(|| panic!("no phase {name} in {d}"))
}

/// Runs each named `async fn name(backend: Backend)` of the calling module as two tests:
/// `sqlite::name`, and `postgres::name` (ignored unless asked for with
/// `--include-ignored`; it needs `DENV_TEST_POSTGRES_DSN`, see [`TestDb::fresh`]).
///
/// ```text
/// on_both_backends!(teams_are_isolated, device_flow);
/// async fn teams_are_isolated(backend: Backend) { let db = TestDb::fresh(backend).await; … }
/// ```
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs PostgreSQL: DENV_TEST_POSTGRES_DSN (just unit starts one)"]
                async fn $name() {
                    super::$name($crate::Backend::Postgres).await
                }
            )*
        }
    };
}
