//! Shipping a snapshot between hosts at the storage level (`storage::ship`,
//! `Storage::export_snapshot` / `Storage::import_snapshot`): the archive of one backend's
//! snapshot becomes a snapshot of another backend that forks like a local one, with
//! content, owners, modes, symlinks, hard links, mtimes, holes and `user.*` xattrs kept;
//! and hostile archives and hostile volumes are refused or stay harmless.
//!
//! The `dir` tests need root (owners). The btrfs ones use the loop-mounted btrfs at
//! `/var/lib/denv-test-btrfs` (mounted with `e2e/lib/btrfs.sh` when missing), the zfs
//! ones the pool `DENV_TEST_ZFS_POOL` (`just unit` makes one with `e2e/lib/zfs.sh`).

use denvd::storage::ship::{trailer, HashingWriter, Shipped};
use denvd::storage::{BtrfsStorage, DirStorage, Storage, ZfsStorage};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const BTRFS_MNT: &str = "/var/lib/denv-test-btrfs";

fn btrfs_root() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/lib/btrfs.sh");
    let st = Command::new("bash")
        .arg(&script)
        .args(["mount", BTRFS_MNT, "8G"])
        .status()
        .expect("run btrfs.sh");
    assert!(st.success(), "could not mount a btrfs at {BTRFS_MNT}");
    PathBuf::from(BTRFS_MNT)
}

/// A backend of `kind` on a fresh data directory.
fn backend(kind: &str) -> (Box<dyn Storage>, tempfile::TempDir) {
    let parent = match kind {
        "btrfs" => btrfs_root(),
        _ => PathBuf::from("/var/tmp"),
    };
    let tmp = tempfile::Builder::new()
        .prefix("denvd-ship-")
        .tempdir_in(parent)
        .unwrap();
    let data = tmp.path().join("data");
    let st: Box<dyn Storage> = match kind {
        "dir" => Box::new(DirStorage::new(&data)),
        "btrfs" => Box::new(BtrfsStorage::new(&data).unwrap()),
        "zfs" => {
            let pool = std::env::var("DENV_TEST_ZFS_POOL").expect(
                "cannot run: DENV_TEST_ZFS_POOL is unset (e2e/lib/zfs.sh create denvunit 2G)",
            );
            Box::new(ZfsStorage::new(&data, &pool).unwrap())
        }
        other => panic!("unknown backend {other}"),
    };
    (st, tmp)
}

fn id(tag: &str) -> String {
    format!("env_s{tag}{:08x}", rand::random::<u32>())
}

fn sh(script: &str) {
    let st = Command::new("sh").args(["-ec", script]).status().unwrap();
    assert!(st.success(), "{script}");
}

/// Fills `p` with a bit of everything a volume can hold: a postgres-like data directory
/// (uid 70, 0700), a setuid file, symlinks (relative, absolute, dangling, long), hard
/// links, a fifo, an empty directory, a long path, fixed mtimes, a `user.*` xattr, and
/// sparse files: 16 MiB with three data regions, 64 MiB with 30 (more than the GNU
/// header's four: extension headers), 64 MiB of nothing but a hole.
fn fill(p: &Path) {
    let long = "d".repeat(120);
    sh(&format!(
        r#"cd '{p}'
mkdir -p pgdata/base/1 empty '{long}/deeper'
echo 'PG_VERSION 16' > pgdata/PG_VERSION
head -c 300000 /dev/urandom > pgdata/base/1/1259
chown -R 70:70 pgdata && chmod 0700 pgdata && chmod 0600 pgdata/PG_VERSION
echo suid > suid && chmod 4755 suid
ln -s pgdata/PG_VERSION rel-link
ln -s /etc/hostname abs-link
ln -s nowhere/at/all dangling
ln -s '{long}/deeper/x' long-link
echo shared > hard1 && ln hard1 hard2 && ln hard1 '{long}/deeper/hard3'
mkfifo fifo
echo x > '{long}/deeper/x'
touch -h -d '2001-02-03 04:05:06' rel-link
touch -d '2001-02-03 04:05:06' pgdata/PG_VERSION hard1 empty
truncate -s 16M sparse3
printf head | dd of=sparse3 conv=notrunc status=none
printf middle | dd of=sparse3 bs=1M seek=8 conv=notrunc status=none
printf tail | dd of=sparse3 bs=1 seek=$((16*1024*1024 - 4)) conv=notrunc status=none
truncate -s 64M sparse30
for i in $(seq 0 29); do printf "region $i" | dd of=sparse30 bs=1M seek=$((i * 2)) conv=notrunc status=none; done
truncate -s 64M hole
"#,
        p = p.display()
    ));
    // zfs-fuse has no xattrs.
    let _ = xattr::set(p.join("suid"), "user.denv", b"kept");
}

/// One line per entry: path, type, mode, owner, size, content digest or link target,
/// mtime (files and directories) and, for hard links, the first path
/// of the same inode.
fn describe(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut inodes: HashMap<u64, String> = HashMap::new();
    for e in walkdir::WalkDir::new(root).sort_by_file_name() {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(root).unwrap().display().to_string();
        let m = e.path().symlink_metadata().unwrap();
        let ft = m.file_type();
        let mut line = format!("{rel} mode={:o} uid={} gid={}", m.mode(), m.uid(), m.gid());
        if ft.is_symlink() {
            line += &format!(" -> {}", std::fs::read_link(e.path()).unwrap().display());
        } else if ft.is_file() {
            let data = std::fs::read(e.path()).unwrap();
            line += &format!(
                " size={} sha={} mtime={}",
                data.len(),
                hex::encode(Sha256::digest(&data)),
                m.mtime()
            );
            if m.nlink() > 1 {
                let first = inodes.entry(m.ino()).or_insert_with(|| rel.clone());
                line += &format!(" link={first}");
            }
        } else if ft.is_dir() && !rel.is_empty() {
            line += &format!(" mtime={}", m.mtime());
        }
        out.push(line);
    }
    out
}

/// The archive of a snapshot as it goes on the wire (the trailer after it), and what the
/// trailer says.
fn export(st: &dyn Storage, env: &str, snap: &str, vols: &[String]) -> (Vec<u8>, Shipped) {
    let mut w = HashingWriter::new(Vec::new());
    st.export_snapshot(env, snap, vols, &mut w).unwrap();
    let mut plain = Vec::new();
    st.export_snapshot(env, snap, vols, &mut plain).unwrap();
    let mut buf = Vec::new();
    let mut w2 = HashingWriter::new(&mut buf);
    std::io::Write::write_all(&mut w2, &plain).unwrap();
    let shipped = w2.finish_with_trailer().unwrap();
    // The trailer describes exactly the archive's bytes.
    assert_eq!(shipped.bytes, plain.len() as u64);
    assert_eq!(shipped.sha256, hex::encode(Sha256::digest(&plain)));
    assert_eq!(w.finish().unwrap(), shipped);
    (buf, shipped)
}

/// No limit worth the name, for the tests that are not about it.
const ANY: u64 = u64::MAX;

/// Snapshot on `from`, ship to `to`, fork there: the fork's volumes are the source's.
fn round_trip(from: &str, to: &str) {
    let (src, _t1) = backend(from);
    let (dst, _t2) = backend(to);
    let vols = vec!["data".to_string(), "other".to_string()];
    let env = id("o");
    for v in &vols {
        let p = src.create(&env, v).unwrap();
        if v == "data" {
            fill(&p);
        } else {
            std::fs::write(p.join("note"), "second volume").unwrap();
        }
    }
    let want: Vec<Vec<String>> = vols
        .iter()
        .map(|v| describe(&src.volume_path(&env, v)))
        .collect();
    src.snapshot(&env, "s1", &vols).unwrap();
    let (archive, expected) = export(src.as_ref(), &env, "s1", &vols);
    // The holes are not on the wire: 144 MiB of apparent size, well under 4 MiB sent.
    assert!(
        archive.len() < 4 << 20,
        "archive of {} bytes",
        archive.len()
    );
    assert!(!dst.has_snapshot(&env, "s1"));
    let got = dst
        .import_snapshot(&env, "s1", &vols, &mut archive.as_slice(), ANY)
        .unwrap();
    assert_eq!(got, expected);
    assert!(dst.has_snapshot(&env, "s1"));
    let fork = id("f");
    dst.fork(&env, "s1", &fork, &vols).unwrap();
    for (v, want) in vols.iter().zip(&want) {
        let got = describe(&dst.volume_path(&fork, v));
        // The fifo and everything else: line by line, for a readable failure.
        for (a, b) in want.iter().zip(&got) {
            assert_eq!(a, b, "{from} -> {to}, volume {v}");
        }
        assert_eq!(
            want.len(),
            got.len(),
            "{from} -> {to}, volume {v}: {got:#?}"
        );
    }
    if from != "zfs" && to != "zfs" {
        let got = xattr::get(dst.volume_path(&fork, "data").join("suid"), "user.denv").unwrap();
        assert_eq!(
            got.as_deref(),
            Some(&b"kept"[..]),
            "{from} -> {to}: user.* xattr"
        );
    }
    // The sparse files arrive sparse.
    for f in ["sparse3", "sparse30", "hole"] {
        let m = std::fs::metadata(dst.volume_path(&fork, "data").join(f)).unwrap();
        assert!(
            m.blocks() * 512 < 8 << 20,
            "{from} -> {to}: {f} of {} bytes takes {} blocks",
            m.len(),
            m.blocks()
        );
    }
    let fifo = dst.volume_path(&fork, "data").join("fifo");
    {
        use std::os::unix::fs::FileTypeExt;
        assert!(fifo.symlink_metadata().unwrap().file_type().is_fifo());
    }
    // A second import of the same snapshot is refused (the runtime answers `cached`
    // before it gets here).
    let again = dst.import_snapshot(&env, "s1", &vols, &mut archive.as_slice(), ANY);
    assert!(again.is_err());
    dst.destroy(&fork).unwrap();
    dst.destroy(&env).unwrap();
    src.destroy(&env).unwrap();
}

#[test]
fn round_trip_dir_to_dir() {
    round_trip("dir", "dir");
}

#[test]
#[ignore = "needs the test btrfs (e2e/lib/btrfs.sh)"]
fn round_trip_btrfs_to_btrfs_and_dir() {
    round_trip("btrfs", "btrfs");
    round_trip("btrfs", "dir");
    round_trip("dir", "btrfs");
}

#[test]
#[ignore = "needs a zfs pool in DENV_TEST_ZFS_POOL (just unit makes one with e2e/lib/zfs.sh)"]
fn round_trip_zfs_to_zfs_and_across() {
    round_trip("zfs", "zfs");
    round_trip("zfs", "dir");
    round_trip("dir", "zfs");
    round_trip("zfs", "btrfs");
    round_trip("btrfs", "zfs");
}

// ---------------------------------------------------------------- hostile archives

/// A raw tar header for `path` (written byte for byte: no checks of the tar crate).
fn raw_header(path: &str, kind: tar::EntryType, size: u64, link: &str) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    {
        let old = h.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1);
    if matches!(kind, tar::EntryType::Char) {
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
    }
    h.set_cksum();
    h
}

/// An archive of `(path, kind, content, link target)` entries, without its trailer, and
/// what its trailer would say.
fn archive(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> (Vec<u8>, Shipped) {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data, link) in entries {
        let h = raw_header(path, *kind, data.len() as u64, link);
        b.append(&h, *data).unwrap();
    }
    let bytes = b.into_inner().unwrap();
    let e = Shipped {
        bytes: bytes.len() as u64,
        sha256: hex::encode(Sha256::digest(&bytes)),
    };
    (bytes, e)
}

/// `bytes` followed by the trailer `t`.
fn trailed(bytes: &[u8], t: &Shipped) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.extend_from_slice(&trailer(t).unwrap());
    v
}

/// Everything under `<data>/snaps/<env>` (the snapshot, any staging directory).
fn leftovers(st: &dyn Storage, env: &str) -> Vec<String> {
    let p = st.data_dir().join("snaps").join(env);
    walkdir::WalkDir::new(&p)
        .min_depth(1)
        .into_iter()
        .filter_map(|e| e.ok())
        .map(|e| e.path().display().to_string())
        .collect()
}

#[test]
fn hostile_archives_are_refused_and_leave_nothing() {
    use tar::EntryType as T;
    let outside = tempfile::Builder::new()
        .prefix("denvd-ship-outside-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let out = outside.path().display().to_string();
    std::fs::write(outside.path().join("victim"), "untouched").unwrap();
    let victim = format!("{out}/victim");
    let escape_file = format!("{out}/pwned");
    let dotdots = "../".repeat(12);
    type Entry = (String, T, Vec<u8>, String);
    let cases: Vec<(&str, Vec<Entry>, &str)> = vec![
        (
            "dot-dot path",
            vec![(
                format!("v/{dotdots}{}", &escape_file[1..]),
                T::Regular,
                b"x".to_vec(),
                String::new(),
            )],
            "not a plain relative path",
        ),
        (
            "absolute path",
            vec![(
                escape_file.clone(),
                T::Regular,
                b"x".to_vec(),
                String::new(),
            )],
            "not a plain relative path",
        ),
        (
            "write through a symlink",
            vec![
                ("v/l".into(), T::Symlink, vec![], out.clone()),
                ("v/l/pwned".into(), T::Regular, b"x".to_vec(), String::new()),
            ],
            "goes through a non-directory",
        ),
        (
            "replace a symlink by a file",
            vec![
                ("v/l".into(), T::Symlink, vec![], victim.clone()),
                (
                    "v/l".into(),
                    T::Regular,
                    b"overwritten".to_vec(),
                    String::new(),
                ),
            ],
            "appears twice",
        ),
        (
            "hard link to an absolute path",
            vec![("v/h".into(), T::Link, vec![], victim.clone())],
            "not a plain relative path",
        ),
        (
            "hard link out with ..",
            vec![(
                "v/h".into(),
                T::Link,
                vec![],
                format!("v/{dotdots}{}", &victim[1..]),
            )],
            "not a plain relative path",
        ),
        (
            "hard link through a symlink",
            vec![
                ("v/l".into(), T::Symlink, vec![], out.clone()),
                ("v/h".into(), T::Link, vec![], "v/l/victim".into()),
            ],
            "goes through a non-directory",
        ),
        (
            "device node",
            vec![("v/null".into(), T::Char, vec![], String::new())],
            "Char",
        ),
        (
            "outside every volume",
            vec![("w/x".into(), T::Regular, b"x".to_vec(), String::new())],
            "not under a volume",
        ),
        (
            "volume replaced by a symlink",
            vec![("v".into(), T::Symlink, vec![], out.clone())],
            "appears twice",
        ),
    ];
    let (st, _t) = backend("dir");
    let vols = vec!["v".to_string()];
    for (name, entries, why) in cases {
        let env = id("h");
        let refs: Vec<(&str, T, &[u8], &str)> = entries
            .iter()
            .map(|(p, k, d, l)| (p.as_str(), *k, d.as_slice(), l.as_str()))
            .collect();
        let (bytes, want) = archive(&refs);
        let bytes = trailed(&bytes, &want);
        let err = st
            .import_snapshot(&env, "s1", &vols, &mut bytes.as_slice(), ANY)
            .expect_err(name)
            .to_string();
        assert!(err.contains(why), "{name}: {err}");
        assert!(!st.has_snapshot(&env, "s1"), "{name}");
        assert_eq!(leftovers(st.as_ref(), &env), Vec::<String>::new(), "{name}");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "untouched",
            "{name}"
        );
        assert!(!Path::new(&escape_file).exists(), "{name}");
        let listing: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(listing.len(), 1, "{name}: {listing:?}");
    }
}

#[test]
fn size_and_digest_are_checked_before_the_snapshot_appears() {
    use tar::EntryType as T;
    let (st, _t) = backend("dir");
    let vols = vec!["v".to_string()];
    let (plain, want) = archive(&[("v/f", T::Regular, b"hello", "")]);
    let bytes = trailed(&plain, &want);

    // A trailer with another digest: the error names both, nothing is left.
    let env = id("d");
    let wrong = Shipped {
        bytes: want.bytes,
        sha256: "0".repeat(64),
    };
    let err = st
        .import_snapshot(
            &env,
            "s1",
            &vols,
            &mut trailed(&plain, &wrong).as_slice(),
            ANY,
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&want.sha256) && err.contains(&"0".repeat(64)),
        "{err}"
    );
    assert!(!st.has_snapshot(&env, "s1"));
    assert!(leftovers(st.as_ref(), &env).is_empty());

    // More bytes than the limit: refused while reading.
    let err = st
        .import_snapshot(&env, "s1", &vols, &mut bytes.as_slice(), want.bytes - 512)
        .unwrap_err()
        .to_string();
    assert!(err.contains("larger than"), "{err}");
    assert!(!st.has_snapshot(&env, "s1"));
    assert!(leftovers(st.as_ref(), &env).is_empty());

    // A stream cut short (its trailer never came), and one cut inside the archive.
    for cut in [&bytes[..plain.len()], &bytes[..plain.len() - 1024]] {
        let err = st
            .import_snapshot(&env, "s1", &vols, &mut &cut[..], ANY)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("trailer")
                || err.contains("does not match")
                || err.contains("reading the archive"),
            "{err}"
        );
        assert!(!st.has_snapshot(&env, "s1"));
        assert!(leftovers(st.as_ref(), &env).is_empty());
    }

    // The right one goes in.
    let got = st
        .import_snapshot(&env, "s1", &vols, &mut bytes.as_slice(), ANY)
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(
        std::fs::read_to_string(st.snapshot_path(&env, "s1").join("v/f")).unwrap(),
        "hello"
    );
}

/// What an agent can plant in its volume (symlinks to the host's files and out of the
/// volume, a fifo, a socket, a device node made by root) is shipped as links that stay
/// links, or left out; the receiving host's files are never touched.
#[test]
fn a_hostile_volume_ships_harmlessly() {
    let (src, _t1) = backend("dir");
    let (dst, _t2) = backend("dir");
    let vols = vec!["v".to_string()];
    let env = id("a");
    let p = src.create(&env, "v").unwrap();
    sh(&format!(
        r#"cd '{p}'
ln -s /etc etc
ln -s ../../../../../../../../etc up
ln -s / root
mkfifo fifo
mknod null c 1 3
python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind("sock")' 2>/dev/null || true
mkdir d && ln -s /etc/passwd d/passwd
"#,
        p = p.display()
    ));
    let passwd = std::fs::read("/etc/passwd").unwrap();
    src.snapshot(&env, "s1", &vols).unwrap();
    let (archive, _) = export(src.as_ref(), &env, "s1", &vols);
    dst.import_snapshot(&env, "s1", &vols, &mut archive.as_slice(), ANY)
        .unwrap();
    let fork = id("b");
    dst.fork(&env, "s1", &fork, &vols).unwrap();
    let q = dst.volume_path(&fork, "v");
    for (link, target) in [
        ("etc", "/etc"),
        ("up", "../../../../../../../../etc"),
        ("root", "/"),
        ("d/passwd", "/etc/passwd"),
    ] {
        let m = q.join(link).symlink_metadata().unwrap();
        assert!(m.file_type().is_symlink(), "{link}");
        assert_eq!(std::fs::read_link(q.join(link)).unwrap(), Path::new(target));
    }
    assert!(q.join("fifo").symlink_metadata().is_ok());
    assert!(
        q.join("null").symlink_metadata().is_err(),
        "device nodes are not shipped"
    );
    assert!(
        q.join("sock").symlink_metadata().is_err(),
        "sockets are not shipped"
    );
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    let perms = std::fs::metadata("/etc").unwrap().permissions().mode();
    assert_eq!(perms & 0o7777, 0o755);
}
