//! The DNS refuser of a denied environment's gateway, as a process of its own.
//!
//! Docker's embedded DNS (20.10) sends no answer at all when its upstream fails, so a
//! denied box's outside lookups would wait out the resolver's timeout unless something
//! on the gateway answers; and that answer must not depend on denvd being up. So the
//! refuser is the denvd binary run as `denvd __dns-refuser <bridge> <gateway>` (found by
//! [`denvd_binary`]), in a process group of its own, stdio on `/dev/null`: it binds UDP
//! and TCP `<gateway>:53` (sockets marked [`DNS_MARK`], so the policy lets queries reach
//! them and nothing else on the host), writes `/run/denv-dns/<bridge>.pid`, and answers
//! every query `REFUSED`. It outlives a `kill -9` of denvd (the systemd unit has
//! `KillMode=process`); it exits by itself within a second when its bridge is gone or
//! was recreated (another interface index), and on `SIGTERM` from [`stop`]. A restarted
//! denvd finds it alive by its pid file and leaves it be.

use super::netpolicy::{refuse, refuser_socket};
use super::{fail, Result, RuntimeError};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the refusers' pid files are: `<dir>/<bridge>.pid`, `<pid> <gateway>`.
pub const PID_DIR: &str = "/run/denv-dns";

/// The first argument that makes the denvd binary a refuser.
pub const ARG: &str = "__dns-refuser";

fn pid_file(bridge: &str) -> PathBuf {
    PathBuf::from(PID_DIR).join(format!("{bridge}.pid"))
}

/// Whether `pid` is a running refuser (its command line starts with `<bin> ARG`).
fn is_refuser(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|b| *b == 0).nth(1) == Some(ARG.as_bytes()))
        .unwrap_or(false)
}

/// The pid of the refuser of `bridge` answering on `gw`, when one runs.
pub fn running(bridge: &str, gw: Ipv4Addr) -> Option<i32> {
    let s = std::fs::read_to_string(pid_file(bridge)).ok()?;
    let mut w = s.split_whitespace();
    let pid: i32 = w.next()?.parse().ok()?;
    let addr: Ipv4Addr = w.next()?.parse().ok()?;
    (addr == gw && is_refuser(pid)).then_some(pid)
}

/// The denvd binary: `DENV_DENVD_BIN` when set, the running executable when it is
/// denvd, else `denvd` next to it or one directory up (a cargo test binary in
/// `target/<profile>/deps`), else `denvd` on `PATH`.
pub fn denvd_binary() -> PathBuf {
    if let Some(b) = std::env::var_os("DENV_DENVD_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(b);
    }
    if let Ok(exe) = std::env::current_exe() {
        if exe.file_name().is_some_and(|n| n == "denvd") {
            return exe;
        }
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        for c in [dir.join("denvd"), dir.join("../denvd")] {
            if c.is_file() {
                return c;
            }
        }
    }
    PathBuf::from("denvd")
}

/// Starts the refuser of `bridge` on `gw:53` unless one runs, and waits (up to 3 s) for
/// it to answer for that address. Errors: `dns refuser on <gw>:53: …` (the binary cannot
/// be run, or the refuser exited: its sockets could not be made).
pub(crate) fn ensure(bridge: &str, gw: Ipv4Addr) -> Result<()> {
    if running(bridge, gw).is_some() {
        return Ok(());
    }
    let addr = SocketAddrV4::new(gw, 53);
    let bin = denvd_binary();
    let mut child = std::process::Command::new(&bin)
        .args([ARG, bridge, &gw.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| {
            RuntimeError::io(format!("dns refuser on {addr}: run {}", bin.display()), e)
        })?;
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        if running(bridge, gw) == Some(child.id() as i32) {
            // Reaped when it ends while this process lives; reparented if denvd dies.
            drop(child.stderr.take());
            std::thread::spawn(move || child.wait());
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return fail(format!(
                "dns refuser on {addr}: exited ({st}): {}",
                err.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    fail(format!("dns refuser on {addr}: did not start within 3 s"))
}

/// Stops the refuser of `bridge` (when one runs) and removes its pid file.
pub(crate) fn stop(bridge: &str) {
    let f = pid_file(bridge);
    if let Ok(s) = std::fs::read_to_string(&f) {
        if let Some(pid) = s
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<i32>().ok())
        {
            if pid > 0 && is_refuser(pid) {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
    let _ = std::fs::remove_file(&f);
}

/// `denvd __dns-refuser <bridge> <gateway>`: binds, writes the pid file, answers every
/// query `REFUSED` until the bridge is gone or recreated. Returns an error message when
/// it cannot start (the caller prints it and exits non-zero).
pub fn main(args: &[String]) -> std::result::Result<(), String> {
    let [bridge, gw] = args else {
        return Err(format!("usage: denvd {ARG} <bridge> <gateway>"));
    };
    let gw: Ipv4Addr = gw.parse().map_err(|e| format!("gateway {gw:?}: {e}"))?;
    let ifindex =
        nix::net::if_::if_nametoindex(bridge.as_str()).map_err(|e| format!("{bridge}: {e}"))?;
    let addr = SocketAddrV4::new(gw, 53);
    let udp = refuser_socket(addr, false).map_err(|e| format!("{addr} (udp): {e}"))?;
    let tcp = refuser_socket(addr, true).map_err(|e| format!("{addr} (tcp): {e}"))?;
    let udp = std::net::UdpSocket::from(udp);
    let tcp = std::net::TcpListener::from(tcp);
    udp.set_nonblocking(false).map_err(|e| e.to_string())?;
    tcp.set_nonblocking(false).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(PID_DIR).map_err(|e| format!("{PID_DIR}: {e}"))?;
    let f = pid_file(bridge);
    let tmp = f.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, format!("{} {gw}\n", std::process::id()))
        .and_then(|()| std::fs::rename(&tmp, &f))
        .map_err(|e| format!("{}: {e}", f.display()))?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            if let Ok((n, from)) = udp.recv_from(&mut buf) {
                if let Some(r) = refuse(&buf[..n]) {
                    let _ = udp.send_to(&r, from);
                }
            }
        }
    });
    std::thread::spawn(move || {
        for s in tcp.incoming().flatten() {
            std::thread::spawn(move || answer_tcp(s));
        }
    });
    loop {
        std::thread::sleep(Duration::from_millis(500));
        if nix::net::if_::if_nametoindex(bridge.as_str()).ok() != Some(ifindex) {
            // The pid file is ours only while it names us.
            if running(bridge, gw) == Some(std::process::id() as i32) {
                let _ = std::fs::remove_file(&f);
            }
            return Ok(());
        }
    }
}

/// One TCP connection: up to 16 length-prefixed queries, each answered `REFUSED`.
fn answer_tcp(mut s: std::net::TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    for _ in 0..16 {
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
        if s.read_exact(&mut q).is_err() {
            return;
        }
        let Some(r) = refuse(&q) else { return };
        let mut out = (r.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&r);
        if s.write_all(&out).is_err() {
            return;
        }
    }
}
