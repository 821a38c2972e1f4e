//! Command line, environment fallbacks, the identity (state) file and storage
//! detection (spec page `11-ref-denvd.md`, "Verbs" and "Flags and environment").
//!
//! Resolution order for `server`, `data_dir` and `zfs_pool`: a flag given on the command
//! line, else the saved state, else the environment variable, else the default; the same
//! for `ca_file`, whose saved value counts only with the saved server. For the other
//! settings: flag, else environment, else default. `--env-file` is read into the process
//! environment before anything is resolved.

use crate::runtime::StorageKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The build version: `DENVD_VERSION` at build time, else `dev`.
pub const VERSION: &str = match option_env!("DENVD_VERSION") {
    Some(v) => v,
    None => "dev",
};

/// `denvd`: the denv sidecar.
#[derive(Debug, Parser)]
#[command(name = "denvd", about = "denv sidecar: runs environments on this machine", version = VERSION)]
pub struct Cli {
    /// The verb.
    #[command(subcommand)]
    pub verb: Verb,
}

/// The four verbs.
#[derive(Debug, Subcommand)]
pub enum Verb {
    /// Join the control plane (first connect with a join token) and run in the foreground.
    Join(Flags),
    /// Run with the saved identity (refuses without one).
    Run(Flags),
    /// Install as a systemd service (Linux, root only) and start it.
    Install(Flags),
    /// Print the build version.
    Version,
}

/// Flags shared by `join`, `run` and `install`.
#[derive(Debug, Clone, Default, Args)]
pub struct Flags {
    /// Control plane base URL, `http://` or `https://`.
    #[arg(long, env = "DENV_SERVER")]
    pub server: Option<String>,
    /// PEM file of the CA certificates an `https://` server's certificate must chain to,
    /// instead of the built-in and system roots.
    #[arg(long, env = "DENV_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Join token (`djt_…`); required on the first join; never persisted.
    #[arg(long, env = "DENV_JOIN_TOKEN")]
    pub token: Option<String>,
    /// Identity file [default: /etc/denv/host.json as root, else ~/.denv/host.json].
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Data directory [default: /var/lib/denv as root, else ~/.denv/data].
    #[arg(long = "data", env = "DENV_DATA_DIR")]
    pub data: Option<PathBuf>,
    /// ZFS pool; storage is zfs only when `zpool list <pool>` succeeds.
    #[arg(long, env = "DENV_ZFS_POOL")]
    pub zfs_pool: Option<String>,
    /// Use the btrfs backend (also chosen when the data directory is on btrfs).
    #[arg(long)]
    pub btrfs: bool,
    /// KEY=VALUE lines read into the environment before flags resolve.
    #[arg(long)]
    pub env_file: Option<PathBuf>,
    /// Address the data port listens on (`IP:PORT`), where other hosts fetch the
    /// snapshots and images this host offers; none by default (the host can then
    /// receive from others but not send).
    #[arg(long, env = "DENV_DATA_ADDR")]
    pub data_addr: Option<std::net::SocketAddr>,
    /// URL other hosts reach the data port at [default: `http://<data-addr>`; required
    /// when the address is 0.0.0.0 or [::]].
    #[arg(long, env = "DENV_DATA_URL")]
    pub data_url: Option<String>,
    /// Accepted for compatibility and unused: the egress probe runs inside the
    /// environment's network namespace, without a container or an image.
    #[arg(long, env = "DENV_PROBE_IMAGE", default_value = "busybox:1.36")]
    pub probe_image: String,
    /// Which of `server`, `ca_file`, `data`, `zfs_pool` were given on the command line
    /// (not environment): those beat the saved state.
    #[arg(skip)]
    pub explicit: Explicit,
}

/// The URL other hosts reach a data port listening on `addr` at: `url` when given
/// (its trailing `/` dropped), else `http://<addr>`. Error: neither a URL nor an address
/// other hosts could dial (0.0.0.0, [::]), or a URL that is not `http://`.
pub fn data_url(addr: std::net::SocketAddr, url: Option<&str>) -> Result<String, String> {
    match url.filter(|u| !u.is_empty()) {
        Some(u) if u.starts_with("http://") => Ok(u.trim_end_matches('/').to_string()),
        Some(u) => Err(format!("--data-url {u:?}: must be an http:// URL")),
        None if addr.ip().is_unspecified() => Err(format!(
            "--data-addr {addr} listens on every address: say with --data-url (DENV_DATA_URL) \
             which one other hosts reach"
        )),
        None => Ok(format!("http://{addr}")),
    }
}

/// Flags given on the command line itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Explicit {
    /// `--server` given.
    pub server: bool,
    /// `--ca-file` given.
    pub ca_file: bool,
    /// `--data` given.
    pub data: bool,
    /// `--zfs-pool` given.
    pub zfs_pool: bool,
}

/// Parses `args` (program name first): reads `--env-file` into the environment first,
/// then parses with environment fallbacks and records which flags were explicit.
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    if let Some(f) = env_file_arg(&args) {
        if let Err(e) = load_env_file(&f) {
            return Err(Cli::command().error(
                clap::error::ErrorKind::Io,
                format!("--env-file {}: {e}", f.display()),
            ));
        }
    }
    let matches = Cli::command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let Some((_, sub)) = matches.subcommand() {
        match &mut cli.verb {
            Verb::Join(f) | Verb::Run(f) | Verb::Install(f) => f.explicit = explicit_of(sub),
            Verb::Version => {}
        }
    }
    Ok(cli)
}

fn explicit_of(m: &ArgMatches) -> Explicit {
    let cl = |id: &str| matches!(m.value_source(id), Some(ValueSource::CommandLine));
    Explicit {
        server: cl("server"),
        ca_file: cl("ca_file"),
        data: cl("data"),
        zfs_pool: cl("zfs_pool"),
    }
}

/// The `--env-file` value in raw arguments (`--env-file F` or `--env-file=F`).
fn env_file_arg(args: &[std::ffi::OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--" {
            return None;
        }
        if s == "--env-file" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = s.strip_prefix("--env-file=") {
            return Some(PathBuf::from(v));
        }
    }
    None
}

/// Reads an env file into the process environment, its values winning over variables
/// already set, and returns the pairs in file order. Errors: the file cannot be read.
/// Format: see [`parse_env_lines`].
pub fn load_env_file(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)?;
    let pairs = parse_env_lines(&text);
    for (k, v) in &pairs {
        std::env::set_var(k, v);
    }
    Ok(pairs)
}

/// The pairs of an env file's text, parsed by `dotenvy` (the `.env` format: `KEY=VALUE`
/// lines, blank lines and `#` comments skipped, an optional `export ` prefix, single
/// quotes taken literally, double quotes with escapes, `$VAR`/`${VAR}` substitution).
/// A line that is not `KEY=VALUE` is skipped, as systemd's `EnvironmentFile=` (which
/// reads the same file) skips it; it is not echoed anywhere, since it may hold a secret.
pub fn parse_env_lines(text: &str) -> Vec<(String, String)> {
    dotenvy::from_read_iter(text.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

/// Whether the process runs as root (effective uid 0; `geteuid(2)`, the value the
/// second field of the `Uid:` line of `/proc/self/status` shows).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `/etc/denv/host.json` as root, else `~/.denv/host.json`.
pub fn default_state_path(root: bool) -> PathBuf {
    if root {
        PathBuf::from("/etc/denv/host.json")
    } else {
        home().join(".denv/host.json")
    }
}

/// `/var/lib/denv` as root, else `~/.denv/data`.
pub fn default_data_dir(root: bool) -> PathBuf {
    if root {
        PathBuf::from("/var/lib/denv")
    } else {
        home().join(".denv/data")
    }
}

/// The identity file: `server`, `host_id`, `secret`, `data_dir`, `zfs_pool`, and
/// `ca_file` when the server is reached with one (mode 0600).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Control plane base URL.
    #[serde(default)]
    pub server: String,
    /// `host_<ulid>`.
    #[serde(default)]
    pub host_id: String,
    /// `dhs_…`.
    #[serde(default)]
    pub secret: String,
    /// Data directory.
    #[serde(default)]
    pub data_dir: String,
    /// ZFS pool (`""` when none).
    #[serde(default)]
    pub zfs_pool: String,
    /// The CA file `server` is checked against (`""`, left out of the file: the default
    /// roots).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_file: String,
}

impl State {
    /// Whether a host id and secret are saved.
    pub fn has_identity(&self) -> bool {
        !self.host_id.is_empty() && !self.secret.is_empty()
    }

    /// Reads the state file; `Ok(None)` when it does not exist.
    pub fn load(path: &Path) -> std::io::Result<Option<State>> {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the state file atomically (temp file with mode 0600, then rename),
    /// creating its directory.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let body = serde_json::to_vec_pretty(self)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        write_private(path, &body)
    }
}

/// Writes `body` to `path` atomically with mode 0600 (temp + fsync + rename).
pub fn write_private(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    // The mode of an existing temp file is not changed by `mode()`: set it explicitly.
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::fs::rename(&tmp, path)
}

/// Everything `join`/`run`/`install` need, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Control plane base URL (`""` when none was given anywhere).
    pub server: String,
    /// The CA file an `https://` server is checked against (absolute; `None`: the
    /// built-in and system roots).
    pub ca_file: Option<PathBuf>,
    /// Join token (`""` when none).
    pub token: String,
    /// Identity file path.
    pub state_path: PathBuf,
    /// The saved identity, if the file exists.
    pub state: Option<State>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// ZFS pool (`""` when none).
    pub zfs_pool: String,
    /// `--btrfs`.
    pub btrfs: bool,
    /// `--probe-image` (unused; see [`Flags::probe_image`]).
    pub probe_image: String,
}

/// Resolves flags against the saved state (which wins for server, data dir and pool
/// unless the flag was given on the command line) and the defaults for `root`.
pub fn resolve(flags: &Flags, root: bool) -> std::io::Result<Resolved> {
    let state_path = flags
        .state
        .clone()
        .unwrap_or_else(|| default_state_path(root));
    let state = State::load(&state_path)?;
    let saved = |f: fn(&State) -> &str| {
        state
            .as_ref()
            .map(|s| f(s).to_string())
            .filter(|s| !s.is_empty())
    };
    let nonempty = |o: &Option<String>| o.clone().filter(|s| !s.is_empty());

    let server = match (flags.explicit.server, saved(|s| &s.server)) {
        (false, Some(s)) => s,
        _ => nonempty(&flags.server).unwrap_or_default(),
    };
    // The saved CA belongs to the saved server: it counts when that server is used and
    // `--ca-file` is not given.
    let ca_flag = flags.ca_file.clone().filter(|p| !p.as_os_str().is_empty());
    let server_saved = !flags.explicit.server && saved(|s| &s.server).is_some();
    let ca_file = match (flags.explicit.ca_file, saved(|s| &s.ca_file)) {
        (false, Some(c)) if server_saved => Some(PathBuf::from(c)),
        _ => ca_flag,
    };
    // Saved with the identity and read again from elsewhere: absolute, as the data dir.
    let ca_file = ca_file.map(|p| std::path::absolute(&p).unwrap_or(p));
    let data_flag = flags.data.clone().filter(|p| !p.as_os_str().is_empty());
    let data_dir = match (flags.explicit.data, saved(|s| &s.data_dir)) {
        (false, Some(d)) => PathBuf::from(d),
        _ => data_flag.unwrap_or_else(|| default_data_dir(root)),
    };
    // Docker refuses relative bind sources, and the quickstart passes `--data ./data`.
    let data_dir = std::path::absolute(&data_dir).unwrap_or(data_dir);
    let zfs_pool = match (flags.explicit.zfs_pool, saved(|s| &s.zfs_pool)) {
        (false, Some(p)) => p,
        _ => nonempty(&flags.zfs_pool).unwrap_or_default(),
    };
    Ok(Resolved {
        server: server.trim_end_matches('/').to_string(),
        ca_file,
        token: nonempty(&flags.token).unwrap_or_default(),
        state_path,
        state,
        data_dir,
        zfs_pool,
        btrfs: flags.btrfs,
        probe_image: flags.probe_image.clone(),
    })
}

/// The storage backend: `zfs` when a pool is configured and `zpool list <pool>`
/// succeeds, else `btrfs` when `--btrfs` is given or the data directory is on btrfs,
/// else `dir`. A configured pool that is not present is logged and ignored.
pub fn detect_storage(r: &Resolved) -> StorageKind {
    if !r.zfs_pool.is_empty() {
        let ok = std::process::Command::new("zpool")
            .args(["list", &r.zfs_pool])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return StorageKind::Zfs {
                pool: r.zfs_pool.clone(),
            };
        }
        tracing::warn!(pool = %r.zfs_pool, "zfs pool not available (zpool list failed); not using zfs");
    }
    if r.btrfs || on_btrfs(&r.data_dir) {
        return StorageKind::Btrfs;
    }
    StorageKind::Dir
}

/// Whether `dir` (created if missing) is on a btrfs file system (`stat -f -c %T`).
pub fn on_btrfs(dir: &Path) -> bool {
    let _ = std::fs::create_dir_all(dir);
    std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir)
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "btrfs")
        .unwrap_or(false)
}

/// The systemd unit `denvd install` writes (`11-ref-denvd.md`, "systemd unit").
pub const SYSTEMD_UNIT: &str = "[Unit]
Description=denv sidecar
After=network-online.target docker.service
Wants=network-online.target

[Service]
EnvironmentFile=/etc/denv/denvd.env
ExecStart=/usr/local/bin/denvd join --state /etc/denv/host.json
Restart=always
RestartSec=3
KillMode=process
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
";

/// Where `install` writes (the real paths, or under a test root).
#[derive(Debug, Clone)]
pub struct InstallPaths {
    /// `/usr/local/bin/denvd`.
    pub bin: PathBuf,
    /// `/etc/denv/denvd.env` (mode 0600).
    pub env_file: PathBuf,
    /// `/etc/systemd/system/denvd.service`.
    pub unit: PathBuf,
}

impl InstallPaths {
    /// The paths under `root` (`/` for a real install).
    pub fn under(root: &Path) -> Self {
        InstallPaths {
            bin: root.join("usr/local/bin/denvd"),
            env_file: root.join("etc/denv/denvd.env"),
            unit: root.join("etc/systemd/system/denvd.service"),
        }
    }
}

/// The `denvd.env` text: `DENV_SERVER`, `DENV_JOIN_TOKEN`, `DENV_DATA_DIR`,
/// `DENV_ZFS_POOL` (empty values for unset ones), and `DENV_CA_FILE` (absolute) when
/// `--ca-file` is given, `DENV_DATA_ADDR` / `DENV_DATA_URL` when `--data-addr` /
/// `--data-url` are.
pub fn env_file_text(flags: &Flags) -> String {
    let s = |o: &Option<String>| o.clone().unwrap_or_default();
    let ca = match flags.ca_file.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => format!(
            "DENV_CA_FILE={}\n",
            std::path::absolute(p)
                .unwrap_or_else(|_| p.clone())
                .display()
        ),
        None => String::new(),
    };
    let mut data_port = String::new();
    if let Some(a) = flags.data_addr {
        data_port.push_str(&format!("DENV_DATA_ADDR={a}\n"));
    }
    if let Some(u) = flags.data_url.as_ref().filter(|u| !u.is_empty()) {
        data_port.push_str(&format!("DENV_DATA_URL={u}\n"));
    }
    format!(
        "DENV_SERVER={}\nDENV_JOIN_TOKEN={}\nDENV_DATA_DIR={}\nDENV_ZFS_POOL={}\n{ca}{data_port}",
        s(&flags.server).trim_end_matches('/'),
        s(&flags.token),
        flags
            .data
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        s(&flags.zfs_pool),
    )
}

/// Writes the files of `denvd install`: copies `exe` to `paths.bin` (mode 0755, via a
/// temp file and rename; skipped when it is the same file), writes the env file (0600)
/// and the unit. Errors: `install: --server (or DENV_SERVER) is required`, I/O errors
/// with the path.
pub fn install_files(flags: &Flags, exe: &Path, paths: &InstallPaths) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if flags.server.as_deref().unwrap_or("").is_empty() {
        return Err("install: --server (or DENV_SERVER) is required".into());
    }
    let io = |p: &Path, e: std::io::Error| format!("install: {}: {e}", p.display());
    let same = match (
        std::fs::canonicalize(exe),
        std::fs::canonicalize(&paths.bin),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same {
        if let Some(d) = paths.bin.parent() {
            std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
        }
        let tmp = paths.bin.with_extension("new");
        std::fs::copy(exe, &tmp).map_err(|e| io(&tmp, e))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &paths.bin).map_err(|e| io(&paths.bin, e))?;
    }
    write_private(&paths.env_file, env_file_text(flags).as_bytes())
        .map_err(|e| io(&paths.env_file, e))?;
    if let Some(d) = paths.unit.parent() {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
    }
    std::fs::write(&paths.unit, SYSTEMD_UNIT).map_err(|e| io(&paths.unit, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines() {
        let p = parse_env_lines("# c\nDENV_SERVER=http://cp:8080\n\nexport DENV_JOIN_TOKEN=\"djt_1\"\nDENV_ZFS_POOL=\nbad\n");
        assert_eq!(
            p,
            vec![
                ("DENV_SERVER".into(), "http://cp:8080".into()),
                ("DENV_JOIN_TOKEN".into(), "djt_1".into()),
                ("DENV_ZFS_POOL".into(), String::new()),
            ]
        );
        // A malformed line is skipped and the lines after it still count; quotes,
        // comments after a value and references to earlier keys.
        let p = parse_env_lines(
            "DENV_A=1\nnot a pair\nDENV_B='lit $DENV_A'\nDENV_C=\"x y\" # note\nDENV_D=${DENV_A}2\n",
        );
        assert_eq!(
            p,
            vec![
                ("DENV_A".into(), "1".into()),
                ("DENV_B".into(), "lit $DENV_A".into()),
                ("DENV_C".into(), "x y".into()),
                ("DENV_D".into(), "12".into()),
            ]
        );
        // What `denvd install` writes reads back as written.
        let flags = Flags {
            server: Some("http://cp:8080".into()),
            token: Some("djt_abc".into()),
            zfs_pool: Some("tank".into()),
            ..Default::default()
        };
        assert_eq!(
            parse_env_lines(&env_file_text(&flags)),
            vec![
                ("DENV_SERVER".into(), "http://cp:8080".into()),
                ("DENV_JOIN_TOKEN".into(), "djt_abc".into()),
                ("DENV_DATA_DIR".into(), String::new()),
                ("DENV_ZFS_POOL".into(), "tank".into()),
            ]
        );
        // With a data port, its address and URL too.
        let flags = Flags {
            server: Some("http://cp:8080".into()),
            data_addr: Some("10.0.0.5:7700".parse().unwrap()),
            data_url: Some("http://h5.internal:7700".into()),
            ..Default::default()
        };
        let lines = parse_env_lines(&env_file_text(&flags));
        assert_eq!(
            lines[4..],
            [
                ("DENV_DATA_ADDR".into(), "10.0.0.5:7700".into()),
                ("DENV_DATA_URL".into(), "http://h5.internal:7700".into()),
            ]
        );
    }

    #[test]
    fn the_data_url_is_given_or_made_from_a_dialable_address() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert_eq!(
            data_url(a("10.0.0.5:7700"), None).unwrap(),
            "http://10.0.0.5:7700"
        );
        assert_eq!(
            data_url(a("0.0.0.0:7700"), Some("http://h5:7700/")).unwrap(),
            "http://h5:7700"
        );
        let e = data_url(a("0.0.0.0:7700"), None).unwrap_err();
        assert!(e.contains("--data-url"), "{e}");
        assert!(data_url(a("[::]:7700"), None).is_err());
        let e = data_url(a("10.0.0.5:7700"), Some("ftp://h5")).unwrap_err();
        assert!(e.contains("http://"), "{e}");
    }

    #[test]
    fn env_file_arg_forms() {
        let a = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(
            env_file_arg(&a(&["denvd", "join", "--env-file", "/x"])),
            Some(PathBuf::from("/x"))
        );
        assert_eq!(
            env_file_arg(&a(&["denvd", "install", "--env-file=/y"])),
            Some(PathBuf::from("/y"))
        );
        assert_eq!(env_file_arg(&a(&["denvd", "run"])), None);
    }
}
