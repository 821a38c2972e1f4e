//! The warm pool end to end against the real engine: the real `denv-cp` binary (SQLite
//! in a temp dir) and the real `denvd` (dir storage) joined to it, requests over REST
//! (`docs/reference/deployments.md` "Warm pool"). What is checked is read off the
//! record and off Docker itself.

use denv_testkit::{phase, CpBinary, Denvd, Start};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const KEY: &str = "dak_pool_test_0123456789abcdef";

fn compose(pool: u32, tag: &str) -> String {
    format!(
        r#"
x-denv:
  pool: {pool}
services:
  box:
    image: busybox:1.36
    user: "1000:1000"
    command: ["sh", "-c", "echo {tag} > /tmp/tag; exec sleep 1000000"]
    volumes: ["w:/work"]
volumes: {{ w: {{}} }}
"#
    )
}

/// On a failed assertion, removes the containers and networks of every environment the
/// test's sidecar holds under `<data>/envs/` (the sidecar is killed before this runs), so
/// a failure leaves nothing running on the machine's engine.
struct Leftovers(std::path::PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let Ok(rd) = std::fs::read_dir(self.0.join("envs")) else {
            return;
        };
        for e in rd.flatten() {
            let label = format!("label=denv.env={}", e.file_name().to_string_lossy());
            for (list, rm) in [
                (&["ps", "-aq"][..], &["rm", "-f"][..]),
                (&["network", "ls", "-q"][..], &["network", "rm"][..]),
            ] {
                let Ok(o) = Command::new("docker")
                    .args(list)
                    .args(["--filter", &label])
                    .output()
                else {
                    continue;
                };
                for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("docker").args(rm).arg(id).output();
                }
            }
        }
    }
}

/// The kit's `denv-cp` (pool cap 5 per host) with this test's REST helpers.
struct Cp(CpBinary);

impl std::ops::Deref for Cp {
    type Target = CpBinary;
    fn deref(&self) -> &CpBinary {
        &self.0
    }
}

impl Cp {
    async fn start(dir: &Path) -> Cp {
        let dsn = dir.join("cp.db").display().to_string();
        let start = Start::in_dir(env!("CARGO_BIN_EXE_denv-cp"), &dsn, dir)
            .key(KEY)
            .env("DENV_POOL_MAX_PER_HOST", "5");
        Cp(CpBinary::start(start).await)
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.0.get(path).await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    async fn wait(&self, dep: &str) -> Value {
        self.0.wait_for(dep, Duration::from_secs(300)).await
    }

    async fn deploy(&self, compose: &str) -> Value {
        let d = self.0.deploy("pooled", "alpha", compose).await;
        let d = self.wait(d["deployment"]["ID"].as_str().unwrap()).await;
        assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
        d
    }

    async fn host_connected(&self) {
        let t0 = Instant::now();
        while self.get("/v1/hosts").await["hosts"][0]["connected"] != true {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "denvd did not connect"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn envs(&self) -> Vec<Value> {
        self.get("/v1/projects/pooled/envs").await["environments"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The live pool members: `(id, parent version, status)`.
    async fn members(&self) -> Vec<(String, String, String)> {
        self.envs()
            .await
            .into_iter()
            .filter(|e| e["Stage"] == "pool" && e["Status"] != "destroyed")
            .map(|e| {
                (
                    e["ID"].as_str().unwrap().to_string(),
                    e["ParentVersionID"].as_str().unwrap().to_string(),
                    e["Status"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Waits until exactly `n` members exist, all healthy, of `version`.
    async fn pool_ready(&self, version: &str, n: usize) -> Vec<String> {
        let t0 = Instant::now();
        loop {
            let m = self.members().await;
            if m.len() == n && m.iter().all(|(_, v, s)| v == version && s == "healthy") {
                // Each fill's deployment is final too (the environment turns healthy
                // just before its verdict is written).
                for (id, _, _) in &m {
                    let deps = self.get(&format!("/v1/envs/{id}/deployments")).await;
                    self.wait(deps["deployments"][0]["ID"].as_str().unwrap())
                        .await;
                }
                return m.into_iter().map(|(id, _, _)| id).collect();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(180),
                "pool of {version} not {n} healthy members: {m:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn fork(&self, env: &str, body: Value) -> Value {
        let (s, d) = self.post(&format!("/v1/envs/{env}/fork"), body).await;
        assert_eq!(s, 202, "{d}");
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

    async fn destroy(&self, env: &str) {
        let (s, d) = self.delete(&format!("/v1/envs/{env}")).await;
        assert_eq!(s, 202, "{d}");
    }

    async fn wait_destroyed(&self, env: &str) -> String {
        let t0 = Instant::now();
        loop {
            let e = self.get(&format!("/v1/envs/{env}")).await;
            if e["environment"]["Status"] == "destroyed" {
                let deps = self.get(&format!("/v1/envs/{env}/deployments")).await;
                let d = deps["deployments"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|d| d["Kind"] == "destroy")
                    .cloned()
                    .unwrap();
                let d = self.wait(d["ID"].as_str().unwrap()).await;
                assert_eq!(d["deployment"]["Status"], "succeeded", "{d}");
                return d["deployment"]["Params"]["reason"]
                    .as_str()
                    .unwrap()
                    .to_string();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{env} not destroyed: {e}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn docker(args: &[&str]) -> String {
    let o = Command::new("docker").args(args).output().unwrap();
    assert!(o.status.success(), "docker {args:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Containers (any state) Docker holds for environment `env`.
fn containers_of(env: &str) -> Vec<String> {
    docker(&["ps", "-aq", "--filter", &format!("label=denv.env={env}")])
        .lines()
        .map(str::to_string)
        .collect()
}

/// The networks the environment's containers are attached to.
fn networks_of(env: &str) -> Vec<String> {
    let mut nets: Vec<String> = containers_of(env)
        .iter()
        .flat_map(|c| {
            docker(&[
                "inspect",
                "-f",
                "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                c,
            ])
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
        })
        .collect();
    nets.sort();
    nets.dedup();
    nets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, busybox:1.36 and target/<profile>/denvd; run with --ignored"]
async fn warm_pool_hands_out_isolated_forks_refills_and_drains() {
    let tmp = tempfile::tempdir().unwrap();
    // DENV_TEST_KEEP=1 keeps the logs and the store for a look afterwards.
    let (_tmp, path) = if std::env::var("DENV_TEST_KEEP").is_ok() {
        let p = tmp.keep();
        eprintln!("kept: {}", p.display());
        (None, p)
    } else {
        let p = tmp.path().to_path_buf();
        (Some(tmp), p)
    };
    let dir = &path;
    let _leftovers = Leftovers(dir.join("data"));
    let mut cp = Cp::start(dir.as_path()).await;
    let _denvd = Denvd::join(&cp.url, &cp.join_token().await, dir);
    cp.host_connected().await;
    let (s, p) = cp.post("/v1/projects", json!({"name": "pooled"})).await;
    assert_eq!(s, 201, "{p}");
    let mut seen: Vec<String> = Vec::new();

    // ---- a deploy with x-denv.pool: 2 fills two members of its version.
    let d = cp.deploy(&compose(2, "one")).await;
    let owner = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    let v1 = d["deployment"]["VersionID"].as_str().unwrap().to_string();
    seen.push(owner.clone());
    let first = cp.pool_ready(&v1, 2).await;
    seen.extend(first.clone());
    for m in &first {
        let deps = cp.get(&format!("/v1/envs/{m}/deployments")).await;
        let fill = &deps["deployments"][0];
        assert_eq!(fill["Kind"], "fork");
        assert_eq!(fill["Params"]["pool"], "fill", "{fill}");
        let fill = cp.wait(fill["ID"].as_str().unwrap()).await;
        assert_eq!(fill["deployment"]["Status"], "succeeded");
        assert_eq!(phase(&fill, "clone")["Evidence"]["pool"], "fill");
        let e = cp.get(&format!("/v1/envs/{m}")).await;
        assert_eq!(e["environment"]["ExpiresAt"], "", "members have no TTL");
    }
    // Written after the snapshot: no fork may see it.
    cp.exec(&owner, &["sh", "-c", "echo parent > /work/after"])
        .await;

    // ---- two hand-outs: already succeeded in the 202, relabelled members.
    let mut handed = Vec::new();
    for (i, name) in ["warm-a", "warm-b"].iter().enumerate() {
        let t0 = Instant::now();
        let d = cp
            .fork(&owner, json!({"name": name, "ttl_sec": 3600}))
            .await;
        let took = t0.elapsed();
        let dep = &d["deployment"];
        assert_eq!(dep["Status"], "succeeded", "a hand-out answers final: {d}");
        let env = dep["EnvID"].as_str().unwrap().to_string();
        assert!(
            first.contains(&env),
            "{env} is one of the members {first:?}"
        );
        assert_eq!(env, first[i], "oldest member first");
        assert_eq!(dep["Params"]["pool"], "hit");
        assert_eq!(phase(&d, "place")["Evidence"]["reason"], "warm pool");
        assert_eq!(phase(&d, "clone")["Evidence"]["pool"], "hit");
        assert_eq!(phase(&d, "clone")["Evidence"]["member"], env.as_str());
        let health = &phase(&d, "health")["Evidence"];
        assert_eq!(health["egress"], "denied (verified)", "{health}");
        assert_eq!(health["pool"], "hit");
        // The record agrees, and the 202 is the same deployment the store has.
        let stored = cp
            .get(&format!("/v1/deployments/{}", dep["ID"].as_str().unwrap()))
            .await;
        assert_eq!(stored["deployment"]["Status"], "succeeded");
        let e = cp.get(&format!("/v1/envs/{env}")).await["environment"].clone();
        assert_eq!(e["Name"], *name);
        assert_eq!(e["Stage"], "fork");
        assert_eq!(e["Status"], "healthy");
        assert_eq!(e["ParentVersionID"], v1.as_str());
        assert_ne!(e["ExpiresAt"], "", "the request's TTL applies");
        eprintln!("hand-out {name}: {took:?}");
        handed.push(env);
    }
    let (a, b) = (handed[0].clone(), handed[1].clone());

    // ---- isolation: own datasets and own networks.
    let ls = cp.exec(&a, &["ls", "/work"]).await;
    assert_eq!(
        ls["stdout"], "",
        "the parent's later write is not in the fork: {ls}"
    );
    cp.exec(&a, &["sh", "-c", "echo a > /work/mine"]).await;
    let o = cp.exec(&b, &["cat", "/work/mine"]).await;
    assert_ne!(o["exit_code"], 0, "a's write seen in b: {o}");
    let o = cp.exec(&owner, &["cat", "/work/mine"]).await;
    assert_ne!(o["exit_code"], 0, "a's write seen in the parent: {o}");
    let o = cp.exec(&a, &["cat", "/work/mine"]).await;
    assert_eq!(o["stdout"], "a\n");
    let (na, nb, np) = (networks_of(&a), networks_of(&b), networks_of(&owner));
    assert!(!na.is_empty() && !nb.is_empty(), "{na:?} {nb:?}");
    for n in &na {
        assert!(!nb.contains(n) && !np.contains(n), "shared network {n}");
    }
    // The agent's box is still denied the internet after the hand-out.
    let o = cp
        .exec(
            &a,
            &[
                "wget",
                "-q",
                "-T",
                "2",
                "-O",
                "/dev/null",
                "http://1.1.1.1/",
            ],
        )
        .await;
    assert_ne!(o["exit_code"], 0, "egress from a hand-out: {o}");

    // ---- refill: two new members, not the ones handed out.
    let refilled = cp.pool_ready(&v1, 2).await;
    assert!(refilled.iter().all(|m| !first.contains(m)), "{refilled:?}");
    seen.extend(refilled.clone());

    // ---- a miss: three forks at once empty the pool; the third is cold and works.
    let mut got = Vec::new();
    for i in 0..3 {
        let d = cp.fork(&owner, json!({"name": format!("burst-{i}")})).await;
        got.push(d);
    }
    let hits = got
        .iter()
        .filter(|d| d["deployment"]["Params"]["pool"] == "hit")
        .count();
    assert_eq!(hits, 2, "{got:?}");
    let cold = got
        .iter()
        .find(|d| d["deployment"]["Params"]["pool"] == "miss")
        .expect("one miss");
    let cold = cp.wait(cold["deployment"]["ID"].as_str().unwrap()).await;
    assert_eq!(cold["deployment"]["Status"], "succeeded", "{cold}");
    assert_eq!(phase(&cold, "clone")["Evidence"]["pool"], "miss");
    let c = cold["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert!(cp.exec(&c, &["ls", "/work"]).await["stdout"] == "");
    let burst: Vec<String> = got
        .iter()
        .map(|d| d["deployment"]["EnvID"].as_str().unwrap().to_string())
        .collect();
    seen.extend(burst.clone());
    cp.pool_ready(&v1, 2).await;

    // ---- a request sets the size; bounds are refused.
    let (s, e) = cp
        .post(&format!("/v1/envs/{owner}/fork"), json!({"pool": 65}))
        .await;
    assert_eq!(s, 400, "{e}");
    // The host's cap (DENV_POOL_MAX_PER_HOST=5 here) bounds the pool, whatever is asked.
    let d = cp.fork(&owner, json!({"name": "capped", "pool": 64})).await;
    seen.push(d["deployment"]["EnvID"].as_str().unwrap().to_string());
    let capped = cp.pool_ready(&v1, 5).await;
    seen.extend(capped.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cp.members().await.len(), 5, "no fill beyond the host's cap");
    let d = cp.fork(&owner, json!({"name": "sized", "pool": 3})).await;
    let sized = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    seen.push(sized.clone());
    let three = cp.pool_ready(&v1, 3).await;
    seen.extend(three.clone());

    // ---- restart: the members are still the pool (known, not leaked), and hand out.
    cp.0.restart(&[]).await;
    cp.host_connected().await;
    let after = cp.pool_ready(&v1, 3).await;
    assert_eq!(after, three, "the same members after a restart");
    let d = cp.fork(&owner, json!({"name": "after-restart"})).await;
    assert_eq!(d["deployment"]["Params"]["pool"], "hit", "{d}");
    let r = d["deployment"]["EnvID"].as_str().unwrap().to_string();
    assert_eq!(cp.exec(&r, &["true"]).await["exit_code"], 0);
    let refilled = cp.pool_ready(&v1, 3).await;
    seen.extend(refilled.clone());

    // ---- a new deploy drains the old version's pool and fills the new one.
    let d = cp.deploy(&compose(1, "two")).await;
    let v2 = d["deployment"]["VersionID"].as_str().unwrap().to_string();
    assert_ne!(v1, v2);
    for m in &refilled {
        assert_eq!(cp.wait_destroyed(m).await, "drained");
        assert!(containers_of(m).is_empty(), "drained {m} left containers");
    }
    // The size set by the request stays with the environment: 3, not the file's 1.
    // (The request set it on the environment; the new file's x-denv.pool does not undo it.)
    let new = cp.pool_ready(&v2, 3).await;
    seen.extend(new.clone());
    let d = cp.fork(&owner, json!({"name": "of-v2"})).await;
    assert_eq!(d["deployment"]["Params"]["pool"], "hit");
    let o = cp
        .exec(
            d["deployment"]["EnvID"].as_str().unwrap(),
            &["cat", "/tmp/tag"],
        )
        .await;
    assert_eq!(o["stdout"], "two\n", "a member of the new version");
    seen.push(d["deployment"]["EnvID"].as_str().unwrap().to_string());

    // ---- pool: 0 drains it.
    let d = cp.fork(&owner, json!({"name": "off", "pool": 0})).await;
    seen.push(d["deployment"]["EnvID"].as_str().unwrap().to_string());
    let t0 = Instant::now();
    while !cp.members().await.is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(120), "not drained");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cp.fork(&owner, json!({"pool": 2})).await;
    let last = cp.pool_ready(&v2, 2).await;
    seen.extend(last.clone());

    // ---- destroying the owner drains its pool; then everything goes and nothing stays.
    cp.destroy(&owner).await;
    for m in &last {
        assert_eq!(cp.wait_destroyed(m).await, "drained");
    }
    for e in cp.envs().await {
        let id = e["ID"].as_str().unwrap().to_string();
        if e["Status"] != "destroyed" {
            cp.destroy(&id).await;
        }
        if !seen.contains(&id) {
            seen.push(id);
        }
    }
    for id in &seen {
        cp.wait_destroyed(id).await;
    }
    let t0 = Instant::now();
    loop {
        let left: Vec<_> = seen
            .iter()
            .filter(|e| !containers_of(e).is_empty())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "containers left for {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
