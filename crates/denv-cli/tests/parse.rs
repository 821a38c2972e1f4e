//! Every documented invocation (spec pages `10-ref-cli.md`, `01-quickstart.md`,
//! `07-verify-howto.md`, `08-snapshot-and-fork-howto.md`) parses to the intended command,
//! in the documented order and with flags after positionals.

use clap::{CommandFactory, Parser};
use denv_cli::cli::*;
use std::path::PathBuf;

fn parse(line: &[&str]) -> Command {
    let mut args = vec!["denv"];
    args.extend_from_slice(line);
    match Cli::try_parse_from(&args) {
        Ok(c) => c.command,
        Err(e) => panic!("{line:?}: {e}"),
    }
}

fn usage_error(line: &[&str]) -> clap::error::ErrorKind {
    let mut args = vec!["denv"];
    args.extend_from_slice(line);
    match Cli::try_parse_from(&args) {
        Ok(c) => panic!("{line:?} parsed: {c:?}"),
        Err(e) => {
            assert_eq!(e.exit_code(), 2, "{line:?}");
            e.kind()
        }
    }
}

fn sel(env: &str) -> EnvSel {
    EnvSel {
        env: env.into(),
        project: None,
    }
}

const WAIT: WaitFlag = WaitFlag { wait: true };
const NO_WAIT: WaitFlag = WaitFlag { wait: false };

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn login() {
    assert_eq!(
        parse(&["login"]),
        Command::Login(LoginArgs {
            server: None,
            no_browser: false,
            ignored: vec![]
        })
    );
    assert_eq!(
        parse(&["login", "--server", "http://cp:8080", "--no-browser"]),
        Command::Login(LoginArgs {
            server: Some("http://cp:8080".into()),
            no_browser: true,
            ignored: vec![]
        })
    );
    // "parses its own two flags and ignores anything else"
    let Command::Login(a) = parse(&["login", "--no-browser", "extra", "--whatever"]) else {
        panic!()
    };
    assert!(a.no_browser);
    assert_eq!(a.ignored, vec!["extra", "--whatever"]);
}

#[test]
fn whoami_templates_init() {
    assert_eq!(parse(&["whoami"]), Command::Whoami);
    assert_eq!(parse(&["templates"]), Command::Templates { kind: None });
    assert_eq!(
        parse(&["templates", "--kind", "agent"]),
        Command::Templates {
            kind: Some("agent".into())
        }
    );
    assert_eq!(
        parse(&["init", "rl-environment-ops"]),
        Command::Init {
            name: "rl-environment-ops".into(),
            out: PathBuf::from("compose.yaml")
        }
    );
    let want = Command::Init {
        name: "agent".into(),
        out: PathBuf::from("agent.yaml"),
    };
    assert_eq!(parse(&["init", "--out", "agent.yaml", "agent"]), want);
    assert_eq!(parse(&["init", "agent", "--out", "agent.yaml"]), want);
}

#[test]
fn project() {
    // quickstart
    assert_eq!(
        parse(&[
            "project",
            "create",
            "--kind",
            "rl-environment",
            "quickstart"
        ]),
        Command::Project(ProjectCmd::Create {
            kind: "rl-environment".into(),
            source: None,
            name: "quickstart".into()
        })
    );
    let want = Command::Project(ProjectCmd::Create {
        kind: "agent".into(),
        source: Some("github:org/repo".into()),
        name: "ops".into(),
    });
    assert_eq!(
        parse(&[
            "project",
            "create",
            "--kind",
            "agent",
            "--source",
            "github:org/repo",
            "ops"
        ]),
        want
    );
    assert_eq!(
        parse(&[
            "project",
            "create",
            "ops",
            "--source",
            "github:org/repo",
            "--kind",
            "agent"
        ]),
        want
    );
    // --kind defaults to rl-environment
    assert_eq!(
        parse(&["project", "create", "w"]),
        Command::Project(ProjectCmd::Create {
            kind: "rl-environment".into(),
            source: None,
            name: "w".into()
        })
    );
    assert_eq!(
        parse(&["project", "list"]),
        Command::Project(ProjectCmd::List)
    );
    assert_eq!(
        parse(&["project", "envs", "quickstart"]),
        Command::Project(ProjectCmd::Envs {
            project: "quickstart".into()
        })
    );
}

#[test]
fn cloud_and_host() {
    assert_eq!(
        parse(&[
            "cloud",
            "connect",
            "--name",
            "h1",
            "--token",
            "tok",
            "--server-type",
            "cpx31",
            "--location",
            "nbg1",
            "hetzner"
        ]),
        Command::Cloud(CloudCmd::Connect {
            provider: "hetzner".into(),
            name: Some("h1".into()),
            token: Some("tok".into()),
            server_type: Some("cpx31".into()),
            location: Some("nbg1".into())
        })
    );
    assert_eq!(
        parse(&["cloud", "connect", "manual"]),
        Command::Cloud(CloudCmd::Connect {
            provider: "manual".into(),
            name: None,
            token: None,
            server_type: None,
            location: None
        })
    );
    assert_eq!(parse(&["cloud", "list"]), Command::Cloud(CloudCmd::List));
    assert_eq!(parse(&["host", "list"]), Command::Host(HostCmd::List));
    assert_eq!(
        parse(&["host", "join-token"]),
        Command::Host(HostCmd::JoinToken)
    );
}

#[test]
fn deploy() {
    // quickstart
    assert_eq!(
        parse(&[
            "deploy",
            "--project",
            "quickstart",
            "-f",
            "compose.yaml",
            "--wait"
        ]),
        Command::Deploy(DeployArgs {
            project: "quickstart".into(),
            env: "alpha".into(),
            file: "compose.yaml".into(),
            warm: None,
            ttl: None,
            wait: WAIT
        })
    );
    assert_eq!(
        parse(&[
            "deploy",
            "--project",
            "p",
            "--env",
            "beta",
            "--file",
            "x.yaml",
            "--warm",
            "make warm -j2",
            "--wait=false"
        ]),
        Command::Deploy(DeployArgs {
            project: "p".into(),
            env: "beta".into(),
            file: "x.yaml".into(),
            warm: Some("make warm -j2".into()),
            ttl: None,
            wait: NO_WAIT
        })
    );
    // waits by default
    let Command::Deploy(a) = parse(&["deploy", "--project", "p"]) else {
        panic!()
    };
    assert_eq!(a.wait, WAIT);
    assert_eq!(a.file, PathBuf::from("compose.yaml"));
    assert_eq!(
        usage_error(&["deploy"]),
        clap::error::ErrorKind::MissingRequiredArgument
    );
    let Command::Deploy(a) = parse(&["deploy", "--project", "p", "--ttl", "2h"]) else {
        panic!()
    };
    assert_eq!(a.ttl, Some(7200));
    assert_eq!(
        usage_error(&["deploy", "--project", "p", "--ttl", "soon"]),
        clap::error::ErrorKind::ValueValidation
    );
}

#[test]
fn ttl_values() {
    use denv_cli::cli::parse_ttl;
    for (s, want) in [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86400),
        ("1d2h3m4s", 93784),
    ] {
        assert_eq!(parse_ttl(s), Ok(want), "{s}");
    }
    for s in [
        "", "0", "0s", "-5", "5x", "m", "30m2h", "1h1h", "2.5h", "h30",
    ] {
        assert!(parse_ttl(s).is_err(), "{s} accepted");
    }
    assert_eq!(
        parse_ttl("soon").unwrap_err(),
        "invalid TTL \"soon\": use seconds (90) or a duration like 30m, 2h, 1h30m"
    );
}

#[test]
fn env() {
    assert_eq!(
        parse(&["env", "get", "env_01"]),
        Command::Env(EnvCmd::Get(sel("env_01")))
    );
    assert_eq!(
        parse(&["env", "versions", "env_01"]),
        Command::Env(EnvCmd::Versions(sel("env_01")))
    );
    assert_eq!(
        parse(&["env", "deployments", "env_01"]),
        Command::Env(EnvCmd::Deployments(sel("env_01")))
    );
    assert_eq!(
        parse(&["env", "destroy", "env_01"]),
        Command::Env(EnvCmd::Destroy(sel("env_01")))
    );
    // by name within a project, either order
    let by_name = Command::Env(EnvCmd::Get(EnvSel {
        env: "alpha".into(),
        project: Some("quickstart".into()),
    }));
    assert_eq!(
        parse(&["env", "get", "--project", "quickstart", "alpha"]),
        by_name
    );
    assert_eq!(
        parse(&["env", "get", "alpha", "--project", "quickstart"]),
        by_name
    );
}

#[test]
fn fork_snapshot_verify_rollback() {
    let f1 = Command::Fork(ForkArgs {
        name: Some("f1".into()),
        version: None,
        ttl: None,
        pool: None,
        cpus: None,
        memory: None,
        pids: None,
        disk: None,
        env: sel("alpha"),
        wait: WAIT,
    });
    // The spec's order, and the order the Go tool refused.
    assert_eq!(parse(&["fork", "--name", "f1", "alpha"]), f1);
    assert_eq!(parse(&["fork", "alpha", "--name", "f1"]), f1);
    assert_eq!(
        parse(&["fork", "--name", "branch-1", "env_01"]),
        Command::Fork(ForkArgs {
            name: Some("branch-1".into()),
            version: None,
            ttl: None,
            pool: None,
            cpus: None,
            memory: None,
            pids: None,
            disk: None,
            env: sel("env_01"),
            wait: WAIT
        })
    );
    assert_eq!(
        parse(&["fork", "--version", "ver_01", "--wait=false", "env_01"]),
        Command::Fork(ForkArgs {
            name: None,
            version: Some("ver_01".into()),
            ttl: None,
            pool: None,
            cpus: None,
            memory: None,
            pids: None,
            disk: None,
            env: sel("env_01"),
            wait: NO_WAIT
        })
    );
    let Command::Fork(a) = parse(&["fork", "--ttl", "30m", "env_01"]) else {
        panic!()
    };
    assert_eq!(a.ttl, Some(1800));
    let Command::Fork(a) = parse(&["fork", "--pool", "4", "env_01"]) else {
        panic!()
    };
    assert_eq!(a.pool, Some(4));
    assert_eq!(a.resources(), None);
    let Command::Fork(a) = parse(&[
        "fork", "--cpus", "0.5", "--memory", "64m", "--pids", "64", "--disk", "1g", "env_01",
    ]) else {
        panic!()
    };
    assert_eq!(
        denv_proto::json::from_struct(&a.resources().unwrap()),
        serde_json::json!({"cpus": "0.5", "memory": "64m", "pids": "64", "disk": "1g"})
    );
    assert_eq!(
        parse(&["snapshot", "env_01"]),
        Command::Snapshot(SnapshotArgs {
            env: sel("env_01"),
            wait: WAIT
        })
    );
    assert_eq!(
        parse(&["verify", "env_01"]),
        Command::Verify(VerifyArgs {
            resume: false,
            env: sel("env_01"),
            wait: WAIT
        })
    );
    let resume = Command::Verify(VerifyArgs {
        resume: true,
        env: sel("env_01"),
        wait: WAIT,
    });
    assert_eq!(parse(&["verify", "--resume", "env_01"]), resume);
    assert_eq!(parse(&["verify", "env_01", "--resume"]), resume);
    assert_eq!(
        parse(&["rollback", "env_01", "ver_01"]),
        Command::Rollback(RollbackArgs {
            env: sel("env_01"),
            version: "ver_01".into(),
            wait: WAIT
        })
    );
    // `--wait` takes its value only with `=`, so it never eats the environment.
    assert_eq!(
        parse(&["snapshot", "--wait", "env_01"]),
        Command::Snapshot(SnapshotArgs {
            env: sel("env_01"),
            wait: WAIT
        })
    );
    usage_error(&["snapshot", "--wait=maybe", "env_01"]);
    usage_error(&["rollback", "env_01"]);
}

#[test]
fn exec() {
    let cmd = |env: &str, service: &str, argv: &[&str]| {
        Command::Exec(ExecArgs {
            service: service.into(),
            timeout: None,
            user: None,
            workdir: None,
            env_vars: vec![],
            input: None,
            stream: false,
            interactive: false,
            env: sel(env),
            cmd: argv.iter().map(|s| s.to_string()).collect(),
        })
    };
    // quickstart, verbatim
    assert_eq!(
        parse(&[
            "exec",
            "--service",
            "box",
            "env_01",
            "--",
            "sh",
            "-c",
            "id -u; echo 42 > /home/agent/answer.txt"
        ]),
        cmd(
            "env_01",
            "box",
            &["sh", "-c", "id -u; echo 42 > /home/agent/answer.txt"]
        )
    );
    // The engine's exec options; flags before the environment, the argv keeps its own.
    let Command::Exec(a) = parse(&[
        "exec",
        "--service",
        "box",
        "-u",
        "1000:1000",
        "--workdir",
        "/srv",
        "-e",
        "A=1",
        "--env",
        "B=2",
        "--input",
        "-",
        "env_01",
        "--",
        "ls",
        "-u",
        "-w",
    ]) else {
        panic!("not exec")
    };
    assert_eq!(a.user.as_deref(), Some("1000:1000"));
    assert_eq!(a.workdir.as_deref(), Some("/srv"));
    assert_eq!(a.env_vars, vec!["A=1", "B=2"]);
    assert_eq!(a.input.as_deref(), Some("-"));
    assert_eq!(a.cmd, vec!["ls", "-u", "-w"]);
    assert_eq!(
        parse(&[
            "exec",
            "--service",
            "db",
            "env_01",
            "--",
            "psql",
            "-U",
            "postgres",
            "-c",
            "create table t(x int); insert into t values (1)"
        ]),
        cmd(
            "env_01",
            "db",
            &[
                "psql",
                "-U",
                "postgres",
                "-c",
                "create table t(x int); insert into t values (1)"
            ]
        )
    );
    assert_eq!(
        parse(&[
            "exec",
            "--service",
            "db",
            "env_02",
            "--",
            "psql",
            "-U",
            "postgres",
            "-tAc",
            "select count(*) from t"
        ]),
        cmd(
            "env_02",
            "db",
            &["psql", "-U", "postgres", "-tAc", "select count(*) from t"]
        )
    );
    // `--` is optional; hyphenated argv words stay in the argv.
    assert_eq!(
        parse(&[
            "exec",
            "--service",
            "box",
            "env_01",
            "ls",
            "-la",
            "--color=never"
        ]),
        cmd("env_01", "box", &["ls", "-la", "--color=never"])
    );
    // flags after the environment, before the argv
    assert_eq!(
        parse(&["exec", "env_01", "--service", "box", "--", "id", "-u"]),
        cmd("env_01", "box", &["id", "-u"])
    );
    // once the argv has started, flag-looking words belong to it
    assert_eq!(
        parse(&[
            "exec",
            "--service",
            "box",
            "env_01",
            "grep",
            "--service",
            "x"
        ]),
        cmd("env_01", "box", &["grep", "--service", "x"])
    );
    assert_eq!(
        parse(&[
            "exec",
            "--timeout",
            "5",
            "--project",
            "q",
            "--service",
            "box",
            "alpha",
            "true"
        ]),
        Command::Exec(ExecArgs {
            service: "box".into(),
            timeout: Some(5),
            user: None,
            workdir: None,
            env_vars: vec![],
            input: None,
            stream: false,
            interactive: false,
            env: EnvSel {
                env: "alpha".into(),
                project: Some("q".into())
            },
            cmd: vec!["true".into()]
        })
    );
    assert_eq!(
        usage_error(&["exec", "--service", "box", "env_01"]),
        clap::error::ErrorKind::MissingRequiredArgument
    );
    assert_eq!(
        usage_error(&["exec", "env_01", "id"]),
        clap::error::ErrorKind::MissingRequiredArgument
    );
}

#[test]
fn files() {
    let put = Command::Files(FilesCmd::Put {
        service: "opsbox".into(),
        env: sel("env_01"),
        local: "./fixtures".into(),
        remote_dir: "/home/ubuntu".into(),
    });
    assert_eq!(
        parse(&[
            "files",
            "put",
            "env_01",
            "--service",
            "opsbox",
            "./fixtures",
            "/home/ubuntu"
        ]),
        put
    );
    assert_eq!(
        parse(&[
            "files",
            "put",
            "--service",
            "opsbox",
            "env_01",
            "./fixtures",
            "/home/ubuntu"
        ]),
        put
    );
    assert_eq!(
        parse(&[
            "files",
            "get",
            "env_01",
            "--service",
            "box",
            "/home/agent/out",
            "./out"
        ]),
        Command::Files(FilesCmd::Get {
            service: "box".into(),
            env: sel("env_01"),
            remote: "/home/agent/out".into(),
            local_dir: "./out".into()
        })
    );
    assert_eq!(
        usage_error(&["files", "get", "env_01", "/a", "./b"]),
        clap::error::ErrorKind::MissingRequiredArgument
    );
}

#[test]
fn deployment_and_events() {
    assert_eq!(
        parse(&["deployment", "get", "dep_01"]),
        Command::Deployment(DeploymentCmd::Get {
            id: "dep_01".into()
        })
    );
    assert_eq!(
        parse(&["deployment", "watch", "dep_01"]),
        Command::Deployment(DeploymentCmd::Watch {
            id: "dep_01".into()
        })
    );
    assert_eq!(
        parse(&["events", "env:env_01"]),
        Command::Events {
            subject: "env:env_01".into()
        }
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(
        usage_error(&["bogus"]),
        clap::error::ErrorKind::InvalidSubcommand
    );
    usage_error(&[]);
    usage_error(&["events"]);
    usage_error(&["whoami", "extra"]);
    usage_error(&["promote", "env_01"]);
}

#[test]
fn import_and_export_parse_as_documented() {
    let common = |out: Option<&str>, no_deploy: bool, wait: WaitFlag| ImportCommon {
        out: out.map(PathBuf::from),
        project: None,
        force: false,
        no_deploy,
        wait,
    };
    assert_eq!(
        parse(&["import", "harbor", "./tasks/fix-backup-cron"]),
        Command::Import(ImportCmd::Harbor {
            common: common(None, false, WAIT),
            dir: "./tasks/fix-backup-cron".into()
        })
    );
    assert_eq!(
        parse(&[
            "import",
            "harbor",
            "t",
            "--out",
            "o",
            "--no-deploy",
            "--wait=false"
        ]),
        Command::Import(ImportCmd::Harbor {
            common: common(Some("o"), true, NO_WAIT),
            dir: "t".into()
        })
    );
    assert!(!parse(&["import", "harbor", "--no-deploy", "t"]).needs_key());
    assert!(parse(&["import", "harbor", "t"]).needs_key());
    assert_eq!(
        parse(&["import", "karotte", "./ops-env"]),
        Command::Import(ImportCmd::Karotte {
            common: common(None, false, WAIT),
            image: None,
            user: "1000:1000".into(),
            dir: "./ops-env".into()
        })
    );
    assert_eq!(
        parse(&["export", "--harbor", "ops-world@ver_01", "./dist"]),
        Command::Export(ExportArgs {
            harbor: true,
            openenv: false,
            source: ".".into(),
            force: false,
            version: "ops-world@ver_01".into(),
            dir: "./dist".into()
        })
    );
    assert_eq!(
        usage_error(&["export", "ops-world@ver_01", "./dist"]),
        clap::error::ErrorKind::MissingRequiredArgument
    );
    assert_eq!(
        usage_error(&["export", "--harbor", "--openenv", "p@v", "d"]),
        clap::error::ErrorKind::ArgumentConflict
    );
    assert_eq!(
        usage_error(&["import", "inspect", "d"]),
        clap::error::ErrorKind::InvalidSubcommand
    );
}

#[test]
fn ca_file_is_a_flag_of_every_command_before_or_after_it() {
    let full = |line: &[&str]| {
        let mut args = vec!["denv"];
        args.extend_from_slice(line);
        Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    };
    let c = full(&["--ca-file", "/etc/denv/ca.pem", "whoami"]);
    assert_eq!(c.ca_file, Some(PathBuf::from("/etc/denv/ca.pem")));
    assert_eq!(c.command, Command::Whoami);
    let c = full(&["project", "list", "--ca-file=ca.pem"]);
    assert_eq!(c.ca_file, Some(PathBuf::from("ca.pem")));
    // Before login's ignored words; after `--` it is the command's own argument.
    let c = full(&[
        "login",
        "--ca-file",
        "ca.pem",
        "--server",
        "https://cp:8443",
    ]);
    assert_eq!(c.ca_file, Some(PathBuf::from("ca.pem")));
    let Command::Login(a) = c.command else {
        panic!()
    };
    assert_eq!(a.server.as_deref(), Some("https://cp:8443"));
    let c = full(&[
        "exec",
        "--service",
        "box",
        "env_1",
        "--",
        "cat",
        "--ca-file",
    ]);
    assert_eq!(c.ca_file, None);
    assert_eq!(full(&["whoami"]).ca_file, None);
}
