//! `dir` storage: plain directories. Snapshot, fork and rollback are recursive copies
//! (`cp -a --reflink=auto`: owners, modes, timestamps, symlinks, hard links and special
//! files preserved; constant-time reflink clones on XFS/btrfs, full copies elsewhere).
//! Correct and slow; the default on any host without btrfs or a ZFS pool.
//!
//! A snapshot is copied before the writers are frozen
//! ([`Storage::prepare_snapshot`]: `<data>/snaps/<env>/.<snap>.precopy/`, a `cp -a` of
//! each volume), and while they are frozen only what changed since that copy began is
//! copied again ([`super::delta`]), so the frozen window grows with the change, not
//! with the data. Without a pre-copy, or when the change is too large for the delta
//! ([`super::delta::MAX_ARGS_BYTES`] of changed paths), the frozen window copies every
//! volume in full.
//!
//! Every copy is independent, so an environment can be destroyed while forks of its
//! snapshots live on.

use super::delta::{self, SyncError, SyncStats};
use super::{copy_tree, mkdir_p, remove_tree, tmp_sibling, Storage, StorageError};
use std::path::{Path, PathBuf};

/// The `dir` backend rooted at a data directory.
#[derive(Debug, Clone)]
pub struct DirStorage {
    data: PathBuf,
}

impl DirStorage {
    /// A backend laying out volumes under `data` (created on first use).
    pub fn new(data: impl Into<PathBuf>) -> Self {
        DirStorage { data: data.into() }
    }
}

impl DirStorage {
    /// Where [`Storage::prepare_snapshot`] copies snapshot `snap` of `env` before the
    /// freeze: `<data>/snaps/<env>/.<snap>.precopy`.
    fn precopy_path(&self, env: &str, snap: &str) -> PathBuf {
        self.data
            .join("snaps")
            .join(env)
            .join(format!(".{snap}.precopy"))
    }

    /// Brings the pre-copy `pre` up to date with the (frozen) volumes and removes its
    /// marker (`writers`: the frozen processes, `None` for all processes); a volume the pre-copy lacks is copied in full, one it has in excess is
    /// removed.
    fn finish_precopy(
        &self,
        env: &str,
        pre: &Path,
        vols: &[String],
        writers: Option<&[u32]>,
    ) -> Result<SyncStats, SyncError> {
        let t0 = delta::marker_stamp(pre)?;
        let mapped = delta::shared_writable_maps(writers);
        let mut total = SyncStats::default();
        for extra in super::subdirs(pre) {
            if !vols.contains(&extra) {
                remove_tree(&pre.join(&extra))?;
            }
        }
        for v in vols {
            let src = self.volume_path(env, v);
            if !src.is_dir() {
                return Err(StorageError::Failed(format!(
                    "volume {v:?} of {env} does not exist ({})",
                    src.display()
                ))
                .into());
            }
            let d = pre.join(v);
            if d.is_dir() {
                let s = delta::sync_tree(&src, &d, t0, &mapped)?;
                total.copied += s.copied;
                total.removed += s.removed;
                total.dirs_fixed += s.dirs_fixed;
                total.scanned += s.scanned;
            } else {
                remove_tree(&d)?;
                copy_tree(&src, &d)?;
            }
        }
        let m = pre.join(delta::MARKER);
        std::fs::remove_file(&m).map_err(|e| StorageError::io(&m, e))?;
        Ok(total)
    }
}

impl Storage for DirStorage {
    fn name(&self) -> &'static str {
        "dir"
    }

    fn data_dir(&self) -> &Path {
        &self.data
    }

    fn create(&self, env: &str, vol: &str) -> Result<PathBuf, StorageError> {
        let p = self.volume_path(env, vol);
        mkdir_p(&p)?;
        Ok(p)
    }

    fn prepare_snapshot(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError> {
        let dst = self.snapshot_path(env, snap);
        if dst.exists() {
            return Err(StorageError::Conflict(format!(
                "snapshot {snap:?} of {env} already exists"
            )));
        }
        let pre = self.precopy_path(env, snap);
        mkdir_p(pre.parent().expect("snapshot path has a parent"))?;
        remove_tree(&pre)?;
        let res = (|| {
            delta::start_precopy(&pre)?;
            for v in vols {
                let src = self.volume_path(env, v);
                if !src.is_dir() {
                    return Err(StorageError::Failed(format!(
                        "volume {v:?} of {env} does not exist ({})",
                        src.display()
                    )));
                }
                delta::precopy_volume(&src, &pre.join(v))?;
            }
            Ok(())
        })();
        if res.is_err() {
            let _ = remove_tree(&pre);
        }
        res
    }

    fn snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
    ) -> Result<Vec<String>, StorageError> {
        self.snapshot_frozen(env, snap, vols, None)
    }

    fn snapshot_frozen(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        writers: Option<&[u32]>,
    ) -> Result<Vec<String>, StorageError> {
        let dst = self.snapshot_path(env, snap);
        if dst.exists() {
            return Err(StorageError::Conflict(format!(
                "snapshot {snap:?} of {env} already exists"
            )));
        }
        mkdir_p(dst.parent().expect("snapshot path has a parent"))?;
        let pre = self.precopy_path(env, snap);
        if pre.is_dir() {
            match self.finish_precopy(env, &pre, vols, writers) {
                Ok(stats) => {
                    tracing::debug!(env, snap, ?stats, "snapshot: pre-copy brought up to date");
                    std::fs::rename(&pre, &dst).map_err(|e| StorageError::io(&dst, e))?;
                    return Ok(vols
                        .iter()
                        .map(|v| dst.join(v).display().to_string())
                        .collect());
                }
                Err(e) => {
                    let why = match e {
                        SyncError::TooMany(n) => format!("{n}+ changed paths"),
                        SyncError::Storage(e) => e.to_string(),
                    };
                    tracing::warn!(
                        env,
                        snap,
                        "snapshot: pre-copy not usable ({why}); copying in full"
                    );
                    remove_tree(&pre)?;
                }
            }
        }
        let tmp = tmp_sibling(&dst, "partial");
        mkdir_p(&tmp)?;
        let mut out = Vec::new();
        for v in vols {
            let src = self.volume_path(env, v);
            if !src.is_dir() {
                let _ = remove_tree(&tmp);
                return Err(StorageError::Failed(format!(
                    "volume {v:?} of {env} does not exist ({})",
                    src.display()
                )));
            }
            if let Err(e) = copy_tree(&src, &tmp.join(v)) {
                let _ = remove_tree(&tmp);
                return Err(e);
            }
            out.push(dst.join(v).display().to_string());
        }
        std::fs::rename(&tmp, &dst).map_err(|e| StorageError::io(&dst, e))?;
        Ok(out)
    }

    fn fork(
        &self,
        from_env: &str,
        snap: &str,
        to_env: &str,
        vols: &[String],
    ) -> Result<(), StorageError> {
        let src = self.snapshot_path(from_env, snap);
        if !src.is_dir() {
            return Err(StorageError::NotFound(format!(
                "snapshot {snap:?} of {from_env} not found"
            )));
        }
        for v in vols {
            let s = src.join(v);
            if !s.is_dir() {
                return Err(StorageError::Failed(format!(
                    "snapshot {snap:?} of {from_env} has no volume {v:?}"
                )));
            }
            let d = self.volume_path(to_env, v);
            if d.exists() {
                return Err(StorageError::Conflict(format!(
                    "volume {v:?} of {to_env} already exists"
                )));
            }
            mkdir_p(d.parent().expect("volume path has a parent"))?;
            let tmp = tmp_sibling(&d, "fork");
            if let Err(e) = copy_tree(&s, &tmp) {
                let _ = remove_tree(&tmp);
                return Err(e);
            }
            std::fs::rename(&tmp, &d).map_err(|e| StorageError::io(&d, e))?;
        }
        Ok(())
    }

    fn rollback(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError> {
        let src = self.snapshot_path(env, snap);
        if !src.is_dir() {
            return Err(StorageError::NotFound(format!(
                "snapshot {snap:?} of {env} not found"
            )));
        }
        for v in vols {
            let s = src.join(v);
            if !s.is_dir() {
                return Err(StorageError::Failed(format!(
                    "snapshot {snap:?} of {env} has no volume {v:?}"
                )));
            }
        }
        for v in vols {
            let d = self.volume_path(env, v);
            mkdir_p(d.parent().expect("volume path has a parent"))?;
            // Copy next to the volume first, then swap, so a failed copy leaves the
            // volume as it was.
            let new = tmp_sibling(&d, "rollback");
            if let Err(e) = copy_tree(&src.join(v), &new) {
                let _ = remove_tree(&new);
                return Err(e);
            }
            let old = tmp_sibling(&d, "old");
            if d.exists() {
                std::fs::rename(&d, &old).map_err(|e| StorageError::io(&d, e))?;
            }
            std::fs::rename(&new, &d).map_err(|e| StorageError::io(&d, e))?;
            remove_tree(&old)?;
        }
        Ok(())
    }

    fn destroy(&self, env: &str) -> Result<(), StorageError> {
        remove_tree(&self.data.join("envs").join(env).join("vol"))?;
        remove_tree(&self.data.join("snaps").join(env))?;
        Ok(())
    }
}
