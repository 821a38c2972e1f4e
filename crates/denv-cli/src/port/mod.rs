//! `denv import` and `denv export` (spec pages `31-blog-harbor.md` §2–3,
//! `36-blog-karotte.md` §2, `33-blog-openenv.md` "Exporting"; our
//! `docs/reference/cli.md` "import" and "export").
//!
//! The mappings are pure functions over files read from disk, so they are unit-tested
//! without a control plane:
//!
//! - [`harbor::import`]: a Harbor task directory → a compose file with `x-denv`.
//! - [`karotte::import`]: a Karotte environment directory → a compose file and `tasks/`.
//! - [`harbor::export`]: a version's spec plus the project's tasks → Harbor task
//!   directories.
//! - [`openenv::export`]: a version's spec → an OpenEnv environment package.
//!
//! `run.rs` adds the calls to the control plane (create the project, deploy `alpha`,
//! read the version).

pub mod harbor;
pub mod karotte;
pub mod openenv;
pub mod tasks;

use anyhow::{bail, Context, Result};
use std::path::{Component, Path, PathBuf};

/// A file an import or export writes: its path and bytes, and whether it is executable.
#[derive(Debug, Clone, PartialEq)]
pub struct OutFile {
    /// Where it goes.
    pub path: PathBuf,
    /// Its content.
    pub bytes: Vec<u8>,
    /// Mode 0755 instead of 0644.
    pub executable: bool,
}

impl OutFile {
    /// A 0644 file.
    pub fn new(path: impl Into<PathBuf>, bytes: impl Into<Vec<u8>>) -> Self {
        OutFile {
            path: path.into(),
            bytes: bytes.into(),
            executable: false,
        }
    }

    /// A 0755 file.
    pub fn exec(path: impl Into<PathBuf>, bytes: impl Into<Vec<u8>>) -> Self {
        OutFile {
            executable: true,
            ..OutFile::new(path, bytes)
        }
    }
}

/// `p` with symlinks resolved as far as it exists: its deepest existing ancestor
/// canonicalised, the rest appended as written.
fn resolve_existing(p: &Path) -> Result<PathBuf> {
    let p = normalize(p);
    let mut rest = Vec::new();
    let mut at = p.as_path();
    loop {
        match std::fs::canonicalize(at) {
            Ok(c) => return Ok(rest.iter().rev().fold(c, |acc, r| acc.join(r))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (at.parent(), at.file_name()) else {
                    return Err(e).with_context(|| format!("resolving {}", p.display()));
                };
                rest.push(name.to_os_string());
                at = parent;
            }
            Err(e) => return Err(e).with_context(|| format!("resolving {}", at.display())),
        }
    }
}

/// Writes `files`, which are all below `root`, creating parent directories. Without
/// `force`, nothing is written when any of them exists already: the error names the
/// first (`<path> exists; pass --force to replace it`). Nothing is written when a file's
/// directory resolves outside `root` (a symlinked directory in an imported task, whose
/// directory is the default output): `<path> is outside <root> (through a symbolic link)`.
pub fn write_all(files: &[OutFile], root: &Path, force: bool) -> Result<()> {
    let top = resolve_existing(root)?;
    for f in files {
        let dir = f.path.parent().unwrap_or(&f.path);
        if !resolve_existing(dir)?.starts_with(&top) {
            bail!(
                "{} is outside {} (through a symbolic link); nothing was written",
                f.path.display(),
                root.display()
            );
        }
    }
    if !force {
        if let Some(f) = files
            .iter()
            .find(|f| std::fs::symlink_metadata(&f.path).is_ok())
        {
            bail!("{} exists; pass --force to replace it", f.path.display());
        }
    }
    for f in files {
        if let Some(p) = f.path.parent() {
            std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
        }
        if std::fs::symlink_metadata(&f.path).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&f.path)
                .with_context(|| format!("replacing {}", f.path.display()))?;
        }
        std::fs::write(&f.path, &f.bytes)
            .with_context(|| format!("writing {}", f.path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = if f.executable { 0o755 } else { 0o644 };
            std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("setting the mode of {}", f.path.display()))?;
        }
    }
    Ok(())
}

/// `path` lexically normalised: `.` dropped, `..` applied to what precedes it.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` as written in a compose file next to `base`: relative (`./sub`, `.`) when it
/// is inside `base`, absolute otherwise. Both must be absolute.
pub fn compose_path(path: &Path, base: &Path) -> String {
    let (p, b) = (normalize(path), normalize(base));
    match p.strip_prefix(&b) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
        Ok(rel) => format!("./{}", rel.display()),
        Err(_) => p.display().to_string(),
    }
}

/// An absolute path for `p` (joined to the current directory when relative).
pub fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(normalize(p))
    } else {
        Ok(normalize(
            &std::env::current_dir()
                .context("reading the current directory")?
                .join(p),
        ))
    }
}

/// `s` as one POSIX shell word (single-quoted unless it only has safe characters).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A project or task name from free text: lower case, runs of characters other than
/// letters, digits, `.`, `_`, `-` become `-`, starting with a letter or digit, without a
/// trailing `-`, at most 63 characters.
/// Errors when nothing is left.
pub fn slug(text: &str) -> Result<String> {
    let mut out = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let s: String = out
        .trim_start_matches(['-', '.', '_'])
        .trim_end_matches('-')
        .chars()
        .take(63)
        .collect();
    let s = s.trim_end_matches('-').to_string();
    if s.is_empty() || !s.as_bytes()[0].is_ascii_alphanumeric() {
        bail!("cannot make a name from {text:?}: use letters, digits, '.', '_' and '-'");
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_paths_are_relative_inside_the_base_and_absolute_outside() {
        let b = Path::new("/w/task");
        assert_eq!(
            compose_path(Path::new("/w/task/environment"), b),
            "./environment"
        );
        assert_eq!(
            compose_path(Path::new("/w/task/./environment/../environment/api"), b),
            "./environment/api"
        );
        assert_eq!(compose_path(Path::new("/w/task"), b), ".");
        assert_eq!(compose_path(Path::new("/w/other/env"), b), "/w/other/env");
    }

    #[test]
    fn quoting_and_slugs() {
        assert_eq!(shell_quote("/tests/test.sh"), "/tests/test.sh");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(
            slug("denv-e2e/Hello World").unwrap(),
            "denv-e2e-hello-world"
        );
        assert!(slug("///")
            .unwrap_err()
            .to_string()
            .contains("cannot make a name"));
    }

    #[test]
    fn write_all_refuses_existing_files_without_force() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a/b.txt");
        write_all(&[OutFile::exec(&a, "x")], d.path(), false).unwrap();
        let e = write_all(
            &[OutFile::new(d.path().join("c"), "c"), OutFile::new(&a, "y")],
            d.path(),
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.ends_with("b.txt exists; pass --force to replace it"),
            "{e}"
        );
        assert!(!d.path().join("c").exists(), "nothing written on refusal");
        write_all(&[OutFile::new(&a, "y")], d.path(), true).unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "y");
    }

    #[test]
    fn write_all_never_writes_outside_its_root_through_a_symlinked_directory() {
        // A downloaded Karotte directory (the default --out) shipping `tasks` as a link
        // to one of the importer's directories.
        let d = tempfile::tempdir().unwrap();
        let (root, elsewhere) = (d.path().join("env"), d.path().join("elsewhere"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("tasks")).unwrap();
        let files = [
            OutFile::new(root.join("docker-compose.yaml"), "c"),
            OutFile::new(root.join("tasks/a/instruction.md"), "i"),
        ];
        for force in [false, true] {
            let e = write_all(&files, &root, force).unwrap_err().to_string();
            assert!(e.contains("outside"), "{e}");
            assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
            assert!(
                !root.join("docker-compose.yaml").exists(),
                "nothing written"
            );
        }
        // A root that is itself a link (the user's own --out) is fine.
        std::fs::remove_file(root.join("tasks")).unwrap();
        let link = d.path().join("out-link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        write_all(&[OutFile::new(link.join("tasks/a/x"), "x")], &link, false).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("tasks/a/x")).unwrap(),
            "x"
        );
    }
}
