//! The built `denv` binary: exit codes, error messages, and output, against a small
//! tonic server on loopback that plays scripted deployments.

use denv_client::v1;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};
use v1::auth_service_server::{AuthService, AuthServiceServer};
use v1::deployment_service_server::{DeploymentService, DeploymentServiceServer};
use v1::environment_service_server::{EnvironmentService, EnvironmentServiceServer};
use v1::project_service_server::{ProjectService, ProjectServiceServer};

const NOT_SIGNED_IN: &str = "denv: not signed in: run `denv login` or set DENV_API_KEY\n";

/// Runs the binary with a clean environment: no DENV_* variables, an empty config home.
async fn denv(home: &Path, vars: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_denv"));
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("xdg"));
    for (k, v) in vars {
        c.env(k, v);
    }
    c.output().await.unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn no_credential_is_not_signed_in_exit_1() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["whoami"][..],
        &["project", "envs", "quickstart"],
        &["host", "join-token"],
        &["verify", "env_1"],
    ] {
        let o = denv(d.path(), &[("DENV_SERVER", "http://127.0.0.1:1")], args).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_eq!(err(&o), NOT_SIGNED_IN, "{args:?}");
        assert_eq!(out(&o), "");
    }
    // An empty DENV_API_KEY is no credential either.
    let o = denv(d.path(), &[("DENV_API_KEY", "")], &["whoami"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(err(&o), NOT_SIGNED_IN);
}

#[tokio::test]
async fn usage_errors_exit_2_and_help_exits_0() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["bogus"][..],
        &["deploy"],
        &["exec", "env_1", "id"],
        &["fork"],
        &["snapshot", "--wait=perhaps", "env_1"],
        &[],
    ] {
        let o = denv(d.path(), &[("DENV_API_KEY", "dak_x")], args).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
        assert!(!err(&o).is_empty());
    }
    let o = denv(d.path(), &[], &["--help"]).await;
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("--project"), "{}", out(&o));
    let o = denv(d.path(), &[], &["exec", "--help"]).await;
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("with --project, its name is accepted too"));
}

#[tokio::test]
async fn unreachable_server_and_bad_config_are_errors_exit_1() {
    let d = tempfile::tempdir().unwrap();
    let o = denv(
        d.path(),
        &[
            ("DENV_API_KEY", "dak_x"),
            ("DENV_SERVER", "http://127.0.0.1:1"),
        ],
        &["whoami"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).starts_with("denv: cannot reach http://127.0.0.1:1: connection refused"),
        "{}",
        err(&o)
    );
    // The config file is the fallback: a key there is used (and reaches the server).
    let cfg = d.path().join("xdg/denv/config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        r#"{"server":"http://127.0.0.1:1","api_key":"dak_file","team":"team_1"}"#,
    )
    .unwrap();
    let o = denv(d.path(), &[], &["whoami"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).starts_with("denv: cannot reach http://127.0.0.1:1"),
        "{}",
        err(&o)
    );
    std::fs::write(&cfg, "{not json").unwrap();
    let o = denv(d.path(), &[], &["whoami"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).starts_with(&format!("denv: parsing {}", cfg.display())),
        "{}",
        err(&o)
    );
    // A missing compose file names the file.
    let o = denv(
        d.path(),
        &[
            ("DENV_API_KEY", "dak_x"),
            ("DENV_SERVER", "http://127.0.0.1:1"),
        ],
        &[
            "deploy",
            "--project",
            "p",
            "-f",
            "/nonexistent/compose.yaml",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).starts_with("denv: reading /nonexistent/compose.yaml"),
        "{}",
        err(&o)
    );
}

/// A self-signed CA certificate (its key thrown away): a valid CA file that no server
/// here was signed by (the client crate's test CA).
const SOME_CA: &str = include_str!("../../denv-client/testdata/test-ca.pem");

#[tokio::test]
async fn the_ca_file_comes_from_the_flag_else_the_environment_and_is_named() {
    let d = tempfile::tempdir().unwrap();
    let key_https = [
        ("DENV_API_KEY", "dak_x"),
        ("DENV_SERVER", "https://127.0.0.1:1"),
    ];
    let missing = "denv: ca file /nonexistent/ca.pem: no such file or directory (os error 2)\n";
    for args in [
        &["--ca-file", "/nonexistent/ca.pem", "whoami"][..],
        &["whoami", "--ca-file", "/nonexistent/ca.pem"],
    ] {
        let o = denv(d.path(), &key_https, args).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert_eq!(err(&o), missing, "{args:?}");
    }
    let mut with_env = key_https.to_vec();
    with_env.push(("DENV_CA_FILE", "/nonexistent/ca.pem"));
    let o = denv(d.path(), &with_env, &["whoami"]).await;
    assert_eq!(err(&o), missing);
    // The flag wins over the variable: a readable CA file, then nothing listens.
    let ca = d.path().join("ca.pem");
    std::fs::write(&ca, SOME_CA).unwrap();
    let o = denv(
        d.path(),
        &with_env,
        &["--ca-file", ca.to_str().unwrap(), "whoami"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).starts_with("denv: cannot reach https://127.0.0.1:1: connection refused"),
        "{}",
        err(&o)
    );
}

// ---------------------------------------------------------------- the fake server

type States = Arc<Mutex<HashMap<String, Vec<v1::DeploymentResponse>>>>;

fn phase(seq: i32, name: &str, status: &str, ev: Value) -> v1::Phase {
    v1::Phase {
        deployment_id: String::new(),
        seq,
        name: name.into(),
        status: status.into(),
        evidence: Some(denv_proto::json::to_value(&ev)),
        ..Default::default()
    }
}

fn state(
    id: &str,
    kind: &str,
    env: &str,
    status: &str,
    err: &str,
    ph: Vec<v1::Phase>,
) -> v1::DeploymentResponse {
    v1::DeploymentResponse {
        deployment: Some(v1::Deployment {
            id: id.into(),
            kind: kind.into(),
            env_id: env.into(),
            status: status.into(),
            error: err.into(),
            ..Default::default()
        }),
        phases: ph,
    }
}

/// The verify of the quickstart's symlink attack, in three states.
fn verify_script() -> Vec<v1::DeploymentResponse> {
    let ok_stop = phase(
        1,
        "stop",
        "ok",
        json!({"agent_service": "box", "mode": "pause"}),
    );
    let collect = phase(
        2,
        "collect",
        "ok",
        json!({"files": 0.0, "bytes": 0.0, "missing": [], "refused": ["home/agent/answer.txt: symlink"]}),
    );
    vec![
        state(
            "dep_v",
            "verify",
            "env_1",
            "running",
            "",
            vec![
                phase(1, "stop", "running", Value::Null),
                phase(2, "collect", "pending", Value::Null),
            ],
        ),
        state(
            "dep_v",
            "verify",
            "env_1",
            "running",
            "",
            vec![ok_stop.clone(), phase(2, "collect", "running", Value::Null)],
        ),
        state(
            "dep_v",
            "verify",
            "env_1",
            "succeeded",
            "",
            vec![
                ok_stop,
                collect,
                phase(
                    3,
                    "verdict",
                    "ok",
                    json!({"reward": 0.0, "source": "refused",
                "refused": ["home/agent/answer.txt: symlink"], "missing": [], "agent_frozen": false, "took_ms": 812.0}),
                ),
            ],
        ),
    ]
}

fn fork_script() -> Vec<v1::DeploymentResponse> {
    vec![
        state(
            "dep_f",
            "fork",
            "env_2",
            "running",
            "",
            vec![phase(1, "place", "running", Value::Null)],
        ),
        state(
            "dep_f",
            "fork",
            "env_2",
            "failed",
            "place: source host not connected",
            vec![
                v1::Phase {
                    error: "source host not connected".into(),
                    ..phase(1, "place", "failed", Value::Null)
                },
                phase(2, "clone", "skipped", Value::Null),
                phase(3, "verdict", "ok", Value::Null),
            ],
        ),
    ]
}

struct Deps(States);

#[tonic::async_trait]
impl DeploymentService for Deps {
    async fn get_deployment(
        &self,
        r: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let m = self.0.lock().unwrap();
        let s = m
            .get(&r.get_ref().id)
            .ok_or_else(|| Status::not_found("deployment not found"))?;
        Ok(Response::new(s.last().unwrap().clone()))
    }
    type WatchDeploymentStream =
        futures::stream::BoxStream<'static, Result<v1::DeploymentResponse, Status>>;
    async fn watch_deployment(
        &self,
        r: Request<v1::GetDeploymentRequest>,
    ) -> Result<Response<Self::WatchDeploymentStream>, Status> {
        use futures::StreamExt;
        let states = self
            .0
            .lock()
            .unwrap()
            .get(&r.get_ref().id)
            .cloned()
            .ok_or_else(|| Status::not_found("deployment not found"))?;
        let s = futures::stream::iter(states).then(|s| async move {
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            Ok(s)
        });
        Ok(Response::new(s.boxed()))
    }
}

struct Projects;

#[tonic::async_trait]
impl ProjectService for Projects {
    async fn list_templates(
        &self,
        _: Request<v1::ListTemplatesRequest>,
    ) -> Result<Response<v1::ListTemplatesResponse>, Status> {
        Ok(Response::new(v1::ListTemplatesResponse {
            kinds: vec!["rl-environment".into(), "agent".into()],
            templates: vec![v1::Template {
                name: "rl-environment-ops".into(),
                kind: "rl-environment".into(),
                compose: "services: {}\n".into(),
                warm: vec!["make".into(), "warm".into()],
                ..Default::default()
            }],
        }))
    }
    async fn list_projects(
        &self,
        _: Request<v1::ListProjectsRequest>,
    ) -> Result<Response<v1::ListProjectsResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn create_project(
        &self,
        _: Request<v1::CreateProjectRequest>,
    ) -> Result<Response<v1::CreateProjectResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn list_envs(
        &self,
        r: Request<v1::ListEnvsRequest>,
    ) -> Result<Response<v1::ListEnvsResponse>, Status> {
        if r.get_ref().project != "quickstart" {
            return Err(Status::not_found("project not found"));
        }
        let e = |id: &str, name: &str, status: &str| v1::Environment {
            id: id.into(),
            name: name.into(),
            status: status.into(),
            ..Default::default()
        };
        Ok(Response::new(v1::ListEnvsResponse {
            environments: vec![
                e("env_0", "alpha", "destroyed"),
                e("env_1", "alpha", "healthy"),
                e("env_2", "branch-1", "healthy"),
            ],
        }))
    }
    async fn deploy(
        &self,
        r: Request<v1::DeployRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        let r = r.into_inner();
        // Echo what was sent, inside Params, with --wait=false in mind.
        let params =
            json!({"env": r.env, "warm": r.warm, "compose": r.compose, "project": r.project});
        Ok(Response::new(v1::DeploymentResponse {
            deployment: Some(v1::Deployment {
                id: "dep_d".into(),
                status: "pending".into(),
                params: Some(denv_proto::json::to_struct(&params)),
                ..Default::default()
            }),
            phases: vec![],
        }))
    }
    async fn get_source(
        &self,
        _: Request<v1::GetSourceRequest>,
    ) -> Result<Response<v1::SourceResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn update_source(
        &self,
        _: Request<v1::UpdateSourceRequest>,
    ) -> Result<Response<v1::SourceResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn deploy_from_source(
        &self,
        _: Request<v1::DeployFromSourceRequest>,
    ) -> Result<Response<v1::DeployFromSourceResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    /// `busy` has a live environment: refused unless forced.
    async fn promote(
        &self,
        r: Request<v1::PromoteRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        // Echoes what the CLI sent, so the test sees each argument in its field.
        let r = r.into_inner();
        Err(Status::failed_precondition(format!(
            "promote project={} from={} to={} version={}",
            r.project, r.from, r.to, r.version
        )))
    }
    async fn delete_project(
        &self,
        r: Request<v1::DeleteProjectRequest>,
    ) -> Result<Response<v1::DeleteProjectResponse>, Status> {
        let r = r.into_inner();
        if r.project != "busy" {
            return Err(Status::not_found(format!(
                "project {} not found",
                r.project
            )));
        }
        if !r.force {
            return Err(Status::failed_precondition(
                "project busy has 1 environment(s) that are not destroyed: alpha (env_1, healthy); destroy them first or pass force",
            ));
        }
        Ok(Response::new(v1::DeleteProjectResponse {
            project: Some(v1::Project {
                id: "prj_1".into(),
                name: "busy".into(),
                ..Default::default()
            }),
            deleted: true,
            destroyed: vec![v1::Deployment {
                id: "dep_x".into(),
                kind: "destroy".into(),
                status: "succeeded".into(),
                ..Default::default()
            }],
        }))
    }
}

struct Envs {
    states: States,
    files: Mutex<Vec<u8>>,
}

fn first(states: &States, id: &str) -> v1::DeploymentResponse {
    states.lock().unwrap()[id][0].clone()
}

#[tonic::async_trait]
impl EnvironmentService for Envs {
    type ExecStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::ExecChunk, Status>> + Send>>;
    /// Scripted: stdout `one`, 400 ms, stderr `two`, 400 ms, stdout = the request's
    /// stdin, then exit code 7 (`fail` as the command: a broken stream instead).
    async fn exec_stream(
        &self,
        r: Request<v1::ExecRequest>,
    ) -> Result<Response<Self::ExecStreamStream>, Status> {
        let r = r.into_inner();
        if r.env != "env_1" {
            return Err(Status::not_found("environment env_x not found"));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let chunk = |o: &[u8], e: &[u8]| v1::ExecChunk {
                stdout: o.to_vec(),
                stderr: e.to_vec(),
                result: None,
            };
            let _ = tx.send(Ok(chunk(b"one\n", b""))).await;
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let _ = tx.send(Ok(chunk(b"", b"two\n"))).await;
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let _ = tx.send(Ok(chunk(&r.stdin, b""))).await;
            if r.cmd.first().map(String::as_str) == Some("fail") {
                let _ = tx
                    .send(Err(Status::unavailable("host h is not connected")))
                    .await;
                return;
            }
            let _ = tx
                .send(Ok(v1::ExecChunk {
                    result: Some(v1::ExecResponse {
                        exit_code: 7,
                        ..Default::default()
                    }),
                    ..Default::default()
                }))
                .await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
    async fn get_env(
        &self,
        r: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::GetEnvResponse>, Status> {
        let env = r.into_inner().env;
        if !env.starts_with("env_") {
            return Err(Status::not_found("environment not found"));
        }
        Ok(Response::new(v1::GetEnvResponse {
            environment: Some(v1::Environment {
                id: env,
                ..Default::default()
            }),
            connected: true,
        }))
    }
    async fn get_sheet(
        &self,
        r: Request<v1::SheetRequest>,
    ) -> Result<Response<v1::SheetResponse>, Status> {
        let r = r.into_inner();
        let id = if r.version.is_empty() {
            format!("ver_of_{}", r.env)
        } else {
            r.version
        };
        let sheet = json!({
            "version": {"id": id, "number": 2, "env": "env_1", "env_name": "alpha",
                        "project": "ops", "created_at": "2026-12-02T10:00:00Z",
                        "snapshot": id, "healthy": true},
            "images": {"db": {"image": "postgres:16", "image_id": "sha256:ab", "digest": null}},
            "snapshot": {"deployment": "dep_d", "kind": "deploy", "frozen_for_ms": 12.0,
                         "consistent": true, "datasets": ["/x"]},
            "datasets": {"pg": {"digest": "sha256:cd", "files": 3.0, "bytes": 42.0}},
            "egress": {"policy": "deny", "result": "denied (verified)", "probe": null,
                       "deployment": "dep_d"},
            "caps": {"services": {"db": {"memory_mb": 4096.0, "pids": 2048.0, "cpus": 1.5}},
                     "disk_mb": 10240.0},
            "clock": "real",
            "protections": {"agent_service": null, "agent_user": null, "verifier": null},
            "gates": {"deployment": "dep_p", "status": "failed", "target": "staging",
                      "error": "gate.replay: not deterministic", "finished_at": "",
                      "phases": [{"name": "gate.fork", "status": "ok", "error": "", "evidence": null},
                                 {"name": "gate.replay", "status": "failed",
                                  "error": "not deterministic", "evidence": null}]},
        });
        Ok(Response::new(v1::SheetResponse {
            sheet: Some(denv_proto::json::to_struct(&sheet)),
        }))
    }
    async fn list_versions(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::ListVersionsResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn list_deployments(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::ListDeploymentsResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn fork(
        &self,
        r: Request<v1::ForkRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        assert_eq!(r.get_ref().name, "branch-1");
        Ok(Response::new(first(&self.states, "dep_f")))
    }
    async fn snapshot(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn rollback(
        &self,
        _: Request<v1::RollbackRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        Err(Status::failed_precondition(
            "version ver_x is not a healthy snapshot of this environment",
        ))
    }
    async fn verify(
        &self,
        r: Request<v1::VerifyRequest>,
    ) -> Result<Response<v1::DeploymentResponse>, Status> {
        if r.get_ref().env != "env_1" {
            return Err(Status::not_found("environment not found"));
        }
        Ok(Response::new(first(&self.states, "dep_v")))
    }
    async fn exec(
        &self,
        r: Request<v1::ExecRequest>,
    ) -> Result<Response<v1::ExecResponse>, Status> {
        let r = r.into_inner();
        let mut vars: Vec<_> = r.env_vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
        vars.sort();
        Ok(Response::new(v1::ExecResponse {
            exit_code: 3,
            stdout: format!("{}|{}|{}", r.env, r.service, r.cmd.join(" ")),
            stderr: format!(
                "{}|{}|{}|{}",
                r.user,
                r.workdir,
                String::from_utf8_lossy(&r.stdin),
                vars.join(",")
            ),
            stdout_truncated: r.user == "nobody",
            ..Default::default()
        }))
    }
    async fn put_files(
        &self,
        r: Request<v1::PutFilesRequest>,
    ) -> Result<Response<v1::PutFilesResponse>, Status> {
        let r = r.into_inner();
        assert_eq!(
            (r.service.as_str(), r.path.as_str()),
            ("box", "/home/agent")
        );
        let n = r.tar.len() as i32;
        *self.files.lock().unwrap() = r.tar;
        Ok(Response::new(v1::PutFilesResponse { ok: true, bytes: n }))
    }
    async fn get_files(
        &self,
        _: Request<v1::GetFilesRequest>,
    ) -> Result<Response<v1::GetFilesResponse>, Status> {
        Ok(Response::new(v1::GetFilesResponse {
            tar: self.files.lock().unwrap().clone(),
        }))
    }
    async fn destroy(
        &self,
        _: Request<v1::EnvRequest>,
    ) -> Result<Response<v1::DestroyResponse>, Status> {
        Err(Status::unimplemented(""))
    }
    /// Two environments; `status` other than the six is refused as the server does.
    async fn list_all_envs(
        &self,
        r: Request<v1::ListAllEnvsRequest>,
    ) -> Result<Response<v1::ListAllEnvsResponse>, Status> {
        let r = r.into_inner();
        let all = [
            "pending",
            "deploying",
            "healthy",
            "failed",
            "destroying",
            "destroyed",
        ];
        if !r.status.is_empty() && !all.contains(&r.status.as_str()) {
            return Err(Status::invalid_argument(format!(
                "unknown status {:?}: use one of {}",
                r.status,
                all.join(", ")
            )));
        }
        let e = |id: &str, name: &str, project: &str, status: &str, v: &str| v1::EnvEntry {
            id: id.into(),
            name: name.into(),
            project: project.into(),
            project_id: format!("prj_{project}"),
            status: status.into(),
            current_version_id: v.into(),
            ..Default::default()
        };
        let rows = vec![
            e("env_1", "alpha", "quickstart", "healthy", "ver_1"),
            e("env_22", "rollout-long-name", "sandboxes", "pending", ""),
        ];
        Ok(Response::new(v1::ListAllEnvsResponse {
            environments: rows
                .into_iter()
                .filter(|x| r.status.is_empty() || x.status == r.status)
                .filter(|x| r.project.is_empty() || x.project == r.project)
                .collect(),
        }))
    }
    type LogsStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::LogEntry, Status>> + Send>>;
    /// Scripted: `web` and `agent` lines (the agent's trying to pass for `web` with a
    /// carriage return and an escape sequence), a stderr line; with `follow`, one more
    /// line 600 ms later and then the stream stays open; `broken` fails mid-stream.
    async fn logs(
        &self,
        r: Request<v1::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let r = r.into_inner();
        if r.env != "env_1" {
            return Err(Status::not_found(format!(
                "environment {} not found",
                r.env
            )));
        }
        if !r.service.is_empty() && r.service != "web" && r.service != "agent" {
            return Err(Status::invalid_argument(format!(
                "unknown service {:?}: the services of env_1 are agent, web",
                r.service
            )));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let l = |svc: &str, stream: &str, line: &str| v1::LogEntry {
                service: svc.into(),
                stream: stream.into(),
                line: line.into(),
                timestamp: if r.timestamps {
                    "2026-12-01T10:00:00.000000001Z".into()
                } else {
                    String::new()
                },
                truncated: false,
            };
            let mut lines = vec![
                l("web", "stdout", &format!("tail={}", r.tail)),
                l("agent", "stdout", "\rweb | forged \x1b[2K"),
                l("web", "stderr", "to stderr"),
            ];
            if !r.service.is_empty() {
                lines.retain(|x| x.service == r.service);
            }
            for x in lines {
                let _ = tx.send(Ok(x)).await;
            }
            if r.service.is_empty() && r.tail == 7 {
                let cut = v1::LogEntry {
                    service: "agent".into(),
                    truncated: true,
                    ..Default::default()
                };
                let _ = tx.send(Ok(cut)).await;
            }
            if r.follow {
                tokio::time::sleep(std::time::Duration::from_millis(600)).await;
                let _ = tx.send(Ok(l("web", "stdout", "later"))).await;
                tx.closed().await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// The device flow: `DeviceToken` is pending twice, then hands out the key once.
#[derive(Default)]
struct Auth {
    polls: Mutex<u32>,
}

#[allow(clippy::result_large_err)]
fn no<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented(""))
}

#[tonic::async_trait]
impl AuthService for Auth {
    async fn dev_login(
        &self,
        _: Request<v1::DevLoginRequest>,
    ) -> Result<Response<v1::DevLoginResponse>, Status> {
        no()
    }
    async fn github_start(
        &self,
        _: Request<v1::GithubStartRequest>,
    ) -> Result<Response<v1::RedirectResponse>, Status> {
        no()
    }
    async fn github_callback(
        &self,
        _: Request<v1::GithubCallbackRequest>,
    ) -> Result<Response<v1::RedirectResponse>, Status> {
        no()
    }
    async fn device_code(
        &self,
        r: Request<v1::DeviceCodeRequest>,
    ) -> Result<Response<v1::DeviceCodeResponse>, Status> {
        // The flow runs without a credential.
        assert!(r.metadata().get("authorization").is_none());
        Ok(Response::new(v1::DeviceCodeResponse {
            device_code: "ddc_1".into(),
            user_code: "ABCD-EFGH".into(),
            verification_uri: "/app/device/".into(),
            verification_uri_complete: "/app/device/?code=ABCD-EFGH".into(),
            expires_in: 900,
            interval: 1,
        }))
    }
    async fn device_approve(
        &self,
        _: Request<v1::DeviceApproveRequest>,
    ) -> Result<Response<v1::DeviceApproveResponse>, Status> {
        no()
    }
    async fn device_token(
        &self,
        r: Request<v1::DeviceTokenRequest>,
    ) -> Result<Response<v1::DeviceTokenResponse>, Status> {
        if r.get_ref().device_code != "ddc_1" {
            return Err(Status::invalid_argument("invalid_device_code"));
        }
        let mut n = self.polls.lock().unwrap();
        *n += 1;
        match *n {
            1 | 2 => Err(Status::failed_precondition("authorization_pending")),
            3 => Ok(Response::new(v1::DeviceTokenResponse {
                api_key: "dak_issued_once".into(),
                team: Some(v1::Team {
                    id: "team_9".into(),
                    name: "acme".into(),
                    ..Default::default()
                }),
            })),
            _ => Err(Status::failed_precondition("key already issued")),
        }
    }
    async fn me(&self, r: Request<v1::MeRequest>) -> Result<Response<v1::MeResponse>, Status> {
        let auth = r
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let team = r
            .metadata()
            .get("x-denv-team")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if auth != "Bearer dak_issued_once" {
            return Err(Status::unauthenticated("invalid api key"));
        }
        Ok(Response::new(v1::MeResponse {
            team: Some(v1::Team {
                id: team.into(),
                name: "acme".into(),
                ..Default::default()
            }),
            teams: vec![],
            user: None,
        }))
    }
    async fn list_teams(
        &self,
        _: Request<v1::ListTeamsRequest>,
    ) -> Result<Response<v1::ListTeamsResponse>, Status> {
        no()
    }
    async fn create_team(
        &self,
        _: Request<v1::CreateTeamRequest>,
    ) -> Result<Response<v1::CreateTeamResponse>, Status> {
        no()
    }
    async fn list_keys(
        &self,
        _: Request<v1::ListKeysRequest>,
    ) -> Result<Response<v1::ListKeysResponse>, Status> {
        no()
    }
    async fn create_key(
        &self,
        _: Request<v1::CreateKeyRequest>,
    ) -> Result<Response<v1::CreateKeyResponse>, Status> {
        no()
    }
    async fn revoke_key(
        &self,
        _: Request<v1::RevokeKeyRequest>,
    ) -> Result<Response<v1::RevokeKeyResponse>, Status> {
        no()
    }
}

async fn serve() -> String {
    let states: States = Arc::new(Mutex::new(HashMap::from([
        ("dep_v".to_string(), verify_script()),
        ("dep_f".to_string(), fork_script()),
    ])));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(DeploymentServiceServer::new(Deps(states.clone())))
            .add_service(ProjectServiceServer::new(Projects))
            .add_service(AuthServiceServer::new(Auth::default()))
            .add_service(EnvironmentServiceServer::new(Envs {
                states,
                files: Mutex::new(vec![]),
            }))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn verify_prints_phases_and_the_verdict_then_the_status() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(d.path(), &vars, &["verify", "--resume", "env_1"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(
        out(&o),
        concat!(
            "deployment dep_v (verify, env env_1)\n",
            "  stop         ok       {\"agent_service\":\"box\",\"mode\":\"pause\"}\n",
            "  collect      ok       {\"bytes\":0,\"files\":0,\"missing\":[],\"refused\":[\"home/agent/answer.txt: symlink\"]}\n",
            "  verdict      ok       {\"agent_frozen\":false,\"reward\":0,\"source\":\"refused\",\"took_ms\":812,\"missing\":[],\"refused\":[\"home/agent/answer.txt: symlink\"]}\n",
            "    reward: 0\n",
            "    source: refused\n",
            "    refused: home/agent/answer.txt: symlink\n",
            "    agent_frozen: false\n",
            "deployment dep_v: succeeded\n",
        )
    );
    // By name within the project: the live `alpha`, not the destroyed one.
    let o = denv(
        d.path(),
        &vars,
        &["verify", "alpha", "--project", "quickstart"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(out(&o).starts_with("deployment dep_v (verify, env env_1)\n"));
    let o = denv(
        d.path(),
        &vars,
        &["verify", "--project", "quickstart", "gamma"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o),
        "denv: no environment named gamma in project quickstart\n"
    );
    // --wait=false prints the 202 answer as JSON.
    let o = denv(d.path(), &vars, &["verify", "--wait=false", "env_1"]).await;
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["deployment"]["ID"], "dep_v");
    assert_eq!(v["deployment"]["Status"], "running");
    // deployment watch follows the same way.
    let o = denv(d.path(), &vars, &["deployment", "watch", "dep_v"]).await;
    assert_eq!(o.status.code(), Some(0));
    assert!(
        out(&o).ends_with("    agent_frozen: false\ndeployment dep_v: succeeded\n"),
        "{}",
        out(&o)
    );
}

#[tokio::test]
async fn a_failed_deployment_exits_1_with_its_error() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(d.path(), &vars, &["fork", "--name", "branch-1", "env_1"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        out(&o),
        concat!(
            "deployment dep_f (fork, env env_2)\n",
            "  place        failed   error: source host not connected\n",
            "  clone        skipped\n",
            "  verdict      ok\n",
            "deployment dep_f: failed\n",
        )
    );
    assert_eq!(err(&o), "denv: place: source host not connected\n");
    // A refused request is the server's message.
    let o = denv(d.path(), &vars, &["rollback", "env_1", "ver_x"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o),
        "denv: version ver_x is not a healthy snapshot of this environment\n"
    );
}

#[tokio::test]
async fn promote_sends_its_arguments_and_sheet_prints_the_record() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(
        d.path(),
        &vars,
        &["promote", "--version", "ver_9", "ops", "alpha", "staging"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o),
        "denv: promote project=ops from=alpha to=staging version=ver_9\n"
    );
    let o = denv(d.path(), &vars, &["promote", "ops", "alpha"]).await;
    assert_eq!(
        o.status.code(),
        Some(2),
        "a missing target is a usage error"
    );

    // A version id goes as `version`, an environment id as `env`.
    let o = denv(d.path(), &vars, &["sheet", "ver_7"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let text = out(&o);
    for line in [
        "version     ver_7 (#2 of alpha in project ops), created 2026-12-02T10:00:00Z\n",
        "  db           postgres:16  id sha256:ab  digest -\n",
        "captured    by deploy dep_d (frozen 12 ms, consistent: true)\n",
        "  pg           sha256:cd  3 files, 42 bytes\n",
        "egress      deny: denied (verified) (proved by dep_d)\n",
        "  db           memory 4096 MiB, pids 2048, cpus 1.5\n",
        "gates       dep_p failed to staging: gate.replay: not deterministic\n",
        "  gate.replay        failed  not deterministic\n",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    let o = denv(d.path(), &vars, &["sheet", "--json", "env_1"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["version"]["id"], "ver_of_env_1");
    assert_eq!(
        v["datasets"]["pg"]["files"], 3,
        "whole numbers print as integers"
    );
}

#[tokio::test]
async fn json_commands_print_the_rest_shapes() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    // The quickstart's one-liner: json.load(...)["environments"], e["Name"], e["ID"].
    let o = denv(d.path(), &vars, &["project", "envs", "quickstart"]).await;
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let branch: Vec<&Value> = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["Name"] == "branch-1")
        .collect();
    assert_eq!(branch[0]["ID"], "env_2");
    assert!(
        out(&o).starts_with("{\n  \"environments\": [\n"),
        "{}",
        out(&o)
    );
    // exec: a non-zero exit code is not an error; `--` is passed through correctly.
    let o = denv(
        d.path(),
        &vars,
        &[
            "exec",
            "--service",
            "box",
            "env_1",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v,
        json!({"exit_code": 3, "stdout": "env_1|box|sh -c exit 3", "stderr": "|||",
               "stdout_truncated": false, "stderr_truncated": false, "timed_out": false})
    );
    // --user, --workdir, --env and --input reach the request; the flags come back.
    let input = d.path().join("in.txt");
    std::fs::write(&input, "from a file\n").unwrap();
    let o = denv(
        d.path(),
        &vars,
        &[
            "exec",
            "--service",
            "box",
            "-u",
            "nobody",
            "-w",
            "/tmp",
            "-e",
            "A=1",
            "--env",
            "B=x=y",
            "--input",
            input.to_str().unwrap(),
            "env_1",
            "--",
            "cat",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stderr"], "nobody|/tmp|from a file\n|A=1,B=x=y");
    assert_eq!(v["stdout_truncated"], true);
    let o = denv(
        d.path(),
        &vars,
        &["exec", "--service", "box", "-e", "NOVALUE", "env_1", "true"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("--env \"NOVALUE\" must be KEY=VALUE"),
        "{}",
        err(&o)
    );
    // deploy --wait=false sends the compose text and the split warm command.
    let compose = d.path().join("compose.yaml");
    std::fs::write(&compose, "services: {box: {image: busybox}}\n").unwrap();
    let o = denv(
        d.path(),
        &vars,
        &[
            "deploy",
            "--project",
            "quickstart",
            "-f",
            compose.to_str().unwrap(),
            "--warm",
            "make  warm -j2",
            "--wait=false",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["deployment"]["Params"],
        json!({"env": "alpha", "warm": ["make", "warm", "-j2"], "project": "quickstart",
               "compose": "services: {box: {image: busybox}}\n"})
    );
}

#[tokio::test]
async fn files_put_then_get_round_trips() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let src = d.path().join("fixtures");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), "alpha").unwrap();
    std::fs::write(src.join("sub/b.txt"), "beta").unwrap();
    let o = denv(
        d.path(),
        &vars,
        &[
            "files",
            "put",
            "env_1",
            "--service",
            "box",
            src.to_str().unwrap(),
            "/home/agent",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    let dest = d.path().join("back");
    let o = denv(
        d.path(),
        &vars,
        &[
            "files",
            "get",
            "--service",
            "box",
            "env_1",
            "/home/agent/fixtures",
            dest.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(
        out(&o),
        format!("2 files written under {}\n", dest.display())
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("fixtures/sub/b.txt")).unwrap(),
        "beta"
    );
}

#[tokio::test]
async fn init_writes_once_and_names_the_warm_command() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let target = d.path().join("c.yaml");
    let t = target.to_str().unwrap();
    let o = denv(d.path(), &vars, &["init", "rl-environment", "--out", t]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "services: {}\n");
    assert!(
        out(&o).contains(&format!(
            "denv deploy --project <project> -f {t} --warm \"make warm\""
        )),
        "{}",
        out(&o)
    );
    let o = denv(d.path(), &vars, &["init", "rl-environment-ops", "--out", t]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o),
        format!("denv: {t} exists; pass --out to write elsewhere\n")
    );
    let o = denv(d.path(), &vars, &["init", "nope", "--out", t]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).starts_with("denv: no template named or of kind nope"));
}

#[cfg(unix)]
#[tokio::test]
async fn login_polls_until_approved_and_saves_the_key_0600() {
    use std::os::unix::fs::PermissionsExt;
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let t0 = std::time::Instant::now();
    // DENV_SERVER points elsewhere: --server wins.
    let o = denv(
        d.path(),
        &[("DENV_SERVER", "http://127.0.0.1:1")],
        &["login", "--server", &url, "--no-browser"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // Three polls one second apart.
    assert!(t0.elapsed() >= std::time::Duration::from_secs(3));
    let cfg = d.path().join("xdg/denv/config.json");
    let text = out(&o);
    assert!(
        text.contains(&format!("{url}/app/device/?code=ABCD-EFGH")),
        "{text}"
    );
    assert!(text.contains("ABCD-EFGH"));
    assert!(
        text.ends_with(&format!(
            "Signed in to team acme. Key saved to {}\n",
            cfg.display()
        )),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&cfg).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    assert_eq!(
        saved,
        json!({"server": url, "api_key": "dak_issued_once", "team": "team_9"})
    );
    // The saved key, server and team are used by the next command.
    let o = denv(d.path(), &[], &["whoami"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["team"]["ID"], "team_9");
    assert_eq!(v["team"]["Name"], "acme");
}

#[tokio::test]
async fn exec_stream_writes_output_as_it_comes_and_exits_with_the_command_code() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let d = tempfile::tempdir().unwrap();
    let url = serve().await;
    let spawn = |args: &[&str]| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_denv"));
        c.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", d.path())
            .env("XDG_CONFIG_HOME", d.path().join("xdg"))
            .env("DENV_API_KEY", "dak_local")
            .env("DENV_SERVER", &url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    // The first line is on our stdout while the command still runs (it ends ~800 ms
    // later): output is streamed, not printed at the end.
    let t = std::time::Instant::now();
    let mut child = spawn(&["exec", "--stream", "--service", "box", "env_1", "--", "x"]);
    drop(child.stdin.take());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).await.unwrap();
    assert_eq!(line, "one\n");
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running when the first line arrived"
    );
    assert!(t.elapsed() < std::time::Duration::from_millis(2500));
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut eline = String::new();
    err.read_line(&mut eline).await.unwrap();
    assert_eq!(eline, "two\n");
    let status = child.wait().await.unwrap();
    assert_eq!(status.code(), Some(7), "the command's exit code");

    // -i passes stdin (here echoed back by the fake).
    let mut child = spawn(&["exec", "-i", "--service", "box", "env_1", "cat"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"from stdin\n").await.unwrap();
    drop(stdin);
    let o = child.wait_with_output().await.unwrap();
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(out_of(&o.stdout), "one\nfrom stdin\n");
    assert_eq!(out_of(&o.stderr), "two\n");

    // denv's own failures are 125, distinct from any command's code: a refused request,
    // a stream that breaks, a bad flag combination.
    for (args, msg) in [
        (
            &["exec", "--stream", "--service", "box", "env_x", "true"][..],
            "environment env_x not found",
        ),
        (
            &["exec", "--stream", "--service", "box", "env_1", "fail"][..],
            "host h is not connected",
        ),
        (
            &[
                "exec",
                "-i",
                "--input",
                "-",
                "--service",
                "box",
                "env_1",
                "cat",
            ][..],
            "cannot be combined",
        ),
    ] {
        let mut child = spawn(args);
        drop(child.stdin.take());
        let o = child.wait_with_output().await.unwrap();
        assert_eq!(o.status.code(), Some(125), "{args:?}");
        assert!(
            out_of(&o.stderr).contains(msg),
            "{args:?}: {}",
            out_of(&o.stderr)
        );
    }
    // Plain exec keeps its JSON and exit 0.
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(d.path(), &vars, &["exec", "--service", "box", "env_1", "x"]).await;
    assert_eq!(o.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exit_code"], 3);
}

fn out_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn env_list_prints_a_table_ids_or_json_and_refuses_unknown_statuses() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(d.path(), &vars, &["env", "list"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(
        out(&o),
        concat!(
            "ID      NAME               PROJECT     STATUS   VERSION\n",
            "env_1   alpha              quickstart  healthy  ver_1\n",
            "env_22  rollout-long-name  sandboxes   pending  -\n",
        )
    );
    let o = denv(
        d.path(),
        &vars,
        &["env", "list", "-q", "--status", "pending"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(out(&o), "env_22\n");
    let o = denv(
        d.path(),
        &vars,
        &["env", "list", "--json", "--project", "quickstart"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["environments"].as_array().unwrap().len(), 1);
    assert_eq!(v["environments"][0]["Project"], "quickstart");
    assert_eq!(v["environments"][0]["CurrentVersionID"], "ver_1");
    let o = denv(d.path(), &vars, &["env", "list", "--status", "running"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(out(&o), "");
    assert_eq!(
        err(&o),
        "denv: unknown status \"running\": use one of pending, deploying, healthy, failed, destroying, destroyed\n"
    );
    // -q and --json together are a usage error.
    let o = denv(d.path(), &vars, &["env", "list", "-q", "--json"]).await;
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test]
async fn project_delete_is_refused_with_the_environments_then_forced() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(d.path(), &vars, &["project", "delete", "busy"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(out(&o), "");
    assert_eq!(
        err(&o),
        "denv: project busy has 1 environment(s) that are not destroyed: alpha (env_1, healthy); destroy them first or pass force\n"
    );
    let o = denv(d.path(), &vars, &["project", "delete", "--force", "busy"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["deleted"], true);
    assert_eq!(v["destroyed"][0]["ID"], "dep_x");
    let o = denv(d.path(), &vars, &["project", "delete", "nope"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(err(&o), "denv: project nope not found\n");
}

#[tokio::test]
async fn logs_prefix_every_line_with_its_service_and_escape_what_could_hide_it() {
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let vars = [("DENV_API_KEY", "dak_local"), ("DENV_SERVER", url.as_str())];
    let o = denv(d.path(), &vars, &["logs", "env_1"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // The default tail is 100; the agent's carriage return and escape cannot rewrite
    // its own prefix into `web`.
    assert_eq!(
        out(&o),
        concat!(
            "web | tail=100\n",
            "agent | \\x0dweb | forged \\x1b[2K\n",
            "web | to stderr\n",
        )
    );
    assert_eq!(err(&o), "");
    // One service: its lines as written, stderr to stderr; --tail 0 asks for none (-1).
    let o = denv(
        d.path(),
        &vars,
        &["logs", "--service", "web", "--tail", "0", "env_1"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(out(&o), "tail=-1\n");
    assert_eq!(err(&o), "to stderr\n");
    let o = denv(d.path(), &vars, &["logs", "-s", "agent", "-t", "env_1"]).await;
    assert_eq!(
        out(&o),
        "2026-12-01T10:00:00.000000001Z \rweb | forged \x1b[2K\n"
    );
    // A service cut at the byte cap is said on stderr; the exit code stays 0.
    let o = denv(d.path(), &vars, &["logs", "-n", "7", "env_1"]).await;
    assert_eq!(o.status.code(), Some(0));
    assert!(
        err(&o).contains("logs of service agent stopped at the 8 MiB cap"),
        "{}",
        err(&o)
    );
    // Refusals exit 1 with the server's message.
    let o = denv(d.path(), &vars, &["logs", "--service", "db", "env_1"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        err(&o),
        "denv: unknown service \"db\": the services of env_1 are agent, web\n"
    );
    let o = denv(d.path(), &vars, &["logs", "env_9"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(err(&o), "denv: environment env_9 not found\n");
    let o = denv(d.path(), &vars, &["logs", "--tail", "-3", "env_1"]).await;
    assert_eq!(o.status.code(), Some(2), "a negative tail is a usage error");
}

#[tokio::test]
async fn logs_follow_prints_lines_as_they_come_and_keeps_running() {
    use tokio::io::AsyncBufReadExt;
    let url = serve().await;
    let d = tempfile::tempdir().unwrap();
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_denv"));
    c.args(["logs", "--follow", "--service", "web", "env_1"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", d.path())
        .env("XDG_CONFIG_HOME", d.path().join("xdg"))
        .env("DENV_API_KEY", "dak_local")
        .env("DENV_SERVER", &url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = c.spawn().unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).await.unwrap();
    assert_eq!(line, "tail=100\n");
    line.clear();
    let t = std::time::Instant::now();
    tokio::time::timeout(std::time::Duration::from_secs(10), out.read_line(&mut line))
        .await
        .expect("the later line arrives while following")
        .unwrap();
    assert_eq!(line, "later\n");
    assert!(t.elapsed() >= std::time::Duration::from_millis(300));
    // Still following: nothing ends the stream but us.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "--follow keeps running"
    );
    child.kill().await.unwrap();
}
