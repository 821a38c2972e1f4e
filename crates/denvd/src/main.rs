//! The `denvd` binary: `join`, `run`, `install`, `version` (spec page `11-ref-denvd.md`).

use anyhow::{bail, Context};
use denvd::config::{self, Flags, InstallPaths, Verb, VERSION};
use denvd::journal::Journal;
use denvd::runtime::{Runtime, RuntimeConfig};
use denvd::stream::{self, RuntimeExecutor, StreamOptions};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The DNS refuser of a denied network (started by the runtime, outlives this process).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(denvd::runtime::refuser::ARG) {
        return match denvd::runtime::refuser::main(&args[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("denvd {}: {e}", denvd::runtime::refuser::ARG);
                ExitCode::FAILURE
            }
        };
    }
    let cli = match config::parse(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let result = match cli.verb {
        Verb::Version => {
            println!("{VERSION}");
            Ok(())
        }
        Verb::Join(f) => serve(f, false),
        Verb::Run(f) => serve(f, true),
        Verb::Install(f) => install(f),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("denvd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `join` (`require_identity = false`) and `run`.
fn serve(flags: Flags, require_identity: bool) -> anyhow::Result<()> {
    let root = config::is_root();
    let r = config::resolve(&flags, root).with_context(|| "reading the state file".to_string())?;
    let mut state = r.state.clone().unwrap_or_default();
    if require_identity && !state.has_identity() {
        bail!(
            "no saved identity in {}: run `denvd join --server URL --token T` first",
            r.state_path.display()
        );
    }
    if r.server.is_empty() {
        bail!("--server (or DENV_SERVER) is required");
    }
    if !state.has_identity() && r.token.is_empty() {
        bail!("a join token is required for the first join (--token or DENV_JOIN_TOKEN)");
    }
    // What is saved with the identity.
    state.server = r.server.clone();
    state.ca_file = r
        .ca_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    state.data_dir = r.data_dir.display().to_string();
    state.zfs_pool = r.zfs_pool.clone();
    if state.has_identity() {
        state
            .save(&r.state_path)
            .with_context(|| format!("saving {}", r.state_path.display()))?;
    }

    // The server URL and CA file are checked before anything starts.
    let trust = stream::trust(&r.server, r.ca_file.as_deref())?;
    let storage = config::detect_storage(&r);
    tracing::info!(server = %r.server, ca_file = ?r.ca_file, data = %r.data_dir.display(), ?storage, version = VERSION, "denvd starting");
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(async move {
        // The egress probe also tries the control plane's port on every host address.
        let egress_probe_ports: Vec<u16> = url_port(&r.server).into_iter().collect();
        let runtime = Runtime::new(RuntimeConfig {
            data_dir: r.data_dir.clone(),
            storage,
            egress_probe_target: std::env::var("DENV_EGRESS_PROBE_TARGET")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "http://1.1.1.1/".into()),
            egress_probe_ports,
            packet_filter: std::env::var("DENV_PACKET_FILTER").unwrap_or_default(),
            libfaketime: denvd::runtime::clock::lib_from_env(),
        })
        .await
        .context("starting the docker runtime")?;
        let journal = Arc::new(Journal::open(&r.data_dir)?);
        {
            let journal = journal.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
                loop {
                    every.tick().await;
                    let j = journal.clone();
                    let n = tokio::task::spawn_blocking(move || j.prune(denvd::journal::RETENTION))
                        .await
                        .unwrap_or(0);
                    if n > 0 {
                        tracing::info!(deleted = n, "journal: results older than 7 days deleted");
                    }
                }
            });
        }
        let mut exec = RuntimeExecutor::watching(runtime.clone())
            .with_ca_file(r.ca_file.as_deref())
            .map_err(anyhow::Error::msg)?;
        if let Some(addr) = flags.data_addr {
            let url =
                config::data_url(addr, flags.data_url.as_deref()).map_err(anyhow::Error::msg)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("data port: listening on {addr}"))?;
            let port = denvd::dataport::DataPort::new(runtime, &url);
            tracing::info!(%addr, %url, "data port listening");
            tokio::spawn(port.clone().serve(listener));
            exec = exec.with_data_port(port);
        }
        let exec = Arc::new(exec);
        let mut opts = StreamOptions::new(&r.server, &r.token, r.state_path.clone(), state);
        opts.trust = trust;
        tokio::select! {
            res = stream::run(opts, exec, journal) => res.map_err(anyhow::Error::from),
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("interrupted");
                Ok(())
            }
        }
    })
}

/// The port of a URL: explicit, else 80 for `http`, 443 for `https`.
fn url_port(url: &str) -> Option<u16> {
    let (scheme, rest) = url.split_once("://")?;
    let hostport = rest.split('/').next()?;
    let default = if scheme == "https" { 443 } else { 80 };
    let port = match hostport.strip_prefix('[') {
        Some(r) => r.split_once("]:").map(|x| x.1),
        None => hostport.rsplit_once(':').map(|x| x.1),
    };
    Some(port.and_then(|p| p.parse().ok()).unwrap_or(default))
}

/// `install`: Linux, root only.
fn install(flags: Flags) -> anyhow::Result<()> {
    if !cfg!(target_os = "linux") {
        bail!("install: linux only");
    }
    if !config::is_root() {
        bail!("install: must run as root");
    }
    let exe = std::env::current_exe().context("install: locating this binary")?;
    let paths = InstallPaths::under(std::path::Path::new("/"));
    config::install_files(&flags, &exe, &paths).map_err(anyhow::Error::msg)?;
    println!(
        "installed {}, {} and {}",
        paths.bin.display(),
        paths.env_file.display(),
        paths.unit.display()
    );
    for args in [&["daemon-reload"][..], &["enable", "--now", "denvd"][..]] {
        match std::process::Command::new("systemctl").args(args).status() {
            Ok(s) if s.success() => {}
            Ok(s) => bail!("install: systemctl {} failed ({s})", args.join(" ")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!(
                    "denvd: systemctl not found; the unit is written but not started. Start the sidecar yourself: {} join --state /etc/denv/host.json (with the variables of {})",
                    paths.bin.display(),
                    paths.env_file.display()
                );
                return Ok(());
            }
            Err(e) => bail!("install: systemctl {}: {e}", args.join(" ")),
        }
    }
    println!("denvd enabled and started (systemctl status denvd)");
    Ok(())
}
