//! Caps asked for by one request: the `resources` object of `POST /v1/sandboxes` and
//! `POST /v1/envs/{env}/fork` (gRPC `CreateSandboxRequest.resources`,
//! `ForkRequest.resources`; manual `docs/reference/rest-api.md#resources`, spec pages
//! `12-ref-rest-api.md`, `19-ref-protections.md` §4).
//!
//! ```json
//! {"cpus": 0.5, "memory": "512m", "pids": 256, "disk": "2g"}
//! ```
//!
//! Any subset of the four keys; an absent key keeps the spec's value.
//!
//! - `cpus`, `memory`, `pids` replace the caps of the **agent's service** only
//!   ([`agent_service`]: `x-denv.agent.service`, else the service named `main`, else the
//!   only service). Other services keep the caps their compose file gave them, as
//!   Harbor's docker backend applies a task's `cpus`/`memory_mb` to `main` only.
//! - `disk` replaces the environment's quota (`x-denv.disk`): volumes together on btrfs
//!   and zfs, each writable layer where the engine allows it, nothing on `dir`.
//!
//! Refused with `400`, the message naming the key (`resources.<key>`) and the limit:
//! unknown keys; values that are not numbers (or, for `memory`/`disk`, sizes like
//! `512m`); zero, negative, non-finite or fractional (`pids`, byte counts) values;
//! values outside [`MIN_CPUS`]..=[`MAX_CPUS`], [`MIN_MEMORY_MB`]..=[`MAX_MEMORY_MB`],
//! 1..=[`MAX_PIDS`], [`denv_compose::MIN_DISK_MB`]..=[`MAX_DISK_MB`]; and values above the
//! capacity of the host the environment goes to ([`check_host`]). Nothing is clamped.

use crate::error::ApiError;
use denv_compose::{max_cpus, Spec, CPU_RESERVE};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Smallest `cpus` (Docker's own minimum, 0.01 CPU).
pub const MIN_CPUS: f64 = 0.01;
/// Largest `cpus` accepted at all (the host's limit usually bites first).
pub const MAX_CPUS: f64 = 256.0;
/// Smallest `memory`, MiB (Docker's minimum is 6 MiB).
pub const MIN_MEMORY_MB: u64 = 6;
/// Largest `memory`, MiB (1 TiB).
pub const MAX_MEMORY_MB: u64 = 1 << 20;
/// Largest `pids` (the kernel's `PID_MAX_LIMIT`).
pub const MAX_PIDS: i64 = 4_194_304;
/// Largest `disk`, MiB (64 TiB).
pub const MAX_DISK_MB: u64 = 64 << 20;

const MIB: u64 = 1 << 20;
const KEYS: &[&str] = &["cpus", "memory", "pids", "disk"];

/// The caps one request asked for (`None` = keep the spec's). Stored as the
/// deployment's `params.resources` so a fork's runner applies the same caps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// CPUs of the agent's service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory of the agent's service, MiB (a byte size rounded up to whole MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Processes and threads of the agent's service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<i64>,
    /// The environment's disk quota, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
}

impl Request {
    /// Nothing asked for.
    pub fn is_empty(&self) -> bool {
        *self == Request::default()
    }

    /// Whether a service cap (not only `disk`) is asked for.
    fn has_service_caps(&self) -> bool {
        self.cpus.is_some() || self.memory_mb.is_some() || self.pids.is_some()
    }

    /// As stored in `params.resources` and shown in evidence (`requested`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Back from `params.resources` (`Request::default()` when absent or unreadable).
    pub fn from_params(params: &Value) -> Request {
        params
            .get("resources")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default()
    }
}

fn bad(msg: String) -> ApiError {
    ApiError::BadRequest(msg)
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// Reads and validates a request's `resources` object (see the module docs); the API
/// edge turns the wire's `Struct` into this map ([`crate::api::convert::caps`]).
///
/// # Errors
/// `400` naming `resources.<key>` and the rule it broke.
pub fn parse(m: &Map<String, Value>) -> Result<Request, ApiError> {
    let mut r = Request::default();
    for (k, v) in m {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "cpus" => r.cpus = Some(cpus(v)?),
            "memory" => {
                r.memory_mb = Some(size_mb("memory", v, MIN_MEMORY_MB, MAX_MEMORY_MB)?);
            }
            "pids" => r.pids = Some(pids(v)?),
            "disk" => {
                r.disk_mb = Some(size_mb("disk", v, denv_compose::MIN_DISK_MB, MAX_DISK_MB)?);
            }
            other => {
                return Err(bad(format!(
                    "resources.{other} is not a resource; the keys are {}",
                    KEYS.join(", ")
                )))
            }
        }
    }
    Ok(r)
}

fn cpus(v: &Value) -> Result<f64, ApiError> {
    let n = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let Some(n) = n.filter(|n| n.is_finite()) else {
        return Err(bad(format!(
            "resources.cpus {} must be a number of CPUs like 0.5 or 2",
            show(v)
        )));
    };
    if n <= 0.0 {
        return Err(bad(format!(
            "resources.cpus {} must be more than 0 (at least {MIN_CPUS})",
            show(v)
        )));
    }
    if n < MIN_CPUS {
        return Err(bad(format!(
            "resources.cpus {} is below the minimum of {MIN_CPUS} CPU",
            show(v)
        )));
    }
    if n > MAX_CPUS {
        return Err(bad(format!(
            "resources.cpus {} is above the maximum of {MAX_CPUS} CPUs",
            show(v)
        )));
    }
    Ok(n)
}

fn pids(v: &Value) -> Result<i64, ApiError> {
    let n = match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                .map(|f| f as i64)
        }),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    let Some(n) = n else {
        return Err(bad(format!(
            "resources.pids {} must be a whole number of processes",
            show(v)
        )));
    };
    if n <= 0 {
        return Err(bad(format!(
            "resources.pids {} must be at least 1",
            show(v)
        )));
    }
    if n > MAX_PIDS {
        return Err(bad(format!(
            "resources.pids {} is above the maximum of {MAX_PIDS}",
            show(v)
        )));
    }
    Ok(n)
}

/// A size (`"512m"`, `"2g"`, a whole number of bytes) in MiB, rounded up.
fn size_mb(key: &str, v: &Value, min_mb: u64, max_mb: u64) -> Result<u64, ApiError> {
    let bytes = match v {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9e18)
                .map(|f| f as u64)
        }),
        Value::String(s) => denv_compose::size_bytes(s),
        _ => None,
    };
    let Some(bytes) = bytes else {
        return Err(bad(format!(
            "resources.{key} {} must be a size like 512m or 2g (a bare number is bytes)",
            show(v)
        )));
    };
    if bytes == 0 {
        return Err(bad(format!(
            "resources.{key} {} must be more than 0 (at least {min_mb} MiB)",
            show(v)
        )));
    }
    if bytes < min_mb * MIB {
        return Err(bad(format!(
            "resources.{key} {} is below the minimum of {min_mb} MiB (a bare number is bytes)",
            show(v)
        )));
    }
    let mb = bytes.div_ceil(MIB);
    if mb > max_mb {
        return Err(bad(format!(
            "resources.{key} {} is above the maximum of {max_mb} MiB",
            show(v)
        )));
    }
    Ok(mb)
}

/// The service a request's `cpus`, `memory` and `pids` apply to: the spec's
/// `x-denv.agent.service`, else a service named `main` (image sandboxes, Harbor's
/// convention), else the only service. `None` when none of these names one.
pub fn agent_service(spec: &Spec) -> Option<String> {
    if let Some(a) = &spec.agent {
        return Some(a.service.clone());
    }
    if spec.services.iter().any(|s| s.name == "main") {
        return Some("main".into());
    }
    match spec.services.as_slice() {
        [only] => Some(only.name.clone()),
        _ => None,
    }
}

/// Writes `r` into `spec` (the agent's service's caps, the environment's disk quota).
/// Returns the service the service caps went to (`None` when only `disk` was asked).
///
/// # Errors
/// `400` when service caps are asked for and [`agent_service`] finds no service.
pub fn apply(spec: &mut Spec, r: &Request) -> Result<Option<String>, ApiError> {
    if let Some(d) = r.disk_mb {
        spec.disk_mb = d;
    }
    if !r.has_service_caps() {
        return Ok(None);
    }
    let Some(name) = agent_service(spec) else {
        let names: Vec<&str> = spec.services.iter().map(|s| s.name.as_str()).collect();
        return Err(bad(format!(
            "resources: cpus, memory and pids apply to the agent's service, and this spec \
             names none (no x-denv.agent.service, no service \"main\", {} services: {}); \
             set x-denv.agent.service",
            names.len(),
            names.join(", ")
        )));
    };
    let Some(s) = spec.services.iter_mut().find(|s| s.name == name) else {
        return Err(bad(format!(
            "resources: the agent's service \"{name}\" is not in the spec"
        )));
    };
    if let Some(c) = r.cpus {
        s.resources.cpus = c;
    }
    if let Some(m) = r.memory_mb {
        s.resources.memory_mb = m;
    }
    if let Some(p) = r.pids {
        s.resources.pids = p;
    }
    Ok(Some(name))
}

/// Refuses `r` when it asks for more than the host `host` (its name or id, for the
/// message) reported at connect (`caps`: its `Capabilities` as JSON: `cpus`,
/// `memory_mb`, `disk_gb` free on its data directory). Unknown (zero) capacities are not
/// checked.
///
/// # Errors
/// `400` naming the key, the value asked and the host's limit.
pub fn check_host(r: &Request, host: &str, caps: &Value) -> Result<(), ApiError> {
    let num = |k: &str| caps.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let (cpus, mem, disk_gb) = (num("cpus"), num("memory_mb"), num("disk_gb"));
    if let Some(c) = r.cpus {
        if cpus > 0.0 && c > max_cpus(cpus) {
            return Err(bad(format!(
                "resources.cpus {c} is more than host {host} allows: {} (its {cpus} CPUs \
                 minus the {CPU_RESERVE} CPU the host keeps)",
                max_cpus(cpus)
            )));
        }
    }
    if let Some(m) = r.memory_mb {
        if mem > 0.0 && m as f64 > mem {
            return Err(bad(format!(
                "resources.memory {m} MiB is more than host {host} has: {mem} MiB"
            )));
        }
    }
    if let Some(d) = r.disk_mb {
        if disk_gb > 0.0 && d as f64 > disk_gb * 1024.0 {
            return Err(bad(format!(
                "resources.disk {d} MiB is more than host {host} has free: {} MiB",
                disk_gb * 1024.0
            )));
        }
    }
    Ok(())
}

/// The caps an environment runs with, for the deployment's evidence: every service's
/// `{cpus, memory_mb, pids}` as the sidecar applies them (zero = default; CPUs at most
/// [`max_cpus`] of the host when its CPU count is known), the disk quota in MiB and how
/// the host enforces it (`disk_quota`: its `volume_quota`, `layer_quota`), and what the
/// request asked for (`requested`, `applied_to`) when it asked.
pub fn evidence(spec: &Spec, caps: Option<&Value>, r: &Request, applied_to: Option<&str>) -> Value {
    let host_cpus = caps
        .and_then(|c| c.get("cpus"))
        .and_then(Value::as_f64)
        .filter(|c| *c > 0.0);
    let mut services = Map::new();
    for s in &spec.services {
        let cpus = if s.resources.cpus <= 0.0 {
            denv_compose::DEFAULT_CPUS
        } else {
            s.resources.cpus
        };
        let cpus = host_cpus.map_or(cpus, |h| cpus.min(max_cpus(h)));
        let memory_mb = if s.resources.memory_mb == 0 {
            denv_compose::DEFAULT_MEMORY_MB
        } else {
            s.resources.memory_mb
        };
        let pids = if s.resources.pids <= 0 {
            denv_compose::DEFAULT_PIDS
        } else {
            s.resources.pids
        };
        services.insert(
            s.name.clone(),
            json!({"cpus": cpus, "memory_mb": memory_mb, "pids": pids}),
        );
    }
    let disk_mb = if spec.disk_mb == 0 {
        denv_compose::DEFAULT_DISK_MB
    } else {
        spec.disk_mb
    };
    let mut ev = json!({"services": services, "disk_mb": disk_mb});
    if let Some(c) = caps {
        ev["disk_quota"] = c.get("volume_quota").cloned().unwrap_or(Value::Null);
        ev["layer_quota"] = c.get("layer_quota").cloned().unwrap_or(Value::Bool(false));
    }
    if !r.is_empty() {
        ev["requested"] = r.to_json();
        if let Some(a) = applied_to {
            ev["applied_to"] = json!(a);
        }
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: Value) -> Result<Request, String> {
        match v {
            Value::Object(m) => parse(&m).map_err(|e| e.to_string()),
            _ => unreachable!(),
        }
    }

    #[test]
    fn parses_sizes_and_numbers() {
        let r = p(json!({"cpus": 0.5, "memory": "64m", "pids": 64, "disk": "1g"})).unwrap();
        assert_eq!(
            r,
            Request {
                cpus: Some(0.5),
                memory_mb: Some(64),
                pids: Some(64),
                disk_mb: Some(1024)
            }
        );
        // Bytes as a number, rounded up to whole MiB; null is absent.
        let r = p(json!({"memory": 67108865, "cpus": null})).unwrap();
        assert_eq!(r.memory_mb, Some(65));
        assert_eq!(r.cpus, None);
    }

    #[test]
    fn refusals_name_the_key_and_the_limit() {
        for (v, want) in [
            (json!({"cpus": 0}), "resources.cpus 0 must be more than 0"),
            (json!({"cpus": -1}), "resources.cpus -1 must be more than 0"),
            (
                json!({"cpus": 0.001}),
                "resources.cpus 0.001 is below the minimum of 0.01",
            ),
            (
                json!({"cpus": 1000}),
                "resources.cpus 1000 is above the maximum of 256",
            ),
            (
                json!({"cpus": "lots"}),
                "resources.cpus \"lots\" must be a number",
            ),
            (
                json!({"cpus": "NaN"}),
                "resources.cpus \"NaN\" must be a number",
            ),
            (
                json!({"memory": "0"}),
                "resources.memory \"0\" must be more than 0",
            ),
            (
                json!({"memory": "-5m"}),
                "resources.memory \"-5m\" must be a size",
            ),
            (
                json!({"memory": "64 bananas"}),
                "resources.memory \"64 bananas\" must be a size",
            ),
            (
                json!({"memory": "64x"}),
                "resources.memory \"64x\" must be a size",
            ),
            (
                json!({"memory": 512}),
                "resources.memory 512 is below the minimum of 6 MiB",
            ),
            (
                json!({"memory": "2p"}),
                "resources.memory \"2p\" is above the maximum of 1048576 MiB",
            ),
            (
                json!({"memory": 1.5}),
                "resources.memory 1.5 must be a size",
            ),
            (json!({"pids": 0}), "resources.pids 0 must be at least 1"),
            (json!({"pids": -3}), "resources.pids -3 must be at least 1"),
            (
                json!({"pids": 2.5}),
                "resources.pids 2.5 must be a whole number",
            ),
            (
                json!({"pids": 99999999}),
                "resources.pids 99999999 is above the maximum of 4194304",
            ),
            (
                json!({"disk": "1m"}),
                "resources.disk \"1m\" is below the minimum of 16 MiB",
            ),
            (
                json!({"disk": "128p"}),
                "resources.disk \"128p\" is above the maximum",
            ),
            (json!({"disk": true}), "resources.disk true must be a size"),
            (
                json!({"memroy": "64m"}),
                "resources.memroy is not a resource; the keys are cpus, memory, pids, disk",
            ),
        ] {
            let e = p(v.clone()).expect_err(&v.to_string());
            assert!(e.starts_with(want), "{v}: {e}");
        }
    }

    #[test]
    fn applies_to_the_agent_service_and_checks_the_host() {
        let mut spec = denv_compose::parse(
            "services:\n  db:\n    image: busybox:1.36\n    mem_limit: 1g\n  main:\n    image: busybox:1.36\n",
        )
        .unwrap();
        let r = p(json!({"memory": "64m", "cpus": 0.5, "disk": "256m"})).unwrap();
        assert_eq!(apply(&mut spec, &r).unwrap().as_deref(), Some("main"));
        let main = spec.services.iter().find(|s| s.name == "main").unwrap();
        let db = spec.services.iter().find(|s| s.name == "db").unwrap();
        assert_eq!((main.resources.memory_mb, main.resources.cpus), (64, 0.5));
        assert_eq!(db.resources.memory_mb, 1024, "other services keep theirs");
        assert_eq!(spec.disk_mb, 256);

        let mut two = denv_compose::parse(
            "services:\n  a:\n    image: busybox:1.36\n  b:\n    image: busybox:1.36\n",
        )
        .unwrap();
        let e = apply(&mut two, &r).unwrap_err().to_string();
        assert!(e.contains("set x-denv.agent.service"), "{e}");
        // disk alone needs no agent service.
        let disk = p(json!({"disk": "1g"})).unwrap();
        assert_eq!(apply(&mut two, &disk).unwrap(), None);

        let caps = json!({"cpus": 2, "memory_mb": 4000, "disk_gb": 10});
        let e = check_host(&p(json!({"cpus": 2})).unwrap(), "h1", &caps)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "resources.cpus 2 is more than host h1 allows: 1.5 (its 2 CPUs minus the 0.5 CPU the host keeps)"
        );
        let e = check_host(&p(json!({"memory": "4001m"})).unwrap(), "h1", &caps)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("resources.memory 4001 MiB is more than host h1 has: 4000 MiB"),
            "{e}"
        );
        let e = check_host(&p(json!({"disk": "11g"})).unwrap(), "h1", &caps)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("resources.disk 11264 MiB is more than host h1 has free"),
            "{e}"
        );
        check_host(
            &p(json!({"cpus": 1.5, "memory": "4000m", "disk": "10g"})).unwrap(),
            "h1",
            &caps,
        )
        .unwrap();
    }
}
