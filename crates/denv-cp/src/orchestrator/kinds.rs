//! The orchestrator's limits (spec page `16-ref-deployments.md`). Kinds, phases and
//! statuses are the enums of [`crate::domain`].

use std::time::Duration;

/// Each phase is bounded by the orchestrator's command timeout (15 minutes).
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The `warm` command's own limit (seconds); the hub waits 10 s longer.
pub const WARM_TIMEOUT_SEC: u32 = 600;
/// `env.exec` default limit when a request gives none (seconds).
pub const EXEC_DEFAULT_TIMEOUT_SEC: u32 = 120;
/// Slack the hub waits beyond an `env.exec`'s own `timeout_sec`.
pub const EXEC_SLACK: Duration = Duration::from_secs(10);
/// `env.put` / `env.get` archive limit (32 MiB).
pub const FILES_LIMIT: usize = 32 << 20;
