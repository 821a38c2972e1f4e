//! Compose file + `x-denv` block parsing and validation (spec page `13-ref-compose.md`).
//!
//! Pure code, no I/O: compose text in, a [`Spec`] (or one [`ComposeError`]) out.
//! The `Spec` is what the control plane pins as a version's spec (stored as JSON,
//! shown under `Spec` in `GET /v1/envs/{env}/versions`) and what the sidecar renders
//! containers from.
//!
//! [`wire`] maps a `Spec` to and from the host-stream messages of `denv-proto` (which
//! depends on no crate of this workspace).

mod spec;
pub use spec::*;

pub mod context;
pub mod dockerignore;

mod parse;
pub use parse::{is_root_user, is_valid_user, parse, size_bytes};

pub mod wire;

/// The one error a refused compose file produces. `Display` is the exact message of
/// `13-ref-compose.md`, e.g. `compose: no services`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ComposeError(pub String);
