//! `env.logs` against the real Docker Engine: what a service's main process wrote to
//! stdout and stderr, as the engine keeps it; the backlog bound (`tail`), the byte cap,
//! timestamps, and a follow that picks up a line written after it started and ends when
//! cancelled, when its reader goes away, and when the environment is destroyed.

mod runtime_support;

use denv_compose::Egress;
use denvd::runtime::{LogsOptions, Runtime};
use runtime_support::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// Writes `script`'s output to the stdout of the service's main process (PID 1), which
/// is what the engine records as the container's log.
async fn to_log(rt: &Runtime, env: &str, service: &str, script: &str) {
    sh(rt, env, service, &format!("({script}) > /proc/1/fd/1")).await;
}

/// Reads a whole non-follow call: `(stdout pieces, stderr pieces, summary)`.
async fn read_all(
    rt: &Runtime,
    env: &str,
    service: &str,
    opts: LogsOptions,
) -> (Vec<String>, Vec<String>, denvd::runtime::LogsSummary) {
    let (tx, mut rx) = mpsc::channel(1024);
    let s = rt
        .logs(env, service, opts, tx, Arc::new(Notify::new()))
        .await
        .expect("logs");
    let (mut out, mut err) = (vec![], vec![]);
    while let Ok((is_err, b)) = rx.try_recv() {
        let t = String::from_utf8(b).unwrap();
        if is_err {
            err.push(t)
        } else {
            out.push(t)
        }
    }
    (out, err, s)
}

fn tail(n: u32) -> LogsOptions {
    LogsOptions {
        tail: n,
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn logs_backlog_caps_timestamps_and_follow() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("logs");
    let _c = Cleanup(vec![env.clone()]);
    let mut web = svc("web", BUSYBOX);
    web.command = argv(&[
        "sh",
        "-c",
        "echo out-1; echo err-1 >&2; sleep 0.3; echo out-2; exec sleep infinity",
    ]);
    let mut other = svc("other", BUSYBOX);
    other.command = argv(&["sh", "-c", "echo other-1; exec sleep infinity"]);
    let sp = spec(vec![other, web], &[], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");

    // The backlog, each line on its own stream with its newline; each service only its own
    // (`out-2` is written 0.3 s after start: wait for it).
    let deadline = Instant::now() + Duration::from_secs(20);
    let (out, err, s) = loop {
        let r = read_all(&rt, &env, "web", tail(100)).await;
        if r.2.lines >= 3 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(out, vec!["out-1\n", "out-2\n"]);
    assert_eq!(err, vec!["err-1\n"]);
    assert_eq!((s.lines, s.bytes, s.truncated), (3, 18, false), "{s:?}");
    let (out, err, _) = read_all(&rt, &env, "other", tail(100)).await;
    assert_eq!((out, err), (vec!["other-1\n".to_string()], vec![]));
    // tail bounds the backlog (the last lines); 0 without follow reads nothing.
    let (out, err, _) = read_all(&rt, &env, "web", tail(1)).await;
    assert_eq!((out, err), (vec!["out-2\n".to_string()], vec![]));
    let (out, err, s) = read_all(&rt, &env, "web", tail(0)).await;
    assert!(out.is_empty() && err.is_empty() && s.lines == 0);

    // Timestamps: the engine's RFC 3339 time, then a space, then the line.
    let (out, _, _) = read_all(
        &rt,
        &env,
        "web",
        LogsOptions {
            tail: 1,
            timestamps: true,
            ..Default::default()
        },
    )
    .await;
    let (ts, rest) = out[0].split_once(' ').unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(ts).is_ok(), "{ts}");
    assert_eq!(rest, "out-2\n");

    // The byte cap: output stops at exactly max_bytes and says it was cut.
    to_log(
        &rt,
        &env,
        "other",
        "i=0; while [ $i -lt 300 ]; do printf '%099d\\n' $i; i=$((i+1)); done",
    )
    .await;
    let (out, _, s) = read_all(
        &rt,
        &env,
        "other",
        LogsOptions {
            tail: 1000,
            max_bytes: 5000,
            ..Default::default()
        },
    )
    .await;
    assert!(s.truncated, "{s:?}");
    assert_eq!(s.bytes, 5000);
    assert_eq!(out.iter().map(String::len).sum::<usize>(), 5000);
    let (_, _, s) = read_all(&rt, &env, "other", tail(1000)).await;
    assert_eq!((s.lines, s.truncated), (301, false), "{s:?}");

    // An unknown service is an error naming it.
    let (tx, _rx) = mpsc::channel(8);
    let e = rt
        .logs(&env, "nope", tail(1), tx, Arc::new(Notify::new()))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("service \"nope\" of {env} not found")
    );

    // Follow: the backlog, then a line written after the follow started; a cancel ends
    // it at once.
    let follow = LogsOptions {
        tail: 1,
        follow: true,
        follow_for: Duration::from_secs(600),
        ..Default::default()
    };
    let (tx, mut rx) = mpsc::channel(64);
    let cancel = Arc::new(Notify::new());
    let task = {
        let (rt, env, cancel, o) = (rt.clone(), env.clone(), cancel.clone(), follow.clone());
        tokio::spawn(async move { rt.logs(&env, "web", o, tx, cancel).await })
    };
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, (false, b"out-2\n".to_vec()));
    to_log(&rt, &env, "web", "echo late-line").await;
    let late = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the late line arrives while following")
        .unwrap();
    assert_eq!(late, (false, b"late-line\n".to_vec()));
    assert!(!task.is_finished(), "still following");
    let t = Instant::now();
    cancel.notify_one();
    let s = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("a cancel ends the follow")
        .unwrap()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!((s.lines, s.truncated), (2, false));

    // A reader that goes away ends it too.
    let (tx, rx) = mpsc::channel(64);
    let task = {
        let (rt, env, o) = (rt.clone(), env.clone(), follow.clone());
        tokio::spawn(async move { rt.logs(&env, "web", o, tx, Arc::new(Notify::new())).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("a closed reader ends the follow")
        .unwrap()
        .unwrap();

    // And a destroy is not held back by a follow: the stream ends with the container.
    let (tx, mut rx) = mpsc::channel(64);
    let task = {
        let (rt, env, o) = (rt.clone(), env.clone(), follow);
        tokio::spawn(async move { rt.logs(&env, "web", o, tx, Arc::new(Notify::new())).await })
    };
    assert!(tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .is_some());
    tokio::time::timeout(Duration::from_secs(120), rt.destroy(&env))
        .await
        .expect("destroy while a follow runs")
        .expect("destroy");
    let r = tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("the follow ends with the container")
        .unwrap();
    // Ended cleanly or with the engine's word that the container went away.
    if let Err(e) = r {
        assert!(e.to_string().contains("logs of service"), "{e}");
    }
    assert!(containers_of(&env).is_empty());
}
