//! What the CLI prints: response messages as indented JSON, and the phase lines of a
//! followed deployment (spec pages `10-ref-cli.md` and `16-ref-deployments.md`).
//!
//! A followed deployment prints:
//!
//! ```text
//! deployment dep_01… (verify, env env_01…)
//!   stop         ok       {"agent_service":"box","mode":"pause"}
//!   collect      ok       {"bytes":3,"files":1,"missing":[],"refused":[]}
//!   …
//!   verdict      ok       {"agent_frozen":true,"reward":1,"source":"reward.txt",…,"refused":[]}
//!     reward: 1
//!     source: reward.txt
//!     agent_frozen: true
//! deployment dep_01…: succeeded
//! ```
//!
//! One line per phase when it reaches `ok`, `failed` or `skipped` (running phases are
//! not printed), with the phase's evidence as compact JSON (scalar fields first, cut at
//! [`EVIDENCE_MAX_CHARS`]) and its error. A verify's verdict adds one line per field the
//! quickstart reads: `reward`, `source`, `exit_code`, each `refused` and `missing` entry,
//! and `agent_frozen`.

use denv_client::v1;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Longest evidence printed on a phase line, in characters.
pub const EVIDENCE_MAX_CHARS: usize = 240;

/// Whole floating-point numbers as integers (protobuf `Value`s carry every number as a
/// double, so `took_ms` would otherwise print as `1234.0`).
pub fn normalize_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalize_numbers).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, normalize_numbers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The data sheet (`GET /v1/versions/{version}/sheet`'s `sheet`) as text: one section
/// per part (version, images, snapshot, datasets, egress, caps, clock, protections,
/// gates), one fact per line, each gate with its status and error.
pub fn sheet(v: &Value) -> String {
    let v = normalize_numbers(v.clone());
    let s = |x: &Value| match x {
        Value::Null => "-".to_string(),
        Value::String(t) if t.is_empty() => "-".to_string(),
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let mut line = |l: String| {
        out.push_str(&l);
        out.push('\n');
    };
    let ver = &v["version"];
    line(format!(
        "version     {} (#{} of {} in project {}), created {}",
        s(&ver["id"]),
        s(&ver["number"]),
        s(&ver["env_name"]),
        s(&ver["project"]),
        s(&ver["created_at"])
    ));
    line(format!(
        "snapshot    {} (healthy: {})",
        s(&ver["snapshot"]),
        s(&ver["healthy"])
    ));
    line("images".into());
    if let Some(images) = v["images"].as_object() {
        for (svc, i) in images {
            line(format!(
                "  {svc:<12} {}  id {}  digest {}",
                s(&i["image"]),
                s(&i["image_id"]),
                s(&i["digest"])
            ));
        }
    }
    let snap = &v["snapshot"];
    if !snap.is_null() {
        line(format!(
            "captured    by {} {} (frozen {} ms, consistent: {})",
            s(&snap["kind"]),
            s(&snap["deployment"]),
            s(&snap["frozen_for_ms"]),
            s(&snap["consistent"])
        ));
    }
    match v["datasets"].as_object() {
        Some(d) => {
            line("datasets    (checked by the newest promote's gate.consistency)".into());
            for (vol, x) in d {
                line(format!(
                    "  {vol:<12} {}  {} files, {} bytes",
                    s(&x["digest"]),
                    s(&x["files"]),
                    s(&x["bytes"])
                ));
            }
        }
        None => line("datasets    not checked yet (run denv promote)".into()),
    }
    let eg = &v["egress"];
    line(format!(
        "egress      {}: {} (proved by {})",
        s(&eg["policy"]),
        s(&eg["result"]),
        s(&eg["deployment"])
    ));
    line(format!("caps        disk {} MiB", s(&v["caps"]["disk_mb"])));
    if let Some(caps) = v["caps"]["services"].as_object() {
        for (svc, c) in caps {
            line(format!(
                "  {svc:<12} memory {} MiB, pids {}, cpus {}",
                s(&c["memory_mb"]),
                s(&c["pids"]),
                s(&c["cpus"])
            ));
        }
    }
    line(format!("clock       {}", s(&v["clock"])));
    let pr = &v["protections"];
    line(format!(
        "agent       {} (user {})",
        s(&pr["agent_service"]),
        s(&pr["agent_user"])
    ));
    let verifier = &pr["verifier"];
    if !verifier.is_null() {
        let by = if verifier["image"].is_null() {
            format!("service {}", s(&verifier["service"]))
        } else {
            format!("image {}", s(&verifier["image"]))
        };
        line(format!("verifier    {by}"));
    }
    let gates = &v["gates"];
    if gates.is_null() {
        line("gates       never promoted".into());
    } else {
        line(format!(
            "gates       {} {} to {}{}",
            s(&gates["deployment"]),
            s(&gates["status"]),
            s(&gates["target"]),
            match gates["error"].as_str() {
                Some(e) if !e.is_empty() => format!(": {e}"),
                _ => String::new(),
            }
        ));
        for p in gates["phases"].as_array().into_iter().flatten() {
            let err = match p["error"].as_str() {
                Some(e) if !e.is_empty() => format!("  {e}"),
                _ => String::new(),
            };
            line(format!("  {:<18} {}{err}", s(&p["name"]), s(&p["status"])));
        }
    }
    out
}

/// A message as the REST API's JSON, indented (the output of every JSON command).
pub fn pretty<T: Serialize>(msg: &T) -> String {
    let v = normalize_numbers(denv_proto::json::to_json(msg));
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// A value as one line of JSON, cut at `max` characters with `…`. The keys of a
/// top-level object come scalars first (then arrays and objects), each group sorted, so
/// the short facts survive the cut (`snapshot`, `frozen_for` before a long `datasets`).
pub fn compact(v: &Value, max: usize) -> String {
    let v = normalize_numbers(v.clone());
    let s = match &v {
        Value::Object(o) => {
            let mut keys: Vec<(&String, &Value)> = o.iter().collect();
            keys.sort_by_key(|(k, v)| (matches!(v, Value::Array(_) | Value::Object(_)), *k));
            let parts: Vec<String> = keys
                .into_iter()
                .map(|(k, v)| {
                    format!(
                        "{}:{}",
                        serde_json::to_string(k).unwrap_or_default(),
                        serde_json::to_string(v).unwrap_or_default()
                    )
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        other => serde_json::to_string(other).unwrap_or_default(),
    };
    if s.chars().count() <= max {
        s
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

fn evidence(p: &v1::Phase) -> Value {
    p.evidence
        .as_ref()
        .map(denv_proto::json::from_value)
        .map(normalize_numbers)
        .unwrap_or(Value::Null)
}

/// The first line printed for a deployment: `deployment <id> (<kind>, env <env>)`.
pub fn deployment_header(d: &v1::Deployment) -> String {
    let mut s = format!("deployment {}", d.id);
    let mut extra = vec![];
    if !d.kind.is_empty() {
        extra.push(d.kind.clone());
    }
    if !d.env_id.is_empty() {
        extra.push(format!("env {}", d.env_id));
    }
    if !extra.is_empty() {
        s.push_str(&format!(" ({})", extra.join(", ")));
    }
    s
}

/// The last line printed for a deployment: `deployment <id>: <status>`.
pub fn deployment_footer(d: &v1::Deployment) -> String {
    format!("deployment {}: {}", d.id, d.status)
}

/// A phase's line: `  <name>  <status>  <evidence>  error: <error>`.
pub fn phase_line(p: &v1::Phase) -> String {
    let mut rest = vec![];
    let ev = evidence(p);
    if !ev.is_null() {
        rest.push(compact(&ev, EVIDENCE_MAX_CHARS));
    }
    if !p.error.is_empty() {
        rest.push(format!("error: {}", p.error));
    }
    if rest.is_empty() {
        format!("  {:<12} {}", p.name, p.status)
    } else {
        format!("  {:<12} {:<8} {}", p.name, p.status, rest.join("  "))
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => compact(other, EVIDENCE_MAX_CHARS),
    }
}

/// One refused/missing entry: a string as is, `{path, reason}` as `path: reason`.
fn entry(v: &Value) -> String {
    match v {
        Value::Object(o) => match (o.get("path"), o.get("reason")) {
            (Some(p), Some(r)) => format!("{}: {}", scalar(p), scalar(r)),
            _ => scalar(v),
        },
        other => scalar(other),
    }
}

/// The extra lines of a verify's `verdict` phase (empty for any other phase):
/// `reward: 1`, `source: reward.txt`, `refused: home/agent/answer.txt: symlink`, ...
pub fn verdict_lines(p: &v1::Phase) -> Vec<String> {
    if p.name != "verdict" {
        return vec![];
    }
    let ev = evidence(p);
    let Some(o) = ev.as_object() else {
        return vec![];
    };
    if !o.contains_key("reward") {
        return vec![];
    }
    let mut out = vec![format!("    reward: {}", scalar(&o["reward"]))];
    for k in ["source", "exit_code"] {
        if let Some(v) = o.get(k).filter(|v| !v.is_null()) {
            out.push(format!("    {k}: {}", scalar(v)));
        }
    }
    for k in ["refused", "missing"] {
        match o.get(k) {
            Some(Value::Array(a)) => {
                out.extend(a.iter().map(|e| format!("    {k}: {}", entry(e))));
            }
            Some(Value::Object(m)) => {
                // A map path -> reason.
                out.extend(
                    m.iter()
                        .map(|(p, r)| format!("    {k}: {p}: {}", scalar(r))),
                );
            }
            Some(v @ Value::String(_)) => out.push(format!("    {k}: {}", scalar(v))),
            _ => {}
        }
    }
    if let Some(v) = o.get("agent_frozen").filter(|v| !v.is_null()) {
        out.push(format!("    agent_frozen: {}", scalar(v)));
    }
    out
}

/// Turns successive deployment states into the lines to print, each phase once when it
/// reaches a final phase status (`ok`, `failed`, `skipped`).
#[derive(Debug, Default)]
pub struct PhasePrinter {
    printed: BTreeMap<i32, String>,
}

impl PhasePrinter {
    /// A printer that has printed nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The new lines for this state of the deployment, in phase order.
    pub fn update(&mut self, d: &v1::DeploymentResponse) -> Vec<String> {
        let mut phases: Vec<&v1::Phase> = d.phases.iter().collect();
        phases.sort_by_key(|p| p.seq);
        let mut out = vec![];
        for p in phases {
            if !matches!(p.status.as_str(), "ok" | "failed" | "skipped") {
                continue;
            }
            if self.printed.get(&p.seq) == Some(&p.status) {
                continue;
            }
            self.printed.insert(p.seq, p.status.clone());
            out.push(phase_line(p));
            out.extend(verdict_lines(p));
        }
        out
    }
}

/// Whether a finished deployment makes the command exit 1: `failed`, and `rolled_back`
/// too (the requested change did not land, even though the environment was restored).
pub fn is_failure(status: &str) -> bool {
    matches!(status, "failed" | "rolled_back")
}

/// The `denv env list` table: a header and one row per environment, columns `ID`,
/// `NAME`, `PROJECT`, `STATUS`, `VERSION` (the current version id, `-` when none),
/// separated by two spaces and padded to the widest cell.
pub fn env_table(envs: &[v1::EnvEntry]) -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut rows = vec![["ID", "NAME", "PROJECT", "STATUS", "VERSION"].map(String::from)];
    for e in envs {
        rows.push([
            e.id.clone(),
            dash(&e.name),
            dash(&e.project),
            e.status.clone(),
            dash(&e.current_version_id),
        ]);
    }
    let mut width = [0usize; 5];
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One line of `denv logs`, with its newline. `prefix: None` (one service): the line as
/// written (after the timestamp when present). `Some(width)`: `service | line` with the
/// name padded to `width`, and every control character of the line but tab shown as
/// `\xNN` (a carriage return or escape sequence cannot move back over the prefix,
/// which the control plane set from the command the line came from).
pub fn log_line(e: &v1::LogEntry, prefix: Option<usize>) -> String {
    let mut out = String::new();
    let body = match prefix {
        None => e.line.clone(),
        Some(w) => {
            out.push_str(&format!("{:<w$} | ", e.service));
            e.line
                .chars()
                .map(|c| {
                    if (c.is_control() && c != '\t') || c == '\u{7f}' {
                        format!("\\x{:02x}", c as u32)
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        }
    };
    if !e.timestamp.is_empty() {
        out.push_str(&e.timestamp);
        out.push(' ');
    }
    out.push_str(&body);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn phase(seq: i32, name: &str, status: &str, ev: Value, err: &str) -> v1::Phase {
        v1::Phase {
            deployment_id: "dep_1".into(),
            seq,
            name: name.into(),
            status: status.into(),
            evidence: Some(denv_proto::json::to_value(&ev)),
            error: err.into(),
            ..Default::default()
        }
    }

    #[test]
    fn phase_line_has_name_status_and_compact_evidence() {
        let p = phase(
            1,
            "resolve",
            "ok",
            json!({"version": "ver_1", "number": 3.0, "services": ["db", "box"]}),
            "",
        );
        assert_eq!(
            phase_line(&p),
            r#"  resolve      ok       {"number":3,"version":"ver_1","services":["db","box"]}"#
        );
        let p = phase(
            9,
            "snapshot",
            "ok",
            json!({"datasets": ["/d/".repeat(100)], "snapshot": "ver_2", "frozen_for": 317.0,
                   "consistent": true}),
            "",
        );
        assert!(
            phase_line(&p).starts_with(
                r#"  snapshot     ok       {"consistent":true,"frozen_for":317,"snapshot":"ver_2","datasets":["/d/"#
            ),
            "{}",
            phase_line(&p)
        );
        let p = phase(
            5,
            "prepare",
            "failed",
            Value::Null,
            "host refused: no such image",
        );
        assert_eq!(
            phase_line(&p),
            "  prepare      failed   error: host refused: no such image"
        );
        let p = phase(6, "start", "skipped", Value::Null, "");
        assert_eq!(phase_line(&p), "  start        skipped");
    }

    #[test]
    fn long_evidence_is_cut() {
        let p = phase(5, "grade", "ok", json!({"stdout": "x".repeat(1000)}), "");
        let l = phase_line(&p);
        assert!(l.ends_with('…'));
        assert_eq!(
            l.chars().count(),
            2 + 12 + 1 + 8 + 1 + EVIDENCE_MAX_CHARS + 1
        );
    }

    #[test]
    fn verify_verdict_prints_reward_and_source() {
        let p = phase(
            6,
            "verdict",
            "ok",
            json!({"reward": 1.0, "source": "reward.txt", "exit_code": 0.0, "refused": [],
                   "missing": [], "agent_frozen": true, "took_ms": 2051.0}),
            "",
        );
        assert_eq!(
            verdict_lines(&p),
            vec![
                "    reward: 1",
                "    source: reward.txt",
                "    exit_code: 0",
                "    agent_frozen: true"
            ]
        );
    }

    #[test]
    fn refused_verdict_prints_the_reason() {
        for refused in [
            json!(["home/agent/answer.txt: symlink"]),
            json!([{"path": "home/agent/answer.txt", "reason": "symlink"}]),
            json!({"home/agent/answer.txt": "symlink"}),
        ] {
            let p = phase(
                6,
                "verdict",
                "ok",
                json!({"reward": 0.0, "source": "refused", "refused": refused,
                       "missing": ["/home/agent/out"], "agent_frozen": false}),
                "",
            );
            assert_eq!(
                verdict_lines(&p),
                vec![
                    "    reward: 0",
                    "    source: refused",
                    "    refused: home/agent/answer.txt: symlink",
                    "    missing: /home/agent/out",
                    "    agent_frozen: false"
                ]
            );
        }
        // A failed verify has a null reward.
        let p = phase(
            6,
            "verdict",
            "failed",
            json!({"reward": null}),
            "grade: timeout",
        );
        assert_eq!(verdict_lines(&p), vec!["    reward: null"]);
    }

    #[test]
    fn other_verdicts_add_nothing() {
        let p = phase(
            11,
            "verdict",
            "ok",
            json!({"version": "ver_1", "took_ms": 5.0}),
            "",
        );
        assert!(verdict_lines(&p).is_empty());
        let p = phase(2, "collect", "ok", json!({"reward": 1}), "");
        assert!(verdict_lines(&p).is_empty());
    }

    #[test]
    fn printer_prints_each_phase_once_when_it_finishes() {
        let mk = |ph: Vec<v1::Phase>| v1::DeploymentResponse {
            deployment: None,
            phases: ph,
        };
        let mut pr = PhasePrinter::new();
        let s1 = mk(vec![
            phase(1, "snapshot", "running", Value::Null, ""),
            phase(2, "health", "pending", Value::Null, ""),
        ]);
        assert!(pr.update(&s1).is_empty());
        let s2 = mk(vec![
            phase(2, "health", "running", Value::Null, ""),
            phase(1, "snapshot", "ok", json!({"snapshot": "ver_2"}), ""),
        ]);
        assert_eq!(
            pr.update(&s2),
            vec![r#"  snapshot     ok       {"snapshot":"ver_2"}"#]
        );
        assert!(pr.update(&s2).is_empty());
        let s3 = mk(vec![
            phase(1, "snapshot", "ok", json!({"snapshot": "ver_2"}), ""),
            phase(2, "health", "ok", json!({"answered": true}), ""),
            phase(
                3,
                "verdict",
                "ok",
                json!({"reward": 1.0, "source": "stdout"}),
                "",
            ),
        ]);
        assert_eq!(
            pr.update(&s3),
            vec![
                r#"  health       ok       {"answered":true}"#.to_string(),
                r#"  verdict      ok       {"reward":1,"source":"stdout"}"#.to_string(),
                "    reward: 1".to_string(),
                "    source: stdout".to_string(),
            ]
        );
    }

    #[test]
    fn header_footer_and_failure_rule() {
        let d = v1::Deployment {
            id: "dep_9".into(),
            kind: "fork".into(),
            env_id: "env_2".into(),
            status: "rolled_back".into(),
            ..Default::default()
        };
        assert_eq!(deployment_header(&d), "deployment dep_9 (fork, env env_2)");
        assert_eq!(deployment_footer(&d), "deployment dep_9: rolled_back");
        assert!(is_failure("failed"));
        assert!(is_failure("rolled_back"));
        assert!(!is_failure("succeeded"));
    }

    #[test]
    fn pretty_uses_go_field_names_and_integral_numbers() {
        let r = v1::ListEnvsResponse {
            environments: vec![v1::Environment {
                id: "env_1".into(),
                name: "alpha".into(),
                ..Default::default()
            }],
        };
        let v: Value = serde_json::from_str(&pretty(&r)).unwrap();
        assert_eq!(v["environments"][0]["ID"], "env_1");
        assert_eq!(v["environments"][0]["Name"], "alpha");
        assert!(pretty(&r).contains("\n  \"environments\": ["));
        assert_eq!(
            normalize_numbers(json!({"a": 1.0, "b": 1.5, "c": [2.0], "d": 7})),
            json!({"a": 1, "b": 1.5, "c": [2], "d": 7})
        );
    }
}
