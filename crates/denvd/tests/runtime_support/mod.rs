//! Shared helpers for the real-Docker runtime tests.
#![allow(dead_code)]

use denv_compose::{Egress, Health, Resources, Service, Spec, VolumeMount};
use denvd::runtime::{Progress, Runtime, RuntimeConfig, StorageKind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

pub const BUSYBOX: &str = "busybox:1.36";
pub const PYTHON: &str = "python:3.12-slim";
pub const POSTGRES: &str = "postgres:16-alpine";

/// Every test that drives the real engine is `#[ignore = "needs Docker …"]`, so a plain
/// `cargo test` on a machine without Docker finishes and lists them as ignored.
///
/// Fails the test at once, naming what is missing, when the engine does not answer or
/// an image the runtime tests use is absent: a test that was asked to run
/// (`--include-ignored`) never passes without its real subject.
pub fn require_docker() {
    let info = Command::new("docker")
        .args(["info", "-f", "{{.ServerVersion}}"])
        .output();
    match info {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "cannot run: the Docker engine does not answer ({}); start it with ./e2e/setup-host.sh",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run: no docker CLI ({e}); run ./e2e/setup-host.sh"),
    }
    for image in [BUSYBOX, PYTHON, POSTGRES] {
        let ok = Command::new("docker")
            .args(["image", "inspect", image])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            ok,
            "cannot run: image {image} is missing; build it with e2e/images/build.sh"
        );
    }
}

/// A unique environment id with upper-case letters (exercises the lower-casing).
pub fn env_id(tag: &str) -> String {
    format!("env_T{}{:08X}", tag.to_uppercase(), rand::random::<u32>())
}

/// Where btrfs tests keep their data (a loop-mounted btrfs, via `e2e/lib/btrfs.sh`).
pub const BTRFS_MNT: &str = "/var/lib/denv-test-btrfs";

static BTRFS: Mutex<bool> = Mutex::new(false);

/// Mounts the test btrfs once per process (idempotent across processes).
pub fn btrfs_root() -> PathBuf {
    let mut done = BTRFS.lock().unwrap_or_else(|e| e.into_inner());
    if !*done {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/lib/btrfs.sh");
        let st = if script.exists() {
            Command::new("bash")
                .arg(&script)
                .args(["mount", BTRFS_MNT, "8G"])
                .status()
                .expect("run btrfs.sh")
        } else {
            let img = format!("{BTRFS_MNT}.img");
            let sh = format!(
                "mountpoint -q {BTRFS_MNT} || {{ mkdir -p {BTRFS_MNT}; [ -s {img} ] || {{ truncate -s 8G {img}; mkfs.btrfs -q {img}; }}; mount -o loop {img} {BTRFS_MNT}; }}"
            );
            Command::new("sh")
                .args(["-c", &sh])
                .status()
                .expect("mount btrfs")
        };
        assert!(st.success(), "could not mount a btrfs at {BTRFS_MNT}");
        *done = true;
    }
    PathBuf::from(BTRFS_MNT)
}

/// A runtime on a fresh data directory for `kind` (`dir`, `btrfs`).
pub async fn runtime(kind: &str) -> (Runtime, tempfile::TempDir) {
    require_docker();
    let (storage, parent) = match kind {
        "dir" => (StorageKind::Dir, PathBuf::from("/var/tmp")),
        "btrfs" => (StorageKind::Btrfs, btrfs_root()),
        other => panic!("unknown storage {other}"),
    };
    let tmp = tempfile::Builder::new()
        .prefix("denvd-test-")
        .tempdir_in(parent)
        .expect("tempdir");
    let mut cfg = RuntimeConfig::new(tmp.path().join("data"));
    cfg.storage = storage;
    let rt = Runtime::new(cfg).await.expect("runtime");
    assert_eq!(rt.storage_name(), kind);
    (rt, tmp)
}

/// Creates `env` as one busybox service `box` sleeping, no volumes, egress denied.
pub async fn create_box(rt: &Runtime, env: &str) {
    let (p, _rx) = progress();
    rt.create(env, &spec(vec![svc("box", BUSYBOX)], &[], Egress::Deny), &p)
        .await
        .expect("create");
}

/// A progress channel whose lines are collected.
pub fn progress() -> (Progress, tokio::sync::mpsc::UnboundedReceiver<String>) {
    tokio::sync::mpsc::unbounded_channel()
}

pub fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Vec<String> {
    let mut v = Vec::new();
    while let Ok(l) = rx.try_recv() {
        v.push(l);
    }
    v
}

pub fn svc(name: &str, image: &str) -> Service {
    Service {
        name: name.into(),
        image: image.into(),
        command: vec!["sleep".into(), "3600".into()],
        resources: Resources::default(),
        ..Default::default()
    }
}

pub fn vol(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        path: path.into(),
        read_only: false,
    }
}

pub fn health(test: &[&str], interval_ms: u64, retries: u32) -> Option<Health> {
    Some(Health {
        test: test.iter().map(|s| s.to_string()).collect(),
        interval_ms,
        retries,
    })
}

pub fn spec(services: Vec<Service>, volumes: &[&str], egress: Egress) -> Spec {
    let mut services = services;
    services.sort_by(|a, b| a.name.cmp(&b.name));
    Spec {
        services,
        volumes: volumes.iter().map(|s| s.to_string()).collect(),
        egress,
        ..Default::default()
    }
}

pub fn argv(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

/// `sh -c <script>` in a service; asserts exit 0 and returns stdout.
pub async fn sh(rt: &Runtime, env: &str, service: &str, script: &str) -> String {
    let r = rt
        .exec(
            env,
            service,
            &argv(&["sh", "-c", script]),
            Duration::from_secs(120),
        )
        .await
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    assert_eq!(
        r.exit_code, 0,
        "{script:?}: stdout {} stderr {}",
        r.stdout, r.stderr
    );
    r.stdout
}

/// Removes leftovers of an environment even when a test panics (sync, by label).
pub struct Cleanup(pub Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for env in &self.0 {
            let out = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("label=denv.env={env}")])
                .output();
            if let Ok(o) = out {
                for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("docker").args(["rm", "-f", id]).output();
                }
            }
            let _ = Command::new("docker")
                .args(["network", "rm", &format!("{}_default", env.to_lowercase())])
                .output();
            // The network's policy in nftables (what exists of it, in any denv table).
            let b = denvd::runtime::bridge_name(env);
            let tables = Command::new("nft")
                .args(["list", "tables", "inet"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for t in tables
                .lines()
                .filter_map(|l| l.strip_prefix("table inet "))
                .filter(|t| t.starts_with("denv"))
            {
                for stmt in [
                    format!("delete element inet {t} env_fwd {{ \"{b}\" }}"),
                    format!("delete element inet {t} env_in {{ \"{b}\" }}"),
                    format!("delete chain inet {t} env_{b}_out"),
                    format!("delete chain inet {t} env_{b}_in"),
                ] {
                    let _ = Command::new("nft")
                        .args(stmt.split_whitespace())
                        .stderr(std::process::Stdio::null())
                        .output();
                }
            }
            // Or in iptables (`DENV_PACKET_FILTER=iptables`): its dispatch rules, its chains.
            let h = b.strip_prefix("dv").unwrap_or(&b).to_string();
            for bin in ["iptables", "ip6tables"] {
                let Ok(o) = Command::new(bin).args(["-w", "-S"]).output() else {
                    continue;
                };
                let listing = String::from_utf8_lossy(&o.stdout).into_owned();
                for l in listing.lines() {
                    if let Some(rule) = l.strip_prefix("-A ") {
                        if rule.contains(&format!("-i {b} -j D")) {
                            let mut args = vec!["-w", "-D"];
                            args.extend(rule.split_whitespace());
                            let _ = Command::new(bin).args(&args).output();
                        }
                    }
                }
                for l in listing.lines() {
                    if let Some(c) = l.strip_prefix("-N ") {
                        if c.starts_with('D')
                            && (c.ends_with(&format!("-{h}-O")) || c.ends_with(&format!("-{h}-I")))
                        {
                            let _ = Command::new(bin).args(["-w", "-F", c]).output();
                            let _ = Command::new(bin).args(["-w", "-X", c]).output();
                        }
                    }
                }
            }
        }
    }
}

/// Containers (any state) labelled with this environment.
pub fn containers_of(env: &str) -> Vec<String> {
    let o = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=denv.env={env}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

pub fn network_exists(name: &str) -> bool {
    Command::new("docker")
        .args(["network", "inspect", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A tar with one file.
pub fn tar_with(name: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, name, data).unwrap();
    b.into_inner().unwrap()
}

/// The first regular file of a tar.
pub fn untar_one(t: &[u8]) -> (String, Vec<u8>) {
    let mut a = tar::Archive::new(t);
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        if e.header().entry_type() == tar::EntryType::Regular {
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            return (name, v);
        }
    }
    panic!("no regular file in the tar");
}
