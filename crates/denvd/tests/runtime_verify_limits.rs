//! verify.collect against a hostile agent on the real Engine (spec
//! `19-ref-protections.md` §3): symlinked parents, files the agent cannot read, a
//! 100 GB sparse file, exactly 256 MiB, a million files, names with any bytes, paths
//! over `PATH_MAX`, set-id bits and extended attributes. Each case asserts the exact
//! outcome; the limits also assert the wall time of the refusal and the peak memory of
//! this process (which is denvd's runtime: `VmHWM`, reset through `clear_refs` before
//! each case). One test in this binary, so nothing else moves the peak.

mod runtime_support;

use denv_compose::{Egress, Spec};
use denvd::runtime::{container_name, Runtime};
use runtime_support::*;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn agent_spec() -> Spec {
    let mut agent = svc("box", PYTHON);
    agent.user = "1000:1000".into();
    agent.env.insert("HOME".into(), "/home/agent".into());
    agent.volumes = vec![vol("home", "/home/agent")];
    let mut s = spec(vec![agent], &["home"], Egress::Allow);
    s.agent = Some(denv_compose::Agent {
        service: "box".into(),
    });
    s
}

/// `VmHWM` and `VmRSS` of this process, bytes.
fn mem() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = |k: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    (kb("VmHWM:") << 10, kb("VmRSS:") << 10)
}

fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

struct Outcome {
    files: u64,
    bytes: u64,
    refused: Vec<String>,
    took: Duration,
    /// Peak RSS during the call above the RSS before it, bytes.
    grew: u64,
    vid: String,
}

async fn collect(rt: &Runtime, env: &str, path: &str) -> Outcome {
    let (p, _rx) = progress();
    let vid = format!("dep_{:08x}", rand::random::<u32>());
    reset_peak();
    let before = mem().1;
    let t0 = Instant::now();
    let c = rt
        .verify_collect(env, &vid, "box", &[path.to_string()], true, &p)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let took = t0.elapsed();
    let grew = mem().0.saturating_sub(before);
    // Accepted: still frozen; unpause for the next case. Refused: resumed already.
    let st = rt
        .docker()
        .inspect_container(&container_name(env, "box"), None)
        .await
        .unwrap()
        .state
        .unwrap();
    if c.refused.is_empty() {
        assert_eq!(st.paused, Some(true), "{path}: accepted, agent frozen");
        rt.docker()
            .unpause_container(&container_name(env, "box"))
            .await
            .unwrap();
    } else {
        assert_eq!(st.paused, Some(false), "{path}: refused and resumed");
        assert!(!rt.submission_dir(&vid).exists(), "{path}: nothing kept");
    }
    Outcome {
        files: c.files,
        bytes: c.bytes,
        refused: c.refused,
        took,
        grew,
        vid,
    }
}

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn hostile_submissions_are_refused_exactly_in_bounded_time_and_memory() {
    let (rt, _t) = runtime("dir").await;
    let env = env_id("vl");
    let _c = Cleanup(vec![env.clone()]);
    let sp = agent_spec();
    let (p, _rx) = progress();
    rt.create(&env, &sp, &p).await.expect("create");
    let vol: PathBuf = rt.data_dir().join("envs").join(&env).join("vol/home");
    assert!(vol.is_dir(), "{}", vol.display());

    // ---- A symlinked parent directory pointing at root-owned files (/etc/shadow is
    // root's, 0640 in the image): refused on the collect path, nothing read.
    sh(&rt, &env, "box", "ln -s /etc /home/agent/out").await;
    let o = collect(&rt, &env, "/home/agent/out/shadow").await;
    assert_eq!(o.refused, ["home/agent/out/shadow: symlink"]);
    // Deeper below the symlink, and a symlinked directory inside a collected tree.
    let o = collect(&rt, &env, "/home/agent/out/ssl/certs").await;
    assert_eq!(o.refused, ["home/agent/out/ssl/certs: symlink"]);
    sh(
        &rt,
        &env,
        "box",
        "mkdir -p /home/agent/t/d && echo a > /home/agent/t/d/a && ln -s /root /home/agent/t/d/r",
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/t").await;
    assert_eq!(o.refused, ["home/agent/t/d/r: symlink"]);

    // ---- A directory the agent cannot read (planted by root, mode 0700): refused,
    // never copied with denvd's privileges.
    std::fs::create_dir(vol.join("locked")).unwrap();
    std::fs::write(vol.join("locked/key"), "secret").unwrap();
    std::fs::set_permissions(vol.join("locked"), PermissionsExt::from_mode(0o700)).unwrap();
    let o = collect(&rt, &env, "/home/agent/locked").await;
    assert_eq!(o.refused, ["home/agent/locked: not readable by the agent"]);
    std::fs::write(vol.join("key"), "secret").unwrap();
    std::fs::set_permissions(vol.join("key"), PermissionsExt::from_mode(0o600)).unwrap();
    let o = collect(&rt, &env, "/home/agent/key").await;
    assert_eq!(o.refused, ["home/agent/key: not readable by the agent"]);

    // ---- A 100 GB sparse file: refused from its size, nothing read, in well under a
    // second, without memory growth.
    sh(
        &rt,
        &env,
        "box",
        "python3 -c \"open('/home/agent/big','w').truncate(100<<30)\"",
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/big").await;
    assert_eq!(
        o.refused,
        ["home/agent/big: submission larger than 256 MiB"]
    );
    println!(
        "100 GB sparse: refused in {:?}, peak +{} KiB",
        o.took,
        o.grew >> 10
    );
    assert!(o.took < Duration::from_millis(500), "{:?}", o.took);
    assert!(o.grew < 16 * MIB, "peak grew by {} bytes", o.grew);

    // ---- Exactly 256 MiB passes (real bytes, streamed), one byte more is refused.
    sh(
        &rt,
        &env,
        "box",
        "rm /home/agent/big && head -c 268435456 /dev/urandom > /home/agent/exact",
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/exact").await;
    assert!(o.refused.is_empty(), "{:?}", o.refused);
    assert_eq!((o.files, o.bytes), (1, 256 * MIB));
    println!(
        "256 MiB: copied in {:?}, peak +{} KiB",
        o.took,
        o.grew >> 10
    );
    assert!(o.grew < 16 * MIB, "peak grew by {} bytes", o.grew);
    let copy = rt.submission_dir(&o.vid).join("home/agent/exact");
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), 256 * MIB);
    let same = std::process::Command::new("cmp")
        .arg(&copy)
        .arg(vol.join("exact"))
        .status()
        .unwrap();
    assert!(same.success(), "the copy has the same bytes");
    std::fs::remove_dir_all(rt.submission_dir(&o.vid)).unwrap();
    sh(&rt, &env, "box", "echo -n x >> /home/agent/exact").await;
    let o = collect(&rt, &env, "/home/agent/exact").await;
    assert_eq!(
        o.refused,
        ["home/agent/exact: submission larger than 256 MiB"]
    );
    assert!(o.took < Duration::from_millis(500), "{:?}", o.took);
    sh(&rt, &env, "box", "rm /home/agent/exact").await;

    // ---- Entry limit: the collected directory counts as one entry, so 19,999 files
    // in it pass and 20,000 do not.
    sh(
        &rt,
        &env,
        "box",
        "mkdir /home/agent/n && cd /home/agent/n && python3 -c 'for i in range(19999): open(f\"f{i}\", \"w\").close()'",
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/n").await;
    assert!(o.refused.is_empty(), "{:?}", o.refused);
    assert_eq!((o.files, o.bytes), (19_999, 0));
    sh(&rt, &env, "box", "touch /home/agent/n/one-more").await;
    let o = collect(&rt, &env, "/home/agent/n").await;
    assert_eq!(o.refused, ["home/agent/n: more than 20000 files"]);

    // ---- A million empty files: refused within the same bound.
    let t0 = Instant::now();
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import os,sys\nd=sys.argv[1]\nos.mkdir(d)\nfd=os.open(d,os.O_RDONLY)\n\
             for i in range(1000000): os.close(os.open(str(i),os.O_CREAT|os.O_WRONLY,0o644,dir_fd=fd))",
        )
        .arg(vol.join("million"))
        .status()
        .unwrap();
    assert!(made.success());
    println!("made a million files in {:?}", t0.elapsed());
    let o = collect(&rt, &env, "/home/agent/million").await;
    assert_eq!(o.refused, ["home/agent/million: more than 20000 files"]);
    println!(
        "million files: refused in {:?}, peak +{} KiB",
        o.took,
        o.grew >> 10
    );
    assert!(o.took < Duration::from_millis(500), "{:?}", o.took);
    assert!(o.grew < 16 * MIB, "peak grew by {} bytes", o.grew);

    // ---- Names: any bytes a Linux name can hold are copied exactly.
    sh(
        &rt,
        &env,
        "box",
        r#"python3 -c "
import os
os.mkdir(b'/home/agent/names')
for n in [b'\xff\xfe', b'a\nb', b'back\\slash', b'\x01ctl', 'é'.encode(), b'x'*255, b' lead', b'-dash', b'*', b'tab\t']:
    with open(b'/home/agent/names/' + n, 'wb') as f: f.write(n)
""#,
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/names").await;
    assert!(o.refused.is_empty(), "{:?}", o.refused);
    assert_eq!(o.files, 10);
    let copy = rt.submission_dir(&o.vid).join("home/agent/names");
    let mut got: Vec<Vec<u8>> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    let mut want: Vec<Vec<u8>> = std::fs::read_dir(vol.join("names"))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    for n in &got {
        let f = copy.join(std::ffi::OsStr::from_bytes(n));
        assert_eq!(&std::fs::read(f).unwrap(), n);
    }
    // A weird name in a refusal is shown escaped.
    sh(
        &rt,
        &env,
        "box",
        r#"python3 -c "import os; os.symlink('/etc', b'/home/agent/names/\xffl\nk')""#,
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/names").await;
    assert_eq!(o.refused, [r"home/agent/names/\xffl\x0ak: symlink"]);

    // ---- A path longer than PATH_MAX under /submission: a refusal with a reason.
    sh(
        &rt,
        &env,
        "box",
        "cd /home/agent && mkdir long && cd long && python3 -c \"
import os
for i in range(17):
    os.mkdir('a'*250); os.chdir('a'*250)
open('f','w').write('x')
\"",
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/long").await;
    let full = format!(
        "home/agent/long{}",
        format!("/{}", "a".repeat(250)).repeat(17)
    );
    assert_eq!(
        o.refused,
        [format!("{}…: path longer than 4095 bytes", &full[..120])]
    );

    // ---- The copy is normalised: set-id, sticky and write bits dropped, no extended
    // attributes, owned by nobody.
    sh(
        &rt,
        &env,
        "box",
        "mkdir /home/agent/m && echo '#!/bin/sh' > /home/agent/m/run && chmod 6777 /home/agent/m/run \
         && echo x > /home/agent/m/w && chmod 0666 /home/agent/m/w && chmod 1777 /home/agent/m \
         && python3 -c \"import os; os.setxattr('/home/agent/m/w', 'user.evil', b'1')\"",
    )
    .await;
    let o = collect(&rt, &env, "/home/agent/m").await;
    assert!(o.refused.is_empty(), "{:?}", o.refused);
    let m = rt.submission_dir(&o.vid).join("home/agent/m");
    for (p, mode) in [
        (m.clone(), 0o555),
        (m.join("run"), 0o555),
        (m.join("w"), 0o444),
    ] {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, mode, "{}", p.display());
        assert_eq!((md.uid(), md.gid()), (65534, 65534), "{}", p.display());
    }
    let xattrs = std::process::Command::new("python3")
        .args([
            "-c",
            "import os,sys; print(os.listxattr(sys.argv[1]), os.listxattr(sys.argv[2]))",
        ])
        .arg(vol.join("m/w"))
        .arg(m.join("w"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&xattrs.stdout).trim(),
        "['user.evil'] []",
        "the agent's file has the attribute, the copy has none"
    );

    rt.destroy(&env).await.unwrap();
}
