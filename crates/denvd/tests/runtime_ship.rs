//! Host to host: `snapshot.receive` over HTTP (`Runtime::ship_receive`) against a
//! hand-written server, where a transfer whose bytes do not hash to its trailer's
//! SHA-256, that is longer than allowed, cut short, or refused is refused with a clear
//! error and leaves no snapshot, and the right one becomes a snapshot that is `cached`
//! next time; then against a real data port ([`denvd::dataport::DataPort`]): one-time
//! tokens, offers of snapshots (sparse files arrive sparse) and of images.
//! Needs Docker (the runtime connects to the engine).

mod runtime_support;

use denvd::storage::ship::{trailer, Shipped};
use runtime_support::*;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

/// Serves `body` once per connection, `status` 200 when the request carries
/// `Authorization: Bearer <token>`, else 401. Returns the URL.
fn serve(body: Vec<u8>, token: &str, announce: Option<u64>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/ship/shp_test", l.local_addr().unwrap());
    let want = format!("authorization: bearer {}", token.to_lowercase());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut authorized = false;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if line.trim().to_lowercase() == want {
                    authorized = true;
                }
            }
            if authorized {
                let n = announce.unwrap_or(body.len() as u64);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(&body[..(n as usize).min(body.len())]);
            } else {
                let msg = b"{\"error\":\"invalid ship token\"}";
                let _ = write!(
                    s,
                    "HTTP/1.1 401 Unauthorized\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    msg.len()
                );
                let _ = s.write_all(msg);
            }
            let _ = s.flush();
            // The end of what this server sends (a short body ends early).
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
        }
    });
    url
}

/// The archive with the trailer `t` after it (the right one when `None`).
fn trailed(t: Option<&Shipped>) -> Vec<u8> {
    let a = archive();
    let right = Shipped {
        bytes: a.len() as u64,
        sha256: hex::encode(Sha256::digest(&a)),
    };
    let mut v = a;
    v.extend_from_slice(&trailer(t.unwrap_or(&right)).unwrap());
    v
}

fn archive() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h.set_size(0);
    b.append_data(&mut h, "w", std::io::empty()).unwrap();
    let data = b"shipped over http\n";
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o640);
    h.set_uid(70);
    h.set_gid(70);
    h.set_mtime(1_700_000_000);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, "w/f", &data[..]).unwrap();
    b.into_inner().unwrap()
}

#[tokio::test]
#[ignore = "needs Docker"]
async fn a_corrupted_or_refused_transfer_leaves_no_snapshot() {
    let (rt, tmp) = runtime("dir").await;
    let client = reqwest::Client::new();
    let data = tmp.path().join("data");
    let plain = archive();
    let sha = hex::encode(Sha256::digest(&plain));
    let body = trailed(None);
    let vols = vec!["w".to_string()];
    let env = env_id("ship");
    let snap_dir = data.join("snaps").join(&env);
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(&snap_dir)
            .map(|rd| {
                let mut v: Vec<String> = rd
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != denvd::storage::RECEIVED_MARK)
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default()
    };
    let url = serve(body.clone(), "dsh_good", None);
    let receive = |url: String, token: &'static str, limit: u64| {
        let (rt, client, env, vols) = (rt.clone(), client.clone(), env.clone(), vols.clone());
        async move {
            rt.ship_receive(&client, &env, "s1", &vols, &url, token, limit)
                .await
                .map_err(|e| e.to_string())
        }
    };

    // A trailer with another digest.
    let wrong = "ab".repeat(32);
    let bad = serve(
        trailed(Some(&Shipped {
            bytes: plain.len() as u64,
            sha256: wrong.clone(),
        })),
        "dsh_good",
        None,
    );
    let err = receive(bad, "dsh_good", 1 << 20).await.unwrap_err();
    assert!(err.contains(&wrong) && err.contains(&sha), "{err}");
    assert!(leftovers().is_empty(), "{:?}", leftovers());

    // A token the server refuses.
    let err = receive(url.clone(), "dsh_stolen", 1 << 20)
        .await
        .unwrap_err();
    assert!(
        err.contains("401") && err.contains("invalid ship token"),
        "{err}"
    );
    assert!(leftovers().is_empty());

    // More archive than allowed: refused while reading.
    let err = receive(url.clone(), "dsh_good", plain.len() as u64 - 512)
        .await
        .unwrap_err();
    assert!(err.contains("larger than"), "{err}");
    assert!(leftovers().is_empty());

    // A truncated transfer (the server sends less than it said; the trailer never
    // comes).
    let cut = serve(
        body[..body.len() - 1024].to_vec(),
        "dsh_good",
        Some(body.len() as u64),
    );
    let err = receive(cut, "dsh_good", 1 << 20).await.unwrap_err();
    assert!(!err.is_empty());
    assert!(leftovers().is_empty(), "{:?}", leftovers());

    // The right one: a snapshot, with owner and mode; a second receive is `cached`.
    let r = rt
        .ship_receive(&client, &env, "s1", &vols, &url, "dsh_good", 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        (r.bytes, r.sha256.as_str(), r.cached),
        (plain.len() as u64, sha.as_str(), false)
    );
    assert_eq!(leftovers(), vec!["s1".to_string()]);
    let f = snap_dir.join("s1/w/f");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "shipped over http\n");
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&f).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (70, 70, 0o640));
    }
    let r = rt
        .ship_receive(&client, &env, "s1", &vols, "", "", 1)
        .await
        .unwrap();
    assert!(r.cached && r.bytes == 0);
    // The start-up reconcile keeps a received snapshot (its environment runs elsewhere).
    let cleaned = rt.reconcile().await;
    assert!(!cleaned.contains(&env), "{cleaned:?}");
    assert_eq!(leftovers(), vec!["s1".to_string()]);
    // Nor is it reported as an environment of this host (the control plane would tear
    // down here an environment that runs elsewhere): not in `host.report`.
    assert!(!rt.list_envs().await.contains(&env));
    let report = denvd::stream::report_event(&rt).await;
    let report = serde_json::to_string(&denv_proto::json::to_json(&report)).unwrap();
    assert!(report.contains("host_report"), "{report}");
    assert!(!report.contains(env.as_str()), "{report}");
    // A snapshot that is not there is not `cached`: with no URL it fails.
    assert!(rt
        .ship_receive(&client, &env, "s2", &vols, "", "", 1)
        .await
        .is_err());
    let _ = rt.destroy(&env).await;
}

/// `GET url` with `token`: the status.
async fn status_of(url: &str, token: &str) -> u16 {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
#[ignore = "needs Docker"]
async fn snapshots_and_images_travel_between_data_ports() {
    use denvd::dataport::{DataPort, Goods};
    use denvd::storage::{DirStorage, Storage};
    use std::os::unix::fs::MetadataExt;
    let (a, ta) = runtime("dir").await;
    let (b, _tb) = runtime("dir").await;
    let client = reqwest::Client::new();
    // A snapshot on host A, made through its storage: a file, and a sparse file of
    // 1 GiB with 4 KiB of data in it.
    let env = env_id("port");
    let vols = vec!["w".to_string()];
    let st = DirStorage::new(ta.path().join("data"));
    let p = st.create(&env, "w").unwrap();
    std::fs::write(p.join("f"), "from host a\n").unwrap();
    let st_sh = format!(
        "cd '{}' && truncate -s 1G sparse && printf data | dd of=sparse bs=1M seek=512 conv=notrunc status=none",
        p.display()
    );
    assert!(std::process::Command::new("sh")
        .args(["-ec", &st_sh])
        .status()
        .unwrap()
        .success());
    st.snapshot(&env, "s1", &vols).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = DataPort::new(
        a.clone(),
        &format!("http://{}", listener.local_addr().unwrap()),
    );
    tokio::spawn(port.clone().serve(listener));
    let token = "dsh_one_time";
    let hash = hex::encode(Sha256::digest(token.as_bytes()));
    assert!(port.offer(Goods::Images(vec![]), "not-a-digest").is_err());
    let url = port
        .offer(
            Goods::Snapshot {
                env: env.clone(),
                snap: "s1".into(),
                vols: vols.clone(),
            },
            &hash,
        )
        .unwrap();
    assert!(
        url.starts_with(port.url()) && url.contains("/v1/ship/off_"),
        "{url}"
    );
    // A wrong token does not spend the offer, nor the right one on the other route.
    assert_eq!(status_of(&url, "dsh_guess").await, 401);
    assert_eq!(
        status_of(&url.replace("/v1/ship/", "/v1/images/"), token).await,
        404
    );
    let r = b
        .ship_receive(&client, &env, "s1", &vols, &url, token, 64 << 20)
        .await
        .unwrap();
    assert!(!r.cached && r.bytes < 1 << 20, "{r:?}");
    // Used once: gone.
    assert_eq!(status_of(&url, token).await, 404);
    let got = b.data_dir().join("snaps").join(&env).join("s1/w");
    assert_eq!(
        std::fs::read_to_string(got.join("f")).unwrap(),
        "from host a\n"
    );
    let m = std::fs::metadata(got.join("sparse")).unwrap();
    assert_eq!(m.len(), 1 << 30);
    assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
    let mut f = std::fs::File::open(got.join("sparse")).unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(512 << 20)).unwrap();
    let mut four = [0u8; 4];
    f.read_exact(&mut four).unwrap();
    assert_eq!(&four, b"data");

    // Images: the offer serves only its own ids; what the receiver's engine already
    // holds is not fetched; an id nobody holds fails naming it.
    let id = {
        let out = std::process::Command::new("docker")
            .args(["image", "inspect", "-f", "{{.Id}}", "busybox:1.36"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let ghost = format!("sha256:{}", "0".repeat(64));
    assert_eq!(
        b.missing_images(&[id.clone(), ghost.clone()])
            .await
            .unwrap(),
        vec![ghost.clone()]
    );
    let url = port.offer(Goods::Images(vec![id.clone()]), &hash).unwrap();
    assert_eq!(status_of(&format!("{url}?ids={ghost}"), token).await, 403);
    let url = port.offer(Goods::Images(vec![id.clone()]), &hash).unwrap();
    let r = b
        .receive_images(&client, std::slice::from_ref(&id), &url, token)
        .await
        .unwrap();
    assert!(r.loaded.is_empty() && r.bytes == 0, "{r:?}");
    let url = port
        .offer(Goods::Images(vec![ghost.clone()]), &hash)
        .unwrap();
    let err = b
        .receive_images(&client, std::slice::from_ref(&ghost), &url, token)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&ghost), "{err}");
    let err = b
        .receive_images(&client, std::slice::from_ref(&ghost), "", "")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no source"), "{err}");
    assert!(b
        .receive_images(&client, &["latest".into()], "", "")
        .await
        .is_err());
    st.destroy(&env).unwrap();
}
