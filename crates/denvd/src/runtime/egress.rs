//! The egress probe and its canary (spec `19-ref-protections.md` §5).
//!
//! A probe that fails to reach `http://1.1.1.1/` proves nothing on a machine without
//! internet. So every probe also tries a **canary** that is reachable from any network
//! with a route out, and the denial only counts when both fail.
//!
//! **Canary design.** One long-lived container per host, `denv-canary` (probe image,
//! `busybox httpd`, label `denv.managed=true`), runs in the host's network namespace and
//! listens only on the gateway address of a dedicated, otherwise empty bridge network
//! `denv-canary` (e.g. `172.20.0.1:<free port>`), serving a page containing
//! `denv-canary-ok`. That address is a host address that is *off-link* for every
//! environment network:
//!
//! - from a normal (egress `allow`) network, a container reaches it through its default
//!   route (its own gateway, i.e. the host), exactly as it would reach the internet;
//! - from an `internal: true` network (egress `deny`) there is no default route, so the
//!   connection fails with "network unreachable", like the public address.
//!
//! (The env network's *own* gateway address is on-link even for internal networks, so
//! it would not be a valid canary.) Nothing is published on the host's external
//! interfaces and no traffic leaves the machine. The canary is created on first use and
//! re-used (its address is kept in the label `denv.canary.addr`).
//!
//! **Probe.** A short-lived container (probe image, label `denv.env=<env>`) on the env's
//! network runs `wget -T 4` against the public target (under `deny` only: under `allow`
//! the public internet is never contacted) and against the canary, prints one marker per
//! target, and is removed.

use super::{fail, network_name, project, Result, Runtime, RuntimeError};
use bollard::container::{Config, CreateContainerOptions, WaitContainerOptions};
use bollard::models::{HostConfig, RestartPolicy, RestartPolicyNameEnum};
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
                let running = c.state.and_then(|s| s.running) == Some(true);
                let same = c
                    .config
                    .and_then(|c| c.labels)
                    .and_then(|l| l.get("denv.canary.addr").cloned())
                    .as_deref()
                    == Some(addr);
                running && same
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
        // Re-use a running canary on the same gateway.
        if let Some(c) = self.inspect(CANARY).await? {
            let addr = c
                .config
                .as_ref()
                .and_then(|c| c.labels.as_ref())
                .and_then(|l| l.get("denv.canary.addr").cloned());
            let running = c.state.as_ref().and_then(|s| s.running) == Some(true);
            if let Some(a) = addr.filter(|a| a.starts_with(&format!("{gw}:"))) {
                if !running {
                    let _ = d.start_container::<String>(CANARY, None).await;
                }
                if wait_listening(&a).await {
                    return Ok(a);
                }
            }
            self.remove_container(CANARY).await?;
        }
        let port = std::net::TcpListener::bind((gw.as_str(), 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| {
                RuntimeError::Failed(format!(
                    "egress probe failed to run: cannot bind the canary on {gw}: {e}"
                ))
            })?;
        let addr = format!("{gw}:{port}");
        let script = format!(
            "mkdir -p /tmp/www && echo {CANARY_MARK} > /tmp/www/index.html && exec httpd -f -p {addr} -h /tmp/www"
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
                    labels: Some(HashMap::from([
                        ("denv.managed".to_string(), "true".to_string()),
                        ("denv.canary.addr".to_string(), addr.clone()),
                    ])),
                    host_config: Some(HostConfig {
                        network_mode: Some("host".into()),
                        memory: Some(32 << 20),
                        pids_limit: Some(32),
                        restart_policy: Some(RestartPolicy {
                            name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                            maximum_retry_count: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .await;
        if let Err(e) = r {
            if e.to_string().contains("Conflict") || e.to_string().contains("already in use") {
                // Another runtime created it meanwhile: use theirs.
                return Box::pin(self.ensure_canary()).await;
            }
            return Err(RuntimeError::docker("create egress canary", e));
        }
        d.start_container::<String>(CANARY, None)
            .await
            .map_err(|e| RuntimeError::docker("start egress canary", e))?;
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
                "if wget -q -T 4 -O /dev/null '{target}' 2>/dev/null; then echo PUBLIC=reached; else echo PUBLIC=blocked; fi; "
            )
        } else {
            String::new()
        };
        let script = format!(
            "{public}if wget -q -T 4 -O - http://{canary}/ 2>/dev/null | grep -q {CANARY_MARK}; then echo CANARY=reached; else echo CANARY=blocked; fi"
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
                host_config: Some(HostConfig {
                    network_mode: Some(network.to_string()),
                    memory: Some(64 << 20),
                    pids_limit: Some(64),
                    ..Default::default()
                }),
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
                return fail(format!("egress probe failed to run: unexpected output {out:?}"));
            }
        } else {
            None
        };
        let canary = if out.contains("CANARY=reached") {
            true
        } else if out.contains("CANARY=blocked") {
            false
        } else {
            return fail(format!("egress probe failed to run: unexpected output {out:?}"));
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
        match tokio::time::timeout(Duration::from_secs(30), w.next()).await {
            Err(_) => {
                self.kill(name).await;
                return fail("egress probe failed to run: probe did not finish within 30s");
            }
            // A non-zero exit shows up as an error item; the markers decide below.
            Ok(_) => {}
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
                    return fail("egress is denied but the stack reached the internet");
                }
                Ok("denied (verified)".into())
            }
            Egress::Allow => {
                let o = self.probe_network(env_id, &net, false).await?;
                if !o.canary {
                    tracing::warn!("{env_id}: egress is allowed but the probe did not reach the canary");
                }
                Ok("allowed".into())
            }
        }
    }
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
