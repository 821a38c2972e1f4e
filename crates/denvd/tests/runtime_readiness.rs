//! Readiness that Docker does not pace, services started as their dependencies are
//! ready, and concurrent commands on one environment, against the real Docker Engine.

mod runtime_support;

use denv_compose::Egress;
use denv_proto::v1::{command, Command, EnvDestroy, EnvExec};
use denvd::journal::{Journal, Outcome};
use denvd::runtime::{container_name, Runtime};
use denvd::stream::RuntimeExecutor;
use runtime_support::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `StartedAt` of a service's container.
async fn started_at(rt: &Runtime, env: &str, service: &str) -> chrono::DateTime<chrono::Utc> {
    let c = rt
        .docker()
        .inspect_container(&container_name(env, service), None)
        .await
        .unwrap();
    let s = c.state.unwrap().started_at.unwrap();
    chrono::DateTime::parse_from_rfc3339(&s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .with_timezone(&chrono::Utc)
}

async fn docker_health(rt: &Runtime, env: &str, service: &str) -> String {
    let c = rt
        .docker()
        .inspect_container(&container_name(env, service), None)
        .await
        .unwrap();
    c.state
        .and_then(|s| s.health)
        .and_then(|h| h.status)
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// A service that becomes healthy ~1 s after it starts, checked every 30 s by Docker.
fn slow_healthy(name: &str) -> denv_compose::Service {
    let mut s = svc(name, BUSYBOX);
    s.command = argv(&["sh", "-c", "sleep 1; touch /tmp/ready; exec sleep 3600"]);
    s.health = health(&["CMD", "test", "-f", "/tmp/ready"], 30_000, 3);
    s
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn a_healthcheck_every_30s_is_ready_in_seconds_and_again_at_once_after_a_snapshot() {
    let (rt, _tmp) = runtime("dir").await;
    let env = env_id("rdy");
    let _c = Cleanup(vec![env.clone()]);
    let spec = spec(vec![slow_healthy("db")], &[], Egress::Deny);
    let (p, _rx) = progress();
    let t0 = Instant::now();
    rt.create(&env, &spec, &p).await.expect("create");
    let took = t0.elapsed();
    // Docker's first check runs 30 s after start; denvd's own check sees it at ~1 s and
    // (a first start) confirms it for 2 s.
    assert!(took < Duration::from_secs(10), "create took {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "ready before the file existed: {took:?}"
    );
    assert_eq!(docker_health(&rt, &env, "db").await, "starting");

    // After the unpause Docker says unhealthy/starting until its next interval (30 s);
    // the snapshot returns after one immediate check of its own.
    let t0 = Instant::now();
    let s = rt.snapshot(&env, "s1", &[], &p).await.expect("snapshot");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "snapshot took {took:?}");
    assert!(s.consistent);
    assert_eq!(sh(&rt, &env, "db", "echo ok").await.trim(), "ok");
    rt.destroy(&env).await.unwrap();
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn a_first_start_is_not_ready_while_an_init_server_answers_then_stops() {
    // The pattern of PostgreSQL's image on an empty volume: a temporary server answers
    // the check, is stopped, and the real one starts a moment later.
    let (rt, _tmp) = runtime("dir").await;
    let env = env_id("init");
    let _c = Cleanup(vec![env.clone()]);
    let mut db = svc("db", BUSYBOX);
    db.command = argv(&[
        "sh",
        "-c",
        "touch /tmp/up; sleep 0.4; rm /tmp/up; sleep 1.2; touch /tmp/up; exec sleep 3600",
    ]);
    db.health = health(&["CMD", "test", "-f", "/tmp/up"], 2_000, 30);
    let (p, _rx) = progress();
    let t0 = Instant::now();
    rt.create(&env, &spec(vec![db], &[], Egress::Deny), &p)
        .await
        .expect("create");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1600),
        "ready during the init server's life: {took:?}"
    );
    assert_eq!(
        sh(&rt, &env, "db", "test -f /tmp/up && echo up")
            .await
            .trim(),
        "up"
    );
    rt.destroy(&env).await.unwrap();
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn a_failing_healthcheck_fails_with_its_output_and_an_exited_service_with_its_logs() {
    let (rt, _tmp) = runtime("dir").await;
    let env = env_id("rdyf");
    let _c = Cleanup(vec![env.clone()]);
    let mut s = svc("db", BUSYBOX);
    // interval 100 ms × 3 retries: Docker gives up after ~0.3 s; denvd's deadline is
    // at least 60 s, but Docker's `unhealthy` verdict ends the wait early.
    s.health = health(&["CMD-SHELL", "echo not yet >&2; exit 3"], 100, 3);
    let (p, _rx) = progress();
    let t0 = Instant::now();
    let e = rt
        .create(&env, &spec(vec![s], &[], Egress::Deny), &p)
        .await
        .unwrap_err()
        .to_string();
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_eq!(e, "service \"db\" is unhealthy: exit 3: not yet");

    let mut s = svc("db", BUSYBOX);
    s.command = argv(&["sh", "-c", "echo bye; exit 7"]);
    let e = rt
        .create(&env, &spec(vec![s], &[], Egress::Deny), &p)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("service \"db\" exited with code 7") && e.ends_with("bye"),
        "{e}"
    );
    rt.destroy(&env).await.unwrap();
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn a_depends_on_chain_starts_in_order_and_independent_services_start_together() {
    let (rt, _tmp) = runtime("dir").await;
    let env = env_id("dep");
    let _c = Cleanup(vec![env.clone()]);
    // a ← b ← c on service_healthy (each ready ~1 s after it starts), d and e on their
    // own, f on a with the default condition (service_started).
    let a = slow_healthy("a");
    let mut b = slow_healthy("b");
    b.depends_on = vec!["a".into()];
    b.depends_on_condition = healthy("a");
    let mut c = svc("c", BUSYBOX);
    c.depends_on = vec!["b".into()];
    c.depends_on_condition = healthy("b");
    let d = slow_healthy("d");
    let e = svc("e", BUSYBOX);
    let mut f = svc("f", BUSYBOX);
    f.depends_on = vec!["a".into()];
    let (p, _rx) = progress();
    let t0 = Instant::now();
    rt.create(&env, &spec(vec![a, b, c, d, e, f], &[], Egress::Deny), &p)
        .await
        .expect("create");
    let took = t0.elapsed();
    let (ta, tb, tc, td, te, tf) = (
        started_at(&rt, &env, "a").await,
        started_at(&rt, &env, "b").await,
        started_at(&rt, &env, "c").await,
        started_at(&rt, &env, "d").await,
        started_at(&rt, &env, "e").await,
        started_at(&rt, &env, "f").await,
    );
    let ms = |x: chrono::DateTime<chrono::Utc>, y: chrono::DateTime<chrono::Utc>| {
        (x - y).num_milliseconds()
    };
    // b waited for a to be ready (its file appears 1 s after start), c for b.
    assert!(ms(tb, ta) >= 1000, "b started {} ms after a", ms(tb, ta));
    assert!(ms(tc, tb) >= 1000, "c started {} ms after b", ms(tc, tb));
    // d and e depend on nothing: they start with a, not after the chain.
    assert!(ms(td, ta).abs() < 900, "d started {} ms from a", ms(td, ta));
    assert!(ms(te, ta).abs() < 900, "e started {} ms from a", ms(te, ta));
    // f only needs a started: after it, and before b, which waited for a's health.
    assert!(ms(tf, ta) >= 0, "f started {} ms before a", -ms(tf, ta));
    assert!(ms(tb, tf) > 0, "f started {} ms after b", ms(tf, tb));
    // Two 1 s waits in a row plus start-up, not five services one after another.
    assert!(took < Duration::from_secs(12), "create took {took:?}");
    rt.destroy(&env).await.unwrap();
}

fn healthy(dep: &str) -> std::collections::BTreeMap<String, String> {
    [(dep.to_string(), denv_compose::SERVICE_HEALTHY.to_string())].into()
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn a_service_waits_for_one_that_must_complete_and_its_exit_is_not_a_death() {
    let (rt, _tmp) = runtime("dir").await;
    let env = env_id("once");
    let _c = Cleanup(vec![env.clone()]);
    let mut migrate = svc("migrate", BUSYBOX);
    migrate.command = argv(&["sh", "-c", "sleep 1; echo migrated > /shared/done"]);
    migrate.volumes = vec![vol("shared", "/shared")];
    let mut app = svc("app", BUSYBOX);
    app.volumes = vec![vol("shared", "/shared")];
    app.depends_on = vec!["migrate".into()];
    app.depends_on_condition = [(
        "migrate".to_string(),
        denv_compose::SERVICE_COMPLETED_SUCCESSFULLY.to_string(),
    )]
    .into();
    // The app reads what the one-shot wrote before it started, or exits.
    app.command = argv(&["sh", "-c", "cat /shared/done || exit 9; exec sleep 3600"]);
    let sp = spec(
        vec![migrate.clone(), app.clone()],
        &["shared"],
        Egress::Deny,
    );
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    assert_eq!(
        sh(&rt, &env, "app", "cat /shared/done").await.trim(),
        "migrated"
    );
    // The exited one-shot is done, not dead; the app is watched as usual.
    assert_eq!(rt.dead_service(&env).await.unwrap(), None);
    rt.destroy(&env).await.unwrap();

    // A one-shot that fails stops the create with its exit code and logs; the app never
    // starts.
    let mut bad = migrate;
    bad.command = argv(&["sh", "-c", "echo no database >&2; exit 3"]);
    let sp = spec(vec![bad, app], &["shared"], Egress::Deny);
    let e = rt.create(&env, &sp, &p).await.unwrap_err().to_string();
    assert_eq!(e, "service \"migrate\" exited with code 3: no database");
    let app_state = rt
        .docker()
        .inspect_container(&container_name(&env, "app"), None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_eq!(
        app_state.started_at.as_deref(),
        Some("0001-01-01T00:00:00Z")
    );
    rt.destroy(&env).await.unwrap();
}

fn exec_cmd(id: &str, env: &str, argv: &[&str]) -> Command {
    Command {
        command_id: id.into(),
        kind: "env.exec".into(),
        env_id: env.into(),
        payload: Some(command::Payload::EnvExec(EnvExec {
            service: "box".into(),
            cmd: argv.iter().map(|s| s.to_string()).collect(),
            timeout_sec: 60,
            ..Default::default()
        })),
    }
}

fn exit_code(o: &Outcome) -> i32 {
    let r = o.result();
    assert!(r.ok, "{}", r.error);
    match &r.payload {
        Some(denv_proto::v1::command_result::Payload::EnvExec(x)) => x.exit_code,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
#[ignore = "needs Docker (run with --include-ignored)"]
async fn ten_execs_on_one_environment_run_together_and_destroy_waits_for_a_running_one() {
    let (rt, tmp) = runtime("dir").await;
    let env = env_id("par");
    let _c = Cleanup(vec![env.clone()]);
    create_box(&rt, &env).await;
    let j = Arc::new(Journal::open(&tmp.path().join("journal")).unwrap());
    let ex = Arc::new(RuntimeExecutor::new(rt.clone()));

    let t0 = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let (j, ex) = (j.clone(), ex.clone());
            let c = exec_cmd(&format!("cmd_par{i}"), &env, &["sleep", "0.5"]);
            tokio::spawn(async move { j.run(&c, ex.as_ref(), &progress().0).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(exit_code(&t.await.unwrap()), 0);
    }
    let took = t0.elapsed();
    // One after another would be 5 s.
    assert!(took < Duration::from_secs(3), "10 execs took {took:?}");

    // A destroy sent while an exec runs waits for it; the exec finishes normally.
    let (j2, ex2, env2) = (j.clone(), ex.clone(), env.clone());
    let running = tokio::spawn(async move {
        let o = j2
            .run(
                &exec_cmd("cmd_parlong", &env2, &["sh", "-c", "sleep 1.5; echo done"]),
                ex2.as_ref(),
                &progress().0,
            )
            .await;
        (o, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let destroy = Command {
        command_id: "cmd_pardestroy".into(),
        kind: "env.destroy".into(),
        env_id: env.clone(),
        payload: Some(command::Payload::EnvDestroy(EnvDestroy {})),
    };
    let o = j.run(&destroy, ex.as_ref(), &progress().0).await;
    let destroyed_at = Instant::now();
    assert!(o.result().ok, "{}", o.result().error);
    let (eo, exec_done) = running.await.unwrap();
    assert_eq!(exit_code(&eo), 0);
    match &eo.result().payload {
        Some(denv_proto::v1::command_result::Payload::EnvExec(x)) => {
            assert_eq!(x.stdout.trim(), "done")
        }
        other => panic!("{other:?}"),
    }
    assert!(exec_done <= destroyed_at, "destroy ended before the exec");
    assert!(containers_of(&env).is_empty(), "{:?}", containers_of(&env));
}
