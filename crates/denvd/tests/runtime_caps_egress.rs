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
