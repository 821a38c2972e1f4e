//! Forks of one version on any host (`docs/reference/targets.md`, "Forks on any host"):
//! the real `denv-cp` binary (SQLite in a temp dir) and two real `denvd` processes (dir
//! storage, each its own data directory) on the machine's one Docker engine. A fork
//! placed on the host without the snapshot gets it shipped host to host, from the first
//! sidecar's data port (`snapshot.send` / `snapshot.receive`), once per host.

use denv_testkit::{phase, CpBinary, Denvd, Start};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const KEY: &str = "dak_ship_test_0123456789abcdef";

const COMPOSE: &str = r#"
services:
  box:
    image: busybox:1.36
    command: ["sleep", "1000000"]
    volumes: ["w:/work"]
volumes: { w: {} }
"#;

struct Cp(CpBinary);

impl std::ops::Deref for Cp {
    type Target = CpBinary;
    fn deref(&self) -> &CpBinary {
        &self.0
    }
}

impl Cp {
    async fn get_ok(&self, path: &str) -> Value {
        let (s, v) = self.0.get(path).await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    async fn wait_ok(&self, dep: &Value) -> Value {
        let id = dep["ID"]
            .as_str()
            .or_else(|| dep["deployment"]["ID"].as_str())
            .unwrap_or_else(|| panic!("no deployment id in {dep}"));
        let d = self.0.wait_for(id, Duration::from_secs(300)).await;
        assert_eq!(d["deployment"]["Status"], "succeeded", "{d:#}");
        d
    }

    async fn exec(&self, env: &str, cmd: &[&str]) -> Value {
        let (s, o) = self
            .post(
                &format!("/v1/envs/{env}/exec"),
                json!({"service": "box", "cmd": cmd}),
            )
            .await;
        assert_eq!(s, 200, "{o}");
        o
    }

    async fn fork(&self, env: &str, version: &str) -> Value {
        let (s, d) = self
            .post(&format!("/v1/envs/{env}/fork"), json!({"version": version}))
            .await;
        assert_eq!(s, 202, "{d}");
        d
    }

    /// The ids of the connected hosts, once `n` are.
    async fn hosts(&self, n: usize) -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let h = self.get_ok("/v1/hosts").await;
            let ids: Vec<String> = h["hosts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|h| h["connected"] == true)
                .map(|h| h["id"].as_str().or(h["ID"].as_str()).unwrap().to_string())
                .collect();
            if ids.len() == n {
                return ids;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "hosts: {h}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// On a failed assertion, removes the containers and networks the test's two sidecars
/// made (labelled with their data directories), so a failure leaves nothing running on
/// the machine's engine.
struct Leftovers(Vec<std::path::PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for d in &self.0 {
            let label = format!("label=denv.data={}", d.join("data").display());
            for (list, rm) in [
                (&["ps", "-aq"][..], &["rm", "-f"][..]),
                (&["network", "ls", "-q"][..], &["network", "rm"][..]),
            ] {
                let Ok(o) = std::process::Command::new("docker")
                    .args(list)
                    .args(["--filter", &label])
                    .output()
                else {
                    continue;
                };
                for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = std::process::Command::new("docker")
                        .args(rm)
                        .arg(id)
                        .output();
                }
            }
        }
    }
}

/// Snapshot directories of `env` under a sidecar's data directory (staging ones
/// included, the `.received` mark left out).
fn snapshots(dir: &Path, env: &str) -> Vec<String> {
    std::fs::read_dir(dir.join("data/snaps").join(env))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs Docker with busybox:1.36 (runs two real denvd)"]
async fn forks_land_on_the_other_host_with_the_snapshot_shipped_once() {
    denv_testkit::require_docker();
    let tmp = tempfile::Builder::new()
        .prefix("denv-ship-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let dir = tmp.path();
    let dsn = dir.join("cp.db").display().to_string();
    let cp =
        Cp(CpBinary::start(Start::in_dir(env!("CARGO_BIN_EXE_denv-cp"), &dsn, dir).key(KEY)).await);
    let (d1, d2) = (dir.join("h1"), dir.join("h2"));
    std::fs::create_dir_all(&d1).unwrap();
    std::fs::create_dir_all(&d2).unwrap();
    // Dropped after the sidecars (declared before them).
    let _leftovers = Leftovers(vec![d1.clone(), d2.clone()]);
    let _h1 = Denvd::join(&cp.url, &cp.join_token().await, &d1);
    let host1 = cp.hosts(1).await.remove(0);

    // The owner lives on host 1 (the only host then), with data in its volume.
    cp.project("shipping").await;
    let dep = cp.deploy("shipping", "owner", COMPOSE).await;
    let dep = cp.wait_ok(&dep).await;
    let owner = dep["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(
        cp.get_ok(&format!("/v1/envs/{owner}")).await["environment"]["HostID"],
        host1
    );
    cp.exec(
        &owner,
        &["sh", "-c", "echo shipped-data > /work/f && head -c 3000000 /dev/urandom > /work/blob && ln -s f /work/link && md5sum /work/blob > /work/blob.md5"],
    )
    .await;
    let (s, snap) = cp
        .post(&format!("/v1/envs/{owner}/snapshot"), json!({}))
        .await;
    assert_eq!(s, 202, "{snap}");
    let snap = cp.wait_ok(&snap).await;
    let version = snap["deployment"]["VersionID"]
        .as_str()
        .unwrap()
        .to_string();

    let _h2 = Denvd::join(&cp.url, &cp.join_token().await, &d2);
    let hosts = cp.hosts(2).await;
    let host2 = hosts.iter().find(|h| **h != host1).unwrap().clone();
    // Both hosts report a load before placing (the first heartbeat follows the welcome).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Two forks at once: the first one's claim on its host sends the second to the other
    // host, so one of them lands on host 2 whatever the two hosts' free memory reads.
    let mut placed = Vec::new();
    for round in 0..2 {
        let a = cp.fork(&owner, &version).await;
        let b = cp.fork(&owner, &version).await;
        let (a, b) = (cp.wait_ok(&a).await, cp.wait_ok(&b).await);
        let mut on2 = Vec::new();
        for d in [&a, &b] {
            let env = d["deployment"]["EnvID"].as_str().unwrap().to_string();
            let host = cp.get_ok(&format!("/v1/envs/{env}")).await["environment"]["HostID"]
                .as_str()
                .unwrap()
                .to_string();
            let place = phase(d, "place");
            assert_eq!(place["Evidence"]["host"], host, "{place}");
            if host == host2 {
                on2.push((env.clone(), place["Evidence"]["ship"].clone()));
            } else {
                assert_eq!(host, host1);
                assert!(place["Evidence"]["ship"].is_null(), "{place}");
            }
            placed.push(env);
        }
        assert_eq!(
            on2.len(),
            1,
            "round {round}: one fork on each host: {a:#} {b:#}"
        );
        let (env2, ship) = on2.remove(0);
        assert_eq!(ship["from_host"], host1, "{ship}");
        assert_eq!(ship["to_host"], host2, "{ship}");
        assert!(ship["bytes"].as_u64().unwrap() > 3_000_000, "{ship}");
        assert_eq!(ship["sha256"].as_str().unwrap().len(), 64, "{ship}");
        assert!(ship["took_ms"].is_u64(), "{ship}");
        assert_eq!(ship["cached"], round == 1, "round {round}: {ship}");
        // One engine serves both sidecars here: the images were there already.
        assert_eq!(ship["images"]["loaded"], json!([]), "{ship}");
        // The fork on host 2 reads the data, links and all.
        let o = cp
            .exec(
                &env2,
                &[
                    "sh",
                    "-c",
                    "cat /work/f; readlink /work/link; md5sum -c /work/blob.md5",
                ],
            )
            .await;
        assert_eq!(o["exit_code"], 0, "{o}");
        let out = o["stdout"].as_str().unwrap();
        assert!(out.starts_with("shipped-data\nf\n"), "{out}");
        assert!(out.contains("/work/blob: OK"), "{out}");
        // The snapshot is on host 2 under the owner's id.
        assert_eq!(
            snapshots(&d2, &owner).len(),
            1,
            "{:?}",
            snapshots(&d2, &owner)
        );
    }
    // The control plane serves no snapshot bytes any more.
    let r = reqwest::Client::new()
        .get(format!("{}/v1/ship/shp_nosuch", cp.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    for env in placed {
        let (s, d) = cp.delete(&format!("/v1/envs/{env}")).await;
        assert_eq!(s, 202, "{d}");
    }
    let (s, d) = cp.delete(&format!("/v1/envs/{owner}")).await;
    assert_eq!(s, 202, "{d}");
    // Let the destroys run before the sidecars go.
    tokio::time::sleep(Duration::from_secs(8)).await;
}
