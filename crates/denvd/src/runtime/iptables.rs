//! The network policy of [`super::netpolicy`] on hosts where only iptables exists
//! (legacy or nf_tables flavour), or when `DENV_PACKET_FILTER=iptables` asks for it.
//!
//! Same verdicts as the nftables table, in chains of the `filter` table of `iptables`
//! and `ip6tables`, named after the runtime's owner tag `<o>` (8 hex digits) so that
//! several denvd processes on one host never touch each other's rules:
//!
//! - `D<o>-FWD` and `D<o>-IN`, jumped to from the first rule of `FORWARD` and `INPUT`,
//!   and from the first rule of `DOCKER-USER` when Docker made it (Docker keeps that jump
//!   first in `FORWARD`, also after it restarts), dispatch on the incoming interface:
//!   `-i <bridge> -j D<o>-<h>-O` / `-j D<o>-<h>-I`, where `<h>` is the bridge name
//!   without its `dv` prefix;
//! - the environment's chains `RETURN` what passes (traffic on its own bridge, replies
//!   of connections made into it, under allow what is not in a blocked range, DNS to the
//!   host's resolvers under allow, DNS to the gateway's refuser under deny, recognised by
//!   its socket mark with `-m socket --restore-skmark -m mark`) and `REJECT` the rest:
//!   `--reject-with tcp-reset` for TCP, `icmp-admin-prohibited` /
//!   `icmp6-adm-prohibited` for everything else. A `RETURN` lets Docker's own rules run
//!   after ours, as an nftables `accept` in a base chain does.
//!
//! Each change is one `iptables-restore --noflush` (and one `ip6tables-restore`) of the
//! owner's chains, replaced whole, then the jumps checked (`-C`) and inserted when
//! missing; all under the policy lock. There are no sets: the blocked ranges are one rule
//! each.

use super::netpolicy::{EnvNet, HostSets, DNS_MARK};
use super::{fail, Result, RuntimeError};
use denv_compose::Egress;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use tokio::io::AsyncWriteExt;

/// `iptables --version`, e.g. `iptables v1.8.9 (nf_tables)`; an error when there is no
/// usable `iptables` (not installed, or the `filter` table cannot be listed: not root).
pub(crate) async fn detect() -> Result<String> {
    let v = run("iptables", &["--version"]).await?;
    run("iptables", &["-w", "-S", "INPUT"]).await?;
    Ok(v.trim().to_string())
}

/// The dispatch chains of an owner: (`D<o>-FWD`, `D<o>-IN`).
pub(crate) fn dispatch(owner: &str) -> (String, String) {
    (format!("D{owner}-FWD"), format!("D{owner}-IN"))
}

/// The chains of one bridge: (`D<o>-<h>-O`, `D<o>-<h>-I`).
pub(crate) fn env_chains(owner: &str, bridge: &str) -> (String, String) {
    let h = bridge.strip_prefix("dv").unwrap_or(bridge);
    (format!("D{owner}-{h}-O"), format!("D{owner}-{h}-I"))
}

/// The `iptables-restore --noflush` script (v4 when `v6` is false) of an owner's chains
/// for `nets` (all its bridges: the dispatch chains are rewritten whole).
pub(crate) fn restore_script(owner: &str, nets: &[EnvNet], h: &HostSets, v6: bool) -> String {
    let (fwd, inp) = dispatch(owner);
    let icmp = if v6 {
        "icmp6-adm-prohibited"
    } else {
        "icmp-admin-prohibited"
    };
    let mut s = String::from("*filter\n");
    let _ = writeln!(s, ":{fwd} - [0:0]");
    let _ = writeln!(s, ":{inp} - [0:0]");
    for n in nets {
        let (o, i) = env_chains(owner, &n.bridge);
        let _ = writeln!(s, ":{o} - [0:0]");
        let _ = writeln!(s, ":{i} - [0:0]");
    }
    let reject = |s: &mut String, chain: &str, cond: &str| {
        let _ = writeln!(
            s,
            "-A {chain} {cond}-p tcp -j REJECT --reject-with tcp-reset"
        );
        let _ = writeln!(s, "-A {chain} {cond}-j REJECT --reject-with {icmp}");
    };
    let dns: Vec<String> = if v6 {
        h.dns6.iter().map(|a| a.to_string()).collect()
    } else {
        h.dns4.iter().map(|a| a.to_string()).collect()
    };
    let block = if v6 { &h.block6 } else { &h.block4 };
    for n in nets {
        let b = &n.bridge;
        let (o, i) = env_chains(owner, b);
        let _ = writeln!(s, "-A {fwd} -i {b} -j {o}");
        let _ = writeln!(s, "-A {inp} -i {b} -j {i}");
        let _ = writeln!(s, "-A {o} -o {b} -j RETURN");
        let _ = writeln!(
            s,
            "-A {o} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
        );
        let _ = writeln!(
            s,
            "-A {i} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
        );
        match n.egress {
            Egress::Allow => {
                for d in &dns {
                    for p in ["udp", "tcp"] {
                        let _ = writeln!(s, "-A {o} -d {d} -p {p} --dport 53 -j RETURN");
                        let _ = writeln!(s, "-A {i} -d {d} -p {p} --dport 53 -j RETURN");
                    }
                }
                for r in block {
                    reject(&mut s, &o, &format!("-d {r} "));
                }
            }
            Egress::Deny => {
                reject(&mut s, &o, "");
                if let (false, Some(gw)) = (v6, n.gateway) {
                    for p in ["udp", "tcp"] {
                        let _ = writeln!(
                            s,
                            "-A {i} -d {gw}/32 -p {p} --dport 53 -m socket --nowildcard \
                             --restore-skmark -m mark --mark {DNS_MARK:#x} -j RETURN"
                        );
                    }
                }
            }
        }
        reject(&mut s, &i, "");
    }
    s.push_str("COMMIT\n");
    s
}

/// Every chain of the owner (from `iptables -S`: `-N D<o>…` lines).
fn owner_chains(owner: &str, listing: &str) -> Vec<String> {
    let p = format!("-N D{owner}-");
    listing
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .filter(|c| format!("-N {c}").starts_with(&p))
        .map(str::to_string)
        .collect()
}

async fn run(bin: &str, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .output()
        .await
        .map_err(|e| {
            RuntimeError::io(format!("network policy: run {bin} {}", args.join(" ")), e)
        })?;
    if !out.status.success() {
        return fail(format!(
            "network policy: {bin} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn restore(bin: &str, script: &str) -> Result<()> {
    let mut child = tokio::process::Command::new(bin)
        .args(["-w", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| RuntimeError::io(format!("network policy: run {bin}"), e))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(script.as_bytes())
        .await
        .map_err(|e| RuntimeError::io(format!("network policy: write to {bin}"), e))?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| RuntimeError::io(format!("network policy: run {bin}"), e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        tracing::warn!(%err, %script, "{bin} failed");
        return fail(format!(
            "network policy: {bin}: {}",
            err.lines().next().unwrap_or("failed").trim()
        ));
    }
    Ok(())
}

/// Inserts `-j <target>` as the first rule of `chain` unless the jump exists.
async fn ensure_jump(bin: &str, chain: &str, target: &str) -> Result<()> {
    if run(bin, &["-w", "-C", chain, "-j", target]).await.is_ok() {
        return Ok(());
    }
    run(bin, &["-w", "-I", chain, "1", "-j", target])
        .await
        .map(|_| ())
}

/// Makes the owner's chains exactly `nets` (bridges not in it lose their chains), in
/// both families; removes the dispatch chains and their jumps when `nets` is empty.
/// The caller holds the policy lock.
pub(crate) async fn sync(owner: &str, nets: &[EnvNet], h: &HostSets) -> Result<()> {
    let (fwd, inp) = dispatch(owner);
    for (bin, rbin, v6) in [
        ("iptables", "iptables-restore", false),
        ("ip6tables", "ip6tables-restore", true),
    ] {
        // A kernel without IPv6 has no IPv6 traffic to filter (and no ip6tables tables).
        if v6 && !std::path::Path::new("/proc/sys/net/ipv6").exists() {
            continue;
        }
        let before = run(bin, &["-w", "-S"]).await?;
        let keep: BTreeSet<String> = nets
            .iter()
            .flat_map(|n| {
                let (o, i) = env_chains(owner, &n.bridge);
                [o, i]
            })
            .chain([fwd.clone(), inp.clone()])
            .collect();
        let docker_user = before.lines().any(|l| l == "-N DOCKER-USER");
        let stale: Vec<String> = if nets.is_empty() {
            for (c, t) in [("FORWARD", &fwd), ("DOCKER-USER", &fwd), ("INPUT", &inp)] {
                while run(bin, &["-w", "-D", c, "-j", t]).await.is_ok() {}
            }
            owner_chains(owner, &before)
        } else {
            restore(rbin, &restore_script(owner, nets, h, v6)).await?;
            ensure_jump(bin, "FORWARD", &fwd).await?;
            ensure_jump(bin, "INPUT", &inp).await?;
            if docker_user {
                ensure_jump(bin, "DOCKER-USER", &fwd).await?;
            }
            owner_chains(owner, &before)
                .into_iter()
                .filter(|c| !keep.contains(c))
                .collect()
        };
        // Flush them all first: a dispatch chain refers to the environments' chains.
        for c in &stale {
            let _ = run(bin, &["-w", "-F", c]).await;
        }
        for c in &stale {
            if let Err(e) = run(bin, &["-w", "-X", c]).await {
                tracing::warn!("network policy: {e}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn net(egress: Egress) -> EnvNet {
        EnvNet {
            env_id: "env_a".into(),
            bridge: "dv0123456789ab".into(),
            egress,
            gateway: Some(Ipv4Addr::new(172, 18, 0, 1)),
            owner: Some("0123abcd".into()),
        }
    }

    fn hosts() -> HostSets {
        HostSets {
            block4: vec!["10.0.0.0/8".into(), "169.254.0.0/16".into()],
            block6: vec!["fc00::/7".into()],
            dns4: vec![Ipv4Addr::new(10, 0, 0, 2)],
            dns6: vec![],
        }
    }

    #[test]
    fn chain_names_fit_iptables() {
        let (o, i) = env_chains("0123abcd", "dv0123456789ab");
        assert_eq!(o, "D0123abcd-0123456789ab-O");
        assert!(o.len() <= 28 && i.len() <= 28);
    }

    #[test]
    fn deny_rejects_everything_but_its_bridge_replies_and_marked_dns() {
        let s = restore_script("0123abcd", &[net(Egress::Deny)], &hosts(), false);
        let o = "D0123abcd-0123456789ab-O";
        let i = "D0123abcd-0123456789ab-I";
        assert!(s.starts_with("*filter\n:D0123abcd-FWD - [0:0]\n"), "{s}");
        assert!(s.contains(&format!("-A D0123abcd-FWD -i dv0123456789ab -j {o}")));
        assert!(s.contains(&format!("-A {o} -o dv0123456789ab -j RETURN")));
        assert!(s.contains(&format!("-A {o} -p tcp -j REJECT --reject-with tcp-reset")));
        assert!(s.contains(&format!(
            "-A {o} -j REJECT --reject-with icmp-admin-prohibited"
        )));
        assert!(s.contains(&format!(
            "-A {i} -d 172.18.0.1/32 -p udp --dport 53 -m socket --nowildcard --restore-skmark -m mark --mark 0x64656e76 -j RETURN"
        )));
        // The input chain ends in the rejects; nothing of the allow-list is there.
        let last: Vec<&str> = s
            .lines()
            .filter(|l| l.starts_with(&format!("-A {i}")))
            .collect();
        assert!(last.last().unwrap().contains("REJECT"), "{s}");
        assert!(!s.contains("10.0.0.0/8"));
        assert!(s.ends_with("COMMIT\n"));
        let s6 = restore_script("0123abcd", &[net(Egress::Deny)], &hosts(), true);
        assert!(s6.contains("icmp6-adm-prohibited") && !s6.contains("172.18.0.1"));
    }

    #[test]
    fn allow_rejects_the_blocked_ranges_only() {
        let s = restore_script("0123abcd", &[net(Egress::Allow)], &hosts(), false);
        let o = "D0123abcd-0123456789ab-O";
        assert!(s.contains(&format!(
            "-A {o} -d 10.0.0.0/8 -p tcp -j REJECT --reject-with tcp-reset"
        )));
        assert!(s.contains(&format!("-A {o} -d 10.0.0.2 -p udp --dport 53 -j RETURN")));
        assert!(!s.contains(&format!("-A {o} -p tcp -j REJECT")), "{s}");
        assert!(!s.contains("socket"));
    }

    #[test]
    fn owner_chains_from_a_listing() {
        let l =
            "-P INPUT ACCEPT\n-N D0123abcd-FWD\n-N D0123abcd-0123456789ab-O\n-N Dffffffff-FWD\n\
                 -A D0123abcd-FWD -i dv0123456789ab -j D0123abcd-0123456789ab-O\n\
                 -A Dffffffff-FWD -i dvffffffffffff -j Dffffffff-ffffffffffff-O\n";
        assert_eq!(
            owner_chains("0123abcd", l),
            vec!["D0123abcd-FWD", "D0123abcd-0123456789ab-O"]
        );
    }
}
