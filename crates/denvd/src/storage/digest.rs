//! The digest of a volume's content, for `denv promote`'s `gate.consistency`
//! (`docs/reference/deployments.md`, "promote"): forks of one snapshot must read the
//! captured data back alike, whatever the backend copied or cloned.
//!
//! The digest is SHA-256 over every entry under the volume's root in path order (the
//! root included, as the empty path): its relative path, type, permission bits, owner,
//! and then a regular file's size and the SHA-256 of its content (holes and written
//! zeros alike, holes never read: [`hash_content`]), or a symlink's target,
//! or a device's number. Modification times are left out (a copy may not keep them to
//! the nanosecond); extended attributes are left out too. Entries are never followed.

use super::StorageError;
use sha2::{Digest, Sha256};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// One volume's digest: `digest` is `sha256:<hex>`, `files` and `bytes` count regular
/// files and their bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeDigest {
    pub digest: String,
    pub files: u64,
    pub bytes: u64,
}

/// Digests the tree at `root` (a directory). Errors name the entry that could not be
/// read.
pub fn digest_tree(root: &Path) -> Result<VolumeDigest, StorageError> {
    let mut tree = Sha256::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut buf = vec![0u8; 1 << 20];
    let walk = walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name();
    for entry in walk {
        let entry = entry.map_err(|e| {
            let path = e.path().unwrap_or(root).to_path_buf();
            StorageError::io(path, e.into())
        })?;
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap_or(path);
        let md = entry
            .metadata()
            .map_err(|e| StorageError::io(path, e.into()))?;
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            "d"
        } else if ft.is_file() {
            "f"
        } else if ft.is_symlink() {
            "l"
        } else if ft.is_fifo() {
            "p"
        } else if ft.is_socket() {
            "s"
        } else if ft.is_char_device() {
            "c"
        } else {
            "b"
        };
        let name = rel.as_os_str().as_encoded_bytes();
        tree.update((name.len() as u64).to_le_bytes());
        tree.update(name);
        tree.update(
            format!(
                "\0{kind} {:o} {}:{}",
                md.mode() & 0o7777,
                md.uid(),
                md.gid()
            )
            .as_bytes(),
        );
        match kind {
            "f" => {
                let f = std::fs::File::open(path).map_err(|e| StorageError::io(path, e))?;
                let h =
                    hash_content(&f, md.len(), &mut buf).map_err(|e| StorageError::io(path, e))?;
                tree.update(format!(" {} ", md.len()).as_bytes());
                tree.update(h);
                files += 1;
                bytes += md.len();
            }
            "l" => {
                let target = std::fs::read_link(path).map_err(|e| StorageError::io(path, e))?;
                tree.update(b" -> ");
                tree.update(target.as_os_str().as_encoded_bytes());
            }
            "c" | "b" => tree.update(format!(" {}", md.rdev()).as_bytes()),
            _ => {}
        }
        tree.update(b"\n");
    }
    Ok(VolumeDigest {
        digest: format!("sha256:{}", hex::encode(tree.finalize())),
        files,
        bytes,
    })
}

/// The grid a file's content is hashed on (see [`hash_content`]).
const BLOCK: usize = 4096;

/// SHA-256 of the first `len` bytes of `f` in a form that does not depend on how the
/// zeros are stored: the content is cut into [`BLOCK`]-byte blocks at multiples of
/// [`BLOCK`] (the last one shorter); a maximal run of all-zero blocks is `Z` and its
/// length in bytes (u64 LE), any other block is `D` and its bytes. Holes are found with
/// `SEEK_DATA` and never read, so a huge sparse file (`truncate -s 4T`, no disk used)
/// costs what its data costs, and a copy that filled the holes digests alike.
fn hash_content(f: &std::fs::File, len: u64, buf: &mut [u8]) -> std::io::Result<[u8; 32]> {
    use nix::unistd::{lseek, Whence};
    use std::os::unix::fs::FileExt;
    let block = BLOCK as u64;
    let mut h = Sha256::new();
    let mut zeros: u64 = 0;
    let mut pos: u64 = 0;
    let flush = |h: &mut Sha256, zeros: &mut u64| {
        if *zeros > 0 {
            h.update(b"Z");
            h.update(zeros.to_le_bytes());
            *zeros = 0;
        }
    };
    while pos < len {
        // Whole blocks of hole before the next data count as zeros, unread.
        let next = match lseek(f, i64::try_from(pos).unwrap_or(i64::MAX), Whence::SeekData) {
            Ok(o) => u64::try_from(o).unwrap_or(pos).min(len),
            Err(nix::errno::Errno::ENXIO) => len,
            Err(_) => pos, // no SEEK_DATA here: read everything
        };
        if next >= len {
            zeros += len - pos;
            break;
        }
        let skip = (next.saturating_sub(pos) / block) * block;
        zeros += skip;
        pos += skip;
        let want = usize::try_from(len - pos).map_or(buf.len(), |r| r.min(buf.len()));
        let n = f.read_at(&mut buf[..want], pos)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the file ended at byte {pos} of {len} while being read"),
            ));
        }
        for chunk in buf[..n].chunks(BLOCK) {
            let end = pos + chunk.len() as u64;
            if chunk.len() < BLOCK && end < len {
                break; // a short read: the rest of this block is read next time
            }
            if chunk.iter().all(|b| *b == 0) {
                zeros += chunk.len() as u64;
            } else {
                flush(&mut h, &mut zeros);
                h.update(b"D");
                h.update(chunk);
            }
            pos = end;
        }
    }
    flush(&mut h, &mut zeros);
    Ok(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/b/f"), b"hello").unwrap();
        std::fs::write(t.path().join("g"), b"world!").unwrap();
        std::os::unix::fs::symlink("a/b/f", t.path().join("l")).unwrap();
        t
    }

    #[test]
    fn a_copy_digests_alike_and_every_change_shows() {
        let t = tree();
        let d = digest_tree(t.path()).unwrap();
        assert!(
            d.digest.starts_with("sha256:") && d.digest.len() == 71,
            "{d:?}"
        );
        assert_eq!((d.files, d.bytes), (2, 11));
        // A copy made by cp -a (new inodes, new mtimes allowed) digests the same.
        let c = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("cp")
            .args(["-a", "--"])
            .arg(t.path().join("."))
            .arg(c.path())
            .status()
            .unwrap();
        assert!(out.success());
        std::fs::set_permissions(c.path(), std::fs::metadata(t.path()).unwrap().permissions())
            .unwrap();
        assert_eq!(digest_tree(c.path()).unwrap(), d);

        // Each kind of change gives another digest: content of the same size, a mode,
        // a link target, a renamed file, an empty directory more.
        type Change = Box<dyn Fn(&Path)>;
        let changes: Vec<Change> = vec![
            Box::new(|p| std::fs::write(p.join("g"), b"World!").unwrap()),
            Box::new(|p| {
                std::fs::set_permissions(p.join("g"), std::fs::Permissions::from_mode(0o600))
                    .unwrap()
            }),
            Box::new(|p| {
                std::fs::remove_file(p.join("l")).unwrap();
                std::os::unix::fs::symlink("g", p.join("l")).unwrap();
            }),
            Box::new(|p| std::fs::rename(p.join("g"), p.join("h")).unwrap()),
            Box::new(|p| std::fs::create_dir(p.join("e")).unwrap()),
        ];
        for (i, change) in changes.iter().enumerate() {
            let t = tree();
            change(t.path());
            assert_ne!(
                digest_tree(t.path()).unwrap().digest,
                d.digest,
                "change {i}"
            );
        }
    }

    #[test]
    fn holes_are_skipped_and_digest_like_written_zeros() {
        use std::os::unix::fs::FileExt;
        // The same content written densely and as a sparse file digests alike (a copy
        // may or may not keep the holes); moving the data changes the digest.
        let dense = tempfile::tempdir().unwrap();
        let mut bytes = vec![0u8; 8 << 20];
        bytes[(3 << 20) + 7..(3 << 20) + 11].copy_from_slice(b"data");
        std::fs::write(dense.path().join("f"), &bytes).unwrap();
        let sparse = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(sparse.path().join("f")).unwrap();
        f.set_len(8 << 20).unwrap();
        f.write_at(b"data", (3 << 20) + 7).unwrap();
        drop(f);
        std::fs::set_permissions(
            sparse.path().join("f"),
            std::fs::metadata(dense.path().join("f"))
                .unwrap()
                .permissions(),
        )
        .unwrap();
        let d = digest_tree(dense.path()).unwrap();
        assert_eq!(digest_tree(sparse.path()).unwrap(), d);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(sparse.path().join("f"))
            .unwrap();
        f.write_at(b"\0\0\0\0data", (3 << 20) + 7).unwrap();
        drop(f);
        assert_ne!(digest_tree(sparse.path()).unwrap().digest, d.digest);

        // A hostile tenant's 4 TiB sparse file (a `truncate -s` costs no disk) must not
        // keep the host hashing zeros for hours while the fork holds its lock.
        let huge = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(huge.path().join("h")).unwrap();
        if f.set_len(4 << 40).is_err() {
            return; // the filesystem has no room for such a file size
        }
        f.write_at(b"x", 1 << 40).unwrap();
        drop(f);
        let t0 = std::time::Instant::now();
        let h = digest_tree(huge.path()).unwrap();
        assert_eq!(h.bytes, 4 << 40);
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn an_unreadable_entry_is_named() {
        let e = digest_tree(Path::new("/nonexistent/denv-digest")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/denv-digest"), "{e}");
    }
}
