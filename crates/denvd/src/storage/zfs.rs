//! `zfs` storage: every volume is a dataset mounted at `<data>/envs/<env>/vol/<name>`,
//! first `<pool>/envs/<env>/vol/<name>`. The parents (`<pool>/envs`, `<pool>/envs/<env>`,
//! `…/vol`, `…/gen`, `…/gen/<name>`) are created with `mountpoint=none`. The volume's
//! *live* dataset is the one whose `mountpoint` is the volume's directory; the others
//! (retired by a rollback) have `mountpoint=none`.
//!
//! - snapshot: ONE recursive snapshot of the environment's dataset,
//!   `zfs snapshot -r <pool>/envs/<env>@<snap>`, which ZFS takes atomically over every
//!   dataset below it (and which any `zfs` accepts; zfs-fuse's `zfs snapshot` takes a
//!   single argument). Then the marker directory `<data>/snaps/<env>/<snap>/` appears
//!   (made aside and renamed into place), holding `datasets`: one `<volume>\t<dataset>@<snap>`
//!   line per volume, naming the snapshot of the dataset that was live;
//! - fork: per volume, `zfs clone -o mountpoint=… <dataset>@<snap> <pool>/envs/<to>/vol/<name>`;
//! - rollback: per volume, the live dataset is unmounted and set `mountpoint=none`
//!   (retired, nothing renamed: zfs-fuse refuses to rename a dataset whose clones are
//!   mounted, i.e. forks that are running), and a clone of the snapshot,
//!   `<pool>/envs/<env>/gen/<name>/r<random>`, is mounted in its place. Unlike
//!   `zfs rollback -r`, this keeps every snapshot (later versions stay restorable and
//!   forkable) and works when later snapshots have forks;
//! - destroy: clones depend on their origin snapshot, so before destroying an
//!   environment, every dataset outside it whose origin is inside it (a fork) is promoted
//!   (`zfs promote`, one at a time until no origin points inside), which moves the
//!   snapshots it needs into the fork; then every dataset of the environment is unmounted
//!   (zfs-fuse can hang destroying a mounted clone) and `zfs destroy -r`'d. Forks
//!   therefore survive their parent's destruction.
//!
//! Disk quota: `zfs set quota=<bytes> <pool>/envs/<env>`, which bounds every volume of
//! the environment together with their snapshots (ZFS counts descendants and snapshots
//! in `quota`). A write past it fails with `EDQUOT` inside the environment only.

use super::{mkdir_p, remove_tree, run, tmp_sibling, Storage, StorageError};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file in a snapshot's marker directory naming each volume's dataset snapshot.
const DATASETS: &str = "datasets";

/// The `zfs` backend: a pool plus the data directory its datasets are mounted under.
#[derive(Debug, Clone)]
pub struct ZfsStorage {
    data: PathBuf,
    pool: String,
}

/// Held by every operation that changes datasets (create, snapshot, fork, rollback,
/// destroy, quota), by every `ZfsStorage` of the process: one change at a time.
/// Destroying an environment and its fork at the same time would race (one promotes the
/// datasets the other is destroying), and zfs-fuse (the user-space ZFS this project's
/// tests run on) was seen to hang for good on two unmounts running at once. On kernel
/// ZFS each of these operations takes milliseconds, so the order costs little.
static CHANGES: Mutex<()> = Mutex::new(());

/// Takes [`CHANGES`] (a panic while it was held does not keep it locked).
fn one_change_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    CHANGES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    fn envs_ds(&self) -> String {
        format!("{}/envs", self.pool)
    }

    fn env_ds(&self, env: &str) -> String {
        format!("{}/envs/{env}", self.pool)
    }

    fn vol_ds(&self, env: &str, vol: &str) -> String {
        format!("{}/envs/{env}/vol/{vol}", self.pool)
    }

    fn ensure_parents(&self, env: &str) -> Result<(), StorageError> {
        let root = self.env_ds(env);
        ensure_unmounted(&[self.envs_ds(), root.clone(), format!("{root}/vol")])
    }

    /// `(dataset, mountpoint)` of every file system of `env` (empty when it has none).
    fn filesystems(&self, env: &str) -> Vec<(String, String)> {
        list_filesystems(&self.env_ds(env), "mountpoint").unwrap_or_default()
    }

    /// The live dataset of volume `vol` of `env`: the one mounted at its directory.
    fn live(&self, fs: &[(String, String)], env: &str, vol: &str) -> Option<String> {
        let p = self.volume_path(env, vol).display().to_string();
        fs.iter().find(|(_, m)| *m == p).map(|(n, _)| n.clone())
    }

    /// The dataset snapshot holding volume `vol` of `env` as of `snap`: from the
    /// marker's `datasets` file, else (a marker without one) `<pool>/envs/<env>/vol/<vol>@<snap>`.
    /// The dataset snapshot holding each of `vols` in snapshot `snap` of `env`, in
    /// order. Errors name the missing snapshot or volume.
    fn snapshot_origins(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
    ) -> Result<Vec<String>, StorageError> {
        if !self.has_snapshot(env, snap) {
            return Err(StorageError::NotFound(format!(
                "snapshot {snap:?} of {env} not found"
            )));
        }
        vols.iter()
            .map(|v| {
                self.find_snapshot(env, v, snap).ok_or_else(|| {
                    StorageError::Failed(format!("snapshot {snap:?} of {env} has no volume {v:?}"))
                })
            })
            .collect()
    }

    fn find_snapshot(&self, env: &str, vol: &str, snap: &str) -> Option<String> {
        let listed = std::fs::read_to_string(self.snapshot_path(env, snap).join(DATASETS));
        let name = match listed {
            Ok(text) => text
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .find(|(v, _)| *v == vol)
                .map(|(_, ds)| ds.to_string())?,
            Err(_) => format!("{}@{snap}", self.vol_ds(env, vol)),
        };
        exists(&name).then_some(name)
    }

    /// Rolls volume `vol` of `env` back to `origin`: retires the live dataset (if any),
    /// mounts a new clone of `origin` in its place.
    fn rollback_one(
        &self,
        env: &str,
        vol: &str,
        live: Option<&str>,
        origin: &str,
    ) -> Result<(), StorageError> {
        let p = self.volume_path(env, vol);
        let gen = format!("{}/gen/{vol}", self.env_ds(env));
        ensure_unmounted(&[format!("{}/gen", self.env_ds(env)), gen.clone()])?;
        if let Some(live) = live {
            while_busy(|| unmount(live))?;
            run("zfs", &["set", "mountpoint=none", live])?;
        }
        let r: u32 = rand::random();
        mkdir_p(&p)?;
        if let Err(e) = clone(origin, &format!("{gen}/r{r:08x}"), &p) {
            // Mount the retired dataset again so the volume is as it was.
            if let Some(live) = live {
                let _ = run(
                    "zfs",
                    &["set", &format!("mountpoint={}", p.display()), live],
                );
            }
            return Err(e);
        }
        Ok(())
    }
}

/// `(dataset, value of prop)` of every file system under `root` (itself included), from
/// `zfs list -H -r -t filesystem -o name,<prop> <root>`. Errors when `root` is missing.
fn list_filesystems(root: &str, prop: &str) -> Result<Vec<(String, String)>, StorageError> {
    let out = run(
        "zfs",
        &[
            "list",
            "-H",
            "-r",
            "-t",
            "filesystem",
            "-o",
            &format!("name,{prop}"),
            root,
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect())
}

fn exists(ds: &str) -> bool {
    run("zfs", &["list", "-H", "-o", "name", ds]).is_ok()
}

/// Creates each missing dataset of `chain` (parents first) with `mountpoint=none`.
/// Tolerates a concurrent creator (two forks creating `<pool>/envs` at once).
fn ensure_unmounted(chain: &[String]) -> Result<(), StorageError> {
    for ds in chain {
        if !exists(ds) {
            if let Err(e) = run("zfs", &["create", "-o", "mountpoint=none", ds]) {
                if !exists(ds) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// `zfs clone -o mountpoint=<p> <origin> <ds>`.
fn clone(origin: &str, ds: &str, p: &Path) -> Result<(), StorageError> {
    run(
        "zfs",
        &[
            "clone",
            "-o",
            &format!("mountpoint={}", p.display()),
            origin,
            ds,
        ],
    )
    .map(|_| ())
}

/// `zfs unmount <ds>` when it is mounted.
fn unmount(ds: &str) -> Result<(), StorageError> {
    let mounted = match run("zfs", &["get", "-H", "-o", "value", "mounted", ds]) {
        Ok(m) => m,
        // Gone already: an earlier, interrupted `zfs destroy -r` (a busy sibling) took it.
        Err(e) if e.to_string().contains("does not exist") => return Ok(()),
        Err(e) => return Err(e),
    };
    if mounted.trim() == "yes" {
        run("zfs", &["unmount", ds])?;
    }
    Ok(())
}

/// Runs `op` again while it fails with `dataset is busy`, for up to 15 s: a file system
/// stays busy for a moment after the last container using it is removed (zfs-fuse).
fn while_busy(mut op: impl FnMut() -> Result<(), StorageError>) -> Result<(), StorageError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        match op() {
            Err(e) if e.to_string().contains("busy") && std::time::Instant::now() < deadline => {
                tracing::debug!("{e}; trying again");
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            r => return r,
        }
    }
}

impl Storage for ZfsStorage {
    fn name(&self) -> &'static str {
        "zfs"
    }

    fn data_dir(&self) -> &Path {
        &self.data
    }

    fn create(&self, env: &str, vol: &str) -> Result<PathBuf, StorageError> {
        let _one = one_change_at_a_time();
        let p = self.volume_path(env, vol);
        if self.live(&self.filesystems(env), env, vol).is_some() {
            return Ok(p);
        }
        self.ensure_parents(env)?;
        let mut ds = self.vol_ds(env, vol);
        if exists(&ds) {
            // Retired by a rollback that could not mount its clone: a new generation.
            let gen = format!("{}/gen/{vol}", self.env_ds(env));
            ensure_unmounted(&[format!("{}/gen", self.env_ds(env)), gen.clone()])?;
            let r: u32 = rand::random();
            ds = format!("{gen}/r{r:08x}");
        }
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
        let _one = one_change_at_a_time();
        let marker = self.snapshot_path(env, snap);
        if marker.exists() {
            return Err(StorageError::Conflict(format!(
                "snapshot {snap:?} of {env} already exists"
            )));
        }
        let fs = self.filesystems(env);
        let mut names = Vec::new();
        for v in vols {
            let Some(live) = self.live(&fs, env, v) else {
                return Err(StorageError::Failed(format!(
                    "volume {v:?} of {env} does not exist ({})",
                    self.vol_ds(env, v)
                )));
            };
            names.push(format!("{live}@{snap}"));
        }
        let all = format!("{}@{snap}", self.env_ds(env));
        if !vols.is_empty() {
            // No marker, so a snapshot by this name is a leftover of an attempt that
            // failed before its marker (nothing can have been forked from it): retake it.
            if exists(&all) {
                run("zfs", &["destroy", "-r", &all])?;
            }
            run("zfs", &["snapshot", "-r", &all])?;
        }
        let listing: String = vols
            .iter()
            .zip(&names)
            .map(|(v, n)| format!("{v}\t{n}\n"))
            .collect();
        let made = (|| {
            mkdir_p(marker.parent().expect("snapshot path has a parent"))?;
            let tmp = tmp_sibling(&marker, "partial");
            mkdir_p(&tmp)?;
            let f = tmp.join(DATASETS);
            std::fs::write(&f, listing).map_err(|e| StorageError::io(&f, e))?;
            std::fs::rename(&tmp, &marker).map_err(|e| {
                let _ = remove_tree(&tmp);
                StorageError::io(&marker, e)
            })
        })();
        if let Err(e) = made {
            if !vols.is_empty() {
                let _ = run("zfs", &["destroy", "-r", &all]);
            }
            return Err(e);
        }
        Ok(names)
    }

    fn fork(
        &self,
        from_env: &str,
        snap: &str,
        to_env: &str,
        vols: &[String],
    ) -> Result<(), StorageError> {
        let _one = one_change_at_a_time();
        if !self.has_snapshot(from_env, snap) {
            return Err(StorageError::NotFound(format!(
                "snapshot {snap:?} of {from_env} not found"
            )));
        }
        let mut origins = Vec::new();
        for v in vols {
            let Some(origin) = self.find_snapshot(from_env, v, snap) else {
                return Err(StorageError::Failed(format!(
                    "snapshot {snap:?} of {from_env} has no volume {v:?}"
                )));
            };
            if exists(&self.vol_ds(to_env, v)) {
                return Err(StorageError::Conflict(format!(
                    "volume {v:?} of {to_env} already exists"
                )));
            }
            origins.push(origin);
        }
        if !vols.is_empty() {
            self.ensure_parents(to_env)?;
        }
        for (v, origin) in vols.iter().zip(&origins) {
            let p = self.volume_path(to_env, v);
            mkdir_p(&p)?;
            clone(origin, &self.vol_ds(to_env, v), &p)?;
        }
        Ok(())
    }

    fn rollback(&self, env: &str, snap: &str, vols: &[String]) -> Result<(), StorageError> {
        let _one = one_change_at_a_time();
        let origins = self.snapshot_origins(env, snap, vols)?;
        if !vols.is_empty() {
            self.ensure_parents(env)?;
        }
        let fs = self.filesystems(env);
        for (v, origin) in vols.iter().zip(&origins) {
            let live = self.live(&fs, env, v);
            self.rollback_one(env, v, live.as_deref(), origin)?;
        }
        Ok(())
    }

    fn destroy(&self, env: &str) -> Result<(), StorageError> {
        let root = self.env_ds(env);
        let _one = one_change_at_a_time();
        if exists(&root) {
            // Promote every clone made from this environment's snapshots so the
            // snapshots it needs move out with it; a promoted clone inherits its
            // origin's origin, which may be inside too (a rolled-back volume), hence the
            // loop. (Clones are found through their `origin`; zfs-fuse has no `clones`
            // property.)
            let prefix = format!("{root}/");
            let mut rounds = 0;
            loop {
                let all = list_filesystems(&self.envs_ds(), "origin")?;
                // One at a time: promoting one fork of a snapshot re-points the other
                // forks of it at the promoted one (outside), so they need nothing.
                let outside = all.into_iter().find_map(|(name, origin)| {
                    (origin.starts_with(&prefix) && !name.starts_with(&prefix)).then_some(name)
                });
                let Some(name) = outside else { break };
                rounds += 1;
                if rounds > 10_000 {
                    return Err(StorageError::Failed(format!(
                        "destroy {root}: {name} still depends on it after {rounds} promotions"
                    )));
                }
                run("zfs", &["promote", &name])?;
            }
            // Deepest first; unmount before destroying (zfs-fuse needs it for clones).
            let mut ds: Vec<String> = self.filesystems(env).into_iter().map(|(n, _)| n).collect();
            ds.sort_by_key(|d| std::cmp::Reverse(d.len()));
            while_busy(|| {
                for d in &ds {
                    unmount(d)?;
                }
                run("zfs", &["destroy", "-r", &root]).map(|_| ())
            })?;
        }
        remove_tree(&self.data.join("envs").join(env).join("vol"))?;
        remove_tree(&self.data.join("snaps").join(env))?;
        Ok(())
    }

    /// Each volume's dataset snapshot is read through a temporary clone
    /// (`<pool>/envs/<env>/shipread-<random>`, mounted under a hidden directory of the
    /// data directory, destroyed afterwards).
    fn export_snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        w: &mut dyn std::io::Write,
    ) -> Result<(), StorageError> {
        let origins = self.snapshot_origins(env, snap, vols)?;
        let r: u32 = rand::random();
        let base = self.data.join(".shipread").join(format!("{env}-{r:08x}"));
        let mut clones: Vec<(String, PathBuf)> = Vec::new();
        let result = (|| {
            let mut trees = Vec::new();
            for (i, (v, origin)) in vols.iter().zip(&origins).enumerate() {
                let ds = format!("{}/shipread-{r:08x}-{i}", self.env_ds(env));
                let p = base.join(v);
                mkdir_p(&p)?;
                {
                    let _one = one_change_at_a_time();
                    clone(origin, &ds, &p)?;
                }
                clones.push((ds, p.clone()));
                trees.push((v.clone(), p));
            }
            super::ship::export_trees(&trees, w)
        })();
        let _one = one_change_at_a_time();
        for (ds, _) in &clones {
            let _ = while_busy(|| {
                unmount(ds)?;
                run("zfs", &["destroy", ds]).map(|_| ())
            });
        }
        let _ = remove_tree(&base);
        result
    }

    /// Each volume is received into a new dataset
    /// `<pool>/envs/<env>/ship/<snap>/<vol>` (mounted in the staging directory while it
    /// is filled), snapshotted as `…@<snap>`, unmounted; the marker's `datasets` file
    /// names those snapshots, so [`Storage::fork`] clones them like local ones.
    fn import_snapshot(
        &self,
        env: &str,
        snap: &str,
        vols: &[String],
        r: &mut dyn std::io::Read,
        limit: u64,
    ) -> Result<super::ship::Shipped, StorageError> {
        let marker = self.snapshot_path(env, snap);
        if marker.exists() {
            return Err(StorageError::Conflict(format!(
                "snapshot {snap:?} of {env} already exists"
            )));
        }
        for v in vols {
            super::validate_name("volume", v)?;
        }
        mkdir_p(marker.parent().expect("snapshot path has a parent"))?;
        let staging = tmp_sibling(&marker, "receiving");
        mkdir_p(&staging)?;
        let parent = format!("{}/ship/{snap}", self.env_ds(env));
        let mut made: Vec<String> = Vec::new();
        let result = (|| {
            {
                let _one = one_change_at_a_time();
                ensure_unmounted(&[
                    self.envs_ds(),
                    self.env_ds(env),
                    format!("{}/ship", self.env_ds(env)),
                ])?;
                if exists(&parent) {
                    // A leftover of a receive that failed: nothing can depend on it.
                    while_busy(|| run("zfs", &["destroy", "-r", &parent]).map(|_| ()))?;
                }
                ensure_unmounted(std::slice::from_ref(&parent))?;
                for v in vols {
                    let ds = format!("{parent}/{v}");
                    let p = staging.join(v);
                    mkdir_p(&p)?;
                    run(
                        "zfs",
                        &["create", "-o", &format!("mountpoint={}", p.display()), &ds],
                    )?;
                    made.push(ds);
                }
            }
            let got = super::ship::receive_into(&staging, vols, r, limit)?;
            let _one = one_change_at_a_time();
            let mut listing = String::new();
            for (v, ds) in vols.iter().zip(&made) {
                run("zfs", &["snapshot", &format!("{ds}@{snap}")])?;
                while_busy(|| unmount(ds))?;
                run("zfs", &["set", "mountpoint=none", ds])?;
                remove_tree(&staging.join(v))?;
                listing.push_str(&format!("{v}\t{ds}@{snap}\n"));
            }
            let f = staging.join(DATASETS);
            std::fs::write(&f, listing).map_err(|e| StorageError::io(&f, e))?;
            super::mark_received(&marker)?;
            std::fs::rename(&staging, &marker).map_err(|e| StorageError::io(&marker, e))?;
            Ok(got)
        })();
        if result.is_err() {
            let _one = one_change_at_a_time();
            for ds in made.iter().rev() {
                let _ = while_busy(|| unmount(ds));
            }
            if exists(&parent) {
                let _ = while_busy(|| run("zfs", &["destroy", "-r", &parent]).map(|_| ()));
            }
            let _ = remove_tree(&staging);
        }
        result
    }

    fn quota_kind(&self) -> &'static str {
        "zfs quota"
    }

    fn set_quota(&self, env: &str, bytes: u64) -> Result<(), StorageError> {
        let _one = one_change_at_a_time();
        self.ensure_parents(env)?;
        run(
            "zfs",
            &["set", &format!("quota={bytes}"), &self.env_ds(env)],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The backend on the pool `DENV_TEST_ZFS_POOL`, with a fresh data dir. A test asked
    /// to run without a pool fails.
    fn backend() -> (ZfsStorage, tempfile::TempDir) {
        let pool = std::env::var("DENV_TEST_ZFS_POOL").expect(
            "cannot run: DENV_TEST_ZFS_POOL is unset (just unit makes a pool with e2e/lib/zfs.sh)",
        );
        let tmp = tempfile::Builder::new()
            .prefix("denvd-zfs-")
            .tempdir_in("/var/tmp")
            .unwrap();
        let st = ZfsStorage::new(tmp.path().join("data"), &pool)
            .unwrap_or_else(|e| panic!("cannot run: {e}"));
        (st, tmp)
    }

    fn id(tag: &str) -> String {
        format!("env_t{tag}{:08x}", rand::random::<u32>())
    }

    fn write(st: &ZfsStorage, env: &str, vol: &str, s: &str) {
        std::fs::write(st.volume_path(env, vol).join("f"), s).unwrap();
    }

    fn read(st: &ZfsStorage, env: &str, vol: &str) -> String {
        std::fs::read_to_string(st.volume_path(env, vol).join("f")).unwrap()
    }

    fn datasets(st: &ZfsStorage, env: &str) -> String {
        run(
            "zfs",
            &[
                "list",
                "-H",
                "-t",
                "all",
                "-r",
                "-o",
                "name",
                &st.env_ds(env),
            ],
        )
        .unwrap_or_default()
    }

    /// One recursive snapshot over every volume; rollback to an older version keeps the
    /// later ones (and works when they were forked); forks survive their parent, through
    /// rollbacks, in any destroy order.
    #[test]
    #[ignore = "needs a zfs pool in DENV_TEST_ZFS_POOL (just unit makes one with e2e/lib/zfs.sh)"]
    fn snapshot_rollback_fork_destroy() {
        let (st, _t) = backend();
        let vols = vec!["a".to_string(), "b".to_string()];
        let (e, f1, f2, g) = (id("e"), id("f"), id("f"), id("g"));
        for v in &vols {
            st.create(&e, v).unwrap();
            write(&st, &e, v, &format!("{v}1"));
        }
        let names = st.snapshot(&e, "s1", &vols).unwrap();
        assert_eq!(
            names,
            vec![
                format!("{}@s1", st.vol_ds(&e, "a")),
                format!("{}@s1", st.vol_ds(&e, "b"))
            ]
        );
        assert!(
            exists(&format!("{}@s1", st.env_ds(&e))),
            "one recursive snapshot"
        );
        assert!(st.snapshot(&e, "s1", &vols).is_err(), "exists already");
        write(&st, &e, "a", "a2");
        st.snapshot(&e, "s2", &vols).unwrap();
        st.fork(&e, "s2", &f1, &vols).unwrap();
        assert_eq!(read(&st, &f1, "a"), "a2");
        write(&st, &e, "a", "a3");

        // Back to s1 although s2 has a fork (mounted); s2 is still there afterwards.
        st.rollback(&e, "s1", &vols).unwrap();
        assert_eq!(
            (read(&st, &e, "a"), read(&st, &e, "b")),
            ("a1".into(), "b1".into())
        );
        st.fork(&e, "s2", &f2, &vols).unwrap();
        assert_eq!(read(&st, &f2, "a"), "a2");
        st.rollback(&e, "s2", &vols).unwrap();
        assert_eq!(read(&st, &e, "a"), "a2");
        write(&st, &e, "a", "a4");
        st.snapshot(&e, "s3", &vols).unwrap();
        st.fork(&e, "s3", &g, &vols).unwrap();
        assert_eq!(read(&st, &g, "a"), "a4");
        assert!(st.fork(&e, "s3", &g, &vols).is_err(), "fork over a volume");
        assert!(st.fork(&e, "nope", &id("x"), &vols).is_err());

        // Destroy the parent first: every fork keeps its data.
        st.destroy(&e).unwrap();
        assert_eq!(datasets(&st, &e), "");
        assert!(!st.data_dir().join("envs").join(&e).join("vol").exists());
        assert!(!st.snapshot_path(&e, "s1").exists());
        st.destroy(&e).unwrap();
        assert_eq!(read(&st, &f1, "a"), "a2");
        assert_eq!(read(&st, &f2, "b"), "b1");
        assert_eq!(read(&st, &g, "a"), "a4");
        for x in [&f2, &g, &f1] {
            st.destroy(x).unwrap();
            assert_eq!(datasets(&st, x), "");
        }
    }

    /// An environment and its fork destroyed at the same time (denvd runs commands of
    /// different environments concurrently): both go, nothing is left.
    #[test]
    #[ignore = "needs a zfs pool in DENV_TEST_ZFS_POOL (just unit makes one with e2e/lib/zfs.sh)"]
    fn concurrent_destroy_of_parent_and_fork() {
        let (st, _t) = backend();
        let vols = vec!["a".to_string()];
        for _ in 0..3 {
            let (e, f) = (id("p"), id("c"));
            st.create(&e, "a").unwrap();
            st.snapshot(&e, "s1", &vols).unwrap();
            st.fork(&e, "s1", &f, &vols).unwrap();
            let threads: Vec<_> = [e.clone(), f.clone()]
                .into_iter()
                .map(|x| {
                    let st = st.clone();
                    std::thread::spawn(move || st.destroy(&x))
                })
                .collect();
            for t in threads {
                t.join().unwrap().unwrap();
            }
            assert_eq!(datasets(&st, &e) + &datasets(&st, &f), "");
        }
    }

    /// An environment without volumes still has snapshots.
    #[test]
    #[ignore = "needs a zfs pool in DENV_TEST_ZFS_POOL (just unit makes one with e2e/lib/zfs.sh)"]
    fn no_volumes() {
        let (st, _t) = backend();
        let (e, m) = (id("n"), id("m"));
        assert_eq!(st.snapshot(&e, "s1", &[]).unwrap(), Vec::<String>::new());
        assert!(st.has_snapshot(&e, "s1"));
        st.fork(&e, "s1", &m, &[]).unwrap();
        st.rollback(&e, "s1", &[]).unwrap();
        st.destroy(&e).unwrap();
        assert!(!st.has_snapshot(&e, "s1"));
        assert_eq!(datasets(&st, &e) + &datasets(&st, &m), "");
    }
}
