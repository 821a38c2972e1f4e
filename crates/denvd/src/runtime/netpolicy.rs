//! The network policy of every environment, owned by denvd in the host's packet filter
//! (spec `19-ref-protections.md` §5; design in `docs/egress-notes.md`).
//!
//! Docker's `internal: true` networks are not a boundary: a container on one still
//! reaches every address of the host (INPUT is not filtered), and Docker's embedded DNS
//! forwards its lookups to the host's resolvers. So each runtime keeps one nftables
//! table of its own, `table inet denv_<owner>` ([`owner_tag`] of its data directory and
//! engine), and programs it per environment:
//!
//! - every environment's network is a normal bridge whose interface denvd names itself,
//!   [`bridge_name`] (`dv` + 12 hex digits of a hash of the environment id), labelled
//!   `denv.egress=deny|allow`;
//! - two base chains, `forward` and `input`, hooked at priority `filter - 10` (before
//!   Docker's `filter` chains: a reject there is final, an accept lets Docker's chains
//!   still run), dispatch on the incoming interface through the verdict maps `env_fwd`
//!   and `env_in` to the environment's own chains `env_<bridge>_out` / `env_<bridge>_in`;
//! - **deny**: traffic that stays on the bridge and replies of connections made *into*
//!   the environment (`ct state established,related`, so published ports work) pass;
//!   everything else the environment sends, forwarded or to the host itself on any
//!   address, TCP, UDP, ICMP, IPv4 or IPv6, is rejected: TCP with a reset, so a connect
//!   fails at once (`ECONNREFUSED`; resets are not rate-limited), everything else with
//!   ICMP administratively-prohibited (which the kernel rate-limits to about one per
//!   second per sender, so a burst of UDP may see timeouts: still nothing passes). The one
//!   exception is DNS to the environment's own gateway, and only when the socket that
//!   would receive it carries denvd's mark [`DNS_MARK`]: denvd's refusing responder
//!   ([`super::refuser`], a process of its own that outlives denvd), which answers every
//!   query `REFUSED`;
//! - **allow**: the same, except forwarded traffic to any address outside the blocked
//!   ranges (set `block4` / `block6`: private, loopback, link-local and metadata,
//!   multicast and reserved ranges, and every prefix of the host's own interfaces) is
//!   accepted, and DNS to the host's resolvers (sets `dns4` / `dns6`, from
//!   `/etc/resolv.conf`) too.
//!
//! Each change is one `nft -f -` transaction, made under an exclusive `flock` on
//! [`LOCK_PATH`] (shared by every denvd process and test runtime on the host), so rules
//! are never half-applied and a reconcile never removes rules another process is adding.
//! Where nftables is not usable (or `DENV_PACKET_FILTER=iptables`), the same verdicts
//! live in iptables chains instead ([`super::iptables`]; [`Backend`]).
//!
//! Only the runtime's own table is touched (a reconcile prunes nothing of another
//! owner's); Docker's tables and chains never are.

use super::{fail, project, Result, Runtime, RuntimeError};
use bollard::models::Network;
use bollard::network::ListNetworksOptions;
use denv_compose::Egress;
use nix::fcntl::{Flock, FlockArg};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use tokio::io::AsyncWriteExt;

/// Prefix of the nftables tables (family `inet`) that hold denvd's rules: each runtime
/// owns `denv_<owner>` ([`owner_tag`]), and touches no other.
pub const TABLE: &str = "denv";

/// Label on an environment's network: the [`owner_tag`] of the runtime that made it.
pub const OWNER_LABEL: &str = "denv.owner";

/// The owner tag of a runtime: 8 hex digits of the FNV-1a hash of its data directory
/// (canonical when it exists) and its engine endpoint (`DOCKER_HOST`, empty for the
/// default socket). Two denvd processes on one host with different data directories or
/// engines own disjoint rules; a restarted denvd finds its own again.
pub fn owner_tag(data_dir: &std::path::Path, docker_host: &str) -> String {
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in dir
        .to_string_lossy()
        .bytes()
        .chain([0u8])
        .chain(docker_host.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h >> 32)
}

/// The nftables table of an owner: `denv_<owner>`.
pub fn owner_table(owner: &str) -> String {
    format!("{TABLE}_{owner}")
}

/// `SO_MARK` of denvd's DNS-refusing sockets (`"denv"` in ASCII). The input rule of a
/// denied environment accepts DNS to its gateway only when the receiving socket carries
/// this mark, so no other DNS server on the host can ever be reached from it.
pub const DNS_MARK: u32 = 0x6465_6e76;

/// Lock file serialising changes to [`TABLE`] across processes.
pub const LOCK_PATH: &str = "/run/denv-netpolicy.lock";

/// Docker's network option naming the bridge interface.
pub const BRIDGE_OPTION: &str = "com.docker.network.bridge.name";

/// Label on an environment's network: `deny` or `allow`.
pub const EGRESS_LABEL: &str = "denv.egress";

/// The canary's /30 (see `egress.rs`): reachable under `allow`, so never in `block4`.
pub(crate) const CANARY_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 19, 255, 252), 30);

/// Ranges an allowed environment never reaches (besides the host's own prefixes).
const BLOCK4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "224.0.0.0/3",
];
const BLOCK6: &[&str] = &[
    "::/127",
    "::ffff:0:0/96",
    "64:ff9b:1::/48",
    "100::/64",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// The bridge interface of an environment's network: `dv` + the first 12 hex digits of
/// the 64-bit FNV-1a hash of the lower-cased environment id (14 characters; Linux allows
/// 15). Stable across processes and versions, so rules keyed by it can be applied
/// before and after the network exists.
pub fn bridge_name(env_id: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in project(env_id).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("dv{:012x}", h >> 16)
}

/// What the policy of one environment's network needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EnvNet {
    /// The environment (label `denv.env`).
    pub env_id: String,
    /// Bridge interface name.
    pub bridge: String,
    /// The network's egress.
    pub egress: Egress,
    /// The bridge's IPv4 address (the containers' gateway and DNS server under deny).
    pub gateway: Option<Ipv4Addr>,
    /// Label [`OWNER_LABEL`]; `None` on networks made before owners existed.
    pub owner: Option<String>,
}

impl EnvNet {
    /// From an inspected network labelled `denv.env` and `denv.egress` whose bridge
    /// denvd named (option [`BRIDGE_OPTION`]). Networks made by an earlier denvd (Docker's
    /// `br-…` names, `internal: true` under deny) are not taken over: they keep Docker's
    /// behaviour until the next create or fork of their environment recreates them.
    pub(crate) fn of(n: &Network) -> Option<EnvNet> {
        let labels = n.labels.as_ref()?;
        let env_id = labels.get("denv.env")?.clone();
        let bridge = n.options.as_ref()?.get(BRIDGE_OPTION)?.clone();
        let egress = match labels.get(EGRESS_LABEL)?.as_str() {
            "allow" => Egress::Allow,
            _ => Egress::Deny,
        };
        let gateway = n
            .ipam
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| {
                c.iter()
                    .find_map(|c| c.gateway.as_deref().and_then(|g| g.parse().ok()))
            });
        let owner = labels.get(OWNER_LABEL).cloned();
        Some(EnvNet {
            env_id,
            bridge,
            egress,
            gateway,
            owner,
        })
    }
}

/// The host's side of the shared sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HostSets {
    /// `block4` elements (CIDR).
    pub block4: Vec<String>,
    /// `block6` elements (CIDR).
    pub block6: Vec<String>,
    /// The host's non-loopback IPv4 resolvers.
    pub dns4: Vec<Ipv4Addr>,
    /// The host's non-loopback IPv6 resolvers.
    pub dns6: Vec<Ipv6Addr>,
}

impl HostSets {
    /// The fixed ranges, every prefix of the host's interfaces (but the canary's), and the
    /// resolvers of `/etc/resolv.conf` (and of systemd-resolved's upstream file, which
    /// Docker reads instead when the first points at `127.0.0.53`).
    pub(crate) fn read() -> HostSets {
        let mut s = HostSets {
            block4: BLOCK4.iter().map(|s| s.to_string()).collect(),
            block6: BLOCK6.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        for (_, addr, prefix) in host_addresses() {
            match addr {
                IpAddr::V4(a) => {
                    let net = v4_network(a, prefix);
                    if (net, prefix) != CANARY_NET && !a.is_loopback() {
                        s.block4.push(format!("{net}/{prefix}"));
                    }
                }
                IpAddr::V6(a) => {
                    if !a.is_loopback() && !is_link_local6(&a) {
                        s.block6.push(format!("{}/{prefix}", v6_network(a, prefix)));
                    }
                }
            }
        }
        for f in ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"] {
            for ip in nameservers(&std::fs::read_to_string(f).unwrap_or_default()) {
                match ip {
                    IpAddr::V4(a) if !a.is_loopback() && !s.dns4.contains(&a) => s.dns4.push(a),
                    IpAddr::V6(a) if !a.is_loopback() && !s.dns6.contains(&a) => s.dns6.push(a),
                    _ => {}
                }
            }
        }
        s
    }
}

/// `nameserver` lines of a resolv.conf (zone ids dropped).
pub(crate) fn nameservers(conf: &str) -> Vec<IpAddr> {
    conf.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver")).then_some(())?;
            w.next()?.split('%').next()?.parse().ok()
        })
        .collect()
}

/// Every address of the host's interfaces: (interface, address, prefix length), in the
/// caller's network namespace.
pub(crate) fn host_addresses() -> Vec<(String, IpAddr, u8)> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for a in addrs {
        let (Some(addr), Some(mask)) = (a.address, a.netmask) else {
            continue;
        };
        if let (Some(ip), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
            let prefix = u32::from(m.ip()).count_ones() as u8;
            out.push((a.interface_name, IpAddr::V4(ip.ip()), prefix));
        } else if let (Some(ip), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
            let prefix = u128::from(m.ip()).count_ones() as u8;
            out.push((a.interface_name, IpAddr::V6(ip.ip()), prefix));
        }
    }
    out
}

pub(crate) fn v4_network(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    Ipv4Addr::from(u32::from(a) & mask)
}

fn v6_network(a: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix.min(128)))
    };
    Ipv6Addr::from(u128::from(a) & mask)
}

pub(crate) fn is_link_local6(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}

/// Chain names of one bridge: (`env_<b>_out`, `env_<b>_in`); `-` becomes `_`.
fn chains(bridge: &str) -> (String, String) {
    let b = bridge.replace('-', "_");
    (format!("env_{b}_out"), format!("env_{b}_in"))
}

/// A bridge name safe to put in a script: 1-15 of `[A-Za-z0-9_.-]`.
fn valid_bridge(b: &str) -> bool {
    !b.is_empty()
        && b.len() <= 15
        && b.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// The table, its maps, sets and base chains, with the sets refreshed; idempotent.
pub(crate) fn header_script(t: &str, h: &HostSets) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "add table inet {t}");
    let _ = writeln!(s, "add map inet {t} env_fwd {{ type ifname : verdict; }}");
    let _ = writeln!(s, "add map inet {t} env_in {{ type ifname : verdict; }}");
    for (name, ty) in [("block4", "ipv4_addr"), ("block6", "ipv6_addr")] {
        let _ = writeln!(
            s,
            "add set inet {t} {name} {{ type {ty}; flags interval; auto-merge; }}"
        );
    }
    let _ = writeln!(s, "add set inet {t} dns4 {{ type ipv4_addr; }}");
    let _ = writeln!(s, "add set inet {t} dns6 {{ type ipv6_addr; }}");
    for (chain, hook) in [("forward", "forward"), ("input", "input")] {
        let _ = writeln!(
            s,
            "add chain inet {t} {chain} {{ type filter hook {hook} priority filter - 10; policy accept; }}"
        );
        let _ = writeln!(s, "flush chain inet {t} {chain}");
    }
    let _ = writeln!(s, "add rule inet {t} forward iifname vmap @env_fwd");
    let _ = writeln!(s, "add rule inet {t} input iifname vmap @env_in");
    let sets: [(&str, Vec<String>); 4] = [
        ("block4", h.block4.clone()),
        ("block6", h.block6.clone()),
        ("dns4", h.dns4.iter().map(|a| a.to_string()).collect()),
        ("dns6", h.dns6.iter().map(|a| a.to_string()).collect()),
    ];
    for (name, elems) in sets {
        let _ = writeln!(s, "flush set inet {t} {name}");
        if !elems.is_empty() {
            let _ = writeln!(s, "add element inet {t} {name} {{ {} }}", elems.join(", "));
        }
    }
    s
}

/// The chains of one environment (replaced whole) and its map entries.
pub(crate) fn env_script(t: &str, n: &EnvNet) -> String {
    let b = &n.bridge;
    let (out, inp) = chains(b);
    // TCP gets a reset (immediate, not rate-limited), the rest ICMP admin-prohibited.
    let reject = |s: &mut String, chain: &str, cond: &str| {
        let cond = if cond.is_empty() {
            String::new()
        } else {
            format!("{cond} ")
        };
        let _ = writeln!(
            s,
            "add rule inet {t} {chain} {cond}meta l4proto tcp counter reject with tcp reset"
        );
        let _ = writeln!(
            s,
            "add rule inet {t} {chain} {cond}counter reject with icmpx admin-prohibited"
        );
    };
    let dns = "meta l4proto { tcp, udp } th dport 53";
    let mut s = String::new();
    let _ = writeln!(s, "add chain inet {t} {out}");
    let _ = writeln!(s, "flush chain inet {t} {out}");
    let _ = writeln!(s, "add rule inet {t} {out} oifname \"{b}\" accept");
    let _ = writeln!(
        s,
        "add rule inet {t} {out} ct state established,related accept"
    );
    if n.egress == Egress::Allow {
        let _ = writeln!(s, "add rule inet {t} {out} ip daddr @dns4 {dns} accept");
        let _ = writeln!(s, "add rule inet {t} {out} ip6 daddr @dns6 {dns} accept");
        reject(&mut s, &out, "ip daddr @block4");
        reject(&mut s, &out, "ip6 daddr @block6");
    } else {
        reject(&mut s, &out, "");
    }
    let _ = writeln!(s, "add chain inet {t} {inp}");
    let _ = writeln!(s, "flush chain inet {t} {inp}");
    let _ = writeln!(
        s,
        "add rule inet {t} {inp} ct state established,related accept"
    );
    match (n.egress, n.gateway) {
        (Egress::Allow, _) => {
            let _ = writeln!(s, "add rule inet {t} {inp} ip daddr @dns4 {dns} accept");
            let _ = writeln!(s, "add rule inet {t} {inp} ip6 daddr @dns6 {dns} accept");
        }
        (Egress::Deny, Some(gw)) => {
            let _ = writeln!(
                s,
                "add rule inet {t} {inp} ip daddr {gw} {dns} socket mark {DNS_MARK:#x} accept"
            );
        }
        (Egress::Deny, None) => {}
    }
    reject(&mut s, &inp, "");
    let _ = writeln!(s, "add element inet {t} env_fwd {{ \"{b}\" : jump {out} }}");
    let _ = writeln!(s, "add element inet {t} env_in {{ \"{b}\" : jump {inp} }}");
    s
}

/// What of one bridge's policy exists in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Present {
    in_fwd_map: bool,
    in_in_map: bool,
    out_chain: bool,
    in_chain: bool,
}

/// Removes what exists of one bridge's policy (map entries first, then chains).
fn remove_script(t: &str, bridge: &str, p: &Present) -> String {
    let (out, inp) = chains(bridge);
    let mut s = String::new();
    if p.in_fwd_map {
        let _ = writeln!(s, "delete element inet {t} env_fwd {{ \"{bridge}\" }}");
    }
    if p.in_in_map {
        let _ = writeln!(s, "delete element inet {t} env_in {{ \"{bridge}\" }}");
    }
    if p.out_chain {
        let _ = writeln!(s, "delete chain inet {t} {out}");
    }
    if p.in_chain {
        let _ = writeln!(s, "delete chain inet {t} {inp}");
    }
    s
}

/// The policies present in the table (from `nft -j list table inet denv`), by bridge.
pub(crate) fn parse_present(json: &str) -> BTreeMap<String, Present> {
    let mut out: BTreeMap<String, Present> = BTreeMap::new();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return out;
    };
    let items = v["nftables"].as_array().cloned().unwrap_or_default();
    // Chains are named after the bridge with '-' → '_'; map keys carry the real name.
    let mut chain_names = BTreeSet::new();
    for it in &items {
        if let Some(name) = it["chain"]["name"].as_str() {
            chain_names.insert(name.to_string());
        }
        if let Some(m) = it.get("map") {
            let which = m["name"].as_str().unwrap_or_default();
            for e in m["elem"].as_array().cloned().unwrap_or_default() {
                if let Some(key) = e[0].as_str() {
                    let p = out.entry(key.to_string()).or_default();
                    match which {
                        "env_fwd" => p.in_fwd_map = true,
                        "env_in" => p.in_in_map = true,
                        _ => {}
                    }
                }
            }
        }
    }
    // Chains of bridges not in a map (a half-removed policy) are keyed by chain stem.
    for name in &chain_names {
        let Some(stem) = name.strip_prefix("env_") else {
            continue;
        };
        let (bridge, is_out) = if let Some(b) = stem.strip_suffix("_out") {
            (b, true)
        } else if let Some(b) = stem.strip_suffix("_in") {
            (b, false)
        } else {
            continue;
        };
        let key = out
            .keys()
            .find(|k| k.replace('-', "_") == bridge)
            .cloned()
            .unwrap_or_else(|| bridge.to_string());
        let p = out.entry(key).or_default();
        if is_out {
            p.out_chain = true;
        } else {
            p.in_chain = true;
        }
    }
    out
}

/// Which packet filter holds the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// `table inet denv_<owner>` (see the module doc).
    Nft,
    /// Chains `D<owner>-…` of iptables and ip6tables (see [`super::iptables`]).
    Iptables,
}

/// The packet filter to use and its name for the capabilities (`nftables v1.0.6`,
/// `iptables v1.8.9 (legacy)`). `choice` is `DENV_PACKET_FILTER`: `""` or `auto` (nftables
/// when `nft` can list the ruleset, else iptables), `nftables` or `iptables`. Errors: an
/// unknown choice, or none of them usable (naming what failed).
pub(crate) async fn detect(choice: &str) -> Result<(Backend, String)> {
    match choice {
        "nftables" | "nft" => Ok((Backend::Nft, detect_nft().await?)),
        "iptables" => Ok((Backend::Iptables, super::iptables::detect().await?)),
        "" | "auto" => match detect_nft().await {
            Ok(v) => Ok((Backend::Nft, v)),
            Err(nft) => match super::iptables::detect().await {
                Ok(v) => Ok((Backend::Iptables, v)),
                Err(ipt) => fail(format!(
                    "network policy: no usable packet filter: {nft}; {ipt} \
                     (install Debian's `nftables` or `iptables` package; denvd must run as root)"
                )),
            },
        },
        other => fail(format!(
            "DENV_PACKET_FILTER: unknown packet filter {other:?} (auto, nftables, iptables)"
        )),
    }
}

/// `nftables v1.0.6` from `nft --version`, once `nft list tables` works.
async fn detect_nft() -> Result<String> {
    let out = tokio::process::Command::new("nft")
        .arg("--version")
        .output()
        .await;
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            return fail(format!(
                "network policy: `nft --version` failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail("network policy: `nft` not found")
        }
        Err(e) => return fail(format!("network policy: cannot run nft: {e}")),
    };
    let list = tokio::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .await
        .map_err(|e| RuntimeError::io("network policy: run nft", e))?;
    if !list.status.success() {
        return fail(format!(
            "network policy: `nft list tables` failed: {}",
            String::from_utf8_lossy(&list.stderr).trim()
        ));
    }
    let v = String::from_utf8_lossy(&out.stdout);
    let v = v.split(" (").next().unwrap_or_default().trim().to_string();
    Ok(if v.is_empty() { "nftables".into() } else { v })
}

/// Runs one `nft -f -` transaction.
async fn nft_apply(script: &str) -> Result<()> {
    let mut child = tokio::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| RuntimeError::io("network policy: run nft", e))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(script.as_bytes())
        .await
        .map_err(|e| RuntimeError::io("network policy: write to nft", e))?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| RuntimeError::io("network policy: run nft", e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        tracing::warn!(%err, %script, "nft transaction failed");
        return fail(format!(
            "network policy: nft: {}",
            err.lines().next().unwrap_or("failed").trim()
        ));
    }
    Ok(())
}

/// Whether `table inet <t>` exists.
async fn nft_table_exists(t: &str) -> bool {
    tokio::process::Command::new("nft")
        .args(["list", "table", "inet", t])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// What of each bridge's policy the table holds now (empty when there is no table).
async fn present(table: &str) -> Result<BTreeMap<String, Present>> {
    let out = tokio::process::Command::new("nft")
        .args(["-j", "list", "table", "inet", table])
        .output()
        .await
        .map_err(|e| RuntimeError::io("network policy: run nft", e))?;
    if !out.status.success() {
        return Ok(BTreeMap::new());
    }
    Ok(parse_present(&String::from_utf8_lossy(&out.stdout)))
}

/// The cross-process lock on [`TABLE`] (released on drop).
pub(crate) async fn lock() -> Result<Flock<File>> {
    tokio::task::spawn_blocking(|| {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_PATH)
            .map_err(|e| RuntimeError::io(format!("network policy: open {LOCK_PATH}"), e))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| {
            RuntimeError::io(format!("network policy: lock {LOCK_PATH}"), e.into())
        })
    })
    .await
    .map_err(|e| RuntimeError::Failed(format!("network policy: lock task: {e}")))?
}

impl Runtime {
    /// This runtime's [`owner_tag`].
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// This runtime's nftables table (`denv_<owner>`, family `inet`).
    pub fn nft_table(&self) -> String {
        owner_table(&self.inner.owner)
    }

    /// Whether a network on the engine is this runtime's: labelled with its owner tag,
    /// or (made before owners existed) unlabelled with the environment's directory in
    /// this runtime's data directory.
    fn owns(&self, n: &EnvNet) -> bool {
        match &n.owner {
            Some(o) => *o == self.inner.owner,
            None => self
                .inner
                .cfg
                .data_dir
                .join("envs")
                .join(&n.env_id)
                .is_dir(),
        }
    }

    /// Applies the policy of one environment's network (its chains replaced whole, the
    /// shared sets refreshed) in one transaction, and under `deny` starts the DNS
    /// refuser on its gateway. Called after the network is created and before any of
    /// its containers exists.
    pub(crate) async fn apply_env_policy(&self, n: &EnvNet) -> Result<()> {
        if !valid_bridge(&n.bridge) {
            return fail(format!(
                "network policy: invalid bridge name {:?}",
                n.bridge
            ));
        }
        if let (Egress::Deny, Some(gw)) = (n.egress, n.gateway) {
            self.ensure_dns_refuser(&n.bridge, gw).await?;
        }
        if self.inner.backend == Backend::Iptables {
            let _l = lock().await?;
            let mut nets = self.owned_networks().await?;
            nets.retain(|o| o.bridge != n.bridge);
            nets.push(n.clone());
            return super::iptables::sync(&self.inner.owner, &nets, &HostSets::read()).await;
        }
        let t = self.nft_table();
        let script = format!(
            "{}{}",
            header_script(&t, &HostSets::read()),
            env_script(&t, n)
        );
        let _l = lock().await?;
        nft_apply(&script).await
    }

    /// The valid networks on the engine this runtime owns.
    async fn owned_networks(&self) -> Result<Vec<EnvNet>> {
        Ok(self
            .env_networks()
            .await?
            .into_iter()
            .filter(|n| self.owns(n) && valid_bridge(&n.bridge))
            .collect())
    }

    /// Removes the policy of one bridge (whatever exists of it in this runtime's table)
    /// and the DNS refuser on its gateway; the table goes too when no policy is left in
    /// it. Failures are logged: a leftover rule matches no interface, and the next
    /// reconcile removes it.
    pub(crate) async fn remove_env_policy(&self, bridge: &str) {
        super::refuser::stop(bridge);
        let t = self.nft_table();
        let r = async {
            let _l = lock().await?;
            if self.inner.backend == Backend::Iptables {
                let mut nets = self.owned_networks().await?;
                nets.retain(|o| o.bridge != bridge);
                return super::iptables::sync(&self.inner.owner, &nets, &HostSets::read()).await;
            }
            let p = present(&t).await?;
            let rest = p.keys().filter(|b| *b != bridge).count();
            if rest == 0 && nft_table_exists(&t).await {
                return nft_apply(&format!("delete table inet {t}\n")).await;
            }
            match p.get(bridge) {
                Some(p) => nft_apply(&remove_script(&t, bridge, p)).await,
                None => Ok(()),
            }
        }
        .await;
        if let Err(e) = r {
            tracing::warn!(bridge, "removing the network policy: {e}");
        }
    }

    /// Re-applies the policy of every network on the engine that this runtime owns
    /// (label [`OWNER_LABEL`], see [`Runtime::owns`]; their DNS refusers too) and removes
    /// from its own table the policies of bridges whose network is gone, in one
    /// transaction. Rules of other owners (another denvd, another data directory or
    /// engine) are never touched. Run when the runtime starts, so rules lost with a
    /// reboot or a flushed ruleset are back before any environment is reported healthy;
    /// safe to run at any time. Returns the number of networks covered.
    pub async fn reconcile_network_policy(&self) -> Result<usize> {
        let _l = lock().await?;
        let nets = self.owned_networks().await?;
        for n in &nets {
            if let (Egress::Deny, Some(gw)) = (n.egress, n.gateway) {
                if let Err(e) = self.ensure_dns_refuser(&n.bridge, gw).await {
                    tracing::warn!(env_id = %n.env_id, "dns refuser: {e}");
                }
            }
        }
        if self.inner.backend == Backend::Iptables {
            super::iptables::sync(&self.inner.owner, &nets, &HostSets::read()).await?;
            return Ok(nets.len());
        }
        let t = self.nft_table();
        if nets.is_empty() {
            // Nothing to hold: no table (an empty one of an earlier run goes).
            if nft_table_exists(&t).await {
                nft_apply(&format!("delete table inet {t}\n")).await?;
            }
            return Ok(0);
        }
        let mut script = header_script(&t, &HostSets::read());
        let mut keep = BTreeSet::new();
        for n in &nets {
            script.push_str(&env_script(&t, n));
            keep.insert(n.bridge.clone());
        }
        for (bridge, p) in present(&t).await? {
            if !keep.contains(&bridge) {
                script.push_str(&remove_script(&t, &bridge, &p));
            }
        }
        nft_apply(&script).await?;
        Ok(nets.len())
    }

    /// Networks labelled `denv.env` on the engine, as policies.
    pub(crate) async fn env_networks(&self) -> Result<Vec<EnvNet>> {
        let filters = HashMap::from([("label".to_string(), vec!["denv.env".to_string()])]);
        let nets = self
            .inner
            .docker
            .list_networks(Some(ListNetworksOptions { filters }))
            .await
            .map_err(|e| RuntimeError::docker("list networks", e))?;
        Ok(nets.iter().filter_map(EnvNet::of).collect())
    }

    /// Starts the DNS refuser of a denied network's gateway unless it runs
    /// ([`super::refuser`]: a process of its own that outlives denvd).
    pub(crate) async fn ensure_dns_refuser(&self, bridge: &str, gw: Ipv4Addr) -> Result<()> {
        let bridge = bridge.to_string();
        tokio::task::spawn_blocking(move || super::refuser::ensure(&bridge, gw))
            .await
            .map_err(|e| RuntimeError::Failed(format!("dns refuser: {e}")))?
    }
}

/// A bound (and for TCP, listening) non-blocking socket for the DNS refuser.
pub(crate) fn refuser_socket(addr: SocketAddrV4, tcp: bool) -> nix::Result<OwnedFd> {
    use nix::sys::socket::{
        bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
        SockaddrIn,
    };
    use std::os::fd::AsRawFd;
    let ty = if tcp {
        SockType::Stream
    } else {
        SockType::Datagram
    };
    let fd = socket(
        AddressFamily::Inet,
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    setsockopt(&fd, sockopt::IpFreebind, &true)?;
    setsockopt(&fd, sockopt::Mark, &DNS_MARK)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(addr))?;
    if tcp {
        listen(&fd, Backlog::new(64)?)?;
    }
    Ok(fd)
}

/// A `REFUSED` answer to a DNS query: same id, opcode and RD bit, QR and RA set, the
/// first question echoed, no records. `None` for anything that is not a query.
pub(crate) fn refuse(q: &[u8]) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 {
        return None;
    }
    let qdcount = u16::from_be_bytes([q[4], q[5]]);
    // The end of the first question: labels, then type and class.
    let mut end = 12;
    let mut with_question = false;
    if qdcount >= 1 {
        let mut i = 12;
        while let Some(&len) = q.get(i) {
            if len == 0 {
                if i + 5 <= q.len() {
                    end = i + 5;
                    with_question = true;
                }
                break;
            }
            if len & 0xc0 != 0 {
                break;
            }
            i += 1 + usize::from(len);
        }
    }
    let mut r = Vec::with_capacity(end);
    r.extend_from_slice(&q[..2]);
    r.push(0x80 | (q[2] & 0x79)); // QR, opcode, RD
    r.push(0x80 | 5); // RA, REFUSED
    r.extend_from_slice(&[0, u8::from(with_question), 0, 0, 0, 0, 0, 0]);
    r.extend_from_slice(&q[12..end]);
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(egress: Egress) -> EnvNet {
        EnvNet {
            env_id: "env_a".into(),
            bridge: bridge_name("env_a"),
            egress,
            gateway: Some(Ipv4Addr::new(172, 18, 0, 1)),
            owner: Some("0123abcd".into()),
        }
    }

    #[test]
    fn bridge_names_are_stable_short_and_case_blind() {
        let b = bridge_name("env_Alpha1");
        assert_eq!(b, bridge_name("ENV_alpha1"));
        assert_eq!(b.len(), 14);
        assert!(b.starts_with("dv") && valid_bridge(&b));
        assert_ne!(b, bridge_name("env_alpha2"));
    }

    #[test]
    fn deny_rejects_all_but_its_bridge_and_marked_dns() {
        let s = env_script("denv_t", &net(Egress::Deny));
        let b = bridge_name("env_a");
        assert!(s.contains(&format!("oifname \"{b}\" accept")), "{s}");
        assert!(s.contains("ct state established,related accept"));
        assert!(s.contains(
            "ip daddr 172.18.0.1 meta l4proto { tcp, udp } th dport 53 socket mark 0x64656e76 accept"
        ));
        assert!(!s.contains("@block4"), "deny needs no allow-list: {s}");
        assert_eq!(
            s.matches("meta l4proto tcp counter reject with tcp reset")
                .count(),
            2
        );
        assert_eq!(
            s.matches("counter reject with icmpx admin-prohibited")
                .count(),
            2
        );
        assert!(s.contains(&format!("env_fwd {{ \"{b}\" : jump env_{b}_out }}")));
    }

    #[test]
    fn allow_rejects_private_ranges_and_the_host() {
        let s = env_script("denv_t", &net(Egress::Allow));
        assert!(s.contains("ip daddr @block4 meta l4proto tcp counter reject with tcp reset"));
        assert!(
            s.contains("ip daddr @block4 counter reject with icmpx"),
            "{s}"
        );
        assert!(s.contains("ip6 daddr @block6 counter reject"));
        assert!(!s.contains("socket mark"));
        // The input chain ends in a reject either way.
        let last_input_rule = s
            .lines()
            .rfind(|l| l.starts_with("add rule") && l.contains("_in "))
            .unwrap();
        assert!(last_input_rule.contains("reject"), "{s}");
    }

    #[test]
    fn header_blocks_the_host_prefixes_but_not_the_canary() {
        let h = HostSets {
            block4: vec!["10.0.0.0/8".into(), "192.0.2.0/24".into()],
            block6: vec!["fc00::/7".into()],
            dns4: vec![Ipv4Addr::new(10, 255, 255, 53)],
            dns6: vec![],
        };
        let s = header_script("denv", &h);
        assert!(s.contains("priority filter - 10; policy accept;"));
        assert!(s.contains("add element inet denv block4 { 10.0.0.0/8, 192.0.2.0/24 }"));
        assert!(s.contains("add element inet denv dns4 { 10.255.255.53 }"));
        assert!(!s.contains("add element inet denv dns6"));
        let read = HostSets::read();
        assert!(read.block4.iter().all(|b| !b.starts_with("198.19.255.252")));
        assert!(read.block4.contains(&"169.254.0.0/16".to_string()));
    }

    #[test]
    fn resolv_conf_nameservers() {
        let c =
            "# x\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nsearch a\nnameserver 127.0.0.53\n";
        assert_eq!(
            nameservers(c),
            vec![
                "10.0.0.2".parse::<IpAddr>().unwrap(),
                "fe80::1".parse().unwrap(),
                "127.0.0.53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn present_policies_from_nft_json() {
        let j = r#"{"nftables":[{"metainfo":{}},{"table":{"family":"inet","name":"denv"}},
          {"map":{"family":"inet","name":"env_fwd","table":"denv","type":"ifname","map":"verdict",
            "elem":[["dv0123",{"jump":{"target":"env_dv0123_out"}}]]}},
          {"map":{"family":"inet","name":"env_in","table":"denv","type":"ifname","map":"verdict"}},
          {"chain":{"family":"inet","table":"denv","name":"env_dv0123_out"}},
          {"chain":{"family":"inet","table":"denv","name":"env_br_abc_in"}},
          {"chain":{"family":"inet","table":"denv","name":"forward"}}]}"#;
        let p = parse_present(j);
        assert_eq!(p.len(), 2, "{p:?}");
        let a = &p["dv0123"];
        assert!(a.in_fwd_map && a.out_chain && !a.in_in_map && !a.in_chain);
        let s = remove_script("denv", "dv0123", a);
        assert_eq!(
            s,
            "delete element inet denv env_fwd { \"dv0123\" }\ndelete chain inet denv env_dv0123_out\n"
        );
        assert!(p["br_abc"].in_chain);
    }

    #[test]
    fn refused_answers_echo_the_question() {
        // id 0x1234, RD, one question example.com A IN, plus an OPT record.
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1];
        q.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
        q.extend_from_slice(&[0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0]);
        let r = refuse(&q).unwrap();
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[2], 0x81);
        assert_eq!(r[3] & 0x0f, 5);
        assert_eq!(&r[4..12], &[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&r[12..], b"\x07example\x03com\x00\x00\x01\x00\x01");
        assert!(refuse(&r).is_none(), "a response is not answered");
        assert!(refuse(&q[..5]).is_none());
    }

    #[test]
    fn network_prefixes() {
        assert_eq!(
            v4_network(Ipv4Addr::new(192, 0, 2, 77), 24),
            Ipv4Addr::new(192, 0, 2, 0)
        );
        assert_eq!(
            v4_network(Ipv4Addr::new(1, 2, 3, 4), 0),
            Ipv4Addr::UNSPECIFIED
        );
        assert!(is_link_local6(&"fe80::1".parse().unwrap()));
        assert!(!is_link_local6(&"fd00::2".parse().unwrap()));
    }
}
