//! The `dir` backend's short frozen window: a pre-copy made while the services run,
//! then, while they are frozen, only what changed since the pre-copy began.
//!
//! # Why the result equals the volume at the freeze
//!
//! [`start_precopy`] first creates a marker file next to the copies and reads its change
//! time `T0` (the file system's own clock), then [`precopy_volume`] copies each volume
//! with `cp -a`. A wall clock set between the two (more than [`MAX_CLOCK_STEP`] against
//! the monotonic clock) voids the comparison and the caller copies in full. While frozen,
//! [`sync_tree`] walks the volume and its pre-copy side by side:
//!
//! - an entry of the copy the volume no longer has is removed;
//! - a non-directory is kept only when all of these hold: the copy has an entry of the
//!   same type; the volume's entry last changed (`ctime`) before `T0 - RACY_MARGIN`;
//!   size, modification time (ns), mode, owner, group and device number are equal; it is
//!   not a regular file with more than one hard link; and no process of the frozen
//!   containers (every process when they are not known) maps it shared and writable
//!   (`/proc/<pid>/maps`). Anything else is removed from the copy and copied again
//!   with `cp -a`, all in one `cp` call so hard links among them stay links. Every write,
//!   truncate, chmod, chown, xattr change, link or rename sets the entry's `ctime` to the
//!   time of the change, so an entry whose `ctime` is older than `T0` (less a margin for
//!   timestamp granularity and for a `write` still copying data after it set `ctime`)
//!   was not changed after the pre-copy began and `cp` copied its final content.
//!   Writes through a shared writable memory map need not touch `ctime` while their
//!   page stays writable, hence two rules: [`precopy_volume`] writes the volume's dirty
//!   pages back (`syncfs`) after `T0` and before it copies, which write-protects every
//!   mapped page, so a later write faults and sets `ctime` (even when the map is closed
//!   by the freeze); and the `/proc/*/maps` rule (the writers are frozen while it is
//!   read) covers a map still open. Hard-linked files are always copied again so their links stay exact.
//! - a directory is walked; a directory missing from the copy (or of another type there)
//!   is copied whole. A directory that changed, or whose entries the sync touched, gets
//!   its mode, owner, extended attributes and times set from the volume afterwards
//!   (deepest first).
//!
//! The work while frozen is one `lstat` per entry of both trees plus the copy of what
//! changed since `T0 - RACY_MARGIN`; it does not grow with unchanged data. When the
//! changed paths do not fit one `cp` call ([`MAX_ARGS_BYTES`]) the caller falls back to
//! a full copy.

use super::{remove_tree, StorageError};
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How much older than the pre-copy's start (`T0`) an entry's `ctime` must be for the
/// entry to count as unchanged: covers coarse (up to 1 s) timestamps and a `write` that
/// set `ctime` before `T0` and was still copying its data when the pre-copy read it.
pub const RACY_MARGIN: Duration = Duration::from_secs(5);

/// Largest total length of the paths handed to one `cp` while frozen (bytes); more
/// changed paths than that makes the caller copy the volume in full instead.
pub const MAX_ARGS_BYTES: usize = 512 << 10;

/// Name of the marker file in a pre-copy directory; its `ctime` is `T0`.
pub const MARKER: &str = ".denv-precopy";

/// A point in time as (seconds, nanoseconds) since the epoch, as `stat` reports it.
pub type Stamp = (i64, i64);

/// What [`sync_tree`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SyncStats {
    /// Entries (files, links, whole directories) copied again.
    pub copied: usize,
    /// Entries of the copy removed (gone from the volume or replaced).
    pub removed: usize,
    /// Directories whose attributes were set again.
    pub dirs_fixed: usize,
    /// Entries of the volume compared.
    pub scanned: usize,
}

/// Why [`sync_tree`] gave up (the caller then copies in full).
#[derive(Debug)]
pub enum SyncError {
    /// Too many changed paths for one `cp` call.
    TooMany(usize),
    /// A file system or `cp` error.
    Storage(StorageError),
}

impl From<StorageError> for SyncError {
    fn from(e: StorageError) -> Self {
        SyncError::Storage(e)
    }
}

/// Largest change of the wall clock against the monotonic clock between the pre-copy's
/// start and the freeze; more means the clock was set (stepped), `ctime`s cannot be
/// compared with `T0`, and [`marker_stamp`] refuses (the caller copies in full).
pub const MAX_CLOCK_STEP: Duration = Duration::from_secs(1);

/// Wall clock minus monotonic clock (ns), relative to the first call in this process.
fn clock_offset_ns() -> i128 {
    static START: std::sync::OnceLock<(std::time::Instant, std::time::SystemTime)> =
        std::sync::OnceLock::new();
    let (i0, s0) = *START.get_or_init(|| (std::time::Instant::now(), std::time::SystemTime::now()));
    let wall = match std::time::SystemTime::now().duration_since(s0) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    };
    wall - i0.elapsed().as_nanos() as i128
}

/// Creates `dir` (which must not exist) with the marker in it (holding the clock offset,
/// see [`MAX_CLOCK_STEP`]) and returns `T0`, the marker's change time. The pre-copies are
/// then made inside `dir`.
pub fn start_precopy(dir: &Path) -> Result<Stamp, StorageError> {
    std::fs::create_dir(dir).map_err(|e| StorageError::io(dir, e))?;
    let m = dir.join(MARKER);
    let body = format!("{} {}\n", std::process::id(), clock_offset_ns());
    std::fs::write(&m, body).map_err(|e| StorageError::io(&m, e))?;
    marker_stamp(dir)
}

/// Copies volume `src` to `dst` (inside a directory made by [`start_precopy`]) with
/// `cp -a --reflink=auto` while the volume is in use. Files that vanish or change while
/// they are copied make `cp` complain; that is expected and accepted (the frozen pass
/// removes, adds and copies again whatever differs), so this fails only when `cp` cannot
/// run or `dst` was not created at all.
pub fn precopy_volume(src: &Path, dst: &Path) -> Result<(), StorageError> {
    // Write the volume's dirty pages back first (after `T0`): that write-protects every
    // shared writable map of them, so a later write through a map faults and sets
    // `ctime`, even when the map is gone by the freeze. Without it a page dirtied before
    // `T0` stays writable and takes later writes with no trace in the metadata.
    let dir = std::fs::File::open(src).map_err(|e| StorageError::io(src, e))?;
    nix::unistd::syncfs(&dir).map_err(|e| StorageError::io(src, e.into()))?;
    let out = Command::new("cp")
        .args(["-a", "--reflink=auto", "--"])
        .arg(src)
        .arg(dst)
        .output()
        .map_err(|e| StorageError::Failed(format!("cp: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if !dst.is_dir() {
            return Err(StorageError::Failed(format!(
                "cp -a {} {}: {}",
                src.display(),
                dst.display(),
                err.trim()
            )));
        }
        tracing::debug!(src = %src.display(), "pre-copy of a changing volume: {}", err.trim());
    }
    Ok(())
}

/// `T0` of a pre-copy directory made by [`start_precopy`]. Errors when the marker is
/// missing or unreadable, was written by another process, or the wall clock was stepped
/// by more than [`MAX_CLOCK_STEP`] since (`the clock moved by N ms since the pre-copy
/// began`).
pub fn marker_stamp(dir: &Path) -> Result<Stamp, StorageError> {
    let m = dir.join(MARKER);
    let body = std::fs::read_to_string(&m).map_err(|e| StorageError::io(&m, e))?;
    let mut f = body.split_ascii_whitespace();
    let (pid, offset) = (
        f.next().and_then(|p| p.parse::<u32>().ok()),
        f.next().and_then(|o| o.parse::<i128>().ok()),
    );
    let (Some(pid), Some(offset)) = (pid, offset) else {
        return Err(StorageError::Failed(format!(
            "{}: not a pre-copy marker",
            m.display()
        )));
    };
    if pid != std::process::id() {
        return Err(StorageError::Failed(format!(
            "{}: pre-copy made by another process ({pid})",
            m.display()
        )));
    }
    let step = (clock_offset_ns() - offset).unsigned_abs();
    if step > MAX_CLOCK_STEP.as_nanos() {
        return Err(StorageError::Failed(format!(
            "the clock moved by {} ms since the pre-copy began",
            step / 1_000_000
        )));
    }
    let md = std::fs::symlink_metadata(&m).map_err(|e| StorageError::io(&m, e))?;
    Ok((md.ctime(), md.ctime_nsec()))
}

/// `T0 - RACY_MARGIN`: entries whose `ctime` is before it count as unchanged.
pub fn cutoff_of(t0: Stamp) -> Stamp {
    (t0.0 - RACY_MARGIN.as_secs() as i64, t0.1)
}

/// `(st_dev, st_ino)` of every file the processes `pids` (all processes when `None`) map
/// shared and writable, from `/proc/<pid>/maps` (read with the `procfs` crate; processes
/// that end while it is read are skipped). Reading every process's maps costs about 1 ms
/// per process, hence the restriction to the frozen containers' processes
/// ([`cgroup_pids_of`]).
pub fn shared_writable_maps(pids: Option<&[u32]>) -> HashSet<(u64, u64)> {
    let mut out = HashSet::new();
    if let Some(pids) = pids {
        for pid in pids {
            if let Ok(p) = i32::try_from(*pid)
                .map_err(drop)
                .and_then(|pid| procfs::process::Process::new(pid).map_err(drop))
            {
                maps_of(&p, &mut out);
            }
        }
        return out;
    }
    let Ok(all) = procfs::process::all_processes() else {
        return out;
    };
    for p in all.flatten() {
        maps_of(&p, &mut out);
    }
    out
}

fn maps_of(p: &procfs::process::Process, out: &mut HashSet<(u64, u64)>) {
    use procfs::process::MMPermissions;
    let Ok(maps) = p.maps() else {
        return;
    };
    for m in maps {
        if !m
            .perms
            .contains(MMPermissions::WRITE | MMPermissions::SHARED)
            || m.inode == 0
        {
            continue;
        }
        let (Ok(maj), Ok(min)) = (u64::try_from(m.dev.0), u64::try_from(m.dev.1)) else {
            continue;
        };
        out.insert((nix::sys::stat::makedev(maj, min), m.inode));
    }
}

/// Every process of the control group that `docker pause` freezes for process `pid` (the
/// v1 `freezer` hierarchy when there is one, else the v2 group), child groups included: a
/// container's processes from its init process. `None` when the group cannot be read or
/// lists no process (the caller then looks at all processes).
pub fn cgroup_pids_of(pid: u32) -> Option<Vec<u32>> {
    let groups = procfs::process::Process::new(i32::try_from(pid).ok()?)
        .ok()?
        .cgroups()
        .ok()?;
    let mut candidates = Vec::new();
    for g in groups {
        let rel = g.pathname.trim_start_matches('/');
        if g.controllers.iter().any(|c| c == "freezer") {
            candidates.insert(0, Path::new("/sys/fs/cgroup/freezer").join(rel));
        } else if g.controllers.is_empty() {
            candidates.push(Path::new("/sys/fs/cgroup").join(rel));
            candidates.push(Path::new("/sys/fs/cgroup/unified").join(rel));
        }
    }
    let root = candidates
        .into_iter()
        .find(|c| c.join("cgroup.procs").is_file())?;
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).ok()?;
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

struct Plan<'a> {
    cutoff: Stamp,
    mapped: &'a HashSet<(u64, u64)>,
    /// Paths relative to the volume root to copy again.
    copy: Vec<PathBuf>,
    args_bytes: usize,
    /// Directories (relative) whose attributes to set, deepest first.
    dirs: Vec<PathBuf>,
    stats: SyncStats,
}

/// Makes `dst`, a copy of `src` begun after `T0` (see the module docs), equal to `src`
/// as it is now. `src` must not change while this runs (its writers are frozen).
/// `mapped` is [`shared_writable_maps`] read while frozen.
///
/// Errors: [`SyncError::TooMany`] when the changed paths exceed [`MAX_ARGS_BYTES`];
/// file system and `cp` errors naming the path. On error `dst` is in an unspecified
/// state and must be discarded.
pub fn sync_tree(
    src: &Path,
    dst: &Path,
    t0: Stamp,
    mapped: &HashSet<(u64, u64)>,
) -> Result<SyncStats, SyncError> {
    let mut plan = Plan {
        cutoff: cutoff_of(t0),
        mapped,
        copy: Vec::new(),
        args_bytes: 0,
        dirs: Vec::new(),
        stats: SyncStats::default(),
    };
    let root = std::fs::symlink_metadata(src).map_err(|e| StorageError::io(src, e))?;
    walk(src, dst, Path::new(""), &root, &mut plan)?;
    if !plan.copy.is_empty() {
        let mut cmd = Command::new("cp");
        cmd.current_dir(src)
            .args(["-a", "--reflink=auto", "--parents", "-t"])
            .arg(dst)
            .arg("--")
            .args(&plan.copy);
        let out = cmd
            .output()
            .map_err(|e| StorageError::Failed(format!("cp: {e}")))?;
        if !out.status.success() {
            return Err(StorageError::Failed(format!(
                "cp -a --parents into {}: {}",
                dst.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
            .into());
        }
        plan.stats.copied = plan.copy.len();
    }
    for rel in &plan.dirs {
        let (s, d) = (src.join(rel), dst.join(rel));
        copy_dir_attrs(&s, &d)?;
        plan.stats.dirs_fixed += 1;
    }
    Ok(plan.stats)
}

fn entries(dir: &Path) -> Result<BTreeMap<OsString, Metadata>, StorageError> {
    let mut out = BTreeMap::new();
    let rd = std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))?;
    for e in rd {
        let e = e.map_err(|e| StorageError::io(dir, e))?;
        let p = e.path();
        match std::fs::symlink_metadata(&p) {
            Ok(m) => {
                out.insert(e.file_name(), m);
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(StorageError::io(&p, err)),
        }
    }
    Ok(out)
}

fn before(t: Stamp, cutoff: Stamp) -> bool {
    t < cutoff
}

/// Whether the copy `d` of volume entry `s` (a non-directory) can be kept.
fn unchanged(s: &Metadata, d: Option<&Metadata>, plan: &Plan<'_>) -> bool {
    let Some(d) = d else { return false };
    let (st, dt) = (s.file_type(), d.file_type());
    let same_type = (st.is_file() && dt.is_file())
        || (st.is_symlink() && dt.is_symlink())
        || (st.is_fifo() && dt.is_fifo())
        || (st.is_socket() && dt.is_socket())
        || (st.is_block_device() && dt.is_block_device())
        || (st.is_char_device() && dt.is_char_device());
    same_type
        && before((s.ctime(), s.ctime_nsec()), plan.cutoff)
        && s.len() == d.len()
        && s.mtime() == d.mtime()
        && s.mtime_nsec() == d.mtime_nsec()
        && s.mode() == d.mode()
        && s.uid() == d.uid()
        && s.gid() == d.gid()
        && s.rdev() == d.rdev()
        && !(st.is_file() && s.nlink() > 1)
        && !plan.mapped.contains(&(s.dev(), s.ino()))
}

fn push_copy(rel: PathBuf, plan: &mut Plan<'_>) -> Result<(), SyncError> {
    plan.args_bytes += rel.as_os_str().len() + 1;
    plan.copy.push(rel);
    if plan.args_bytes > MAX_ARGS_BYTES {
        return Err(SyncError::TooMany(plan.copy.len()));
    }
    Ok(())
}

fn walk(
    src: &Path,
    dst: &Path,
    rel: &Path,
    src_md: &Metadata,
    plan: &mut Plan<'_>,
) -> Result<(), SyncError> {
    let (s_dir, d_dir) = (src.join(rel), dst.join(rel));
    let se = entries(&s_dir)?;
    let de = entries(&d_dir)?;
    let mut touched = false;
    for name in de.keys() {
        if !se.contains_key(name) {
            remove_tree(&d_dir.join(name))?;
            plan.stats.removed += 1;
            touched = true;
        }
    }
    for (name, s) in &se {
        plan.stats.scanned += 1;
        let r = rel.join(name);
        let d = de.get(name);
        if s.is_dir() {
            if d.is_some_and(Metadata::is_dir) {
                walk(src, dst, &r, s, plan)?;
                continue;
            }
        } else if unchanged(s, d, plan) {
            continue;
        }
        if d.is_some() {
            remove_tree(&d_dir.join(name))?;
            plan.stats.removed += 1;
        }
        touched = true;
        push_copy(r, plan)?;
    }
    if touched || !before((src_md.ctime(), src_md.ctime_nsec()), plan.cutoff) {
        plan.dirs.push(rel.to_path_buf());
    }
    Ok(())
}

/// Sets `d`'s owner, mode, extended attributes and times to `s`'s (both directories).
/// Extended attributes the file system refuses are skipped, as `cp -a` does.
fn copy_dir_attrs(s: &Path, d: &Path) -> Result<(), StorageError> {
    let md = std::fs::symlink_metadata(s).map_err(|e| StorageError::io(s, e))?;
    std::os::unix::fs::lchown(d, Some(md.uid()), Some(md.gid()))
        .map_err(|e| StorageError::io(d, e))?;
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(md.mode() & 0o7777))
        .map_err(|e| StorageError::io(d, e))?;
    let want: Vec<OsString> = xattr::list(s).map(|l| l.collect()).unwrap_or_default();
    if let Ok(have) = xattr::list(d) {
        for n in have {
            if !want.contains(&n) {
                let _ = xattr::remove(d, &n);
            }
        }
    }
    for n in &want {
        if let Ok(Some(v)) = xattr::get(s, n) {
            let _ = xattr::set(d, n, &v);
        }
    }
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    utimensat(
        nix::fcntl::AT_FDCWD,
        d,
        &TimeSpec::new(md.atime(), md.atime_nsec()),
        &TimeSpec::new(md.mtime(), md.mtime_nsec()),
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| StorageError::io(d, std::io::Error::from(e)))
}
