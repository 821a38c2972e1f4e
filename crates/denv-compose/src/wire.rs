//! [`Spec`](crate::Spec) and its parts ⇄ the host-stream wire messages of `denv-proto`
//! (`proto/denv/v1/host.proto`; spec page `15-ref-protocol.md`, `env.create`,
//! `env.fork`, `verify.run`).
//!
//! Here rather than in `denv-proto`, so the generated code depends on no crate of this
//! workspace (and a client of the API does not pull in the compose parser through it).
//! The conversions are `From` impls plus the helpers below.

use crate as compose;
use denv_proto::v1;

impl From<&compose::Service> for v1::ServiceSpec {
    fn from(s: &compose::Service) -> Self {
        v1::ServiceSpec {
            name: s.name.clone(),
            image: s.image.clone(),
            env: s.env.clone().into_iter().collect(),
            ports: s.ports.iter().map(|p| u32::from(*p)).collect(),
            volumes: s
                .volumes
                .iter()
                .map(|v| v1::VolumeMountSpec {
                    name: v.name.clone(),
                    path: v.path.clone(),
                    read_only: v.read_only,
                })
                .collect(),
            health: s.health.as_ref().map(|h| v1::HealthSpec {
                test: h.test.clone(),
                interval_ms: h.interval_ms,
                retries: h.retries,
            }),
            depends_on: s.depends_on.clone(),
            depends_on_condition: s.depends_on_condition.clone().into_iter().collect(),
            command: s.command.clone(),
            user: s.user.clone(),
            resources: Some(v1::ResourcesSpec {
                memory_mb: s.resources.memory_mb,
                pids: s.resources.pids,
                cpus: s.resources.cpus,
            }),
            cap_add: s.cap_add.clone(),
            image_id: s.image_id.clone(),
        }
    }
}

impl From<&v1::ServiceSpec> for compose::Service {
    /// Zero caps become the sidecar defaults (4096 MiB, 2048 pids, 2.0 CPUs).
    fn from(s: &v1::ServiceSpec) -> Self {
        let r = s.resources.unwrap_or_default();
        let d = compose::Resources::default();
        compose::Service {
            name: s.name.clone(),
            image: s.image.clone(),
            env: s.env.clone().into_iter().collect(),
            ports: s
                .ports
                .iter()
                .filter_map(|p| u16::try_from(*p).ok())
                .collect(),
            volumes: s
                .volumes
                .iter()
                .map(|v| compose::VolumeMount {
                    name: v.name.clone(),
                    path: v.path.clone(),
                    read_only: v.read_only,
                })
                .collect(),
            health: s.health.as_ref().map(|h| compose::Health {
                test: h.test.clone(),
                interval_ms: h.interval_ms,
                retries: h.retries,
            }),
            depends_on: s.depends_on.clone(),
            depends_on_condition: s.depends_on_condition.clone().into_iter().collect(),
            command: s.command.clone(),
            user: s.user.clone(),
            resources: compose::Resources {
                memory_mb: if r.memory_mb == 0 {
                    d.memory_mb
                } else {
                    r.memory_mb
                },
                pids: if r.pids == 0 { d.pids } else { r.pids },
                cpus: if r.cpus == 0.0 { d.cpus } else { r.cpus },
            },
            cap_add: s.cap_add.clone(),
            image_id: s.image_id.clone(),
        }
    }
}

impl From<&compose::Verifier> for v1::VerifierSpec {
    fn from(v: &compose::Verifier) -> Self {
        v1::VerifierSpec {
            image: v.image.clone().unwrap_or_default(),
            service: v.service.clone().unwrap_or_default(),
            command: v.command.clone(),
            collect: v.collect.clone(),
            timeout_sec: u32::try_from(v.timeout_sec).unwrap_or(u32::MAX),
            image_id: v.image_id.clone(),
        }
    }
}

impl From<&v1::VerifierSpec> for compose::Verifier {
    /// A zero timeout becomes the default 600 s.
    fn from(v: &v1::VerifierSpec) -> Self {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        compose::Verifier {
            image: opt(&v.image),
            service: opt(&v.service),
            command: v.command.clone(),
            collect: v.collect.clone(),
            timeout_sec: if v.timeout_sec == 0 {
                denv_proto::contract::VERIFIER_TIMEOUT_SEC
            } else {
                u64::from(v.timeout_sec)
            },
            image_id: v.image_id.clone(),
        }
    }
}

/// The egress wire string ("deny" | "allow"; anything else is deny).
pub fn egress_from_wire(s: &str) -> compose::Egress {
    if s == "allow" {
        compose::Egress::Allow
    } else {
        compose::Egress::Deny
    }
}

/// The `env.create` payload for a spec.
pub fn env_create(version: &str, spec: &compose::Spec) -> v1::EnvCreate {
    v1::EnvCreate {
        version: version.to_string(),
        services: spec.services.iter().map(Into::into).collect(),
        volumes: spec.volumes.clone(),
        from_snapshot: String::new(),
        warm: spec.warm.clone(),
        egress: spec.egress.as_str().to_string(),
        agent_service: agent_service(spec),
        disk_mb: spec.disk_mb,
        expires_at: String::new(),
        verifier_image: spec
            .verifier
            .as_ref()
            .and_then(|v| v.image.clone())
            .unwrap_or_default(),
        clock: clock_wire(spec),
    }
}

/// `x-denv.clock` as sent on the wire: `"frozen"`, `"real"`, or `""` when unset.
pub fn clock_wire(spec: &compose::Spec) -> String {
    spec.clock
        .map(|c| c.as_str().to_string())
        .unwrap_or_default()
}

/// The wire's clock string back: `"frozen"` and `"real"`, anything else unset (the real
/// clock).
pub fn clock_from_wire(s: &str) -> Option<compose::Clock> {
    match s {
        "frozen" => Some(compose::Clock::Frozen),
        "real" => Some(compose::Clock::Real),
        _ => None,
    }
}

/// `x-denv.agent.service`, `""` when the spec has no agent (the wire spelling).
pub fn agent_service(spec: &compose::Spec) -> String {
    spec.agent
        .as_ref()
        .map(|a| a.service.clone())
        .unwrap_or_default()
}

/// The runnable part of a spec (services, volumes, egress, the agent service and the
/// disk quota in MiB, 0 = default) from an `env.create` or `env.fork` payload, as the
/// sidecar needs it. An empty `agent_service` means no agent.
pub fn spec_from_wire(
    services: &[v1::ServiceSpec],
    volumes: &[String],
    egress: &str,
    agent_service: &str,
    disk_mb: u64,
) -> compose::Spec {
    compose::Spec {
        services: services.iter().map(Into::into).collect(),
        volumes: volumes.to_vec(),
        egress: egress_from_wire(egress),
        agent: (!agent_service.is_empty()).then(|| compose::Agent {
            service: agent_service.to_string(),
        }),
        disk_mb,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_round_trips() {
        let s = compose::Service {
            name: "db".into(),
            image: "postgres:16-alpine".into(),
            env: [("A".to_string(), "1".to_string())].into_iter().collect(),
            ports: vec![5432],
            volumes: vec![compose::VolumeMount {
                name: "pg".into(),
                path: "/var/lib/postgresql/data".into(),
                read_only: false,
            }],
            health: Some(compose::Health {
                test: vec!["CMD-SHELL".into(), "pg_isready".into()],
                interval_ms: 2000,
                retries: 30,
            }),
            depends_on: vec!["cache".into(), "migrate".into()],
            depends_on_condition: [(
                "migrate".to_string(),
                compose::SERVICE_COMPLETED_SUCCESSFULLY.to_string(),
            )]
            .into(),
            command: vec![],
            user: "1000:1000".into(),
            resources: compose::Resources {
                memory_mb: 512,
                pids: 100,
                cpus: 1.5,
            },
            cap_add: vec!["CHOWN".into()],
            image_id: format!("sha256:{}", "ab".repeat(32)),
        };
        let wire = v1::ServiceSpec::from(&s);
        assert_eq!(compose::Service::from(&wire), s);
    }

    #[test]
    fn clock_round_trips() {
        for c in [
            None,
            Some(compose::Clock::Frozen),
            Some(compose::Clock::Real),
        ] {
            let spec = compose::Spec {
                clock: c,
                ..Default::default()
            };
            assert_eq!(clock_from_wire(&clock_wire(&spec)), c);
            assert_eq!(env_create("ver_1", &spec).clock, clock_wire(&spec));
        }
        assert_eq!(clock_from_wire("paused"), None);
    }

    #[test]
    fn zero_caps_become_defaults() {
        let wire = v1::ServiceSpec {
            name: "x".into(),
            image: "busybox:1.36".into(),
            ..Default::default()
        };
        let s = compose::Service::from(&wire);
        assert_eq!(s.resources, compose::Resources::default());
    }
}
