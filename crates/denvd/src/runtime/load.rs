//! What this host has free now and what its environments hold: the `HostLoad` every
//! heartbeat carries (`host.proto`; `docs/reference/denvd.md`, "Load"), from which the
//! control plane places new environments (`docs/reference/targets.md`, "Placement").
//!
//! - memory: `MemAvailable` and `MemTotal` of /proc/meminfo (procfs);
//! - disk: the space available under the data directory (statvfs, as `df` shows it);
//! - CPUs: [`max_cpus`] of the host's, what one container may be given;
//! - environments: the directories under `<data>/envs` holding a saved `spec.json` (the
//!   live ones, as the engine watch counts them), and their caps summed as the runtime
//!   applies them ([`super::stack::caps`], [`super::stack::disk_bytes`]: an unset cap
//!   is its default, CPUs clamped to the host's).
//!
//! Reading it costs one statvfs and one small file per environment; nothing asks Docker.

use super::contain::max_cpus;
use super::Runtime;
use denv_compose::Spec;
use serde::{Deserialize, Serialize};
use std::path::Path;

const MIB: u64 = 1 << 20;

/// The host's figures at one instant (all zero when unreadable).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// `MemAvailable`, MiB (`MemFree + Buffers + Cached` on a kernel without it).
    pub memory_free_mb: u64,
    /// `MemTotal`, MiB.
    pub memory_total_mb: u64,
    /// Space available under the data directory, MiB.
    pub disk_free_mb: u64,
    /// CPUs a container may use: the host's minus the 0.5 it keeps ([`max_cpus`]).
    pub cpus: f64,
    /// Environments with a saved spec.
    pub environments: u32,
    /// Their services' CPU caps summed (each at most [`Load::cpus`]).
    pub reserved_cpus: f64,
    /// Their services' memory caps summed, MiB.
    pub reserved_memory_mb: u64,
    /// Their disk quotas summed, MiB.
    pub reserved_disk_mb: u64,
}

/// What the environments under a data directory hold ([`held`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    /// Environments with a `spec.json` (one that does not parse counts, holding nothing).
    pub environments: u32,
    /// CPU caps summed.
    pub cpus: f64,
    /// Memory caps summed, MiB.
    pub memory_mb: u64,
    /// Disk quotas summed, MiB.
    pub disk_mb: u64,
}

impl Runtime {
    /// The host's figures now ([`measure`] off the async threads).
    pub async fn load(&self) -> Load {
        let data = self.inner.cfg.data_dir.clone();
        let host_cpus = self.inner.host_cpus;
        tokio::task::spawn_blocking(move || measure(&data, host_cpus))
            .await
            .unwrap_or_default()
    }
}

/// The figures of a host with `host_cpus` CPUs whose data directory is `data_dir`.
pub fn measure(data_dir: &Path, host_cpus: f64) -> Load {
    let (memory_free_mb, memory_total_mb) = memory_mb();
    let held = held(data_dir, host_cpus);
    Load {
        memory_free_mb,
        memory_total_mb,
        disk_free_mb: free_disk_bytes(data_dir).unwrap_or(0) / MIB,
        cpus: max_cpus(host_cpus),
        environments: held.environments,
        reserved_cpus: held.cpus,
        reserved_memory_mb: held.memory_mb,
        reserved_disk_mb: held.disk_mb,
    }
}

/// (available, total) memory in MiB; zeros when /proc/meminfo cannot be read.
fn memory_mb() -> (u64, u64) {
    match <procfs::Meminfo as procfs::Current>::current() {
        Ok(m) => {
            let available = m.mem_available.unwrap_or(m.mem_free + m.buffers + m.cached);
            (available / MIB, m.mem_total / MIB)
        }
        Err(e) => {
            tracing::debug!(error = %e, "reading /proc/meminfo");
            (0, 0)
        }
    }
}

/// Bytes available to unprivileged users on the file system holding `path` (what `df`
/// shows as available), `None` when statvfs fails.
pub fn free_disk_bytes(path: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    #[allow(clippy::useless_conversion)] // the widths differ between targets
    let (blocks, size) = (
        u64::from(s.blocks_available()),
        u64::from(s.fragment_size()),
    );
    Some(blocks.saturating_mul(size))
}

/// The environments under `<data_dir>/envs` that have a `spec.json`, and their caps
/// summed as the runtime applies them on a host with `host_cpus` CPUs.
pub fn held(data_dir: &Path, host_cpus: f64) -> Held {
    let mut h = Held::default();
    let Ok(rd) = std::fs::read_dir(data_dir.join("envs")) else {
        return h;
    };
    for entry in rd.flatten() {
        let path = entry.path().join("spec.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => continue, // not an environment (yet, or any more)
        };
        h.environments += 1;
        match serde_json::from_slice::<Spec>(&bytes) {
            Ok(spec) => {
                for s in &spec.services {
                    let (mem, _, cpus) = super::stack::caps(&s.resources, host_cpus);
                    h.cpus += cpus;
                    h.memory_mb += u64::try_from(mem).unwrap_or(0) / MIB;
                }
                h.disk_mb += super::stack::disk_bytes(&spec) / MIB;
            }
            Err(e) => tracing::debug!(path = %path.display(), error = %e, "unreadable spec"),
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(data: &Path, env: &str, compose: &str) {
        let spec = denv_compose::parse(compose).unwrap();
        let dir = data.join("envs").join(env);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("spec.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
    }

    #[test]
    fn held_sums_the_caps_of_environments_with_a_spec() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(held(dir.path(), 4.0), Held::default(), "no envs directory");
        // Two services: one capped, one on the defaults (2 CPUs, 4096 MiB).
        save(
            dir.path(),
            "env_a",
            "services:\n  db:\n    image: redis:7\n    mem_limit: 512m\n    cpus: 0.5\n  app:\n    image: busybox:1.36\n",
        );
        // One service asking for more CPUs than the host gives: clamped to 3.5.
        save(
            dir.path(),
            "env_b",
            "x-denv:\n  disk: 1g\nservices:\n  big:\n    image: busybox:1.36\n    cpus: 8\n    mem_limit: 1g\n",
        );
        // Not environments: a directory without a spec, and a stray file.
        std::fs::create_dir_all(dir.path().join("envs/env_gone")).unwrap();
        std::fs::write(dir.path().join("envs/note"), b"x").unwrap();
        // An unreadable spec counts, holding nothing.
        std::fs::create_dir_all(dir.path().join("envs/env_bad")).unwrap();
        std::fs::write(dir.path().join("envs/env_bad/spec.json"), b"{").unwrap();

        let h = held(dir.path(), 4.0);
        assert_eq!(h.environments, 3);
        assert_eq!(h.cpus, 0.5 + 2.0 + 3.5);
        assert_eq!(h.memory_mb, 512 + 4096 + 1024);
        assert_eq!(h.disk_mb, 10240 + 1024);
    }

    #[test]
    fn measure_reads_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        save(
            dir.path(),
            "env_a",
            "services:\n  app:\n    image: busybox:1.36\n",
        );
        let l = measure(dir.path(), 2.0);
        assert!(
            l.memory_total_mb > 0 && l.memory_free_mb <= l.memory_total_mb,
            "{l:?}"
        );
        assert!(l.disk_free_mb > 0, "{l:?}");
        assert_eq!(l.cpus, 1.5);
        assert_eq!(
            (
                l.environments,
                l.reserved_cpus,
                l.reserved_memory_mb,
                l.reserved_disk_mb
            ),
            (1, 1.5, 4096, 10240)
        );
    }
}
