//! The command line (spec page `10-ref-cli.md`), as clap derive types.
//!
//! Unlike the Go tool the spec describes, flags may come before or after positional
//! arguments; the documented order (`denv fork --name f1 alpha`) keeps working.

use clap::{ArgAction, Args, Parser, Subcommand};
use std::path::PathBuf;

/// denv: deploy, snapshot, fork and grade agent environments.
///
/// Environments are named by id (`env_…`); commands that take an environment also accept
/// its name when `--project` is given. Flags may come before or after positional
/// arguments.
///
/// Server and credential: `DENV_SERVER` and `DENV_API_KEY`, else the config file that
/// `denv login` writes (`$XDG_CONFIG_HOME/denv/config.json` or
/// `~/.config/denv/config.json`). An `https://` server's certificate is checked against
/// the built-in and system roots, or the CA certificates of `--ca-file` (`DENV_CA_FILE`).
/// Output is the response as indented JSON; errors print `denv: <message>` and exit 1;
/// usage errors exit 2.
#[derive(Parser, Debug, PartialEq)]
#[command(name = "denv", version)]
pub struct Cli {
    /// PEM file of the CA certificates an https:// server's certificate must chain to,
    /// instead of the built-in and system roots [env: DENV_CA_FILE]
    #[arg(long, global = true, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Every command of the CLI.
#[derive(Subcommand, Debug, PartialEq)]
pub enum Command {
    /// Sign in with the device flow and save the key to the config file.
    Login(LoginArgs),
    /// Show the team (and user) the credential belongs to.
    Whoami,
    /// List the project kinds and templates.
    Templates {
        /// Only templates of this kind (`rl-environment`, `agent`).
        #[arg(long)]
        kind: Option<String>,
    },
    /// Write a template's compose file.
    Init {
        /// A template name (`rl-environment-ops`) or kind (`rl-environment`, `agent`).
        name: String,
        /// Where to write the compose file (never overwritten).
        #[arg(long, default_value = "compose.yaml")]
        out: PathBuf,
    },
    /// Create and list projects, list a project's environments.
    #[command(subcommand)]
    Project(ProjectCmd),
    /// Connect and list clouds.
    #[command(subcommand)]
    Cloud(CloudCmd),
    /// List hosts, mint a join token.
    #[command(subcommand)]
    Host(HostCmd),
    /// Deploy a compose file to a project's environment.
    Deploy(DeployArgs),
    /// Show, list versions and deployments of, or destroy an environment.
    #[command(subcommand)]
    Env(EnvCmd),
    /// Fork an environment from a version into a new environment.
    Fork(ForkArgs),
    /// Capture an environment's live state as a new version.
    Snapshot(SnapshotArgs),
    /// Freeze the agent, collect its work, and grade it on a fork.
    Verify(VerifyArgs),
    /// Copy files into or out of a service.
    #[command(subcommand)]
    Files(FilesCmd),
    /// Restore an environment to one of its healthy versions.
    Rollback(RollbackArgs),
    /// Run the promote gates on a version of one environment; when they pass, another
    /// environment of the project runs it.
    Promote(PromoteArgs),
    /// Print the data sheet of a version (or of an environment's current version).
    Sheet(SheetArgs),
    /// Run a command in a service of an environment.
    Exec(ExecArgs),
    /// Print the container logs of an environment's services.
    Logs(LogsArgs),
    /// Show or watch a deployment.
    #[command(subcommand)]
    Deployment(DeploymentCmd),
    /// Turn a Harbor task or a Karotte environment into a denv project and deploy it.
    #[command(subcommand)]
    Import(ImportCmd),
    /// Write a version of a project as Harbor tasks (`--harbor`) or as an OpenEnv
    /// environment package (`--openenv`).
    Export(ExportArgs),
    /// List events of a subject (`env:<id>`, `dep:<id>`, `host:<id>`, `cmd:<id>`).
    Events {
        /// The subject, e.g. `env:env_01…`.
        subject: String,
    },
}

/// A TTL flag in seconds: `90`, `90s`, `30m`, `2h`, `1d`, or units combined largest
/// first (`1h30m`). Error: `invalid TTL "x": use seconds (90) or a duration like 30m, 2h,
/// 1h30m`; zero is refused (`a TTL must be at least 1s`).
pub fn parse_ttl(s: &str) -> Result<i64, String> {
    let bad = || format!("invalid TTL {s:?}: use seconds (90) or a duration like 30m, 2h, 1h30m");
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let total = if t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<i64>().map_err(|_| bad())?
    } else {
        let mut total: i64 = 0;
        let mut num = String::new();
        let mut last_unit = i64::MAX;
        for c in t.chars() {
            if c.is_ascii_digit() {
                num.push(c);
                continue;
            }
            let unit = match c {
                'd' => 86_400,
                'h' => 3_600,
                'm' => 60,
                's' => 1,
                _ => return Err(bad()),
            };
            if num.is_empty() || unit >= last_unit {
                return Err(bad());
            }
            let n: i64 = num.parse().map_err(|_| bad())?;
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
            num.clear();
            last_unit = unit;
        }
        if !num.is_empty() {
            return Err(bad());
        }
        total
    };
    if total < 1 {
        return Err("a TTL must be at least 1s".into());
    }
    Ok(total)
}

/// `denv login`.
#[derive(Args, Debug, PartialEq)]
pub struct LoginArgs {
    /// The control plane (default: `DENV_SERVER`, the saved server, or
    /// `http://localhost:8080`).
    #[arg(long)]
    pub server: Option<String>,
    /// Print the URL instead of opening a browser.
    #[arg(long)]
    pub no_browser: bool,
    /// Ignored (login parses only its own two flags).
    #[arg(hide = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub ignored: Vec<String>,
}

/// An environment argument: an id, or a name looked up in `--project`.
#[derive(Args, Debug, PartialEq, Clone)]
pub struct EnvSel {
    /// Environment id (`env_…`); with --project, its name is accepted too.
    pub env: String,
    /// Project (id or name) in which to look up an environment given by name.
    #[arg(long)]
    pub project: Option<String>,
}

/// `--wait` / `--wait=false` of the commands that start a deployment.
#[derive(Args, Debug, PartialEq, Clone, Copy)]
pub struct WaitFlag {
    /// Follow the deployment and print its phases (default); `--wait=false` prints the
    /// 202 response and returns.
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        default_missing_value = "true",
        num_args = 0..=1,
        require_equals = true,
        action = ArgAction::Set
    )]
    pub wait: bool,
}

/// `denv project …`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum ProjectCmd {
    /// Create a project and its `alpha` environment.
    Create {
        /// `rl-environment` or `agent`.
        #[arg(long, default_value = "rl-environment")]
        kind: String,
        /// Free text, conventionally `github:owner/repo`.
        #[arg(long)]
        source: Option<String>,
        /// The project's name.
        name: String,
    },
    /// List the team's projects.
    List,
    /// List a project's environments.
    Envs {
        /// Project name or id.
        project: String,
    },
    /// Delete a project: refused while it has environments that are not destroyed,
    /// unless --force, which destroys them first (waiting for each destroy).
    Delete {
        /// Destroy the project's live environments first.
        #[arg(long)]
        force: bool,
        /// Project name or id.
        project: String,
    },
}

/// `denv cloud …`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum CloudCmd {
    /// Record a cloud (`manual`, `hetzner`, `e2b`, `daytona`); the provider validates it.
    Connect {
        /// The provider.
        provider: String,
        /// A name for the cloud.
        #[arg(long)]
        name: Option<String>,
        /// The provider's API token.
        #[arg(long)]
        token: Option<String>,
        /// Machine type (hetzner; default `cpx31`).
        #[arg(long)]
        server_type: Option<String>,
        /// Location (hetzner; default `nbg1`).
        #[arg(long)]
        location: Option<String>,
    },
    /// List the team's clouds (secrets shown as `•••`).
    List,
}

/// `denv host …`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum HostCmd {
    /// List hosts, each with a `connected` flag.
    List,
    /// Mint a single-use join token (valid 1 hour) and its install command.
    JoinToken,
}

/// `denv deploy`.
#[derive(Args, Debug, PartialEq)]
pub struct DeployArgs {
    /// Project name or id.
    #[arg(long)]
    pub project: String,
    /// Environment name.
    #[arg(long, default_value = "alpha")]
    pub env: String,
    /// The compose file.
    #[arg(short = 'f', long = "file", default_value = "compose.yaml")]
    pub file: PathBuf,
    /// Warm command run after health, split on whitespace (e.g. "make warm").
    #[arg(long)]
    pub warm: Option<String>,
    /// Destroy the environment this long from now: seconds (`90`) or a duration (`30m`,
    /// `2h`, `1h30m`, `1d`). Without it an existing environment keeps its TTL.
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl: Option<i64>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

/// `denv env …`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum EnvCmd {
    /// List the team's environments across projects (destroyed ones only with --all or
    /// --status destroyed), as a table.
    List(EnvListArgs),
    /// Show an environment and whether its host is connected.
    Get(EnvSel),
    /// List an environment's versions.
    Versions(EnvSel),
    /// List an environment's deployments.
    Deployments(EnvSel),
    /// Start a destroy deployment (does not wait).
    Destroy(EnvSel),
}

/// `denv env list`.
#[derive(Args, Debug, PartialEq)]
pub struct EnvListArgs {
    /// Only this project's environments (name or id).
    #[arg(long)]
    pub project: Option<String>,
    /// Only environments with this status: pending, deploying, healthy, failed,
    /// destroying, destroyed.
    #[arg(long)]
    pub status: Option<String>,
    /// Include destroyed environments.
    #[arg(long, short = 'a')]
    pub all: bool,
    /// Print only the ids, one a line.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Print the response as JSON instead of a table.
    #[arg(long, conflicts_with = "quiet")]
    pub json: bool,
}

/// `denv logs`.
#[derive(Args, Debug, PartialEq)]
pub struct LogsArgs {
    /// Only this service (its lines unprefixed, stderr to stderr); default: every
    /// service, each line prefixed `service | `.
    #[arg(long, short = 's')]
    pub service: Option<String>,
    /// Keep printing new lines until interrupted (or the containers stop).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Lines of backlog per service (0: none; at most 10000).
    #[arg(long, short = 'n', default_value_t = 100)]
    pub tail: u32,
    /// Start each line with the engine's RFC 3339 time.
    #[arg(long, short = 't')]
    pub timestamps: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub env: EnvSel,
}

/// `denv fork`.
#[derive(Args, Debug, PartialEq)]
pub struct ForkArgs {
    /// The new environment's name (default `<env>-fork-<n>`).
    #[arg(long)]
    pub name: Option<String>,
    /// The version to fork (default: the current version).
    #[arg(long)]
    pub version: Option<String>,
    /// Destroy the fork this long from now: seconds (`90`) or a duration (`30m`, `2h`,
    /// `1h30m`, `1d`).
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl: Option<i64>,
    /// Keep this many forks of the version warm from now on (0 turns the pool off; absent
    /// leaves it as it is). Later forks of the version are handed out from the pool.
    #[arg(long, value_name = "N")]
    pub pool: Option<i32>,
    /// CPUs of the fork's agent service (`0.5`, `2`), replacing the version's cap.
    #[arg(long, value_name = "N")]
    pub cpus: Option<String>,
    /// Memory of the fork's agent service, a size (`512m`, `2g`; a bare number is bytes).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Processes (and threads) of the fork's agent service.
    #[arg(long, value_name = "N")]
    pub pids: Option<String>,
    /// The fork's disk quota, a size (`1g`); enforced on btrfs and zfs storage.
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub env: EnvSel,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

impl ForkArgs {
    /// The request's `resources` object from `--cpus/--memory/--pids/--disk` (`None`
    /// when none is given). Values go as written; the server validates them and names
    /// the field it refuses (`resources.memory …`).
    pub fn resources(&self) -> Option<pbjson_types::Struct> {
        let mut m = serde_json::Map::new();
        for (k, v) in [
            ("cpus", &self.cpus),
            ("memory", &self.memory),
            ("pids", &self.pids),
            ("disk", &self.disk),
        ] {
            if let Some(v) = v {
                m.insert(k.to_string(), serde_json::Value::String(v.clone()));
            }
        }
        if m.is_empty() {
            None
        } else {
            Some(denv_proto::json::to_struct(&serde_json::Value::Object(m)))
        }
    }
}

/// `denv snapshot`.
#[derive(Args, Debug, PartialEq)]
pub struct SnapshotArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub env: EnvSel,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

/// `denv verify`.
#[derive(Args, Debug, PartialEq)]
pub struct VerifyArgs {
    /// Unfreeze the agent service afterwards.
    #[arg(long)]
    pub resume: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub env: EnvSel,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

/// `denv rollback`.
#[derive(Args, Debug, PartialEq)]
pub struct RollbackArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub env: EnvSel,
    /// A healthy version of the environment (`ver_…`).
    pub version: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

/// `denv promote <project> <from-env> <to-env>`.
#[derive(Args, Debug, PartialEq)]
pub struct PromoteArgs {
    /// The project (id or name).
    pub project: String,
    /// The environment whose version is promoted (id or name).
    pub from: String,
    /// The environment that runs the version afterwards (a name; created when missing).
    pub to: String,
    /// A version of the source or its lineage (`ver_…`) instead of its current one.
    #[arg(long)]
    pub version: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

/// `denv sheet <env|version>`.
#[derive(Args, Debug, PartialEq)]
pub struct SheetArgs {
    /// A version (`ver_…`), an environment id (`env_…`), or with --project an
    /// environment's name (its current version).
    pub target: String,
    /// Project (id or name) in which to look up an environment given by name.
    #[arg(long)]
    pub project: Option<String>,
    /// Print the sheet as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `denv exec`.
#[derive(Args, Debug, PartialEq)]
pub struct ExecArgs {
    /// The service to run in.
    #[arg(long)]
    pub service: String,
    /// Seconds before the command is killed (server default 120).
    #[arg(long)]
    pub timeout: Option<i32>,
    /// Run as this user (name, uid, name:group, uid:gid), through the engine's exec user;
    /// default: the service's user.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Working directory (absolute); default: the service's.
    #[arg(long, short = 'w')]
    pub workdir: Option<String>,
    /// `KEY=VALUE` added to the command's environment (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env_vars: Vec<String>,
    /// A file whose bytes are the command's stdin (`-`: this process's stdin, read to the
    /// end first); at most 32 MiB.
    #[arg(long, value_name = "FILE")]
    pub input: Option<String>,
    /// Unix mode: stream the command's stdout and stderr to this process's as they are
    /// written, and exit with the command's exit code (125 when denv itself failed)
    /// instead of printing JSON.
    #[arg(long)]
    pub stream: bool,
    /// Unix mode (as --stream) with this process's stdin passed to the command (read to
    /// its end before the command starts; at most 32 MiB).
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub env: EnvSel,
    /// The argv (everything after the environment; `--` is optional).
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
}

/// `denv files …`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum FilesCmd {
    /// Upload a local file or directory into a directory of a service.
    Put {
        /// The service.
        #[arg(long)]
        service: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        env: EnvSel,
        /// Local file or directory (archived under its base name).
        local: PathBuf,
        /// Directory inside the service to extract into.
        remote_dir: String,
    },
    /// Download a path of a service into a local directory.
    Get {
        /// The service.
        #[arg(long)]
        service: String,
        #[command(flatten)]
        #[allow(missing_docs)]
        env: EnvSel,
        /// Path inside the service.
        remote: String,
        /// Local directory to extract regular files and directories under.
        local_dir: PathBuf,
    },
}

/// `denv deployment …`.
#[derive(Subcommand, Debug, PartialEq)]
pub enum DeploymentCmd {
    /// Show a deployment and its phases.
    Get {
        /// Deployment id (`dep_…`).
        id: String,
    },
    /// Print a deployment's phases as they change until it finishes.
    Watch {
        /// Deployment id (`dep_…`).
        id: String,
    },
}

/// Flags shared by both imports.
#[derive(Args, Debug, PartialEq, Clone)]
pub struct ImportCommon {
    /// Directory to write `docker-compose.yaml` (and `tasks/`) into; default: the
    /// directory being imported. Build contexts are written relative to it when inside
    /// it, absolute otherwise.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The project's name; default: from `[task] name` (Harbor) or the directory's name.
    #[arg(long)]
    pub project: Option<String>,
    /// Replace files the import writes when they exist already.
    #[arg(long)]
    pub force: bool,
    /// Only write the files: no project, no deploy (and no credential needed).
    #[arg(long)]
    pub no_deploy: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub wait: WaitFlag,
}

/// `denv import …` (spec pages `31-blog-harbor.md` §2, `36-blog-karotte.md` §2).
#[derive(Subcommand, Debug, PartialEq)]
pub enum ImportCmd {
    /// A Harbor task directory (`task.toml`, `environment/`, `tests/test.sh`).
    Harbor {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: ImportCommon,
        /// The task directory.
        dir: PathBuf,
    },
    /// A Karotte environment directory (a Dockerfile and Python `Step`s).
    Karotte {
        #[command(flatten)]
        #[allow(missing_docs)]
        common: ImportCommon,
        /// Use this built image instead of building the directory's Dockerfile.
        #[arg(long)]
        image: Option<String>,
        /// The student's uid:gid when the Dockerfile's last USER is not a numeric non-root
        /// uid.
        #[arg(long, default_value = "1000:1000")]
        user: String,
        /// The environment directory.
        dir: PathBuf,
    },
}

impl ImportCmd {
    /// The flags both imports share.
    pub fn common(&self) -> &ImportCommon {
        match self {
            ImportCmd::Harbor { common, .. } | ImportCmd::Karotte { common, .. } => common,
        }
    }
}

/// `denv export`.
#[derive(Args, Debug, PartialEq)]
#[command(group(clap::ArgGroup::new("format").required(true).args(["harbor", "openenv"])))]
pub struct ExportArgs {
    /// Harbor task directories, one per task (spec `31-blog-harbor.md` §3).
    #[arg(long)]
    pub harbor: bool,
    /// An OpenEnv environment package (spec `33-blog-openenv.md` "Exporting").
    #[arg(long)]
    pub openenv: bool,
    /// The project's source directory, where `tasks/` (or a root `instruction.md`) is;
    /// `--openenv` takes the tasks' instructions from it too (none is fine).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub source: PathBuf,
    /// Replace files that exist already.
    #[arg(long)]
    pub force: bool,
    /// `<project>@<version>`: a project name or id and a version id (`ver_…`).
    #[arg(value_name = "PROJECT@VERSION")]
    pub version: String,
    /// The directory to write into.
    pub dir: PathBuf,
}

impl Command {
    /// Whether the command needs a credential (all but `login` and
    /// `import --no-deploy`).
    pub fn needs_key(&self) -> bool {
        match self {
            Command::Login(_) => false,
            Command::Import(i) => !i.common().no_deploy,
            _ => true,
        }
    }
}
