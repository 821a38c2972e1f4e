//! Compose text → [`Spec`]: the rules of `13-ref-compose.md`, plus the decisions that page
//! leaves open (each one below is marked *decided*).
//!
//! The parser is pure (no I/O, no environment lookups, no interpolation of `${VAR}`) and
//! never panics: every input, however malformed, yields a [`Spec`] or one [`ComposeError`].
//!
//! # Order of checks
//!
//! A file with several problems reports the first one met in this order:
//!
//! 1. YAML syntax (`compose: invalid YAML at line L column C: …`), after a linear pre-scan
//!    that refuses `[`/`{` nested deeper than 64 (libyaml is quadratic in that depth), then
//!    `<<` merge keys.
//!    Tags such as `!reset` / `!override` are stripped (their value is kept).
//! 2. The document is a mapping (an empty document means `compose: no services`).
//! 3. `services` is a non-empty mapping (`compose: no services`) whose names are all valid
//!    and distinct.
//! 4. Top-level `volumes`, in sorted name order: shape, name, `external`.
//! 5. Each service, in sorted name order; within one service:
//!    shape → `image` → `network_mode` → `privileged`/`cap_add` → the other refused
//!    keys (in the order of the table below) → `user` → `environment` → `ports` → `volumes`
//!    → `depends_on` → `command` → `healthcheck` → caps (`mem_limit`, `pids_limit`, `cpus`,
//!    then their `deploy.resources.limits` spellings).
//! 6. `depends_on` cycles.
//! 7. `x-denv`: shape → `kind` → `egress` → `warm` → `clock` → `disk` → `pool` → `agent` (exists →
//!    non-root user → no `cap_add`) → `verifier`
//!    (exactly one of image/service → that service exists → `command` → `collect` →
//!    `timeout_sec` → requires `agent.service`) → `promote` (`replay` → `consistency` →
//!    `invariants` → `soak`; each check: shape → `service` exists → `cmd`).
//!
//! # Service keys
//!
//! Supported: `image`, `build` (`context`, `dockerfile`, `args`, `target`; kept in
//! [`Spec::builds`]; a service needs an `image` or a `build`: `compose: service "x" has no
//! image and no build`), `environment`, `ports`, `volumes`, `depends_on`, `command`,
//! `healthcheck`, `user`, `mem_limit`, `pids_limit`, `cpus`, `deploy.resources.limits`,
//! `cap_add` (capabilities of Docker's default set only, [`crate::ADDABLE_CAPS`]; `CAP_`
//! prefix and case are normalised; never on the agent service).
//!
//! Refused (a key that would reach outside the sandbox, break forks, or silently change
//! what runs), each with `compose: service "x" uses <key>, which is refused; <why>` unless
//! the spec page gives the text:
//!
//! | Key | When | Why |
//! |---|---|---|
//! | `build.dockerfile_inline`, `build.additional_contexts`, `build.ssh`, `build.secrets`, `build.entitlements`, `build.privileged`, `build.network: host` | set | they read host files or widen the build's sandbox |
//! | `network_mode` | `host` (spec message); anything but `bridge`/`default` (`none`, `service:…`, `container:…`) | every service joins the stack's own network |
//! | `privileged` | true | `compose: service "x" asks for privileged, which is refused` |
//! | `cap_add` | a capability outside Docker's default set | `compose: service "x" cap_add SYS_ADMIN is refused; only capabilities of Docker's default set can be added back (AUDIT_WRITE, CHOWN, …)` |
//! | `devices`, `device_cgroup_rules` | non-empty | host devices reach outside the sandbox |
//! | `gpus`, `deploy.resources.reservations.devices` | non-empty | GPU passthrough is not available yet |
//! | `security_opt` | non-empty | it can switch off the sandbox's confinement |
//! | `sysctls` | non-empty | kernel parameters are not set for environments |
//! | `volumes_from` | non-empty | it shares another container's mounts |
//! | `pid` | any value | a shared pid namespace reaches outside the service |
//! | `ipc` | `host`, `service:…`, `container:…` | shared ipc namespace; `private`/`shareable`/`none` are ignored |
//! | `uts`, `userns_mode`, `cgroup` | `host` | host namespaces reach outside the sandbox |
//! | `cgroup_parent` | any value | the sidecar places every service in its own capped cgroup |
//! | `oom_kill_disable` | true | it would defeat the memory cap |
//! | `env_file` | any value | the file is not read; put the variables under `environment` |
//! | `secrets`, `configs` | non-empty | they are read from host files |
//! | `entrypoint` | any value | not carried in the spec; put the whole argv in `command` |
//! | `working_dir` | any value | not carried in the spec; use `sh -c "cd /dir && …"` in `command` |
//!
//! Ignored (harmless, or replaced by what the sidecar renders): `container_name` (forks need
//! unique names), `hostname`, `domainname`, `restart`, `labels`, `annotations`, `logging`,
//! `stdin_open`, `tty`, `init`, `shm_size`, `stop_signal`, `stop_grace_period`, `expose`
//! (every port is reachable on the stack network), `networks` (one network per stack),
//! `platform`, `pull_policy`, `profiles`, `read_only`, `tmpfs` (and long-form `type: tmpfs`
//! volumes), `ulimits` (the sidecar sets its own), `cap_drop` (every capability is dropped
//! anyway), `dns*`, `extra_hosts`, `links`, `external_links`,
//! `mac_address`, `oom_score_adj`, `mem_reservation`, `memswap_limit`, `cpu_*`, `cpuset`,
//! `scale` and `deploy` other than the keys above (one container per service), healthcheck
//! `timeout`/`start_period`/`start_interval`, `runtime` (the sidecar chooses it), `x-*`
//! extensions, and any other key.
//!
//! # Values (*decided* where the page is silent)
//!
//! - `environment`: a `null` value or a list entry without `=` would be read from the host
//!   shell in Compose; there is no shell at deploy time, so the variable is left unset.
//! - `ports`: integers or strings; `/tcp` is dropped; `/udp` and `/sctp` are refused
//!   (`port "53/udp" is refused; only tcp ports are supported`); ranges are refused; the
//!   long form `{target: 80}` is accepted; duplicates are dropped, first occurrence kept.
//! - `volumes`: the short form `name:/path[:opts]` where opts is a comma list of
//!   `ro`/`rw`/`z`/`Z`/`nocopy`/`consistent`/`cached`/`delegated`; the long form
//!   `{type: volume, source, target, read_only}`. Host-path sources (`/`, `.`, `~`, `$`) are
//!   bind mounts. An entry that is not `name:/absolute/path` (anonymous `/data`, bare `pg`,
//!   relative target, unknown option) gets `volume "v" must be <name>:<path>`, quoting the
//!   entry as written (the page lost its angle brackets; `<name>:<path>` restores them).
//!   Two mounts at one path are refused.
//! - `depends_on`: the list form and mapping entries without `condition` mean
//!   `service_started` (as in Compose); `service_healthy` and
//!   `service_completed_successfully` are kept in `depends_on_condition`; any other
//!   condition is refused; `required` and `restart` are ignored.
//! - `healthcheck`: a string test becomes `["CMD-SHELL", s]`; `NONE`, `["NONE"]` or
//!   `disable: true` give `None`; no `test` gives `None` (the image's own `HEALTHCHECK`
//!   applies); `CMD-SHELL` with several words joins them with spaces; `interval` is a Go
//!   duration (`2s`, `1m30s`, `500ms`, `1.5s`, `10us`, rounded up to whole ms), 0 or absent
//!   means 30000 ms; `retries` 0 or absent means 3.
//! - `user`: `uid[:gid]` or names, a YAML integer is stringified.
//! - caps: `mem_limit` is bytes or `<n>[.<n>][ ][kmgtp][i][b]` (binary units, any case),
//!   rounded up to whole MiB, at least Docker's 6 MiB; `pids_limit` must not be negative
//!   (`-1` would mean unlimited); `cpus` is a non-negative number or numeric string. Zero
//!   means the default, and a zero shorthand counts as absent, so a `deploy` value applies.
//! - `x-denv.warm`: a list's items are argv elements exactly as written; a single string is
//!   split on whitespace like `command`.
//! - `x-denv.verifier.command` may be a string (split on whitespace) or a list;
//!   `collect` may be one string; a collect path containing `..` is refused (the copy is
//!   laid out under a host directory); `timeout_sec` 0 or absent means 600.
//! - Service and volume names must match `[A-Za-z0-9][A-Za-z0-9_.-]*` (they become
//!   container, network-alias and dataset names).

use std::collections::{BTreeMap, BTreeSet};

use serde_yaml::{Mapping, Value};

use crate::{
    Agent, Build, Check, Clock, ComposeError, Egress, Health, Promote, Resources, Service, Spec,
    Verifier, VolumeMount, DEFAULT_CPUS, DEFAULT_MEMORY_MB, DEFAULT_PIDS,
    DEFAULT_VERIFIER_TIMEOUT_SEC, MAX_POOL, MAX_REPLAY_FORKS, MAX_SOAK_MS, MIN_DISK_MB,
};

type Result<T> = std::result::Result<T, ComposeError>;

const MIB: u64 = 1024 * 1024;
/// Docker refuses memory limits below 6 MiB.
const MIN_MEMORY_BYTES: u64 = 6 * MIB;
/// Healthcheck interval when the file sets none (Docker's default), in ms.
const DEFAULT_INTERVAL_MS: u64 = 30_000;
/// Healthcheck retries when the file sets none (Docker's default).
const DEFAULT_RETRIES: u32 = 3;

fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(ComposeError(msg.into()))
}

/// Parse and validate a compose file with its `x-denv` block (`13-ref-compose.md`).
///
/// Returns the normalised [`Spec`]: services sorted by name, caps and defaults filled in.
///
/// Errors: one [`ComposeError`] whose text is the exact message of the spec page, e.g.
/// `compose: no services`; see the module docs for the order in which problems are found
/// and the messages for cases the page does not spell out.
pub fn parse(text: &str) -> Result<Spec> {
    check_flow_depth(text)?;
    let doc: Value = serde_yaml::from_str(text).map_err(yaml_error)?;
    let mut doc = untag(doc);
    doc.apply_merge().map_err(yaml_error)?;
    let root = match doc {
        Value::Null => return fail("compose: no services"),
        Value::Mapping(m) => m,
        other => {
            return fail(format!(
                "compose: the file must be a mapping with a services key, got {}",
                kind_of(&other)
            ))
        }
    };

    // Services, sorted by name.
    let services_raw = match root.get("services") {
        None | Some(Value::Null) => return fail("compose: no services"),
        Some(Value::Mapping(m)) if m.is_empty() => return fail("compose: no services"),
        Some(Value::Mapping(m)) => m,
        Some(other) => {
            return fail(format!(
                "compose: services must be a mapping of service name to service, got {}",
                kind_of(other)
            ))
        }
    };
    let services_raw = named_entries(services_raw, "service")?;
    let service_names: BTreeSet<String> = services_raw.keys().cloned().collect();

    // Top-level volumes, sorted by name.
    let volumes = top_level_volumes(root.get("volumes"))?;
    let declared: BTreeSet<String> = volumes.iter().cloned().collect();

    let mut services = Vec::with_capacity(services_raw.len());
    let mut builds = BTreeMap::new();
    for (name, raw) in &services_raw {
        let (svc, b) = service(name, raw, &declared, &service_names)?;
        if let Some(b) = b {
            builds.insert(name.clone(), b);
        }
        services.push(svc);
    }
    check_cycles(&services)?;

    let mut spec = Spec {
        services,
        volumes,
        builds,
        ..Spec::default()
    };
    x_denv(root.get("x-denv"), &mut spec)?;
    Ok(spec)
}

/// Whether `user` is a well-formed engine user: a name or uid, optionally `:` and a group
/// name or gid, each part made of ASCII letters, digits, `_`, `-`, `.`, not starting with
/// `-`, at most 64 characters in all (`1000`, `1000:1000`, `ubuntu`, `www-data:www-data`).
/// Anything else (spaces, quotes, `$`, `;`, a third `:` part, NUL) is refused, so a user
/// string can never carry more than a user. Used for compose `user` and for the exec API's
/// `user` (spec pages `13-ref-compose.md`, `12-ref-rest-api.md`).
pub fn is_valid_user(user: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with('-')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    let mut parts = user.split(':');
    let first = parts.next().unwrap_or("");
    let second = parts.next();
    user.len() <= 64 && parts.next().is_none() && part(first) && second.is_none_or(part)
}

/// Whether a compose `user` value may run as root. Only a numeric, non-zero uid
/// (`1000`, `1000:1000`, `1000:0`) is proven non-root: empty (the image default),
/// uid `0` in any spelling (`0`, `00`, `0:1000`), `root`, any other name (a name is
/// resolved by the image's `/etc/passwd`, which may map it to uid 0) and anything that is
/// not plain digits (`-0`, `+0`, `0x0`) all count as root.
///
/// Used by the parser for `x-denv.agent.service` and by callers that accept a `user`
/// from elsewhere (spec page `19-ref-protections.md`, protection 1).
pub fn is_root_user(user: &str) -> bool {
    let uid = user.trim().split(':').next().unwrap_or("").trim();
    let numeric = !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit());
    !numeric || uid.bytes().all(|b| b == b'0')
}

// ---------------------------------------------------------------------------------------
// YAML helpers

fn yaml_error(e: serde_yaml::Error) -> ComposeError {
    let full = e.to_string();
    match e.location() {
        Some(loc) => {
            let mark = format!(" at line {} column {}", loc.line(), loc.column());
            let msg = full.replacen(&mark, "", 1);
            ComposeError(format!(
                "compose: invalid YAML at line {} column {}: {}",
                loc.line(),
                loc.column(),
                msg
            ))
        }
        None => ComposeError(format!("compose: invalid YAML: {full}")),
    }
}

/// Deepest `[`/`{` nesting accepted before handing the text to libyaml.
const MAX_FLOW_DEPTH: usize = 64;

/// libyaml's scanner is quadratic in flow-collection depth (100,000 `[` take about a
/// minute), and serde_yaml's recursion limit only applies after the whole text is scanned.
/// Count openers minus closers (quotes and comments not excluded: more than 64 unclosed
/// brackets inside strings do not occur in real files) and refuse early, in linear time.
fn check_flow_depth(text: &str) -> Result<()> {
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    for c in text.chars() {
        column += 1;
        match c {
            '\n' => {
                line += 1;
                column = 0;
            }
            '[' | '{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return fail(format!(
                        "compose: invalid YAML at line {line} column {column}: collections nested deeper than {MAX_FLOW_DEPTH} levels"
                    ));
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Drop YAML tags (`!reset`, `!override`, custom tags), keeping the tagged value.
/// Depth is bounded by serde_yaml's recursion limit, so recursion is safe here.
fn untag(v: Value) -> Value {
    match v {
        Value::Tagged(t) => untag(t.value),
        Value::Sequence(s) => Value::Sequence(s.into_iter().map(untag).collect()),
        Value::Mapping(m) => {
            Value::Mapping(m.into_iter().map(|(k, v)| (untag(k), untag(v))).collect())
        }
        other => other,
    }
}

/// A scalar as text: strings as is, numbers and bools in their YAML spelling.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// What a value is, for messages: its text for scalars, else its shape.
fn describe(v: &Value) -> String {
    scalar(v).unwrap_or_else(|| kind_of(v).to_string())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// A compose boolean: `true`/`"true"`/non-zero are true; `null`/`false`/`""` false; any
/// other value counts as true (the conservative reading for refusal checks).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !(s.is_empty() || s.eq_ignore_ascii_case("false") || s == "0"),
        _ => true,
    }
}

/// Set: anything but null, false, empty string, empty list or empty mapping.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.trim().is_empty(),
        Value::Sequence(s) => !s.is_empty(),
        Value::Mapping(m) => !m.is_empty(),
        _ => true,
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Mapping keys as strings, sorted, with duplicates (after stringifying) refused.
fn named_entries<'a>(m: &'a Mapping, what: &str) -> Result<BTreeMap<String, &'a Value>> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let Some(name) = scalar(k) else {
            return fail(format!(
                "compose: {what} names must be strings, got {}",
                kind_of(k)
            ));
        };
        if !valid_name(&name) {
            return fail(format!(
                "compose: {what} name \"{name}\" is invalid; use letters, digits, '.', '_' and '-', starting with a letter or digit"
            ));
        }
        if out.insert(name.clone(), v).is_some() {
            return fail(format!("compose: {what} \"{name}\" is declared twice"));
        }
    }
    Ok(out)
}

fn string_list(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Sequence(items) => items.iter().map(scalar).collect(),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Top-level volumes

fn top_level_volumes(v: Option<&Value>) -> Result<Vec<String>> {
    let m = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Mapping(m)) => m,
        Some(other) => {
            return fail(format!(
                "compose: volumes must be a mapping of volume name to options, got {}",
                kind_of(other)
            ))
        }
    };
    let entries = named_entries(m, "volume")?;
    for (name, opts) in &entries {
        match opts {
            Value::Null => {}
            Value::Mapping(o) => {
                if o.get("external").is_some_and(truthy) {
                    return fail(format!(
                        "compose: volume \"{name}\" is external, which is refused; denv creates and forks every volume itself"
                    ));
                }
            }
            other => {
                return fail(format!(
                    "compose: volume \"{name}\" must be a mapping of options, got {}",
                    kind_of(other)
                ))
            }
        }
    }
    Ok(entries.into_keys().collect())
}

// ---------------------------------------------------------------------------------------
// Services

fn service(
    name: &str,
    raw: &Value,
    declared: &BTreeSet<String>,
    all: &BTreeSet<String>,
) -> Result<(Service, Option<Build>)> {
    let empty = Mapping::new();
    let m = match raw {
        Value::Null => &empty,
        Value::Mapping(m) => m,
        other => {
            return fail(format!(
                "compose: service \"{name}\" must be a mapping, got {}",
                kind_of(other)
            ))
        }
    };

    let image = m.get("image").and_then(scalar).unwrap_or_default();
    let image = image.trim().to_string();
    let build = build(name, m.get("build"))?;
    if image.is_empty() && build.is_none() {
        return fail(format!(
            "compose: service \"{name}\" has no image and no build"
        ));
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return fail(format!(
            "compose: service \"{name}\" image \"{image}\" is not a valid image reference"
        ));
    }

    refused_keys(name, m)?;

    let svc = Service {
        name: name.to_string(),
        image,
        user: user(name, m.get("user"))?,
        env: environment(name, m.get("environment"))?,
        ports: ports(name, m.get("ports"))?,
        volumes: service_volumes(name, m.get("volumes"), declared)?,
        depends_on: depends_on(name, m.get("depends_on"), all)?,
        depends_on_condition: depends_on_condition(name, m.get("depends_on"))?,
        command: command(name, m.get("command"))?,
        health: healthcheck(name, m.get("healthcheck"))?,
        resources: resources(name, m)?,
        cap_add: cap_add(name, m.get("cap_add"))?,
        // Pinned by the control plane from the host's report, never from the file.
        image_id: String::new(),
    };
    Ok((svc, build))
}

/// `build:`: a context string, or a mapping of `context`, `dockerfile`, `args`, `target`
/// (the keys that reach the engine's build API). Keys that read host files or widen the
/// build's sandbox are refused; the other Compose build keys are ignored.
fn build(name: &str, v: Option<&Value>) -> Result<Option<Build>> {
    fn bad<T>(name: &str, what: &str) -> Result<T> {
        fail(format!("compose: service \"{name}\" build {what}"))
    }
    let m = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Mapping(m)) => m.clone(),
        Some(Value::String(s)) => {
            let mut m = Mapping::new();
            m.insert(Value::from("context"), Value::from(s.clone()));
            m
        }
        Some(other) => {
            return bad(
                name,
                &format!(
                    "must be a context path or a mapping, got {}",
                    kind_of(other)
                ),
            )
        }
    };
    const REFUSED: &[(&str, &str)] = &[
        ("dockerfile_inline", "put the Dockerfile in the context"),
        (
            "additional_contexts",
            "only the one context is uploaded; put everything in it",
        ),
        ("ssh", "the host's SSH agent is not lent to builds"),
        ("secrets", "they are read from host files"),
        ("entitlements", "it widens the build's sandbox"),
    ];
    for (key, why) in REFUSED {
        if m.get(*key).is_some_and(is_set) {
            return Err(refused(name, &format!("build.{key}"), why));
        }
    }
    if m.get("privileged").is_some_and(truthy) {
        return Err(refused(
            name,
            "build.privileged",
            "it widens the build's sandbox",
        ));
    }
    if let Some(n) = m.get("network").and_then(scalar) {
        if n == "host" {
            return Err(refused(
                name,
                "build.network: host",
                "a build step would reach the host's network",
            ));
        }
    }
    let text = |key: &str, default: &str| -> Result<String> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(default.to_string()),
            Some(v) => match scalar(v) {
                Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                Some(_) => Ok(default.to_string()),
                None => bad(name, &format!("{key} must be a string, got {}", kind_of(v))),
            },
        }
    };
    let context = text("context", ".")?;
    if context.contains("://") || context.starts_with("git@") {
        return bad(
            name,
            &format!("context \"{context}\" is a remote URL; only a local directory is uploaded"),
        );
    }
    if context.contains('\0') {
        return bad(name, "context contains a NUL byte");
    }
    let dockerfile = text("dockerfile", "Dockerfile")?;
    let rel = dockerfile.trim_start_matches("./");
    if rel.is_empty()
        || dockerfile.starts_with('/')
        || rel.split('/').any(|c| c == "..")
        || rel.contains('\0')
    {
        return bad(
            name,
            &format!("dockerfile \"{dockerfile}\" must be a relative path inside the context"),
        );
    }
    let target = text("target", "")?;
    let args = build_args(name, m.get("args"))?;
    Ok(Some(Build {
        context,
        dockerfile: rel.to_string(),
        args,
        target,
        context_digest: String::new(),
        scope: String::new(),
    }))
}

/// `build.args`: a mapping or a `KEY=VALUE` list; a key without a value is left unset
/// (Compose would read it from the host shell, and there is none).
fn build_args(name: &str, v: Option<&Value>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let bad_key = |k: &str| {
        fail::<()>(format!(
            "compose: service \"{name}\" build arg name \"{k}\" is invalid"
        ))
    };
    let ok_key = |k: &str| !k.is_empty() && !k.contains('=') && !k.contains('\0');
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(m)) => {
            for (k, val) in m {
                let Some(key) = scalar(k) else {
                    return fail(format!(
                        "compose: service \"{name}\" build arg names must be strings"
                    ));
                };
                if !ok_key(&key) {
                    bad_key(&key)?;
                }
                match val {
                    Value::Null => {}
                    other => match scalar(other) {
                        Some(s) => {
                            out.insert(key, s);
                        }
                        None => {
                            return fail(format!(
                                "compose: service \"{name}\" build arg \"{key}\" must be a string, number or bool"
                            ))
                        }
                    },
                }
            }
        }
        Some(Value::Sequence(items)) => {
            for item in items {
                let Some(s) = scalar(item) else {
                    return fail(format!(
                        "compose: service \"{name}\" build arg \"{}\" must be KEY=VALUE",
                        describe(item)
                    ));
                };
                match s.split_once('=') {
                    Some((k, val)) => {
                        if !ok_key(k) {
                            bad_key(k)?;
                        }
                        out.insert(k.to_string(), val.to_string());
                    }
                    None if ok_key(&s) => {}
                    None => bad_key(&s)?,
                }
            }
        }
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" build args must be a mapping or a list of KEY=VALUE, got {}",
                kind_of(other)
            ))
        }
    }
    Ok(out)
}

/// `cap_add`: a list (or one string) of capability names; each is normalised (upper
/// case, `CAP_` dropped) and must be in [`crate::ADDABLE_CAPS`]. Sorted, unique.
fn cap_add(name: &str, v: Option<&Value>) -> Result<Vec<String>> {
    let items: Vec<&Value> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(s)) => s.iter().collect(),
        Some(one @ Value::String(_)) => vec![one],
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" cap_add must be a list of capability names, got {}",
                kind_of(other)
            ))
        }
    };
    let mut out = Vec::new();
    for it in items {
        let Some(raw) = scalar(it).filter(|_| matches!(it, Value::String(_))) else {
            return fail(format!(
                "compose: service \"{name}\" cap_add must be a list of capability names, got {}",
                kind_of(it)
            ));
        };
        let up = raw.trim().to_ascii_uppercase();
        let cap = up.strip_prefix("CAP_").unwrap_or(&up).to_string();
        if !crate::ADDABLE_CAPS.contains(&cap.as_str()) {
            return fail(format!(
                "compose: service \"{name}\" cap_add {} is refused; only capabilities of Docker's default set can be added back ({})",
                raw.trim(),
                crate::ADDABLE_CAPS.join(", ")
            ));
        }
        if !out.contains(&cap) {
            out.push(cap);
        }
    }
    out.sort();
    Ok(out)
}

fn refused(name: &str, what: &str, why: &str) -> ComposeError {
    ComposeError(format!(
        "compose: service \"{name}\" uses {what}, which is refused; {why}"
    ))
}

/// The refused-key table of the module docs, in that order.
fn refused_keys(name: &str, m: &Mapping) -> Result<()> {
    if let Some(v) = m.get("network_mode").filter(|v| !v.is_null()) {
        let mode = describe(v);
        if mode == "host" {
            return fail(format!(
                "compose: service \"{name}\" uses network_mode: host, which cannot be forked"
            ));
        }
        if mode != "bridge" && mode != "default" {
            return Err(refused(
                name,
                &format!("network_mode: {mode}"),
                "every service joins the stack's own network",
            ));
        }
    }
    if m.get("privileged").is_some_and(truthy) {
        return fail(format!(
            "compose: service \"{name}\" asks for privileged, which is refused"
        ));
    }
    cap_add(name, m.get("cap_add"))?;

    const SET_KEYS: &[(&str, &str)] = &[
        ("devices", "host devices reach outside the sandbox"),
        (
            "device_cgroup_rules",
            "host devices reach outside the sandbox",
        ),
        ("gpus", "GPU passthrough is not available yet"),
        (
            "security_opt",
            "it can switch off the sandbox's confinement",
        ),
        ("sysctls", "kernel parameters are not set for environments"),
        (
            "volumes_from",
            "it shares another container's mounts; use named volumes",
        ),
    ];
    for (key, why) in SET_KEYS {
        if m.get(*key).is_some_and(is_set) {
            return Err(refused(name, key, why));
        }
    }
    let gpu_devices = m
        .get("deploy")
        .and_then(|d| d.get("resources"))
        .and_then(|r| r.get("reservations"))
        .and_then(|r| r.get("devices"));
    if gpu_devices.is_some_and(is_set) {
        return Err(refused(
            name,
            "deploy.resources.reservations.devices",
            "GPU passthrough is not available yet",
        ));
    }

    if let Some(v) = m.get("pid").filter(|v| is_set(v)) {
        return Err(refused(
            name,
            &format!("pid: {}", describe(v)),
            "a shared pid namespace reaches outside the service",
        ));
    }
    if let Some(v) = m.get("ipc").filter(|v| is_set(v)) {
        let mode = describe(v);
        if mode == "host" || mode.starts_with("service:") || mode.starts_with("container:") {
            return Err(refused(
                name,
                &format!("ipc: {mode}"),
                "a shared ipc namespace reaches outside the service",
            ));
        }
    }
    for key in ["uts", "userns_mode", "cgroup"] {
        if let Some(v) = m.get(key) {
            if describe(v) == "host" {
                return Err(refused(
                    name,
                    &format!("{key}: host"),
                    "host namespaces reach outside the sandbox",
                ));
            }
        }
    }
    if m.get("cgroup_parent").is_some_and(is_set) {
        return Err(refused(
            name,
            "cgroup_parent",
            "the sidecar places every service in its own capped cgroup",
        ));
    }
    if m.get("oom_kill_disable").is_some_and(truthy) {
        return Err(refused(
            name,
            "oom_kill_disable",
            "it would defeat the memory cap",
        ));
    }
    if m.get("env_file").is_some_and(is_set) {
        return Err(refused(
            name,
            "env_file",
            "the file is not read; put the variables under environment",
        ));
    }
    for key in ["secrets", "configs"] {
        if m.get(key).is_some_and(is_set) {
            return Err(refused(
                name,
                key,
                "they are read from host files; use environment or a named volume",
            ));
        }
    }
    if m.get("entrypoint").is_some_and(|v| !v.is_null()) {
        return Err(refused(
            name,
            "entrypoint",
            "it is not carried in v0; put the whole argv in command",
        ));
    }
    if m.get("working_dir").is_some_and(is_set) {
        return Err(refused(
            name,
            "working_dir",
            "it is not carried in v0; use command: [\"sh\", \"-c\", \"cd /dir && ...\"]",
        ));
    }
    Ok(())
}

fn user(name: &str, v: Option<&Value>) -> Result<String> {
    let user = match v {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) if n.as_u64().is_some() => n.to_string(),
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" user \"{}\" must be uid[:gid] (e.g. \"1000:1000\")",
                describe(other)
            ))
        }
    };
    if !user.is_empty() && !is_valid_user(&user) {
        return fail(format!(
            "compose: service \"{name}\" user \"{user}\" must be uid[:gid] (e.g. \"1000:1000\")"
        ));
    }
    Ok(user)
}

fn environment(name: &str, v: Option<&Value>) -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    let check_key = |k: &str| {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            fail(format!(
                "compose: service \"{name}\" environment variable name \"{k}\" is invalid"
            ))
        } else {
            Ok(())
        }
    };
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(m)) => {
            for (k, val) in m {
                let Some(key) = scalar(k) else {
                    return fail(format!(
                        "compose: service \"{name}\" environment variable names must be strings"
                    ));
                };
                check_key(&key)?;
                match val {
                    // Compose would read it from the host shell; there is none: unset.
                    Value::Null => {}
                    other => match scalar(other) {
                        Some(s) => {
                            env.insert(key, s);
                        }
                        None => {
                            return fail(format!(
                                "compose: service \"{name}\" environment variable \"{key}\" must be a string, number or bool"
                            ))
                        }
                    },
                }
            }
        }
        Some(Value::Sequence(items)) => {
            for item in items {
                let Value::String(s) = item else {
                    return fail(format!(
                        "compose: service \"{name}\" environment entry \"{}\" must be KEY=VALUE",
                        describe(item)
                    ));
                };
                match s.split_once('=') {
                    Some((k, val)) => {
                        check_key(k)?;
                        env.insert(k.to_string(), val.to_string());
                    }
                    // `- KEY` is read from the host shell in Compose; there is none: unset.
                    None => check_key(s)?,
                }
            }
        }
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" environment must be a mapping or a list of KEY=VALUE, got {}",
                kind_of(other)
            ))
        }
    }
    Ok(env)
}

fn ports(name: &str, v: Option<&Value>) -> Result<Vec<u16>> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" ports must be a list, got {}",
                kind_of(other)
            ))
        }
    };
    let mut out: Vec<u16> = Vec::new();
    let mut seen = BTreeSet::new();
    for item in items {
        let p = port(name, item)?;
        if seen.insert(p) {
            out.push(p);
        }
    }
    Ok(out)
}

fn port(name: &str, item: &Value) -> Result<u16> {
    let invalid = || {
        fail(format!(
            "compose: service \"{name}\" port \"{}\" must be a container port (80, 8080:80 or 127.0.0.1:8080:80)",
            describe(item)
        ))
    };
    let udp = |written: &str| {
        fail(format!(
            "compose: service \"{name}\" port \"{written}\" is refused; only tcp ports are supported"
        ))
    };
    let number = |s: &str| s.trim().parse::<u16>().ok().filter(|p| *p != 0);
    match item {
        Value::Number(n) => match n.as_u64().and_then(|p| u16::try_from(p).ok()) {
            Some(p) if p != 0 => Ok(p),
            _ => invalid(),
        },
        Value::String(s) => {
            let (main, proto) = match s.rsplit_once('/') {
                Some((main, proto)) => (main, Some(proto)),
                None => (s.as_str(), None),
            };
            match proto {
                None => {}
                Some(p) if p.eq_ignore_ascii_case("tcp") => {}
                Some(p) if p.eq_ignore_ascii_case("udp") || p.eq_ignore_ascii_case("sctp") => {
                    return udp(s)
                }
                Some(_) => return invalid(),
            }
            let container = main.rsplit(':').next().unwrap_or("");
            match number(container) {
                Some(p) => Ok(p),
                None => invalid(),
            }
        }
        Value::Mapping(m) => {
            if let Some(proto) = m.get("protocol").and_then(scalar) {
                if !proto.eq_ignore_ascii_case("tcp") {
                    return udp(&format!(
                        "{}/{proto}",
                        m.get("target").map(describe).unwrap_or_default()
                    ));
                }
            }
            match m.get("target").and_then(scalar).as_deref().and_then(number) {
                Some(p) => Ok(p),
                None => invalid(),
            }
        }
        _ => invalid(),
    }
}

/// A short-form volume source that names a host path (a bind mount).
fn is_host_path(source: &str) -> bool {
    source.starts_with(['/', '.', '~', '$', '\\'])
}

fn service_volumes(
    name: &str,
    v: Option<&Value>,
    declared: &BTreeSet<String>,
) -> Result<Vec<VolumeMount>> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" volumes must be a list, got {}",
                kind_of(other)
            ))
        }
    };
    let mut out: Vec<VolumeMount> = Vec::new();
    let mut paths = BTreeSet::new();
    for item in items {
        let Some(mount) = volume_entry(name, item, declared)? else {
            continue;
        };
        if !paths.insert(mount.path.clone()) {
            return fail(format!(
                "compose: service \"{name}\" mounts two volumes at \"{}\"",
                mount.path
            ));
        }
        out.push(mount);
    }
    Ok(out)
}

fn must_be(name: &str, written: &str) -> ComposeError {
    ComposeError(format!(
        "compose: service \"{name}\" volume \"{written}\" must be <name>:<path>"
    ))
}

fn bind_mount(name: &str, source: &str) -> ComposeError {
    ComposeError(format!(
        "compose: service \"{name}\" bind-mounts \"{source}\"; only named volumes are forkable"
    ))
}

/// One `volumes` entry; `Ok(None)` for a long-form `tmpfs`, which is ignored.
fn volume_entry(
    name: &str,
    item: &Value,
    declared: &BTreeSet<String>,
) -> Result<Option<VolumeMount>> {
    const OPTIONS: &[&str] = &[
        "ro",
        "rw",
        "z",
        "Z",
        "nocopy",
        "consistent",
        "cached",
        "delegated",
    ];
    let (source, target, read_only, written) = match item {
        Value::String(s) => {
            let parts: Vec<&str> = s.split(':').collect();
            let source = parts.first().copied().unwrap_or("");
            if parts.len() >= 2 && is_host_path(source) {
                return Err(bind_mount(name, source));
            }
            if !(2..=3).contains(&parts.len()) {
                return Err(must_be(name, s));
            }
            let mut read_only = false;
            if let Some(opts) = parts.get(2) {
                for opt in opts.split(',') {
                    if !OPTIONS.contains(&opt) {
                        return Err(must_be(name, s));
                    }
                    read_only |= opt == "ro";
                }
            }
            let target = parts.get(1).copied().unwrap_or("");
            (source.to_string(), target.to_string(), read_only, s.clone())
        }
        Value::Mapping(m) => {
            let kind = m
                .get("type")
                .and_then(scalar)
                .unwrap_or_else(|| "volume".into());
            let source = m.get("source").and_then(scalar).unwrap_or_default();
            let target = m.get("target").and_then(scalar).unwrap_or_default();
            let written = if source.is_empty() {
                target.clone()
            } else {
                source.clone()
            };
            match kind.as_str() {
                "volume" => {}
                "bind" => return Err(bind_mount(name, &source)),
                "tmpfs" => return Ok(None),
                other => {
                    return fail(format!(
                        "compose: service \"{name}\" volume \"{written}\" has type \"{other}\", which is refused; only named volumes are forkable"
                    ))
                }
            }
            if is_host_path(&source) {
                return Err(bind_mount(name, &source));
            }
            let read_only = m.get("read_only").is_some_and(truthy);
            (source, target, read_only, written)
        }
        other => return Err(must_be(name, &describe(other))),
    };
    if source.is_empty() || !target.starts_with('/') {
        return Err(must_be(name, &written));
    }
    if !declared.contains(&source) {
        return fail(format!(
            "compose: service \"{name}\" uses undeclared volume \"{source}\""
        ));
    }
    Ok(Some(VolumeMount {
        name: source,
        path: target,
        read_only,
    }))
}

fn depends_on(name: &str, v: Option<&Value>, all: &BTreeSet<String>) -> Result<Vec<String>> {
    let shape = || {
        fail(format!(
            "compose: service \"{name}\" depends_on must be a list or a mapping of service names"
        ))
    };
    let names: Vec<String> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(_)) => match v.and_then(string_list) {
            Some(names) => names,
            None => return shape(),
        },
        Some(Value::Mapping(m)) => match m.keys().map(scalar).collect::<Option<Vec<_>>>() {
            Some(names) => names,
            None => return shape(),
        },
        Some(_) => return shape(),
    };
    let mut out: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for dep in names {
        if !all.contains(&dep) {
            return fail(format!(
                "compose: service \"{name}\" depends on \"{dep}\", which is not a service in this file"
            ));
        }
        if seen.insert(dep.clone()) {
            out.push(dep);
        }
    }
    Ok(out)
}

/// The mapping form's conditions other than `service_started` (the default; also of the
/// list form and of an entry without `condition`).
fn depends_on_condition(name: &str, v: Option<&Value>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Some(Value::Mapping(m)) = v else {
        return Ok(out);
    };
    for (k, entry) in m {
        let Some(dep) = scalar(k) else { continue };
        let cond = match entry {
            Value::Mapping(e) => match e.get("condition") {
                None | Some(Value::Null) => continue,
                Some(c) => match scalar(c) {
                    Some(c) => c,
                    None => {
                        return fail(format!(
                            "compose: service \"{name}\" depends_on \"{dep}\" condition must be a string"
                        ))
                    }
                },
            },
            _ => continue,
        };
        match cond.as_str() {
            crate::SERVICE_STARTED => {}
            crate::SERVICE_HEALTHY | crate::SERVICE_COMPLETED_SUCCESSFULLY => {
                out.insert(dep, cond);
            }
            other => {
                return fail(format!(
                    "compose: service \"{name}\" depends_on \"{dep}\" condition \"{other}\" must be service_started, service_healthy or service_completed_successfully"
                ))
            }
        }
    }
    Ok(out)
}

/// `command`-style argv: a string split on whitespace, or a list of scalars.
fn argv(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Null => Some(Vec::new()),
        Value::String(s) => Some(s.split_whitespace().map(str::to_string).collect()),
        Value::Sequence(_) => string_list(v),
        _ => None,
    }
}

fn command(name: &str, v: Option<&Value>) -> Result<Vec<String>> {
    match v.map(argv) {
        None => Ok(Vec::new()),
        Some(Some(argv)) => Ok(argv),
        Some(None) => fail(format!(
            "compose: service \"{name}\" command must be a string or a list of strings"
        )),
    }
}

fn healthcheck(name: &str, v: Option<&Value>) -> Result<Option<Health>> {
    let m = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Mapping(m)) => m,
        Some(other) => {
            return fail(format!(
                "compose: service \"{name}\" healthcheck must be a mapping, got {}",
                kind_of(other)
            ))
        }
    };
    if m.get("disable").is_some_and(truthy) {
        return Ok(None);
    }
    let bad_test = || {
        fail(format!(
            "compose: service \"{name}\" healthcheck test must be a string or a list starting with CMD, CMD-SHELL or NONE"
        ))
    };
    let test = match m.get("test") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.trim() == "NONE" => return Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => return bad_test(),
        Some(Value::String(s)) => vec!["CMD-SHELL".to_string(), s.clone()],
        Some(list @ Value::Sequence(_)) => {
            let Some(items) = string_list(list) else {
                return bad_test();
            };
            match items.split_first() {
                Some((first, _)) if first == "NONE" => return Ok(None),
                Some((first, rest)) if first == "CMD" && !rest.is_empty() => items,
                Some((first, rest)) if first == "CMD-SHELL" && !rest.is_empty() => {
                    vec!["CMD-SHELL".to_string(), rest.join(" ")]
                }
                _ => return bad_test(),
            }
        }
        Some(_) => return bad_test(),
    };
    let interval_ms = match m.get("interval") {
        None | Some(Value::Null) => 0,
        Some(v) => match scalar(v).as_deref().and_then(duration_ms) {
            Some(ms) => ms,
            None => {
                return fail(format!(
                    "compose: service \"{name}\" healthcheck interval \"{}\" must be a duration like 2s, 1m30s or 500ms",
                    describe(v)
                ))
            }
        },
    };
    let retries = match m.get("retries") {
        None | Some(Value::Null) => 0,
        Some(v) => match scalar(v).and_then(|s| s.trim().parse::<u32>().ok()) {
            Some(r) => r,
            None => {
                return fail(format!(
                    "compose: service \"{name}\" healthcheck retries \"{}\" must be a non-negative integer",
                    describe(v)
                ))
            }
        },
    };
    Ok(Some(Health {
        test,
        interval_ms: if interval_ms == 0 {
            DEFAULT_INTERVAL_MS
        } else {
            interval_ms
        },
        retries: if retries == 0 {
            DEFAULT_RETRIES
        } else {
            retries
        },
    }))
}

/// A Go-style duration (`2s`, `1m30s`, `500ms`, `1.5h`, `10us`, `0`) in milliseconds,
/// rounded up. `None` when malformed or longer than about 31 years.
fn duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    const UNITS: &[(&str, f64)] = &[
        ("ns", 1e-6),
        ("us", 1e-3),
        ("µs", 1e-3),
        ("μs", 1e-3),
        ("ms", 1.0),
        ("s", 1e3),
        ("m", 60e3),
        ("h", 3600e3),
    ];
    let mut rest = s;
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(digits);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        let (unit, scale) = UNITS.iter().find(|(u, _)| tail.starts_with(u))?;
        total += value * scale;
        rest = &tail[unit.len()..];
    }
    if !total.is_finite() || total > 1e12 {
        return None;
    }
    // In range by the check above.
    Some(total.ceil() as u64)
}

fn resources(name: &str, m: &Mapping) -> Result<Resources> {
    let limits = m
        .get("deploy")
        .and_then(|d| d.get("resources"))
        .and_then(|r| r.get("limits"));
    let limit = |key: &str| limits.and_then(|l| l.get(key));

    let memory = memory_bytes(name, "mem_limit", m.get("mem_limit"))?;
    let memory_alt = memory_bytes(name, "deploy.resources.limits.memory", limit("memory"))?;
    let pids = pids_cap(name, "pids_limit", m.get("pids_limit"))?;
    let pids_alt = pids_cap(name, "deploy.resources.limits.pids", limit("pids"))?;
    let cpus = cpus_cap(name, "cpus", m.get("cpus"))?;
    let cpus_alt = cpus_cap(name, "deploy.resources.limits.cpus", limit("cpus"))?;

    let memory_mb = match memory.or(memory_alt) {
        Some(bytes) => bytes.div_ceil(MIB),
        None => DEFAULT_MEMORY_MB,
    };
    Ok(Resources {
        memory_mb,
        pids: pids.or(pids_alt).unwrap_or(DEFAULT_PIDS),
        cpus: cpus.or(cpus_alt).unwrap_or(DEFAULT_CPUS),
    })
}

/// Bytes of a memory cap; `None` when absent or zero (the default applies).
fn memory_bytes(name: &str, key: &str, v: Option<&Value>) -> Result<Option<u64>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(bytes) = scalar(v).as_deref().and_then(size_bytes) else {
        return fail(format!(
            "compose: service \"{name}\" {key} \"{}\" must be bytes or a size like 512m or 2g",
            describe(v)
        ));
    };
    if bytes == 0 {
        return Ok(None);
    }
    if bytes < MIN_MEMORY_BYTES {
        return fail(format!(
            "compose: service \"{name}\" {key} \"{}\" is below Docker's 6 MiB minimum",
            describe(v)
        ));
    }
    Ok(Some(bytes))
}

/// Docker's `RAMInBytes`: `<n>[.<n>][ ][kmgtp][i][b]`, binary units, any case
/// (`512m`, `2g`, `1.5GiB`, `1024k`, `67108864`). `None` when `s` is not such a size or
/// is 9e18 bytes or more. Used for `mem_limit`, `x-denv.disk` and the API's
/// `resources.memory` / `resources.disk` (spec `13-ref-compose.md`).
pub fn size_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return None;
    }
    let unit = unit.trim_start().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let scale: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return None,
    };
    // `"i"` alone or `"ib"` alone are not units.
    if scale == 1 && s.len() > num.len() {
        let tail = s[num.len()..].trim_start().to_ascii_lowercase();
        if tail != "b" {
            return None;
        }
    }
    let value: f64 = num.parse().ok()?;
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes >= 9.0e18 {
        return None;
    }
    // In range by the check above.
    Some(bytes as u64)
}

/// A pids cap; `None` when absent or zero.
fn pids_cap(name: &str, key: &str, v: Option<&Value>) -> Result<Option<i64>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(n) = scalar(v).and_then(|s| s.trim().parse::<i64>().ok()) else {
        return fail(format!(
            "compose: service \"{name}\" {key} \"{}\" must be an integer",
            describe(v)
        ));
    };
    if n < 0 {
        return fail(format!(
            "compose: service \"{name}\" {key} {n} is refused; set a positive limit (0 means the default {DEFAULT_PIDS})"
        ));
    }
    Ok((n != 0).then_some(n))
}

/// A CPU cap; `None` when absent or zero.
fn cpus_cap(name: &str, key: &str, v: Option<&Value>) -> Result<Option<f64>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let parsed = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match parsed {
        Some(c) if c.is_finite() && c >= 0.0 => Ok((c != 0.0).then_some(c)),
        _ => fail(format!(
            "compose: service \"{name}\" {key} \"{}\" must be a non-negative number",
            describe(v)
        )),
    }
}

/// Refuse `depends_on` cycles, naming the first cycle found from the alphabetically first
/// service that is on or leads to one: `compose: depends_on cycle: a -> b -> a`.
/// Linear in services plus edges (Kahn's algorithm, then one walk).
fn check_cycles(services: &[Service]) -> Result<()> {
    let index: BTreeMap<&str, usize> = services
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let deps: Vec<Vec<usize>> = services
        .iter()
        .map(|s| {
            s.depends_on
                .iter()
                .filter_map(|d| index.get(d.as_str()).copied())
                .collect()
        })
        .collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); services.len()];
    for (u, ds) in deps.iter().enumerate() {
        for &d in ds {
            if let Some(list) = dependents.get_mut(d) {
                list.push(u);
            }
        }
    }
    // Peel services whose dependencies are all peeled; what remains is on or leads to a cycle.
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..services.len()).filter(|&i| waiting[i] == 0).collect();
    while let Some(d) = ready.pop() {
        for &u in &dependents[d] {
            waiting[u] -= 1;
            if waiting[u] == 0 {
                ready.push(u);
            }
        }
    }
    // Services are sorted, so the lowest remaining index is the alphabetically first.
    let Some(start) = (0..services.len()).find(|&i| waiting[i] > 0) else {
        return Ok(());
    };
    // Every remaining service depends on another remaining one: walk until a repeat.
    let mut path: Vec<usize> = vec![start];
    let mut seen_at: BTreeMap<usize, usize> = BTreeMap::from([(start, 0)]);
    let mut current = start;
    let names = |ids: &[usize]| {
        ids.iter()
            .map(|&i| services[i].name.as_str())
            .collect::<Vec<_>>()
            .join(" -> ")
    };
    loop {
        let Some(&next) = deps[current].iter().find(|&&d| waiting[d] > 0) else {
            // Unreachable by construction; report what we have rather than panic.
            return fail(format!("compose: depends_on cycle: {}", names(&path)));
        };
        if let Some(&pos) = seen_at.get(&next) {
            let mut cycle = path.split_off(pos);
            cycle.push(next);
            return fail(format!("compose: depends_on cycle: {}", names(&cycle)));
        }
        seen_at.insert(next, path.len());
        path.push(next);
        current = next;
    }
}

// ---------------------------------------------------------------------------------------
// x-denv

fn x_denv(v: Option<&Value>, spec: &mut Spec) -> Result<()> {
    let m = match v {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Mapping(m)) => m,
        Some(other) => {
            return fail(format!(
                "compose: x-denv must be a mapping, got {}",
                kind_of(other)
            ))
        }
    };

    if let Some(kind) = m.get("kind").filter(|v| !v.is_null()) {
        match kind {
            Value::String(s) => spec.kind = s.clone(),
            other => {
                return fail(format!(
                    "compose: x-denv.kind must be a string, got {}",
                    kind_of(other)
                ))
            }
        }
    }

    if let Some(egress) = m.get("egress").filter(|v| !v.is_null()) {
        spec.egress = match describe(egress).as_str() {
            "deny" => Egress::Deny,
            "allow" => Egress::Allow,
            got => {
                return fail(format!(
                    "compose: x-denv.egress must be deny or allow, got \"{got}\""
                ))
            }
        };
    }

    if let Some(warm) = m.get("warm") {
        spec.warm = match warm {
            Value::Null => Vec::new(),
            Value::String(s) => s.split_whitespace().map(str::to_string).collect(),
            other => match string_list(other) {
                Some(argv) => argv,
                None => return fail("compose: x-denv.warm must be a list of strings (argv)"),
            },
        };
    }

    if let Some(clock) = m.get("clock").filter(|v| !v.is_null()) {
        spec.clock = Some(match describe(clock).as_str() {
            "frozen" => Clock::Frozen,
            "real" => Clock::Real,
            got => {
                return fail(format!(
                    "compose: x-denv.clock must be frozen or real, got \"{got}\""
                ))
            }
        });
    }

    if let Some(disk) = m.get("disk").filter(|v| !v.is_null()) {
        let bad = || {
            fail(format!(
                "compose: x-denv.disk \"{}\" must be a size like 512m or 20g (at least {MIN_DISK_MB}m)",
                describe(disk)
            ))
        };
        let Some(bytes) = scalar(disk).as_deref().and_then(size_bytes) else {
            return bad();
        };
        if bytes != 0 && bytes < MIN_DISK_MB * MIB {
            return bad();
        }
        spec.disk_mb = bytes.div_ceil(MIB);
    }

    if let Some(pool) = m.get("pool").filter(|v| !v.is_null()) {
        spec.pool = match pool {
            Value::Number(n) => n
                .as_u64()
                .filter(|n| *n <= u64::from(MAX_POOL))
                .map(|n| n as u32),
            _ => None,
        }
        .ok_or_else(|| {
            ComposeError(format!(
                "compose: x-denv.pool \"{}\" must be a whole number from 0 to {MAX_POOL} (warm forks kept)",
                describe(pool)
            ))
        })?;
    }

    if let Some(agent) = m.get("agent").filter(|v| !v.is_null()) {
        spec.agent = Some(agent_block(agent, spec)?);
    }

    if let Some(verifier) = m.get("verifier").filter(|v| !v.is_null()) {
        spec.verifier = Some(verifier_block(verifier, spec)?);
    }

    if let Some(promote) = m.get("promote").filter(|v| !v.is_null()) {
        spec.promote = Some(promote_block(promote, spec)?);
    }
    Ok(())
}

/// `x-denv.promote` (`docs/reference/compose.md`): `replay: {forks, commands}`,
/// `consistency`, `invariants` (lists of checks) and `soak` (a duration).
fn promote_block(v: &Value, spec: &Spec) -> Result<Promote> {
    let Value::Mapping(m) = v else {
        return fail("compose: x-denv.promote must be a mapping");
    };
    for key in m.keys() {
        let k = describe(key);
        if !matches!(k.as_str(), "replay" | "consistency" | "invariants" | "soak") {
            return fail(format!(
                "compose: x-denv.promote.{k} is not a key of x-denv.promote (replay, consistency, invariants, soak)"
            ));
        }
    }
    let mut p = Promote::default();
    if let Some(replay) = m.get("replay").filter(|v| !v.is_null()) {
        let Value::Mapping(r) = replay else {
            return fail("compose: x-denv.promote.replay must be a mapping like { forks: 3, commands: [...] }");
        };
        if let Some(forks) = r.get("forks").filter(|v| !v.is_null()) {
            p.replay_forks = match forks {
                Value::Number(n) => n
                    .as_u64()
                    .filter(|n| (2..=u64::from(MAX_REPLAY_FORKS)).contains(n))
                    .map(|n| n as u32),
                _ => None,
            }
            .ok_or_else(|| {
                ComposeError(format!(
                    "compose: x-denv.promote.replay.forks \"{}\" must be a whole number from 2 to {MAX_REPLAY_FORKS}",
                    describe(forks)
                ))
            })?;
        }
        p.replay = checks(r.get("commands"), "replay.commands", spec)?;
    }
    p.consistency = checks(m.get("consistency"), "consistency", spec)?;
    p.invariants = checks(m.get("invariants"), "invariants", spec)?;
    if let Some(soak) = m.get("soak").filter(|v| !v.is_null()) {
        p.soak_ms = scalar(soak)
            .as_deref()
            .map(str::trim)
            .and_then(|s| if s == "0" { Some(0) } else { duration_ms(s) })
            .filter(|ms| *ms <= MAX_SOAK_MS)
            .ok_or_else(|| {
                ComposeError(format!(
                    "compose: x-denv.promote.soak \"{}\" must be a duration like 30s or 5m (at most 10m)",
                    describe(soak)
                ))
            })?;
    }
    Ok(p)
}

/// A list of promote checks at `x-denv.promote.<what>`: each `{name?, service, cmd}`
/// where `cmd` is a list (argv) or a string (run with `sh -c`).
fn checks(v: Option<&Value>, what: &str, spec: &Spec) -> Result<Vec<Check>> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items,
        Some(_) => {
            return fail(format!(
                "compose: x-denv.promote.{what} must be a list of {{service, cmd}} checks"
            ))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Mapping(c) = item else {
            return fail(format!(
                "compose: x-denv.promote.{what}[{i}] must be a mapping like {{ service: db, cmd: [...] }}"
            ));
        };
        let Some(service) = c.get("service").and_then(scalar).filter(|s| !s.is_empty()) else {
            return fail(format!(
                "compose: x-denv.promote.{what}[{i}].service is required"
            ));
        };
        if spec.service(&service).is_none() {
            return fail(format!(
                "compose: x-denv.promote.{what}[{i}].service \"{service}\" is not a service in this file"
            ));
        }
        let cmd = match c.get("cmd") {
            Some(Value::String(s)) if !s.trim().is_empty() => {
                vec!["sh".to_string(), "-c".to_string(), s.clone()]
            }
            Some(other @ Value::Sequence(_)) => match string_list(other) {
                Some(argv) if !argv.is_empty() => argv,
                _ => {
                    return fail(format!(
                        "compose: x-denv.promote.{what}[{i}].cmd must be a non-empty list of strings or a shell string"
                    ))
                }
            },
            _ => {
                return fail(format!(
                    "compose: x-denv.promote.{what}[{i}].cmd is required (a list of strings or a shell string)"
                ))
            }
        };
        let name = c
            .get("name")
            .and_then(scalar)
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| match cmd.as_slice() {
                [sh, dash_c, script] if sh == "sh" && dash_c == "-c" => script.clone(),
                _ => cmd.join(" "),
            });
        out.push(Check { name, service, cmd });
    }
    Ok(out)
}

fn agent_block(v: &Value, spec: &Spec) -> Result<Agent> {
    let Value::Mapping(m) = v else {
        return fail("compose: x-denv.agent must be a mapping like { service: opsbox }");
    };
    let Some(name) = m.get("service").and_then(scalar).filter(|s| !s.is_empty()) else {
        return fail("compose: x-denv.agent.service is required: the service the agent runs in");
    };
    let Some(service) = spec.service(&name) else {
        return fail(format!(
            "compose: x-denv.agent.service \"{name}\" is not a service in this file"
        ));
    };
    if is_root_user(&service.user) {
        return fail(format!(
            "compose: x-denv.agent.service \"{name}\" must set a non-root user (user: \"1000:1000\"); the agent is never root"
        ));
    }
    if !service.cap_add.is_empty() {
        return fail(format!(
            "compose: x-denv.agent.service \"{name}\" uses cap_add, which is refused; the agent runs with no capabilities"
        ));
    }
    Ok(Agent { service: name })
}

fn verifier_block(v: &Value, spec: &Spec) -> Result<Verifier> {
    let Value::Mapping(m) = v else {
        return fail("compose: x-denv.verifier must be a mapping");
    };
    let field = |key: &str| {
        m.get(key)
            .and_then(scalar)
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let image = field("image");
    let service = field("service");
    if image.is_some() == service.is_some() {
        return fail("compose: x-denv.verifier needs exactly one of image or service");
    }
    if let Some(name) = &service {
        if spec.service(name).is_none() {
            return fail(format!(
                "compose: x-denv.verifier.service \"{name}\" is not a service in this file"
            ));
        }
    }

    let command = match m.get("command").map(argv) {
        Some(Some(argv)) if !argv.is_empty() => argv,
        Some(Some(_)) | None => return fail("compose: x-denv.verifier.command is required"),
        Some(None) => {
            return fail("compose: x-denv.verifier.command must be a string or a list of strings")
        }
    };

    let collect = match m.get("collect") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(other) => match string_list(other) {
            Some(paths) => paths,
            None => {
                return fail("compose: x-denv.verifier.collect must be a list of absolute paths")
            }
        },
    };
    for path in &collect {
        if !path.starts_with('/') {
            return fail(format!(
                "compose: x-denv.verifier.collect path \"{path}\" must be absolute"
            ));
        }
        if path.split('/').any(|c| c == "..") {
            return fail(format!(
                "compose: x-denv.verifier.collect path \"{path}\" must not contain \"..\""
            ));
        }
    }

    let timeout_sec = match m.get("timeout_sec") {
        None | Some(Value::Null) => 0,
        Some(v) => match scalar(v).and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(t) => t,
            None => {
                return fail(format!(
                "compose: x-denv.verifier.timeout_sec \"{}\" must be a positive integer (seconds)",
                describe(v)
            ))
            }
        },
    };

    if spec.agent.is_none() {
        return fail(
            "compose: x-denv.verifier requires x-denv.agent.service, the service whose paths are collected",
        );
    }

    Ok(Verifier {
        image,
        service,
        command,
        collect,
        timeout_sec: if timeout_sec == 0 {
            DEFAULT_VERIFIER_TIMEOUT_SEC
        } else {
            timeout_sec
        },
        image_id: String::new(),
    })
}
