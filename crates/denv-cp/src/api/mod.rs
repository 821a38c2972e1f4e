//! tonic service implementations of `proto/denv/v1/api.proto`.
//!
//! Each service holds an [`crate::AppState`], authenticates with
//! [`crate::auth::authenticate`], and returns [`crate::ApiError`] as `tonic::Status`.
//! `server(state)` on each gives the tonic server to mount.

pub mod auth;
pub mod convert;
pub mod deployments;
pub mod envs;
pub mod events;
pub mod github;
pub mod health;
pub mod logs;
pub mod projects;
pub mod sandboxes;
pub mod targets;
