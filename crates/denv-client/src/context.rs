//! Build contexts as a client sends them with a deploy (`docs/reference/compose.md`,
//! "Builds"): the directory of a compose `build:` packed into an uncompressed tar.
//! `denv deploy` and the Python package (`denv.client.pack_context`, through the native
//! module) both call [`pack`], so the same directory gives the same bytes either way.
//!
//! - `.dockerignore` at the context root is honoured with Docker's rules
//!   ([`denv_compose::dockerignore`]): what it excludes is not sent and does not count
//!   towards the limit; the Dockerfiles in use and `.dockerignore` itself are always sent.
//!   An excluded directory is not walked unless an exception (`!…`) or a Dockerfile may
//!   lie below it; it then appears in the tar only as the parent of what is sent.
//! - The tar is deterministic: members in byte order of their paths, owner 0:0, mtime 0,
//!   permission bits kept, symlinks stored as links (never followed); sockets, fifos and
//!   devices are left out. The same files give the same digest, so the host's build
//!   cache hits.
//! - Packing stops with an error once the archive would pass [`MAX_CONTEXT_BYTES`].

use denv_compose::dockerignore::{DockerIgnore, PatternError, FILE_NAME};
use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use denv_compose::context::MAX_CONTEXT_BYTES;

/// Why a context could not be packed. `Display` is the message shown to users.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// `build context <dir> is not a directory`.
    #[error("build context {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// `build context <dir> is larger than 32 MiB (stopped at <path>); leave large files
    /// out of it`, with `<path>` relative to the context.
    #[error("build context {} is larger than 32 MiB (stopped at {}); leave large files out of it", .dir.display(), .at.display())]
    TooLarge {
        /// The context directory as given.
        dir: PathBuf,
        /// The first member that did not fit.
        at: PathBuf,
    },
    /// `<dir>/.dockerignore line <n>: pattern "<p>" does not parse: <reason>`.
    #[error("{} {error}", .file.display())]
    Ignore {
        /// The `.dockerignore` file.
        file: PathBuf,
        /// The line and pattern refused (part of the message, not a separate cause).
        error: PatternError,
    },
    /// `reading <path>: <io error>`.
    #[error("reading {}: {error}", .path.display())]
    Io {
        /// The file or directory that could not be read.
        path: PathBuf,
        /// The error of the read (part of the message, not a separate cause).
        error: std::io::Error,
    },
}

/// An uncompressed, deterministic tar of build context `dir` (see the module docs),
/// leaving out what its `.dockerignore` excludes. `dockerfiles` are the Dockerfile paths
/// (relative to `dir`, as compose's `build.dockerfile`) of the builds that use this
/// context, always sent; empty means `["Dockerfile"]`.
///
/// Errors: [`PackError::NotADirectory`], [`PackError::Ignore`] for a `.dockerignore`
/// line that does not parse, [`PackError::TooLarge`] past 32 MiB, [`PackError::Io`].
pub fn pack(dir: &Path, dockerfiles: &[&str]) -> Result<Vec<u8>, PackError> {
    if !dir.is_dir() {
        return Err(PackError::NotADirectory(dir.to_path_buf()));
    }
    let ignore = read_ignore(dir, dockerfiles)?;
    let mut walked = Vec::new();
    walk(dir, Path::new(""), &ignore, &mut walked)?;
    // An excluded directory walked for its exceptions is sent as a parent only.
    let mut parents: HashSet<&Path> = HashSet::new();
    for (rel, excluded) in &walked {
        if !excluded {
            for a in rel.ancestors().skip(1) {
                if a.as_os_str().is_empty() || !parents.insert(a) {
                    break;
                }
            }
        }
    }
    let mut members: Vec<&Path> = walked
        .iter()
        .filter(|(rel, excluded)| !excluded || parents.contains(rel.as_path()))
        .map(|(rel, _)| rel.as_path())
        .collect();
    members.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));

    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| PackError::Io { path, error }
    };
    let too_large = |at: &Path| PackError::TooLarge {
        dir: dir.to_path_buf(),
        at: at.to_path_buf(),
    };
    // The archive ends with two zero blocks.
    const TRAILER: u64 = 1024;
    let max = MAX_CONTEXT_BYTES as u64;
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    for rel in members {
        let full = dir.join(rel);
        let md = std::fs::symlink_metadata(&full).map_err(io(&full))?;
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(&md, tar::HeaderMode::Deterministic);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mode(md.permissions().mode() & 0o7777);
        let data = if md.is_file() { md.len() } else { 0 };
        let estimate = b.get_ref().len() as u64 + 512 + data.div_ceil(512) * 512 + TRAILER;
        if estimate > max {
            return Err(too_large(rel));
        }
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&full).map_err(io(&full))?;
            h.set_size(0);
            b.append_link(&mut h, rel, &target).map_err(io(&full))?;
        } else if md.is_dir() {
            h.set_size(0);
            b.append_data(&mut h, rel, std::io::empty())
                .map_err(io(&full))?;
        } else if md.is_file() {
            let f = std::fs::File::open(&full).map_err(io(&full))?;
            b.append_data(&mut h, rel, f).map_err(io(&full))?;
        } else {
            continue;
        }
        // Long names and link targets take extra header blocks.
        if b.get_ref().len() as u64 + TRAILER > max {
            return Err(too_large(rel));
        }
    }
    b.into_inner().map_err(io(dir))
}

/// The context's `.dockerignore` (none: nothing excluded), keeping `.dockerignore` and
/// the Dockerfiles.
fn read_ignore(dir: &Path, dockerfiles: &[&str]) -> Result<DockerIgnore, PackError> {
    let file = dir.join(FILE_NAME);
    let text = match std::fs::read(&file) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(PackError::Io { path: file, error }),
    };
    let dockerfiles: &[&str] = if dockerfiles.is_empty() {
        &["Dockerfile"]
    } else {
        dockerfiles
    };
    DockerIgnore::for_build(&text, dockerfiles).map_err(|error| PackError::Ignore { file, error })
}

/// Every file, directory and symlink below `root.join(rel)` with whether `ignore`
/// excludes it; an excluded directory's subtree only when something in it may be sent.
fn walk(
    root: &Path,
    rel: &Path,
    ignore: &DockerIgnore,
    out: &mut Vec<(PathBuf, bool)>,
) -> Result<(), PackError> {
    let dir = root.join(rel);
    let io = |error| PackError::Io {
        path: dir.clone(),
        error,
    };
    for entry in std::fs::read_dir(&dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let r = rel.join(entry.file_name());
        let ft = entry.file_type().map_err(io)?;
        let name = r.to_string_lossy();
        let excluded = !ignore.is_empty() && ignore.is_excluded(&name);
        if ft.is_dir() {
            let descend = !excluded || ignore.may_include_below(&name);
            out.push((r.clone(), excluded));
            if descend {
                walk(root, &r, ignore, out)?;
            }
        } else if ft.is_file() || ft.is_symlink() {
            out.push((r, excluded));
        }
        // sockets, fifos and devices are left out
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(path, link target)` of every member, in order.
    fn members(tar_bytes: &[u8]) -> Vec<(String, String)> {
        tar::Archive::new(tar_bytes)
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.display().to_string())
                    .unwrap_or_default();
                (e.path().unwrap().display().to_string(), link)
            })
            .collect()
    }

    fn names(tar_bytes: &[u8]) -> Vec<String> {
        members(tar_bytes).into_iter().map(|(p, _)| p).collect()
    }

    fn write(root: &Path, rel: &str, data: &[u8]) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    #[test]
    fn packs_deterministically_in_byte_order_with_links_and_modes() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        write(root, "Dockerfile", b"FROM busybox:1.36\n");
        write(root, "sub/x", b"x");
        write(root, "sub-y", b"y");
        std::fs::set_permissions(root.join("sub/x"), std::fs::Permissions::from_mode(0o750))
            .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let one = pack(root, &[]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(root, "sub/x", b"x"); // new mtime, same content
        assert_eq!(one, pack(root, &[]).unwrap(), "same files, same bytes");
        assert_eq!(
            members(&one),
            [
                ("Dockerfile".to_string(), String::new()),
                ("link".to_string(), "/etc/passwd".to_string()),
                ("sub".to_string(), String::new()),
                ("sub-y".to_string(), String::new()),
                ("sub/x".to_string(), String::new()),
            ],
            "byte order ('-' before '/'); the symlink is stored, not followed"
        );
        let mut ar = tar::Archive::new(&one[..]);
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(
                (h.mtime().unwrap(), h.uid().unwrap(), h.gid().unwrap()),
                (0, 0, 0)
            );
            if e.path().unwrap().to_str() == Some("sub/x") {
                assert_eq!(h.mode().unwrap(), 0o750, "permission bits kept");
            }
        }
        let info = denv_compose::context::check_context("a", ".", "Dockerfile", &one).unwrap();
        assert_eq!(info.entries, 5);
    }

    #[test]
    fn dockerignore_leaves_out_what_it_names() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        write(
            root,
            ".dockerignore",
            b"# build inputs only\n.git\nnode_modules\n*.log\n!keep.log\ndocs\n!docs/api/*.md\nDockerfile\n",
        );
        write(root, "Dockerfile", b"FROM busybox:1.36\n");
        write(root, ".git/HEAD", b"ref: refs/heads/main\n");
        write(root, ".git/objects/ab/cd", b"blob");
        write(root, "node_modules/m/index.js", b"js");
        write(root, "app.log", b"log");
        write(root, "keep.log", b"keep");
        write(root, "src/app.log", b"nested logs are not matched by *.log");
        write(root, "src/main.py", b"print()");
        write(root, "docs/intro.md", b"intro");
        write(root, "docs/api/ref.md", b"ref");
        write(root, "docs/api/ref.txt", b"txt");
        let t = pack(root, &[]).unwrap();
        assert_eq!(
            names(&t),
            [
                ".dockerignore",
                "Dockerfile",
                "docs",
                "docs/api",
                "docs/api/ref.md",
                "keep.log",
                "src",
                "src/app.log",
                "src/main.py",
            ]
        );
        denv_compose::context::check_context("a", ".", "Dockerfile", &t).unwrap();
    }

    #[test]
    fn an_ignored_dockerfile_in_an_ignored_directory_is_still_sent() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        write(root, ".dockerignore", b"*\n");
        write(root, "build/app.Dockerfile", b"FROM busybox:1.36\n");
        write(root, "build/other", b"x");
        write(root, "Dockerfile", b"FROM x\n");
        let t = pack(root, &["./build/app.Dockerfile"]).unwrap();
        assert_eq!(
            names(&t),
            [".dockerignore", "build", "build/app.Dockerfile"]
        );
        assert_eq!(
            names(&pack(root, &[]).unwrap()),
            [".dockerignore", "Dockerfile"]
        );
    }

    #[test]
    fn an_ignored_large_file_does_not_count_towards_the_limit() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        write(root, "Dockerfile", b"FROM x\n");
        std::fs::create_dir(root.join("data")).unwrap();
        let f = std::fs::File::create(root.join("data/big.bin")).unwrap();
        f.set_len(40 * 1024 * 1024).unwrap();
        let e = pack(root, &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "build context {} is larger than 32 MiB (stopped at data/big.bin); leave large files out of it",
                root.display()
            )
        );
        write(root, ".dockerignore", b"data/*.bin\n");
        let t = pack(root, &[]).unwrap();
        assert_eq!(names(&t), [".dockerignore", "Dockerfile", "data"]);
        assert!(t.len() < 8192);
    }

    #[test]
    fn the_limit_counts_what_is_written() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let f = std::fs::File::create(root.join("fits.bin")).unwrap();
        // One header, the data and the trailer: exactly the limit.
        f.set_len(MAX_CONTEXT_BYTES as u64 - 512 - 1024).unwrap();
        let t = pack(root, &[]).unwrap();
        assert_eq!(t.len(), MAX_CONTEXT_BYTES);
        denv_compose::context::check_context("a", ".", "fits.bin", &t).unwrap();
        write(root, "a", b"");
        let e = pack(root, &[]).unwrap_err();
        assert!(
            matches!(&e, PackError::TooLarge { at, .. } if at == Path::new("fits.bin")),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_directory_or_the_pattern() {
        let d = tempfile::tempdir().unwrap();
        let e = pack(&d.path().join("nope"), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "build context {}/nope is not a directory",
                d.path().display()
            )
        );
        write(d.path(), ".dockerignore", b"ok\n\n[a-\n");
        let e = pack(d.path(), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}/.dockerignore line 3: pattern \"[a-\" does not parse: unclosed character class [",
                d.path().display()
            )
        );
        assert!(matches!(e, PackError::Ignore { .. }));
    }
}
