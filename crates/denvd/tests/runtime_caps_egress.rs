//! Caps on every container (memory, pids, CPUs), a fork bomb and a memory hog contained
//! (spec `19-ref-protections.md` §4). Egress is in `runtime_egress.rs`.

mod runtime_support;

use denv_compose::{Egress, Resources};
use denvd::runtime::container_name;
use runtime_support::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn caps_on_every_container_and_contained() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("caps");
    let _c = Cleanup(vec![env.clone()]);
    let mut small = svc("small", BUSYBOX);
    small.resources = Resources {
        memory_mb: 64,
        pids: 64,
        cpus: 0.5,
    };
    let mut dflt = svc("dflt", BUSYBOX);
    dflt.resources = Resources {
        memory_mb: 0,
        pids: 0,
        cpus: 0.0,
    };
    let sp = spec(vec![small, dflt], &[], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    let d = rt.docker();
    let hc = |name: &str| {
        let n = container_name(&env, name);
        async move {
            d.inspect_container(&n, None)
                .await
                .unwrap()
                .host_config
                .unwrap()
        }
    };
    let h = hc("small").await;
    assert_eq!(h.memory, Some(64 << 20));
    assert_eq!(h.memory_swap, Some(64 << 20));
    assert_eq!(h.pids_limit, Some(64));
    assert_eq!(h.nano_cpus, Some(500_000_000));
    let h = hc("dflt").await;
    assert_eq!(h.memory, Some(4096 << 20));
    assert_eq!(h.pids_limit, Some(2048));
    // The default 2.0 CPUs, at most the host's CPUs minus the 0.5 reserve.
    let host = std::thread::available_parallelism().unwrap().get() as f64;
    let want = (denvd::runtime::max_cpus(host).min(2.0) * 1e9) as i64;
    assert_eq!(h.nano_cpus, Some(want));

    // Fork bomb: stops at the pid cap, inside its own cgroup.
    let bomb = "n=0; for i in $(seq 300); do sleep 120 & n=$((n+1)); done; echo tried=$n";
    let r = rt
        .exec(
            &env,
            "small",
            &argv(&["sh", "-c", bomb]),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(
        r.stderr.contains("can't fork") || r.stderr.contains("Resource temporarily unavailable"),
        "fork bomb was not stopped: exit {} stderr {}",
        r.exit_code,
        r.stderr
    );
    let st = d
        .inspect_container(&container_name(&env, "small"), None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(st.running, Some(true), "the service survives its fork bomb");
    // The other service and the host go on.
    assert_eq!(sh(&rt, &env, "dflt", "echo alive").await, "alive\n");

    // Memory hog: the hog is OOM-killed (exit 137), the service and host go on.
    let env2 = env_id("mem");
    let _c2 = Cleanup(vec![env2.clone()]);
    let mut hog = svc("hog", BUSYBOX);
    hog.resources = Resources {
        memory_mb: 64,
        pids: 64,
        cpus: 1.0,
    };
    rt.create(&env2, &spec(vec![hog], &[], Egress::Deny), &p)
        .await
        .expect("create hog");
    let r = rt
        .exec(
            &env2,
            "hog",
            &argv(&[
                "sh",
                "-c",
                "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo survived ${#x}",
            ]),
            Duration::from_secs(120),
        )
        .await
        .unwrap();
    assert_eq!(
        r.exit_code, 137,
        "hog not OOM-killed: {} {}",
        r.stdout, r.stderr
    );
    assert!(!r.stdout.contains("survived"));
    assert_eq!(
        sh(&rt, &env2, "hog", "echo still-here").await,
        "still-here\n"
    );
    rt.destroy(&env).await.unwrap();
    rt.destroy(&env2).await.unwrap();
}

/// The cgroup limits a service's processes see, read inside the container through exec:
/// `(cpu quota/period as CPUs, memory bytes, pids)`, on cgroup v2 (`cpu.max`,
/// `memory.max`, `pids.max`) or v1 (`cpu.cfs_quota_us`/`cpu.cfs_period_us`,
/// `memory.limit_in_bytes`, `pids/pids.max`).
async fn cgroup_limits(rt: &denvd::runtime::Runtime, env: &str) -> (f64, u64, String) {
    let out = sh(
        rt,
        env,
        "main",
        "if [ -f /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max; \
         else echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); \
         cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max; fi",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let cpu: Vec<f64> = lines[0]
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(-1.0))
        .collect();
    (
        cpu[0] / cpu[1],
        lines[1].trim().parse().unwrap(),
        lines[2].trim().to_string(),
    )
}

/// A fork created with caps of its own (what the control plane sends for a fork or
/// sandbox request's `resources`: the agent's service's caps and `disk_mb` changed in
/// the version's spec) runs with them, seen from inside: its cgroup, a 200 MiB
/// allocation killed under 64 MiB, a fork bomb stopped at 64 processes, a write past
/// its 64 MiB btrfs quota refused. The parent keeps the version's defaults and does
/// all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_fork_runs_with_the_caps_it_asked_for() {
    let (rt, _t) = runtime("btrfs").await;
    let parent = env_id("capp");
    let child = env_id("capc");
    let _c = Cleanup(vec![parent.clone(), child.clone()]);
    let mut m = svc("main", PYTHON);
    m.volumes = vec![vol("work", "/work")];
    let sp = spec(vec![m], &["work"], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&parent, &sp, &p).await.expect("create");
    rt.snapshot(&parent, "ver_caps", &[], &p)
        .await
        .expect("snapshot");
    let mut fsp = sp.clone();
    fsp.services[0].resources = Resources {
        memory_mb: 64,
        pids: 64,
        cpus: 0.5,
    };
    fsp.disk_mb = 64;
    rt.fork(&child, &parent, "ver_caps", &fsp, &p)
        .await
        .expect("fork");

    let d = rt.docker();
    let h = d
        .inspect_container(&container_name(&child, "main"), None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(h.memory, Some(64 << 20));
    assert_eq!(h.pids_limit, Some(64));
    assert_eq!(h.nano_cpus, Some(500_000_000));
    let (cpus, mem, pids) = cgroup_limits(&rt, &child).await;
    assert_eq!((cpus, mem, pids.as_str()), (0.5, 64 << 20, "64"));
    let (_, pmem, ppids) = cgroup_limits(&rt, &parent).await;
    assert_eq!(
        (pmem, ppids.as_str()),
        (4096 << 20, "2048"),
        "the parent keeps its caps"
    );

    // 200 MiB touched: killed under 64 MiB, fine in the parent.
    let hog = argv(&[
        "python3",
        "-c",
        "b = b'x' * (200 << 20); print('survived', len(b))",
    ]);
    let r = rt
        .exec(&child, "main", &hog, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 137, "hog not OOM-killed: {r:?}");
    assert!(!r.stdout.contains("survived"));
    let r = rt
        .exec(&parent, "main", &hog, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(r.stdout.trim(), format!("survived {}", 200 << 20), "{r:?}");

    // Disk: a write past the fork's 64 MiB quota fails inside it; the parent writes as much.
    let dd = argv(&[
        "sh",
        "-c",
        "dd if=/dev/urandom of=/work/big bs=1M count=200 conv=fsync; echo rc=$?",
    ]);
    let r = rt
        .exec(&child, "main", &dd, Duration::from_secs(300))
        .await
        .unwrap();
    assert!(!r.stdout.contains("rc=0"), "write past the quota: {r:?}");
    assert!(
        r.stderr.contains("Disk quota exceeded") || r.stderr.contains("No space left"),
        "{}",
        r.stderr
    );
    let r = rt
        .exec(&parent, "main", &dd, Duration::from_secs(300))
        .await
        .unwrap();
    assert!(
        r.stdout.contains("rc=0"),
        "the parent's 10 GiB quota: {r:?}"
    );
    // Fork bomb, last: stops at 64 processes in the fork; the service stays up. (Its
    // orphans become zombies of PID 1, `sleep`, which never reaps them: the fork's
    // pids stay used up, so nothing is exec'd in it afterwards.)
    let bomb = "n=0; for i in $(seq 200); do sleep 5 & n=$((n+1)); done; echo tried=$n";
    let r = rt
        .exec(
            &child,
            "main",
            &argv(&["sh", "-c", bomb]),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(
        r.stderr.contains("fork") || r.stderr.contains("Resource temporarily unavailable"),
        "fork bomb was not stopped: exit {} stderr {}",
        r.exit_code,
        r.stderr
    );
    let st = d
        .inspect_container(&container_name(&child, "main"), None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(st.running, Some(true), "the fork survives its fork bomb");
    assert_eq!(sh(&rt, &parent, "main", "echo alive").await, "alive\n");
    rt.destroy(&child).await.unwrap();
    rt.destroy(&parent).await.unwrap();
}
