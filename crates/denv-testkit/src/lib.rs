//! The control plane's test kit: what integration tests need to run `denv-cp` against
//! its real store, in one line each.
//!
//! - [`TestDb`]: a fresh database, SQLite in a temp dir or PostgreSQL from
//!   `DENV_TEST_POSTGRES_DSN` ([`Backend`]).
//! - [`CpBinary`]: the real `denv-cp` binary on a free port, with REST and gRPC helpers.
//! - [`CpInProcess`]: the hub and TargetService on a tonic server inside the test.
//! - [`FakeSidecar`]: a sidecar that speaks the real host stream without Docker.
//! - [`Denvd`]: the real `denvd` binary joined to a control plane.
//!
//! ```ignore
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

pub use binary::{CpBinary, Start};
pub use db::{free_port, with_database, Backend, TestDb, NEEDS_POSTGRES};
pub use denvd::{require_docker, sibling_binary, Denvd};
pub use inprocess::CpInProcess;
pub use sidecar::{FakeOptions, FakeSidecar, Identity};
