//! A dockerd restart mid-episode (issue 11, "Engine restart"), on a private engine
//! instance so the machine's dockerd and the tests sharing it are never touched: its own
//! `--data-root`, `--exec-root` (so its own containerd), `--pidfile` and unix socket
//! under a temporary directory, no iptables and no default bridge. This file is its own
//! test binary because the runtime finds the engine through `DOCKER_HOST`.
//!
//! Docker 20.10 quirk: a dockerd started with `--bridge=none` on a data root that has
//! been used before deletes the host's `docker0` (the machine's engine then cannot start
//! containers on its default bridge). [`start_dockerd`] puts `docker0` back at once, with
//! the addresses it had, when the private engine removed it.

mod runtime_support;

use denv_compose::{Agent, Egress};
use denvd::runtime::{Runtime, RuntimeConfig};
use runtime_support::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The host's `docker0` addresses (`ip -o -4 addr` lines' CIDRs), `None` when absent.
fn docker0_addrs() -> Option<Vec<String>> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", "docker0"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
            .collect(),
    )
}

/// Recreates the host's `docker0` with `addrs` when it is gone.
fn restore_docker0(addrs: &Option<Vec<String>>) {
    let Some(addrs) = addrs else { return };
    if docker0_addrs().is_some() {
        return;
    }
    let mut cmd = "ip link add docker0 type bridge".to_string();
    for a in addrs {
        cmd += &format!(" && ip addr add {a} dev docker0");
    }
    cmd += " && ip link set docker0 up";
    let ok = Command::new("sh")
        .args(["-c", &cmd])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "could not restore the host's docker0: {cmd}");
}

fn start_dockerd(dir: &Path) -> Child {
    let docker0 = docker0_addrs();
    let sock = dir.join("docker.sock");
    let _ = std::fs::remove_file(&sock);
    let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
    let mut child = Command::new("dockerd")
        .arg("--data-root")
        .arg(dir.join("root"))
        .arg("--exec-root")
        .arg(dir.join("exec"))
        .arg("--pidfile")
        .arg(dir.join("dockerd.pid"))
        .arg("-H")
        .arg(format!("unix://{}", sock.display()))
        .args([
            "--iptables=false",
            "--ip-masq=false",
            "--bridge=none",
            "--containerd-namespace=denvtest",
            "--containerd-plugins-namespace=denvtest-plugins",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("dockerd");
    for _ in 0..120 {
        let ok = Command::new("docker")
            .args(["-H", &format!("unix://{}", sock.display()), "version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            restore_docker0(&docker0);
            return child;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "private dockerd did not answer: {}",
        std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
    );
}

fn stop_dockerd(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    for _ in 0..120 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn dockerd_restart_mid_episode_fails_the_environment() {
    require_docker();
    let dir = tempfile::Builder::new()
        .prefix("denv-dockerd-")
        .tempdir_in("/tmp")
        .unwrap();
    let host = format!("unix://{}", dir.path().join("docker.sock").display());
    let child = start_dockerd(dir.path());
    let load = Command::new("sh")
        .args([
            "-c",
            &format!("docker save {BUSYBOX} | docker -H {host} load"),
        ])
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stderr)
    );
    std::env::set_var("DOCKER_HOST", &host);

    let data = tempfile::Builder::new()
        .prefix("denvd-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let rt = Runtime::new(RuntimeConfig::new(data.path().join("data")))
        .await
        .expect("runtime on the private engine");
    let env = env_id("rst");
    let mut agent = svc("box", BUSYBOX);
    agent.user = "1000:1000".into();
    // Deny: the private engine runs without iptables, so nothing would NAT an allowed
    // network's traffic to the canary; the deny policy is denvd's own nftables table.
    let mut sp = spec(vec![agent, svc("db", BUSYBOX)], &[], Egress::Deny);
    sp.agent = Some(Agent {
        service: "box".into(),
    });
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    let (tx, mut failures) = tokio::sync::mpsc::unbounded_channel();
    let watcher = tokio::spawn(rt.clone().watch_engine(tx));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(failures.try_recv().is_err());

    // The engine restarts under the running episode.
    stop_dockerd(child);
    let child = start_dockerd(dir.path());
    let f = tokio::time::timeout(Duration::from_secs(60), failures.recv())
        .await
        .expect("no failure reported within 60 s of the engine's return")
        .unwrap();
    eprintln!("after the restart: {f:?}");
    assert_eq!(f.env_id, env);
    assert!(f.reason.contains("is not running"), "{}", f.reason);
    assert_eq!(
        rt.recorded_failure(&env).as_deref(),
        Some(f.reason.as_str())
    );
    let (p, _rx) = progress();
    let e = rt
        .verify_collect(&env, "vfy_rst", "box", &argv(&["/tmp"]), false, &p)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("infra error: the agent service \"box\" is not running"),
        "{e}"
    );

    watcher.abort();
    rt.destroy(&env).await.unwrap();
    let _ = Command::new("docker")
        .args(["-H", &host, "network", "prune", "-f"])
        .output();
    stop_dockerd(child);
}
