//! `snapshot.receive` over HTTP against a hand-written server (`Runtime::ship_receive`):
//! a transfer whose bytes do not hash to the announced SHA-256, or that is longer than
//! announced, or that the server refuses, is refused with a clear error and leaves no
//! snapshot; the right one becomes a snapshot that forks; a present one is `cached`.
//! Needs Docker (the runtime connects to the engine).

mod runtime_support;

use denvd::storage::ship::Expected;
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
    let body = archive();
    let sha = hex::encode(Sha256::digest(&body));
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

    // A wrong digest.
    let wrong = "ab".repeat(32);
    let err = rt
        .ship_receive(
            &client,
            &env,
            "s1",
            &vols,
            &url,
            "dsh_good",
            Expected {
                bytes: body.len() as u64,
                sha256: wrong.clone(),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&wrong) && err.contains(&sha), "{err}");
    assert!(leftovers().is_empty(), "{:?}", leftovers());

    // A token the server refuses.
    let err = rt
        .ship_receive(
            &client,
            &env,
            "s1",
            &vols,
            &url,
            "dsh_stolen",
            Expected {
                bytes: body.len() as u64,
                sha256: sha.clone(),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("401") && err.contains("invalid ship token"),
        "{err}"
    );
    assert!(leftovers().is_empty());

    // More bytes than announced: refused before reading them (Content-Length), and
    // while reading when the length is not announced up front.
    let err = rt
        .ship_receive(
            &client,
            &env,
            "s1",
            &vols,
            &url,
            "dsh_good",
            Expected {
                bytes: body.len() as u64 - 512,
                sha256: sha.clone(),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("announced"), "{err}");
    assert!(leftovers().is_empty());

    // A truncated transfer (the server sends less than it said).
    let cut = serve(
        body[..body.len() - 1024].to_vec(),
        "dsh_good",
        Some(body.len() as u64),
    );
    let err = rt
        .ship_receive(
            &client,
            &env,
            "s1",
            &vols,
            &cut,
            "dsh_good",
            Expected {
                bytes: body.len() as u64,
                sha256: sha.clone(),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.is_empty());
    assert!(leftovers().is_empty(), "{:?}", leftovers());

    // The right one: a snapshot, with owner and mode; a second receive is `cached`.
    let r = rt
        .ship_receive(
            &client,
            &env,
            "s1",
            &vols,
            &url,
            "dsh_good",
            Expected {
                bytes: body.len() as u64,
                sha256: sha.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!((r.bytes, r.cached), (body.len() as u64, false));
    assert_eq!(leftovers(), vec!["s1".to_string()]);
    let f = snap_dir.join("s1/w/f");
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "shipped over http\n");
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&f).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (70, 70, 0o640));
    }
    let r = rt
        .ship_receive(
            &client,
            &env,
            "s1",
            &vols,
            "",
            "",
            Expected {
                bytes: 1,
                sha256: String::new(),
            },
        )
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
    let report = serde_json::to_string(&denv_proto::json::from_struct(
        report.body.as_ref().unwrap(),
    ))
    .unwrap();
    assert!(!report.contains(env.as_str()), "{report}");
    // A snapshot that is not there is not `cached`: with no URL it fails.
    assert!(rt
        .ship_receive(
            &client,
            &env,
            "s2",
            &vols,
            "",
            "",
            Expected {
                bytes: 1,
                sha256: String::new()
            }
        )
        .await
        .is_err());
    let _ = rt.destroy(&env).await;
}
