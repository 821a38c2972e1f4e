//! TTLs and the host report on the real engine (issue 11, "Lifecycle"): denvd destroys an
//! expired environment on its own, across a restart of the runtime (the expiry is on
//! disk), without any control plane; and `host.report` names exactly this data
//! directory's environments and the dead ones.

mod runtime_support;

use denv_compose::Egress;
use denvd::runtime::{network_name, Runtime, RuntimeConfig, EXPIRES_FILE};
use runtime_support::*;
use std::time::Duration;

fn rfc3339_in(secs: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(secs))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn an_expired_environment_is_destroyed_by_the_sidecar_across_a_restart() {
    let (rt, tmp) = runtime("dir").await;
    let env = env_id("ttl");
    let later = env_id("later");
    let _c = Cleanup(vec![env.clone(), later.clone()]);

    // Refusals: a passed expiry creates nothing, garbage is named.
    let past = rfc3339_in(-5);
    let e = rt.set_expiry(&env, &past).unwrap_err().to_string();
    assert_eq!(e, format!("environment {env} expired at {past} (ttl)"));
    assert!(!rt.data_dir().join("envs").join(&env).exists());
    let e = rt.set_expiry(&env, "tomorrow").unwrap_err().to_string();
    assert_eq!(e, "expires_at \"tomorrow\" is not an RFC 3339 time");

    let exp = rfc3339_in(6);
    rt.set_expiry(&env, &exp).unwrap();
    let mut s = svc("box", BUSYBOX);
    s.volumes = vec![vol("w", "/w")];
    let sp = spec(vec![s], &["w"], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    sh(&rt, &env, "box", "echo data > /w/f").await;
    assert_eq!(rt.expiry(&env).as_deref(), Some(exp.as_str()));
    let file = rt.data_dir().join("envs").join(&env).join(EXPIRES_FILE);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), format!("{exp}\n"));
    // Another environment, an hour from expiring: left alone.
    rt.set_expiry(&later, &rfc3339_in(3600)).unwrap();
    // Nothing is due yet.
    assert!(rt.reap_expired().await.is_empty());
    assert_eq!(containers_of(&env).len(), 1);

    // The sidecar restarts (a new runtime over the same data directory) and nobody
    // tells it anything: its own watch destroys the environment when the TTL passes.
    let data = rt.data_dir().to_path_buf();
    drop(rt);
    let rt = Runtime::new(RuntimeConfig::new(&data))
        .await
        .expect("runtime");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watch = tokio::spawn(rt.clone().watch_expiry(tx));
    let x = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("no expiry within 30 s")
        .expect("watch ended");
    watch.abort();
    assert_eq!(x.env_id, env);
    assert_eq!(x.expires_at, exp);
    assert!(
        chrono::Utc::now() >= chrono::DateTime::parse_from_rfc3339(&exp).unwrap(),
        "destroyed before its expiry"
    );
    assert!(containers_of(&env).is_empty(), "{:?}", containers_of(&env));
    assert!(!network_exists(&network_name(&env)));
    assert!(!data.join("envs").join(&env).exists());
    assert!(rt.list_envs().await.iter().all(|e| e != &env));
    assert_eq!(rt.expiry(&later).map(|_| ()), Some(()));
    drop(tmp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn the_host_report_names_this_data_directorys_environments_and_the_dead() {
    let (mine, _t1) = runtime("dir").await;
    let (other, _t2) = runtime("dir").await;
    let env = env_id("rep");
    let theirs = env_id("theirs");
    let _c = Cleanup(vec![env.clone(), theirs.clone()]);
    let sp = spec(vec![svc("box", BUSYBOX)], &[], Egress::Deny);
    let (p, _rx) = progress();
    mine.create(&env, &sp, &p).await.expect("create");
    other.create(&theirs, &sp, &p).await.expect("create");

    let body = |ev: denv_proto::v1::HostEvent| match ev.event {
        Some(denv_proto::v1::host_event::Event::HostReport(r)) => r,
        other => panic!("not a host report: {other:?}"),
    };
    let r = body(denvd::stream::report_event(&mine).await);
    assert_eq!(r.environments, vec![env.clone()]);
    assert!(r.failed.is_empty(), "{r:?}");
    let r = body(denvd::stream::report_event(&other).await);
    assert_eq!(r.environments, vec![theirs.clone()]);

    // Its container is killed: the report says so.
    let out = std::process::Command::new("docker")
        .args(["kill", &denvd::runtime::container_name(&env, "box")])
        .output()
        .unwrap();
    assert!(out.status.success());
    let f = mine.check_env(&env).await.expect("found dead");
    let r = body(denvd::stream::report_event(&mine).await);
    assert_eq!(r.failed.get(&env), Some(&f.reason));
    assert!(
        f.reason.starts_with("service \"box\" is not running"),
        "{}",
        f.reason
    );
    mine.destroy(&env).await.unwrap();
    other.destroy(&theirs).await.unwrap();
}
