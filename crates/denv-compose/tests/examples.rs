//! The spec's examples (copied from `/work/shared/spec/examples/` into `tests/fixtures/`)
//! parse into exactly the expected specs, and every spec round-trips through JSON.

use std::collections::BTreeMap;

use denv_compose::{
    parse, Agent, Clock, Egress, Health, Resources, Service, Spec, Verifier, VolumeMount,
};

const QUICKSTART: &str = include_str!("fixtures/quickstart.compose.yaml");
const REFERENCE: &str = include_str!("fixtures/compose-reference.example.yaml");
const CREATING: &str = include_str!("fixtures/creating-an-environment.compose.yaml");
const KAROTTE: &str = include_str!("fixtures/karotte.compose.yaml");
const VERIFY_HOWTO: &str = include_str!("fixtures/verify-howto.x-denv.yaml");
const X_DENV_REFERENCE: &str = include_str!("fixtures/x-denv-reference.block.yaml");

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        path: path.into(),
        read_only: false,
    }
}

fn health(test: &[&str], interval_ms: u64, retries: u32) -> Option<Health> {
    Some(Health {
        test: s(test),
        interval_ms,
        retries,
    })
}

fn caps(memory_mb: u64, pids: i64) -> Resources {
    Resources {
        memory_mb,
        pids,
        cpus: 2.0,
    }
}

fn parsed(text: &str) -> Spec {
    parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn postgres(env_pairs: &[(&str, &str)]) -> Service {
    Service {
        name: "db".into(),
        image: "postgres:16-alpine".into(),
        env: env(env_pairs),
        volumes: vec![mount("pg", "/var/lib/postgresql/data")],
        health: health(&["CMD-SHELL", "pg_isready -U postgres"], 2000, 30),
        ..Service::default()
    }
}

#[test]
fn quickstart() {
    let expected = Spec {
        services: vec![
            Service {
                name: "box".into(),
                image: "python:3.12-slim".into(),
                env: env(&[
                    ("HOME", "/home/agent"),
                    ("PGHOST", "db"),
                    ("PGPASSWORD", "world"),
                ]),
                volumes: vec![mount("home", "/home/agent")],
                depends_on: s(&["db"]),
                command: s(&["sleep", "infinity"]),
                user: "1000:1000".into(),
                ..Service::default()
            },
            postgres(&[("POSTGRES_PASSWORD", "world")]),
        ],
        volumes: s(&["home", "pg"]),
        egress: Egress::Deny,
        kind: "rl-environment".into(),
        warm: vec![],
        agent: Some(Agent {
            service: "box".into(),
        }),
        verifier: Some(Verifier {
            image: Some("busybox:1.36".into()),
            service: None,
            command: s(&[
                "sh",
                "-c",
                "[ \"$(cat /submission/home/agent/answer.txt)\" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt",
            ]),
            collect: s(&["/home/agent/answer.txt"]),
            timeout_sec: 600,
            image_id: String::new(),
        }),
        clock: None,
        world_instant_ms: 0,
        disk_mb: 0,
        builds: Default::default(),
        pool: 0,
        promote: None,
    };
    let spec = parsed(QUICKSTART);
    assert_eq!(spec, expected);
    assert_eq!(spec.first_service().map(|s| s.name.as_str()), Some("box"));
    assert_eq!(spec.services[0].resources, caps(4096, 2048));
}

#[test]
fn compose_reference_example() {
    let expected = Spec {
        services: vec![
            Service {
                name: "db".into(),
                image: "redis:7-alpine".into(),
                volumes: vec![mount("rd", "/data")],
                health: health(&["CMD", "redis-cli", "ping"], 2000, 15),
                ..Service::default()
            },
            Service {
                name: "opsbox".into(),
                image: "python:3.12-slim".into(),
                env: env(&[("HOME", "/home/agent")]),
                volumes: vec![mount("home", "/home/agent")],
                command: s(&["sleep", "infinity"]),
                user: "1000:1000".into(),
                resources: caps(2048, 512),
                ..Service::default()
            },
        ],
        volumes: s(&["home", "rd"]),
        egress: Egress::Deny,
        kind: "rl-environment".into(),
        warm: vec![],
        agent: Some(Agent {
            service: "opsbox".into(),
        }),
        verifier: Some(Verifier {
            image: Some("busybox:1.36".into()),
            service: None,
            command: s(&[
                "sh",
                "-c",
                "mkdir -p /logs/verifier; [ \"$(cat /submission/home/agent/answer.txt)\" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt",
            ]),
            collect: s(&["/home/agent/answer.txt"]),
            timeout_sec: 600,
            image_id: String::new(),
        }),
        clock: None,
        world_instant_ms: 0,
        disk_mb: 0,
        builds: Default::default(),
        pool: 0,
        promote: None,
    };
    assert_eq!(parsed(REFERENCE), expected);
}

#[test]
fn creating_an_environment_blog() {
    let expected = Spec {
        services: vec![
            postgres(&[("POSTGRES_PASSWORD", "world")]),
            Service {
                name: "opsbox".into(),
                image: "ubuntu:24.04".into(),
                env: env(&[
                    ("HOME", "/home/ubuntu"),
                    ("PGHOST", "db"),
                    ("PGPASSWORD", "world"),
                ]),
                volumes: vec![mount("home", "/home/ubuntu")],
                depends_on: s(&["db", "queue"]),
                command: s(&["sleep", "infinity"]),
                user: "1000:1000".into(),
                resources: caps(2048, 512),
                ..Service::default()
            },
            Service {
                name: "queue".into(),
                image: "redis:7-alpine".into(),
                volumes: vec![mount("redis", "/data")],
                health: health(&["CMD", "redis-cli", "ping"], 2000, 15),
                command: s(&["redis-server", "--appendonly", "yes"]),
                ..Service::default()
            },
        ],
        volumes: s(&["home", "pg", "redis"]),
        egress: Egress::Deny,
        kind: "rl-environment".into(),
        // A list item is one argv element, exactly as written.
        warm: s(&["psql -h db -U postgres -f /seed/orders.sql"]),
        agent: Some(Agent {
            service: "opsbox".into(),
        }),
        verifier: Some(Verifier {
            image: Some("ghcr.io/you/verifier:1.2".into()),
            service: None,
            command: s(&["/verify.sh"]),
            collect: s(&["/home/ubuntu/answer.txt"]),
            timeout_sec: 600,
            image_id: String::new(),
        }),
        clock: Some(Clock::Frozen),
        world_instant_ms: 0,
        disk_mb: 0,
        builds: Default::default(),
        pool: 0,
        promote: None,
    };
    assert_eq!(parsed(CREATING), expected);
}

#[test]
fn karotte_blog() {
    let expected = Spec {
        services: vec![
            postgres(&[]),
            Service {
                name: "karotte".into(),
                image: "ghcr.io/you/karotte-ops-env:3".into(),
                volumes: vec![mount("student", "/home/student")],
                command: s(&["sleep", "infinity"]),
                user: "1000:1000".into(),
                resources: caps(4096, 1024),
                ..Service::default()
            },
        ],
        volumes: s(&["pg", "student"]),
        egress: Egress::Deny,
        kind: "rl-environment".into(),
        warm: vec![],
        agent: Some(Agent {
            service: "karotte".into(),
        }),
        verifier: Some(Verifier {
            image: None,
            service: Some("karotte".into()),
            command: s(&["karotte", "judge", "--step", "fix_backup"]),
            collect: s(&["/home/student/submission"]),
            timeout_sec: 600,
            image_id: String::new(),
        }),
        clock: None,
        world_instant_ms: 0,
        disk_mb: 0,
        builds: Default::default(),
        pool: 0,
        promote: None,
    };
    assert_eq!(parsed(KAROTTE), expected);
}

#[test]
fn x_denv_blocks_alone_have_no_services() {
    assert_eq!(
        parse(VERIFY_HOWTO).map_err(|e| e.to_string()),
        Err("compose: no services".to_string())
    );
    assert_eq!(
        parse(X_DENV_REFERENCE).map_err(|e| e.to_string()),
        Err("compose: no services".to_string())
    );
}

#[test]
fn verify_howto_block_with_a_service() {
    let text = format!(
        "{VERIFY_HOWTO}services:\n  box: {{image: python:3.12-slim, user: \"1000:1000\"}}\n"
    );
    let spec = parsed(&text);
    assert_eq!(
        spec.verifier,
        Some(Verifier {
            image: Some("ghcr.io/you/grader:1.2".into()),
            service: None,
            command: s(&["/grade.sh"]),
            collect: s(&["/home/agent/answer.txt", "/home/agent/out"]),
            timeout_sec: 300,
            image_id: String::new(),
        })
    );
    assert_eq!(spec.agent.map(|a| a.service).as_deref(), Some("box"));
}

#[test]
fn x_denv_reference_block_with_a_service() {
    let text = format!(
        "{X_DENV_REFERENCE}services:\n  opsbox: {{image: ubuntu:24.04, user: \"1000:1000\"}}\n"
    );
    let spec = parsed(&text);
    assert_eq!(spec.warm, s(&["psql", "-f", "/seed/orders.sql"]));
    assert_eq!(spec.egress, Egress::Deny);
    assert_eq!(spec.kind, "rl-environment");
    let v = spec.verifier.expect("verifier");
    assert_eq!(v.image.as_deref(), Some("ghcr.io/you/grader:1"));
    assert_eq!(v.timeout_sec, 600);
}

#[test]
fn x_denv_reference_block_with_a_root_agent_is_refused() {
    let text = format!("{X_DENV_REFERENCE}services:\n  opsbox: {{image: ubuntu:24.04}}\n");
    assert_eq!(
        parse(&text).map_err(|e| e.to_string()),
        Err("compose: x-denv.agent.service \"opsbox\" must set a non-root user (user: \"1000:1000\"); the agent is never root".to_string())
    );
}

#[test]
fn specs_round_trip_through_json() {
    for text in [QUICKSTART, REFERENCE, CREATING, KAROTTE] {
        let spec = parsed(text);
        let json = serde_json::to_string(&spec).expect("serialise");
        let back: Spec = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(back, spec);
    }
}

#[test]
fn json_shape_is_the_contract() {
    let spec = parsed(KAROTTE);
    let json = serde_json::to_value(&spec).expect("serialise");
    assert_eq!(json["egress"], "deny");
    assert_eq!(json["kind"], "rl-environment");
    assert_eq!(json["clock"], serde_json::Value::Null);
    assert_eq!(json["agent"]["service"], "karotte");
    assert_eq!(json["verifier"]["service"], "karotte");
    assert_eq!(json["verifier"]["image"], serde_json::Value::Null);
    assert_eq!(json["verifier"]["timeout_sec"], 600);
    assert_eq!(json["volumes"], serde_json::json!(["pg", "student"]));
    let db = &json["services"][0];
    assert_eq!(db["name"], "db");
    assert_eq!(
        db["health"]["test"],
        serde_json::json!(["CMD-SHELL", "pg_isready -U postgres"])
    );
    assert_eq!(db["health"]["interval_ms"], 2000);
    assert_eq!(
        db["resources"],
        serde_json::json!({"memory_mb": 4096, "pids": 2048, "cpus": 2.0})
    );
    assert_eq!(
        json["services"][1]["volumes"][0],
        serde_json::json!({"name": "student", "path": "/home/student", "read_only": false})
    );
    let frozen = serde_json::to_value(parsed(CREATING)).expect("serialise");
    assert_eq!(frozen["clock"], "frozen");
}

#[test]
fn minimal_json_fills_defaults() {
    // Fields marked `serde(default)` may be absent in stored JSON.
    let spec: Spec = serde_json::from_str(
        r#"{"services":[{"name":"a","image":"x"}],"volumes":[],"egress":"allow"}"#,
    )
    .expect("deserialise");
    assert_eq!(spec.egress, Egress::Allow);
    assert_eq!(spec.services[0].resources, caps(4096, 2048));
    assert_eq!(spec.agent, None);
}
