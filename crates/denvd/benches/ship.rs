//! Shipping a snapshot host to host against `tar | tar` over the same TCP link. Real
//! Docker (the runtimes connect to the engine), real file systems (`dir` under
//! `/var/tmp`).
//!
//! ```text
//! cargo bench -p denvd --bench ship                      # release build, 1024 MiB, 3 trials
//! DENV_BENCH_SHIP_MIB=64 DENV_BENCH_SHIP_TRIALS=2 cargo bench -p denvd --bench ship
//! DENV_BENCH_SHIP_ADDR=10.231.0.1 …                      # the data port on another address
//! DENV_BENCH_SHIP_JSON=/tmp/ship.json …                  # the figures also as JSON
//! ```
//!
//! Host A's volume holds `mib` MiB of incompressible data in 64 files and is
//! snapshotted; each trial offers the snapshot on A's data port
//! ([`denvd::dataport::DataPort`], listening on `DENV_BENCH_SHIP_ADDR`, default
//! 127.0.0.1) and has host B receive it (`snapshot.receive`: fetch, unpack, check the
//! trailer's SHA-256, rename into place), timed from the request to the snapshot in
//! place. The baseline, in the same run and over the same address: `tar -cf -` of the
//! same volume written into a TCP connection, `tar -xf -` reading it on the other side
//! into a new directory, timed until that tar exits. Median of the trials; the ratio is
//! the pair-by-pair median of ship / tar.

mod support;
use denvd::dataport::{DataPort, Goods};
use denvd::runtime::{Runtime, RuntimeConfig};
use denvd::storage::{DirStorage, Storage};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::Instant;
use support::fill;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `tar -cf - -C src .` into a TCP connection to `addr`, `tar -xf - -C dst` from the
/// accepted side: seconds until the receiving tar is done.
fn tar_over_tcp(addr: &str, src: &Path, dst: &Path) -> f64 {
    use std::process::{Command, Stdio};
    let l = std::net::TcpListener::bind(format!("{addr}:0")).unwrap();
    let to = l.local_addr().unwrap();
    std::fs::create_dir_all(dst).unwrap();
    let t = Instant::now();
    let dst = dst.to_path_buf();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(&dst)
            .arg("-xf")
            .arg("-")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::copy(&mut s, tar.stdin.as_mut().unwrap()).unwrap();
        drop(tar.stdin.take());
        assert!(tar.wait().unwrap().success());
    });
    let mut conn = std::net::TcpStream::connect(to).unwrap();
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(src)
        .arg("-cf")
        .arg("-")
        .arg(".")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::copy(tar.stdout.as_mut().unwrap(), &mut conn).unwrap();
    assert!(tar.wait().unwrap().success());
    drop(conn);
    rx.join().unwrap();
    t.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mib: u64 = std::env::var("DENV_BENCH_SHIP_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let trials: usize = std::env::var("DENV_BENCH_SHIP_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let addr = std::env::var("DENV_BENCH_SHIP_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let root = tempfile::Builder::new()
        .prefix("denvd-bench-ship-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let (da, db) = (root.path().join("a"), root.path().join("b"));
    let a = Runtime::new(RuntimeConfig::new(&da))
        .await
        .expect("runtime a");
    let b = Runtime::new(RuntimeConfig::new(&db))
        .await
        .expect("runtime b");
    let st = DirStorage::new(&da);
    let env = format!("env_benchship{:06x}", rand::random::<u32>() & 0xffffff);
    let vols = vec!["data".to_string()];
    let vol = st.create(&env, "data").unwrap();
    fill(&vol, mib);
    let listener = tokio::net::TcpListener::bind(format!("{addr}:0"))
        .await
        .unwrap();
    let port = DataPort::new(
        a.clone(),
        &format!("http://{}", listener.local_addr().unwrap()),
    );
    tokio::spawn(port.clone().serve(listener));
    let client = reqwest::Client::new();
    println!("ship benchmark: {mib} MiB in 64 files, {trials} trials, over {addr}");
    let (mut ships, mut tars, mut ratios) = (vec![], vec![], vec![]);
    for i in 0..trials {
        let snap = format!("s{i}");
        st.snapshot(&env, &snap, &vols).unwrap();
        let token = format!("dsh_bench_{i}");
        let url = port
            .offer(
                Goods::Snapshot {
                    env: env.clone(),
                    snap: snap.clone(),
                    vols: vols.clone(),
                },
                &hex::encode(Sha256::digest(token.as_bytes())),
            )
            .unwrap();
        let t = Instant::now();
        let r = b
            .ship_receive(&client, &env, &snap, &vols, &url, &token, u64::MAX)
            .await
            .expect("ship");
        let ship = t.elapsed().as_secs_f64();
        let tar = tar_over_tcp(
            &addr,
            &st.snapshot_path(&env, &snap).join("data"),
            &root.path().join(format!("tar-{i}")),
        );
        println!(
            "| trial {i} | ship {ship:7.3} s ({} MiB archive) | tar | tar over TCP {tar:7.3} s | {:5.2}x |",
            r.bytes >> 20,
            ship / tar
        );
        ships.push(ship);
        tars.push(tar);
        ratios.push(ship / tar);
        std::fs::remove_dir_all(root.path().join(format!("tar-{i}"))).unwrap();
    }
    let (s, t, x) = (median(&mut ships), median(&mut tars), median(&mut ratios));
    println!(
        "ship {mib} MiB host to host: {s:.3} s; tar | tar over the same link: {t:.3} s; {x:.2}x (target <= 1.25x)"
    );
    if let Ok(p) = std::env::var("DENV_BENCH_SHIP_JSON") {
        let j = serde_json::json!({
            format!("ship_p2p_{mib}MiB_s"): s,
            format!("tar_tcp_{mib}MiB_s"): t,
            format!("ship_p2p_{mib}MiB_vs_tar_x"): x,
        });
        std::fs::write(p, j.to_string()).unwrap();
    }
    let _ = b.destroy(&env).await;
    st.destroy(&env).unwrap();
}
