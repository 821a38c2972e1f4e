//! Storage backends: where an environment's named volumes live, and how they are
//! snapshotted, forked, rolled back and destroyed (spec `11-ref-denvd.md`, "Storage
//! backends" and "Data directory layout").
//!
//! Every backend keeps the documented layout under the data directory:
//!
//! | path | contents |
//! |---|---|
//! | `<data>/envs/<env>/vol/<name>/` | the volume's data, bind-mounted into containers |
//! | `<data>/snaps/<env>/<snap>/` | the snapshot (`dir`: copies, `btrfs`: read-only subvolumes, `zfs`: a marker directory naming, in its file `datasets`, the snapshot of each volume's dataset, `<pool>/envs/<env>/vol/<name>@<snap>` until a rollback; all taken by one `zfs snapshot -r <pool>/envs/<env>@<snap>`) |
//!
//! A snapshot exists exactly when `<data>/snaps/<env>/<snap>/` exists (it is created
//! atomically by rename, last), so an environment with no volumes still has snapshots
//! (empty trees).
//!
//! The trait is synchronous: the runtime calls it from `tokio::task::spawn_blocking`.

mod btrfs;
pub mod delta;
pub mod digest;
mod dir;
pub mod ship;
mod zfs;

pub use btrfs::BtrfsStorage;
pub use dir::DirStorage;
pub use zfs::ZfsStorage;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An error from a storage backend. The message names the dataset or path and, for
/// external tools (`cp`, `btrfs`, `zfs`), carries the tool's stderr. The variant is what
/// kind of failure it is ([`StorageError::code`]).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A failed operation, with a message naming what failed.
    #[error("{0}")]
    Failed(String),
    /// The snapshot asked for is not there (`snapshot "s" of env_x not found`).
    #[error("{0}")]
    NotFound(String),
    /// What would be made exists already (`snapshot "s" of env_x already exists`,
    /// `volume "v" of env_x already exists`).
    #[error("{0}")]
    Conflict(String),
    /// A name that cannot be a path component ([`validate_name`]).
    #[error("{0}")]
    Invalid(String),
    /// A file system error on `path`.
    #[error("{path}: {source}")]
    Io {
        /// The path the operation was on.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl StorageError {
    /// The command result's code for this error: `Failed` and `Io` are the host's own
    /// failure (`FAILED`).
    pub fn code(&self) -> denv_proto::v1::HostErrorCode {
        use denv_proto::v1::HostErrorCode as C;
        match self {
            StorageError::NotFound(_) => C::NotFound,
            StorageError::Conflict(_) => C::Conflict,
            StorageError::Invalid(_) => C::Invalid,
            StorageError::Failed(_) | StorageError::Io { .. } => C::Failed,
        }
    }

    pub(crate) fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        StorageError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

/// One storage backend. Volume names, environment ids and snapshot names are used as
/// path components (and ZFS dataset components); [`validate_name`] is applied by the
/// runtime before any call.
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// `"dir"`, `"btrfs"` or `"zfs"`: the `storage` capability and result field.
    fn name(&self) -> &'static str;

    /// The data directory this backend lays its files out under.
    fn data_dir(&self) -> &Path;

    /// Host directory of a volume (`<data>/envs/<env>/vol/<vol>`), whether or not it exists.
    fn volume_path(&self, env: &str, vol: &str) -> PathBuf {
        self.data_dir().join("envs").join(env).join("vol").join(vol)
    }

    /// Directory marking a snapshot (`<data>/snaps/<env>/<snap>`).
    fn snapshot_path(&self, env: &str, snap: &str) -> PathBuf {
        self.data_dir().join("snaps").join(env).join(snap)
    }

    /// Whether snapshot `snap` of `env` exists.
    fn has_snapshot(&self, env: &str, snap: &str) -> bool {
        self.snapshot_path(env, snap).is_dir()
    }

    /// Creates the (empty) dataset for volume `vol` of `env`, or keeps an existing one.
    /// Returns the host directory to bind-mount.
    fn create(&self, env: &str, vol: &str) -> Result<PathBuf, StorageError>;

    /// Captures every listed volume of `env` under `snap`, together (the caller has
    /// frozen all writers). Returns the dataset names captured (backend-specific: paths
    /// for `dir`/`btrfs`, `pool/…@snap` for `zfs`). Fails if `snap` already exists.
    fn snapshot(&self, env: &str, snap: &str, vols: &[String])
        -> Result<Vec<String>, StorageError>;

    /// [`Storage::snapshot`], told the processes that were frozen (`writers`, host pids;
    /// `None` when unknown). `dir` uses them to look for files written through shared
    /// memory maps (see [`delta`]). Default: `snapshot`.
    fn snapshot_frozen(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        writers: Option<&[u32]>,
    ) -> Result<Vec<String>, StorageError> {
        let _ = writers;
        self.snapshot(env, snap, vols)
    }

    /// Does what it can of snapshot `snap` of `env` while the services still run, so
    /// that [`Storage::snapshot`], called next with the writers frozen, has less to do
    /// (`dir`: a pre-copy, see [`delta`]; `btrfs`: a commit of the file system, so its
    /// dirty data and qgroup accounting are not flushed inside the frozen window).
    /// Default: nothing. An error is not fatal: the
    /// caller logs it and `snapshot` then does all the work.
    fn prepare_snapshot(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError> {
        let _ = (env, snap, vols);
        Ok(())
    }

    /// Creates the volumes `vols` of `to_env` from snapshot `snap` of `from_env`
    /// (copy, subvolume snapshot or clone). Fails if `to_env` already has such a volume
    /// or the snapshot lacks one.
    fn fork(
        &self,
        from_env: &str,
        snap: &str,
        to_env: &str,
        vols: &[String],
    ) -> Result<(), StorageError>;

    /// Restores every listed volume of `env` to its content in snapshot `snap`. The
    /// caller has stopped every container using them.
    fn rollback(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError>;

    /// Removes every volume and snapshot of `env` (`<data>/envs/<env>/vol` and
    /// `<data>/snaps/<env>`). Idempotent. Forks made from this environment's snapshots
    /// keep working (see each backend for how).
    fn destroy(&self, env: &str) -> Result<(), StorageError>;

    /// How an environment's disk quota is enforced on its volumes: `"btrfs qgroup"`,
    /// `"zfs quota"`, or `"none"` (the default: `dir` storage has no quota).
    fn quota_kind(&self) -> &'static str {
        "none"
    }

    /// Limits the space of `env`'s volumes to `bytes`, created and future volumes, forks
    /// and rollbacks included: on zfs all volumes together, snapshots counted; on btrfs
    /// each volume's own data (what it does not share with a snapshot or the environment
    /// it was forked from; `storage/btrfs.rs` says why). Called before the volumes are created or
    /// cloned, and again on every create. A write past the limit fails inside the environment with `EDQUOT` ("Disk
    /// quota exceeded"). Default: does nothing.
    fn set_quota(&self, env: &str, bytes: u64) -> Result<(), StorageError> {
        let _ = (env, bytes);
        Ok(())
    }

    /// Writes the volumes `vols` of snapshot `snap` of `env` to `w` as one portable
    /// archive ([`ship`]: a top-level directory per volume). `dir`/`btrfs` read the
    /// snapshot's trees; `zfs` reads each dataset snapshot through a temporary clone.
    /// Fails when the snapshot or one of its volumes is missing, or `w` fails.
    fn export_snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        w: &mut dyn Write,
    ) -> Result<(), StorageError> {
        let root = self.snapshot_path(env, snap);
        let trees = snapshot_trees(&root, env, snap, vols)?;
        ship::export_trees(&trees, w)
    }

    /// Makes snapshot `snap` of `env`, with the volumes `vols`, from the archive read
    /// from `r` (as written by [`Storage::export_snapshot`] on any backend), under the
    /// rules of [`ship::unpack`] (nothing written outside the staging directory, no
    /// device nodes, at most `limit` bytes of archive read). Only when the archive has
    /// the size and SHA-256 of the trailer that follows it does the snapshot appear (its
    /// directory renamed into place last); on any error nothing is left. Fails when the
    /// snapshot exists. Returns the archive's size and digest.
    /// Default: the `dir` layout (plain directories).
    fn import_snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        r: &mut dyn Read,
        limit: u64,
    ) -> Result<ship::Shipped, StorageError> {
        import_staged(
            &self.snapshot_path(env, snap),
            vols,
            r,
            limit,
            &|p| std::fs::create_dir(p).map_err(|e| StorageError::io(p, e)),
            &|_| Ok(()),
            &|p| {
                let _ = remove_tree(p);
            },
        )
    }

    /// Environment ids that have volumes or snapshots on disk.
    fn envs(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sub in ["envs", "snaps"] {
            if let Ok(rd) = std::fs::read_dir(self.data_dir().join(sub)) {
                for e in rd.flatten() {
                    if let Some(n) = e.file_name().to_str() {
                        if !out.iter().any(|x: &String| x == n) {
                            out.push(n.to_string());
                        }
                    }
                }
            }
        }
        out.sort();
        out
    }
}

/// Checks that `value` can be used as a path component and a ZFS dataset/snapshot name
/// component: 1-200 characters of `[A-Za-z0-9_.:-]`, not `.` or `..`.
/// `what` names the value in the error (`environment id`, `snapshot name`, `volume`).
pub fn validate_name(what: &str, value: &str) -> Result<(), StorageError> {
    let ok = !value.is_empty()
        && value.len() <= 200
        && value != "."
        && value != ".."
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'));
    if ok {
        Ok(())
    } else {
        Err(StorageError::Invalid(format!(
            "invalid {what} {value:?} (allowed: letters, digits, _ . : -)"
        )))
    }
}

/// Runs an external tool, returning its stdout; on failure the error carries the command
/// line and the tool's stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, StorageError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| StorageError::Failed(format!("{program}: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(StorageError::Failed(format!(
            "{} {}: {}",
            program,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Copies `src` (a directory) to `dst` (which must not exist) preserving owners, modes,
/// timestamps, symlinks, hard links and special files, with reflinks where the file
/// system can (`cp -a --reflink=auto`).
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<(), StorageError> {
    let (s, d) = (src.to_string_lossy(), dst.to_string_lossy());
    run("cp", &["-a", "--reflink=auto", "--", &s, &d]).map(|_| ())
}

/// A file in `<data>/snaps/<env>/` saying that snapshots of `env` were received from
/// another host (`snapshot.receive`): `env` does not run here, and the start-up
/// reconcile keeps its snapshots instead of removing them as an orphan's.
pub const RECEIVED_MARK: &str = ".received";

/// Writes [`RECEIVED_MARK`] next to the received snapshot `marker`.
pub(crate) fn mark_received(marker: &Path) -> Result<(), StorageError> {
    let f = marker
        .parent()
        .expect("snapshot path has a parent")
        .join(RECEIVED_MARK);
    std::fs::write(&f, b"").map_err(|e| StorageError::io(&f, e))
}

/// The tree of each volume of a snapshot laid out as `<root>/<vol>` (`dir`, `btrfs`).
pub(crate) fn snapshot_trees(
    root: &Path,
    env: &str,
    snap: &str,
    vols: &[String],
) -> Result<Vec<(String, PathBuf)>, StorageError> {
    if !root.is_dir() {
        return Err(StorageError::NotFound(format!(
            "snapshot {snap:?} of {env} not found"
        )));
    }
    vols.iter()
        .map(|v| {
            let p = root.join(v);
            match p.symlink_metadata() {
                Ok(m) if m.is_dir() => Ok((v.clone(), p)),
                _ => Err(StorageError::Failed(format!(
                    "snapshot {snap:?} of {env} has no volume {v:?}"
                ))),
            }
        })
        .collect()
}

/// Receives a snapshot at `marker` (`<data>/snaps/<env>/<snap>`): a staging directory
/// next to it gets a directory per volume from `make_vol`, the archive is unpacked and
/// checked ([`ship::receive_into`]), each volume is sealed by `seal` (made read-only),
/// and the staging directory is renamed to `marker`. On any failure `discard` is called
/// on each volume directory made and the staging directory is removed.
pub(crate) fn import_staged(
    marker: &Path,
    vols: &[String],
    r: &mut dyn Read,
    limit: u64,
    make_vol: &dyn Fn(&Path) -> Result<(), StorageError>,
    seal: &dyn Fn(&Path) -> Result<(), StorageError>,
    discard: &dyn Fn(&Path),
) -> Result<ship::Shipped, StorageError> {
    if marker.exists() {
        return Err(StorageError::Conflict(format!(
            "snapshot {} already exists",
            marker.display()
        )));
    }
    mkdir_p(marker.parent().expect("snapshot path has a parent"))?;
    let staging = tmp_sibling(marker, "receiving");
    mkdir_p(&staging)?;
    let mut made = Vec::new();
    let result = (|| {
        for v in vols {
            validate_name("volume", v)?;
            let p = staging.join(v);
            make_vol(&p)?;
            made.push(p);
        }
        let got = ship::receive_into(&staging, vols, r, limit)?;
        for p in &made {
            seal(p)?;
        }
        mark_received(marker)?;
        std::fs::rename(&staging, marker).map_err(|e| StorageError::io(marker, e))?;
        Ok(got)
    })();
    if result.is_err() {
        for p in &made {
            discard(p);
        }
        let _ = remove_tree(&staging);
    }
    result
}

/// `mkdir -p` with a contextual error.
pub(crate) fn mkdir_p(p: &Path) -> Result<(), StorageError> {
    std::fs::create_dir_all(p).map_err(|e| StorageError::io(p, e))
}

/// `rm -rf` that ignores a missing path.
pub(crate) fn remove_tree(p: &Path) -> Result<(), StorageError> {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(p, e)),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p).map_err(|e| StorageError::io(p, e)),
        Ok(_) => std::fs::remove_file(p).map_err(|e| StorageError::io(p, e)),
    }
}

/// A sibling temporary path next to `p` (same file system, for atomic renames).
pub(crate) fn tmp_sibling(p: &Path, tag: &str) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let r: u32 = rand::random();
    p.with_file_name(format!(".{name}.{tag}-{r:08x}"))
}

/// Sub-directory names of `p` (sorted); empty when `p` does not exist.
pub(crate) fn subdirs(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("x", "env_01ABC").is_ok());
        assert!(validate_name("x", "ver_01:a.b-c").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "a@b"] {
            let e = validate_name("x", bad).unwrap_err();
            assert_eq!(e.code(), denv_proto::v1::HostErrorCode::Invalid, "{bad}");
        }
    }

    #[test]
    fn a_backends_missing_and_existing_snapshots_carry_their_codes() {
        use denv_proto::v1::HostErrorCode as C;
        let t = tempfile::tempdir().unwrap();
        let st = DirStorage::new(t.path());
        st.create("env_a", "v").unwrap();
        let vols = vec!["v".to_string()];
        let e = st.fork("env_a", "s1", "env_b", &vols).unwrap_err();
        assert_eq!(
            (e.code(), e.to_string().as_str()),
            (C::NotFound, "snapshot \"s1\" of env_a not found")
        );
        st.snapshot("env_a", "s1", &vols).unwrap();
        let e = st.snapshot("env_a", "s1", &vols).unwrap_err();
        assert_eq!(
            (e.code(), e.to_string().as_str()),
            (C::Conflict, "snapshot \"s1\" of env_a already exists")
        );
        st.fork("env_a", "s1", "env_b", &vols).unwrap();
        let e = st.fork("env_a", "s1", "env_b", &vols).unwrap_err();
        assert_eq!(e.code(), C::Conflict, "{e}");
        // The host's own failure is FAILED.
        let e = st
            .snapshot("env_a", "s2", &["nope".to_string()])
            .unwrap_err();
        assert_eq!(e.code(), C::Failed, "{e}");
    }
}
