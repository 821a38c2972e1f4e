//! Caps on every container (memory, pids, CPUs), a fork bomb and a memory hog contained,
//! and the egress probe proven against the canary (spec `19-ref-protections.md` §4-5).

mod runtime_support;

use bollard::network::CreateNetworkOptions;
use denv_compose::{Egress, Resources};
use denvd::runtime::container_name;
use runtime_support::*;
use std::io::{Read, Write};
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

/// The canary design: a normal bridge network reaches the canary, an internal one
/// reaches neither the canary nor the public target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn canary_reachable_only_from_non_internal_networks() {
    let (rt, _t) = runtime("dir").await;
    let tag = format!("{:08x}", rand::random::<u32>());
    let env = format!("env_canary{tag}");
    let _c = Cleanup(vec![env.clone()]);
    let d = rt.docker();
    let open = format!("denv-test-open-{tag}");
    let closed = format!("denv-test-internal-{tag}");
    for (name, internal) in [(&open, false), (&closed, true)] {
        d.create_network(CreateNetworkOptions {
            name: name.clone(),
            internal,
            driver: "bridge".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let a = rt.probe_network(&env, &open, false).await;
    let b = rt.probe_network(&env, &closed, true).await;
    d.remove_network(&open).await.unwrap();
    d.remove_network(&closed).await.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        (a.public, a.canary),
        (None, true),
        "normal network reaches the canary"
    );
    assert_eq!(
        (b.public, b.canary),
        (Some(false), false),
        "internal network reaches nothing"
    );
    let addr = rt.canary_addr().await.unwrap();
    assert!(
        !addr.starts_with("0.0.0.0") && !addr.starts_with("127."),
        "{addr}"
    );
    // No probe container is left behind.
    assert!(containers_of(&env).is_empty());
}

/// `allow`: ports published on 127.0.0.1 and reported; the probe reaches the canary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn allow_publishes_endpoints_deny_does_not() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("allow");
    let _c = Cleanup(vec![env.clone()]);
    let mut web = svc("web", BUSYBOX);
    web.command = argv(&[
        "sh",
        "-c",
        "mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www",
    ]);
    web.ports = vec![8080];
    let (p, mut rx) = progress();
    let c = rt
        .create(&env, &spec(vec![web.clone()], &[], Egress::Allow), &p)
        .await
        .expect("create allow");
    assert_eq!(c.egress, "allowed");
    assert!(drain(&mut rx)
        .iter()
        .any(|l| l == "healthy; egress allowed"));
    let ep = c.endpoints.get("web").expect("endpoint for web").clone();
    assert!(ep.starts_with("127.0.0.1:"), "{ep}");
    let mut body = String::new();
    for _ in 0..50 {
        if let Ok(mut s) = std::net::TcpStream::connect(&ep) {
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            s.read_to_string(&mut body).unwrap();
            if body.contains("hello-from-web") {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(body.contains("hello-from-web"), "{body}");
    let net = rt
        .docker()
        .inspect_network::<String>(&denvd::runtime::network_name(&env), None)
        .await
        .unwrap();
    assert_eq!(net.internal, Some(false));
    // The same spec under deny: internal network, no endpoints.
    let c = rt
        .create(&env, &spec(vec![web], &[], Egress::Deny), &p)
        .await
        .expect("recreate deny");
    assert_eq!(c.egress, "denied (verified)");
    assert!(c.endpoints.is_empty());
    rt.destroy(&env).await.unwrap();
}
