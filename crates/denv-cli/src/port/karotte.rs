//! Karotte environments → denv projects (spec page `36-blog-karotte.md` §2 "Import a
//! Karotte environment as a denv project"; our `docs/howto/karotte.md`).
//!
//! **What is read.** A Karotte environment directory holds one image's definition (a
//! `Dockerfile`, or a built image named with `--image`) and Python files declaring
//! `Step(...)`s. The Python is never run: `python3` (on the importing machine) parses
//! every `*.py` file under the directory (hidden directories and `__pycache__` skipped)
//! with its `ast` module and reads, from each call to `Step(...)` or `<module>.Step(...)`,
//! the keyword arguments `name` (a string), `instructions` (a string) and
//! `submission_paths` (a list of absolute path strings), each a literal
//! (`ast.literal_eval`). `judge` is not read: the judge stays Karotte's, run in the image
//! as `karotte judge --step <name>`. The student's user is the Dockerfile's last `USER`
//! when that is a numeric non-root uid, else `--user` (default `1000:1000`).
//!
//! **What is written** (into the directory, or `--out`): `docker-compose.yaml` with
//! service `karotte` (the image, the student's `user`, `sleep infinity`, the student's
//! home as volume `student` when every submission path is under one `/home/<user>`),
//! `x-denv` with `egress: deny`, `agent.service: karotte` and `verifier` = the first step's
//! judge (`service: karotte`, `command: [karotte, judge, --step, <name>]`, `collect:` its
//! `submission_paths`); and per step `tasks/<name>/instruction.md` (its `instructions`)
//! and `tasks/<name>/verifier.yaml` (its judge command and `collect`).

use super::{compose_path, OutFile};
use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use serde_yaml::{Mapping, Value};
use std::path::Path;

/// The service a Karotte image runs as.
pub const SERVICE: &str = "karotte";
/// The student's uid:gid when the Dockerfile does not say.
pub const DEFAULT_USER: &str = "1000:1000";

/// The `ast` reader run by `python3` (argv: the environment directory). Prints
/// `{"steps": [{file, line, name?, instructions?, submission_paths?, bad: [...]}]}`.
const AST_READER: &str = r#"
import ast, json, os, stat, sys
root = sys.argv[1]
real_root = os.path.realpath(root)
steps = []
for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
    for f in sorted(files):
        if not f.endswith(".py"):
            continue
        p = os.path.join(d, f)
        rel = os.path.relpath(p, root)
        real = os.path.realpath(p)
        if os.path.commonpath([real, real_root]) != real_root:
            print(f"{rel}: resolves to {real}, outside the directory being imported", file=sys.stderr)
            sys.exit(3)
        try:
            regular = stat.S_ISREG(os.stat(real).st_mode)
        except OSError as e:
            print(f"{rel}: {e.strerror}", file=sys.stderr)
            sys.exit(3)
        if not regular:
            print(f"{rel}: not a regular file", file=sys.stderr)
            sys.exit(3)
        with open(real, encoding="utf-8") as fh:
            try:
                tree = ast.parse(fh.read(), rel)
            except SyntaxError as e:
                print(f"{rel}:{e.lineno}: {e.msg}", file=sys.stderr)
                sys.exit(3)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        calls.sort(key=lambda n: (n.lineno, n.col_offset))
        for n in calls:
            fn = n.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            if name != "Step":
                continue
            s = {"file": rel, "line": n.lineno, "bad": []}
            for kw in n.keywords:
                if kw.arg in ("name", "instructions", "submission_paths"):
                    try:
                        s[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        s["bad"].append(kw.arg)
            steps.append(s)
json.dump({"steps": steps}, sys.stdout)
"#;

/// One `Step(...)` as read.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RawStep {
    /// File relative to the environment directory.
    pub file: String,
    /// Line of the call.
    pub line: u64,
    /// `name=`.
    #[serde(default)]
    pub name: Option<serde_json::Value>,
    /// `instructions=`.
    #[serde(default)]
    pub instructions: Option<serde_json::Value>,
    /// `submission_paths=`.
    #[serde(default)]
    pub submission_paths: Option<serde_json::Value>,
    /// Keywords that were not literals.
    #[serde(default)]
    pub bad: Vec<String>,
}

/// A step, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Its name (a task name: letters, digits, `.`, `_`, `-`).
    pub name: String,
    /// Its instructions.
    pub instructions: String,
    /// Absolute paths.
    pub submission_paths: Vec<String>,
}

#[derive(Deserialize)]
struct AstOut {
    steps: Vec<RawStep>,
}

/// The steps of `env_dir` as `python3` reads them (see the module doc). Errors: no
/// `python3`, a file that does not parse (`<file>:<line>: <msg>`).
pub fn read_steps(env_dir: &Path) -> Result<Vec<RawStep>> {
    let out = std::process::Command::new("python3")
        .arg("-I")
        .arg("-c")
        .arg(AST_READER)
        .arg(env_dir)
        .output()
        .map_err(|e| {
            anyhow!("running python3 to read the Karotte steps (it parses them with ast, never runs them): {e}")
        })?;
    if !out.status.success() {
        bail!(
            "reading the Karotte steps of {}: {}",
            env_dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let r: AstOut =
        serde_json::from_slice(&out.stdout).context("reading the steps python3 printed")?;
    Ok(r.steps)
}

/// Checks raw steps: each has a literal string `name` (usable as a directory name),
/// string `instructions`, and a non-empty list of absolute `submission_paths` without
/// `..`; names are unique. Errors name `<file>:<line>`.
pub fn check_steps(raw: Vec<RawStep>) -> Result<Vec<Step>> {
    if raw.is_empty() {
        bail!("no Step(...) found in the directory's Python files");
    }
    let mut out: Vec<Step> = Vec::new();
    for r in raw {
        let at = format!("{}:{}", r.file, r.line);
        if let Some(b) = r.bad.first() {
            bail!("{at}: Step {b}= must be a literal (the import reads it without running Python)");
        }
        let name = match &r.name {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(_) => bail!("{at}: Step name= must be a string"),
            None => bail!("{at}: Step has no name= keyword"),
        };
        if name.is_empty()
            || !name.as_bytes()[0].is_ascii_alphanumeric()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            bail!("{at}: Step name {name:?} must be letters, digits, '.', '_' and '-', starting with a letter or digit (it names a task directory)");
        }
        let instructions = match &r.instructions {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(_) => bail!("{at}: Step {name} instructions= must be a string"),
            None => bail!("{at}: Step {name} has no instructions= keyword"),
        };
        let paths: Vec<String> = match &r.submission_paths {
            Some(serde_json::Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| anyhow!("{at}: Step {name} submission_paths= must be strings"))?,
            Some(serde_json::Value::String(s)) => vec![s.clone()],
            _ => bail!(
                "{at}: Step {name} needs submission_paths= (a non-empty list of absolute paths)"
            ),
        };
        for p in &paths {
            if !p.starts_with('/') || p.split('/').any(|c| c == "..") {
                bail!("{at}: Step {name} submission path {p:?} must be absolute, without \"..\"");
            }
        }
        if out.iter().any(|s| s.name == name) {
            bail!("{at}: a second Step named {name}");
        }
        out.push(Step {
            name,
            instructions,
            submission_paths: paths,
        });
    }
    Ok(out)
}

/// The Dockerfile's last `USER` when it is a numeric non-root uid (`1000`, `1000:1000`).
pub fn dockerfile_user(dockerfile: &str) -> Option<String> {
    let last = dockerfile
        .lines()
        .map(str::trim)
        .rfind(|l| l.get(..5).is_some_and(|p| p.eq_ignore_ascii_case("USER ")))?;
    let u = last.get(5..).unwrap_or_default().trim().to_string();
    let uid = u.split(':').next().unwrap_or("");
    (!uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()) && !denv_compose::is_root_user(&u))
        .then_some(u)
}

/// What an import writes: the compose file and the tasks, plus notes.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// `docker-compose.yaml` then `tasks/<name>/…`.
    pub files: Vec<OutFile>,
    /// Name for the project (the directory's).
    pub project: String,
    /// One line each.
    pub notes: Vec<String>,
}

fn judge(step: &str) -> Vec<String> {
    ["karotte", "judge", "--step", step]
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// The import of Karotte environment `env_dir` with `steps` (read by [`read_steps`] and
/// [`check_steps`]) into `out_dir` (both absolute); `image` replaces the Dockerfile,
/// `user` is used when the Dockerfile has no numeric non-root `USER`. See the module doc
/// for the mapping. Errors: neither a Dockerfile nor `--image`.
pub fn import(
    env_dir: &Path,
    out_dir: &Path,
    steps: &[Step],
    image: Option<&str>,
    user: &str,
) -> Result<Imported> {
    let mut notes = Vec::new();
    let name = env_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let project = super::slug(&name)?;
    let mut svc = Mapping::new();
    let dockerfile = env_dir.join("Dockerfile");
    let mut student = None;
    match image {
        Some(i) => {
            svc.insert("image".into(), i.into());
        }
        None if dockerfile.is_file() => {
            let text = std::fs::read_to_string(&dockerfile)
                .with_context(|| format!("reading {}", dockerfile.display()))?;
            student = dockerfile_user(&text);
            let mut b = Mapping::new();
            b.insert("context".into(), compose_path(env_dir, out_dir).into());
            svc.insert("build".into(), Value::Mapping(b));
        }
        None => bail!(
            "{} has no Dockerfile: pass --image with the environment's built image",
            env_dir.display()
        ),
    }
    let user = match student {
        Some(u) => u,
        None => {
            if !denv_compose::is_valid_user(user) || denv_compose::is_root_user(user) {
                bail!("--user {user:?} must be a numeric non-root uid[:gid] (e.g. 1000:1000): the student is never root");
            }
            notes.push(format!(
                "the student runs as {user} (the Dockerfile names no numeric non-root USER; --user sets it)"
            ));
            user.to_string()
        }
    };
    svc.insert("user".into(), user.into());
    svc.insert(
        "command".into(),
        Value::Sequence(vec!["sleep".into(), "infinity".into()]),
    );
    let first = &steps[0];
    // The student's home as a volume when every submission path is under one /home/<x>.
    let homes: std::collections::BTreeSet<String> = steps
        .iter()
        .flat_map(|s| &s.submission_paths)
        .map(|p| {
            let mut it = p.split('/').skip(1);
            match (it.next(), it.next(), it.next()) {
                (Some("home"), Some(h), Some(_)) => format!("/home/{h}"),
                _ => String::new(),
            }
        })
        .collect();
    let mut top = Mapping::new();
    let mut x = Mapping::new();
    x.insert("kind".into(), "rl-environment".into());
    x.insert("egress".into(), "deny".into());
    let mut agent = Mapping::new();
    agent.insert("service".into(), SERVICE.into());
    x.insert("agent".into(), Value::Mapping(agent));
    let mut v = Mapping::new();
    v.insert("service".into(), SERVICE.into());
    v.insert(
        "command".into(),
        Value::Sequence(judge(&first.name).into_iter().map(Value::String).collect()),
    );
    v.insert(
        "collect".into(),
        Value::Sequence(
            first
                .submission_paths
                .iter()
                .cloned()
                .map(Value::String)
                .collect(),
        ),
    );
    x.insert("verifier".into(), Value::Mapping(v));
    top.insert("x-denv".into(), Value::Mapping(x));
    let home = (homes.len() == 1)
        .then(|| homes.into_iter().next())
        .flatten()
        .filter(|h| !h.is_empty());
    if let Some(h) = &home {
        svc.insert(
            "volumes".into(),
            Value::Sequence(vec![format!("student:{h}").into()]),
        );
    }
    let mut services = Mapping::new();
    services.insert(SERVICE.into(), Value::Mapping(svc));
    top.insert("services".into(), Value::Mapping(services));
    if home.is_some() {
        let mut vols = Mapping::new();
        vols.insert("student".into(), Value::Mapping(Mapping::new()));
        top.insert("volumes".into(), Value::Mapping(vols));
    }
    if steps.len() > 1 {
        notes.push(format!(
            "x-denv.verifier judges step {} (the first); each step's judge is in tasks/<step>/verifier.yaml",
            first.name
        ));
    }
    let compose = format!(
        "# Written by `denv import karotte` from {}.\n# The Karotte source stays authoritative for the steps and judges.\n{}",
        env_dir.display(),
        serde_yaml::to_string(&Value::Mapping(top))?
    );
    denv_compose::parse(&compose)
        .map_err(|e| anyhow!("the imported compose file is refused: {e}"))?;
    let mut files = vec![OutFile::new(out_dir.join("docker-compose.yaml"), compose)];
    for s in steps {
        let dir = out_dir.join("tasks").join(&s.name);
        let mut instr = s.instructions.trim_end().to_string();
        instr.push('\n');
        files.push(OutFile::new(dir.join("instruction.md"), instr));
        let o = super::tasks::VerifierOverride {
            service: Some(SERVICE.into()),
            command: Some(judge(&s.name)),
            collect: Some(s.submission_paths.clone()),
            timeout_sec: None,
        };
        files.push(OutFile::new(
            dir.join("verifier.yaml"),
            format!(
                "# Step {} of the Karotte environment: its judge, run by denv verify.\n{}",
                s.name,
                serde_yaml::to_string(&o)?
            ),
        ));
    }
    Ok(Imported {
        files,
        project,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/fixtures/karotte/ops-env")
    }

    fn raw(name: &str, paths: serde_json::Value) -> RawStep {
        RawStep {
            file: "steps.py".into(),
            line: 3,
            name: Some(name.into()),
            instructions: Some("do".into()),
            submission_paths: Some(paths),
            bad: Vec::new(),
        }
    }

    #[test]
    fn the_fixtures_steps_are_read_without_running_them() {
        let d = tempfile::tempdir().unwrap();
        // A file that would fail if it were run: the reader only parses it.
        std::fs::write(
            d.path().join("steps.py"),
            "import sys\nsys.exit(9)\nfrom karotte import Step\nimport karotte\nA = karotte.Step(name=\"a\", instructions=\"x\", submission_paths=[\"/home/s/a\"], judge=lambda p: 1)\n",
        )
        .unwrap();
        std::fs::create_dir(d.path().join(".venv")).unwrap();
        std::fs::write(d.path().join(".venv/x.py"), "Step(name=\"hidden\")\n").unwrap();
        let steps = check_steps(read_steps(d.path()).unwrap()).unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].submission_paths, ["/home/s/a"]);
        let steps = check_steps(read_steps(&fixture()).unwrap()).unwrap();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["write_greeting", "sum_numbers"], "file order");
        assert!(steps[1]
            .instructions
            .contains("/home/student/numbers.txt holds"));
        std::fs::write(d.path().join("bad.py"), "def f(:\n").unwrap();
        let e = read_steps(d.path()).unwrap_err().to_string();
        assert!(e.contains("bad.py:1:"), "{e}");
    }

    #[test]
    fn the_reader_opens_only_the_directorys_own_regular_files() {
        // A FIFO named *.py would block the reader's open() forever; a *.py symlink
        // to a file outside would have it read the importer's files.
        let d = tempfile::tempdir().unwrap();
        let env = d.path().join("env");
        std::fs::create_dir(&env).unwrap();
        std::fs::write(
            env.join("steps.py"),
            "S = Step(name=\"a\", instructions=\"x\", submission_paths=[\"/home/s/a\"])\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("outside.py"),
            "S = Step(name=\"b\", instructions=\"y\", submission_paths=[\"/home/s/b\"])\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("steps.py", env.join("inside.py")).unwrap();
        assert_eq!(read_steps(&env).unwrap().len(), 2, "a link inside is read");
        std::os::unix::fs::symlink(d.path().join("outside.py"), env.join("link.py")).unwrap();
        let e = read_steps(&env).unwrap_err().to_string();
        assert!(e.contains("link.py") && e.contains("outside"), "{e}");
        std::fs::remove_file(env.join("link.py")).unwrap();
        let st = std::process::Command::new("mkfifo")
            .arg(env.join("z.py"))
            .status()
            .unwrap();
        assert!(st.success());
        let t0 = std::time::Instant::now();
        let e = read_steps(&env).unwrap_err().to_string();
        assert!(
            e.contains("z.py") && e.contains("not a regular file"),
            "{e}"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn steps_are_checked() {
        let ok = check_steps(vec![raw("a", serde_json::json!("/home/s/x"))]).unwrap();
        assert_eq!(
            ok[0].submission_paths,
            ["/home/s/x"],
            "one string is a list of one"
        );
        let e = |r: Vec<RawStep>| check_steps(r).unwrap_err().to_string();
        assert!(e(vec![]).contains("no Step(...) found"));
        assert!(e(vec![raw("a", serde_json::json!(["rel"]))])
            .contains("steps.py:3: Step a submission path \"rel\" must be absolute"));
        assert!(e(vec![raw("a", serde_json::json!([]))]).contains("needs submission_paths="));
        assert!(e(vec![raw("a b", serde_json::json!(["/x"]))])
            .contains("Step name \"a b\" must be letters"));
        assert!(e(vec![
            raw("a", serde_json::json!(["/x"])),
            raw("a", serde_json::json!(["/y"]))
        ])
        .contains("a second Step named a"));
        let mut r = raw("a", serde_json::json!(["/x"]));
        r.bad.push("instructions".into());
        assert!(e(vec![r]).contains("Step instructions= must be a literal"));
        let mut r = raw("a", serde_json::json!(["/x"]));
        r.name = None;
        assert!(e(vec![r]).contains("Step has no name= keyword"));
    }

    #[test]
    fn dockerfile_user_is_the_last_numeric_non_root_user() {
        assert_eq!(
            dockerfile_user("FROM x\nUSER root\nuser 1000:1000\n").as_deref(),
            Some("1000:1000")
        );
        assert_eq!(dockerfile_user("USER 1000\nUSER student\n"), None, "a name");
        assert_eq!(dockerfile_user("USER 0\n"), None);
        assert_eq!(dockerfile_user("FROM x\n"), None);
    }

    #[test]
    fn import_writes_the_compose_file_and_a_task_per_step() {
        let dir = fixture();
        let steps = check_steps(read_steps(&dir).unwrap()).unwrap();
        let i = import(&dir, &dir, &steps, None, DEFAULT_USER).unwrap();
        assert_eq!(i.project, "ops-env");
        let compose = std::str::from_utf8(&i.files[0].bytes).unwrap();
        let spec = denv_compose::parse(compose).unwrap();
        let svc = spec.service(SERVICE).unwrap();
        assert_eq!(svc.user, "1000:1000", "the Dockerfile's USER");
        assert_eq!(spec.builds[SERVICE].context, ".");
        assert_eq!(svc.volumes[0].path, "/home/student");
        assert_eq!(spec.egress, denv_compose::Egress::Deny);
        let v = spec.verifier.unwrap();
        assert_eq!(v.command, ["karotte", "judge", "--step", "write_greeting"]);
        assert_eq!(v.collect, ["/home/student/submission"]);
        assert_eq!(v.service.as_deref(), Some(SERVICE));
        let paths: Vec<String> = i
            .files
            .iter()
            .map(|f| f.path.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "docker-compose.yaml",
                "tasks/write_greeting/instruction.md",
                "tasks/write_greeting/verifier.yaml",
                "tasks/sum_numbers/instruction.md",
                "tasks/sum_numbers/verifier.yaml"
            ]
        );
        let o: crate::port::tasks::VerifierOverride =
            serde_yaml::from_slice(&i.files[4].bytes).unwrap();
        assert_eq!(
            o.command.unwrap(),
            ["karotte", "judge", "--step", "sum_numbers"]
        );

        let d = tempfile::tempdir().unwrap();
        let i = import(
            d.path(),
            &d.path().join("out"),
            &steps,
            Some("karotte-ops:3"),
            "2000:2000",
        )
        .unwrap();
        let spec = denv_compose::parse(std::str::from_utf8(&i.files[0].bytes).unwrap()).unwrap();
        assert_eq!(spec.services[0].image, "karotte-ops:3");
        assert_eq!(
            spec.services[0].user, "2000:2000",
            "--user without a Dockerfile USER"
        );
        let e = import(d.path(), d.path(), &steps, None, DEFAULT_USER)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no Dockerfile: pass --image"), "{e}");
        let e = import(d.path(), d.path(), &steps, Some("i"), "root")
            .unwrap_err()
            .to_string();
        assert!(e.contains("the student is never root"), "{e}");
    }
}
