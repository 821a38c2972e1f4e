//! The egress probe and its canary (spec `19-ref-protections.md` §5).
//!
//! A probe that fails to reach `http://1.1.1.1/` proves nothing on a machine without
//! internet. So every probe also tries a **canary** that is reachable from any network
//! with a route out, and the denial only counts when both fail.
//!
//! **Canary design.** One long-lived container per host, `denv-canary` (probe image,
//! `busybox httpd` serving a page containing `denv-canary-ok`, label
//! `denv.managed=true`), on its own bridge network `denv-canary`, with its port 8080
//! published **only on that network's gateway address** (e.g. `172.30.0.1:<ephemeral>`),
//! so nothing is exposed on the host's external interfaces and nothing leaves the
//! machine. A probe reaches it the way it would reach the internet: the packet leaves the
//! env's bridge, is DNAT-ed by the host and *forwarded* to another network.
//!
//! - from a normal (egress `allow`) network the forward is allowed: reached;
//! - from an `internal: true` network (egress `deny`) Docker's isolation rules drop every
//!   forwarded packet whose destination is outside the network's subnet: not reached,
//!   exactly like the public address.
//!
//! Why not simply a listener on a host address: Docker 20.10 gives containers on an
//! internal network a default route to the bridge gateway, and the host's INPUT chain is
//! not filtered, so **anything listening on a host address is reachable from a denied
//! network** (measured; a host-network canary answered from an internal network). A
//! canary that is only reachable through forwarding is the one that proves what "no route
//! out" means. (Operators should not run sensitive services on `0.0.0.0` of a denv host.)
//! The canary is created on first use and re-used; its address is read back from the
//! published port.
//!
//! **Probe.** A short-lived container (probe image, label `denv.env=<env>`) on the env's
//! network runs `wget -T 4` against the public target (under `deny` only: under `allow`
//! the public internet is never contacted) and against the canary, prints one marker per
//! target, and is removed.

use super::{fail, network_name, project, Result, Runtime, RuntimeError};
use bollard::container::{Config, CreateContainerOptions, WaitContainerOptions};
use bollard::models::{HostConfig, PortBinding, RestartPolicy, RestartPolicyNameEnum};
use bollard::network::{CreateNetworkOptions, InspectNetworkOptions};
use denv_compose::Egress;
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;

/// Name of the canary container and of its bridge network.
pub const CANARY: &str = "denv-canary";
const CANARY_MARK: &str = "denv-canary-ok";

/// What a probe container saw from one network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// It reached the public target (`None`: not tried, as under `allow`).
    pub public: Option<bool>,
    /// It reached the canary.
    pub canary: bool,
}

impl Runtime {
    /// The canary's `ip:port`, creating the canary when needed.
    pub async fn canary_addr(&self) -> Result<String> {
        let mut slot = self.inner.canary.lock().await;
        if let Some(a) = slot.as_ref() {
            if self.canary_running(a).await {
                return Ok(a.clone());
            }
        }
        let a = self.ensure_canary().await?;
        *slot = Some(a.clone());
        Ok(a)
    }

    async fn canary_running(&self, addr: &str) -> bool {
        match self.inspect(CANARY).await {
            Ok(Some(c)) => {
                c.state.as_ref().and_then(|s| s.running) == Some(true)
                    && published_addr(&c).as_deref() == Some(addr)
            }
            _ => false,
        }
    }

    async fn ensure_canary(&self) -> Result<String> {
        let d = &self.inner.docker;
        self.ensure_image(&self.inner.cfg.probe_image).await?;
        // The dedicated bridge whose gateway address the canary listens on.
        let gw = match d
            .inspect_network(CANARY, None::<InspectNetworkOptions<String>>)
            .await
        {
            Ok(n) => gateway_of(&n),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                let r = d
                    .create_network(CreateNetworkOptions {
                        name: CANARY.to_string(),
                        check_duplicate: true,
                        driver: "bridge".to_string(),
                        labels: HashMap::from([("denv.managed".to_string(), "true".to_string())]),
                        ..Default::default()
                    })
                    .await;
                if let Err(e) = r {
                    // A concurrent creator won the race: fine.
                    if !e.to_string().contains("already exists") {
                        return Err(RuntimeError::docker("create canary network", e));
                    }
                }
                let n = d
                    .inspect_network(CANARY, None::<InspectNetworkOptions<String>>)
                    .await
                    .map_err(|e| RuntimeError::docker("inspect canary network", e))?;
                gateway_of(&n)
            }
            Err(e) => return Err(RuntimeError::docker("inspect canary network", e)),
        };
        let Some(gw) = gw else {
            return fail("egress probe failed to run: canary network has no gateway address");
        };
        // Re-use a running canary published on the same gateway.
        if let Some(c) = self.inspect(CANARY).await? {
            let addr = c
                .config
                .as_ref()
                .and_then(|c| c.labels.as_ref())
                .and_then(|l| l.get("denv.canary.gateway").cloned())
                .filter(|g| *g == gw)
                .and(published_addr(&c));
            let running = c.state.as_ref().and_then(|s| s.running) == Some(true);
            if let (Some(a), true) = (addr, running) {
                if wait_listening(&a).await {
                    return Ok(a);
                }
            }
            self.remove_container(CANARY).await?;
        }
        let script = format!(
            "mkdir -p /tmp/www && echo {CANARY_MARK} > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
        );
        let r = d
            .create_container(
                Some(CreateContainerOptions {
                    name: CANARY.to_string(),
                    platform: None,
                }),
                Config {
                    image: Some(self.inner.cfg.probe_image.clone()),
                    entrypoint: Some(vec!["sh".into(), "-c".into(), script]),
                    exposed_ports: Some(HashMap::from([("8080/tcp".to_string(), HashMap::new())])),
                    labels: Some(HashMap::from([
                        ("denv.managed".to_string(), "true".to_string()),
                        ("denv.canary.gateway".to_string(), gw.clone()),
                    ])),
                    host_config: Some(hardened(HostConfig {
                        network_mode: Some(CANARY.into()),
                        port_bindings: Some(HashMap::from([(
                            "8080/tcp".to_string(),
                            Some(vec![PortBinding {
                                host_ip: Some(gw.clone()),
                                host_port: None,
                            }]),
                        )])),
                        memory: Some(32 << 20),
                        pids_limit: Some(32),
                        restart_policy: Some(RestartPolicy {
                            name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                            maximum_retry_count: None,
                        }),
                        ..Default::default()
                    })),
                    ..Default::default()
                },
            )
            .await;
        if let Err(e) = r {
            if e.to_string().contains("Conflict") || e.to_string().contains("already in use") {
                // Another runtime created it meanwhile: use theirs.
                tokio::time::sleep(Duration::from_millis(500)).await;
                return Box::pin(self.ensure_canary()).await;
            }
            return Err(RuntimeError::docker("create egress canary", e));
        }
        d.start_container::<String>(CANARY, None)
            .await
            .map_err(|e| RuntimeError::docker("start egress canary", e))?;
        let addr = self
            .inspect(CANARY)
            .await?
            .and_then(|c| published_addr(&c))
            .ok_or_else(|| {
                RuntimeError::Failed("egress probe failed to run: canary port not published".into())
            })?;
        if !wait_listening(&addr).await {
            let logs = self.logs_tail(CANARY, 10).await;
            return fail(format!(
                "egress probe failed to run: canary on {addr} did not start: {logs}"
            ));
        }
        Ok(addr)
    }

    /// Runs one probe container on `network`: tries the canary, and the public target
    /// when `try_public`. Errors (`egress probe failed to run: …`) when the probe itself
    /// cannot run.
    pub async fn probe_network(
        &self,
        env_id: &str,
        network: &str,
        try_public: bool,
    ) -> Result<ProbeOutcome> {
        let canary = self.canary_addr().await?;
        let target = &self.inner.cfg.egress_probe_target;
        let public = if try_public {
            format!(
                "(if wget -q -T 4 -O /dev/null '{target}' 2>/dev/null; then echo PUBLIC=reached; else echo PUBLIC=blocked; fi) & "
            )
        } else {
            String::new()
        };
        let script = format!(
            "{public}(if wget -q -T 4 -O - http://{canary}/ 2>/dev/null | grep -q {CANARY_MARK}; then echo CANARY=reached; else echo CANARY=blocked; fi) & wait"
        );
        let name = format!(
            "{}-egress-probe-{:08x}",
            project(env_id),
            rand::random::<u32>()
        );
        let d = &self.inner.docker;
        d.create_container(
            Some(CreateContainerOptions {
                name: name.clone(),
                platform: None,
            }),
            Config {
                image: Some(self.inner.cfg.probe_image.clone()),
                entrypoint: Some(vec!["sh".into(), "-c".into(), script]),
                labels: Some(HashMap::from([
                    ("denv.managed".to_string(), "true".to_string()),
                    ("denv.env".to_string(), env_id.to_string()),
                    ("denv.probe".to_string(), "egress".to_string()),
                ])),
                host_config: Some(hardened(HostConfig {
                    network_mode: Some(network.to_string()),
                    memory: Some(64 << 20),
                    pids_limit: Some(64),
                    ..Default::default()
                })),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| {
            RuntimeError::Failed(format!(
                "egress probe failed to run: {}",
                RuntimeError::docker("create probe", e)
            ))
        })?;
        let r = self.run_probe(&name).await;
        let _ = self.remove_container(&name).await;
        let out = r?;
        let public = if try_public {
            if out.contains("PUBLIC=reached") {
                Some(true)
            } else if out.contains("PUBLIC=blocked") {
                Some(false)
            } else {
                return fail(format!(
                    "egress probe failed to run: unexpected output {out:?}"
                ));
            }
        } else {
            None
        };
        let canary = if out.contains("CANARY=reached") {
            true
        } else if out.contains("CANARY=blocked") {
            false
        } else {
            return fail(format!(
                "egress probe failed to run: unexpected output {out:?}"
            ));
        };
        Ok(ProbeOutcome { public, canary })
    }

    async fn run_probe(&self, name: &str) -> Result<String> {
        let d = &self.inner.docker;
        d.start_container::<String>(name, None).await.map_err(|e| {
            RuntimeError::Failed(format!(
                "egress probe failed to run: {}",
                RuntimeError::docker("start probe", e)
            ))
        })?;
        let mut w = d.wait_container(
            name,
            Some(WaitContainerOptions {
                condition: "not-running",
            }),
        );
        // A non-zero exit shows up as an error item; the markers decide afterwards.
        if tokio::time::timeout(Duration::from_secs(30), w.next())
            .await
            .is_err()
        {
            self.kill(name).await;
            return fail("egress probe failed to run: probe did not finish within 30s");
        }
        Ok(self.logs_tail(name, 20).await)
    }

    /// The egress check of create / fork / rollback. `deny`: the probe must reach
    /// neither the public target nor the canary → `denied (verified)`; reaching either
    /// is `egress is denied but the stack reached the internet`. `allow`: only the
    /// canary is probed → `allowed` (an unreachable canary is logged, not fatal).
    pub(crate) async fn verify_egress(&self, env_id: &str, egress: Egress) -> Result<String> {
        let net = network_name(env_id);
        match egress {
            Egress::Deny => {
                let o = self.probe_network(env_id, &net, true).await?;
                if o.public == Some(true) || o.canary {
                    // Seen under many parallel network creations on Docker 20.10: a probe
                    // reaches the canary while the engine is still reprogramming its
                    // isolation rules. Probe once more after the rules settle; a stack
                    // that still gets out is refused.
                    tracing::warn!(env_id, ?o, "egress probe reached out; probing again");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let again = self.probe_network(env_id, &net, true).await?;
                    if again.public == Some(true) || again.canary {
                        return fail("egress is denied but the stack reached the internet");
                    }
                }
                Ok("denied (verified)".into())
            }
            Egress::Allow => {
                let o = self.probe_network(env_id, &net, false).await?;
                if !o.canary {
                    tracing::warn!(
                        "{env_id}: egress is allowed but the probe did not reach the canary"
                    );
                }
                Ok("allowed".into())
            }
        }
    }
}

/// `host_ip:host_port` of the canary's published port.
fn published_addr(c: &bollard::models::ContainerInspectResponse) -> Option<String> {
    c.network_settings
        .as_ref()?
        .ports
        .as_ref()?
        .get("8080/tcp")?
        .as_ref()?
        .iter()
        .find_map(|b| match (&b.host_ip, &b.host_port) {
            (Some(ip), Some(p)) if !p.is_empty() => Some(format!("{ip}:{p}")),
            _ => None,
        })
}

fn gateway_of(n: &bollard::models::Network) -> Option<String> {
    n.ipam
        .as_ref()
        .and_then(|i| i.config.as_ref())
        .and_then(|c| c.iter().find_map(|c| c.gateway.clone()))
        .filter(|g| !g.is_empty())
}

/// Whether something accepts TCP connections on `addr` within ~10 s.
async fn wait_listening(addr: &str) -> bool {
    for _ in 0..100 {
        if let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_millis(500),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// `hc` with the containment settings and no capabilities (probe, canary).
fn hardened(mut hc: HostConfig) -> HostConfig {
    super::harden(&mut hc, super::Privilege::None);
    hc
}
