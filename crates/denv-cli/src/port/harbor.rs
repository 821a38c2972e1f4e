//! Harbor tasks ↔ denv projects (spec page `31-blog-harbor.md` §2 "Import a Harbor task
//! as a denv project" and §3 "Export a denv environment as Harbor tasks"; our
//! `docs/howto/harbor.md`).
//!
//! A Harbor task is a directory: `task.toml`, `instruction.md`, `environment/` (a
//! `Dockerfile`, a `docker-compose.yaml`, or neither with `[environment] docker_image`),
//! `tests/test.sh` (writes `/logs/verifier/reward.txt`) and `solution/`.

use super::{compose_path, shell_quote, OutFile};
use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use serde_yaml::{Mapping, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The service Harbor's agent runs in (Harbor's implicit compose service).
pub const MAIN: &str = "main";
/// The one-shot service an import adds to make the agent's directories its own.
pub const SETUP: &str = "harbor-setup";
/// The uid:gid the agent runs as when the task does not give a non-root numeric user.
pub const AGENT_USER: &str = "1000:1000";
/// Directory the agent must be able to write whatever the task's image says (Harbor's
/// convention: tasks and their tests work in `/app`).
pub const APP_DIR: &str = "/app";
/// Largest `tests/` directory an import carries (as a tar, before base64).
pub const MAX_TESTS_BYTES: usize = 1024 * 1024;
/// The compose file names Harbor reads in `environment/`.
pub const COMPOSE_FILES: [&str; 2] = ["docker-compose.yaml", "docker-compose.yml"];

/// The shell script of an imported task's verifier: unpacks the `tests/` tar (base64 in
/// `$1`) into a fresh `/tests` and runs `tests/test.sh` with bash (sh when the image has
/// no bash), as Harbor does, after exporting the task's `[verifier] env`.
const VERIFIER_SCRIPT: &str = "set -e; rm -rf /tests; mkdir -p /tests /logs/verifier; \
printf '%s' \"$1\" | base64 -d | tar -xf - -C /tests; chmod -R a+rX /tests; \
if command -v bash >/dev/null 2>&1; then exec bash /tests/test.sh; else exec sh /tests/test.sh; fi";

/// What `denv import harbor` writes and reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The compose file (with `x-denv`) to write.
    pub compose: String,
    /// Name for the project (from `[task] name`, else the directory's name).
    pub project: String,
    /// What the mapping decided that the user should know (one line each).
    pub notes: Vec<String>,
}

fn toml_str<'a>(doc: &'a toml_edit::DocumentMut, table: &str, key: &str) -> Option<&'a str> {
    doc.get(table)?.get(key)?.as_str()
}

fn toml_num(doc: &toml_edit::DocumentMut, table: &str, key: &str) -> Result<Option<f64>> {
    let Some(v) = doc.get(table).and_then(|t| t.get(key)) else {
        return Ok(None);
    };
    if let Some(i) = v.as_integer() {
        return Ok(Some(i as f64));
    }
    if let Some(f) = v.as_float() {
        return Ok(Some(f));
    }
    bail!("task.toml: [{table}] {key} must be a number")
}

/// Checks that `path` (which the import reads or packs) resolves, symlinks followed,
/// inside the task directory whose canonical path is `root`: a downloaded task must not
/// make the import read, or the deploy upload, the importer's other files. A path that
/// does not exist is checked as written.
fn inside_task(root: &Path, path: &Path, what: &str) -> Result<()> {
    let resolved = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => super::normalize(path),
        Err(e) => return Err(e).with_context(|| format!("resolving {}", path.display())),
    };
    if !resolved.starts_with(root) {
        bail!(
            "{what} {} resolves to {}, outside the task directory {}: an import reads and uploads only the task's own files",
            path.display(),
            resolved.display(),
            root.display()
        );
    }
    Ok(())
}

/// `task.toml` parsed.
pub fn read_task_toml(task_dir: &Path) -> Result<toml_edit::DocumentMut> {
    let p = task_dir.join("task.toml");
    if std::fs::metadata(&p).is_ok_and(|m| !m.is_file()) {
        bail!("{} is not a regular file", p.display());
    }
    let text = std::fs::read_to_string(&p).with_context(|| {
        format!(
            "reading {}: a Harbor task directory has a task.toml",
            p.display()
        )
    })?;
    text.parse::<toml_edit::DocumentMut>()
        .map_err(|e| anyhow!("{}: invalid TOML: {e}", p.display()))
}

/// `x-denv.egress` for a task: `allow` when `[environment] network_mode = "public"`
/// (Harbor's default) or the deprecated `allow_internet = true`; `deny` for
/// `no-network`, `allow_internet = false`, and `allowlist` (denv has no allowlist: the
/// note says so).
fn egress(doc: &toml_edit::DocumentMut, notes: &mut Vec<String>) -> Result<&'static str> {
    if let Some(v) = doc.get("environment").and_then(|t| t.get("allow_internet")) {
        let b = v.as_bool().ok_or_else(|| {
            anyhow!("task.toml: [environment] allow_internet must be true or false")
        })?;
        return Ok(if b { "allow" } else { "deny" });
    }
    match toml_str(doc, "environment", "network_mode") {
        None | Some("public") => Ok("allow"),
        Some("no-network") => Ok("deny"),
        Some("allowlist") => {
            notes.push(
                "network_mode \"allowlist\" maps to egress: deny (denv has no host allowlist)"
                    .into(),
            );
            Ok("deny")
        }
        Some(o) => bail!(
            "task.toml: [environment] network_mode {o:?} must be public, no-network or allowlist"
        ),
    }
}

/// Compose's `${VAR}` interpolation of one string with `vars`: `$VAR`, `${VAR}`,
/// `${VAR:-default}`, `${VAR-default}`, `$$`. A variable that is unset and has no default
/// is an error naming it (the import writes a file that is never interpolated again).
pub fn interpolate(text: &str, vars: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('{') {
            let end = r
                .find('}')
                .ok_or_else(|| anyhow!("unterminated ${{ in {text:?}"))?;
            let expr = &r[..end];
            let (name, default) = match expr.find([':', '-']) {
                Some(j) => {
                    let d = expr[j..]
                        .strip_prefix(":-")
                        .or_else(|| expr[j..].strip_prefix('-'))
                        .ok_or_else(|| {
                            anyhow!("${{{expr}}} in {text:?}: only ${{VAR}}, ${{VAR:-default}} and ${{VAR-default}} are supported")
                        })?;
                    (&expr[..j], Some(d))
                }
                None => (expr, None),
            };
            let v = match (vars.get(name), default) {
                (Some(v), Some(d)) if v.is_empty() && expr[name.len()..].starts_with(':') => {
                    d.to_string()
                }
                (Some(v), _) => v.clone(),
                (None, Some(d)) => d.to_string(),
                (None, None) => bail!(
                    "the task's compose file uses ${{{name}}}, which is not a Harbor variable nor in [environment] env; set it there or give a default (${{{name}:-…}})"
                ),
            };
            out.push_str(&v);
            rest = &r[end + 1..];
        } else {
            let n = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if n == 0 {
                out.push('$');
                rest = after;
                continue;
            }
            let name = &after[..n];
            let v = vars.get(name).ok_or_else(|| {
                anyhow!("the task's compose file uses ${name}, which is not a Harbor variable nor in [environment] env")
            })?;
            out.push_str(v);
            rest = &after[n..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn interpolate_value(v: Value, vars: &BTreeMap<String, String>) -> Result<Value> {
    Ok(match v {
        Value::String(s) => Value::String(interpolate(&s, vars)?),
        Value::Sequence(s) => Value::Sequence(
            s.into_iter()
                .map(|v| interpolate_value(v, vars))
                .collect::<Result<_>>()?,
        ),
        Value::Mapping(m) => {
            let mut out = Mapping::new();
            for (k, v) in m {
                out.insert(interpolate_value(k, vars)?, interpolate_value(v, vars)?);
            }
            Value::Mapping(out)
        }
        other => other,
    })
}

/// An `environment:` value (mapping or `KEY=VALUE` list) as a mapping.
fn env_mapping(v: Option<&Value>) -> Mapping {
    match v {
        Some(Value::Mapping(m)) => m.clone(),
        Some(Value::Sequence(s)) => {
            let mut m = Mapping::new();
            for item in s {
                if let Some(s) = item.as_str() {
                    match s.split_once('=') {
                        Some((k, v)) => m.insert(k.into(), v.into()),
                        None => m.insert(s.into(), Value::Null),
                    };
                }
            }
            m
        }
        _ => Mapping::new(),
    }
}

/// Compose's merge of a later file over an earlier one: mappings key by key,
/// `environment` as mappings, `build` as a string is a context; anything else replaces.
fn merge(base: Value, over: Value, key: &str) -> Value {
    if key == "environment" {
        let mut m = env_mapping(Some(&base));
        for (k, v) in env_mapping(Some(&over)) {
            m.insert(k, v);
        }
        return Value::Mapping(m);
    }
    let as_build = |v: Value| match v {
        Value::String(s) if key == "build" => {
            let mut m = Mapping::new();
            m.insert("context".into(), Value::String(s));
            Value::Mapping(m)
        }
        v => v,
    };
    match (as_build(base), as_build(over)) {
        (Value::Mapping(mut b), Value::Mapping(o)) => {
            for (k, v) in o {
                let ks = k.as_str().unwrap_or_default().to_string();
                let merged = match b.remove(&k) {
                    Some(old) => merge(old, v, &ks),
                    None => v,
                };
                b.insert(k, merged);
            }
            Value::Mapping(b)
        }
        (_, o) => o,
    }
}

fn map_mut<'a>(m: &'a mut Mapping, key: &str) -> &'a mut Mapping {
    if !matches!(m.get(key), Some(Value::Mapping(_))) {
        m.insert(key.into(), Value::Mapping(Mapping::new()));
    }
    match m.get_mut(key) {
        Some(Value::Mapping(m)) => m,
        _ => unreachable!("inserted above"),
    }
}

/// The `tests/` directory as a deterministic tar (paths in byte order, owner 0:0, mtime
/// 0), at most [`MAX_TESTS_BYTES`]. Symlinks and special files are refused.
pub fn tests_tar(tests: &Path) -> Result<Vec<u8>> {
    let mut files = Vec::new();
    collect(tests, Path::new(""), &mut files)?;
    files.sort();
    let mut b = tar::Builder::new(Vec::new());
    for (rel, is_dir) in files {
        let full = tests.join(&rel);
        let meta = std::fs::metadata(&full)?;
        let mut h = tar::Header::new_ustar();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        #[cfg(unix)]
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        #[cfg(not(unix))]
        let mode = 0o644;
        h.set_mode(mode | if is_dir { 0o755 } else { 0o444 });
        if is_dir {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            b.append_data(&mut h, &rel, std::io::empty())?;
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(meta.len());
            let f = std::fs::File::open(&full)
                .with_context(|| format!("reading {}", full.display()))?;
            b.append_data(&mut h, &rel, f)?;
        }
        if b.get_ref().len() > MAX_TESTS_BYTES {
            bail!(
                "{} is larger than {} KiB; an import carries the tests inside the compose file",
                tests.display(),
                MAX_TESTS_BYTES / 1024
            );
        }
    }
    let out = b.into_inner()?;
    if out.len() > MAX_TESTS_BYTES {
        bail!(
            "{} is larger than {} KiB; an import carries the tests inside the compose file",
            tests.display(),
            MAX_TESTS_BYTES / 1024
        );
    }
    Ok(out)
}

fn collect(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, bool)>) -> Result<()> {
    let dir = root.join(rel);
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let r = rel.join(e.file_name());
        let t = e.file_type()?;
        if t.is_dir() {
            out.push((r.clone(), true));
            collect(root, &r, out)?;
        } else if t.is_file() {
            out.push((r, false));
        } else {
            bail!(
                "{}: only regular files and directories are carried into the grader",
                root.join(&r).display()
            );
        }
    }
    Ok(())
}

/// The verifier command of an imported task: `sh -c <script> denv-harbor-tests <base64
/// tar of tests/>`, with `env` exported first (service `main`'s `environment` and the
/// task's `[verifier] env` over it: Harbor runs `test.sh` with the container's variables,
/// while denv runs a service verifier with a clean environment).
pub fn verifier_command(tests_tar: &[u8], env: &BTreeMap<String, String>) -> Vec<String> {
    let mut script = String::new();
    for (k, v) in env {
        script.push_str(&format!("export {k}={}; ", shell_quote(v)));
    }
    script.push_str(VERIFIER_SCRIPT);
    vec![
        "sh".into(),
        "-c".into(),
        script,
        "denv-harbor-tests".into(),
        base64::engine::general_purpose::STANDARD.encode(tests_tar),
    ]
}

/// The import of a Harbor task directory (spec `31-blog-harbor.md` §2), with the compose
/// file to be written in `out_dir` (build contexts are written relative to it when
/// inside it, absolute otherwise). Both paths absolute.
///
/// - **Environment.** `environment/docker-compose.yaml` (or `.yml`) is merged over
///   Harbor's implicit `main` service (`build: environment/` when
///   `environment/Dockerfile` exists, else `image: <docker_image>`; `command: sh -c
///   "sleep infinity"`) with Harbor's variables interpolated (`CONTEXT_DIR`,
///   `MAIN_IMAGE_NAME`, `PREBUILT_IMAGE_NAME`, `CPUS`, `MEMORY`, `[environment] env`);
///   relative build contexts are relative to `environment/`, as in Harbor. Without a
///   compose file, `main` alone (a Dockerfile task is built on the target; a
///   `docker_image` task uses the image). `[environment] env` goes into `main`'s
///   environment.
/// - **Agent.** `x-denv.agent.service: main`. `main` runs as `1000:1000` unless the task
///   gives it a numeric non-root `user`. `/app` and `[environment] workdir` become named
///   volumes of `main`, and a one-shot `harbor-setup` service (same image, root, before
///   `main` starts) gives them to the agent's uid, so the agent can write where the
///   task's files are.
/// - **Verifier.** `x-denv.verifier` runs in service `main` of the fork, as root: `tests/`
///   travels in the command (a base64 tar, at most 1 MiB) and is unpacked into `/tests`
///   just before `tests/test.sh` runs; the agent's image and volumes never hold it.
///   `solution/` goes nowhere. `timeout_sec` from `[verifier] timeout_sec`.
/// - **Network and caps.** `network_mode`/`allow_internet` → `x-denv.egress`; `cpus` and
///   `memory_mb` → `cpus`/`mem_limit` of `main`; `storage_mb` → `x-denv.disk`.
///
/// Errors name the file and the problem (no `task.toml`, no `tests/test.sh`, no
/// environment definition, an unknown `${VAR}`, a bad value).
pub fn import(task_dir: &Path, out_dir: &Path) -> Result<Imported> {
    // (A missing directory is reported below, as a missing task.toml.)
    let root = std::fs::canonicalize(task_dir).unwrap_or_else(|_| super::normalize(task_dir));
    for (rel, what) in [
        ("task.toml", "task.toml"),
        ("environment", "environment/"),
        ("tests", "tests/"),
    ] {
        inside_task(&root, &task_dir.join(rel), what)?;
    }
    let doc = read_task_toml(task_dir)?;
    let mut notes = Vec::new();
    let test_sh = task_dir.join("tests/test.sh");
    if !test_sh.is_file() {
        bail!(
            "{} is missing: Harbor's verifier script becomes x-denv.verifier",
            test_sh.display()
        );
    }
    let env_dir = task_dir.join("environment");
    let compose_file = COMPOSE_FILES
        .iter()
        .map(|n| env_dir.join(n))
        .find(|p| p.is_file());
    let dockerfile = env_dir.join("Dockerfile").is_file();
    let docker_image = toml_str(&doc, "environment", "docker_image").map(str::to_string);
    let name = toml_str(&doc, "task", "name")
        .map(|n| n.rsplit('/').next().unwrap_or(n).to_string())
        .or_else(|| {
            task_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let project = super::slug(&name)?;

    let mut task_env = BTreeMap::new();
    if let Some(t) = doc.get("environment").and_then(|t| t.get("env")) {
        let t = t
            .as_table_like()
            .ok_or_else(|| anyhow!("task.toml: [environment] env must be a table"))?;
        for (k, v) in t.iter() {
            let v = v
                .as_str()
                .ok_or_else(|| anyhow!("task.toml: [environment] env.{k} must be a string"))?;
            task_env.insert(k.to_string(), v.to_string());
        }
    }
    let mut verifier_env = BTreeMap::new();
    if let Some(t) = doc.get("verifier").and_then(|t| t.get("env")) {
        let t = t
            .as_table_like()
            .ok_or_else(|| anyhow!("task.toml: [verifier] env must be a table"))?;
        for (k, v) in t.iter() {
            let v = v
                .as_str()
                .ok_or_else(|| anyhow!("task.toml: [verifier] env.{k} must be a string"))?;
            verifier_env.insert(k.to_string(), v.to_string());
        }
    }
    let cpus = toml_num(&doc, "environment", "cpus")?;
    let memory_mb = toml_num(&doc, "environment", "memory_mb")?;
    let storage_mb = toml_num(&doc, "environment", "storage_mb")?;

    // Harbor's variables: the process environment is deliberately not read (the file is
    // written once; it must not depend on the shell that imported it).
    let mut vars = task_env.clone();
    vars.insert(
        "CONTEXT_DIR".into(),
        super::normalize(&env_dir).display().to_string(),
    );
    vars.insert("MAIN_IMAGE_NAME".into(), format!("hb__{project}"));
    if let Some(i) = &docker_image {
        vars.insert("PREBUILT_IMAGE_NAME".into(), i.clone());
    }
    if let Some(c) = cpus {
        vars.insert("CPUS".into(), c.to_string());
    }
    if let Some(m) = memory_mb {
        vars.insert("MEMORY".into(), format!("{m}M"));
    }

    // Harbor's implicit main service.
    let mut main = Mapping::new();
    if dockerfile {
        let mut b = Mapping::new();
        b.insert("context".into(), "${CONTEXT_DIR}".into());
        main.insert("build".into(), Value::Mapping(b));
    } else if docker_image.is_some() {
        main.insert("image".into(), "${PREBUILT_IMAGE_NAME}".into());
    } else if compose_file.is_none() {
        bail!(
            "{} has no environment definition: add environment/Dockerfile, environment/docker-compose.yaml, or [environment] docker_image in task.toml",
            task_dir.display()
        );
    }
    main.insert(
        "command".into(),
        Value::Sequence(vec!["sh".into(), "-c".into(), "sleep infinity".into()]),
    );
    let mut services = Mapping::new();
    services.insert(MAIN.into(), Value::Mapping(main));
    let mut top = Mapping::new();
    top.insert("services".into(), Value::Mapping(services));
    let mut top = Value::Mapping(top);
    if let Some(cf) = &compose_file {
        inside_task(&root, cf, "the compose file")?;
        let text =
            std::fs::read_to_string(cf).with_context(|| format!("reading {}", cf.display()))?;
        let task: Value = serde_yaml::from_str(&text)
            .map_err(|e| anyhow!("{}: invalid YAML: {e}", cf.display()))?;
        if !matches!(task, Value::Mapping(_)) {
            bail!("{}: a compose file must be a mapping", cf.display());
        }
        top = merge(top, task, "");
    }
    let mut top = match interpolate_value(top, &vars)? {
        Value::Mapping(m) => m,
        _ => unreachable!("a mapping stays a mapping"),
    };
    top.remove("version");
    top.remove("name");

    // Build contexts: relative ones are relative to environment/ (Harbor runs compose
    // there), written relative to the output directory.
    let services = map_mut(&mut top, "services");
    let names: Vec<Value> = services.keys().cloned().collect();
    for n in &names {
        let Some(Value::Mapping(svc)) = services.get_mut(n) else {
            bail!(
                "the task's compose file: service {} must be a mapping",
                n.as_str().unwrap_or("?")
            );
        };
        if let Some(b) = svc.remove("build") {
            let mut b = match b {
                Value::String(s) => {
                    let mut m = Mapping::new();
                    m.insert("context".into(), Value::String(s));
                    m
                }
                Value::Mapping(m) => m,
                _ => bail!(
                    "the task's compose file: service {} build must be a path or a mapping",
                    n.as_str().unwrap_or("?")
                ),
            };
            let ctx = b
                .get("context")
                .and_then(Value::as_str)
                .unwrap_or(".")
                .to_string();
            let abs = if Path::new(&ctx).is_absolute() {
                PathBuf::from(&ctx)
            } else {
                env_dir.join(&ctx)
            };
            inside_task(
                &root,
                &abs,
                &format!("service {}'s build context", n.as_str().unwrap_or("?")),
            )?;
            b.insert("context".into(), compose_path(&abs, out_dir).into());
            svc.insert("build".into(), Value::Mapping(b));
        }
    }
    let Some(Value::Mapping(main)) = services.get_mut(MAIN) else {
        bail!("the task's compose file: service main must be a mapping");
    };
    if main.get("image").is_none() && main.get("build").is_none() {
        bail!(
            "{} has no environment definition for service main: add environment/Dockerfile, set [environment] docker_image, or give main an image",
            task_dir.display()
        );
    }
    // Task env into main.
    if !task_env.is_empty() {
        let mut m = env_mapping(main.get("environment"));
        for (k, v) in &task_env {
            m.insert(k.as_str().into(), v.as_str().into());
        }
        main.insert("environment".into(), Value::Mapping(m));
    }
    // The grader's variables: main's environment (Harbor's test.sh sees the container's),
    // then [verifier] env. Names that are not shell identifiers cannot be exported.
    let mut grader_env = BTreeMap::new();
    for (k, v) in env_mapping(main.get("environment")) {
        let (Some(k), Some(v)) = (
            k.as_str(),
            match v {
                Value::String(s) => Some(s),
                Value::Number(n) => Some(n.to_string()),
                Value::Bool(b) => Some(b.to_string()),
                _ => None,
            },
        ) else {
            continue;
        };
        if k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            grader_env.insert(k.to_string(), v);
        } else {
            notes.push(format!(
                "variable {k:?} of service main is not passed to the verifier (not a shell name)"
            ));
        }
    }
    grader_env.extend(verifier_env);
    // Caps.
    if let Some(c) = cpus {
        main.insert("cpus".into(), serde_yaml::to_value(c)?);
    }
    if let Some(m) = memory_mb {
        main.insert("mem_limit".into(), format!("{}m", m.ceil() as u64).into());
    }
    // The agent's user.
    let user = match main.get("user") {
        Some(Value::String(u)) if !denv_compose::is_root_user(u) => u.clone(),
        Some(Value::Number(n)) if !denv_compose::is_root_user(&n.to_string()) => n.to_string(),
        Some(u) => {
            notes.push(format!(
                "service main's user {} is root or a name; the agent runs as {AGENT_USER} (the agent is never root in denv)",
                serde_yaml::to_string(u).unwrap_or_default().trim()
            ));
            AGENT_USER.to_string()
        }
        None => {
            notes.push(format!(
                "the agent (service main) runs as {AGENT_USER}: the agent is never root in denv"
            ));
            AGENT_USER.to_string()
        }
    };
    main.insert("user".into(), user.clone().into());
    // Writable directories of the agent: named volumes, chowned by harbor-setup.
    let mut dirs = vec![APP_DIR.to_string()];
    if let Some(w) = toml_str(&doc, "environment", "workdir") {
        if !w.starts_with('/') {
            bail!("task.toml: [environment] workdir {w:?} must be an absolute path");
        }
        if w != APP_DIR && w != "/" {
            dirs.push(w.trim_end_matches('/').to_string());
        }
    }
    let mut mounts: Vec<String> = match main.get("volumes") {
        Some(Value::Sequence(s)) => s
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                anyhow!("the task's compose file: service main volumes must be name:/path strings")
            })?,
        None => Vec::new(),
        Some(_) => bail!("the task's compose file: service main volumes must be a list"),
    };
    let mut new_volumes = Vec::new();
    let mut setup_mounts = Vec::new();
    for d in &dirs {
        let existing = mounts
            .iter()
            .find(|m| m.split(':').nth(1) == Some(d.as_str()))
            .cloned();
        let mount = match existing {
            Some(m) => m,
            None => {
                let vol = format!("agent{}", d.replace('/', "-").trim_end_matches('-'));
                new_volumes.push(vol.clone());
                let m = format!("{vol}:{d}");
                mounts.push(m.clone());
                m
            }
        };
        setup_mounts.push(mount);
    }
    main.insert(
        "volumes".into(),
        Value::Sequence(mounts.into_iter().map(Value::String).collect()),
    );
    let mut deps = match main.remove("depends_on") {
        None => Mapping::new(),
        Some(Value::Sequence(s)) => {
            let mut m = Mapping::new();
            for d in s {
                let mut c = Mapping::new();
                c.insert("condition".into(), "service_started".into());
                m.insert(d, Value::Mapping(c));
            }
            m
        }
        Some(Value::Mapping(m)) => m,
        Some(_) => {
            bail!("the task's compose file: service main depends_on must be a list or a mapping")
        }
    };
    let mut c = Mapping::new();
    c.insert("condition".into(), "service_completed_successfully".into());
    deps.insert(SETUP.into(), Value::Mapping(c));
    main.insert("depends_on".into(), Value::Mapping(deps));
    let mut setup = Mapping::new();
    for k in ["image", "build"] {
        if let Some(v) = main.get(k) {
            setup.insert(k.into(), v.clone());
        }
    }
    setup.insert("user".into(), "0:0".into());
    let uid_gid = if user.contains(':') {
        user.clone()
    } else {
        format!("{user}:{user}")
    };
    let chown = format!(
        "chown -R {} {}",
        uid_gid,
        dirs.iter()
            .map(|d| shell_quote(d))
            .collect::<Vec<_>>()
            .join(" ")
    );
    setup.insert(
        "command".into(),
        Value::Sequence(vec!["sh".into(), "-c".into(), chown.into()]),
    );
    setup.insert(
        "volumes".into(),
        Value::Sequence(setup_mounts.into_iter().map(Value::String).collect()),
    );
    if services.contains_key(SETUP) {
        bail!("the task's compose file already has a service {SETUP}, the name the import uses for its setup step");
    }
    services.insert(SETUP.into(), Value::Mapping(setup));
    if !new_volumes.is_empty() {
        let vols = map_mut(&mut top, "volumes");
        for v in new_volumes {
            vols.insert(v.into(), Value::Mapping(Mapping::new()));
        }
    }

    // x-denv.
    let egress = egress(&doc, &mut notes)?;
    let tar = tests_tar(&task_dir.join("tests"))?;
    let mut verifier = Mapping::new();
    verifier.insert("service".into(), MAIN.into());
    verifier.insert(
        "command".into(),
        Value::Sequence(
            verifier_command(&tar, &grader_env)
                .into_iter()
                .map(Value::String)
                .collect(),
        ),
    );
    if let Some(t) = toml_num(&doc, "verifier", "timeout_sec")? {
        verifier.insert("timeout_sec".into(), (t.ceil().max(1.0) as u64).into());
    }
    let mut agent = Mapping::new();
    agent.insert("service".into(), MAIN.into());
    let mut x = Mapping::new();
    x.insert("kind".into(), "rl-environment".into());
    x.insert("egress".into(), egress.into());
    if let Some(s) = storage_mb {
        x.insert("disk".into(), format!("{}m", s.ceil() as u64).into());
    }
    x.insert("agent".into(), Value::Mapping(agent));
    x.insert("verifier".into(), Value::Mapping(verifier));
    let mut out = Mapping::new();
    out.insert("x-denv".into(), Value::Mapping(x));
    for (k, v) in top {
        if k.as_str() != Some("x-denv") {
            out.insert(k, v);
        }
    }
    if toml_str(&doc, "verifier", "environment_mode").is_some() {
        notes.push("[verifier] environment_mode is not needed: denv verify always grades on a fork of the agent's environment".into());
    }
    let header = format!(
        "# Written by `denv import harbor` from {}.\n\
         # The verifier carries tests/ (a base64 tar, unpacked into /tests in the fork just\n\
         # before tests/test.sh runs); import again with --force after changing tests/.\n",
        task_dir.display()
    );
    let compose = format!("{header}{}", serde_yaml::to_string(&Value::Mapping(out))?);
    denv_compose::parse(&compose)
        .map_err(|e| anyhow!("the imported compose file is refused: {e}"))?;
    Ok(Imported {
        compose,
        project,
        notes,
    })
}

/// What `denv export --harbor` is given about the version.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSource<'a> {
    /// Project name (task names are `<project>/<task>`).
    pub project: &'a str,
    /// The version id (`ver_…`), recorded in the files.
    pub version: &'a str,
    /// The version's spec (with `image_id` pinned per service).
    pub spec: &'a denv_compose::Spec,
    /// The project's tasks ([`super::tasks::discover`]).
    pub tasks: &'a [super::tasks::Task],
}

/// The verifier of one task: the version's `x-denv.verifier` with the task's
/// `verifier.yaml` keys over it.
fn task_verifier(
    spec: &denv_compose::Spec,
    t: &super::tasks::Task,
) -> Result<(String, Vec<String>, Vec<String>, u64)> {
    let base = spec.verifier.as_ref();
    let o = &t.verifier;
    let service = o
        .service
        .clone()
        .or_else(|| base.and_then(|v| v.service.clone()));
    let command = o
        .command
        .clone()
        .or_else(|| base.map(|v| v.command.clone()))
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            anyhow!(
                "task {}: the version has no x-denv.verifier and tasks/{}/verifier.yaml gives no command",
                t.name,
                t.name
            )
        })?;
    let Some(service) = service else {
        bail!(
            "task {}: the verifier runs in its own image ({}); a Harbor verifier runs tests/test.sh in the agent's container, so export takes a service verifier (set service: in tasks/{}/verifier.yaml)",
            t.name,
            base.and_then(|v| v.image.as_deref()).unwrap_or("?"),
            t.name
        );
    };
    let collect = o
        .collect
        .clone()
        .or_else(|| base.map(|v| v.collect.clone()))
        .unwrap_or_default();
    let timeout = o
        .timeout_sec
        .or_else(|| base.map(|v| v.timeout_sec))
        .filter(|t| *t > 0)
        .unwrap_or(denv_proto::contract::VERIFIER_TIMEOUT_SEC);
    Ok((service, command, collect, timeout))
}

/// `tests/test.sh` of an exported task: runs the verifier as `denv verify` does, in the
/// agent's container as root (where Harbor runs it): each `collect` path is copied to
/// `/submission/<path>` (a symlink, hard link or special file in it scores 0, as denv
/// refuses it), `SUBMISSION=/submission`, the command runs in `/`, and when it wrote no
/// `/logs/verifier/reward.txt` the last word of its stdout is the reward (0 when that is
/// not a number).
pub fn test_sh(origin: &str, command: &[String], collect: &[String]) -> String {
    let cmd = command
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    let paths = if collect.is_empty() {
        String::new()
    } else {
        collect
            .iter()
            .map(|p| shell_quote(p))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        r#"#!/bin/sh
# Written by `denv export --harbor` from {origin}: the version's x-denv.verifier, run
# the way `denv verify` runs it (as root, in the agent's container, after the agent).
set -u
mkdir -p /logs/verifier
rm -f /logs/verifier/reward.txt
rm -rf /submission
mkdir -p /submission
chmod 700 /submission
for p in {paths}; do
  [ -e "$p" ] || [ -L "$p" ] || continue
  bad="$(find "$p" \( -type l -o \( ! -type f ! -type d \) -o \( -type f -links +1 \) \) -print 2>/dev/null | head -n 1)"
  if [ -L "$p" ] || [ -n "$bad" ]; then
    echo "denv: submission refused: ${{bad:-$p}} is a symlink, hard link or special file" >&2
    echo 0 > /logs/verifier/reward.txt
    exit 0
  fi
  mkdir -p "/submission$(dirname "$p")"
  cp -R "$p" "/submission$p"
done
export SUBMISSION=/submission
cd /
out=/logs/verifier/denv-verifier-stdout.txt
{cmd} > "$out"
code=$?
cat "$out"
if [ ! -s /logs/verifier/reward.txt ]; then
  last="$(tr -s ' \t\r' '\n\n\n' < "$out" | grep -v '^$' | tail -n 1)"
  case "$last" in
    ''|*[!0-9.eE+-]*)
      echo "denv: the verifier wrote no reward (exit $code)" >&2
      echo 0 > /logs/verifier/reward.txt ;;
    *) echo "$last" > /logs/verifier/reward.txt ;;
  esac
fi
"#
    )
}

fn copy_tree(src: &Path, dst: &Path, out: &mut Vec<OutFile>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .with_context(|| format!("reading {}", src.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let t = e.file_type()?;
        let p = e.path();
        if t.is_dir() {
            copy_tree(&p, &dst.join(e.file_name()), out)?;
        } else if t.is_file() {
            let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            #[cfg(unix)]
            let exec =
                std::os::unix::fs::PermissionsExt::mode(&e.metadata()?.permissions()) & 0o111 != 0;
            #[cfg(not(unix))]
            let exec = false;
            let f = OutFile::new(dst.join(e.file_name()), bytes);
            out.push(OutFile {
                executable: exec || p.extension().is_some_and(|x| x == "sh"),
                ..f
            });
        } else {
            bail!(
                "{}: only regular files and directories are exported",
                p.display()
            );
        }
    }
    Ok(())
}

fn pinned(spec: &denv_compose::Spec, s: &denv_compose::Service) -> Result<String> {
    let _ = spec;
    if s.image_id.is_empty() {
        bail!(
            "service {} of the version has no pinned image id (its first deploy did not finish?)",
            s.name
        );
    }
    Ok(s.image_id.clone())
}

/// The compose file of a multi-service export: every service on its pinned image id,
/// the agent's renamed `main` (Harbor's agent service; the old name kept as a network
/// alias), with command, environment, user, named volumes, healthcheck, dependencies and
/// caps.
fn export_compose(spec: &denv_compose::Spec, agent: &str) -> Result<String> {
    let rename = |n: &str| {
        if n == agent {
            MAIN.to_string()
        } else {
            n.to_string()
        }
    };
    let mut services = Mapping::new();
    for s in &spec.services {
        if s.name == MAIN && agent != MAIN {
            bail!("service main is not the agent's; Harbor runs its agent in service main");
        }
        let mut m = Mapping::new();
        m.insert("image".into(), pinned(spec, s)?.into());
        if !s.command.is_empty() {
            m.insert(
                "command".into(),
                Value::Sequence(s.command.iter().cloned().map(Value::String).collect()),
            );
        } else if s.name == agent {
            m.insert(
                "command".into(),
                Value::Sequence(vec!["sh".into(), "-c".into(), "sleep infinity".into()]),
            );
        }
        if !s.env.is_empty() {
            let mut e = Mapping::new();
            for (k, v) in &s.env {
                e.insert(k.as_str().into(), v.as_str().into());
            }
            m.insert("environment".into(), Value::Mapping(e));
        }
        if !s.user.is_empty() {
            m.insert("user".into(), s.user.as_str().into());
        }
        if !s.volumes.is_empty() {
            m.insert(
                "volumes".into(),
                Value::Sequence(
                    s.volumes
                        .iter()
                        .map(|v| {
                            format!(
                                "{}:{}{}",
                                v.name,
                                v.path,
                                if v.read_only { ":ro" } else { "" }
                            )
                            .into()
                        })
                        .collect(),
                ),
            );
        }
        if let Some(h) = &s.health {
            let mut hm = Mapping::new();
            hm.insert(
                "test".into(),
                Value::Sequence(h.test.iter().cloned().map(Value::String).collect()),
            );
            hm.insert("interval".into(), format!("{}ms", h.interval_ms).into());
            hm.insert("retries".into(), u64::from(h.retries).into());
            m.insert("healthcheck".into(), Value::Mapping(hm));
        }
        if !s.depends_on.is_empty() {
            let mut d = Mapping::new();
            for dep in &s.depends_on {
                let mut c = Mapping::new();
                let cond = s
                    .depends_on_condition
                    .get(dep)
                    .cloned()
                    .unwrap_or_else(|| denv_compose::SERVICE_STARTED.to_string());
                c.insert("condition".into(), cond.into());
                d.insert(rename(dep).into(), Value::Mapping(c));
            }
            m.insert("depends_on".into(), Value::Mapping(d));
        }
        m.insert(
            "mem_limit".into(),
            format!("{}m", s.resources.memory_mb).into(),
        );
        m.insert("cpus".into(), serde_yaml::to_value(s.resources.cpus)?);
        m.insert("pids_limit".into(), s.resources.pids.into());
        if s.name == agent && agent != MAIN {
            let mut aliases = Mapping::new();
            aliases.insert("aliases".into(), Value::Sequence(vec![agent.into()]));
            let mut nets = Mapping::new();
            nets.insert("default".into(), Value::Mapping(aliases));
            m.insert("networks".into(), Value::Mapping(nets));
        }
        services.insert(rename(&s.name).into(), Value::Mapping(m));
    }
    let mut top = Mapping::new();
    top.insert("services".into(), Value::Mapping(services));
    if !spec.volumes.is_empty() {
        let mut v = Mapping::new();
        for n in &spec.volumes {
            v.insert(n.as_str().into(), Value::Mapping(Mapping::new()));
        }
        top.insert("volumes".into(), Value::Mapping(v));
    }
    Ok(serde_yaml::to_string(&Value::Mapping(top))?)
}

/// The Harbor task directories of a version (spec `31-blog-harbor.md` §3), one per task
/// under `out_dir/<task>/`:
///
/// - `task.toml`: `[task] name = "<project>/<task>"`; `[environment]` with
///   `docker_image` = the agent service's pinned image id (`sha256:…`, as the version
///   records it) for a single-service version, `network_mode` from `x-denv.egress`
///   (`deny` → `no-network`, `allow` → `public`), `cpus` and `memory_mb` of the agent's
///   caps, `storage_mb` of `x-denv.disk`; `[verifier] timeout_sec` and `user = "root"`.
///   Comments say what does not travel (the volumes' data) and, for a multi-service
///   version, the memory and CPUs a single-container target would need (the sum of the
///   services' caps).
/// - `environment/docker-compose.yaml` for a multi-service version (every service on its
///   pinned image id; the agent's service is `main`).
/// - `instruction.md`, `tests/test.sh` ([`test_sh`]), `solution/` when the task has one.
///
/// Errors: no tasks, a task whose verifier cannot run in the agent's container (an image
/// verifier, or a service verifier in another service), no agent service, a service
/// without a pinned image id.
pub fn export(src: &ExportSource<'_>, out_dir: &Path) -> Result<Vec<OutFile>> {
    let spec = src.spec;
    let agent = spec
        .agent
        .as_ref()
        .map(|a| a.service.clone())
        .ok_or_else(|| anyhow!("the version has no x-denv.agent.service: Harbor needs the service its agent runs in"))?;
    let agent_svc = spec
        .service(&agent)
        .ok_or_else(|| anyhow!("the version's agent service {agent} is not among its services"))?;
    if src.tasks.is_empty() {
        bail!("no tasks to export: the source directory has neither tasks/<name>/instruction.md nor an instruction.md (pass --source DIR)");
    }
    let origin = format!("{}@{}", src.project, src.version);
    // One-shot services (another waits for them to exit 0: an import's harbor-setup)
    // do not count as services a single container would have to hold.
    let one_shots: Vec<&str> = spec
        .services
        .iter()
        .filter(|s| {
            spec.services.iter().any(|o| {
                o.depends_on_condition.get(&s.name).map(String::as_str)
                    == Some(denv_compose::SERVICE_COMPLETED_SUCCESSFULLY)
            })
        })
        .map(|s| s.name.as_str())
        .collect();
    let multi = spec.services.len() - one_shots.len() > 1;
    let mut files = Vec::new();
    for t in src.tasks {
        let (service, command, collect, timeout) = task_verifier(spec, t)?;
        if service != agent {
            bail!(
                "task {}: the verifier runs in service {service}, not in the agent's service {agent}; Harbor runs tests/test.sh in the agent's container",
                t.name
            );
        }
        let dir = out_dir.join(&t.name);
        let mut doc = toml_edit::DocumentMut::new();
        doc["schema_version"] = toml_edit::value("1.4");
        doc["task"] = toml_edit::table();
        doc["task"]["name"] = toml_edit::value(format!("{}/{}", src.project, t.name));
        doc["task"]["version"] = toml_edit::value("1.0.0");
        doc["verifier"] = toml_edit::table();
        doc["verifier"]["timeout_sec"] = toml_edit::value(timeout as f64);
        doc["verifier"]["user"] = toml_edit::value("root");
        doc["environment"] = toml_edit::table();
        let mut header = vec![
            format!("Exported by `denv export --harbor` from {origin}."),
            "Not carried: the data of the version's volumes (its snapshot); the task starts from"
                .into(),
            "the image's own files, as a fresh deploy of the environment would.".into(),
        ];
        if multi {
            let mem: u64 = spec.services.iter().map(|s| s.resources.memory_mb).sum();
            let cpus: f64 = spec.services.iter().map(|s| s.resources.cpus).sum();
            header.push(format!(
                "A compose task of {} services: a single-container target (Daytona, Modal, …) would need memory_mb = {mem} and cpus = {cpus} to hold them all.",
                spec.services.len()
            ));
            files.push(OutFile::new(
                dir.join("environment/docker-compose.yaml"),
                export_compose(spec, &agent)?,
            ));
        } else {
            doc["environment"]["docker_image"] = toml_edit::value(pinned(spec, agent_svc)?);
            for o in &one_shots {
                header.push(format!(
                    "One-shot service {o} is not run: a single-container task runs only the agent's image."
                ));
            }
        }
        doc["environment"]["network_mode"] = toml_edit::value(match spec.egress {
            denv_compose::Egress::Allow => "public",
            denv_compose::Egress::Deny => "no-network",
        });
        doc["environment"]["cpus"] = toml_edit::value(agent_svc.resources.cpus);
        doc["environment"]["memory_mb"] =
            toml_edit::value(i64::try_from(agent_svc.resources.memory_mb).unwrap_or(i64::MAX));
        if spec.disk_mb > 0 {
            doc["environment"]["storage_mb"] =
                toml_edit::value(i64::try_from(spec.disk_mb).unwrap_or(i64::MAX));
        }
        let text = format!(
            "{}\n{}",
            header
                .iter()
                .map(|l| format!("# {l}\n"))
                .collect::<String>(),
            doc
        );
        files.push(OutFile::new(dir.join("task.toml"), text));
        files.push(OutFile::new(
            dir.join("instruction.md"),
            t.instruction.clone(),
        ));
        files.push(OutFile::exec(
            dir.join("tests/test.sh"),
            test_sh(&origin, &command, &collect),
        ));
        if let Some(sol) = &t.solution {
            copy_tree(sol, &dir.join("solution"), &mut files)?;
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::tasks::{Task, VerifierOverride};

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../e2e/python/fixtures/harbor")
            .join(name)
    }

    fn copy(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dst.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
    }

    fn untar_names(cmd: &[String]) -> Vec<String> {
        let tar = base64::engine::general_purpose::STANDARD
            .decode(&cmd[4])
            .unwrap();
        tar::Archive::new(&tar[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn dockerfile_task_becomes_a_built_main_with_a_non_root_agent_and_the_tests_in_the_verifier() {
        let dir = fixture("hello-dockerfile");
        let i = import(&dir, &dir).unwrap();
        assert_eq!(i.project, "hello-dockerfile");
        let spec = denv_compose::parse(&i.compose).unwrap();
        assert_eq!(spec.egress, denv_compose::Egress::Deny, "no-network");
        assert_eq!(spec.disk_mb, 10240, "storage_mb");
        assert_eq!(spec.agent.as_ref().unwrap().service, "main");
        let main = spec.service("main").unwrap();
        assert_eq!(main.user, "1000:1000");
        assert_eq!((main.resources.cpus, main.resources.memory_mb), (1.0, 2048));
        assert_eq!(spec.builds["main"].context, "./environment");
        assert_eq!(spec.builds[SETUP].context, "./environment", "same image");
        assert_eq!(
            main.depends_on_condition.get(SETUP).map(String::as_str),
            Some("service_completed_successfully")
        );
        assert_eq!(main.volumes[0].path, "/app");
        let setup = spec.service(SETUP).unwrap();
        assert_eq!(setup.user, "0:0");
        assert_eq!(setup.command[2], "chown -R 1000:1000 /app");
        let v = spec.verifier.as_ref().unwrap();
        assert_eq!(v.service.as_deref(), Some("main"));
        assert_eq!(v.timeout_sec, 120);
        assert!(v.collect.is_empty());
        assert_eq!(untar_names(&v.command), ["test.sh"]);
        assert!(i.compose.contains("/tests/test.sh"));
        assert!(!i.compose.contains("solve.sh"), "solution/ stays out");
        assert!(i.notes[0].contains("runs as 1000:1000"), "{:?}", i.notes);
    }

    #[test]
    fn compose_task_is_merged_over_main_with_harbor_variables_and_contexts_under_environment() {
        let dir = fixture("hello-compose-build");
        let out = Path::new("/elsewhere/out");
        let i = import(&dir, out).unwrap();
        let spec = denv_compose::parse(&i.compose).unwrap();
        let main = spec.service("main").unwrap();
        assert_eq!(
            main.image, "hb__hello-compose-build",
            "${{MAIN_IMAGE_NAME}}"
        );
        assert_eq!(main.env["MAIN_IMAGE"], "hb__hello-compose-build");
        assert_eq!(
            main.env["GREETING_PATH"], "/greeting.txt",
            "[environment] env"
        );
        assert_eq!(
            main.env["API_URL"], "http://api:8000",
            "the task's own list form"
        );
        let env_dir = super::super::normalize(&dir.join("environment"));
        assert_eq!(
            spec.builds["main"].context,
            env_dir.display().to_string(),
            "outside --out: absolute"
        );
        assert_eq!(
            spec.builds["api"].context,
            env_dir.join("api").display().to_string(),
            "relative to environment/"
        );
        assert_eq!(spec.builds["api"].args["GREETING"], "Hello, world!");
        assert_eq!(
            main.depends_on_condition.get("api").map(String::as_str),
            Some("service_healthy"),
            "the task's own dependency is kept"
        );
        assert_eq!(spec.egress, denv_compose::Egress::Deny);
        let script = &spec.verifier.unwrap().command[2];
        assert!(
            script.starts_with("export API_URL=http://api:8000; export GREETING_PATH=/greeting.txt; export MAIN_IMAGE=hb__hello-compose-build; set -e;"),
            "main's environment reaches the grader: {script}"
        );
    }

    #[test]
    fn image_task_with_a_workdir_and_public_network() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        copy(&fixture("hello-image"), &t);
        let toml = std::fs::read_to_string(t.join("task.toml"))
            .unwrap()
            .replace("workdir = \"/app\"", "workdir = \"/srv/work\"")
            .replace("network_mode = \"no-network\"", "network_mode = \"public\"");
        std::fs::write(t.join("task.toml"), toml).unwrap();
        let spec = denv_compose::parse(&import(&t, &t).unwrap().compose).unwrap();
        let main = spec.service("main").unwrap();
        assert_eq!(main.image, "python:3.12-slim");
        assert_eq!(spec.egress, denv_compose::Egress::Allow);
        let paths: Vec<&str> = main.volumes.iter().map(|v| v.path.as_str()).collect();
        assert_eq!(paths, ["/app", "/srv/work"]);
        assert_eq!(
            spec.service(SETUP).unwrap().command[2],
            "chown -R 1000:1000 /app /srv/work"
        );
    }

    #[test]
    fn bad_tasks_are_refused_naming_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(
            e.contains("t/task.toml: a Harbor task directory has a task.toml"),
            "{e}"
        );
        copy(&fixture("hello-dockerfile"), &t);
        std::fs::remove_file(t.join("environment/Dockerfile")).unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("has no environment definition"), "{e}");
        std::fs::write(
            t.join("environment/docker-compose.yaml"),
            "services:\n  main:\n    image: ${NOPE}\n",
        )
        .unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(
            e.contains("uses ${NOPE}, which is not a Harbor variable"),
            "{e}"
        );
        std::fs::remove_file(t.join("tests/test.sh")).unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("tests/test.sh is missing"), "{e}");
        std::fs::write(t.join("tests/test.sh"), "exit 0\n").unwrap();
        std::fs::write(
            t.join("environment/docker-compose.yaml"),
            "services:\n  main:\n    image: busybox:1.36\n",
        )
        .unwrap();
        std::fs::write(
            t.join("task.toml"),
            "[environment]\nnetwork_mode = \"lan\"\n",
        )
        .unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(
            e.contains("network_mode \"lan\" must be public, no-network or allowlist"),
            "{e}"
        );
        std::fs::write(t.join("task.toml"), "[environment\n").unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("task.toml: invalid TOML"), "{e}");
        std::fs::write(
            t.join("task.toml"),
            "[environment]\nallow_internet = true\n",
        )
        .unwrap();
        let spec = denv_compose::parse(&import(&t, &t).unwrap().compose).unwrap();
        assert_eq!(spec.egress, denv_compose::Egress::Allow, "allow_internet");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("/etc/passwd", t.join("tests/leak")).unwrap();
            let e = import(&t, &t).unwrap_err().to_string();
            assert!(e.contains("only regular files and directories"), "{e}");
        }
    }

    #[test]
    fn nothing_outside_the_task_directory_is_read_or_packed() {
        // A hostile task: build contexts that leave the task (`..`, absolute, or through
        // a symlink inside it), and a compose file, tests/ or environment/ that are
        // symlinks to the importer's files.
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("Dockerfile"), "FROM busybox\nCOPY . /stolen\n").unwrap();
        std::fs::write(secret.join("test.sh"), "exit 0\n").unwrap();
        std::fs::write(
            secret.join("docker-compose.yaml"),
            "services: {main: {image: x}}\n",
        )
        .unwrap();
        let t = d.path().join("t");
        let fresh = || {
            let _ = std::fs::remove_dir_all(&t);
            copy(&fixture("hello-dockerfile"), &t);
        };
        let compose =
            |text: &str| std::fs::write(t.join("environment/docker-compose.yaml"), text).unwrap();
        for ctx in ["../../secret", secret.to_str().unwrap(), "./link", "link/."] {
            fresh();
            std::os::unix::fs::symlink(&secret, t.join("environment/link")).unwrap();
            compose(&format!(
                "services:\n  main:\n    build: {{context: {ctx:?}}}\n"
            ));
            let e = import(&t, &t).unwrap_err().to_string();
            assert!(e.contains("outside the task directory"), "{ctx}: {e}");
        }
        // A context that stays inside (also through a symlink inside) is fine.
        fresh();
        std::os::unix::fs::symlink("..", t.join("environment/up")).unwrap();
        compose("services:\n  main:\n    build: {context: ./up/environment}\n");
        import(&t, &t).unwrap();
        // The compose file, tests/ and environment/ must not lead outside either.
        fresh();
        std::os::unix::fs::symlink(
            secret.join("docker-compose.yaml"),
            t.join("environment/docker-compose.yaml"),
        )
        .unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("outside the task directory"), "{e}");
        fresh();
        std::fs::remove_dir_all(t.join("tests")).unwrap();
        std::os::unix::fs::symlink(&secret, t.join("tests")).unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("outside the task directory"), "{e}");
        fresh();
        std::fs::remove_dir_all(t.join("environment")).unwrap();
        std::os::unix::fs::symlink(&secret, t.join("environment")).unwrap();
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("outside the task directory"), "{e}");
        // A FIFO as task.toml is refused, not waited on.
        fresh();
        std::fs::remove_file(t.join("task.toml")).unwrap();
        let st = std::process::Command::new("mkfifo")
            .arg(t.join("task.toml"))
            .status()
            .unwrap();
        assert!(st.success());
        let e = import(&t, &t).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn interpolation_follows_compose() {
        let vars: BTreeMap<String, String> = [("A", "x"), ("E", "")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let i = |s: &str| interpolate(s, &vars);
        assert_eq!(i("$A/${A}-$$A").unwrap(), "x/x-$A");
        assert_eq!(i("${B:-d}${B-e}${E:-f}${E-g}").unwrap(), "def");
        assert_eq!(i("cost $ 5").unwrap(), "cost $ 5");
        assert!(i("${A").unwrap_err().to_string().contains("unterminated"));
        assert!(i("${A:?no}")
            .unwrap_err()
            .to_string()
            .contains("only ${VAR}"));
    }

    fn spec(compose: &str) -> denv_compose::Spec {
        let mut s = denv_compose::parse(compose).unwrap();
        for (n, svc) in s.services.iter_mut().enumerate() {
            svc.image_id = format!("sha256:{n:064}");
        }
        s
    }

    fn task(name: &str, o: VerifierOverride) -> Task {
        Task {
            name: name.into(),
            instruction: format!("do {name}\n"),
            verifier: o,
            solution: None,
        }
    }

    fn file<'a>(files: &'a [OutFile], suffix: &str) -> &'a str {
        let f = files
            .iter()
            .find(|f| f.path.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix}"));
        std::str::from_utf8(&f.bytes).unwrap()
    }

    const ONE: &str = "x-denv:\n  egress: deny\n  agent: {service: box}\n  verifier: {service: box, command: [\"/grade.sh\", \"it's\"], collect: [/home/a/out], timeout_sec: 30}\nservices:\n  box: {image: busybox:1.36, user: \"1000:1000\", mem_limit: 1g, cpus: 0.5}\n";

    #[test]
    fn single_service_versions_pin_the_image_id() {
        let s = spec(ONE);
        let tasks = [
            task("a", VerifierOverride::default()),
            task(
                "b",
                VerifierOverride {
                    command: Some(vec!["judge".into(), "b".into()]),
                    ..Default::default()
                },
            ),
        ];
        let src = ExportSource {
            project: "ops",
            version: "ver_1",
            spec: &s,
            tasks: &tasks,
        };
        let f = export(&src, Path::new("/out")).unwrap();
        let toml = file(&f, "a/task.toml");
        let doc: toml_edit::DocumentMut = toml.parse().unwrap();
        assert_eq!(
            doc["environment"]["docker_image"].as_str(),
            Some(&*format!("sha256:{:064}", 0))
        );
        assert_eq!(
            doc["environment"]["network_mode"].as_str(),
            Some("no-network")
        );
        assert_eq!(doc["environment"]["memory_mb"].as_integer(), Some(1024));
        assert_eq!(doc["environment"]["cpus"].as_float(), Some(0.5));
        assert_eq!(doc["verifier"]["timeout_sec"].as_float(), Some(30.0));
        assert_eq!(doc["task"]["name"].as_str(), Some("ops/a"));
        assert!(toml.contains("from ops@ver_1"));
        assert!(toml.contains("Not carried: the data of the version's volumes"));
        assert_eq!(file(&f, "a/instruction.md"), "do a\n");
        let t = file(&f, "a/tests/test.sh");
        assert!(t.contains("\n/grade.sh 'it'\\''s' > \"$out\"\n"), "{t}");
        assert!(t.contains("for p in /home/a/out; do"), "{t}");
        assert!(f
            .iter()
            .any(|f| f.path.ends_with("a/tests/test.sh") && f.executable));
        assert!(
            file(&f, "b/tests/test.sh").contains("\njudge b > \"$out\"\n"),
            "the task's own command"
        );
    }

    #[test]
    fn multi_service_versions_are_compose_tasks_with_the_single_container_note() {
        let s = spec("x-denv:\n  agent: {service: box}\n  verifier: {service: box, command: [/g]}\nservices:\n  box: {image: busybox:1.36, user: \"1000\", depends_on: {db: {condition: service_healthy}}, volumes: [\"w:/w\"]}\n  db: {image: redis:7-alpine, mem_limit: 512m, healthcheck: {test: [CMD, redis-cli, ping], interval: 2s}}\nvolumes: {w: {}}\n");
        let tasks = [task("t", VerifierOverride::default())];
        let src = ExportSource {
            project: "p",
            version: "v",
            spec: &s,
            tasks: &tasks,
        };
        let f = export(&src, Path::new("/o")).unwrap();
        let toml = file(&f, "t/task.toml");
        assert!(!toml.contains("docker_image"), "{toml}");
        assert!(toml.contains("memory_mb = 4608 and cpus = 4"), "{toml}");
        let c: Value = serde_yaml::from_str(file(&f, "t/environment/docker-compose.yaml")).unwrap();
        let main = &c["services"]["main"];
        assert_eq!(main["image"].as_str(), Some(&*format!("sha256:{:064}", 0)));
        assert_eq!(
            main["depends_on"]["db"]["condition"].as_str(),
            Some("service_healthy")
        );
        assert_eq!(
            main["networks"]["default"]["aliases"][0].as_str(),
            Some("box")
        );
        assert_eq!(main["volumes"][0].as_str(), Some("w:/w"));
        assert_eq!(
            c["services"]["db"]["healthcheck"]["interval"].as_str(),
            Some("2000ms")
        );
        assert!(c["services"].get("box").is_none());
    }

    #[test]
    fn verifiers_that_cannot_run_in_the_agents_container_are_refused() {
        let s = spec("x-denv:\n  agent: {service: box}\n  verifier: {image: grader:1, command: [/g]}\nservices:\n  box: {image: busybox:1.36, user: \"1000\"}\n  db: {image: redis:7-alpine}\n");
        let tasks = [task("t", VerifierOverride::default())];
        let src = ExportSource {
            project: "p",
            version: "v",
            spec: &s,
            tasks: &tasks,
        };
        let e = export(&src, Path::new("/o")).unwrap_err().to_string();
        assert!(
            e.contains("the verifier runs in its own image (grader:1)"),
            "{e}"
        );
        let tasks = [task(
            "t",
            VerifierOverride {
                service: Some("db".into()),
                ..Default::default()
            },
        )];
        let src = ExportSource {
            tasks: &tasks,
            ..src
        };
        let e = export(&src, Path::new("/o")).unwrap_err().to_string();
        assert!(
            e.contains("runs in service db, not in the agent's service box"),
            "{e}"
        );
        let src = ExportSource { tasks: &[], ..src };
        let e = export(&src, Path::new("/o")).unwrap_err().to_string();
        assert!(e.contains("no tasks to export"), "{e}");
        let mut s = spec(ONE);
        s.services[0].image_id.clear();
        let tasks = [task("t", VerifierOverride::default())];
        let src = ExportSource {
            project: "p",
            version: "v",
            spec: &s,
            tasks: &tasks,
        };
        let e = export(&src, Path::new("/o")).unwrap_err().to_string();
        assert!(
            e.contains("service box of the version has no pinned image id"),
            "{e}"
        );
    }

    #[test]
    fn an_imported_task_exports_as_one_container_without_its_setup_service() {
        let dir = fixture("hello-dockerfile");
        let s = spec(&import(&dir, &dir).unwrap().compose);
        let tasks = crate::port::tasks::discover(&dir, "hello").unwrap();
        let src = ExportSource {
            project: "hello",
            version: "v",
            spec: &s,
            tasks: &tasks,
        };
        let f = export(&src, Path::new("/o")).unwrap();
        let toml = file(&f, "hello/task.toml");
        assert!(toml.contains("docker_image = \"sha256:"), "{toml}");
        assert!(
            toml.contains("One-shot service harbor-setup is not run"),
            "{toml}"
        );
        assert_eq!(
            file(&f, "hello/solution/solve.sh"),
            std::fs::read_to_string(dir.join("solution/solve.sh")).unwrap()
        );
        assert!(f
            .iter()
            .any(|f| f.path.ends_with("solution/solve.sh") && f.executable));
    }
}
