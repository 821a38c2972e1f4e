//! The `dir` backend's pre-copy + delta snapshot (`storage::delta`) on the real file
//! system: the snapshot must equal the volume at the freeze instant, compared with what
//! `cp -a` of the frozen volume gives (content, modes, owners, modification times of
//! files and directories, symlinks, FIFOs, hard-link groups, extended attributes),
//! while a writer changes the volume during the pre-copy and after it.

use denvd::storage::delta::{self, RACY_MARGIN};
use denvd::storage::{DirStorage, Storage};
use rand::Rng;
use std::collections::{BTreeMap, HashMap};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One entry as `cp -a` preserves it (access times excluded: reading changes them).
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    size: u64,
    content: Option<Vec<u8>>,
    target: Option<PathBuf>,
    xattrs: BTreeMap<String, Vec<u8>>,
    rdev: u64,
    /// The first path (in sorted order) with the same inode, for regular files.
    link_group: Option<String>,
}

fn manifest(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut inodes: HashMap<u64, String> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    let mut all = Vec::new();
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let md = std::fs::symlink_metadata(&p).unwrap();
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
        all.push(rel);
    }
    all.sort();
    for rel in all {
        let p = root.join(&rel);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_fifo() {
            "fifo"
        } else {
            "other"
        };
        let key = rel.display().to_string();
        let link_group = ft.is_file().then(|| {
            inodes
                .entry(md.ino())
                .or_insert_with(|| key.clone())
                .clone()
        });
        let xattrs = xattr::list(&p)
            .map(|l| {
                l.map(|n| {
                    let v = xattr::get(&p, &n).unwrap().unwrap_or_default();
                    (n.to_string_lossy().into_owned(), v)
                })
                .collect()
            })
            .unwrap_or_default();
        out.insert(
            key,
            Entry {
                kind,
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                mtime: (md.mtime(), md.mtime_nsec()),
                size: if ft.is_dir() { 0 } else { md.len() },
                content: ft.is_file().then(|| std::fs::read(&p).unwrap()),
                target: ft.is_symlink().then(|| std::fs::read_link(&p).unwrap()),
                xattrs,
                rdev: md.rdev(),
                link_group,
            },
        );
    }
    out
}

fn assert_same(got: &Path, want: &Path) {
    let (g, w) = (manifest(got), manifest(want));
    let gk: Vec<_> = g.keys().collect();
    let wk: Vec<_> = w.keys().collect();
    assert_eq!(gk, wk, "different paths");
    for (k, we) in &w {
        let ge = &g[k];
        if ge != we {
            let short = |e: &Entry| {
                format!(
                    "{} mode {:o} {}:{} mtime {:?} size {} xattrs {:?} group {:?} target {:?}",
                    e.kind, e.mode, e.uid, e.gid, e.mtime, e.size, e.xattrs, e.link_group, e.target
                )
            };
            panic!(
                "{k} differs:\n got  {}\n want {}\n content equal: {}",
                short(ge),
                short(we),
                ge.content == we.content
            );
        }
    }
}

fn cp_a(src: &Path, dst: &Path) {
    let out = Command::new("cp")
        .args(["-a", "--"])
        .arg(src)
        .arg(dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write(p: &Path, data: &[u8]) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// A volume with a bit of everything: nested directories with modes, owners and
/// xattrs, many small files, one large file, symlinks, a hard-link pair, a FIFO.
fn populate(v: &Path) {
    let mut rng = rand::thread_rng();
    for d in 0..8 {
        let dir = v.join(format!("d{d}"));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for f in 0..25 {
            let mut buf = vec![0u8; 1000 + 97 * f];
            rng.fill(&mut buf[..]);
            write(&dir.join(format!("f{f:02}")), &buf);
        }
        std::os::unix::fs::chown(&dir, Some(1000 + d), Some(2000 + d)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2750)).unwrap();
        xattr::set(&dir, "user.tag", format!("dir{d}").as_bytes()).unwrap();
        write(&dir.join("sub/deep"), b"deep");
    }
    let mut big = vec![0u8; 16 << 20];
    rng.fill(&mut big[..]);
    write(&v.join("big.bin"), &big);
    xattr::set(v.join("big.bin"), "user.big", b"yes").unwrap();
    std::fs::set_permissions(v.join("big.bin"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(v.join("big.bin"), Some(70), Some(70)).unwrap();
    symlink("d0/f00", v.join("link")).unwrap();
    symlink("/nonexistent/target", v.join("dangling")).unwrap();
    write(&v.join("hl/a"), b"hard linked");
    std::fs::hard_link(v.join("hl/a"), v.join("hl/b")).unwrap();
    let st = Command::new("mkfifo").arg(v.join("pipe")).status().unwrap();
    assert!(st.success());
}

/// Changes the volume until `stop`: in-place overwrites of the same size (the case a
/// size+mtime check alone misses), appends, truncates, deletions, creations, renames,
/// chmod/chown, xattr changes, new hard links and symlinks, new and removed directories.
fn writer(v: PathBuf, stop: Arc<AtomicBool>, ops: Arc<AtomicUsize>) {
    let mut rng = rand::thread_rng();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let d = v.join(format!("d{}", rng.gen_range(0..8)));
        let f = d.join(format!("f{:02}", rng.gen_range(0..25)));
        let _ = match rng.gen_range(0..12) {
            0..=2 => (|| {
                let mut h = std::fs::OpenOptions::new().write(true).open(&f)?;
                h.seek(SeekFrom::Start(rng.gen_range(0..500)))?;
                h.write_all(&rng.gen::<[u8; 32]>())
            })(),
            3 => std::fs::OpenOptions::new()
                .append(true)
                .open(&f)
                .and_then(|mut h| h.write_all(b"appended")),
            4 => std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .and_then(|h| h.set_len(100)),
            5 => std::fs::remove_file(&f),
            6 => std::fs::write(d.join(format!("new{n}")), n.to_string()),
            7 => std::fs::rename(&f, v.join(format!("d{}/moved{n}", rng.gen_range(0..8)))),
            8 => std::fs::set_permissions(
                &f,
                std::fs::Permissions::from_mode(0o600 + (n % 64) as u32),
            ),
            9 => xattr::set(&f, "user.n", n.to_string().as_bytes()),
            10 => std::fs::hard_link(&f, d.join(format!("hl{n}"))),
            _ => {
                let nd = d.join(format!("nd{n}"));
                std::fs::create_dir(&nd)
                    .and_then(|_| std::fs::write(nd.join("x"), b"x"))
                    .and_then(|_| std::os::unix::fs::chown(&nd, Some(5), Some(6)))
                    .and_then(|_| {
                        std::fs::remove_dir_all(d.join(format!("nd{}", n.saturating_sub(50))))
                    })
            }
        };
        ops.fetch_add(1, Ordering::SeqCst);
        if n.is_multiple_of(16) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn delta_equals_the_volume_at_the_freeze_while_a_writer_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let v = tmp.path().join("vol");
    populate(&v);
    // Everything above is older than T0 - margin once the pre-copy starts, so unchanged
    // entries take the "keep" path.
    std::thread::sleep(RACY_MARGIN + Duration::from_secs(1));

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let w = {
        let (v, stop, ops) = (v.clone(), stop.clone(), ops.clone());
        std::thread::spawn(move || writer(v, stop, ops))
    };
    std::thread::sleep(Duration::from_millis(30));
    let pre = tmp.path().join("pre");
    let ops_before = ops.load(Ordering::SeqCst);
    let t0 = delta::start_precopy(&pre).unwrap();
    delta::precopy_volume(&v, &pre.join("v")).unwrap();
    let ops_during = ops.load(Ordering::SeqCst) - ops_before;
    let big_ino = std::fs::metadata(pre.join("v/big.bin")).unwrap().ino();
    std::thread::sleep(Duration::from_millis(150));
    // The freeze: the writer is stopped and stays stopped.
    stop.store(true, Ordering::SeqCst);
    w.join().unwrap();
    let ops_total = ops.load(Ordering::SeqCst);
    assert!(ops_during > 0, "the writer did nothing during the pre-copy");
    assert!(
        ops_total > ops_before + ops_during,
        "nothing changed after the pre-copy"
    );

    let reference = tmp.path().join("ref");
    cp_a(&v, &reference);
    let stats = delta::sync_tree(&v, &pre.join("v"), t0, &delta::shared_writable_maps(None))
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_same(&pre.join("v"), &reference);
    assert_same(&pre.join("v"), &v);
    // Unchanged data was kept, not copied again.
    assert_eq!(
        std::fs::metadata(pre.join("v/big.bin")).unwrap().ino(),
        big_ino,
        "the unchanged 16 MiB file was copied again"
    );
    assert!(stats.scanned > 200, "{stats:?}");
    assert!(stats.copied < stats.scanned, "{stats:?}");
    eprintln!("writer ops: {ops_during} during the pre-copy, {ops_total} in all; {stats:?}");
}

#[test]
fn dir_storage_snapshot_with_prepare_crash_leftovers_and_fallback() {
    let tmp = tempfile::tempdir().unwrap();
    let st = DirStorage::new(tmp.path().join("data"));
    let env = "env_delta";
    let vols = vec!["a".to_string(), "b".to_string()];
    for vname in &vols {
        let p = st.create(env, vname).unwrap();
        populate(&p);
    }
    let (a, b) = (st.volume_path(env, "a"), st.volume_path(env, "b"));

    // 1. prepare, change both volumes, snapshot: equal to the volumes now.
    st.prepare_snapshot(env, "s1", &vols).unwrap();
    let pre = st.data_dir().join("snaps").join(env).join(".s1.precopy");
    assert!(pre.join(delta::MARKER).is_file());
    std::fs::remove_dir_all(a.join("d3")).unwrap();
    std::fs::remove_file(a.join("big.bin")).unwrap();
    write(&b.join("d1/f00"), b"rewritten");
    write(&b.join("fresh/new"), b"new");
    std::fs::remove_file(b.join("hl/b")).unwrap();
    let ds = st.snapshot(env, "s1", &vols).unwrap();
    assert_eq!(ds.len(), 2);
    let snap = st.snapshot_path(env, "s1");
    assert!(!pre.exists(), "the pre-copy directory is left");
    assert!(!snap.join(delta::MARKER).exists());
    assert_eq!(
        std::fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<std::collections::BTreeSet<_>>(),
        ["a", "b"].map(String::from).into()
    );
    assert_same(&snap.join("a"), &a);
    assert_same(&snap.join("b"), &b);
    assert!(!snap.join("a/big.bin").exists() && !snap.join("a/d3").exists());
    assert_eq!(std::fs::read(snap.join("b/d1/f00")).unwrap(), b"rewritten");
    // The snapshot is a copy: changing the volume does not change it.
    write(&a.join("d0/f00"), b"after");
    assert_ne!(std::fs::read(snap.join("a/d0/f00")).unwrap(), b"after");
    let err = st.prepare_snapshot(env, "s1", &vols).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert!(st.snapshot(env, "s1", &vols).is_err());

    // 2. A pre-copy left by a crash (junk, no marker) is replaced by the next prepare.
    let stale = st.data_dir().join("snaps").join(env).join(".s2.precopy");
    write(&stale.join("a/junk"), b"junk");
    st.prepare_snapshot(env, "s2", &vols).unwrap();
    assert!(!stale.join("a/junk").exists());
    st.snapshot(env, "s2", &vols).unwrap();
    assert_same(&st.snapshot_path(env, "s2").join("a"), &a);

    // 3. Too many changed paths for one cp: the snapshot is copied in full, still equal.
    st.prepare_snapshot(env, "s3", &vols).unwrap();
    let long = "x".repeat(180);
    for i in 0..3200 {
        write(&a.join(format!("many/{long}{i:05}")), b"m");
    }
    st.snapshot(env, "s3", &vols).unwrap();
    assert_same(&st.snapshot_path(env, "s3").join("a"), &a);
    assert_same(&st.snapshot_path(env, "s3").join("b"), &b);

    // 4. A marker that is not this process's (a clock offset 10 s off, or another pid)
    //    is refused, and the snapshot is then copied in full, still equal.
    st.prepare_snapshot(env, "s3b", &vols).unwrap();
    let pre = st.data_dir().join("snaps").join(env).join(".s3b.precopy");
    let body = std::fs::read_to_string(pre.join(delta::MARKER)).unwrap();
    let (pid, off) = body.trim().split_once(' ').unwrap();
    let off: i128 = off.parse().unwrap();
    std::fs::write(
        pre.join(delta::MARKER),
        format!("{pid} {}", off + 10_000_000_000),
    )
    .unwrap();
    let err = delta::marker_stamp(&pre).unwrap_err().to_string();
    let moved: u64 = err
        .strip_prefix("the clock moved by ")
        .and_then(|r| r.strip_suffix(" ms since the pre-copy began"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!((9900..=10100).contains(&moved), "{err}");
    std::fs::write(pre.join(delta::MARKER), format!("1 {off}")).unwrap();
    let err = delta::marker_stamp(&pre).unwrap_err().to_string();
    assert!(err.contains("another process"), "{err}");
    std::fs::write(pre.join(delta::MARKER), format!("{pid} {off}")).unwrap();
    delta::marker_stamp(&pre).unwrap();
    std::fs::write(
        pre.join(delta::MARKER),
        format!("{pid} {}", off - 5_000_000_000),
    )
    .unwrap();
    // A stale file in the pre-copy that the fallback must not keep.
    write(&pre.join("a/d0/f00"), b"stale");
    st.snapshot(env, "s3b", &vols).unwrap();
    assert_same(&st.snapshot_path(env, "s3b").join("a"), &a);

    // 5. No prepare at all: the full copy, as before.
    write(&b.join("d2/f01"), b"s4");
    st.snapshot(env, "s4", &vols).unwrap();
    assert_same(&st.snapshot_path(env, "s4").join("b"), &b);

    // 6. A prepare whose volume vanished fails and leaves nothing; snapshot then fails
    //    with the volume named.
    let err = st
        .prepare_snapshot(env, "s5", &["a".into(), "gone".into()])
        .unwrap_err();
    assert!(err.to_string().contains("\"gone\""), "{err}");
    assert!(!st
        .data_dir()
        .join("snaps")
        .join(env)
        .join(".s5.precopy")
        .exists());
    st.destroy(env).unwrap();
    assert!(!st.data_dir().join("snaps").join(env).exists());
}

/// A file written through a shared writable memory map: the second write lands on a
/// page that is already dirty and writable, so the kernel need not update `ctime`;
/// the `/proc/*/maps` rule must still copy it again.
#[test]
fn shared_writable_mmap_writes_are_not_missed() {
    let tmp = tempfile::tempdir().unwrap();
    let v = tmp.path().join("vol");
    let f = v.join("mapped.db");
    write(&f, &[b'A'; 8192]);
    let ready = tmp.path().join("ready");
    let go = tmp.path().join("go");
    let done = tmp.path().join("done");
    let script = format!(
        r#"
import mmap, os, time
fd = os.open({f:?}, os.O_RDWR)
m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[0:8192] = b"B" * 8192
open({ready:?}, "w").close()
while not os.path.exists({go:?}):
    time.sleep(0.01)
m[0:8192] = b"C" * 8192
open({done:?}, "w").close()
while True:
    time.sleep(1)
"#,
        f = f.display().to_string(),
        ready = ready.display().to_string(),
        go = go.display().to_string(),
        done = done.display().to_string(),
    );
    let mut py = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .spawn()
        .unwrap();
    let wait_for = |p: &Path| {
        for _ in 0..1000 {
            if p.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} never appeared", p.display());
    };
    wait_for(&ready);
    std::thread::sleep(RACY_MARGIN + Duration::from_secs(1));
    let pre = tmp.path().join("pre");
    let t0 = delta::start_precopy(&pre).unwrap();
    cp_a(&v, &pre.join("v"));
    assert_eq!(
        std::fs::read(pre.join("v/mapped.db")).unwrap(),
        [b'B'; 8192]
    );
    write(&go, b"");
    wait_for(&done);
    // Freeze the writer for real, as the cgroup freezer would.
    let pid = py.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let md = std::fs::metadata(&f).unwrap();
    let key = (md.dev(), md.ino());
    // Seen among all processes, among the writer's own cgroup's, not among others'.
    assert!(delta::shared_writable_maps(None).contains(&key));
    let group = delta::cgroup_pids_of(py.id()).expect("the writer's cgroup");
    assert!(group.contains(&py.id()), "{group:?}");
    assert!(!delta::shared_writable_maps(Some(&[std::process::id()])).contains(&key));
    let mapped = delta::shared_writable_maps(Some(&group));
    assert!(
        mapped.contains(&key),
        "the mapping is not seen in /proc/<pid>/maps"
    );
    let res = delta::sync_tree(&v, &pre.join("v"), t0, &mapped);
    let _ = py.kill();
    let _ = py.wait();
    res.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        std::fs::read(pre.join("v/mapped.db")).unwrap(),
        [b'C'; 8192],
        "the snapshot has the pre-copy's content, not the content at the freeze"
    );
}

/// A writer that dirtied a shared map long before the pre-copy, wrote through it again
/// after the pre-copy read the file, and unmapped it before the freeze: no map is left to
/// see, and a page that stayed writable took the second write without touching `ctime`
/// unless the pre-copy wrote the dirty pages back (which write-protects them) first.
#[test]
fn a_write_through_a_map_closed_before_the_freeze_is_not_missed() {
    let tmp = tempfile::tempdir().unwrap();
    let v = tmp.path().join("vol");
    let f = v.join("mapped.db");
    write(&f, &[b'A'; 8192]);
    let ready = tmp.path().join("ready");
    let go = tmp.path().join("go");
    let done = tmp.path().join("done");
    let script = format!(
        r#"
import mmap, os, time
fd = os.open({f:?}, os.O_RDWR)
m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[0:8192] = b"B" * 8192
open({ready:?}, "w").close()
while not os.path.exists({go:?}):
    time.sleep(0.01)
m[0:8192] = b"C" * 8192
m.close()
os.close(fd)
open({done:?}, "w").close()
"#,
        f = f.display().to_string(),
        ready = ready.display().to_string(),
        go = go.display().to_string(),
        done = done.display().to_string(),
    );
    let mut py = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .spawn()
        .unwrap();
    let wait_for = |p: &Path| {
        for _ in 0..1000 {
            if p.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} never appeared", p.display());
    };
    wait_for(&ready);
    std::thread::sleep(RACY_MARGIN + Duration::from_secs(1));
    let pre = tmp.path().join("pre");
    let t0 = delta::start_precopy(&pre).unwrap();
    delta::precopy_volume(&v, &pre.join("v")).unwrap();
    assert_eq!(
        std::fs::read(pre.join("v/mapped.db")).unwrap(),
        [b'B'; 8192]
    );
    write(&go, b"");
    wait_for(&done);
    assert!(py.wait().unwrap().success());
    let mapped = delta::shared_writable_maps(None);
    let md = std::fs::metadata(&f).unwrap();
    assert!(!mapped.contains(&(md.dev(), md.ino())), "the map is gone");
    delta::sync_tree(&v, &pre.join("v"), t0, &mapped).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        std::fs::read(pre.join("v/mapped.db")).unwrap(),
        [b'C'; 8192],
        "the snapshot has the pre-copy's content, not the content at the freeze"
    );
}

/// The `/proc/*/maps` rule on its own: a file whose metadata all say "unchanged" but
/// that a process maps shared and writable is copied again. The pre-copy's content is
/// made stale by hand (same size, same times), as a write through the map that left no
/// trace in the metadata would leave it.
#[test]
fn a_mapped_file_is_copied_again_even_when_its_metadata_say_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let v = tmp.path().join("vol");
    write(&v.join("m"), &[b'X'; 4096]);
    write(&v.join("plain"), &[b'P'; 4096]);
    std::thread::sleep(RACY_MARGIN + Duration::from_secs(1));
    let pre = tmp.path().join("pre");
    let t0 = delta::start_precopy(&pre).unwrap();
    delta::precopy_volume(&v, &pre.join("v")).unwrap();
    let stale = |name: &str| {
        let p = pre.join("v").join(name);
        let md = std::fs::metadata(&p).unwrap();
        std::fs::write(&p, [b'S'; 4096]).unwrap();
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &p,
            &nix::sys::time::TimeSpec::new(md.atime(), md.atime_nsec()),
            &nix::sys::time::TimeSpec::new(md.mtime(), md.mtime_nsec()),
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
    };
    stale("m");
    stale("plain");
    let md = std::fs::metadata(v.join("m")).unwrap();
    let mapped = [(md.dev(), md.ino())].into_iter().collect();
    let stats =
        delta::sync_tree(&v, &pre.join("v"), t0, &mapped).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(std::fs::read(pre.join("v/m")).unwrap(), [b'X'; 4096]);
    // The unmapped file shows what the rule prevents: its stale copy was kept.
    assert_eq!(std::fs::read(pre.join("v/plain")).unwrap(), [b'S'; 4096]);
    assert_eq!(stats.copied, 1, "{stats:?}");
}
