//! `btrfs` storage: the data directory is on a btrfs file system and every volume is a
//! subvolume. A snapshot is a read-only subvolume snapshot per volume
//! (`btrfs subvolume snapshot -r`), a fork is a writable snapshot of that, and a rollback
//! deletes the volume's subvolume and snapshots the saved one back in its place. All of
//! these are constant time regardless of data size.
//!
//! Snapshots are independent subvolumes (copy-on-write shares the blocks), so an
//! environment and its snapshots can be destroyed while forks made from them live on.
//!
//! Disk quota: quotas are enabled on the file system (`btrfs quota enable`) when the
//! backend opens. The environment's quota (bytes) is kept in `<data>/envs/<env>/vol/.quota`
//! and set as the exclusive limit of every volume subvolume's own qgroup (`btrfs qgroup
//! limit -e <bytes> <volume>`) whenever a volume is created, forked or rolled back, and
//! on every existing volume when the quota is set. Each volume may so hold at most the
//! quota of data it does not share: what it wrote itself, not what a fork shares with
//! the snapshot it came from. A write past it fails with `EDQUOT` inside the environment
//! only.
//!
//! Why level-0 limits and not one level-1 qgroup over the environment's volumes: a
//! snapshot (read-only or a fork) of a subvolume that is a member of a higher-level
//! qgroup marks the whole file system's qgroup data inconsistent, and while it is so the
//! kernel accounts nothing and no limit of any environment holds, until a rescan that
//! reads every extent of the file system. Level-0 qgroups stay consistent through
//! snapshots, forks and deletes (measured on kernel 6.18: a 64 MiB exclusive limit held
//! on the source, its read-only snapshot's fork and the source again, with no rescan).
//!
//! Deleting a subvolume taller than the kernel's `drop_subtree_threshold` can still flag
//! the data inconsistent; the backend starts a rescan after every destroy and rollback
//! when it is flagged, and waits for one before setting a quota.

use super::{mkdir_p, remove_tree, run, subdirs, tmp_sibling, Storage, StorageError};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The `btrfs` backend rooted at a data directory on btrfs.
#[derive(Debug, Clone)]
pub struct BtrfsStorage {
    data: PathBuf,
    quotas: bool,
}

impl BtrfsStorage {
    /// A backend on `data`, which must be on a btrfs file system (checked with
    /// `stat -f`). Error: `<data> is not on btrfs (found <type>)`.
    pub fn new(data: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let data = data.into();
        mkdir_p(&data)?;
        let fs = run("stat", &["-f", "-c", "%T", &data.to_string_lossy()])?;
        let fs = fs.trim();
        if fs != "btrfs" {
            return Err(StorageError::Failed(format!(
                "{} is not on btrfs (found {fs})",
                data.display()
            )));
        }
        let quotas = match run("btrfs", &["quota", "enable", &data.to_string_lossy()]) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!("btrfs quotas unavailable, volumes have no quota: {e}");
                false
            }
        };
        Ok(BtrfsStorage { data, quotas })
    }

    /// When the qgroup data is flagged inconsistent, rescans it (waiting when `wait`).
    /// Failures are logged: quotas then do not hold until a later rescan.
    fn rescan_if_inconsistent(&self, wait: bool) {
        if !self.quotas {
            return;
        }
        let data = self.data.to_string_lossy();
        let flagged = std::process::Command::new("btrfs")
            .args(["qgroup", "show", &data])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stderr).contains("inconsistent"))
            .unwrap_or(false);
        if !flagged {
            return;
        }
        let r = if wait {
            // `-w` starts one and waits; when one already runs, `-W` waits for it.
            run("btrfs", &["quota", "rescan", "-w", &data])
                .or_else(|_| run("btrfs", &["quota", "rescan", "-W", &data]))
        } else {
            run("btrfs", &["quota", "rescan", &data])
        };
        if let Err(e) = r {
            tracing::warn!("btrfs qgroup rescan: {e}");
        }
    }

    /// Where the environment's quota is kept: `<data>/envs/<env>/vol/.quota` (decimal
    /// bytes), removed with the volumes by `destroy`.
    fn quota_file(&self, env: &str) -> PathBuf {
        self.data.join("envs").join(env).join("vol").join(".quota")
    }

    /// The environment's quota in bytes, `None` when none was set (or quotas are off).
    fn quota_of(&self, env: &str) -> Option<u64> {
        if !self.quotas {
            return None;
        }
        std::fs::read_to_string(self.quota_file(env))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Sets the environment's quota, if it has one, as the exclusive limit of the volume
    /// subvolume at `p` (which a snapshot may have given its source's limit).
    fn limit_volume(&self, env: &str, p: &Path) -> Result<(), StorageError> {
        let Some(bytes) = self.quota_of(env) else {
            return Ok(());
        };
        run(
            "btrfs",
            &[
                "qgroup",
                "limit",
                "-e",
                &bytes.to_string(),
                &p.to_string_lossy(),
            ],
        )?;
        Ok(())
    }
}

/// Whether `p` is the root of a btrfs subvolume (inode 256).
fn is_subvolume(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| m.is_dir() && m.ino() == 256)
        .unwrap_or(false)
}

fn subvol_delete(p: &Path) -> Result<(), StorageError> {
    if is_subvolume(p) {
        // Nested subvolumes (a container could create one inside a volume) must go first.
        for n in subdirs_all(p) {
            subvol_delete(&p.join(n))?;
        }
        run("btrfs", &["subvolume", "delete", &p.to_string_lossy()])?;
        Ok(())
    } else {
        remove_tree(p)
    }
}

/// All sub-directory names, including hidden ones.
fn subdirs_all(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| is_subvolume(&p.join(n)))
                .collect()
        })
        .unwrap_or_default()
}

/// A snapshot of `src` at `dst`, read-only or writable.
fn snapshot_subvol(src: &Path, dst: &Path, read_only: bool) -> Result<(), StorageError> {
    let (s, d) = (src.to_string_lossy(), dst.to_string_lossy());
    let mut args = vec!["subvolume", "snapshot"];
    if read_only {
        args.push("-r");
    }
    args.extend([&*s, &*d]);
    run("btrfs", &args)?;
    Ok(())
}

impl Storage for BtrfsStorage {
    fn name(&self) -> &'static str {
        "btrfs"
    }

    fn data_dir(&self) -> &Path {
        &self.data
    }

    fn create(&self, env: &str, vol: &str) -> Result<PathBuf, StorageError> {
        let p = self.volume_path(env, vol);
        if is_subvolume(&p) {
            return Ok(p);
        }
        if p.exists() {
            return Err(StorageError::Failed(format!(
                "{} exists and is not a btrfs subvolume",
                p.display()
            )));
        }
        mkdir_p(p.parent().expect("volume path has a parent"))?;
        let path = p.to_string_lossy();
        run("btrfs", &["subvolume", "create", &path])?;
        self.limit_volume(env, &p)?;
        Ok(p)
    }

    /// Commits the file system (`syncfs`): a subvolume snapshot commits a transaction,
    /// and with quotas on, that commit flushes the dirty data and accounts every extent
    /// changed since the last one (a cost that grows with the forks sharing them). Done
    /// here, outside the frozen window, the snapshot's own commit has almost nothing left.
    fn prepare_snapshot(
        &self,
        _env: &str,
        _snap: &str,
        _vols: &[String],
    ) -> Result<(), StorageError> {
        let dir = std::fs::File::open(&self.data).map_err(|e| StorageError::io(&self.data, e))?;
        nix::unistd::syncfs(&dir).map_err(|e| StorageError::io(&self.data, e.into()))
    }

    fn snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
    ) -> Result<Vec<String>, StorageError> {
        let dst = self.snapshot_path(env, snap);
        if dst.exists() {
            return Err(StorageError::Conflict(format!(
                "snapshot {snap:?} of {env} already exists"
            )));
        }
        mkdir_p(dst.parent().expect("snapshot path has a parent"))?;
        let tmp = tmp_sibling(&dst, "partial");
        mkdir_p(&tmp)?;
        let cleanup = |tmp: &Path| {
            for n in subdirs_all(tmp) {
                let _ = subvol_delete(&tmp.join(n));
            }
            let _ = remove_tree(tmp);
        };
        let mut out = Vec::new();
        for v in vols {
            let src = self.volume_path(env, v);
            if !is_subvolume(&src) {
                cleanup(&tmp);
                return Err(StorageError::Failed(format!(
                    "volume {v:?} of {env} is not a btrfs subvolume ({})",
                    src.display()
                )));
            }
            if let Err(e) = snapshot_subvol(&src, &tmp.join(v), true) {
                cleanup(&tmp);
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
            if !is_subvolume(&s) {
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
            snapshot_subvol(&s, &d, false)?;
            self.limit_volume(to_env, &d)?;
        }
        Ok(())
    }

    fn rollback(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError> {
        let src = self.snapshot_path(env, snap);
        for v in vols {
            if !is_subvolume(&src.join(v)) {
                return Err(StorageError::Failed(format!(
                    "snapshot {snap:?} of {env} has no volume {v:?}"
                )));
            }
        }
        for v in vols {
            let d = self.volume_path(env, v);
            mkdir_p(d.parent().expect("volume path has a parent"))?;
            // Snapshot next to the volume, then swap, so a failure leaves it as it was.
            let new = tmp_sibling(&d, "rollback");
            snapshot_subvol(&src.join(v), &new, false)?;
            self.limit_volume(env, &new)?;
            let old = tmp_sibling(&d, "old");
            if d.exists() {
                std::fs::rename(&d, &old).map_err(|e| StorageError::io(&d, e))?;
            }
            std::fs::rename(&new, &d).map_err(|e| StorageError::io(&d, e))?;
            subvol_delete(&old)?;
        }
        self.rescan_if_inconsistent(true);
        Ok(())
    }

    fn destroy(&self, env: &str) -> Result<(), StorageError> {
        let vol_root = self.data.join("envs").join(env).join("vol");
        for n in subdirs_all(&vol_root) {
            subvol_delete(&vol_root.join(n))?;
        }
        remove_tree(&vol_root)?;
        let snap_root = self.data.join("snaps").join(env);
        let mut snaps = subdirs(&snap_root);
        // Half-made snapshots (".<name>.partial-…") too.
        snaps.extend(
            std::fs::read_dir(&snap_root)
                .map(|rd| {
                    rd.flatten()
                        .filter_map(|e| e.file_name().to_str().map(str::to_string))
                        .filter(|n| n.starts_with('.'))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
        );
        for s in snaps {
            let sp = snap_root.join(&s);
            for n in subdirs_all(&sp) {
                subvol_delete(&sp.join(n))?;
            }
        }
        remove_tree(&snap_root)?;
        if self.quotas {
            // The deleted subvolumes' own qgroups, once the cleaner has dropped them.
            let _ = run(
                "btrfs",
                &["qgroup", "clear-stale", &self.data.to_string_lossy()],
            );
        }
        self.rescan_if_inconsistent(false);
        Ok(())
    }

    /// Each volume is received into a new subvolume, which is then made read-only
    /// (`btrfs property set -ts <p> ro true`), like a snapshot taken here.
    fn import_snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        r: &mut dyn std::io::Read,
        limit: u64,
    ) -> Result<super::ship::Shipped, StorageError> {
        super::import_staged(
            &self.snapshot_path(env, snap),
            vols,
            r,
            limit,
            &|p| run("btrfs", &["subvolume", "create", &p.to_string_lossy()]).map(|_| ()),
            &|p| {
                run(
                    "btrfs",
                    &["property", "set", "-ts", &p.to_string_lossy(), "ro", "true"],
                )
                .map(|_| ())
            },
            &|p| {
                let _ = subvol_delete(p);
            },
        )
    }

    fn quota_kind(&self) -> &'static str {
        if self.quotas {
            "btrfs qgroup"
        } else {
            "none"
        }
    }

    fn set_quota(&self, env: &str, bytes: u64) -> Result<(), StorageError> {
        if !self.quotas {
            return Ok(());
        }
        let f = self.quota_file(env);
        mkdir_p(f.parent().expect("quota file has a parent"))?;
        let tmp = tmp_sibling(&f, "new");
        std::fs::write(&tmp, bytes.to_string()).map_err(|e| StorageError::io(&tmp, e))?;
        std::fs::rename(&tmp, &f).map_err(|e| StorageError::io(&f, e))?;
        self.rescan_if_inconsistent(true);
        let vol_root = f.parent().expect("quota file has a parent");
        for n in subdirs_all(vol_root) {
            self.limit_volume(env, &vol_root.join(n))?;
        }
        Ok(())
    }
}
