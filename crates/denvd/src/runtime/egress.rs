//! The egress proof and its canary (spec `19-ref-protections.md` §5).
//!
//! The policy itself lives in the host's packet filter (see `netpolicy.rs`); this module
//! proves, after every create, fork and rollback, that it is in force for the
//! environment, from the environment's own point of view.
//!
//! **Probe.** No container: denvd (root) takes the PID of one of the environment's
//! running service containers, and in a short-lived dedicated OS thread enters its
//! network namespace (`setns` on `/proc/<pid>/ns/net`), checks that the namespace carries
//! the container's address, and makes TCP connect attempts with a 500 ms timeout:
//!
//! - the **canary** (below);
//! - every address of the host's interfaces (the bridge gateways of every network, the
//!   LAN address, …; loopback and IPv6 link-local left out) on the **sentinel** port and
//!   on each of [`super::RuntimeConfig::egress_probe_ports`] (the control plane's);
//! - a metadata address, `169.254.169.254:80`;
//! - under `deny` only, and only once every other attempt was stopped, the public target
//!   ([`super::RuntimeConfig::egress_probe_target`]), so that not even a broken policy
//!   sends a packet off the machine before the rest has shown it in force.
//!
//! The policy rejects TCP with a reset, so a stopped attempt fails at once ("connection
//! refused"); IPv6 addresses on an IPv4-only network are unreachable without a packet. A
//! reset alone does not tell the policy from a closed port, so the attempts that prove
//! something go to ports known to listen: the canary's, and the sentinel, a listener
//! each runtime keeps on every host address (`[::]:<ephemeral>`, accepting and closing
//! at once). Refused there, only the policy can have refused. A connection, or no
//! answer within the timeout (the policy is not in force), fails the operation. The
//! whole probe takes about a millisecond. Each attempt is recorded in
//! [`EgressProbe::attempts`] with what answered.
//!
//! **Canary.** A listener that is reachable exactly like the internet is: through
//! forwarding, to an address outside every private range, and never leaves the machine.
//! One network namespace per host, [`canary_netns`], joined to the host by the veth pair
//! `dvcanary0` (host, `198.19.255.253/30`) / `dvcanary1` (namespace, [`CANARY_IP`]), in
//! the benchmarking range 198.18.0.0/15 (RFC 2544) that no Docker pool uses, with a
//! default route back to the host. Each runtime binds its own TCP listener in it on an
//! ephemeral port (no shared lock, nothing to serialise concurrent creates), and answers
//! `denv-canary-ok`. From an allowed environment it is reached; from a denied one it must
//! not be, so the proof means something on a machine without internet.

use super::netpolicy::{host_addresses, is_link_local6, lock, EnvNet};
use super::{fail, network_name, Result, Runtime, RuntimeError};
use bollard::network::InspectNetworkOptions;
use denv_compose::Egress;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// Name of the canary's network namespace (`/run/netns/denv-egress-canary`) for a
/// `denvd` in the machine's own network namespace; see [`canary_netns`].
pub const CANARY_NETNS: &str = "denv-egress-canary";

/// The canary namespace's name for this process: [`CANARY_NETNS`] in the network
/// namespace of pid 1, else `denv-egress-canary-<inode of this process's network
/// namespace>`. Names in `/run/netns` are the machine's, while the canary's veth
/// `dvcanary0` lives in the namespace `denvd` runs in: two `denvd` in two namespaces of
/// one machine (a test fleet) must not take each other's canary.
pub fn canary_netns() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let ino = |p: &str| std::fs::metadata(p).map(|m| m.ino()).ok();
        match (ino("/proc/self/ns/net"), ino("/proc/1/ns/net")) {
            (Some(me), Some(init)) if me != init => format!("{CANARY_NETNS}-{me}"),
            _ => CANARY_NETNS.to_string(),
        }
    })
}
const CANARY_HOST_IF: &str = "dvcanary0";
const CANARY_NS_IF: &str = "dvcanary1";
/// The host's side of the canary's veth pair.
pub const CANARY_HOST_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 253);
/// The canary's address.
pub const CANARY_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 254);
const CANARY_MARK: &[u8] = b"denv-canary-ok\n";
/// The metadata address every probe tries.
pub const METADATA: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)), 80);
/// Timeout of one connect attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// What the egress probe of one environment tried and saw (create/fork evidence).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressProbe {
    /// The verdict: `denied (verified)` or `allowed`.
    pub egress: String,
    /// Wall time of the probe inside the namespace (enter, check, every attempt), µs.
    pub took_us: u64,
    /// Whose namespace: `<service> (pid <pid>, <address>)`.
    pub from: String,
    /// Every attempt, in order.
    pub attempts: Vec<ProbeAttempt>,
}

/// One connect attempt of the probe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeAttempt {
    /// `canary`, `host <interface>` (the sentinel's port or one of the configured
    /// ports), `metadata` or `public`.
    pub target: String,
    /// `ip:port` (IPv6 in brackets).
    pub addr: String,
    /// `connected`, `refused (connection refused)`, `rejected (no route to host)`,
    /// `unreachable (…)`, `no answer within 500 ms` or `error: …`.
    pub result: String,
    /// How long the attempt took, µs.
    pub took_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Connected,
    /// A TCP reset: the policy's reject (or a closed port).
    Refused,
    /// ICMP host unreachable / administratively prohibited.
    Rejected,
    /// No route in the namespace (e.g. IPv6 on an IPv4-only network).
    NoRoute(String),
    TimedOut,
    Error(String),
}

impl Outcome {
    fn of(r: std::io::Result<TcpStream>) -> Outcome {
        use nix::errno::Errno;
        match r {
            Ok(_) => Outcome::Connected,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Outcome::TimedOut,
            Err(e) => match e.raw_os_error().map(Errno::from_raw) {
                Some(Errno::EHOSTUNREACH) => Outcome::Rejected,
                Some(Errno::ENETUNREACH) | Some(Errno::EADDRNOTAVAIL) => {
                    Outcome::NoRoute(e.to_string())
                }
                Some(Errno::ECONNREFUSED) => Outcome::Refused,
                _ => Outcome::Error(e.to_string()),
            },
        }
    }

    fn stopped(&self) -> bool {
        matches!(
            self,
            Outcome::Refused | Outcome::Rejected | Outcome::NoRoute(_)
        )
    }

    fn text(&self) -> String {
        match self {
            Outcome::Connected => "connected".into(),
            Outcome::Rejected => "rejected (no route to host)".into(),
            Outcome::NoRoute(e) => format!("unreachable ({})", strip_os_error(e)),
            Outcome::Refused => "refused (connection refused)".into(),
            Outcome::TimedOut => format!("no answer within {} ms", CONNECT_TIMEOUT.as_millis()),
            Outcome::Error(e) => format!("error: {e}"),
        }
    }
}

/// `Network is unreachable (os error 101)` → `network is unreachable`.
fn strip_os_error(e: &str) -> String {
    e.split(" (os error").next().unwrap_or(e).to_lowercase()
}

/// The runtime's canary listener.
pub(crate) struct Canary {
    addr: SocketAddr,
    netns: (u64, u64),
    task: tokio::task::AbortHandle,
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn netns_path() -> String {
    format!("/run/netns/{}", canary_netns())
}

fn netns_id() -> Option<(u64, u64)> {
    std::fs::metadata(netns_path())
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// `ip` with arguments; its stderr on failure.
async fn ip(args: &[&str]) -> std::result::Result<String, String> {
    let o = tokio::process::Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Whether the canary's namespace, veth pair, addresses and route are all in place.
async fn canary_netns_ok() -> bool {
    let host = format!("{CANARY_HOST_IP}/30");
    let inner = format!("{CANARY_IP}/30");
    let via = format!("via {CANARY_HOST_IP}");
    netns_id().is_some()
        && ip(&["-o", "addr", "show", "dev", CANARY_HOST_IF])
            .await
            .is_ok_and(|o| o.contains(&host))
        && ip(&[
            "-n",
            canary_netns(),
            "-o",
            "addr",
            "show",
            "dev",
            CANARY_NS_IF,
        ])
        .await
        .is_ok_and(|o| o.contains(&inner))
        && ip(&["-n", canary_netns(), "route", "show", "default"])
            .await
            .is_ok_and(|o| o.contains(&via))
}

/// Creates (or repairs) the canary's namespace and veth pair; under the policy lock, so
/// concurrent runtimes on the host do it once.
async fn ensure_canary_netns() -> Result<()> {
    if canary_netns_ok().await {
        return Ok(());
    }
    let _l = lock().await?;
    if canary_netns_ok().await {
        return Ok(());
    }
    let _ = ip(&["link", "del", CANARY_HOST_IF]).await;
    let _ = ip(&["netns", "del", canary_netns()]).await;
    let host = format!("{CANARY_HOST_IP}/30");
    let inner = format!("{CANARY_IP}/30");
    let gw = CANARY_HOST_IP.to_string();
    let steps: [&[&str]; 8] = [
        &["netns", "add", canary_netns()],
        &[
            "link",
            "add",
            CANARY_HOST_IF,
            "type",
            "veth",
            "peer",
            "name",
            CANARY_NS_IF,
            "netns",
            canary_netns(),
        ],
        &["addr", "add", &host, "dev", CANARY_HOST_IF],
        &["link", "set", CANARY_HOST_IF, "up"],
        &["-n", canary_netns(), "link", "set", "lo", "up"],
        &[
            "-n",
            canary_netns(),
            "addr",
            "add",
            &inner,
            "dev",
            CANARY_NS_IF,
        ],
        &["-n", canary_netns(), "link", "set", CANARY_NS_IF, "up"],
        &["-n", canary_netns(), "route", "add", "default", "via", &gw],
    ];
    for s in steps {
        ip(s).await.map_err(|e| {
            RuntimeError::Failed(format!("egress probe failed to run: canary: {e}"))
        })?;
    }
    Ok(())
}

/// Binds a TCP listener on the canary's address in its namespace (from a dedicated
/// thread that enters the namespace and ends).
fn bind_in_canary_netns() -> std::result::Result<(std::net::TcpListener, (u64, u64)), String> {
    std::thread::spawn(|| {
        let f = std::fs::File::open(netns_path()).map_err(|e| format!("{}: {e}", netns_path()))?;
        let m = f.metadata().map_err(|e| e.to_string())?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns {}: {e}", netns_path()))?;
        let l = std::net::TcpListener::bind((CANARY_IP, 0))
            .map_err(|e| format!("bind {CANARY_IP}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok((l, (m.dev(), m.ino())))
    })
    .join()
    .map_err(|_| "canary thread panicked".to_string())?
}

async fn serve_canary(l: tokio::net::TcpListener) {
    use tokio::io::AsyncWriteExt;
    loop {
        match l.accept().await {
            Ok((mut s, _)) => {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(2), s.write_all(CANARY_MARK))
                        .await;
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// `http://1.1.1.1/`, `https://[2606:4700::1111]:8443/x`, `1.1.1.1:80` or `1.1.1.1` →
/// a socket address. Names are refused: the probe never resolves anything.
pub fn parse_target(t: &str) -> std::result::Result<SocketAddr, String> {
    let (rest, port) = if let Some(r) = t.strip_prefix("http://") {
        (r, 80)
    } else if let Some(r) = t.strip_prefix("https://") {
        (r, 443)
    } else {
        (t, 80)
    };
    let hostport = rest.split('/').next().unwrap_or(rest);
    if let Ok(a) = hostport.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bare = hostport.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, port))
        .map_err(|_| {
            format!("public target {t:?} must be an IP address (the probe resolves no names)")
        })
}

/// A target, what answered, and how long it took.
type Attempt = (Target, Outcome, Duration);

/// One attempt to run.
struct Target {
    label: String,
    addr: SocketAddr,
    public: bool,
}

/// Runs the attempts inside the namespace of `pid` (a dedicated thread that ends with
/// them). Errors when the namespace cannot be entered or does not carry `expect_ip`.
fn attempts_in_netns(
    pid: i64,
    expect_ip: Option<IpAddr>,
    targets: Vec<Target>,
) -> std::result::Result<(Vec<Attempt>, Duration), String> {
    std::thread::Builder::new()
        .name("denv-egress-probe".into())
        .spawn(move || {
            let t0 = Instant::now();
            let path = format!("/proc/{pid}/ns/net");
            let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns {path}: {e}"))?;
            if let Some(ip) = expect_ip {
                let here = host_addresses();
                if !here.iter().any(|(_, a, _)| *a == ip) {
                    return Err(format!(
                        "the network namespace of pid {pid} does not carry the container's address {ip}"
                    ));
                }
            }
            let mut out = Vec::with_capacity(targets.len());
            let (public, rest): (Vec<Target>, Vec<Target>) =
                targets.into_iter().partition(|t| t.public);
            for t in rest {
                let a = Instant::now();
                let o = Outcome::of(TcpStream::connect_timeout(&t.addr, CONNECT_TIMEOUT));
                out.push((t, o, a.elapsed()));
            }
            // The public target only once everything else was stopped.
            if out.iter().all(|(_, o, _)| o.stopped()) {
                for t in public {
                    let a = Instant::now();
                    let o = Outcome::of(TcpStream::connect_timeout(&t.addr, CONNECT_TIMEOUT));
                    out.push((t, o, a.elapsed()));
                }
            }
            Ok((out, t0.elapsed()))
        })
        .map_err(|e| format!("probe thread: {e}"))?
        .join()
        .map_err(|_| "probe thread panicked".to_string())?
}

/// The runtime's sentinel: a listener on every host address.
pub(crate) struct Sentinel {
    port: u16,
    task: tokio::task::AbortHandle,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Runtime {
    /// The port of this runtime's sentinel, a TCP listener on every address of the host
    /// (`[::]`, dual stack; `0.0.0.0` where IPv6 is off) that accepts and closes at once.
    /// An environment that connects to it on any host address is not denied the host.
    pub async fn sentinel_port(&self) -> Result<u16> {
        let mut slot = self.inner.sentinel.lock().await;
        if let Some(s) = slot.as_ref() {
            if !s.task.is_finished() {
                return Ok(s.port);
            }
        }
        let l = match tokio::net::TcpListener::bind("[::]:0").await {
            Ok(l) => l,
            Err(_) => tokio::net::TcpListener::bind("0.0.0.0:0")
                .await
                .map_err(|e| RuntimeError::io("egress probe failed to run: sentinel", e))?,
        };
        let port = l
            .local_addr()
            .map_err(|e| RuntimeError::io("egress probe failed to run: sentinel", e))?
            .port();
        let task = tokio::spawn(async move {
            loop {
                // Accepted and dropped: closed at once.
                if l.accept().await.is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        })
        .abort_handle();
        *slot = Some(Sentinel { port, task });
        Ok(port)
    }

    /// The canary's `ip:port` for this runtime, creating the namespace and this runtime's
    /// listener when needed (again when the namespace was replaced). Errors:
    /// `egress probe failed to run: canary: …`.
    pub async fn canary_addr(&self) -> Result<SocketAddr> {
        let mut slot = self.inner.canary.lock().await;
        if let Some(c) = slot.as_ref() {
            let veth = std::path::Path::new("/sys/class/net").join(CANARY_HOST_IF);
            if netns_id() == Some(c.netns) && !c.task.is_finished() && veth.exists() {
                return Ok(c.addr);
            }
        }
        ensure_canary_netns().await?;
        let (l, netns) = tokio::task::spawn_blocking(bind_in_canary_netns)
            .await
            .map_err(|e| RuntimeError::Failed(format!("egress probe failed to run: canary: {e}")))?
            .map_err(|e| {
                RuntimeError::Failed(format!("egress probe failed to run: canary: {e}"))
            })?;
        let addr = l
            .local_addr()
            .map_err(|e| RuntimeError::io("egress probe failed to run: canary", e))?;
        let l = tokio::net::TcpListener::from_std(l)
            .map_err(|e| RuntimeError::io("egress probe failed to run: canary", e))?;
        let task = tokio::spawn(serve_canary(l)).abort_handle();
        *slot = Some(Canary { addr, netns, task });
        Ok(addr)
    }

    /// Probes the environment's network from inside one of its containers' network
    /// namespace (see the module docs) and judges the result against its egress (from
    /// the network's `denv.egress` label). `Ok` is the evidence of a policy in force.
    ///
    /// Errors: `egress probe failed to run: …` (no running container, the namespace
    /// cannot be entered, the canary cannot be set up);
    /// `egress is denied but the stack reached the internet: …`,
    /// `egress is denied but the stack reached the host: …`,
    /// `egress is denied but the network policy is not in force: …`,
    /// `egress is allowed but the stack reached the host: …`,
    /// `egress is allowed but the canary is not reachable: …`.
    pub async fn probe_env(&self, env_id: &str) -> Result<EgressProbe> {
        let net = network_name(env_id);
        let n = self
            .inner
            .docker
            .inspect_network(&net, None::<InspectNetworkOptions<String>>)
            .await
            .map_err(|e| {
                RuntimeError::Failed(format!(
                    "egress probe failed to run: {}",
                    RuntimeError::docker(format!("inspect network {net}"), e)
                ))
            })?;
        let egress = EnvNet::of(&n).map(|n| n.egress).unwrap_or(Egress::Deny);
        let run_err = |e: String| RuntimeError::Failed(format!("egress probe failed to run: {e}"));

        // One running service container: its pid and address on the network.
        let mut from = None;
        for c in self.managed_containers(Some(env_id)).await? {
            let labels = c.labels.clone().unwrap_or_default();
            let Some(service) = labels.get("denv.service") else {
                continue;
            };
            let Some(id) = c.id.as_deref() else { continue };
            let Some(ci) = self.inspect(id).await? else {
                continue;
            };
            let st = ci.state.clone().unwrap_or_default();
            let pid = st.pid.unwrap_or(0);
            if st.running != Some(true) || st.paused == Some(true) || pid <= 0 {
                continue;
            }
            let ip = ci
                .network_settings
                .as_ref()
                .and_then(|s| s.networks.as_ref())
                .and_then(|m| m.get(&net))
                .and_then(|e| e.ip_address.as_deref())
                .and_then(|a| a.parse::<IpAddr>().ok());
            from = Some((service.clone(), pid, ip));
            break;
        }
        let Some((service, pid, ip)) = from else {
            return Err(run_err(format!(
                "no running container of {env_id} to probe from"
            )));
        };

        let canary = self.canary_addr().await?;
        let mut ports = vec![self.sentinel_port().await?];
        ports.extend(self.inner.cfg.egress_probe_ports.iter().copied());
        ports.dedup();
        let mut targets = vec![Target {
            label: "canary".into(),
            addr: canary,
            public: false,
        }];
        let mut seen = std::collections::BTreeSet::new();
        for (iface, addr, _) in host_addresses() {
            let skip = match addr {
                IpAddr::V4(a) => a.is_loopback(),
                IpAddr::V6(a) => a.is_loopback() || is_link_local6(&a),
            };
            if skip || !seen.insert(addr) {
                continue;
            }
            for p in &ports {
                targets.push(Target {
                    label: format!("host {iface}"),
                    addr: SocketAddr::new(addr, *p),
                    public: false,
                });
            }
        }
        targets.push(Target {
            label: "metadata".into(),
            addr: METADATA,
            public: false,
        });
        if egress == Egress::Deny {
            let addr = parse_target(&self.inner.cfg.egress_probe_target).map_err(run_err)?;
            targets.push(Target {
                label: "public".into(),
                addr,
                public: true,
            });
        }

        let (results, took) =
            tokio::task::spawn_blocking(move || attempts_in_netns(pid, ip, targets))
                .await
                .map_err(|e| run_err(format!("probe task: {e}")))?
                .map_err(run_err)?;
        let mut probe = EgressProbe {
            egress: String::new(),
            took_us: took.as_micros() as u64,
            from: match ip {
                Some(ip) => format!("{service} (pid {pid}, {ip})"),
                None => format!("{service} (pid {pid})"),
            },
            attempts: results
                .iter()
                .map(|(t, o, d)| ProbeAttempt {
                    target: t.label.clone(),
                    addr: t.addr.to_string(),
                    result: o.text(),
                    took_us: d.as_micros() as u64,
                })
                .collect(),
        };
        let what = |t: &Target, o: &Outcome| format!("{} {} {}", t.label, t.addr, o.text());
        for (t, o, _) in &results {
            if let Outcome::Error(e) = o {
                return Err(run_err(format!("connect to {}: {e}", t.addr)));
            }
        }
        match egress {
            Egress::Deny => {
                for (t, o, _) in &results {
                    if o.stopped() {
                        continue;
                    }
                    let host = t.label.starts_with("host");
                    return fail(match o {
                        Outcome::TimedOut => format!(
                            "egress is denied but the network policy is not in force: {}",
                            what(t, o)
                        ),
                        _ if host => {
                            format!(
                                "egress is denied but the stack reached the host: {}",
                                what(t, o)
                            )
                        }
                        _ => format!(
                            "egress is denied but the stack reached the internet: {}",
                            what(t, o)
                        ),
                    });
                }
                probe.egress = "denied (verified)".into();
            }
            Egress::Allow => {
                for (t, o, _) in &results {
                    if t.label == "canary" {
                        if *o != Outcome::Connected {
                            return fail(format!(
                                "egress is allowed but the canary is not reachable: {}",
                                what(t, o)
                            ));
                        }
                    } else if !o.stopped() {
                        return fail(format!(
                            "egress is allowed but the stack reached the host: {}",
                            what(t, o)
                        ));
                    }
                }
                probe.egress = "allowed".into();
            }
        }
        Ok(probe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_ip_literals() {
        assert_eq!(
            parse_target("http://1.1.1.1/").unwrap(),
            "1.1.1.1:80".parse().unwrap()
        );
        assert_eq!(
            parse_target("https://[2606:4700::1111]:8443/x").unwrap(),
            "[2606:4700::1111]:8443".parse().unwrap()
        );
        assert_eq!(
            parse_target("203.0.113.9:25").unwrap(),
            "203.0.113.9:25".parse().unwrap()
        );
        assert!(parse_target("http://example.com/")
            .unwrap_err()
            .contains("must be an IP address"));
    }

    #[test]
    fn outcomes_from_errors() {
        let e = |n| Err(std::io::Error::from_raw_os_error(n));
        assert_eq!(Outcome::of(e(nix::libc::EHOSTUNREACH)), Outcome::Rejected);
        assert!(Outcome::of(e(nix::libc::ENETUNREACH)).stopped());
        assert_eq!(Outcome::of(e(nix::libc::ECONNREFUSED)), Outcome::Refused);
        assert!(Outcome::Refused.stopped());
        assert!(!Outcome::Connected.stopped());
        assert_eq!(
            Outcome::of(Err(std::io::Error::from(std::io::ErrorKind::TimedOut))),
            Outcome::TimedOut
        );
        assert_eq!(
            Outcome::of(e(nix::libc::ENETUNREACH)).text(),
            "unreachable (network is unreachable)"
        );
        assert_eq!(Outcome::Rejected.text(), "rejected (no route to host)");
    }
}
