//! `x-denv.clock: frozen` on the real Docker Engine: every fork of a snapshot starts its
//! services' wall clock at the snapshot's world instant (a shell `date`, Python
//! `time.time()`, PostgreSQL `now()`), whenever the fork is made; `real` keeps the host's
//! clock; a host without libfaketime refuses a frozen clock.

mod runtime_support;

use denv_compose::{Clock, Egress, Spec};
use denvd::runtime::{clock, Runtime, RuntimeConfig};
use runtime_support::*;
use std::time::Duration;

const UBUNTU: &str = "ubuntu:24.04";
const REDIS: &str = "redis:7-alpine";

/// How far one reading may be from where the sidecar's offset puts it, besides the exec
/// round trip it was read in: the readings' own resolution (PostgreSQL µs, Python µs,
/// `date` ns, the offset ms) and rounding of the bounds to ms.
const SLACK_MS: i64 = 5;

fn now_ms() -> i64 {
    clock::real_now_ms()
}

/// A stack with a coreutils shell (Ubuntu stand-in: Debian's `date`), Python and
/// PostgreSQL, plus a static busybox (which the frozen clock does not cover).
fn world(clock: Clock) -> Spec {
    let mut db = svc("db", POSTGRES);
    db.command = vec![];
    db.env.insert("POSTGRES_PASSWORD".into(), "pw".into());
    db.volumes = vec![vol("pg", "/var/lib/postgresql/data")];
    db.health = health(&["CMD-SHELL", "pg_isready -U postgres"], 1000, 60);
    let mut sp = spec(
        vec![
            svc("bb", BUSYBOX),
            db,
            svc("py", PYTHON),
            svc("shell", UBUNTU),
        ],
        &["pg"],
        Egress::Deny,
    );
    sp.clock = Some(clock);
    sp
}

/// One service's wall clock, as epoch seconds printed by the process itself, with the
/// host's real time just before and just after the exec (ms).
struct Reading {
    service: &'static str,
    world_ms: i64,
    before: i64,
    after: i64,
}

async fn read(rt: &Runtime, env: &str, service: &'static str, cmd: &[&str]) -> Reading {
    let before = now_ms();
    let r = rt
        .exec(env, service, &argv(cmd), Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{service}: {e}"));
    let after = now_ms();
    assert_eq!(r.exit_code, 0, "{service}: {} {}", r.stdout, r.stderr);
    let secs: f64 = r
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{service}: {:?}: {e}", r.stdout));
    Reading {
        service,
        world_ms: (secs * 1000.0).round() as i64,
        before,
        after,
    }
}

/// The clocks of the three covered services (and busybox's, which is not covered).
async fn readings(rt: &Runtime, env: &str) -> (Vec<Reading>, Reading) {
    let covered = vec![
        read(rt, env, "shell", &["date", "+%s.%N"]).await,
        read(
            rt,
            env,
            "py",
            &["python3", "-c", "import time; print(time.time())"],
        )
        .await,
        read(
            rt,
            env,
            "db",
            &[
                "psql",
                "-U",
                "postgres",
                "-Atc",
                "select extract(epoch from now())",
            ],
        )
        .await,
    ];
    let bb = read(rt, env, "bb", &["date", "+%s"]).await;
    (covered, bb)
}

/// Asserts that each reading is the host's real time at the read plus `offset_ms`: the
/// process's clock minus the offset lies within the exec's real bounds (± [`SLACK_MS`]).
fn assert_on_offset(what: &str, rs: &[Reading], offset_ms: i64) {
    for r in rs {
        let real = r.world_ms - offset_ms;
        assert!(
            real >= r.before - SLACK_MS && real <= r.after + SLACK_MS,
            "{what}: {} reads {} = real {real} with offset {offset_ms} ms, outside [{}, {}]",
            r.service,
            r.world_ms,
            r.before,
            r.after
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, libfaketime and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn frozen_clock_forks_replay_the_snapshot_instant() {
    let (rt, _t) = runtime("dir").await;
    let ok = std::process::Command::new("docker")
        .args(["image", "inspect", UBUNTU])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "cannot run: image {UBUNTU} is missing (e2e/images/build.sh)"
    );
    clock::find_lib(None).expect("cannot run: libfaketime is missing (./e2e/setup-host.sh)");
    let src = env_id("clk");
    let forks: Vec<String> = (0..3).map(|i| env_id(&format!("clkf{i}"))).collect();
    let again = env_id("clkg");
    let mut all = vec![src.clone(), again.clone()];
    all.extend(forks.iter().cloned());
    let _c = Cleanup(all);
    let sp = world(Clock::Frozen);

    // A first deploy runs on the real clock.
    let (p, mut rx) = progress();
    rt.create(&src, &sp, &p).await.expect("create");
    let (covered, _) = readings(&rt, &src).await;
    assert_on_offset("the first deploy", &covered, 0);
    let lines = drain(&mut rx);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("clock frozen: this start runs on the real clock")),
        "{lines:?}"
    );

    let before = now_ms();
    let snap = rt
        .snapshot(&src, "ver_clk", &[], &p)
        .await
        .expect("snapshot");
    let after = now_ms();
    assert_eq!(snap.clock_offset_ms, 0);
    assert!(
        (before..=after).contains(&snap.world_instant_ms),
        "a real-clock snapshot's instant is the real time of its freeze: {} not in [{before}, {after}]",
        snap.world_instant_ms
    );
    let instant = snap.world_instant_ms;
    let mut fork_spec = sp.clone();
    fork_spec.world_instant_ms = instant;

    // Three forks, seconds apart in real time.
    let mut started = Vec::new();
    for (i, fork) in forks.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let t_req = now_ms();
        let f = rt
            .fork(fork, &src, "ver_clk", &fork_spec, &p)
            .await
            .unwrap_or_else(|e| panic!("fork {i}: {e}"));
        let t_done = now_ms();
        // The sidecar fixed the offset somewhere within the fork command: the fork's
        // clock started at the snapshot's instant at that moment.
        let start_real = instant - f.clock_offset_ms;
        assert!(
            start_real >= t_req && start_real <= t_done,
            "fork {i}: offset {} ms puts its start at real {start_real}, outside the command [{t_req}, {t_done}]",
            f.clock_offset_ms
        );
        let (covered, bb) = readings(&rt, fork).await;
        assert_on_offset(&format!("fork {i}"), &covered, f.clock_offset_ms);
        // busybox is static: it does not load the preload and reads the real clock.
        assert!(
            bb.world_ms / 1000 >= bb.before / 1000 && bb.world_ms / 1000 <= bb.after / 1000,
            "fork {i}: static busybox reads {} s, the real time was [{}, {}] ms",
            bb.world_ms / 1000,
            bb.before,
            bb.after
        );
        // Each service's own reading of the fork's start instant: its clock minus the
        // real time elapsed since the start.
        for r in &covered {
            let seen_start_lo = r.world_ms - (r.after - start_real);
            let seen_start_hi = r.world_ms - (r.before - start_real);
            eprintln!(
                "fork {i}: {} reads {} ms; its start on its clock [{}, {}] ms from the \
                 snapshot's instant (offset {} ms, fork took {} ms, {} ms after the snapshot)",
                r.service,
                r.world_ms,
                seen_start_lo - instant,
                seen_start_hi - instant,
                f.clock_offset_ms,
                t_done - t_req,
                t_req - instant
            );
            assert!(
                seen_start_lo - SLACK_MS <= instant && instant <= seen_start_hi + SLACK_MS,
                "fork {i}: {} saw its start at [{seen_start_lo}, {seen_start_hi}], not {instant}",
                r.service
            );
        }
        started.push((t_req, t_done, f.clock_offset_ms));
    }
    // Real time moved on between the forks by more than any fork took (the uncertainty
    // of where in its command a fork's clock started), and the offsets moved with it.
    let longest = started.iter().map(|(a, b, _)| b - a).max().unwrap();
    let moved = started[2].0 - started[0].0;
    assert!(
        moved > longest,
        "the forks were {moved} ms apart, the longest took {longest} ms"
    );
    assert!(
        started[0].2 - started[2].2 >= moved - longest,
        "offsets {:?} did not follow real time ({moved} ms)",
        started
    );

    // The library is read-only in the container; LD_PRELOAD unset in one's own process
    // shows the real clock (documented: the clock is for replay, not containment).
    let w = rt
        .exec(
            &forks[0],
            "shell",
            &argv(&["sh", "-c", "echo x >> /run/denv/libfaketime.so.1"]),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_ne!(w.exit_code, 0, "the mounted library is writable: {w:?}");
    let unset = read(
        &rt,
        &forks[0],
        "shell",
        &["env", "-u", "LD_PRELOAD", "date", "+%s.%N"],
    )
    .await;
    assert_on_offset("LD_PRELOAD unset", std::slice::from_ref(&unset), 0);

    // A snapshot of a frozen fork records the fork's world instant, and a fork of that
    // starts there: offsets compose.
    let f2 = &forks[2];
    let offset2 = started[2].2;
    let before = now_ms();
    let s2 = rt
        .snapshot(f2, "ver_clk2", &[], &p)
        .await
        .expect("snapshot of a fork");
    let after = now_ms();
    assert_eq!(s2.clock_offset_ms, offset2);
    assert!(
        (before + offset2..=after + offset2).contains(&s2.world_instant_ms),
        "{} not in [{}, {}]",
        s2.world_instant_ms,
        before + offset2,
        after + offset2
    );
    let mut spec2 = sp.clone();
    spec2.world_instant_ms = s2.world_instant_ms;
    let t_req = now_ms();
    let g = rt
        .fork(&again, f2, "ver_clk2", &spec2, &p)
        .await
        .expect("fork of a fork's snapshot");
    let t_done = now_ms();
    let start_real = s2.world_instant_ms - g.clock_offset_ms;
    assert!((t_req..=t_done).contains(&start_real));
    let (covered, _) = readings(&rt, &again).await;
    assert_on_offset("fork of the fork", &covered, g.clock_offset_ms);

    // A rollback restarts the snapshot's instant (it is in the snapshot's spec).
    let t_req = now_ms();
    let rb = rt.rollback(f2, "ver_clk2", &p).await.expect("rollback");
    let t_done = now_ms();
    let start_real = s2.world_instant_ms - rb.clock_offset_ms;
    assert!(
        (t_req..=t_done).contains(&start_real),
        "rollback: start at {start_real} outside [{t_req}, {t_done}]"
    );
    let (covered, _) = readings(&rt, f2).await;
    assert_on_offset("rollback", &covered, rb.clock_offset_ms);

    for e in [&src, &again].into_iter().chain(forks.iter()) {
        rt.destroy(e).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn real_clock_forks_read_the_host_clock() {
    let (rt, _t) = runtime("dir").await;
    let src = env_id("clr");
    let fork = env_id("clrf");
    let _c = Cleanup(vec![src.clone(), fork.clone()]);
    let sp = world(Clock::Real);
    let (p, _rx) = progress();
    rt.create(&src, &sp, &p).await.expect("create");
    let snap = rt.snapshot(&src, "ver_r", &[], &p).await.expect("snapshot");
    assert_eq!(snap.clock_offset_ms, 0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut fs = sp.clone();
    fs.world_instant_ms = snap.world_instant_ms;
    let f = rt.fork(&fork, &src, "ver_r", &fs, &p).await.expect("fork");
    assert_eq!(f.clock_offset_ms, 0, "real: no offset");
    let (covered, _) = readings(&rt, &fork).await;
    assert_on_offset("real-clock fork", &covered, 0);
    let env = sh(&rt, &fork, "shell", "env").await;
    assert!(!env.contains("LD_PRELOAD"), "{env}");
    rt.destroy(&src).await.unwrap();
    rt.destroy(&fork).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_frozen_clock_without_libfaketime_is_refused() {
    require_docker();
    let tmp = tempfile::Builder::new()
        .prefix("denvd-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut cfg = RuntimeConfig::new(tmp.path().join("data"));
    cfg.libfaketime = Some("/nonexistent/libfaketime.so.1".into());
    let rt = Runtime::new(cfg).await.expect("runtime");
    assert!(
        rt.capabilities().await.clock.starts_with("unavailable: "),
        "{}",
        rt.capabilities().await.clock
    );
    let env = env_id("cln");
    let _c = Cleanup(vec![env.clone()]);
    let mut sp = spec(vec![svc("box", BUSYBOX)], &[], Egress::Deny);
    sp.clock = Some(Clock::Frozen);
    let (p, _rx) = progress();
    let e = rt.create(&env, &sp, &p).await.unwrap_err().to_string();
    assert_eq!(
        e,
        "x-denv.clock: frozen needs libfaketime on this host: \
         DENV_LIBFAKETIME=/nonexistent/libfaketime.so.1 is not a file"
    );
    assert!(
        containers_of(&env).is_empty(),
        "nothing runs on the real clock instead"
    );
    rt.destroy(&env).await.unwrap();
}

/// Images libfaketime cannot run in stay on the real clock, reported in the fork's
/// result: a musl-based one (it has `/lib/ld-musl-<arch>.so.1`; a musl program preloading
/// the glibc libfaketime would not start: `Error relocating …: __snprintf_chk: symbol not
/// found`, exit 127; the image here is busybox with a file at the loader's path, which is
/// what denvd looks at) and the redis stand-in, whose Debian `redis-server` and
/// `redis-cli` link jemalloc and hang under libfaketime (it stays healthy here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, libfaketime and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn musl_and_jemalloc_images_stay_on_the_real_clock() {
    let (rt, _t) = runtime("dir").await;
    let ok = std::process::Command::new("docker")
        .args(["image", "inspect", REDIS])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "cannot run: image {REDIS} is missing (e2e/images/build.sh)"
    );
    clock::find_lib(None).expect("cannot run: libfaketime is missing (./e2e/setup-host.sh)");
    let loader = clock::musl_loader();
    let tag = format!("denv-test/musl-marked:{:08x}", rand::random::<u32>());
    let dockerfile = format!(
        "FROM {BUSYBOX}\nLABEL denv.test.musl={tag}\nRUN mkdir -p /lib && cp /bin/busybox {loader}\n"
    );
    let mut child = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &tag, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("docker build");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(dockerfile.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "docker build {tag}");
    let src = env_id("clm");
    let fork = env_id("clmf");
    let _c = Cleanup(vec![src.clone(), fork.clone()]);
    let mut rd = svc("rd", REDIS);
    rd.command = vec![];
    rd.health = health(&["CMD", "redis-cli", "ping"], 500, 40);
    let mut sp = spec(
        vec![svc("m", &tag), rd, svc("shell", UBUNTU)],
        &[],
        Egress::Deny,
    );
    sp.clock = Some(Clock::Frozen);
    let (p, mut rx) = progress();
    rt.create(&src, &sp, &p).await.expect("create");
    let snap = rt.snapshot(&src, "ver_m", &[], &p).await.expect("snapshot");
    sp.world_instant_ms = snap.world_instant_ms;
    tokio::time::sleep(Duration::from_secs(2)).await;
    drain(&mut rx);
    let f = rt.fork(&fork, &src, "ver_m", &sp, &p).await.expect("fork");
    assert_eq!(
        f.clock_real_services,
        [
            ("m".to_string(), format!("musl: {loader}")),
            (
                "rd".to_string(),
                format!(
                    "jemalloc: /usr/lib/{}-linux-gnu/libjemalloc.so.2",
                    std::env::consts::ARCH
                )
            ),
        ]
        .into_iter()
        .collect()
    );
    assert!(f.clock_offset_ms < -1000, "{}", f.clock_offset_ms);
    let lines = drain(&mut rx);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("clock frozen: service m stays on the real clock (musl: ")),
        "{lines:?}"
    );
    let env_of = |service: &str| {
        let out = std::process::Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{json .Config.Env}}",
                &denvd::runtime::container_name(&fork, service),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(!env_of("m").contains("LD_PRELOAD"), "{}", env_of("m"));
    assert!(!env_of("rd").contains("LD_PRELOAD"), "{}", env_of("rd"));
    let ping = sh(&rt, &fork, "rd", "redis-cli ping").await;
    assert_eq!(ping.trim(), "PONG");
    assert!(env_of("shell").contains("LD_PRELOAD=/run/denv/libfaketime.so.1"));
    let (covered, _) = (
        vec![read(&rt, &fork, "shell", &["date", "+%s.%N"]).await],
        (),
    );
    assert_on_offset("shell next to a musl service", &covered, f.clock_offset_ms);
    rt.destroy(&src).await.unwrap();
    rt.destroy(&fork).await.unwrap();
    let _ = std::process::Command::new("docker")
        .args(["rmi", &tag])
        .output();
}
