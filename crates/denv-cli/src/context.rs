//! Build contexts for `denv deploy` (`13-ref-compose.md` "Builds"): for every compose
//! service with a `build:`, the context directory (relative to the compose file's
//! directory, or absolute) is packed into an uncompressed tar and sent with the deploy,
//! keyed by the context as written.
//!
//! The tar is deterministic: members in byte order of their paths, owner 0:0, mtime 0,
//! permission bits kept, symlinks stored as links (never followed), so the same files
//! give the same digest and the sidecar's build cache hits. Packing stops with an error
//! once the archive would pass 32 MiB. `.dockerignore` is not applied.

use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Largest context sent, bytes (the control plane refuses more).
pub const MAX_CONTEXT_BYTES: u64 = 32 * 1024 * 1024;

/// The contexts of `compose_text`'s build services, keyed by the context as written.
/// A file the parser refuses yields no contexts (the control plane then reports it).
pub fn contexts_for(compose_text: &str, compose_dir: &Path) -> Result<HashMap<String, Vec<u8>>> {
    let Ok(spec) = denv_compose::parse(compose_text) else {
        return Ok(HashMap::new());
    };
    let mut out = HashMap::new();
    for b in spec.builds.values() {
        if out.contains_key(&b.context) {
            continue;
        }
        let dir = compose_dir.join(&b.context);
        if !dir.is_dir() {
            bail!(
                "build context \"{}\" ({}) is not a directory",
                b.context,
                dir.display()
            );
        }
        let tar = pack(&dir).with_context(|| format!("packing build context {}", dir.display()))?;
        out.insert(b.context.clone(), tar);
    }
    Ok(out)
}

/// An uncompressed, deterministic tar of `dir` (see the module docs).
pub fn pack(dir: &Path) -> Result<Vec<u8>> {
    let mut files = Vec::new();
    walk(dir, PathBuf::new(), &mut files)?;
    files.sort();
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let mut total: u64 = 0;
    for rel in files {
        let full = dir.join(&rel);
        let md = std::fs::symlink_metadata(&full)
            .with_context(|| format!("reading {}", full.display()))?;
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(&md, tar::HeaderMode::Deterministic);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        total += 512 + md.len().div_ceil(512) * 512;
        if total > MAX_CONTEXT_BYTES {
            bail!(
                "build context {} is larger than 32 MiB (stopped at {}); leave large files out of it",
                dir.display(),
                rel.display()
            );
        }
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(&full)?;
            h.set_size(0);
            b.append_link(&mut h, &rel, &target)?;
        } else if md.is_dir() {
            h.set_size(0);
            b.append_data(&mut h, &rel, std::io::empty())?;
        } else if md.is_file() {
            let f = std::fs::File::open(&full)
                .with_context(|| format!("reading {}", full.display()))?;
            b.append_data(&mut h, &rel, f)?;
        }
    }
    Ok(b.into_inner()?)
}

fn walk(root: &Path, rel: PathBuf, out: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(&rel);
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let r = rel.join(entry.file_name());
        let ft = entry.file_type()?;
        if ft.is_dir() {
            out.push(r.clone());
            walk(root, r, out)?;
        } else if ft.is_file() || ft.is_symlink() {
            out.push(r);
        }
        // sockets, fifos and devices are left out
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_deterministically_and_keys_by_context_as_written() {
        let d = tempfile::tempdir().unwrap();
        let app = d.path().join("app");
        std::fs::create_dir_all(app.join("sub")).unwrap();
        std::fs::write(app.join("Dockerfile"), "FROM busybox:1.36\n").unwrap();
        std::fs::write(app.join("sub/x"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", app.join("link")).unwrap();
        let compose = "services:\n  a: {build: ./app}\n  b: {build: {context: ./app, target: t}}\n  c: {image: busybox:1.36}\n";
        let one = contexts_for(compose, d.path()).unwrap();
        assert_eq!(one.keys().collect::<Vec<_>>(), ["./app"]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(app.join("sub/x"), "x").unwrap(); // new mtime, same content
        let two = contexts_for(compose, d.path()).unwrap();
        assert_eq!(one["./app"], two["./app"], "same files, same bytes");
        let info = denv_compose::context::check_context("a", "./app", "Dockerfile", &one["./app"])
            .unwrap();
        assert_eq!(info.entries, 4);
        let mut ar = tar::Archive::new(&one["./app"][..]);
        let names: Vec<(String, String)> = ar
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
            .collect();
        assert_eq!(
            names,
            [
                ("Dockerfile".to_string(), String::new()),
                ("link".to_string(), "/etc/passwd".to_string()),
                ("sub".to_string(), String::new()),
                ("sub/x".to_string(), String::new())
            ],
            "the symlink is stored, not followed"
        );
        let e = contexts_for("services:\n  a: {build: ./nope}\n", d.path()).unwrap_err();
        assert!(e.to_string().starts_with("build context \"./nope\""), "{e}");
    }

    #[test]
    fn a_context_over_the_limit_stops_with_a_message() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Dockerfile"), "FROM x\n").unwrap();
        let f = std::fs::File::create(d.path().join("big.bin")).unwrap();
        f.set_len(MAX_CONTEXT_BYTES + 1).unwrap();
        let e = pack(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("is larger than 32 MiB (stopped at big.bin)"),
            "{e}"
        );
    }
}
