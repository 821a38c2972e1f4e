//! `denvd`, the sidecar denv runs on a user's machine (spec page `11-ref-denvd.md`).
//!
//! - [`runtime`]: the Docker runtime (bollard): create, exec, files, snapshot, fork,
//!   rollback, destroy, egress probe, host report.
//! - [`storage`]: storage backends (`dir`, `btrfs`, `zfs`) behind one trait.
//! - [`verify`]: `verify.collect` (freeze, copy, refuse special files) and `verify.run`.
//! - [`stream`], [`journal`]: the outbound host stream and the idempotent command journal.
//! - [`dataport`]: the data port other hosts fetch snapshots and images from.
//! - [`config`]: flags, environment fallbacks, the identity file, storage detection,
//!   `install`.

pub mod config;
pub mod dataport;
pub mod journal;
pub mod runtime;
pub mod storage;
pub mod stream;
pub mod verify;
