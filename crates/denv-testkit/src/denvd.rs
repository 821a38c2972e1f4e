//! The real `denvd` binary joined to a control plane (these tests need Docker).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The binary `name` in the test binary's target directory (`target/<profile>/name`):
/// `denvd` is not a dependency of the tests, so `cargo build -p denvd` builds it first.
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>-… → target/<profile>/<name>
    let p = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(p.exists(), "{} missing: cargo build -p {name}", p.display());
    p
}

/// A running `denvd join`: its state (`host.json`), data (`data/`) and log
/// (`denvd.log`) in a dir of the caller's. Killed on drop.
pub struct Denvd {
    /// The process.
    pub child: Child,
    /// The dir of its state, data and log.
    pub dir: PathBuf,
}

impl Drop for Denvd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Denvd {
    /// `denvd join --server url --token token` with its state and data in `dir`; the
    /// egress probe aims at a documentation address (TEST-NET-1), which never answers.
    pub fn join(url: &str, token: &str, dir: &Path) -> Denvd {
        Denvd::join_trusting(url, token, dir, None)
    }

    /// [`Denvd::join`] with `--ca-file ca_file` when one is given (an `https://` control
    /// plane whose certificate that CA signed). Every sidecar started here has a data
    /// port on a free loopback port (`--data-addr 127.0.0.1:<port>`).
    pub fn join_trusting(url: &str, token: &str, dir: &Path, ca_file: Option<&Path>) -> Denvd {
        let mut cmd = Command::new(sibling_binary("denvd"));
        cmd.args(["join", "--server", url, "--token", token, "--state"])
            .arg(dir.join("host.json"))
            .arg("--data")
            .arg(dir.join("data"));
        if let Some(ca) = ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        cmd.arg("--data-addr").arg(format!("127.0.0.1:{port}"));
        let child = cmd
            .env("DENV_EGRESS_PROBE_TARGET", "http://192.0.2.1/")
            .env_remove("DENV_JOIN_TOKEN")
            .env_remove("DENV_SERVER")
            .env_remove("DENV_CA_FILE")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("denvd.log")).unwrap())
            .spawn()
            .expect("spawn denvd");
        Denvd {
            child,
            dir: dir.to_path_buf(),
        }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("denvd.log")).unwrap_or_default()
    }
}

/// Whether a Docker engine answers here; panics otherwise (the test was asked to run).
pub fn require_docker() {
    let ok = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "this test needs a reachable Docker engine");
}
