//! Carrying out a parsed command against the control plane.

use crate::cli::*;
use crate::output::{self, PhasePrinter};
use anyhow::{anyhow, bail, Context, Result};
use denv_client::{v1, Client, Config};
use serde_json::Value;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// Largest archive `files put` uploads (the server's limit).
pub use denv_proto::contract::FILES_ARCHIVE_MAX_BYTES as MAX_ARCHIVE_BYTES;

/// How a command ended when it did not error: exit 0, or exit 1 after a deployment that
/// failed or rolled back.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 1 (the reason was already printed).
    Failed,
    /// Exit with this code: `denv exec --stream` passes the command's own.
    Exit(u8),
}

/// The exit code of `denv exec --stream`/`-i` when denv itself failed (the request was
/// refused, the environment or host is unreachable, the stream broke), as `docker exec`
/// uses it; the command's own codes pass through unchanged.
pub const EXEC_DENV_FAILED: u8 = 125;

fn println(s: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", s.as_ref());
    let _ = out.flush();
}

fn print_json<T: serde::Serialize>(msg: &T) {
    println(output::pretty(msg));
}

/// Runs one command. `cfg` is the resolved configuration; commands other than `login`
/// need its key.
pub async fn run(cmd: Command, cfg: Config) -> Result<Outcome> {
    if let Command::Login(a) = cmd {
        return login(a, cfg).await;
    }
    if let Command::Import(i) = &cmd {
        if i.common().no_deploy {
            return import(None, i).await;
        }
    }
    cfg.require_key()?;
    let c = Client::from_config(&cfg)?;
    match cmd {
        Command::Login(_) => unreachable!("handled above"),
        Command::Whoami => print_json(&c.me(v1::MeRequest {}).await?),
        Command::Templates { kind } => print_json(
            &c.list_templates(v1::ListTemplatesRequest {
                kind: kind.unwrap_or_default(),
            })
            .await?,
        ),
        Command::Init { name, out } => init(&c, &name, &out).await?,
        Command::Project(p) => match p {
            ProjectCmd::Create { kind, source, name } => print_json(
                &c.create_project(v1::CreateProjectRequest {
                    name,
                    kind,
                    source: source.unwrap_or_default(),
                })
                .await?,
            ),
            ProjectCmd::List => print_json(&c.list_projects(v1::ListProjectsRequest {}).await?),
            ProjectCmd::Envs { project } => {
                print_json(&c.list_envs(v1::ListEnvsRequest { project }).await?)
            }
            ProjectCmd::Delete { force, project } => print_json(
                &c.delete_project(v1::DeleteProjectRequest { project, force })
                    .await?,
            ),
        },
        Command::Cloud(cc) => match cc {
            CloudCmd::Connect {
                provider,
                name,
                token,
                server_type,
                location,
            } => {
                let mut config = serde_json::Map::new();
                for (k, v) in [
                    ("token", token),
                    ("server_type", server_type),
                    ("location", location),
                ] {
                    if let Some(v) = v {
                        config.insert(k.to_string(), Value::String(v));
                    }
                }
                print_json(
                    &c.create_cloud(v1::CreateCloudRequest {
                        provider,
                        name: name.unwrap_or_default(),
                        config: Some(denv_proto::json::to_struct(&Value::Object(config))),
                    })
                    .await?,
                )
            }
            CloudCmd::List => print_json(&c.list_clouds(v1::ListCloudsRequest {}).await?),
        },
        Command::Host(h) => match h {
            HostCmd::List => print_json(&c.list_hosts(v1::ListHostsRequest {}).await?),
            HostCmd::JoinToken => print_json(
                &c.create_join_token(v1::CreateJoinTokenRequest::default())
                    .await?,
            ),
        },
        Command::Deploy(a) => {
            let compose = std::fs::read_to_string(&a.file)
                .with_context(|| format!("reading {}", a.file.display()))?;
            let warm = a
                .warm
                .as_deref()
                .map(|w| w.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default();
            let dir = a
                .file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let contexts = crate::context::contexts_for(&compose, dir)?;
            let r = c
                .deploy(v1::DeployRequest {
                    project: a.project,
                    env: a.env,
                    compose,
                    warm,
                    ttl_sec: a.ttl.unwrap_or(0),
                    contexts,
                })
                .await?;
            return follow(&c, r, a.wait.wait).await;
        }
        Command::Env(e) => match e {
            EnvCmd::List(a) => {
                let r = c
                    .list_all_envs(v1::ListAllEnvsRequest {
                        project: a.project.unwrap_or_default(),
                        status: a.status.unwrap_or_default(),
                        all: a.all,
                    })
                    .await?;
                if a.json {
                    print_json(&r);
                } else if a.quiet {
                    for e in &r.environments {
                        println(&e.id);
                    }
                } else {
                    let table = output::env_table(&r.environments);
                    let _ = std::io::stdout().lock().write_all(table.as_bytes());
                }
            }
            EnvCmd::Get(s) => {
                let env = resolve_env(&c, &s).await?;
                print_json(&c.get_env(v1::EnvRequest { env }).await?)
            }
            EnvCmd::Versions(s) => {
                let env = resolve_env(&c, &s).await?;
                print_json(&c.list_versions(v1::EnvRequest { env }).await?)
            }
            EnvCmd::Deployments(s) => {
                let env = resolve_env(&c, &s).await?;
                print_json(&c.list_deployments(v1::EnvRequest { env }).await?)
            }
            EnvCmd::Destroy(s) => {
                let env = resolve_env(&c, &s).await?;
                print_json(&c.destroy(v1::EnvRequest { env }).await?)
            }
        },
        Command::Fork(a) => {
            let env = resolve_env(&c, &a.env).await?;
            let resources = a.resources();
            let r = c
                .fork(v1::ForkRequest {
                    env,
                    name: a.name.unwrap_or_default(),
                    version: a.version.unwrap_or_default(),
                    ttl_sec: a.ttl.unwrap_or(0),
                    pool: a.pool,
                    resources,
                })
                .await?;
            return follow(&c, r, a.wait.wait).await;
        }
        Command::Snapshot(a) => {
            let env = resolve_env(&c, &a.env).await?;
            let r = c.snapshot(v1::EnvRequest { env }).await?;
            return follow(&c, r, a.wait.wait).await;
        }
        Command::Verify(a) => {
            let env = resolve_env(&c, &a.env).await?;
            let r = c
                .verify(v1::VerifyRequest {
                    env,
                    resume: a.resume,
                })
                .await?;
            return follow(&c, r, a.wait.wait).await;
        }
        Command::Rollback(a) => {
            let env = resolve_env(&c, &a.env).await?;
            let r = c
                .rollback(v1::RollbackRequest {
                    env,
                    version: a.version,
                })
                .await?;
            return follow(&c, r, a.wait.wait).await;
        }
        Command::Promote(a) => {
            let r = c
                .promote(v1::PromoteRequest {
                    project: a.project,
                    from: a.from,
                    to: a.to,
                    version: a.version.unwrap_or_default(),
                })
                .await?;
            return follow(&c, r, a.wait.wait).await;
        }
        Command::Sheet(a) => {
            let req = if a.target.starts_with("ver_") {
                v1::SheetRequest {
                    version: a.target,
                    ..Default::default()
                }
            } else {
                let sel = EnvSel {
                    env: a.target,
                    project: a.project,
                };
                v1::SheetRequest {
                    env: resolve_env(&c, &sel).await?,
                    ..Default::default()
                }
            };
            let r = c.get_sheet(req).await?;
            let sheet = denv_proto::json::from_struct(&r.sheet.unwrap_or_default());
            if a.json {
                print_json(&sheet);
            } else {
                let text = output::sheet(&sheet);
                let _ = std::io::stdout().lock().write_all(text.as_bytes());
            }
        }
        Command::Exec(a) if a.stream || a.interactive => {
            return match exec_unix(&c, a).await {
                Ok(code) => Ok(Outcome::Exit(code)),
                Err(e) => {
                    eprintln!("denv: {e:#}");
                    Ok(Outcome::Exit(EXEC_DENV_FAILED))
                }
            };
        }
        Command::Logs(a) => logs(&c, a).await?,
        Command::Exec(a) => {
            let env = resolve_env(&c, &a.env).await?;
            let req = exec_request(env, a)?;
            print_json(&c.exec(req).await?)
        }
        Command::Files(f) => match f {
            FilesCmd::Put {
                service,
                env,
                local,
                remote_dir,
            } => {
                let env = resolve_env(&c, &env).await?;
                let tar = tar_path(&local)?;
                print_json(
                    &c.put_files(v1::PutFilesRequest {
                        env,
                        service,
                        path: remote_dir,
                        tar,
                    })
                    .await?,
                )
            }
            FilesCmd::Get {
                service,
                env,
                remote,
                local_dir,
            } => {
                let env = resolve_env(&c, &env).await?;
                let r = c
                    .get_files(v1::GetFilesRequest {
                        env,
                        service,
                        path: remote,
                    })
                    .await?;
                let n = extract(&r.tar, &local_dir)?;
                println(format!("{n} files written under {}", local_dir.display()));
            }
        },
        Command::Deployment(d) => match d {
            DeploymentCmd::Get { id } => {
                print_json(&c.get_deployment(v1::GetDeploymentRequest { id }).await?)
            }
            DeploymentCmd::Watch { id } => {
                let r = c.get_deployment(v1::GetDeploymentRequest { id }).await?;
                return follow(&c, r, true).await;
            }
        },
        Command::Import(i) => return import(Some(&c), &i).await,
        Command::Export(a) => export(&c, &a).await?,
        Command::Events { subject } => {
            print_json(&c.list_events(v1::ListEventsRequest { subject }).await?)
        }
    }
    Ok(Outcome::Ok)
}

/// `denv import harbor|karotte`: writes the compose file (and tasks), then, with a
/// client, creates the project (an existing one of that name is deployed to) and deploys
/// `alpha` with the build contexts, as `denv project create` + `denv deploy` do.
async fn import(c: Option<&Client>, cmd: &ImportCmd) -> Result<Outcome> {
    use crate::port;
    let common = cmd.common();
    let (dir, files, project, notes) = match cmd {
        ImportCmd::Harbor { dir, .. } => {
            let dir = port::absolute(dir)?;
            let out = port::absolute(common.out.as_deref().unwrap_or(&dir))?;
            let i = port::harbor::import(&dir, &out)?;
            let f = vec![port::OutFile::new(
                out.join("docker-compose.yaml"),
                i.compose,
            )];
            (out, f, i.project, i.notes)
        }
        ImportCmd::Karotte {
            dir, image, user, ..
        } => {
            let dir = port::absolute(dir)?;
            let out = port::absolute(common.out.as_deref().unwrap_or(&dir))?;
            let steps = port::karotte::check_steps(port::karotte::read_steps(&dir)?)?;
            let i = port::karotte::import(&dir, &out, &steps, image.as_deref(), user)?;
            (out, i.files, i.project, i.notes)
        }
    };
    let project = common.project.clone().unwrap_or(project);
    port::write_all(&files, &dir, common.force)?;
    for f in &files {
        println(format!("wrote {}", f.path.display()));
    }
    for n in &notes {
        println(format!("note: {n}"));
    }
    let Some(c) = c else {
        println(format!(
            "deploy it with: denv project create {project} && denv deploy --project {project} -f {}",
            dir.join("docker-compose.yaml").display()
        ));
        return Ok(Outcome::Ok);
    };
    match c
        .create_project(v1::CreateProjectRequest {
            name: project.clone(),
            kind: "rl-environment".into(),
            source: String::new(),
        })
        .await
    {
        Ok(_) => println(format!("created project {project} (rl-environment)")),
        Err(e) if e.code == denv_client::Code::AlreadyExists => {
            println(format!("project {project} exists; deploying to its alpha"))
        }
        Err(e) => return Err(e.into()),
    }
    let compose = String::from_utf8(files[0].bytes.clone()).context("the compose file")?;
    let contexts = crate::context::contexts_for(&compose, &dir)?;
    let r = c
        .deploy(v1::DeployRequest {
            project,
            env: "alpha".into(),
            compose,
            warm: Vec::new(),
            ttl_sec: 0,
            contexts,
        })
        .await?;
    follow(c, r, common.wait.wait).await
}

/// `denv export --harbor|--openenv <project>@<version> <dir>`: finds the version among
/// the project's environments, reads the tasks of `--source`, writes the files.
async fn export(c: &Client, a: &ExportArgs) -> Result<()> {
    use crate::port;
    let (project, version) = a
        .version
        .split_once('@')
        .filter(|(p, v)| !p.is_empty() && !v.is_empty())
        .ok_or_else(|| {
            anyhow!(
                "{:?} must be <project>@<version> (a version id ver_…)",
                a.version
            )
        })?;
    let envs = c
        .list_envs(v1::ListEnvsRequest {
            project: project.to_string(),
        })
        .await?
        .environments;
    let mut found = None;
    for e in &envs {
        let vs = c
            .list_versions(v1::EnvRequest { env: e.id.clone() })
            .await?;
        if let Some(v) = vs.versions.into_iter().find(|v| v.id == version) {
            found = Some(v);
            break;
        }
    }
    let v = found.ok_or_else(|| {
        anyhow!("version {version} is not a version of an environment of project {project}")
    })?;
    let spec: denv_compose::Spec = serde_json::from_value(denv_proto::json::from_struct(
        &v.spec.clone().unwrap_or_default(),
    ))
    .context("reading the version's spec")?;
    let source = port::absolute(&a.source)?;
    let out = port::absolute(&a.dir)?;
    let tasks = port::tasks::discover(&source, &port::slug(project)?)?;
    let files = if a.harbor {
        port::harbor::export(
            &port::harbor::ExportSource {
                project,
                version,
                spec: &spec,
                tasks: &tasks,
            },
            &out,
        )?
    } else {
        port::openenv::export(project, version, &spec, &tasks, &out)?
    };
    port::write_all(&files, &out, a.force)?;
    for f in &files {
        println(format!("wrote {}", f.path.display()));
    }
    Ok(())
}

/// An environment id from an id, or from a name looked up in `--project`.
async fn resolve_env(c: &Client, sel: &EnvSel) -> Result<String> {
    let Some(project) = &sel.project else {
        return Ok(sel.env.clone());
    };
    if sel.env.starts_with("env_") {
        return Ok(sel.env.clone());
    }
    let envs = c
        .list_envs(v1::ListEnvsRequest {
            project: project.clone(),
        })
        .await?
        .environments;
    // Prefer a live environment when a destroyed one had the same name.
    let mut named: Vec<&v1::Environment> = envs.iter().filter(|e| e.name == sel.env).collect();
    named.sort_by_key(|e| e.status == "destroyed");
    named
        .first()
        .map(|e| e.id.clone())
        .ok_or_else(|| anyhow!("no environment named {} in project {project}", sel.env))
}

/// Prints a started deployment and, with `wait`, follows it to the end.
async fn follow(c: &Client, started: v1::DeploymentResponse, wait: bool) -> Result<Outcome> {
    if !wait {
        print_json(&started);
        return Ok(Outcome::Ok);
    }
    let d = started
        .deployment
        .clone()
        .ok_or_else(|| anyhow!("the server answered without a deployment"))?;
    println(output::deployment_header(&d));
    let mut printer = PhasePrinter::new();
    for l in printer.update(&started) {
        println(l);
    }
    let last = if denv_client::is_final(&d.status) {
        started
    } else {
        c.wait_deployment(&d.id, |s| {
            for l in printer.update(s) {
                println(l);
            }
        })
        .await?
    };
    let d = last.deployment.unwrap_or(d);
    println(output::deployment_footer(&d));
    if output::is_failure(&d.status) {
        if !d.error.is_empty() {
            eprintln!("denv: {}", d.error);
        }
        return Ok(Outcome::Failed);
    }
    Ok(Outcome::Ok)
}

/// `denv init`: writes the compose file of the first template whose name or kind matches.
async fn init(c: &Client, name: &str, out: &Path) -> Result<()> {
    let t = c
        .list_templates(v1::ListTemplatesRequest::default())
        .await?;
    let tpl = t
        .templates
        .iter()
        .find(|t| t.name == name)
        .or_else(|| t.templates.iter().find(|t| t.kind == name))
        .ok_or_else(|| {
            let names: Vec<&str> = t.templates.iter().map(|t| t.name.as_str()).collect();
            anyhow!(
                "no template named or of kind {name} (templates: {}; kinds: {})",
                names.join(", "),
                t.kinds.join(", ")
            )
        })?;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("{} exists; pass --out to write elsewhere", out.display())
        }
        Err(e) => return Err(e).with_context(|| format!("writing {}", out.display())),
    };
    f.write_all(tpl.compose.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println(format!(
        "wrote {} from template {} ({})",
        out.display(),
        tpl.name,
        tpl.kind
    ));
    if !tpl.requires.is_empty() {
        println(format!("requires: {}", tpl.requires.join(", ")));
    }
    if !tpl.warm.is_empty() {
        println(deploy_hint(&out.display().to_string(), &tpl.warm));
    }
    Ok(())
}

/// The `denv deploy … --warm` line `init` prints for a template with a warm command.
/// `--warm` splits on whitespace, so a warm argv whose words contain spaces cannot be
/// passed that way: the line then points at the compose file's own `x-denv.warm`, which
/// the deploy runs anyway.
pub fn deploy_hint(file: &str, warm: &[String]) -> String {
    if warm
        .iter()
        .all(|w| !w.is_empty() && !w.contains(char::is_whitespace))
    {
        format!(
            "deploy it with: denv deploy --project <project> -f {file} --warm \"{}\"",
            warm.join(" ")
        )
    } else {
        format!(
            "deploy it with: denv deploy --project <project> -f {file}\n\
             (its warm command, x-denv.warm, runs after health: {})",
            serde_json::to_string(warm).unwrap_or_default()
        )
    }
}

/// A tar of a local file or directory, named by its base name; symlinks are archived as
/// symlinks. Errors when the archive exceeds 32 MiB.
pub fn tar_path(local: &Path) -> Result<Vec<u8>> {
    let meta =
        std::fs::symlink_metadata(local).with_context(|| format!("reading {}", local.display()))?;
    let canon = if local.file_name().is_none() {
        local
            .canonicalize()
            .with_context(|| format!("reading {}", local.display()))?
    } else {
        local.to_path_buf()
    };
    let base = canon
        .file_name()
        .ok_or_else(|| anyhow!("{} has no base name", local.display()))?
        .to_owned();
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let res = if meta.is_dir() {
        b.append_dir_all(&base, local)
    } else {
        b.append_path_with_name(local, &base)
    };
    res.with_context(|| format!("archiving {}", local.display()))?;
    let bytes = b
        .into_inner()
        .with_context(|| format!("archiving {}", local.display()))?;
    if bytes.len() > MAX_ARCHIVE_BYTES {
        bail!(
            "archive of {} is {} bytes; the limit is 32 MiB",
            local.display(),
            bytes.len()
        );
    }
    Ok(bytes)
}

/// Extracts the regular files and directories of a tar under `dir` (created if
/// missing); anything else, and any path that is absolute or climbs with `..`, is
/// skipped. Returns the number of regular files written.
pub fn extract(tar_bytes: &[u8], dir: &Path) -> Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut a = tar::Archive::new(tar_bytes);
    let mut n = 0;
    for e in a.entries().context("reading the archive")? {
        let mut e = e.context("reading the archive")?;
        let path = e.path().context("reading the archive")?.into_owned();
        let Some(rel) = safe_relative(&path) else {
            continue;
        };
        let dest = dir.join(&rel);
        match e.header().entry_type() {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&dest)
                    .with_context(|| format!("creating {}", dest.display()))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if rel.as_os_str().is_empty() {
                    continue;
                }
                if let Some(p) = dest.parent() {
                    std::fs::create_dir_all(p)
                        .with_context(|| format!("creating {}", p.display()))?;
                }
                // A symlink left at the destination by an earlier run is replaced, not
                // followed.
                if std::fs::symlink_metadata(&dest).is_ok_and(|m| m.file_type().is_symlink()) {
                    std::fs::remove_file(&dest)
                        .with_context(|| format!("replacing {}", dest.display()))?;
                }
                e.unpack(&dest)
                    .with_context(|| format!("writing {}", dest.display()))?;
                n += 1;
            }
            _ => {}
        }
    }
    Ok(n)
}

/// `path` without `.` components, if it only has normal components.
fn safe_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// `denv login`: the device flow.
async fn login(a: LoginArgs, cfg: Config) -> Result<Outcome> {
    // --server, else DENV_SERVER, else the saved server, else the default: the resolved
    // config already holds the last three in that order when no key is in the
    // environment; with DENV_API_KEY set the saved file was not read, so read it here.
    // The CA file: --ca-file or DENV_CA_FILE (in `cfg`), else the one saved with the
    // saved server when that is the server.
    let (server, saved_ca) = match a.server.filter(|s| !s.is_empty()) {
        Some(s) => (s, None),
        None => match std::env::var("DENV_SERVER").ok().filter(|s| !s.is_empty()) {
            Some(s) => (s, None),
            None => match cfg
                .path
                .as_deref()
                .and_then(|p| Config::load_file(p).ok().flatten())
                .filter(|f| !f.server.is_empty())
            {
                Some(f) => (
                    f.server,
                    Some(f.ca_file)
                        .filter(|c| !c.is_empty())
                        .map(std::path::PathBuf::from),
                ),
                None => (cfg.server.clone(), None),
            },
        },
    };
    let ca_file = cfg.ca_file.clone().or(saved_ca);
    let server = server.trim_end_matches('/').to_string();
    let c = Client::connect_with(&server, None, None, ca_file.as_deref())?;
    let code = c.device_code(v1::DeviceCodeRequest {}).await?;
    let url = absolute(&server, &code.verification_uri_complete);
    let base = absolute(&server, &code.verification_uri);
    println(format!(
        "Open {url}\nor go to {base} and enter the code {}",
        code.user_code
    ));
    if !a.no_browser {
        let _ = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }
    println("Waiting for approval…");
    let mut interval = Duration::from_secs(u64::try_from(code.interval.max(1)).unwrap_or(5));
    let expires = Duration::from_secs(u64::try_from(code.expires_in.max(1)).unwrap_or(900));
    let deadline = Instant::now() + expires;
    loop {
        tokio::time::sleep(interval).await;
        if Instant::now() > deadline {
            bail!("the code expired before it was approved; run `denv login` again");
        }
        match c
            .device_token(v1::DeviceTokenRequest {
                device_code: code.device_code.clone(),
            })
            .await
        {
            Ok(t) => {
                let team = t.team.unwrap_or_default();
                let saved = Config {
                    server: server.clone(),
                    api_key: Some(t.api_key),
                    team: (!team.id.is_empty()).then_some(team.id),
                    // Saved beside the server it was needed for.
                    ca_file: ca_file.clone(),
                    path: cfg.path.clone(),
                };
                let path = saved.save()?;
                println(format!(
                    "Signed in to team {}. Key saved to {}",
                    team.name,
                    path.display()
                ));
                return Ok(Outcome::Ok);
            }
            Err(e) if denv_client::is_authorization_pending(&e) => {
                if e.message.contains("slow_down") {
                    interval += Duration::from_secs(5);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A verification URI made absolute against the server when it is a path.
fn absolute(server: &str, uri: &str) -> String {
    if uri.starts_with("http://") || uri.starts_with("https://") {
        uri.to_string()
    } else if uri.starts_with('/') {
        format!("{server}{uri}")
    } else {
        format!("{server}/{uri}")
    }
}

/// `denv exec --stream`/`-i`: writes each piece of output to this process's stdout or
/// stderr as it arrives (flushed), and returns the command's exit code (its low 8
/// bits; 124 after a timeout). Any failure of denv itself is the `Err`.
async fn exec_unix(c: &Client, mut a: ExecArgs) -> Result<u8> {
    use futures::StreamExt;
    if a.interactive {
        if a.input.is_some() {
            bail!("-i passes this process's stdin; it cannot be combined with --input");
        }
        a.input = Some("-".into());
    }
    let env = resolve_env(c, &a.env).await?;
    let req = exec_request(env, a)?;
    let mut s = c.exec_stream(req).await?;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(item) = s.next().await {
        let chunk = item?;
        if !chunk.stdout.is_empty() {
            out.write_all(&chunk.stdout)
                .and_then(|_| out.flush())
                .context("writing stdout")?;
        }
        if !chunk.stderr.is_empty() {
            err.write_all(&chunk.stderr)
                .and_then(|_| err.flush())
                .context("writing stderr")?;
        }
        if let Some(r) = chunk.result {
            return Ok((r.exit_code & 0xff) as u8);
        }
    }
    bail!("the exec stream ended without a result")
}

/// `denv logs`: with `--service`, the service's stdout lines to stdout and its stderr
/// lines to stderr, as written; without, every line to stdout prefixed by its service
/// (as the control plane attributed it), padded to the longest name, with control
/// characters escaped ([`output::log_line`]) so a line cannot rewrite its prefix. A
/// service cut at the byte cap is reported on stderr.
async fn logs(c: &Client, a: LogsArgs) -> Result<()> {
    use futures::StreamExt;
    let env = resolve_env(c, &a.env).await?;
    let one = a.service.is_some();
    let mut width = 0;
    if !one {
        // The prefix width: the services' names, known from the first lines otherwise.
        if let Ok(r) = c.get_env(v1::EnvRequest { env: env.clone() }).await {
            let version = r
                .environment
                .map(|e| e.current_version_id)
                .unwrap_or_default();
            if let Ok(vs) = c.list_versions(v1::EnvRequest { env: env.clone() }).await {
                if let Some(v) = vs.versions.iter().find(|v| v.id == version) {
                    let spec = denv_proto::json::from_struct(&v.spec.clone().unwrap_or_default());
                    if let Some(svcs) = spec.get("services").and_then(|s| s.as_array()) {
                        width = svcs
                            .iter()
                            .filter_map(|s| s.get("name").and_then(|n| n.as_str()))
                            .map(str::len)
                            .max()
                            .unwrap_or(0);
                    }
                }
            }
        }
    }
    let req = v1::LogsRequest {
        env,
        service: a.service.unwrap_or_default(),
        tail: if a.tail == 0 {
            -1
        } else {
            i32::try_from(a.tail).unwrap_or(i32::MAX)
        },
        follow: a.follow,
        timestamps: a.timestamps,
    };
    let mut s = c.logs(req).await?;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(item) = s.next().await {
        let e = item?;
        if e.truncated {
            eprintln!(
                "denv: the logs of service {} stopped at the 8 MiB cap of one call; pass a smaller --tail",
                e.service
            );
            continue;
        }
        let text = output::log_line(&e, if one { None } else { Some(width) });
        let w: &mut dyn Write = if one && e.stream == "stderr" {
            &mut err
        } else {
            &mut out
        };
        if w.write_all(text.as_bytes())
            .and_then(|_| w.flush())
            .is_err()
        {
            // The reader went away (`| head`): stop quietly, as Unix tools do.
            return Ok(());
        }
    }
    Ok(())
}

/// The `ExecRequest` of `denv exec`: `--env` entries split at the first `=` (a missing
/// `=` is an error), `--input` read whole (`-` is stdin; over 32 MiB is an error).
pub fn exec_request(env: String, a: ExecArgs) -> Result<v1::ExecRequest> {
    let mut env_vars = std::collections::HashMap::new();
    for kv in &a.env_vars {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--env {kv:?} must be KEY=VALUE");
        };
        env_vars.insert(k.to_string(), v.to_string());
    }
    let stdin = match a.input.as_deref() {
        None => Vec::new(),
        Some("-") => {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut b)
                .context("reading stdin")?;
            b
        }
        Some(p) => std::fs::read(p).with_context(|| format!("reading {p}"))?,
    };
    if stdin.len() > denv_proto::contract::EXEC_STDIN_MAX_BYTES {
        bail!("--input is {} bytes; the limit is 32 MiB", stdin.len());
    }
    Ok(v1::ExecRequest {
        env,
        service: a.service,
        cmd: a.cmd,
        timeout_sec: a.timeout.unwrap_or(0),
        user: a.user.unwrap_or_default(),
        workdir: a.workdir.unwrap_or_default(),
        stdin,
        env_vars,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_of_a_directory_is_named_by_its_base_name_and_extracts_back() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("fixtures");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("a.txt"), "alpha").unwrap();
        std::fs::write(src.join("sub/b.txt"), "beta").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
        let t = tar_path(&src).unwrap();
        let mut names: Vec<String> = tar::Archive::new(&t[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        names.sort();
        assert!(names.contains(&"fixtures/a.txt".to_string()), "{names:?}");
        assert!(
            names.contains(&"fixtures/sub/b.txt".to_string()),
            "{names:?}"
        );
        let out = d.path().join("out");
        // Two regular files; the symlink is skipped.
        assert_eq!(extract(&t, &out).unwrap(), 2);
        assert_eq!(
            std::fs::read_to_string(out.join("fixtures/sub/b.txt")).unwrap(),
            "beta"
        );
        assert!(std::fs::symlink_metadata(out.join("fixtures/link")).is_err());
    }

    #[test]
    fn tar_of_a_file_and_of_dot() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("answer.txt");
        std::fs::write(&f, "42").unwrap();
        let t = tar_path(&f).unwrap();
        let e: Vec<String> = tar::Archive::new(&t[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(e, vec!["answer.txt"]);
        assert!(tar_path(&d.path().join("missing")).is_err());
    }

    #[test]
    fn extract_skips_escapes_and_special_files() {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, ty: tar::EntryType, body: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(ty);
            h.set_size(body.len() as u64);
            h.set_mode(0o644);
            // set_path refuses `..`, so write the name bytes directly.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, body).unwrap();
        };
        add("ok.txt", tar::EntryType::Regular, b"ok");
        add("../evil.txt", tar::EntryType::Regular, b"evil");
        add("/abs.txt", tar::EntryType::Regular, b"abs");
        add("fifo", tar::EntryType::Fifo, b"");
        add("dir/", tar::EntryType::Directory, b"");
        let t = b.into_inner().unwrap();
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("o");
        assert_eq!(extract(&t, &out).unwrap(), 1);
        assert_eq!(std::fs::read_to_string(out.join("ok.txt")).unwrap(), "ok");
        assert!(!d.path().join("evil.txt").exists());
        assert!(out.join("dir").is_dir());
        assert!(!out.join("fifo").exists());
    }

    #[test]
    fn oversize_archives_are_refused_locally() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("big.bin");
        // Real data: a sparse file would be archived sparse, and small.
        std::fs::write(&f, vec![7u8; MAX_ARCHIVE_BYTES + 1]).unwrap();
        let Err(e) = tar_path(&f) else {
            panic!("an archive over 32 MiB was accepted")
        };
        let e = e.to_string();
        assert!(e.contains("the limit is 32 MiB"), "{e}");
    }

    #[test]
    fn deploy_hint_uses_warm_only_when_it_splits_back() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            deploy_hint("compose.yaml", &w(&["make", "warm"])),
            "deploy it with: denv deploy --project <project> -f compose.yaml --warm \"make warm\""
        );
        assert_eq!(
            deploy_hint("c.yaml", &w(&["sh", "-c", "psql -c 'x'"])),
            "deploy it with: denv deploy --project <project> -f c.yaml\n\
             (its warm command, x-denv.warm, runs after health: [\"sh\",\"-c\",\"psql -c 'x'\"])"
        );
    }

    #[test]
    fn relative_verification_uris_get_the_server() {
        assert_eq!(
            absolute("http://127.0.0.1:8080", "/app/device/?code=AB"),
            "http://127.0.0.1:8080/app/device/?code=AB"
        );
        assert_eq!(
            absolute("http://x", "https://console/app/device/"),
            "https://console/app/device/"
        );
    }
}
