//! `env.exec` with a user, a working directory, an environment and stdin, through the
//! engine's own exec options, against the real Docker Engine; output caps reported in
//! fields. Written as the attacker would: user strings that try to carry more than a
//! user, working directories through symlinks and `..`, stdin the command never reads.

mod runtime_support;

use denv_compose::{Agent, Egress};
use denvd::runtime::{ExecOptions, ExecResult, Runtime};
use runtime_support::*;
use std::time::{Duration, Instant};

async fn run(rt: &Runtime, env: &str, script: &str, o: ExecOptions) -> ExecResult {
    rt.exec_with(
        env,
        "box",
        &argv(&["sh", "-c", script]),
        o,
        Duration::from_secs(30),
    )
    .await
    .unwrap_or_else(|e| panic!("exec {script:?}: {e}"))
}

fn user(u: &str) -> ExecOptions {
    ExecOptions {
        user: Some(u.into()),
        ..Default::default()
    }
}

fn workdir(w: &str) -> ExecOptions {
    ExecOptions {
        workdir: Some(w.into()),
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn exec_user_workdir_env_stdin_and_caps() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("exec");
    let _c = Cleanup(vec![env.clone()]);
    // An agent service: uid 1000, no capabilities, no new privileges.
    let mut agent = svc("box", BUSYBOX);
    agent.user = "1000:1000".into();
    let mut sp = spec(vec![agent], &[], Egress::Deny);
    sp.agent = Some(Agent {
        service: "box".into(),
    });
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");

    // The default stays the service's non-root user.
    let r = run(&rt, &env, "id -u; id -g", ExecOptions::default()).await;
    assert_eq!(r.stdout, "1000\n1000\n", "{r:?}");
    // Only an explicit user changes it: root by name and by uid, nobody by name.
    for (u, want) in [
        ("root", "0\n"),
        ("0", "0\n"),
        ("0:0", "0\n"),
        ("nobody", "65534\n"),
        ("1234:4321", "1234\n"),
    ] {
        let r = run(&rt, &env, "id -u", user(u)).await;
        assert_eq!(
            (r.exit_code, r.stdout.as_str()),
            (0, want),
            "user {u}: {r:?}"
        );
    }
    let r = run(&rt, &env, "id -g", user("1234:4321")).await;
    assert_eq!(r.stdout, "4321\n");
    // root in the agent's container is uid 0 without capabilities (the container's set).
    let r = run(&rt, &env, "grep CapEff /proc/self/status", user("root")).await;
    assert!(r.stdout.contains("0000000000000000"), "{r:?}");

    // A user string is one user and nothing else: refused before the engine sees it.
    for bad in [
        "root; id",
        "0 -u",
        "$(id -u)",
        "`id`",
        "a:b:c",
        "-1",
        "root\n",
        "ro ot",
        "root\0",
        ":",
        "x:",
        &"a".repeat(65),
    ] {
        let e = rt
            .exec_with(
                &env,
                "box",
                &argv(&["touch", "/tmp/pwned"]),
                user(bad),
                Duration::from_secs(10),
            )
            .await
            .expect_err(bad);
        assert!(e.to_string().contains("is not a user"), "{bad:?}: {e}");
    }
    let r = run(
        &rt,
        &env,
        "test -e /tmp/pwned && echo yes || echo no",
        user("root"),
    )
    .await;
    assert_eq!(r.stdout, "no\n");
    // A user the image does not know is the engine's error, as `docker exec` shows it.
    let r = rt
        .exec_with(
            &env,
            "box",
            &argv(&["id"]),
            user("nosuchuser"),
            Duration::from_secs(10),
        )
        .await;
    // Exactly what `docker exec` answers: exit 126 and the engine's message.
    let r = r.unwrap();
    assert_eq!(r.exit_code, 126, "{r:?}");
    assert!(r.stdout.contains("unable to find user nosuchuser"), "{r:?}");

    // Working directory: as given, resolved by the container (symlinks, `..`).
    let r = run(&rt, &env, "pwd -P", workdir("/tmp")).await;
    assert_eq!(r.stdout, "/tmp\n");
    let r = run(&rt, &env, "pwd -P", workdir("/tmp/../etc")).await;
    assert_eq!(r.stdout, "/etc\n");
    run(&rt, &env, "ln -s /etc /tmp/link", ExecOptions::default()).await;
    let r = run(&rt, &env, "pwd -P", workdir("/tmp/link")).await;
    assert_eq!(r.stdout, "/etc\n");
    for bad in ["tmp", "./tmp", "", "/tmp\0x"] {
        if bad.is_empty() {
            continue;
        }
        let e = rt
            .exec_with(
                &env,
                "box",
                &argv(&["pwd"]),
                workdir(bad),
                Duration::from_secs(10),
            )
            .await
            .expect_err(bad);
        assert!(e.to_string().contains("absolute path"), "{bad:?}: {e}");
    }
    // A missing directory: the engine refuses to start the command.
    let r = rt
        .exec_with(
            &env,
            "box",
            &argv(&["pwd"]),
            workdir("/no/such/dir"),
            Duration::from_secs(10),
        )
        .await;
    let r = r.unwrap();
    assert_eq!(r.exit_code, 126, "{r:?}");
    assert!(r.stdout.contains("chdir to cwd"), "{r:?}");
    // User and working directory together: root may enter /root, uid 1000 may not.
    let both = ExecOptions {
        user: Some("root".into()),
        workdir: Some("/root".into()),
        ..Default::default()
    };
    let r = run(&rt, &env, "id -u; pwd", both).await;
    assert_eq!(r.stdout, "0\n/root\n", "{r:?}");

    // Environment variables, values passed verbatim (no shell in between).
    let o = ExecOptions {
        env: vec!["FOO=bar baz $(id)".into(), "EMPTY=".into()],
        ..Default::default()
    };
    let r = run(&rt, &env, "printf '%s|%s|' \"$FOO\" \"${EMPTY-unset}\"", o).await;
    assert_eq!(r.stdout, "bar baz $(id)||");
    for bad in ["=x", "NOEQUALS", "A\0B=1"] {
        let o = ExecOptions {
            env: vec![bad.into()],
            ..Default::default()
        };
        let e = rt
            .exec_with(&env, "box", &argv(&["true"]), o, Duration::from_secs(10))
            .await
            .expect_err(bad);
        assert!(e.to_string().contains("environment variable"), "{e}");
    }

    // stdin: bytes in, then end of file; large input; input the command never reads.
    let o = ExecOptions {
        stdin: Some(b"line one\nline two\n".to_vec()),
        ..Default::default()
    };
    let r = run(&rt, &env, "cat; echo done", o).await;
    assert_eq!(r.stdout, "line one\nline two\ndone\n");
    let big = vec![b'x'; 6 << 20];
    let o = ExecOptions {
        stdin: Some(big),
        ..Default::default()
    };
    let r = run(&rt, &env, "wc -c", o).await;
    assert_eq!(r.stdout.trim(), (6u32 << 20).to_string());
    let r = run(
        &rt,
        &env,
        "read x; echo no input: $?",
        ExecOptions::default(),
    )
    .await;
    assert_eq!(
        r.stdout, "no input: 1\n",
        "stdin without input is at end of file"
    );
    let o = ExecOptions {
        stdin: Some(vec![b'y'; 8 << 20]),
        ..Default::default()
    };
    let t = Instant::now();
    let r = run(&rt, &env, "exit 7", o).await;
    assert_eq!(r.exit_code, 7, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(20));
    let o = ExecOptions {
        stdin: Some(vec![b'z'; 8 << 20]),
        ..Default::default()
    };
    let t = Instant::now();
    let r = rt
        .exec_with(
            &env,
            "box",
            &argv(&["sleep", "100"]),
            o,
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert!(r.timed_out && r.exit_code == 124, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(r.stderr.ends_with("denvd: command timed out after 3s"));

    // Output caps are fields, not text: exactly 4 MiB is whole, one byte more is cut.
    let r = run(
        &rt,
        &env,
        "head -c 4194304 /dev/zero | tr '\\0' a",
        ExecOptions::default(),
    )
    .await;
    assert_eq!(r.stdout.len(), 4 << 20);
    assert!(!r.stdout_truncated && !r.stderr_truncated && !r.timed_out);
    let r = run(
        &rt,
        &env,
        "head -c 5000000 /dev/zero | tr '\\0' a; head -c 4194305 /dev/zero | tr '\\0' b >&2",
        ExecOptions::default(),
    )
    .await;
    assert_eq!(r.stdout.len(), 4 << 20);
    assert!(r.stdout.bytes().all(|b| b == b'a'), "no marker in the text");
    assert_eq!(r.stderr.len(), 4 << 20);
    assert!(r.stderr.bytes().all(|b| b == b'b'));
    assert!(r.stdout_truncated && r.stderr_truncated, "{}", r.exit_code);
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn exec_output_streams_as_it_is_written_without_a_cap() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("exs");
    let _c = Cleanup(vec![env.clone()]);
    let sp = spec(vec![svc("box", BUSYBOX)], &[], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");

    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let o = ExecOptions {
        output: Some(tx),
        stdin: Some(b"piped\n".to_vec()),
        ..Default::default()
    };
    let rt2 = rt.clone();
    let env2 = env.clone();
    let t = Instant::now();
    let run = tokio::spawn(async move {
        rt2.exec_with(
            &env2,
            "box",
            &argv(&[
                "sh",
                "-c",
                "echo first; sleep 2; echo second >&2; cat; head -c 5000000 /dev/zero",
            ]),
            o,
            Duration::from_secs(30),
        )
        .await
    });
    // The first piece arrives long before the command ends.
    let (is_err, first) = rx.recv().await.unwrap();
    assert_eq!((is_err, first.as_slice()), (false, &b"first\n"[..]));
    assert!(
        t.elapsed() < Duration::from_millis(1800),
        "{:?}",
        t.elapsed()
    );
    let (mut out, mut err) = (first, Vec::new());
    while let Some((is_err, b)) = rx.recv().await {
        if is_err {
            err.extend(b);
        } else {
            out.extend(b);
        }
    }
    let r = run.await.unwrap().unwrap();
    assert!(t.elapsed() >= Duration::from_secs(2));
    assert_eq!(err, b"second\n");
    assert_eq!(
        out.len(),
        "first\npiped\n".len() + 5_000_000,
        "no 4 MiB cap"
    );
    assert!(out.starts_with(b"first\npiped\n"));
    assert_eq!(r.exit_code, 0);
    assert!(r.stdout.is_empty() && r.stderr.is_empty() && !r.stdout_truncated);
}
