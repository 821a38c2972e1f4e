//! The digest of a volume's content, for `denv promote`'s `gate.consistency`
//! (`docs/reference/deployments.md`, "promote"): forks of one snapshot must read the
//! captured data back alike, whatever the backend copied or cloned.
//!
//! The digest is SHA-256 over every entry under the volume's root in path order (the
//! root included, as the empty path): its relative path, type, permission bits, owner,
//! and then a regular file's size and the SHA-256 of its bytes, or a symlink's target,
//! or a device's number. Modification times are left out (a copy may not keep them to
//! the nanosecond); extended attributes are left out too. Entries are never followed.

use super::StorageError;
use sha2::{Digest, Sha256};
use std::io::Read;
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
                let mut f = std::fs::File::open(path).map_err(|e| StorageError::io(path, e))?;
                let mut h = Sha256::new();
                loop {
                    let n = f.read(&mut buf).map_err(|e| StorageError::io(path, e))?;
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                tree.update(format!(" {} ", md.len()).as_bytes());
                tree.update(h.finalize());
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
    fn an_unreadable_entry_is_named() {
        let e = digest_tree(Path::new("/nonexistent/denv-digest")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/denv-digest"), "{e}");
    }
}
