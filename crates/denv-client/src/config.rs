//! Where the CLI and the Python package find the server and the credential
//! (spec page `10-ref-cli.md`, "Configuration").
//!
//! | Source | Precedence |
//! |---|---|
//! | `DENV_API_KEY`, `DENV_SERVER`, `DENV_CA_FILE` | first |
//! | `$XDG_CONFIG_HOME/denv/config.json`, else `~/.config/denv/config.json` | fallback, read only when `DENV_API_KEY` is unset; its `server` is used only when `DENV_SERVER` is unset too, its `ca_file` only with its `server` and when `DENV_CA_FILE` is unset |
//! | `http://localhost:8080` | default server |
//!
//! `DENV_CA_FILE` (or the file's `ca_file`) names a PEM file of CA certificates that an
//! `https://` server's certificate is checked against instead of the default roots
//! ([`crate::transport`]).
//!
//! An empty environment variable counts as unset.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The server used when neither `DENV_SERVER` nor the config file names one.
pub const DEFAULT_SERVER: &str = "http://localhost:8080";

/// The message of every command run without a credential.
pub const NOT_SIGNED_IN: &str = "not signed in: run `denv login` or set DENV_API_KEY";

/// Errors reading or writing the config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file exists but could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not the JSON object `{server, api_key, team}`.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The config file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file or directory being written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Neither `XDG_CONFIG_HOME` nor `HOME` is set, so there is no config file location.
    #[error("no config location: neither XDG_CONFIG_HOME nor HOME is set")]
    NoPath,
    /// No credential from the environment or the config file.
    #[error("{}", NOT_SIGNED_IN)]
    NotSignedIn,
}

/// The config file's contents: the three keys `denv login` writes, and `ca_file` when it
/// signed in with one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFile {
    /// Base URL of the control plane.
    #[serde(default)]
    pub server: String,
    /// Team API key (`dak_…`) or user session token (`dst_…`).
    #[serde(default)]
    pub api_key: String,
    /// The team id the key was approved for ("" when unknown).
    #[serde(default)]
    pub team: String,
    /// The CA certificates (a PEM file's absolute path) an `https://` server is checked
    /// against; `""` (and left out of the file): the default roots.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_file: String,
}

/// The resolved client settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Base URL of the control plane, e.g. `http://127.0.0.1:8080`.
    pub server: String,
    /// The credential sent as `authorization: Bearer <key>`; `None` when not signed in.
    pub api_key: Option<String>,
    /// Sent as `x-denv-team` when set (from the config file only).
    pub team: Option<String>,
    /// `DENV_CA_FILE`, else the config file's `ca_file` when its `server` is used: the PEM
    /// file of CA certificates an `https://` server's certificate is checked against
    /// instead of the default roots.
    pub ca_file: Option<PathBuf>,
    /// Where the config file is (or would be) kept; `None` without `XDG_CONFIG_HOME`
    /// and `HOME`.
    pub path: Option<PathBuf>,
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.is_empty())
}

impl Config {
    /// Resolves the settings from the process environment and the config file.
    ///
    /// Errors only when the config file has to be read and is unreadable or malformed;
    /// a missing file is not an error.
    pub fn resolve() -> Result<Self, ConfigError> {
        Self::resolve_with(|k| std::env::var(k).ok())
    }

    /// [`Config::resolve`] with the environment given as a lookup function (for tests and
    /// embedders).
    pub fn resolve_with(env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let path = Self::file_path_with(&env);
        let env_server = non_empty(env("DENV_SERVER"));
        let env_ca = non_empty(env("DENV_CA_FILE")).map(PathBuf::from);
        if let Some(key) = non_empty(env("DENV_API_KEY")) {
            return Ok(Config {
                server: env_server.unwrap_or_else(|| DEFAULT_SERVER.to_string()),
                api_key: Some(key),
                team: None,
                ca_file: env_ca,
                path,
            });
        }
        let file = match &path {
            Some(p) => Self::load_file(p)?.unwrap_or_default(),
            None => ConfigFile::default(),
        };
        // The file's CA file was saved for the file's server: it goes with that server.
        let file_ca = match env_server {
            None => non_empty(Some(file.ca_file)).map(PathBuf::from),
            Some(_) => None,
        };
        let server = env_server
            .or_else(|| non_empty(Some(file.server)))
            .unwrap_or_else(|| DEFAULT_SERVER.to_string());
        Ok(Config {
            server,
            api_key: non_empty(Some(file.api_key)),
            team: non_empty(Some(file.team)),
            ca_file: env_ca.or(file_ca),
            path,
        })
    }

    /// The config file location: `$XDG_CONFIG_HOME/denv/config.json`, else
    /// `$HOME/.config/denv/config.json`.
    pub fn file_path() -> Option<PathBuf> {
        Self::file_path_with(|k| std::env::var(k).ok())
    }

    /// [`Config::file_path`] with the environment given as a lookup function.
    pub fn file_path_with(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
        if let Some(x) = non_empty(env("XDG_CONFIG_HOME")) {
            return Some(PathBuf::from(x).join("denv").join("config.json"));
        }
        non_empty(env("HOME")).map(|h| {
            PathBuf::from(h)
                .join(".config")
                .join("denv")
                .join("config.json")
        })
    }

    /// Reads a config file; `Ok(None)` when it does not exist.
    pub fn load_file(path: &Path) -> Result<Option<ConfigFile>, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })
    }

    /// The credential, or [`ConfigError::NotSignedIn`].
    pub fn require_key(&self) -> Result<&str, ConfigError> {
        self.api_key.as_deref().ok_or(ConfigError::NotSignedIn)
    }

    /// Writes `{server, api_key, team}` (and `ca_file`, made absolute, when set) to
    /// [`Config::path`] with mode `0600` (its directory is created with mode `0700` when
    /// missing) and returns the path.
    ///
    /// The file is written to a temporary name beside it and renamed, so a reader never
    /// sees half a file and an older file's wider mode is not kept.
    pub fn save(&self) -> Result<PathBuf, ConfigError> {
        let path = self.path.clone().ok_or(ConfigError::NoPath)?;
        let file = ConfigFile {
            server: self.server.clone(),
            api_key: self.api_key.clone().unwrap_or_default(),
            team: self.team.clone().unwrap_or_default(),
            ca_file: self
                .ca_file
                .as_deref()
                .map(|p| {
                    std::path::absolute(p)
                        .unwrap_or_else(|_| p.to_path_buf())
                        .display()
                        .to_string()
                })
                .unwrap_or_default(),
        };
        write_file(&path, &file)?;
        Ok(path)
    }
}

fn write_file(path: &Path, file: &ConfigFile) -> Result<(), ConfigError> {
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ConfigError::Write { path: p, source }
    };
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            let mut b = std::fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
            b.create(dir).map_err(err(dir))?;
        }
    }
    let mut body = serde_json::to_vec_pretty(file).unwrap_or_default();
    body.push(b'\n');
    let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let write = || -> std::io::Result<()> {
        let mut f = opts.open(&tmp)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(path)(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn write_config(dir: &Path, json: &str) -> PathBuf {
        let p = dir.join("denv").join("config.json");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, json).unwrap();
        p
    }

    const FILE: &str = r#"{"server":"http://file:9","api_key":"dak_file","team":"team_f"}"#;

    #[test]
    fn env_key_and_server_win_and_the_file_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        // A malformed file proves it is not read at all.
        write_config(d.path(), "not json");
        let x = d.path().to_str().unwrap();
        let c = Config::resolve_with(lookup(&[
            ("XDG_CONFIG_HOME", x),
            ("DENV_API_KEY", "dak_env"),
            ("DENV_SERVER", "http://env:1"),
        ]))
        .unwrap();
        assert_eq!(c.api_key.as_deref(), Some("dak_env"));
        assert_eq!(c.server, "http://env:1");
        assert_eq!(c.team, None);
        assert_eq!(c.path, Some(d.path().join("denv/config.json")));
    }

    #[test]
    fn env_key_without_env_server_uses_the_default_not_the_file_server() {
        let d = tempfile::tempdir().unwrap();
        write_config(d.path(), FILE);
        let c = Config::resolve_with(lookup(&[
            ("XDG_CONFIG_HOME", d.path().to_str().unwrap()),
            ("DENV_API_KEY", "dak_env"),
        ]))
        .unwrap();
        assert_eq!(c.server, DEFAULT_SERVER);
        assert_eq!(c.api_key.as_deref(), Some("dak_env"));
    }

    #[test]
    fn file_is_the_fallback_and_env_server_overrides_its_server() {
        let d = tempfile::tempdir().unwrap();
        write_config(d.path(), FILE);
        let x = d.path().to_str().unwrap();
        let c = Config::resolve_with(lookup(&[("XDG_CONFIG_HOME", x)])).unwrap();
        assert_eq!(c.server, "http://file:9");
        assert_eq!(c.api_key.as_deref(), Some("dak_file"));
        assert_eq!(c.team.as_deref(), Some("team_f"));

        let c = Config::resolve_with(lookup(&[
            ("XDG_CONFIG_HOME", x),
            ("DENV_SERVER", "http://env:1"),
        ]))
        .unwrap();
        assert_eq!(c.server, "http://env:1");
        assert_eq!(c.api_key.as_deref(), Some("dak_file"));
    }

    #[test]
    fn home_is_used_without_xdg_and_empty_vars_count_as_unset() {
        let d = tempfile::tempdir().unwrap();
        write_config(&d.path().join(".config"), FILE);
        let c = Config::resolve_with(lookup(&[
            ("HOME", d.path().to_str().unwrap()),
            ("XDG_CONFIG_HOME", ""),
            ("DENV_API_KEY", ""),
            ("DENV_SERVER", ""),
        ]))
        .unwrap();
        assert_eq!(c.path, Some(d.path().join(".config/denv/config.json")));
        assert_eq!(c.api_key.as_deref(), Some("dak_file"));
        assert_eq!(c.server, "http://file:9");
    }

    #[test]
    fn nothing_anywhere_is_the_default_server_and_not_signed_in() {
        let d = tempfile::tempdir().unwrap();
        let c = Config::resolve_with(lookup(&[("HOME", d.path().to_str().unwrap())])).unwrap();
        assert_eq!(c.server, DEFAULT_SERVER);
        assert_eq!(c.api_key, None);
        let e = c.require_key().unwrap_err();
        assert_eq!(
            e.to_string(),
            "not signed in: run `denv login` or set DENV_API_KEY"
        );
        let c = Config::resolve_with(lookup(&[])).unwrap();
        assert_eq!(c.path, None);
        assert!(matches!(c.save(), Err(ConfigError::NoPath)));
    }

    #[test]
    fn malformed_file_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = write_config(d.path(), "{");
        let e = Config::resolve_with(lookup(&[("XDG_CONFIG_HOME", d.path().to_str().unwrap())]))
            .unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }));
        assert!(e
            .to_string()
            .starts_with(&format!("parsing {}", p.display())));
    }

    #[cfg(unix)]
    #[test]
    fn save_writes_mode_0600_and_round_trips() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let x = d.path().join("xdg");
        let c = Config {
            server: "http://127.0.0.1:8080".into(),
            api_key: Some("dak_saved".into()),
            team: Some("team_1".into()),
            ca_file: None,
            path: Config::file_path_with(lookup(&[("XDG_CONFIG_HOME", x.to_str().unwrap())])),
        };
        // A pre-existing world-readable file must end up 0600 too.
        write_config(&x, "{}");
        std::fs::set_permissions(
            x.join("denv/config.json"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let p = c.save().unwrap();
        assert_eq!(p, x.join("denv/config.json"));
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"server":"http://127.0.0.1:8080","api_key":"dak_saved","team":"team_1"})
        );
        let back =
            Config::resolve_with(lookup(&[("XDG_CONFIG_HOME", x.to_str().unwrap())])).unwrap();
        assert_eq!(back, c);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("config.json")]);
    }

    #[cfg(unix)]
    #[test]
    fn save_creates_the_directory_0700() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let c = Config {
            server: DEFAULT_SERVER.into(),
            api_key: Some("dak_x".into()),
            team: None,
            ca_file: None,
            path: Some(d.path().join("a/denv/config.json")),
        };
        let p = c.save().unwrap();
        let dir_mode = std::fs::metadata(p.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        let f: ConfigFile = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(f.team, "");
    }

    #[test]
    fn the_ca_file_comes_from_the_environment_else_the_file_and_is_saved_absolute() {
        let d = tempfile::tempdir().unwrap();
        let x = d.path().to_str().unwrap();
        write_config(
            d.path(),
            r#"{"server":"https://file:9","api_key":"dak_file","ca_file":"/etc/denv/file-ca.pem"}"#,
        );
        let c = Config::resolve_with(lookup(&[("XDG_CONFIG_HOME", x)])).unwrap();
        assert_eq!(c.ca_file, Some(PathBuf::from("/etc/denv/file-ca.pem")));
        let c = Config::resolve_with(lookup(&[
            ("XDG_CONFIG_HOME", x),
            ("DENV_CA_FILE", "/env/ca.pem"),
        ]))
        .unwrap();
        assert_eq!(c.ca_file, Some(PathBuf::from("/env/ca.pem")));
        // Another server than the file's: the file's CA is not for it.
        let c = Config::resolve_with(lookup(&[
            ("XDG_CONFIG_HOME", x),
            ("DENV_SERVER", "https://other:1"),
        ]))
        .unwrap();
        assert_eq!((c.api_key.as_deref(), c.ca_file), (Some("dak_file"), None));
        // With the key in the environment the file is not read: only DENV_CA_FILE counts.
        let c = Config::resolve_with(lookup(&[("XDG_CONFIG_HOME", x), ("DENV_API_KEY", "dak_e")]))
            .unwrap();
        assert_eq!(c.ca_file, None);
        let c = Config::resolve_with(lookup(&[
            ("XDG_CONFIG_HOME", x),
            ("DENV_API_KEY", "dak_e"),
            ("DENV_CA_FILE", "/env/ca.pem"),
        ]))
        .unwrap();
        assert_eq!(c.ca_file, Some(PathBuf::from("/env/ca.pem")));

        // Saved as an absolute path; a config without one has no `ca_file` key at all.
        let c = Config {
            server: "https://cp:8443".into(),
            api_key: Some("dak_s".into()),
            team: None,
            ca_file: Some(PathBuf::from("rel/ca.pem")),
            path: Some(d.path().join("s/config.json")),
        };
        let p = c.save().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let want = std::env::current_dir().unwrap().join("rel/ca.pem");
        assert_eq!(v["ca_file"], want.display().to_string());
        let c = Config { ca_file: None, ..c };
        let p = c.save().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert!(v.get("ca_file").is_none(), "{v}");
    }
}
