//! Containment applied to every container denvd creates (services, verifiers, copy-up
//! helpers, egress probes, the egress canary): spec `19-ref-protections.md` §4.
//!
//! - `no-new-privileges` always, so a setuid binary of the image never raises the
//!   effective uid or capabilities;
//! - denvd's own seccomp allow-list ([`super::seccomp`]) instead of Docker's default,
//!   which also refuses the btrfs ioctls that would make a subvolume outside a volume's
//!   disk cap;
//! - every capability dropped (`cap_drop: ALL`), then:
//!   - the agent service (`x-denv.agent.service`), probes, the canary and copy-up
//!     helpers get none back;
//!   - other services and image verifiers get [`SERVICE_CAPS`] back, plus the service's
//!     `cap_add` (capabilities of Docker's default set only; the compose parser refuses
//!     the others and refuses `cap_add` on the agent service);
//! - the `json-file` log driver with a size cap: [`LOG_MAX_FILES`] files of at most
//!   [`LOG_MAX_SIZE_BYTES`] each, so a log flood leaves at most 20 MiB per container on
//!   the host;
//! - `core` ulimit 0 (soft = hard: a process cannot raise it, so no core dumps);
//! - `nofile` ulimit [`NOFILE_LIMIT`] (soft = hard) per process, and the `pids` cap per
//!   container (processes and threads; `nproc` is not set because it counts per uid
//!   across the whole host);
//! - CPUs at most [`max_cpus`] of the host (the host keeps [`CPU_RESERVE`] CPU).

use bollard::models::{HostConfig, HostConfigLogConfig, ResourcesUlimits};
use std::collections::HashMap;

/// Capabilities every non-agent service (and an image verifier) keeps: what database and
/// web-server entrypoints need to chown their data directory and drop to their own user
/// (postgres, redis, nginx) and to bind a port below 1024. Docker's default set minus
/// `AUDIT_WRITE`, `MKNOD`, `NET_RAW`, `SETFCAP`, `SETPCAP` and `SYS_CHROOT` (which a
/// service can add back with `cap_add`).
pub const SERVICE_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETUID",
];

/// Largest size of one `json-file` log file per container, bytes (10 MiB).
pub const LOG_MAX_SIZE_BYTES: u64 = 10 << 20;

/// Log files kept per container (the current one plus rotated ones).
pub const LOG_MAX_FILES: u32 = 2;

/// Open files per process in every container (`ulimit -n`, soft and hard).
pub const NOFILE_LIMIT: i64 = 8192;

pub use denv_compose::{max_cpus, CPU_RESERVE};

/// What a container may do beyond no capabilities.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Privilege<'a> {
    /// No capabilities at all (agent service, probe, canary, copy-up helper).
    None,
    /// [`SERVICE_CAPS`] plus these (a service's `cap_add`).
    Service(&'a [String]),
}

/// The capabilities kept for `p`, sorted, unique.
pub(crate) fn kept_caps(p: Privilege<'_>) -> Vec<String> {
    match p {
        Privilege::None => Vec::new(),
        Privilege::Service(extra) => {
            let mut v: Vec<String> = SERVICE_CAPS.iter().map(|c| c.to_string()).collect();
            v.extend(extra.iter().cloned());
            v.sort();
            v.dedup();
            v
        }
    }
}

/// Adds the containment settings to a container's host config (keeps what is already
/// set for memory, pids, CPUs, mounts and networks).
pub(crate) fn harden(hc: &mut HostConfig, p: Privilege<'_>) {
    hc.security_opt = Some(vec![
        "no-new-privileges:true".to_string(),
        super::seccomp::security_opt().to_string(),
    ]);
    hc.cap_drop = Some(vec!["ALL".to_string()]);
    let keep = kept_caps(p);
    hc.cap_add = if keep.is_empty() { None } else { Some(keep) };
    hc.privileged = Some(false);
    hc.log_config = Some(HostConfigLogConfig {
        typ: Some("json-file".to_string()),
        config: Some(HashMap::from([
            ("max-size".to_string(), LOG_MAX_SIZE_BYTES.to_string()),
            ("max-file".to_string(), LOG_MAX_FILES.to_string()),
        ])),
    });
    hc.ulimits = Some(vec![
        ResourcesUlimits {
            name: Some("nofile".to_string()),
            soft: Some(NOFILE_LIMIT),
            hard: Some(NOFILE_LIMIT),
        },
        // No core dumps: a core lands in the layer or a volume, or, on a host whose
        // `core_pattern` pipes to a collector, on the host outside every cap.
        ResourcesUlimits {
            name: Some("core".to_string()),
            soft: Some(0),
            hard: Some(0),
        },
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_headroom() {
        assert_eq!(max_cpus(2.0), 1.5);
        assert_eq!(max_cpus(8.0), 7.5);
        assert_eq!(max_cpus(1.0), 0.5);
        assert_eq!(max_cpus(0.25), 0.25);
    }

    #[test]
    fn caps_sets() {
        assert!(kept_caps(Privilege::None).is_empty());
        let extra = vec!["SYS_CHROOT".to_string(), "CHOWN".to_string()];
        let k = kept_caps(Privilege::Service(&extra));
        assert_eq!(
            k,
            [
                "CHOWN",
                "DAC_OVERRIDE",
                "FOWNER",
                "FSETID",
                "KILL",
                "NET_BIND_SERVICE",
                "SETGID",
                "SETUID",
                "SYS_CHROOT"
            ]
        );
        let mut hc = HostConfig::default();
        harden(&mut hc, Privilege::None);
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, None);
        let opts = hc.security_opt.unwrap();
        assert_eq!(opts[0], "no-new-privileges:true");
        assert!(
            opts[1].starts_with("seccomp={\"architectures\""),
            "{}",
            opts[1]
        );
    }
}
