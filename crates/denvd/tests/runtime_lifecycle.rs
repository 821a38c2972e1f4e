//! create → exec → put/get → snapshot → fork → rollback → destroy against the real
//! Docker Engine, once per storage backend (`dir`, `btrfs`; `zfs` when configured).

mod runtime_support;

use denv_compose::Egress;
use denvd::runtime::{bridge_name, container_name, network_name, Runtime};
use runtime_support::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

async fn lifecycle(rt: Runtime) {
    let parent = env_id("lc");
    let child = env_id("lcf");
    let _cleanup = Cleanup(vec![parent.clone(), child.clone()]);
    let mut db = svc("db", BUSYBOX);
    db.volumes = vec![vol("data", "/data")];
    db.health = health(&["CMD", "test", "-d", "/data"], 500, 20);
    let mut app = svc("app", BUSYBOX);
    app.depends_on = vec!["db".into()];
    app.volumes = vec![vol("data", "/shared")];
    let spec = spec(vec![db, app], &["data"], Egress::Deny);

    // create
    let (p, mut rx) = progress();
    let c = rt.create(&parent, &spec, &p).await.expect("create");
    assert_eq!(c.egress, "denied (verified)");
    assert!(
        c.endpoints.is_empty(),
        "no service declares a port: {:?}",
        c.endpoints
    );
    assert_eq!(c.storage, rt.storage_name());
    assert!(c.digests["db"].starts_with("sha256:"), "{:?}", c.digests);
    assert!(c.started_in > 0);
    let lines = drain(&mut rx);
    assert!(
        lines
            .iter()
            .any(|l| l == "healthy; egress denied (verified)"),
        "{lines:?}"
    );

    // What runs: names, labels, network, alias, files on disk.
    let d = rt.docker();
    let ci = d
        .inspect_container(&container_name(&parent, "db"), None)
        .await
        .unwrap();
    let labels = ci.config.unwrap().labels.unwrap();
    assert_eq!(labels["denv.env"], parent);
    assert_eq!(labels["denv.service"], "db");
    assert_eq!(labels["denv.managed"], "true");
    let net = d
        .inspect_network::<String>(&network_name(&parent), None)
        .await
        .unwrap();
    // A normal bridge named by denvd; the policy is in nftables (runtime_caps_egress.rs).
    assert_eq!(net.internal, Some(false));
    assert_eq!(
        net.options.unwrap()["com.docker.network.bridge.name"],
        bridge_name(&parent)
    );
    assert_eq!(net.labels.unwrap()["denv.egress"], "deny");
    let out = sh(&rt, &parent, "app", "nslookup db 2>&1 || true").await;
    assert!(
        out.contains("Address") && !out.contains("can't resolve"),
        "{out}"
    );
    let env_dir = rt.data_dir().join("envs").join(&parent);
    let compose = std::fs::read_to_string(env_dir.join("compose.yaml")).unwrap();
    assert!(compose.contains(&bridge_name(&parent)), "{compose}");
    assert!(compose.contains("denv.egress: deny"), "{compose}");
    assert!(compose.contains("mem_limit: 4096m"), "{compose}");
    assert!(compose.contains("pids_limit: 2048"), "{compose}");
    assert!(env_dir.join("spec.json").is_file());

    // exec: a shared volume, exit codes
    sh(&rt, &parent, "db", "echo v1 > /data/f").await;
    assert_eq!(sh(&rt, &parent, "app", "cat /shared/f").await, "v1\n");
    let r = rt
        .exec(
            &parent,
            "app",
            &argv(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (3, "out\n", "err\n")
    );
    let r = rt
        .exec(
            &parent,
            "app",
            &argv(&["sleep", "30"]),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 124);
    assert!(
        r.stderr.ends_with("denvd: command timed out after 1s"),
        "{}",
        r.stderr
    );

    // put / get
    let put = rt
        .put(
            &parent,
            "db",
            "/data/in/deep",
            tar_with("hello.txt", b"hi there"),
        )
        .await
        .unwrap();
    assert_eq!(put.path, "/data/in/deep");
    let t = rt
        .get(&parent, "db", "/data/in/deep/hello.txt")
        .await
        .unwrap();
    assert_eq!(
        untar_one(&t),
        ("hello.txt".to_string(), b"hi there".to_vec())
    );
    let e = rt
        .get(&parent, "db", "/nope")
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(e, "db: /nope: no such file or directory");

    // snapshot
    let (p, mut rx) = progress();
    let s = rt
        .snapshot(&parent, "ver_1", &[], &p)
        .await
        .expect("snapshot");
    assert_eq!(s.snapshot, "ver_1");
    assert_eq!(s.datasets.len(), 1);
    assert!(s.consistent);
    let lines = drain(&mut rx);
    assert!(
        s.frozen_for < 30_000,
        "frozen {} ms: {lines:?}",
        s.frozen_for
    );
    assert!(lines.iter().any(|l| l.ends_with("freezing 2 service(s)")));
    assert!(
        lines
            .iter()
            .any(|l| l.contains("(pause ") && l.contains(" ms, capture ")),
        "{lines:?}"
    );
    for svc in ["db", "app"] {
        let st = d
            .inspect_container(&container_name(&parent, svc), None)
            .await
            .unwrap()
            .state
            .unwrap();
        assert_eq!(
            (st.running, st.paused),
            (Some(true), Some(false)),
            "{svc} unpaused"
        );
    }
    let e = rt
        .snapshot(&parent, "ver_1", &[], &p)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("already exists"), "{e}");
    sh(&rt, &parent, "db", "echo v2 > /data/f").await;

    // fork: has the snapshot's data, its own network, independent writes
    let f = rt
        .fork(&child, &parent, "ver_1", &spec, &p)
        .await
        .expect("fork");
    assert!(f.forked_in > 0);
    assert_eq!(f.egress, "denied (verified)");
    assert_eq!(sh(&rt, &child, "db", "cat /data/f").await, "v1\n");
    assert_eq!(
        sh(&rt, &child, "db", "cat /data/in/deep/hello.txt").await,
        "hi there"
    );
    assert!(network_exists(&network_name(&child)));
    let fnet = d
        .inspect_container(&container_name(&child, "db"), None)
        .await
        .unwrap()
        .network_settings
        .unwrap()
        .networks
        .unwrap();
    assert_eq!(fnet.keys().collect::<Vec<_>>(), vec![&network_name(&child)]);
    sh(&rt, &child, "db", "echo fork > /data/f").await;
    assert_eq!(sh(&rt, &parent, "db", "cat /data/f").await, "v2\n");

    // rollback restores the snapshot (spec read back from disk)
    let rb = rt.rollback(&parent, "ver_1", &p).await.expect("rollback");
    assert_eq!(rb.snapshot, "ver_1");
    assert_eq!(sh(&rt, &parent, "db", "cat /data/f").await, "v1\n");
    assert_eq!(sh(&rt, &child, "db", "cat /data/f").await, "fork\n");

    // destroy the parent first: the fork keeps working
    let vol_dir = rt.data_dir().join("envs").join(&parent).join("vol");
    let snap_dir = rt.data_dir().join("snaps").join(&parent);
    assert!(vol_dir.join("data").is_dir() && snap_dir.join("ver_1").is_dir());
    let dr = rt.destroy(&parent).await.expect("destroy");
    assert_eq!(dr.destroyed, parent);
    assert!(containers_of(&parent).is_empty());
    assert!(!network_exists(&network_name(&parent)));
    assert!(!rt.data_dir().join("envs").join(&parent).exists());
    assert!(!snap_dir.exists());
    assert_eq!(sh(&rt, &child, "db", "cat /data/f").await, "fork\n");
    // idempotent
    rt.destroy(&parent).await.expect("destroy again");
    rt.destroy(&child).await.expect("destroy fork");
    assert!(containers_of(&child).is_empty());
    assert!(!network_exists(&network_name(&child)));
    assert!(!rt.data_dir().join("envs").join(&child).exists());
    assert!(!rt.list_envs().await.contains(&child));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn lifecycle_dir() {
    let (rt, _t) = runtime("dir").await;
    lifecycle(rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn lifecycle_btrfs() {
    let (rt, _t) = runtime("btrfs").await;
    lifecycle(rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and a zfs pool in DENV_TEST_ZFS_POOL (just unit makes one with e2e/lib/zfs.sh)"]
async fn lifecycle_zfs() {
    let pool = std::env::var("DENV_TEST_ZFS_POOL").expect(
        "cannot run: DENV_TEST_ZFS_POOL is unset (just unit makes a pool with e2e/lib/zfs.sh)",
    );
    let listed = std::process::Command::new("zpool")
        .args(["list", &pool])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        listed,
        "cannot run: `zpool list {pool}` fails (no zfs tools or no such pool)"
    );
    require_docker();
    let tmp = tempfile::Builder::new()
        .prefix("denvd-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut cfg = denvd::runtime::RuntimeConfig::new(tmp.path().join("data"));
    cfg.storage = denvd::runtime::StorageKind::Zfs { pool };
    let rt = Runtime::new(cfg).await.expect("runtime");
    lifecycle(rt).await;
}

/// Docker's named-volume semantics: an empty volume is filled from the image's content
/// at its mount path, with ownership and modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn copy_up_fills_empty_volumes() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("cu");
    let _c = Cleanup(vec![env.clone()]);
    let mut a = svc("a", BUSYBOX);
    a.volumes = vec![vol("etc", "/etc")];
    let mut b = svc("b", PYTHON);
    b.user = "1000:1000".into();
    b.volumes = vec![vol("home", "/home/agent")];
    let sp = spec(vec![a, b], &["etc", "home"], Egress::Allow);
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    let etc = rt.data_dir().join("envs").join(&env).join("vol/etc");
    let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap();
    assert!(passwd.starts_with("root:x:0:0"), "{passwd}");
    let home = rt.data_dir().join("envs").join(&env).join("vol/home");
    let m = std::fs::metadata(&home).unwrap();
    assert_eq!(
        m.permissions().mode() & 0o7777,
        0o777,
        "mode of /home/agent kept"
    );
    // The non-root agent can write into its volume, and it lands in the dataset.
    sh(&rt, &env, "b", "id -u > /home/agent/me").await;
    assert_eq!(std::fs::read_to_string(home.join("me")).unwrap(), "1000\n");
    assert_eq!(std::fs::metadata(home.join("me")).unwrap().uid(), 1000);
    rt.destroy(&env).await.unwrap();
}

/// PostgreSQL: copy-up of a volume owned by the postgres user, CHECKPOINT on snapshot,
/// and the fork has the committed row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn postgres_snapshot_and_fork() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("pg");
    let fork = env_id("pgf");
    let _c = Cleanup(vec![env.clone(), fork.clone()]);
    let mut db = svc("db", POSTGRES);
    db.command = vec![];
    db.env.insert("POSTGRES_PASSWORD".into(), "pw".into());
    db.volumes = vec![vol("pg", "/var/lib/postgresql/data")];
    db.health = health(&["CMD-SHELL", "pg_isready -U postgres"], 1000, 60);
    let sp = spec(vec![db], &["pg"], Egress::Deny);
    let (p, mut rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create postgres");
    sh(
        &rt,
        &env,
        "db",
        "psql -U postgres -c 'create table t(x int); insert into t values (42)'",
    )
    .await;
    let s = rt
        .snapshot(&env, "ver_pg", &[], &p)
        .await
        .expect("snapshot");
    assert!(s.consistent);
    let lines = drain(&mut rx);
    assert!(
        lines.iter().any(|l| l == "postgres CHECKPOINT in db"),
        "{lines:?}"
    );
    rt.fork(&fork, &env, "ver_pg", &sp, &p)
        .await
        .expect("fork postgres");
    let out = sh(&rt, &fork, "db", "psql -U postgres -tAc 'select x from t'").await;
    assert_eq!(out.trim(), "42");
    rt.destroy(&env).await.unwrap();
    rt.destroy(&fork).await.unwrap();
}

/// A failing healthcheck names the service and its last health output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn unhealthy_service_is_named() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("uh");
    let _c = Cleanup(vec![env.clone()]);
    let mut s = svc("web", BUSYBOX);
    s.health = health(&["CMD-SHELL", "echo not-ready-yet; exit 1"], 200, 2);
    let sp = spec(vec![s], &[], Egress::Deny);
    let (p, _rx) = progress();
    let e = rt.create(&env, &sp, &p).await.unwrap_err().to_string();
    assert!(
        e.starts_with("service \"web\" is unhealthy: exit 1: not-ready-yet"),
        "{e}"
    );
    let e = rt
        .create(
            &env,
            &spec(vec![svc("x", "denv-missing/image:0")], &[], Egress::Deny),
            &p,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "image \"denv-missing/image:0\" is not present locally and could not be pulled"
        ),
        "{e}"
    );
    // An image built on a host is never pulled from a registry under its name.
    let built = format!("denv-build/{}", "0".repeat(64));
    let e = rt
        .create(&env, &spec(vec![svc("x", &built)], &[], Egress::Deny), &p)
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "image {built:?} was built on this host and is gone from it; deploy again to build it"
        )
    );
    // A service with no healthcheck counts as ready once it runs; one that has exited
    // by the time the rest of the stack is ready fails the create (here it quits 0.3 s
    // after its start, while the other service needs about 0.8 s).
    let mut quits = svc("quits", BUSYBOX);
    quits.command = argv(&["sh", "-c", "sleep 0.3; echo bye; exit 3"]);
    let mut slow = svc("slow", BUSYBOX);
    slow.command = argv(&["sh", "-c", "sleep 0.8; touch /tmp/ok; sleep 1000"]);
    slow.health = health(&["CMD", "test", "-f", "/tmp/ok"], 100, 50);
    let sp = spec(vec![quits, slow], &[], Egress::Deny);
    let e = rt.create(&env, &sp, &p).await.unwrap_err().to_string();
    assert!(e.starts_with("service \"quits\" exited with code 3"), "{e}");
    assert!(e.contains("bye"), "{e}");
    rt.destroy(&env).await.unwrap();
}

/// A deploy of a new spec that fails, then a rollback to the previous snapshot: the
/// rollback restores the snapshot's data AND re-renders the snapshot's own spec, not the
/// failed one that was saved last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn rollback_uses_the_snapshots_spec() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("rbs");
    let _c = Cleanup(vec![env.clone()]);
    let mut good = svc("app", BUSYBOX);
    good.volumes = vec![vol("data", "/data")];
    good.command = argv(&["sh", "-c", "echo v1 > /data/v; sleep 1000000"]);
    good.health = health(&["CMD", "test", "-f", "/data/v"], 300, 10);
    let v1 = spec(vec![good], &["data"], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&env, &v1, &p).await.expect("create v1");
    rt.snapshot(&env, "ver_good", &[], &p)
        .await
        .expect("snapshot");

    let mut bad = svc("app", BUSYBOX);
    bad.volumes = vec![vol("data", "/data")];
    bad.command = argv(&["sh", "-c", "rm -f /data/v; sleep 1000000"]);
    bad.health = health(&["CMD", "false"], 200, 2);
    let v2 = spec(vec![bad], &["data"], Egress::Deny);
    let e = rt.create(&env, &v2, &p).await.unwrap_err().to_string();
    assert!(e.contains("unhealthy"), "{e}");

    rt.rollback(&env, "ver_good", &p).await.expect("rollback");
    assert_eq!(sh(&rt, &env, "app", "cat /data/v").await, "v1\n");
    // The saved spec is the one of the snapshot, with the image id it ran pinned.
    let saved = rt.saved_spec(&env).await.unwrap();
    assert!(
        saved.services[0].image_id.starts_with("sha256:"),
        "{saved:?}"
    );
    let mut want = v1.clone();
    want.services[0].image_id = saved.services[0].image_id.clone();
    // The snapshot's spec records the snapshot's world instant (x-denv.clock).
    assert!(saved.world_instant_ms > 0, "{saved:?}");
    want.world_instant_ms = saved.world_instant_ms;
    assert_eq!(saved, want);
    rt.destroy(&env).await.unwrap();
}

/// Builds a one-layer image on busybox whose `/which` says `word`, tagged `tag` (with a
/// label unique to the run, so the id is new); returns its id.
fn build_which(tag: &str, word: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("docker")
        .args(["build", "-q", "-t", tag, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let file =
        format!("FROM {BUSYBOX}\nRUN echo {word} > /which\nLABEL denv.test.run={tag}-{word}\n");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(file.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn docker_out(args: &[&str]) -> (bool, String) {
    let o = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
    )
}

/// A version's pinned image id runs whatever its tag names later; once that image is
/// gone from the host, a create from the pin fails naming the image and the id, and
/// creates nothing (never the image the tag names now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_pinned_image_survives_a_retag_and_a_removed_one_is_named() {
    let (rt, _t) = runtime("dir").await;
    let (first, pinned, now, gone) = (
        env_id("pin1"),
        env_id("pin2"),
        env_id("pin3"),
        env_id("pin4"),
    );
    let _c = Cleanup(vec![
        first.clone(),
        pinned.clone(),
        now.clone(),
        gone.clone(),
    ]);
    let tag = format!("denv-test/{}:1", first.to_lowercase());
    let one = build_which(&tag, "one");
    let sp = spec(vec![svc("main", &tag)], &[], Egress::Deny);
    let (p, _rx) = progress();
    let c = rt.create(&first, &sp, &p).await.expect("create");
    assert_eq!(c.image_ids["main"], one, "the id the tag named at create");

    // The tag moves to another image.
    let two = build_which(&tag, "two");
    assert_ne!(one, two);
    let mut pin = sp.clone();
    pin.services[0].image_id = one.clone();
    rt.create(&pinned, &pin, &p)
        .await
        .expect("create from the pin");
    assert_eq!(sh(&rt, &pinned, "main", "cat /which").await, "one\n");
    let (_, image) = docker_out(&[
        "inspect",
        "-f",
        "{{.Image}}",
        &container_name(&pinned, "main"),
    ]);
    assert_eq!(image, one);
    // Control: the tag alone now runs the other image.
    let c = rt.create(&now, &sp, &p).await.expect("create from the tag");
    assert_eq!(c.image_ids["main"], two);
    assert_eq!(sh(&rt, &now, "main", "cat /which").await, "two\n");

    // The pinned image leaves the host: the pin is refused by name, nothing is created.
    rt.destroy(&first).await.unwrap();
    rt.destroy(&pinned).await.unwrap();
    let (ok, out) = docker_out(&["rmi", &one]);
    assert!(ok, "{out}");
    let e = rt.create(&gone, &pin, &p).await.unwrap_err().to_string();
    assert!(
        e.contains(&format!("image {tag:?} of service \"main\" (pinned by the version as {one}) is no longer on this host")),
        "{e}"
    );
    assert!(
        containers_of(&gone).is_empty(),
        "{:?}",
        containers_of(&gone)
    );
    // An id that is not one is refused before the engine is asked.
    pin.services[0].image_id = "busybox:1.36".into();
    let e = rt.create(&gone, &pin, &p).await.unwrap_err().to_string();
    assert!(e.contains("is not sha256:<64 hex digits>"), "{e}");
    rt.destroy(&now).await.unwrap();
    docker_out(&["rmi", "-f", &tag]);
}

/// An empty volume at a path the image does not have belongs to the service's numeric
/// user, so a non-root agent can write its home (the quickstart on a stock image).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn empty_volume_at_a_new_path_belongs_to_the_service_user() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("own");
    let _c = Cleanup(vec![env.clone()]);
    let mut box_ = svc("box", BUSYBOX);
    box_.user = "1000:1000".into();
    box_.volumes = vec![vol("home", "/home/agent")];
    box_.command = argv(&["sleep", "1000000"]);
    let sp = spec(vec![box_], &["home"], Egress::Deny);
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    assert_eq!(
        sh(
            &rt,
            &env,
            "box",
            "echo 42 > /home/agent/answer.txt; id -u; stat -c %u:%g /home/agent"
        )
        .await,
        "1000\n1000:1000\n"
    );
    rt.destroy(&env).await.unwrap();
}
