//! Every failed command carries a `HostErrorCode` naming what kind of failure it is,
//! set from the runtime's typed errors: commands run through the journal and the
//! runtime executor (the path the host stream takes) against the real Docker Engine.

mod runtime_support;

use denv_proto::v1::{
    command, Command, CommandResult, EnvExec, EnvGet, EnvSnapshot, HostErrorCode,
};
use denvd::journal::Journal;
use denvd::stream::RuntimeExecutor;
use runtime_support::*;

fn cmd(id: &str, env: &str, kind: &str, payload: command::Payload) -> Command {
    Command {
        command_id: id.into(),
        kind: kind.into(),
        env_id: env.into(),
        payload: Some(payload),
    }
}

fn exec(argv: &[&str]) -> command::Payload {
    command::Payload::EnvExec(EnvExec {
        service: "box".into(),
        cmd: argv.iter().map(|s| s.to_string()).collect(),
        timeout_sec: 60,
        ..Default::default()
    })
}

fn snapshot(name: &str) -> command::Payload {
    command::Payload::EnvSnapshot(EnvSnapshot {
        name: name.into(),
        keep_paused: vec![],
    })
}

fn get(path: &str) -> command::Payload {
    command::Payload::EnvGet(EnvGet {
        service: "box".into(),
        path: path.into(),
    })
}

/// The failure of `r`: its code and message.
fn failure(r: &CommandResult) -> (HostErrorCode, &str) {
    assert!(!r.ok, "expected a failure: {r:?}");
    (r.code(), r.error.as_str())
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn failed_commands_carry_the_code_of_their_failure() {
    let (rt, tmp) = runtime("dir").await;
    let j = Journal::open(&tmp.path().join("journal")).unwrap();
    let ex = RuntimeExecutor::new(rt.clone());
    let run = |c: Command| {
        let (j, ex) = (&j, &ex);
        async move { j.run(&c, ex, &progress().0).await.into_result() }
    };

    // An environment this host never had: NOT_FOUND, with the message as before.
    let ghost = env_id("ghost");
    let r = run(cmd("cmd_c1", &ghost, "env.exec", exec(&["true"]))).await;
    assert_eq!(
        failure(&r),
        (
            HostErrorCode::NotFound,
            format!("service \"box\" of {ghost} not found").as_str()
        )
    );
    let r = run(cmd("cmd_c2", &ghost, "env.snapshot", snapshot("s1"))).await;
    let (code, msg) = failure(&r);
    assert_eq!(code, HostErrorCode::NotFound, "{msg}");
    assert!(
        msg.starts_with(&format!("environment {ghost} not found on this host")),
        "{msg}"
    );
    // A name the sidecar refuses: INVALID.
    let r = run(cmd("cmd_c3", &ghost, "env.snapshot", snapshot("../s"))).await;
    assert_eq!(
        failure(&r),
        (
            HostErrorCode::Invalid,
            "invalid snapshot name \"../s\" (allowed: letters, digits, _ . : -)"
        )
    );

    let env = env_id("codes");
    let _c = Cleanup(vec![env.clone()]);
    create_box(&rt, &env).await;

    // A snapshot name taken: CONFLICT.
    let r = run(cmd("cmd_c4", &env, "env.snapshot", snapshot("s1"))).await;
    assert!(r.ok, "{}", r.error);
    let r = run(cmd("cmd_c5", &env, "env.snapshot", snapshot("s1"))).await;
    assert_eq!(
        failure(&r),
        (
            HostErrorCode::Conflict,
            format!("snapshot \"s1\" of {env} already exists").as_str()
        )
    );
    // A service the environment lacks: NOT_FOUND.
    let mut other = exec(&["true"]);
    if let command::Payload::EnvExec(x) = &mut other {
        x.service = "web".into();
    }
    let r = run(cmd("cmd_c6", &env, "env.exec", other)).await;
    assert_eq!(failure(&r).0, HostErrorCode::NotFound, "{}", r.error);
    // An exec option the engine would misread: INVALID.
    let mut bad = exec(&["true"]);
    if let command::Payload::EnvExec(x) = &mut bad {
        x.workdir = "relative".into();
    }
    let r = run(cmd("cmd_c7", &env, "env.exec", bad)).await;
    assert_eq!(failure(&r).0, HostErrorCode::Invalid, "{}", r.error);

    // An archive over the 32 MiB of env.get: TOO_LARGE; a missing path is the host's
    // failure (the REST API answers it 502), not NOT_FOUND.
    let r = run(cmd(
        "cmd_c8",
        &env,
        "env.exec",
        exec(&["dd", "if=/dev/zero", "of=/big", "bs=1M", "count=33"]),
    ))
    .await;
    assert!(r.ok, "{}", r.error);
    let r = run(cmd("cmd_c9", &env, "env.get", get("/big"))).await;
    assert_eq!(
        failure(&r),
        (HostErrorCode::TooLarge, "/big: archive larger than 32 MiB")
    );
    let r = run(cmd("cmd_c10", &env, "env.get", get("/nope"))).await;
    assert_eq!(
        failure(&r),
        (
            HostErrorCode::Failed,
            "box: /nope: no such file or directory"
        )
    );

    // The code is journalled with the result: a repeat answers it again.
    let r = run(cmd("cmd_c1", &ghost, "env.exec", exec(&["true"]))).await;
    assert_eq!(failure(&r).0, HostErrorCode::NotFound);

    // A success carries none.
    let r = run(cmd("cmd_c11", &env, "env.exec", exec(&["true"]))).await;
    assert!(r.ok, "{}", r.error);
    assert_eq!(r.code(), HostErrorCode::Unspecified);
    rt.destroy(&env).await.unwrap();
}
