//! verify.collect / verify.run against the real Engine (spec `19-ref-protections.md`
//! §2-3, `13-ref-compose.md` verifier contract).

mod runtime_support;

use bollard::exec::{CreateExecOptions, StartExecResults};
use denv_compose::{Egress, Spec, Verifier};
use denvd::runtime::{container_name, Runtime};
use futures::StreamExt;
use runtime_support::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

const GRADE: &str = "mkdir -p /logs/verifier; touch /logs/verifier/ran; \
    [ \"$(cat /submission/home/agent/answer.txt)\" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt";

fn image_verifier(cmd: &str, timeout_sec: u64) -> Verifier {
    Verifier {
        image: Some(BUSYBOX.into()),
        service: None,
        command: argv(&["sh", "-c", cmd]),
        collect: vec!["/home/agent/answer.txt".into()],
        timeout_sec,
        image_id: String::new(),
    }
}

fn agent_spec() -> Spec {
    let mut agent = svc("box", PYTHON);
    agent.user = "1000:1000".into();
    agent.env.insert("HOME".into(), "/home/agent".into());
    agent.volumes = vec![vol("home", "/home/agent")];
    let mut s = spec(vec![agent], &["home"], Egress::Allow);
    s.agent = Some(denv_compose::Agent {
        service: "box".into(),
    });
    s.verifier = Some(image_verifier(GRADE, 60));
    s
}

/// Collects the agent's submission (it must be accepted), snapshots the environment as
/// `snap` and forks the grader's environment `grader` from it; returns the verify id.
async fn collect_and_fork(
    rt: &Runtime,
    env: &str,
    grader: &str,
    sp: &Spec,
    snap: &str,
    p: &denvd::runtime::Progress,
) -> String {
    let vid = format!("dep_{:08x}", rand::random::<u32>());
    let c = rt
        .verify_collect(
            env,
            &vid,
            "box",
            &sp.verifier.as_ref().unwrap().collect,
            false,
            p,
        )
        .await
        .expect("collect");
    assert!(c.refused.is_empty(), "{c:?}");
    rt.snapshot(env, snap, &["box".to_string()], p)
        .await
        .expect("snapshot");
    rt.fork(grader, env, snap, sp, p)
        .await
        .expect("fork grader");
    vid
}

/// Runs `script` as root in the agent (for setup steps that need root, e.g. mknod).
async fn as_root(rt: &Runtime, env: &str, script: &str) {
    let d = rt.docker();
    let e = d
        .create_exec(
            &container_name(env, "box"),
            CreateExecOptions {
                cmd: Some(argv(&["sh", "-c", script])),
                user: Some("0".to_string()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    if let StartExecResults::Attached { mut output, .. } = d.start_exec(&e.id, None).await.unwrap()
    {
        while output.next().await.is_some() {}
    }
    assert_eq!(
        d.inspect_exec(&e.id).await.unwrap().exit_code,
        Some(0),
        "{script}"
    );
}

async fn paused(rt: &Runtime, env: &str) -> bool {
    rt.docker()
        .inspect_container(&container_name(env, "box"), None)
        .await
        .unwrap()
        .state
        .unwrap()
        .paused
        == Some(true)
}

async fn unpause(rt: &Runtime, env: &str) {
    if paused(rt, env).await {
        rt.docker()
            .unpause_container(&container_name(env, "box"))
            .await
            .unwrap();
    }
}

/// A correct answer scores 1 through the whole flow: collect (agent frozen), snapshot
/// with the agent kept paused, fork, grade on the fork in the verifier image. A
/// background process the agent left behind cannot change the graded copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn correct_answer_scores_one_and_agent_stays_frozen() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("va");
    let grader = format!("{env}-verify-1");
    let _c = Cleanup(vec![env.clone(), grader.clone()]);
    let sp = agent_spec();
    let (p, mut rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    sh(&rt, &env, "box", "echo hello > /home/agent/answer.txt").await;
    // The agent leaves a process that rewrites the answer 3 s later.
    sh(
        &rt,
        &env,
        "box",
        "nohup sh -c 'sleep 3; echo tampered > /home/agent/answer.txt' >/dev/null 2>&1 &",
    )
    .await;
    drain(&mut rx);

    let vid = format!("dep_{:08x}", rand::random::<u32>());
    let c = rt
        .verify_collect(
            &env,
            &vid,
            "box",
            &sp.verifier.as_ref().unwrap().collect,
            false,
            &p,
        )
        .await
        .expect("collect");
    assert_eq!((c.files, c.bytes), (1, 6));
    assert!(c.refused.is_empty() && c.missing.is_empty(), "{c:?}");
    let lines = drain(&mut rx);
    assert_eq!(
        lines[..2],
        ["freezing agent service box", "checking the copy"]
    );
    assert!(paused(&rt, &env).await, "the agent stays paused");

    // The copy: owned by nobody (not the grader's root), read-only, absolute layout,
    // inside root's 0700 verify directory.
    let sub = rt.submission_dir(&vid);
    let m = std::fs::metadata(&sub).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o555);
    assert_eq!((m.uid(), m.gid()), (65534, 65534));
    let top = std::fs::metadata(sub.parent().unwrap()).unwrap();
    assert_eq!((top.uid(), top.permissions().mode() & 0o777), (0, 0o700));
    let ans = sub.join("home/agent/answer.txt");
    let am = std::fs::metadata(&ans).unwrap();
    assert_eq!((am.uid(), am.permissions().mode() & 0o7777), (65534, 0o444));

    let s = rt
        .snapshot(&env, "ver_capture", &["box".to_string()], &p)
        .await
        .expect("snapshot with agent frozen");
    assert!(s.consistent);
    assert!(
        paused(&rt, &env).await,
        "keep_paused keeps the agent frozen"
    );
    // Well past the background writer's wake-up time: it is frozen.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(std::fs::read_to_string(&ans).unwrap(), "hello\n");
    let t = rt.get(&env, "box", "/home/agent/answer.txt").await.unwrap();
    assert_eq!(
        untar_one(&t).1,
        b"hello\n",
        "the agent's own file is untouched too"
    );
    let e = rt
        .exec(&env, "box", &argv(&["true"]), Duration::from_secs(5))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("is paused"), "{e}");
    let e = rt
        .put(&env, "box", "/home/agent", tar_with("x", b"x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("is paused"), "{e}");

    rt.fork(&grader, &env, "ver_capture", &sp, &p)
        .await
        .expect("fork grader");
    let r = rt
        .verify_run(&grader, &vid, sp.verifier.as_ref().unwrap(), false, &p)
        .await
        .expect("run");
    assert_eq!(r.reward, Some(1.0));
    assert_eq!(r.source, "reward.txt");
    assert_eq!(r.exit_code, 0);
    assert!(rt
        .data_dir()
        .join("verify")
        .join(&vid)
        .join("logs/ran")
        .exists());
    assert!(drain(&mut rx)
        .iter()
        .any(|l| l == "grading in busybox:1.36"));

    // A service verifier inside the fork, reward on stdout.
    let sv = Verifier {
        image: None,
        service: Some("box".into()),
        command: argv(&[
            "sh",
            "-c",
            "id -u; stat -c '%A %u' /submission; [ \"$(cat $SUBMISSION/home/agent/answer.txt)\" = hello ] && echo 1 || echo 0",
        ]),
        collect: vec![],
        timeout_sec: 60,
        image_id: String::new(),
    };
    let r = rt
        .verify_run(&grader, &vid, &sv, false, &p)
        .await
        .expect("service run");
    assert_eq!((r.reward, r.source.as_str()), (Some(1.0), "stdout"));
    assert!(
        r.stdout.starts_with("0\ndr-xr-xr-x 65534\n"),
        "runs as root over a read-only copy owned by nobody: {}",
        r.stdout
    );
    assert!(drain(&mut rx)
        .iter()
        .any(|l| l == "grading inside service box"));

    // Timeout and no reward.
    let e = rt
        .verify_run(&grader, &vid, &image_verifier("sleep 30", 2), false, &p)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "verifier timed out after 2s");
    let e = rt
        .verify_run(
            &grader,
            &vid,
            &image_verifier("echo no reward here; exit 3", 30),
            false,
            &p,
        )
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "verifier wrote no reward (exit 3)");
    rt.destroy(&grader).await.unwrap();
    rt.destroy(&env).await.unwrap();
    assert!(containers_of(&grader).is_empty() && containers_of(&env).is_empty());
}

/// Every weird answer is refused before anything is written, and the grader never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn weird_answers_are_refused_and_grader_never_runs() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("vr");
    let _c = Cleanup(vec![env.clone()]);
    let sp = agent_spec();
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    sh(&rt, &env, "box", "echo hello > /home/agent/answer.txt").await;

    let deep: String = (1..=33).map(|i| format!("/{i}")).collect();
    let cases: Vec<(&str, String, &str, String)> = vec![
        ("symlink", "ln -s /etc/passwd /home/agent/sym.txt".into(), "/home/agent/sym.txt", "home/agent/sym.txt: symlink".into()),
        ("symlink in a tree", "mkdir -p /home/agent/t && echo a > /home/agent/t/a && ln -s a /home/agent/t/b".into(), "/home/agent/t", "home/agent/t/b: symlink".into()),
        ("hard link", "mkdir -p /home/agent/hl && echo x > /home/agent/other && ln /home/agent/other /home/agent/hl/answer.txt".into(), "/home/agent/hl", "home/agent/hl/answer.txt: hard link".into()),
        ("fifo", "mkfifo /home/agent/fifo.txt".into(), "/home/agent/fifo.txt", "home/agent/fifo.txt: fifo".into()),
        ("socket", "python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"/home/agent/sock\")'".into(), "/home/agent/sock", "home/agent/sock: socket".into()),
        ("socket in a tree", "mkdir -p /home/agent/st && echo a > /home/agent/st/a && python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind(\"/home/agent/st/s\")'".into(), "/home/agent/st", "home/agent/st/s: socket".into()),
        // The agent container has no MKNOD capability even for root (containment), so the
        // device node is planted from the host, in the volume's dataset.
        ("device", "HOST:mknod {vol}/dev c 1 3".into(), "/home/agent/dev", "home/agent/dev: device".into()),
        ("33 levels", format!("mkdir -p /home/agent/deep{deep}"), "/home/agent/deep", format!("home/agent/deep{deep}: deeper than 32")),
        ("20001 files", "mkdir -p /home/agent/many && cd /home/agent/many && python3 -c 'for i in range(20001): open(f\"f{i}\", \"w\").close()'".into(), "/home/agent/many", "home/agent/many: more than 20000 files".into()),
    ];
    for (what, setup, path, want) in cases {
        unpause(&rt, &env).await;
        if let Some(s) = setup.strip_prefix("ROOT:") {
            as_root(&rt, &env, s).await;
        } else if let Some(s) = setup.strip_prefix("HOST:") {
            let vol = rt.data_dir().join("envs").join(&env).join("vol/home");
            let cmd = s.replace("{vol}", &vol.display().to_string());
            let st = std::process::Command::new("sh")
                .args(["-c", &cmd])
                .status()
                .unwrap();
            assert!(st.success(), "{cmd}");
        } else {
            sh(&rt, &env, "box", &setup).await;
        }
        let vid = format!("dep_{:08x}", rand::random::<u32>());
        let c = rt
            .verify_collect(
                &env,
                &vid,
                "box",
                &[
                    "/home/agent/answer.txt".to_string(),
                    path.to_string(),
                    "/home/agent/absent".to_string(),
                ],
                false,
                &p,
            )
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(c.refused, vec![want], "{what}");
        assert_eq!(c.missing, vec!["/home/agent/absent".to_string()], "{what}");
        assert_eq!((c.files, c.bytes), (0, 0), "{what}");
        assert!(!rt.submission_dir(&vid).exists(), "{what}: nothing written");
        assert!(paused(&rt, &env).await, "{what}: agent paused");
        let r = rt
            .verify_run(&env, &vid, sp.verifier.as_ref().unwrap(), true, &p)
            .await
            .unwrap();
        assert_eq!(
            (r.reward, r.source.as_str()),
            (Some(0.0), "refused"),
            "{what}"
        );
        assert!(
            !rt.data_dir()
                .join("verify")
                .join(&vid)
                .join("logs/ran")
                .exists(),
            "{what}: grader ran"
        );
    }
    // A missing path alone is not a refusal.
    let vid = format!("dep_{:08x}", rand::random::<u32>());
    let c = rt
        .verify_collect(
            &env,
            &vid,
            "box",
            &["/home/agent/nothing".to_string()],
            false,
            &p,
        )
        .await
        .unwrap();
    assert!(c.refused.is_empty());
    assert_eq!(c.missing, vec!["/home/agent/nothing".to_string()]);
    assert!(rt.submission_dir(&vid).is_dir());
    rt.destroy(&env).await.unwrap();
}

/// The grader's context is not the agent's: a service verifier runs with a clean
/// environment (none of the agent service's `LD_PRELOAD`, `PYTHONPATH`, `HOME`, `ENV`,
/// `GIT_*`) in `/`, so the agent's `sitecustomize.py` and shell rc never run, over a
/// copy owned by nobody (so tools keep their "owned by someone else" checks); an image
/// verifier gets a fresh, empty, root-owned `/logs/verifier` on every run whatever a
/// previous run left there; a grader killed from outside is an infra error, not a 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn grader_context_is_clean_and_a_killed_grader_is_an_infra_error() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("vc");
    let grader = format!("{env}-verify-1");
    let _c = Cleanup(vec![env.clone(), grader.clone()]);
    let mut sp = agent_spec();
    let agent = &mut sp.services[0];
    for (k, v) in [
        ("LD_PRELOAD", "/home/agent/evil.so"),
        ("PYTHONPATH", "/home/agent/py"),
        ("PYTHONSTARTUP", "/home/agent/py/start.py"),
        ("ENV", "/home/agent/.shrc"),
        ("BASH_ENV", "/home/agent/.shrc"),
        ("GIT_DIR", "/home/agent/repo/.git"),
        ("PATH", "/home/agent/bin:/usr/local/bin:/usr/bin:/bin"),
    ] {
        agent.env.insert(k.into(), v.into());
    }
    sp.verifier.as_mut().unwrap().collect =
        vec!["/home/agent/answer.txt".into(), "/home/agent/repo".into()];
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    sh(
        &rt,
        &env,
        "box",
        "set -e; cd /home/agent; echo hello > answer.txt; mkdir -p py bin repo/.git; \
         echo 'print(\"PWNED-site\")' > py/sitecustomize.py; \
         echo 'echo PWNED-rc' > .shrc; \
         printf '#!/bin/sh\\necho PWNED-path\\n' > bin/python3; chmod +x bin/python3; \
         printf '[core]\\n\\tfsmonitor = \"echo PWNED-git >&2; false\"\\n' > repo/.git/config",
    )
    .await;
    let vid = collect_and_fork(&rt, &env, &grader, &sp, "ver_ctx", &p).await;

    // Service verifier inside the fork's copy of the agent's own service.
    let sv = Verifier {
        image: None,
        service: Some("box".into()),
        command: argv(&[
            "python3",
            "-c",
            "import os; print(sorted(os.environ)); print(os.getcwd()); \
             print(os.stat('/submission/home/agent/repo/.git/config').st_uid); \
             print(oct(os.stat('/logs/verifier').st_mode & 0o7777), os.stat('/logs/verifier').st_uid, os.listdir('/logs/verifier')); \
             print(1)",
        ]),
        collect: vec![],
        timeout_sec: 60,
        image_id: String::new(),
    };
    let r = rt
        .verify_run(&grader, &vid, &sv, false, &p)
        .await
        .expect("service run");
    assert_eq!(
        r.stdout,
        "['DENV_VERIFY_ID', 'HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'PYTHONNOUSERSITE', 'SUBMISSION']\n/\n65534\n0o755 0 []\n1\n",
        "stderr: {}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("PWNED") && !r.stderr.contains("LD_PRELOAD"),
        "{}",
        r.stderr
    );
    assert_eq!((r.reward, r.source.as_str()), (Some(1.0), "stdout"));

    // Image verifier: the first run leaves a symlink and a file in /logs/verifier; the
    // next run starts from a fresh, empty, root-owned directory.
    let dirty = image_verifier(
        "ln -s / /logs/verifier/evil; mkdir /logs/verifier/reward.txt.d; echo 1 > /logs/verifier/reward.txt",
        30,
    );
    let r = rt
        .verify_run(&grader, &vid, &dirty, false, &p)
        .await
        .unwrap();
    assert_eq!((r.reward, r.source.as_str()), (Some(1.0), "reward.txt"));
    let check = image_verifier(
        "[ -z \"$(ls -A /logs/verifier)\" ] && [ \"$(stat -c '%u %a' /logs/verifier)\" = '0 755' ] \
         && echo 0.5 > /logs/verifier/reward.txt",
        30,
    );
    let r = rt
        .verify_run(&grader, &vid, &check, false, &p)
        .await
        .unwrap();
    assert_eq!((r.reward, r.source.as_str()), (Some(0.5), "reward.txt"));

    // A grader killed from outside (host trouble, the OOM killer): an infra error.
    let name_filter = format!("label=denv.env={grader}");
    let killer = tokio::spawn(async move {
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let out = std::process::Command::new("docker")
                .args([
                    "ps",
                    "-q",
                    "--filter",
                    &name_filter,
                    "--filter",
                    "label=denv.verifier=true",
                ])
                .output()
                .unwrap();
            let ids = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !ids.is_empty() {
                std::process::Command::new("docker")
                    .args(["kill", "--signal", "KILL", &ids])
                    .output()
                    .unwrap();
                return;
            }
        }
    });
    let e = rt
        .verify_run(
            &grader,
            &vid,
            &image_verifier("echo 1 > /logs/verifier/reward.txt; sleep 30", 60),
            false,
            &p,
        )
        .await
        .unwrap_err()
        .to_string();
    killer.await.unwrap();
    assert_eq!(
        e,
        "infra error: the verifier was killed (SIGKILL); the episode was not graded"
    );
    rt.destroy(&grader).await.unwrap();
    rt.destroy(&env).await.unwrap();
}

/// Exactly-once grading: when denvd stops waiting for a grader (it died during
/// `verify.run`; here the call is dropped) and the same verify is run again, the image
/// grader that is still running is adopted and its result used, never started twice;
/// a service grader's earlier processes are killed before the new one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_grader_interrupted_by_a_restart_is_adopted_or_killed_never_doubled() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("ve");
    let grader = format!("{env}-verify-1");
    let _c = Cleanup(vec![env.clone(), grader.clone()]);
    let sp = agent_spec();
    let (p, mut rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    sh(&rt, &env, "box", "echo hello > /home/agent/answer.txt").await;
    let vid = format!("dep_{:08x}", rand::random::<u32>());
    rt.verify_collect(
        &env,
        &vid,
        "box",
        &sp.verifier.as_ref().unwrap().collect,
        false,
        &p,
    )
    .await
    .expect("collect");
    rt.snapshot(&env, "ver_once", &["box".to_string()], &p)
        .await
        .expect("snapshot");
    rt.fork(&grader, &env, "ver_once", &sp, &p)
        .await
        .expect("fork grader");
    let labelled = |vid: &str| {
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=denv.verify={vid}")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .count()
    };

    // Image grader: the first call is dropped mid-run, the grader keeps running.
    let slow = image_verifier(
        "echo run >> /logs/verifier/runs; sleep 4; echo 1 > /logs/verifier/reward.txt",
        60,
    );
    let first = {
        let (rt, grader, vid, slow, p) = (
            rt.clone(),
            grader.clone(),
            vid.clone(),
            slow.clone(),
            p.clone(),
        );
        tokio::spawn(async move { rt.verify_run(&grader, &vid, &slow, false, &p).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.abort();
    let _ = first.await;
    assert_eq!(labelled(&vid), 1, "the first grader is still there");
    drain(&mut rx);
    let r = rt
        .verify_run(&grader, &vid, &slow, false, &p)
        .await
        .expect("adopted");
    assert_eq!((r.reward, r.source.as_str()), (Some(1.0), "reward.txt"));
    let logs = rt.data_dir().join("verify").join(&vid).join("logs");
    assert_eq!(
        std::fs::read_to_string(logs.join("runs")).unwrap(),
        "run\n",
        "ran once"
    );
    assert!(
        drain(&mut rx)
            .iter()
            .any(|l| l.starts_with("adopting the grader ")
                && l.ends_with(" started before a restart"))
    );
    assert_eq!(labelled(&vid), 0, "removed after the verdict");

    // Service grader: the first exec is dropped mid-run; the next run kills it first.
    let svc = |cmd: &str| Verifier {
        image: None,
        service: Some("box".into()),
        command: argv(&["sh", "-c", cmd]),
        collect: vec![],
        timeout_sec: 60,
        image_id: String::new(),
    };
    let first = {
        let (rt, grader, vid, p) = (rt.clone(), grader.clone(), vid.clone(), p.clone());
        let v = svc("echo run >> /tmp/runs; sleep 30; echo 1");
        tokio::spawn(async move { rt.verify_run(&grader, &vid, &v, false, &p).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.abort();
    let _ = first.await;
    drain(&mut rx);
    let r = rt
        .verify_run(
            &grader,
            &vid,
            &svc("python3 -c \"import os; print(sum(1 for q in os.listdir('/proc') if q.isdigit() and open(f'/proc/{q}/cmdline','rb').read() == b'sleep\\x0030\\x00'))\"; cat /tmp/runs; echo 1"),
            false,
            &p,
        )
        .await
        .expect("second run");
    assert_eq!(r.stdout, "0\nrun\n1\n", "{}", r.stderr);
    assert!(drain(&mut rx)
        .iter()
        .any(|l| l == "killed 2 process(es) of a grader started before a restart"));
    rt.destroy(&grader).await.unwrap();
    rt.destroy(&env).await.unwrap();
}

/// Infra errors the agent cannot cause are never a 0: a verifier image that is not on
/// the host (and cannot be pulled: this machine reaches no registry) and a grader the
/// OOM killer stops inside its service's memory cap both fail `verify.run`, which the
/// control plane records as `reward: null`, `source: error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_missing_grader_image_and_an_oom_killed_grader_are_infra_errors() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("vi");
    let grader = format!("{env}-verify-1");
    let _c = Cleanup(vec![env.clone(), grader.clone()]);
    let mut sp = agent_spec();
    sp.services[0].resources.memory_mb = 64;
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    sh(&rt, &env, "box", "echo hello > /home/agent/answer.txt").await;
    let vid = collect_and_fork(&rt, &env, &grader, &sp, "ver_inf", &p).await;

    let mut missing = image_verifier("echo 1 > /logs/verifier/reward.txt", 60);
    missing.image = Some("denv-test/no-such-grader:0".into());
    let e = rt
        .verify_run(&grader, &vid, &missing, false, &p)
        .await
        .expect_err("a missing grader image is an error, never a reward");
    assert!(
        e.to_string().contains("denv-test/no-such-grader:0"),
        "the error names the image: {e}"
    );

    // 256 MiB in a 64 MiB service: the kernel's OOM killer ends the grader.
    let hog = Verifier {
        image: None,
        service: Some("box".into()),
        command: argv(&["python3", "-c", "b = bytearray(256 << 20); print(1)"]),
        collect: vec![],
        timeout_sec: 60,
        image_id: String::new(),
    };
    let e = rt
        .verify_run(&grader, &vid, &hog, false, &p)
        .await
        .expect_err("an OOM-killed grader is an infra error, never a 0");
    assert!(
        e.to_string()
            .starts_with("infra error: the verifier was killed"),
        "{e}"
    );
    rt.destroy(&grader).await.unwrap();
    rt.destroy(&env).await.unwrap();
}
