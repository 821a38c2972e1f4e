//! Fork time against dataset size for the `dir` and `btrfs` backends, and the
//! snapshot's frozen window. Real Docker, real file systems.
//!
//! ```text
//! cargo bench -p denvd --bench fork            # release build
//! cargo test  -p denvd --bench fork --release  # same, via the test runner
//! DENV_BENCH_SIZES=10,100 cargo bench -p denvd --bench fork   # MiB, default 10,100,1024
//! ```
//!
//! `dir` data lives under `/var/tmp` (ext4 here: `cp --reflink=auto` falls back to a
//! full copy); `btrfs` on the loop-mounted `/var/lib/denv-test-btrfs` (via
//! `e2e/lib/btrfs.sh`). Per size: one environment with one busybox service and one
//! volume holding the data (64 files of size/64, incompressible), then
//! `snapshot` (frozen window) and `fork`. `fork` is the full command: clone, container
//! start, health, egress probe; `clone` is the storage step alone. The probe runs in
//! the environment's network namespace and costs about a millisecond under either
//! egress.

mod support;
use denv_compose::{Egress, Service, Spec, VolumeMount};
use denvd::runtime::{Runtime, RuntimeConfig, StorageKind};
use denvd::storage::{BtrfsStorage, DirStorage, Storage};
use std::path::{Path, PathBuf};
use std::time::Instant;
use support::fill;

const BTRFS_MNT: &str = "/var/lib/denv-test-btrfs";

fn spec() -> Spec {
    Spec {
        services: vec![Service {
            name: "box".into(),
            image: "busybox:1.36".into(),
            command: vec!["sleep".into(), "3600".into()],
            volumes: vec![VolumeMount {
                name: "data".into(),
                path: "/data".into(),
                read_only: false,
            }],
            ..Default::default()
        }],
        volumes: vec!["data".into()],
        egress: Egress::Allow,
        ..Default::default()
    }
}

fn mount_btrfs() -> bool {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/lib/btrfs.sh");
    std::process::Command::new("bash")
        .arg(script)
        .args(["mount", BTRFS_MNT, "8G"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

async fn bench(kind: &str, root: PathBuf, sizes: &[u64]) {
    let tmp = tempfile::Builder::new()
        .prefix("denvd-bench-")
        .tempdir_in(&root)
        .unwrap();
    let data = tmp.path().join("data");
    let mut cfg = RuntimeConfig::new(&data);
    cfg.storage = if kind == "btrfs" {
        StorageKind::Btrfs
    } else {
        StorageKind::Dir
    };
    let rt = Runtime::new(cfg).await.expect("runtime");
    let storage: Box<dyn Storage> = if kind == "btrfs" {
        Box::new(BtrfsStorage::new(&data).unwrap())
    } else {
        Box::new(DirStorage::new(&data))
    };
    let (p, _rx) = tokio::sync::mpsc::unbounded_channel();
    let sp = spec();
    for &mib in sizes {
        let tag = format!("{:06x}", rand::random::<u32>() & 0xffffff);
        let env = format!("env_bench{kind}{mib}_{tag}");
        let fork = format!("{env}_f");
        let clone = format!("{env}_c");
        rt.create(&env, &sp, &p).await.expect("create");
        fill(&storage.volume_path(&env, "data"), mib);
        let s = rt.snapshot(&env, "s1", &[], &p).await.expect("snapshot");
        let t = Instant::now();
        storage
            .fork(&env, "s1", &clone, &["data".to_string()])
            .expect("storage fork");
        let clone_ms = t.elapsed().as_millis();
        let f = rt.fork(&fork, &env, "s1", &sp, &p).await.expect("fork");
        println!(
            "| {kind:5} | {mib:5} MiB | frozen_for {:6} ms | clone {:6} ms | fork (clone+start+probe) {:6} ms |",
            s.frozen_for, clone_ms, f.forked_in
        );
        storage.destroy(&clone).unwrap();
        rt.destroy(&fork).await.unwrap();
        rt.destroy(&env).await.unwrap();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes: Vec<u64> = std::env::var("DENV_BENCH_SIZES")
        .unwrap_or_else(|_| "10,100,1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("fork benchmark (sizes in MiB: {sizes:?})");
    bench("dir", PathBuf::from("/var/tmp"), &sizes).await;
    if mount_btrfs() {
        bench("btrfs", PathBuf::from(BTRFS_MNT), &sizes).await;
    } else {
        println!("btrfs: skipped (could not mount {BTRFS_MNT})");
    }
}
