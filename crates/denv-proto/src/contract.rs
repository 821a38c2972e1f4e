//! The contract's numbers: protocol versions, size limits and default timeouts that
//! more than one party (control plane, sidecar, clients) must agree on. Each is defined
//! here once; every crate imports it from here (some re-export it under an older name).
//!
//! Sizes are bytes, `*_SEC` constants are seconds, `Duration`s say their unit in the
//! doc. The spec page of each is named in its doc comment; `docs/reference/protocol.md`
//! and `docs/reference/rest-api.md` are the published form.

use std::time::Duration;

// ---------------------------------------------------------------- host protocol

/// The oldest host-protocol version this build speaks (spec `15-ref-protocol.md`,
/// "Session"; `Hello.min_protocol`). A sidecar sends it in `hello`, the control plane
/// accepts sidecars whose range reaches down to or past it.
pub const PROTOCOL_MIN: u32 = 1;

/// The newest host-protocol version this build speaks (`Hello.protocol`). The
/// `welcome` carries the version chosen: the highest both ends speak.
pub const PROTOCOL: u32 = 1;

// The range is not empty (checked when this crate compiles).
const _: () = assert!(PROTOCOL_MIN <= PROTOCOL);

/// Largest host-stream frame, either way: 64 MiB (files and build contexts travel as
/// `bytes` inside one frame; `15-ref-protocol.md`, "Frames").
pub const HOST_FRAME_MAX_BYTES: usize = 64 << 20;

/// How long a new host stream may take to send `hello`: 5 s (`15-ref-protocol.md`,
/// "Session" step 1).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The sidecar's heartbeat period: 10 s (`15-ref-protocol.md`, "Session" step 4).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(10);

/// No frame from a sidecar for this long ends its call and marks the host
/// `unreachable`: 60 s (`15-ref-protocol.md`, "Session" step 4).
pub const HOST_GRACE: Duration = Duration::from_secs(60);

/// The sidecar's first reconnect delay after a dropped call: 1 s (before jitter;
/// `15-ref-protocol.md`, "Session" step 5).
pub const RECONNECT_MIN: Duration = Duration::from_secs(1);

/// The sidecar's largest reconnect delay: 30 s (before jitter).
pub const RECONNECT_MAX: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- size limits

/// Largest gRPC message of the public API, either way: 64 MiB (server, Rust client
/// and Python binding; `12-ref-rest-api.md`).
pub const API_MESSAGE_MAX_BYTES: usize = 64 << 20;

/// Largest REST request body, tar uploads included: 32 MiB (`12-ref-rest-api.md`;
/// over it the gateway answers `413`).
pub const REST_BODY_MAX_BYTES: usize = 32 << 20;

/// Largest `files put` / `files get` tar archive (`env.put`, `env.get`): 32 MiB
/// (`15-ref-protocol.md`, `env.get`; `12-ref-rest-api.md`, files routes).
pub const FILES_ARCHIVE_MAX_BYTES: usize = 32 << 20;

/// Largest stdin of an `env.exec` (`denv exec --input`): 32 MiB.
pub const EXEC_STDIN_MAX_BYTES: usize = 32 << 20;

/// Largest captured stdout, and separately stderr, of an `env.exec`: 4 MiB each; the
/// rest is dropped and the result says `stdout_truncated` / `stderr_truncated`
/// (`15-ref-protocol.md`, `env.exec`).
pub const EXEC_OUTPUT_MAX_BYTES: usize = 4 << 20;

/// Largest build context (the uncompressed tar of a compose `build:` service): 32 MiB,
/// so it fits one host frame (`13-ref-compose.md`, "Builds").
pub const BUILD_CONTEXT_MAX_BYTES: usize = 32 << 20;

/// Output per service of one `env.logs` call before it is cut: 8 MiB (also the
/// sidecar's default when a request leaves `max_bytes` at 0).
pub const LOGS_MAX_BYTES: u64 = 8 << 20;

// ---------------------------------------------------------------- default timeouts

/// `env.exec`'s limit when a request gives none (`timeout_sec` 0): 120 s
/// (`15-ref-protocol.md`, `env.exec`; `12-ref-rest-api.md`).
pub const EXEC_TIMEOUT_SEC: u32 = 120;

/// How long the control plane waits for an `env.exec` beyond its own `timeout_sec`:
/// 10 s (`15-ref-protocol.md`, "Timeouts").
pub const EXEC_SLACK: Duration = Duration::from_secs(10);

/// The `warm` command's own limit: 600 s (`16-ref-deployments.md`, `warm` phase).
pub const WARM_TIMEOUT_SEC: u32 = 600;

/// Each deployment phase's command is bounded by this: 15 min (`15-ref-protocol.md`,
/// "Timeouts"; `16-ref-deployments.md`).
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A verifier's limit when `x-denv.verifier.timeout_sec` is unset (or 0 on the wire):
/// 600 s (`13-ref-compose.md`, verifier).
pub const VERIFIER_TIMEOUT_SEC: u64 = 600;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_the_published_ones() {
        assert_eq!(PROTOCOL_MIN, 1);
        assert_eq!(PROTOCOL, 1);
        assert_eq!(HOST_FRAME_MAX_BYTES, 64 * 1024 * 1024);
        assert_eq!(API_MESSAGE_MAX_BYTES, 64 * 1024 * 1024);
        assert_eq!(REST_BODY_MAX_BYTES, 32 * 1024 * 1024);
        assert_eq!(FILES_ARCHIVE_MAX_BYTES, 32 * 1024 * 1024);
        assert_eq!(EXEC_STDIN_MAX_BYTES, 32 * 1024 * 1024);
        assert_eq!(EXEC_OUTPUT_MAX_BYTES, 4 * 1024 * 1024);
        assert_eq!(BUILD_CONTEXT_MAX_BYTES, 32 * 1024 * 1024);
        assert_eq!(LOGS_MAX_BYTES, 8 * 1024 * 1024);
        assert_eq!(EXEC_TIMEOUT_SEC, 120);
        assert_eq!(EXEC_SLACK.as_secs(), 10);
        assert_eq!(WARM_TIMEOUT_SEC, 600);
        assert_eq!(PHASE_TIMEOUT.as_secs(), 900);
        assert_eq!(VERIFIER_TIMEOUT_SEC, 600);
        assert_eq!(
            (
                HELLO_TIMEOUT.as_secs(),
                HEARTBEAT_INTERVAL.as_secs(),
                HOST_GRACE.as_secs()
            ),
            (5, 10, 60)
        );
        assert_eq!((RECONNECT_MIN.as_secs(), RECONNECT_MAX.as_secs()), (1, 30));
    }
}
