//! The human-readable compose file kept at `<data>/envs/<env>/compose.yaml`: equivalent
//! to what the runtime runs (spec `13-ref-compose.md`, "The sidecar renders a new compose
//! file from that spec"). It is never executed; it documents the caps
//! (`mem_limit`, `pids_limit`, `cpus` on every service), the containment
//! (`security_opt: [no-new-privileges:true, seccomp=seccomp.json]` with the profile
//! written beside it, `cap_drop: [ALL]`, the kept `cap_add`,
//! the capped `json-file` logging, `ulimits.nofile`), the network (its bridge name
//! and `denv.egress` label; the policy itself is denvd's nftables table `inet denv_<owner>`,
//! which compose cannot express, and under deny every service's DNS server is the
//! network's gateway) and the volumes (local volumes bound to the dataset directories,
//! which keeps Docker's copy-up semantics).

use denv_compose::{Egress, Spec};
use serde_yaml::{Mapping, Value};
use std::path::Path;

/// The seccomp profile's file next to `compose.yaml` (what the runtime passes inline).
pub const SECCOMP_FILE: &str = "seccomp.json";

fn s(v: impl Into<String>) -> Value {
    Value::String(v.into())
}

/// Renders `spec` for environment `env_id` whose volumes live at
/// `volume_path(name)`. `cpus` are the effective values (clamped to the host).
pub fn render_compose(
    env_id: &str,
    spec: &Spec,
    volume_path: &dyn Fn(&str) -> std::path::PathBuf,
    host_cpus: f64,
) -> String {
    let lc = super::project(env_id);
    let mut services = Mapping::new();
    for svc in &spec.services {
        let (mem, pids, cpus) = super::stack::caps(&svc.resources, host_cpus);
        let mut m = Mapping::new();
        m.insert(s("image"), s(super::stack::run_image(svc).to_string()));
        m.insert(
            s("container_name"),
            s(super::container_name(env_id, &svc.name)),
        );
        if !svc.command.is_empty() {
            m.insert(
                s("command"),
                Value::Sequence(svc.command.iter().map(|c| s(c.clone())).collect()),
            );
        }
        if !svc.user.is_empty() {
            m.insert(s("user"), s(svc.user.clone()));
        }
        if !svc.env.is_empty() {
            let mut e = Mapping::new();
            for (k, v) in &svc.env {
                e.insert(s(k.clone()), s(v.clone()));
            }
            m.insert(s("environment"), Value::Mapping(e));
        }
        if !svc.ports.is_empty() {
            m.insert(
                s("ports"),
                Value::Sequence(
                    svc.ports
                        .iter()
                        .map(|p| s(format!("127.0.0.1::{p}")))
                        .collect(),
                ),
            );
        }
        if !svc.volumes.is_empty() {
            m.insert(
                s("volumes"),
                Value::Sequence(
                    svc.volumes
                        .iter()
                        .map(|v| {
                            s(format!(
                                "{}:{}{}",
                                v.name,
                                v.path,
                                if v.read_only { ":ro" } else { "" }
                            ))
                        })
                        .collect(),
                ),
            );
        }
        if let Some(h) = &svc.health {
            let mut hm = Mapping::new();
            hm.insert(
                s("test"),
                Value::Sequence(h.test.iter().map(|t| s(t.clone())).collect()),
            );
            hm.insert(s("interval"), s(format!("{}ms", h.interval_ms)));
            hm.insert(s("retries"), Value::Number(h.retries.into()));
            m.insert(s("healthcheck"), Value::Mapping(hm));
        }
        if !svc.depends_on.is_empty() && svc.depends_on_condition.is_empty() {
            m.insert(
                s("depends_on"),
                Value::Sequence(svc.depends_on.iter().map(|d| s(d.clone())).collect()),
            );
        } else if !svc.depends_on.is_empty() {
            let mut deps = Mapping::new();
            for d in &svc.depends_on {
                let cond = svc
                    .depends_on_condition
                    .get(d)
                    .map(String::as_str)
                    .unwrap_or(denv_compose::SERVICE_STARTED);
                let mut c = Mapping::new();
                c.insert(s("condition"), s(cond));
                deps.insert(s(d.clone()), Value::Mapping(c));
            }
            m.insert(s("depends_on"), Value::Mapping(deps));
        }
        m.insert(s("mem_limit"), s(format!("{}m", mem >> 20)));
        m.insert(s("memswap_limit"), s(format!("{}m", mem >> 20)));
        m.insert(s("pids_limit"), Value::Number(pids.into()));
        m.insert(s("cpus"), s(format!("{cpus}")));
        // Containment (runtime/contain.rs), as the runtime sets it.
        let is_agent = spec.agent.as_ref().is_some_and(|a| a.service == svc.name);
        let keep = super::contain::kept_caps(if is_agent {
            super::contain::Privilege::None
        } else {
            super::contain::Privilege::Service(&svc.cap_add)
        });
        m.insert(
            s("security_opt"),
            Value::Sequence(vec![
                s("no-new-privileges:true"),
                s(format!("seccomp={SECCOMP_FILE}")),
            ]),
        );
        m.insert(s("cap_drop"), Value::Sequence(vec![s("ALL")]));
        if !keep.is_empty() {
            m.insert(
                s("cap_add"),
                Value::Sequence(keep.into_iter().map(s).collect()),
            );
        }
        let mut lopts = Mapping::new();
        lopts.insert(
            s("max-size"),
            s(super::contain::LOG_MAX_SIZE_BYTES.to_string()),
        );
        lopts.insert(s("max-file"), s(super::contain::LOG_MAX_FILES.to_string()));
        let mut logging = Mapping::new();
        logging.insert(s("driver"), s("json-file"));
        logging.insert(s("options"), Value::Mapping(lopts));
        m.insert(s("logging"), Value::Mapping(logging));
        let mut nofile = Mapping::new();
        nofile.insert(
            s("soft"),
            Value::Number(super::contain::NOFILE_LIMIT.into()),
        );
        nofile.insert(
            s("hard"),
            Value::Number(super::contain::NOFILE_LIMIT.into()),
        );
        let mut ulimits = Mapping::new();
        ulimits.insert(s("nofile"), Value::Mapping(nofile));
        m.insert(s("ulimits"), Value::Mapping(ulimits));
        let mut labels = Mapping::new();
        labels.insert(s("denv.env"), s(env_id));
        labels.insert(s("denv.service"), s(svc.name.clone()));
        labels.insert(s("denv.managed"), s("true"));
        m.insert(s("labels"), Value::Mapping(labels));
        services.insert(s(svc.name.clone()), Value::Mapping(m));
    }
    let mut volumes = Mapping::new();
    for v in &spec.volumes {
        let mut opts = Mapping::new();
        opts.insert(s("type"), s("none"));
        opts.insert(s("o"), s("bind"));
        opts.insert(s("device"), s(volume_path(v).display().to_string()));
        let mut vm = Mapping::new();
        vm.insert(s("driver"), s("local"));
        vm.insert(s("driver_opts"), Value::Mapping(opts));
        volumes.insert(s(v.clone()), Value::Mapping(vm));
    }
    let mut net = Mapping::new();
    net.insert(s("name"), s(format!("{lc}_default")));
    let mut opts = Mapping::new();
    opts.insert(s(super::BRIDGE_OPTION), s(super::bridge_name(env_id)));
    net.insert(s("driver_opts"), Value::Mapping(opts));
    let mut nl = Mapping::new();
    nl.insert(s(super::EGRESS_LABEL), s(spec.egress.as_str()));
    net.insert(s("labels"), Value::Mapping(nl));
    let mut networks = Mapping::new();
    networks.insert(s("default"), Value::Mapping(net));

    let mut top = Mapping::new();
    top.insert(s("name"), s(lc));
    top.insert(s("services"), Value::Mapping(services));
    if !volumes.is_empty() {
        top.insert(s("volumes"), Value::Mapping(volumes));
    }
    top.insert(s("networks"), Value::Mapping(networks));
    let body = serde_yaml::to_string(&Value::Mapping(top)).unwrap_or_default();
    let policy = match spec.egress {
        Egress::Deny => {
            "deny: only its own services; DNS goes to the gateway, where denvd refuses outside names"
        }
        Egress::Allow => {
            "allow: the internet, not the host, other environments, private or metadata ranges"
        }
    };
    let clock = if spec.frozen_clock() && spec.world_instant_ms != 0 {
        format!(
            "# Clock frozen: starts at {} (ms {}); every service also gets the read-only \
             libfaketime mounts and LD_PRELOAD/FAKETIME_* variables (offset in clock/faketimerc; \
             docs/reference/compose.md#clock).\n",
            super::clock::rfc3339(spec.world_instant_ms),
            spec.world_instant_ms
        )
    } else {
        String::new()
    };
    format!(
        "# Rendered by denvd for {env_id} (egress {}). Equivalent to what runs; not executed.\n\
         # Network policy (nftables table inet {}, chains env_{}_out/_in): {policy}.\n{clock}{body}",
        spec.egress.as_str(),
        super::TABLE,
        super::bridge_name(env_id),
    )
}

/// Writes `spec.json` and `compose.yaml` into `dir` (created).
pub(crate) fn write_env_files(dir: &Path, spec: &Spec, compose: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?;
    let tmp = dir.join(".spec.json.tmp");
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, dir.join("spec.json"))?;
    std::fs::write(dir.join("compose.yaml"), compose)?;
    let profile =
        serde_json::to_vec_pretty(&super::seccomp::profile()).map_err(std::io::Error::other)?;
    std::fs::write(dir.join(SECCOMP_FILE), profile)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use denv_compose::{Agent, Service};

    #[test]
    fn containment_is_rendered() {
        let spec = Spec {
            services: vec![
                Service {
                    name: "box".into(),
                    image: "busybox:1.36".into(),
                    user: "1000:1000".into(),
                    ..Default::default()
                },
                Service {
                    name: "db".into(),
                    image: "postgres:16-alpine".into(),
                    cap_add: vec!["SYS_CHROOT".into()],
                    ..Default::default()
                },
            ],
            agent: Some(Agent {
                service: "box".into(),
            }),
            ..Default::default()
        };
        let y = render_compose("env_X", &spec, &|v| format!("/d/{v}").into(), 2.0);
        let doc: Value = serde_yaml::from_str(y.split_once('\n').unwrap().1).unwrap();
        let svc = |n: &str| doc["services"][n].clone();
        assert_eq!(svc("box")["security_opt"][0], s("no-new-privileges:true"));
        assert_eq!(svc("box")["security_opt"][1], s("seccomp=seccomp.json"));
        assert_eq!(svc("box")["cap_drop"][0], s("ALL"));
        assert!(
            svc("box").get("cap_add").is_none(),
            "the agent keeps nothing"
        );
        assert_eq!(svc("box")["cpus"], s("1.5"));
        let caps = svc("db")["cap_add"].as_sequence().unwrap().clone();
        assert_eq!(caps.len(), 9);
        assert!(caps.contains(&s("SYS_CHROOT")));
        assert_eq!(svc("db")["logging"]["options"]["max-size"], s("10485760"));
        assert_eq!(
            svc("db")["ulimits"]["nofile"]["hard"],
            Value::Number(8192.into())
        );
    }
}
