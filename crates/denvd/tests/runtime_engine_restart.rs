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
use denvd::runtime::{bridge_name, container_name, network_name, Runtime, RuntimeConfig};
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

/// One private engine at a time (the tests share the containerd namespace and
/// `DOCKER_HOST`).
static ENGINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A private engine's directory (data root, exec root, socket, pidfile). Dropped, even
/// by a failed assertion: the engine still running there is stopped, and what it left
/// mounted under the directory (dockerd bind-mounts its data root onto itself, and
/// leaves it so after a SIGTERM) is unmounted, so the directory can be removed.
struct EngineDir(tempfile::TempDir);

impl EngineDir {
    fn new() -> Self {
        Self(
            tempfile::Builder::new()
                .prefix("denv-dockerd-")
                .tempdir_in("/tmp")
                .unwrap(),
        )
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for EngineDir {
    fn drop(&mut self) {
        let pidfile = self.path().join("dockerd.pid");
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            for _ in 0..60 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        let prefix = self.path().to_string_lossy().into_owned();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
    }
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
    let _one = ENGINE.lock().await;
    std::env::remove_var("DOCKER_HOST");
    let dir = EngineDir::new();
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
    std::env::remove_var("DOCKER_HOST");
}

/// `docker -H <host> exec <container> sh -c <cmd>`: (exit ok, output, wall ms).
fn exec_in(host: &str, container: &str, cmd: &str) -> (bool, String, u128) {
    let t = std::time::Instant::now();
    let o = Command::new("docker")
        .args(["-H", host, "exec", container, "sh", "-c", cmd])
        .output()
        .unwrap();
    let ms = t.elapsed().as_millis();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), out, ms)
}

/// From inside a denied box: the host's port on the gateway is refused and an outside
/// name does not resolve, both at once (well under the 3 s wget timeout and a resolver's
/// 5 s), plus what each took.
fn assert_denied_at_once(host: &str, container: &str, gw: &str, port: u16, when: &str) {
    let (ok, out, ms) = exec_in(
        host,
        container,
        &format!("wget -q -T 3 -O /dev/null http://{gw}:{port}/"),
    );
    eprintln!("{when}: host port: {out:?} in {ms} ms");
    assert!(!ok && out.contains("refused"), "{when}: host port: {out}");
    assert!(ms < 1500, "{when}: host port took {ms} ms: {out}");
    let (ok, out, ms) = exec_in(host, container, "nslookup denv-egress-test.example.com");
    eprintln!("{when}: outside name: {out:?} in {ms} ms");
    assert!(!ok, "{when}: an outside name resolved: {out}");
    assert!(ms < 1500, "{when}: the lookup took {ms} ms: {out}");
}

/// Whether the packet filter holds the output chain of `bridge` for the runtime whose
/// nftables table is `table` (`denv_<owner>`; on iptables, `DENV_PACKET_FILTER=iptables`,
/// the chain `D<owner>-<h>-O`).
fn has_chain(table: &str, bridge: &str) -> bool {
    let owner = table.strip_prefix("denv_").unwrap();
    let chain = format!("D{owner}-{}-O", bridge.strip_prefix("dv").unwrap());
    let out_chain = format!("env_{bridge}_out");
    let args: Vec<&str> = if std::env::var("DENV_PACKET_FILTER").as_deref() == Ok("iptables") {
        vec!["iptables", "-w", "-S", &chain]
    } else {
        vec!["nft", "list", "chain", "inet", table, &out_chain]
    };
    Command::new(args[0])
        .args(&args[1..])
        .stderr(Stdio::null())
        .output()
        .unwrap()
        .status
        .success()
}

/// The policy is in the kernel, not in denvd: after `kill -9` of denvd (its runtime
/// gone) and a restart of the engine, a denied box whose container runs again is refused
/// the host and the outside at once, before any denvd is back to report health; the
/// restarted runtime then proves it. Meanwhile a denvd on another engine (the machine's)
/// starts and reconciles, and the private engine's rules stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn policy_survives_denvd_kill_and_engine_restart() {
    require_docker();
    let _one = ENGINE.lock().await;
    // The machine's engine for `docker save` (an earlier test may have left its own).
    std::env::remove_var("DOCKER_HOST");
    let dir = EngineDir::new();
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
    let table = rt.nft_table();
    let env = env_id("pkill");
    let mut b = svc("box", BUSYBOX);
    b.command = argv(&["sleep", "3600"]);
    let (p, _rx) = progress();
    rt.create(&env, &spec(vec![b], &[], Egress::Deny), &p)
        .await
        .expect("create");
    let bridge = bridge_name(&env);
    let boxc = container_name(&env, "box");
    let gw = rt
        .docker()
        .inspect_network::<String>(&network_name(&env), None)
        .await
        .unwrap()
        .ipam
        .unwrap()
        .config
        .unwrap()[0]
        .gateway
        .clone()
        .unwrap();
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    assert_denied_at_once(&host, &boxc, &gw, port, "after create");

    // Another denvd, on the machine's engine, starts and reconciles.
    std::env::remove_var("DOCKER_HOST");
    let other_data = tempfile::Builder::new()
        .prefix("denvd-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let other = Runtime::new(RuntimeConfig::new(other_data.path().join("data")))
        .await
        .expect("runtime on the machine's engine");
    assert_ne!(other.nft_table(), table);
    assert!(
        has_chain(&table, &bridge),
        "another denvd's reconcile removed the private engine's rules"
    );
    drop(other);
    std::env::set_var("DOCKER_HOST", &host);

    // denvd dies (its runtime is gone: nothing of it runs), then the engine restarts.
    drop(rt);
    stop_dockerd(child);
    let child = start_dockerd(dir.path());
    assert!(has_chain(&table, &bridge), "the rules did not survive");
    // The box runs again (as a restart policy would start it), with no denvd running.
    let st = Command::new("docker")
        .args(["-H", &host, "start", &boxc])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert_denied_at_once(&host, &boxc, &gw, port, "engine restarted, denvd down");

    // denvd back: its reconcile keeps the rules and the proof holds.
    let rt = Runtime::new(RuntimeConfig::new(data.path().join("data")))
        .await
        .expect("runtime again");
    assert!(has_chain(&table, &bridge));
    let pr = rt.probe_env(&env).await.expect("probe");
    assert_eq!(pr.egress, "denied (verified)");
    assert_denied_at_once(&host, &boxc, &gw, port, "denvd back");

    rt.destroy(&env).await.unwrap();
    assert!(!has_chain(&table, &bridge));
    let _ = Command::new("docker")
        .args(["-H", &host, "network", "prune", "-f"])
        .output();
    stop_dockerd(child);
    std::env::remove_var("DOCKER_HOST");
    drop(listener);
}
