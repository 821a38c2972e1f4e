//! The `denv` command-line interface (spec page `10-ref-cli.md`): a thin client over the
//! gRPC API that prints each response as the REST API's JSON, indented.
//!
//! - [`cli`]: the command line (clap derive).
//! - [`output`]: JSON printing and the phase lines of followed deployments.
//! - [`run`]: carrying out a command.
//! - [`port`]: `denv import` and `denv export` (Harbor, Karotte, OpenEnv).
//!
//! Exit codes: 0 on success, 1 on any error (printed as `denv: <message>`) and after a
//! followed deployment that ended `failed` or `rolled_back`, 2 on usage errors;
//! `denv exec --stream`/`-i` exits with the command's exit code, or 125 when denv itself
//! failed.

pub mod cli;
pub mod context;
pub mod output;
pub mod port;
pub mod run;

pub use cli::Cli;
pub use run::Outcome;

use std::process::ExitCode;

/// Parses `args` (including the program name), runs the command, and returns the exit
/// code, printing errors to stderr.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    use clap::Parser;
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            // Help and version print to stdout and exit 0; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let var = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
    let mut cfg = match denv_client::Config::resolve() {
        Ok(c) => c,
        // A broken config file must not stop `denv login` from replacing it.
        Err(_) if !cli.command.needs_key() => denv_client::Config {
            server: var("DENV_SERVER").unwrap_or_else(|| denv_client::DEFAULT_SERVER.to_string()),
            api_key: None,
            team: None,
            ca_file: var("DENV_CA_FILE").map(Into::into),
            path: denv_client::Config::file_path(),
        },
        Err(e) => {
            eprintln!("denv: {e}");
            return ExitCode::from(1);
        }
    };
    let ca_flag = cli.ca_file.filter(|p| !p.as_os_str().is_empty());
    if matches!(cli.command, cli::Command::Login(_)) {
        // `login` picks its server itself and takes the saved CA file only with the
        // saved server; here only what was given now.
        cfg.ca_file = ca_flag.or_else(|| var("DENV_CA_FILE").map(Into::into));
    } else if let Some(ca) = ca_flag {
        cfg.ca_file = Some(ca);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("denv: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run::run(cli.command, cfg)) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::from(1),
        Ok(Outcome::Exit(code)) => ExitCode::from(code),
        Err(e) => {
            eprintln!("denv: {e:#}");
            ExitCode::from(1)
        }
    }
}
