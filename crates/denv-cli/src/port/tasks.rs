//! A project's tasks (spec `31-blog-harbor.md` §3: "a `tasks/` directory with
//! `instruction.md` and a verifier"), as `denv export` reads them from the project's
//! source directory and `denv import karotte` writes them.
//!
//! Layout, under the source directory:
//!
//! ```text
//! tasks/<name>/instruction.md    required: the task's prompt
//! tasks/<name>/verifier.yaml     optional: replaces keys of the version's x-denv.verifier
//!                                (service, command, collect, timeout_sec)
//! tasks/<name>/solution/         optional: a reference solution (solve.sh)
//! ```
//!
//! Without `tasks/`, a source directory that has an `instruction.md` at its root (an
//! imported Harbor task) is one task, named after the project, with `solution/` beside it.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A task's own verifier keys (`tasks/<name>/verifier.yaml`); each given key replaces the
/// version's `x-denv.verifier` key of the same name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifierOverride {
    /// The service the verifier runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The verifier's argv.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Absolute paths collected from the agent's service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collect: Option<Vec<String>>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_sec: Option<u64>,
}

/// One task of a project.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Its name (the directory's).
    pub name: String,
    /// `instruction.md`.
    pub instruction: String,
    /// `verifier.yaml`, when present.
    pub verifier: VerifierOverride,
    /// `solution/`, when present.
    pub solution: Option<PathBuf>,
}

/// The tasks of `source` (see the module doc), sorted by name. `default_name` names the
/// single task of a source with a root `instruction.md`. An empty list when there is
/// neither. Errors name the file: a task directory without `instruction.md`, a
/// `verifier.yaml` that does not parse.
pub fn discover(source: &Path, default_name: &str) -> Result<Vec<Task>> {
    let dir = source.join("tasks");
    let mut out = Vec::new();
    if dir.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if !e.file_type()?.is_dir() {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            out.push(load(&e.path(), &name)?);
        }
        if out.is_empty() {
            bail!("{} has no task directories", dir.display());
        }
        return Ok(out);
    }
    if source.join("instruction.md").is_file() {
        out.push(load(source, default_name)?);
    }
    Ok(out)
}

fn load(dir: &Path, name: &str) -> Result<Task> {
    let ip = dir.join("instruction.md");
    let instruction = std::fs::read_to_string(&ip)
        .with_context(|| format!("reading {}: every task has an instruction.md", ip.display()))?;
    let vp = dir.join("verifier.yaml");
    let verifier = if vp.is_file() {
        let t =
            std::fs::read_to_string(&vp).with_context(|| format!("reading {}", vp.display()))?;
        serde_yaml::from_str(&t).map_err(|e| anyhow!("{}: {e}", vp.display()))?
    } else {
        VerifierOverride::default()
    };
    let sol = dir.join("solution");
    Ok(Task {
        name: name.to_string(),
        instruction,
        verifier,
        solution: sol.is_dir().then_some(sol),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_dir_root_instruction_or_nothing() {
        let d = tempfile::tempdir().unwrap();
        assert!(discover(d.path(), "p").unwrap().is_empty());
        std::fs::write(d.path().join("instruction.md"), "do it").unwrap();
        std::fs::create_dir(d.path().join("solution")).unwrap();
        let t = discover(d.path(), "p").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].name.as_str(), t[0].instruction.as_str()),
            ("p", "do it")
        );
        assert!(t[0].solution.is_some());
        let b = d.path().join("tasks/b");
        let a = d.path().join("tasks/a");
        std::fs::create_dir_all(&b).unwrap();
        std::fs::create_dir_all(&a).unwrap();
        std::fs::write(b.join("instruction.md"), "B").unwrap();
        let e = discover(d.path(), "p").unwrap_err().to_string();
        assert!(
            e.contains("tasks/a/instruction.md: every task has an instruction.md"),
            "{e}"
        );
        std::fs::write(a.join("instruction.md"), "A").unwrap();
        std::fs::write(
            a.join("verifier.yaml"),
            "command: [judge, a]\ncollect: [/x]\n",
        )
        .unwrap();
        let t = discover(d.path(), "p").unwrap();
        assert_eq!(
            t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            t[0].verifier.command.as_deref(),
            Some(&["judge".to_string(), "a".to_string()][..])
        );
        std::fs::write(a.join("verifier.yaml"), "comand: [x]\n").unwrap();
        let e = discover(d.path(), "p").unwrap_err().to_string();
        assert!(e.contains("verifier.yaml: unknown field `comand`"), "{e}");
    }
}
