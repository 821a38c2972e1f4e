//! `zfs` storage: every volume is a dataset `<pool>/envs/<env>/vol/<name>` mounted at
//! `<data>/envs/<env>/vol/<name>` (the parents `<pool>/envs`, `<pool>/envs/<env>` and
//! `<pool>/envs/<env>/vol` are created with `mountpoint=none`).
//!
//! - snapshot: one atomic `zfs snapshot ds1@snap ds2@snap …` over every volume, plus the
//!   marker directory `<data>/snaps/<env>/<snap>/`;
//! - fork: `zfs clone -o mountpoint=… <pool>/envs/<from>/vol/<name>@<snap> <pool>/envs/<to>/vol/<name>`;
//! - rollback: `zfs rollback -r <ds>@<snap>` (ZFS semantics: snapshots of that volume
//!   taken after `<snap>` are destroyed; it fails if one of them has clones, i.e. was
//!   forked);
//! - destroy: clones depend on their origin snapshot, so before destroying an
//!   environment whose snapshots were forked, each such clone is promoted
//!   (`zfs promote`), which moves the origin snapshot into the clone's dataset; then every
//!   dataset of the environment is unmounted and `zfs destroy -r`'d. Forks therefore
//!   survive their parent's destruction.
//!
//! Disk quota: `zfs set quota=<bytes> <pool>/envs/<env>`, which bounds every volume of
//! the environment together with their snapshots (ZFS counts descendants and snapshots
//! in `quota`). A write past it fails with `EDQUOT` inside the environment only.

use super::{mkdir_p, remove_tree, run, tmp_sibling, Storage, StorageError};
use std::path::{Path, PathBuf};

/// The `zfs` backend: a pool plus the data directory its datasets are mounted under.
#[derive(Debug, Clone)]
pub struct ZfsStorage {
    data: PathBuf,
    pool: String,
}

impl ZfsStorage {
    /// A backend on `pool`, which must exist (`zpool list <pool>` succeeds).
    /// Error: `zfs pool "<pool>" not available: …`.
    pub fn new(data: impl Into<PathBuf>, pool: &str) -> Result<Self, StorageError> {
        let data = data.into();
        mkdir_p(&data)?;
        run("zpool", &["list", "-H", pool])
            .map_err(|e| StorageError::Failed(format!("zfs pool {pool:?} not available: {e}")))?;
        Ok(ZfsStorage {
            data,
            pool: pool.to_string(),
        })
    }

    fn env_ds(&self, env: &str) -> String {
        format!("{}/envs/{env}", self.pool)
    }

    fn vol_ds(&self, env: &str, vol: &str) -> String {
        format!("{}/envs/{env}/vol/{vol}", self.pool)
    }

    fn ensure_parents(&self, env: &str) -> Result<(), StorageError> {
        for ds in [
            format!("{}/envs", self.pool),
            self.env_ds(env),
            format!("{}/vol", self.env_ds(env)),
        ] {
            if !exists(&ds) {
                run("zfs", &["create", "-o", "mountpoint=none", &ds])?;
            }
        }
        Ok(())
    }
}

fn exists(ds: &str) -> bool {
    run("zfs", &["list", "-H", "-o", "name", ds]).is_ok()
}

impl Storage for ZfsStorage {
    fn name(&self) -> &'static str {
        "zfs"
    }

    fn data_dir(&self) -> &Path {
        &self.data
    }

    fn create(&self, env: &str, vol: &str) -> Result<PathBuf, StorageError> {
        let p = self.volume_path(env, vol);
        let ds = self.vol_ds(env, vol);
        if exists(&ds) {
            return Ok(p);
        }
        self.ensure_parents(env)?;
        mkdir_p(&p)?;
        run(
            "zfs",
            &["create", "-o", &format!("mountpoint={}", p.display()), &ds],
        )?;
        Ok(p)
    }

    fn snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
    ) -> Result<Vec<String>, StorageError> {
        let marker = self.snapshot_path(env, snap);
        if marker.exists() {
            return Err(StorageError::Failed(format!(
                "snapshot {snap:?} of {env} already exists"
            )));
        }
        let names: Vec<String> = vols
            .iter()
            .map(|v| format!("{}@{snap}", self.vol_ds(env, v)))
            .collect();
        if !names.is_empty() {
            let mut args = vec!["snapshot"];
            args.extend(names.iter().map(String::as_str));
            run("zfs", &args)?;
        }
        mkdir_p(marker.parent().expect("snapshot path has a parent"))?;
        let tmp = tmp_sibling(&marker, "partial");
        mkdir_p(&tmp)?;
        std::fs::rename(&tmp, &marker).map_err(|e| StorageError::io(&marker, e))?;
        Ok(names)
    }

    fn fork(
        &self,
        from_env: &str,
        snap: &str,
        to_env: &str,
        vols: &[String],
    ) -> Result<(), StorageError> {
        if !self.has_snapshot(from_env, snap) {
            return Err(StorageError::Failed(format!(
                "snapshot {snap:?} of {from_env} not found"
            )));
        }
        self.ensure_parents(to_env)?;
        for v in vols {
            let origin = format!("{}@{snap}", self.vol_ds(from_env, v));
            if !exists(&origin) {
                return Err(StorageError::Failed(format!(
                    "snapshot {snap:?} of {from_env} has no volume {v:?}"
                )));
            }
            let p = self.volume_path(to_env, v);
            mkdir_p(&p)?;
            run(
                "zfs",
                &[
                    "clone",
                    "-o",
                    &format!("mountpoint={}", p.display()),
                    &origin,
                    &self.vol_ds(to_env, v),
                ],
            )?;
        }
        Ok(())
    }

    fn rollback(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError> {
        for v in vols {
            run(
                "zfs",
                &["rollback", "-r", &format!("{}@{snap}", self.vol_ds(env, v))],
            )?;
        }
        Ok(())
    }

    fn destroy(&self, env: &str) -> Result<(), StorageError> {
        let root = self.env_ds(env);
        if exists(&root) {
            // Promote every clone made from this environment's snapshots so the
            // snapshots move out with them. (Clones are found through their `origin`;
            // zfs-fuse has no `clones` property.)
            let all = run(
                "zfs",
                &[
                    "list",
                    "-H",
                    "-r",
                    "-t",
                    "filesystem",
                    "-o",
                    "name,origin",
                    &format!("{}/envs", self.pool),
                ],
            )?;
            let prefix = format!("{root}/");
            for line in all.lines() {
                let mut cols = line.split('\t');
                let (Some(name), Some(origin)) = (cols.next(), cols.next()) else {
                    continue;
                };
                if origin.starts_with(&prefix) && !name.starts_with(&prefix) {
                    run("zfs", &["promote", name])?;
                }
            }
            let datasets = run(
                "zfs",
                &["list", "-H", "-r", "-t", "filesystem", "-o", "name", &root],
            )?;
            // Deepest first; unmount before destroying (zfs-fuse needs it for clones).
            let mut ds: Vec<&str> = datasets.lines().filter(|l| !l.is_empty()).collect();
            ds.sort_by_key(|d| std::cmp::Reverse(d.len()));
            for d in &ds {
                let _ = run("zfs", &["unmount", d]);
            }
            run("zfs", &["destroy", "-r", &root])?;
        }
        remove_tree(&self.data.join("envs").join(env).join("vol"))?;
        remove_tree(&self.data.join("snaps").join(env))?;
        Ok(())
    }

    fn quota_kind(&self) -> &'static str {
        "zfs quota"
    }

    fn set_quota(&self, env: &str, bytes: u64) -> Result<(), StorageError> {
        self.ensure_parents(env)?;
        run(
            "zfs",
            &["set", &format!("quota={bytes}"), &self.env_ds(env)],
        )?;
        Ok(())
    }
}
