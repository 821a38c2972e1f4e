//! denv control plane (`denv-cp`): one process serving the public API over gRPC,
//! gRPC-web and the REST gateway, the sidecar host stream, and the orchestrator, over
//! one store (SQLite or Postgres).
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | flags and environment (`18-ref-config.md`) |
//! | [`server`] | the one listen port: tonic services + REST gateway + releases + CORS |
//! | [`tls`] | the port's TLS: certificate and key, the accept loop |
//! | [`gateway`] | REST paths of `12-ref-rest-api.md` mapped onto the service traits |
//! | [`api`] | tonic service implementations; [`api::convert`]: domain and store rows → wire messages |
//! | [`auth`] | credentials (`dak_`, `dst_`, `X-Denv-Team`) → [`auth::Caller`]; bootstrap |
//! | [`hub`] | sidecar streams and the command path |
//! | [`replica`] | several replicas on one PostgreSQL: registry, host holders, leases |
//! | [`domain`] | statuses, kinds and phases as enums, with their transitions; the rows the orchestrator works on |
//! | [`orchestrator`] | deployments and their phases |
//! | [`store`] | sea-orm entities and repository functions |
//! | [`error`] | [`error::ApiError`] and its gRPC/HTTP mapping |

pub mod api;
pub mod auth;
pub mod config;
pub mod domain;
pub mod error;
pub mod gateway;
pub mod hub;
pub mod ids;
pub mod orchestrator;
pub mod ratelimit;
pub mod replica;
pub mod sealed;
pub mod server;
pub mod state;
pub mod store;
pub mod tls;

pub use error::ApiError;
pub use state::AppState;
