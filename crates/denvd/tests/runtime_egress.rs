//! Egress that means what it says (spec `19-ref-protections.md` §5): denvd's nftables
//! policy per environment network, seen from inside an agent box, and its proof.
//!
//! No packet leaves the machine: every target is an address of this host, of its
//! bridges, of the canary's namespace, or a metadata/public address that the policy
//! rejects locally (the probe only tries the public one after everything else was
//! rejected).

mod runtime_support;

use denv_compose::{Egress, Service};
use denvd::runtime::{bridge_name, container_name, network_name, Runtime, RuntimeConfig};
use runtime_support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, UdpSocket};
use std::time::Duration;

/// Runs in the box (python): each `[kind, name, host, port]` target is tried once
/// (`tcp`: connect with a 3 s timeout, then read a line; `udp`: a connected datagram and
/// a reply within 0.3 s; `dns`: getaddrinfo), printed as `{name: [result, ms]}`.
const PROBE_PY: &str = r#"
import json, socket, sys, time
out = {}
for kind, name, host, port in json.loads(sys.argv[1]):
    t = time.monotonic()
    try:
        if kind == "tcp":
            s = socket.create_connection((host, port), timeout=3)
            s.settimeout(1)
            try:
                data = s.recv(64).decode(errors="replace").strip()
            except OSError:
                data = ""
            s.close()
            r = "connected:" + data
        elif kind == "udp":
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(0.3)
            s.connect((host, port))
            s.send(b"x")
            s.recv(64)
            r = "answered"
        else:
            r = "resolved:" + socket.getaddrinfo(host, 80, proto=socket.IPPROTO_TCP)[0][4][0]
    except socket.gaierror as e:
        r = "gaierror:%s" % e.args[0]
    except OSError as e:
        r = "%s:%s" % (type(e).__name__, e.errno)
    out[name] = [r, round((time.monotonic() - t) * 1000, 1)]
print(json.dumps(out))
"#;

/// `{name: (result, ms)}` of [`PROBE_PY`] run in `service` of `env`.
async fn probe_from(
    rt: &Runtime,
    env: &str,
    service: &str,
    targets: &[(&str, String, String, u16)],
) -> BTreeMap<String, (String, f64)> {
    let t: Vec<Value> = targets
        .iter()
        .map(|(k, n, h, p)| serde_json::json!([k, n, h, p]))
        .collect();
    let arg = serde_json::to_string(&t).unwrap();
    let out = sh(
        rt,
        env,
        service,
        &format!("python3 -c '{PROBE_PY}' '{arg}'"),
    )
    .await;
    let v: BTreeMap<String, (String, f64)> =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    v
}

/// Every non-loopback, non-link-local address of the host.
fn host_addresses() -> Vec<(String, IpAddr)> {
    let out = std::process::Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .expect("ip addr");
    let mut v = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() < 4 || !(w[2] == "inet" || w[2] == "inet6") {
            continue;
        }
        let ip: IpAddr = w[3].split('/').next().unwrap().parse().unwrap();
        let skip = match ip {
            IpAddr::V4(a) => a.is_loopback(),
            IpAddr::V6(a) => a.is_loopback() || (a.segments()[0] & 0xffc0) == 0xfe80,
        };
        if !skip {
            v.push((w[1].to_string(), ip));
        }
    }
    v
}

fn web(port: u16, body: &str) -> Service {
    let mut w = svc("web", BUSYBOX);
    w.command = argv(&[
        "sh",
        "-c",
        &format!(
            "mkdir -p /www && echo {body} > /www/index.html && exec httpd -f -p {port} -h /www"
        ),
    ]);
    w.ports = vec![port];
    w
}

fn box_() -> Service {
    let mut b = svc("box", PYTHON);
    b.command = argv(&["sleep", "3600"]);
    b
}

async fn container_ip(rt: &Runtime, env: &str, service: &str) -> String {
    let c = rt
        .docker()
        .inspect_container(&container_name(env, service), None)
        .await
        .unwrap();
    c.network_settings.unwrap().networks.unwrap()[&network_name(env)]
        .ip_address
        .clone()
        .unwrap()
}

async fn gateway(rt: &Runtime, env: &str) -> String {
    rt.docker()
        .inspect_network::<String>(&network_name(env), None)
        .await
        .unwrap()
        .ipam
        .unwrap()
        .config
        .unwrap()[0]
        .gateway
        .clone()
        .unwrap()
}

fn http_get(addr: &str) -> String {
    let mut body = String::new();
    for _ in 0..50 {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            let _ = s.read_to_string(&mut body);
            if !body.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    body
}

/// A refusal, not a timeout: errno 111 (refused: the policy's reset), 113 (no route to
/// host), 101 or 99 (network unreachable, address not available: IPv6 on an IPv4-only
/// network), well under the 3 s timeout. For UDP: no answer (the policy's ICMP is rate-limited, so a timeout is
/// fine); that nothing arrived is checked on the listener.
fn assert_stopped_at_once(res: &BTreeMap<String, (String, f64)>, name: &str) {
    let (r, ms) = &res[name];
    if name.starts_with("host udp") {
        assert_ne!(r, "answered", "{name}");
        return;
    }
    let ok = ["ConnectionRefusedError:111", ":113", ":101", ":99"]
        .iter()
        .any(|e| r.ends_with(e));
    assert!(
        ok,
        "{name}: expected an immediate refusal, got {r} after {ms} ms"
    );
    assert!(*ms < 500.0, "{name}: {r} took {ms} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, nftables and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn deny_and_allow_mean_what_they_say() {
    let (rt, _t) = runtime("dir").await;
    // The packet filter in use, as the host reports it.
    let pf = rt.capabilities().await.packet_filter;
    let want = if on_iptables() {
        "iptables v"
    } else {
        "nftables v"
    };
    assert!(pf.starts_with(want), "packet_filter {pf:?}");
    let denied = env_id("deny");
    let allowed = env_id("allow");
    let _c = Cleanup(vec![denied.clone(), allowed.clone()]);
    let (p, mut rx) = progress();

    // Listeners on every host address (dual stack), TCP and UDP.
    let tcp = TcpListener::bind("[::]:0").unwrap();
    let tport = tcp.local_addr().unwrap().port();
    let udp = UdpSocket::bind("0.0.0.0:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let uport = udp.local_addr().unwrap().port();

    let d = rt
        .create(
            &denied,
            &spec(vec![web(8080, "hello-denied"), box_()], &[], Egress::Deny),
            &p,
        )
        .await
        .expect("create deny");
    let a = rt
        .create(
            &allowed,
            &spec(vec![web(8080, "hello-allowed"), box_()], &[], Egress::Allow),
            &p,
        )
        .await
        .expect("create allow");
    assert_eq!(d.egress, "denied (verified)");
    assert_eq!(a.egress, "allowed");
    let lines = drain(&mut rx);
    assert!(lines
        .iter()
        .any(|l| l == "healthy; egress denied (verified)"));
    assert!(
        lines.iter().any(|l| l.starts_with("egress probe: ")),
        "{lines:?}"
    );

    // The proof: in the namespace, milliseconds, every attempt stopped (deny); the
    // canary reached and the host stopped (allow).
    let pr = &d.egress_probe;
    assert!(pr.took_us < 50_000, "probe took {} µs", pr.took_us);
    assert!(pr.from.starts_with("box (pid ") || pr.from.starts_with("web (pid "));
    for t in ["canary", "metadata", "public"] {
        assert!(pr.attempts.iter().any(|a| a.target == t), "{pr:?}");
    }
    let gw = gateway(&rt, &denied).await;
    let sentinel = rt.sentinel_port().await.unwrap();
    assert!(
        pr.attempts.iter().any(|a| a.target.starts_with("host")
            && a.addr == format!("{gw}:{sentinel}")
            && a.result == "refused (connection refused)"),
        "the env's own gateway is tried on the sentinel: {pr:?}"
    );
    let stopped = |r: &str| {
        r.starts_with("refused") || r.starts_with("rejected") || r.starts_with("unreachable")
    };
    for at in &pr.attempts {
        assert!(stopped(&at.result), "{at:?}");
        assert!(at.took_us < 100_000, "{at:?}");
    }
    let pa = &a.egress_probe;
    let canary = pa.attempts.iter().find(|a| a.target == "canary").unwrap();
    assert_eq!(canary.result, "connected");
    assert!(pa.attempts.iter().all(|a| a.target != "public"));
    assert!(pa
        .attempts
        .iter()
        .filter(|a| a.target != "canary")
        .all(|a| stopped(&a.result)));

    // Published ports work under both, from the host.
    for (c, body) in [(&d, "hello-denied"), (&a, "hello-allowed")] {
        let ep = c.endpoints.get("web").expect("endpoint").clone();
        assert!(ep.starts_with("127.0.0.1:"), "{ep}");
        assert!(http_get(&ep).contains(body), "{ep}");
    }

    // Under deny, the containers' DNS server is the gateway (denvd's refuser).
    let hc = rt
        .docker()
        .inspect_container(&container_name(&denied, "box"), None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(hc.dns, Some(vec![gw.clone()]));

    let canary = rt.canary_addr().await.unwrap();
    let other_web_allowed = container_ip(&rt, &allowed, "web").await;
    let other_web_denied = container_ip(&rt, &denied, "web").await;
    let mut targets: Vec<(&str, String, String, u16)> = vec![
        ("tcp", "own web".into(), "web".into(), 8080),
        ("dns", "own name".into(), "web".into(), 0),
        (
            "dns",
            "outside name".into(),
            "denv-egress-test.example.com".into(),
            0,
        ),
        (
            "tcp",
            "canary".into(),
            canary.ip().to_string(),
            canary.port(),
        ),
        ("tcp", "metadata".into(), "169.254.169.254".into(), 80),
    ];
    for (iface, ip) in host_addresses() {
        targets.push((
            "tcp",
            format!("host tcp {iface} {ip}"),
            ip.to_string(),
            tport,
        ));
        if ip.is_ipv4() {
            targets.push((
                "udp",
                format!("host udp {iface} {ip}"),
                ip.to_string(),
                uport,
            ));
        }
    }

    // From the denied box: its own services only.
    let mut t = targets.clone();
    t.push(("tcp", "other env".into(), other_web_allowed.clone(), 8080));
    let res = probe_from(&rt, &denied, "box", &t).await;
    assert!(res["own web"].0.starts_with("connected"), "{res:?}");
    assert!(res["own name"].0.starts_with("resolved:"), "{res:?}");
    let (r, ms) = &res["outside name"];
    assert!(r.starts_with("gaierror"), "outside name: {r}");
    assert!(*ms < 500.0, "outside lookup took {ms} ms");
    for name in t.iter().map(|x| x.1.as_str()) {
        if !name.starts_with("own") && name != "outside name" {
            assert_stopped_at_once(&res, name);
        }
    }
    // ICMP too.
    let ping = rt
        .exec(
            &denied,
            "web",
            &argv(&["ping", "-c", "1", "-W", "2", &gw]),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_ne!(ping.exit_code, 0, "ping of the gateway: {}", ping.stdout);
    // Nothing arrived on the host's UDP listener.
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram reached the host"
    );

    // From the allowed box: the canary answers; the host and other envs do not.
    let mut t: Vec<_> = targets
        .iter()
        .filter(|x| x.0 != "dns" || x.1 == "own name")
        .cloned()
        .collect();
    t.push(("tcp", "other env".into(), other_web_denied.clone(), 8080));
    let res = probe_from(&rt, &allowed, "box", &t).await;
    assert!(res["own web"].0.starts_with("connected"), "{res:?}");
    assert!(res["own name"].0.starts_with("resolved:"), "{res:?}");
    assert_eq!(res["canary"].0, "connected:denv-canary-ok", "{res:?}");
    for name in t.iter().map(|x| x.1.as_str()) {
        if !name.starts_with("own") && name != "canary" {
            assert_stopped_at_once(&res, name);
        }
    }
    drop(tcp);

    rt.destroy(&denied).await.unwrap();
    rt.destroy(&allowed).await.unwrap();
    // The policy goes with the network (and the runtime's table with its last policy).
    assert!(!has_chain(&rt, &bridge_name(&denied)));
    assert!(
        !any_rules_left(&rt),
        "the runtime's rules outlived its last network"
    );
}

/// The rules are denvd's truth about its host: lost (reboot, flushed ruleset), they are
/// back when a runtime starts on the same data directory, before anything is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, nftables and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn policy_is_back_when_denvd_starts() {
    let (rt, tmp) = runtime("dir").await;
    let env = env_id("back");
    let _c = Cleanup(vec![env.clone()]);
    let (p, _rx) = progress();
    rt.create(&env, &spec(vec![box_()], &[], Egress::Deny), &p)
        .await
        .expect("create");
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let gw = gateway(&rt, &env).await;
    let t = [("tcp", "gateway".to_string(), gw.clone(), port)];
    let res = probe_from(&rt, &env, "box", &t).await;
    assert_stopped_at_once(&res, "gateway");

    // The rules vanish (as after a reboot): the host is reachable, which shows what
    // the rules were holding back.
    let b = bridge_name(&env);
    drop_policy(&rt, &b);
    let res = probe_from(&rt, &env, "box", &t).await;
    assert!(res["gateway"].0.starts_with("connected"), "{res:?}");

    // A fresh runtime on the same data directory (what `kill -9` + restart does).
    drop(rt);
    let mut cfg = RuntimeConfig::new(tmp.path().join("data"));
    cfg.egress_probe_ports = vec![port];
    let rt = Runtime::new(cfg).await.expect("runtime");
    assert!(has_chain(&rt, &b));
    let res = probe_from(&rt, &env, "box", &t).await;
    assert_stopped_at_once(&res, "gateway");
    let pr = rt.probe_env(&env).await.expect("probe after restart");
    assert_eq!(pr.egress, "denied (verified)");
    assert!(pr
        .attempts
        .iter()
        .any(|a| a.addr == format!("{gw}:{port}") && a.result.starts_with("refused")));
    rt.destroy(&env).await.unwrap();
}

/// Whether the tests run on the iptables backend (`DENV_PACKET_FILTER=iptables`).
fn on_iptables() -> bool {
    std::env::var("DENV_PACKET_FILTER").as_deref() == Ok("iptables")
}

/// Whether the runtime's packet filter holds the output chain of `bridge`, read from
/// `nft` or `iptables` (not from the runtime).
fn has_chain(rt: &Runtime, bridge: &str) -> bool {
    let args: Vec<String> = if on_iptables() {
        let h = bridge.strip_prefix("dv").unwrap();
        ["iptables", "-w", "-S", &format!("D{}-{h}-O", rt.owner())]
            .map(String::from)
            .to_vec()
    } else {
        let t = rt.nft_table();
        [
            "nft",
            "list",
            "chain",
            "inet",
            &t,
            &format!("env_{bridge}_out"),
        ]
        .map(String::from)
        .to_vec()
    };
    std::process::Command::new(&args[0])
        .args(&args[1..])
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap()
        .status
        .success()
}

/// Whether anything of the runtime's rules is left in the packet filter.
fn any_rules_left(rt: &Runtime) -> bool {
    let (cmd, needle) = if on_iptables() {
        (["iptables", "-w", "-S"], format!("D{}-", rt.owner()))
    } else {
        (
            ["nft", "list", "ruleset"],
            format!("table inet {}", rt.nft_table()),
        )
    };
    let out = std::process::Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains(&needle)
}

/// Removes one bridge's policy by hand (as a reboot or a flushed ruleset would).
fn drop_policy(rt: &Runtime, bridge: &str) {
    if on_iptables() {
        let h = bridge.strip_prefix("dv").unwrap();
        let o = rt.owner();
        for bin in ["iptables", "ip6tables"] {
            let script = format!(
                "{bin} -w -D D{o}-FWD -i {bridge} -j D{o}-{h}-O; \
                 {bin} -w -D D{o}-IN -i {bridge} -j D{o}-{h}-I; \
                 {bin} -w -F D{o}-{h}-O && {bin} -w -X D{o}-{h}-O && \
                 {bin} -w -F D{o}-{h}-I && {bin} -w -X D{o}-{h}-I"
            );
            let st = std::process::Command::new("sh")
                .args(["-c", &script])
                .status()
                .unwrap();
            assert!(st.success(), "{script}");
        }
        return;
    }
    let t = rt.nft_table();
    let script = format!(
        "delete element inet {t} env_fwd {{ \"{bridge}\" }}\n\
         delete element inet {t} env_in {{ \"{bridge}\" }}\n\
         delete chain inet {t} env_{bridge}_out\n\
         delete chain inet {t} env_{bridge}_in\n"
    );
    let mut c = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success());
}

/// Two denvd instances on one host (other data directories, as several e2e stacks or a
/// test's private engine): each owns its rules, and one's reconcile at start leaves the
/// other's alone, even though the other's networks are on the engine it sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, nftables and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_reconcile_keeps_to_its_own_rules() {
    let (a, ta) = runtime("dir").await;
    let (b, _tb) = runtime("dir").await;
    assert_ne!(a.owner(), b.owner());
    let ea = env_id("owna");
    let eb = env_id("ownb");
    let _c = Cleanup(vec![ea.clone(), eb.clone()]);
    let (p, _rx) = progress();
    let sp = spec(vec![box_()], &[], Egress::Deny);
    a.create(&ea, &sp, &p).await.expect("create a");
    b.create(&eb, &sp, &p).await.expect("create b");
    let (ba, bb) = (bridge_name(&ea), bridge_name(&eb));
    assert!(has_chain(&a, &ba) && has_chain(&b, &bb));
    assert!(!has_chain(&a, &bb) && !has_chain(&b, &ba));

    // A's runtime starts again (kill -9 + restart) and reconciles: B's rules stay.
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    drop(a);
    let a = Runtime::new(RuntimeConfig::new(ta.path().join("data")))
        .await
        .expect("runtime a again");
    assert!(has_chain(&a, &ba), "A's own rules are back");
    assert!(has_chain(&b, &bb), "A's reconcile removed B's rules");
    assert_eq!(a.reconcile_network_policy().await.unwrap(), 1);
    assert!(has_chain(&b, &bb));
    let gw = gateway(&b, &eb).await;
    let t = [("tcp", "gateway".to_string(), gw, port)];
    let res = probe_from(&b, &eb, "box", &t).await;
    assert_stopped_at_once(&res, "gateway");

    // Destroying A's environment removes A's table, not B's.
    a.destroy(&ea).await.unwrap();
    assert!(!has_chain(&a, &ba));
    assert!(has_chain(&b, &bb));
    let res = probe_from(&b, &eb, "box", &t).await;
    assert_stopped_at_once(&res, "gateway");
    b.destroy(&eb).await.unwrap();
    assert!(!any_rules_left(&a) && !any_rules_left(&b));
    // A runtime with no environment holds no rules at all.
    let (c, _tc) = runtime("dir").await;
    assert!(!any_rules_left(&c), "an idle runtime left rules");
}

/// While denvd is down (its runtime gone, as after `kill -9`), a denied box's lookups
/// still fail at once and its own names still resolve: the refuser on the gateway is a
/// process of its own. It goes when the environment's network goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, nftables and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn lookups_fail_at_once_while_denvd_is_down() {
    let (rt, tmp) = runtime("dir").await;
    let env = env_id("down");
    let _c = Cleanup(vec![env.clone()]);
    let (p, _rx) = progress();
    rt.create(
        &env,
        &spec(vec![box_(), web(8080, "own")], &[], Egress::Deny),
        &p,
    )
    .await
    .expect("create");
    let b = bridge_name(&env);
    let gw: std::net::Ipv4Addr = gateway(&rt, &env).await.parse().unwrap();
    let pid = denvd::runtime::refuser::running(&b, gw).expect("a refuser runs");
    drop(rt);
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the refuser went with the runtime"
    );
    let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let arg = serde_json::json!([
        ["dns", "outside", "denv-egress-test.example.com", 0],
        ["dns", "outside tld", "example.org", 0],
        ["dns", "own name", "web", 0],
        ["tcp", "gateway", gw.to_string(), port],
    ])
    .to_string();
    let out = std::process::Command::new("docker")
        .args([
            "exec",
            &container_name(&env, "box"),
            "python3",
            "-c",
            PROBE_PY,
            &arg,
        ])
        .output()
        .unwrap();
    let res: BTreeMap<String, (String, f64)> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    for name in ["outside", "outside tld"] {
        let (r, ms) = &res[name];
        assert!(r.starts_with("gaierror"), "{name}: {r}");
        assert!(
            *ms < 500.0,
            "{name}: the lookup took {ms} ms with denvd down"
        );
    }
    assert!(res["own name"].0.starts_with("resolved:"), "{res:?}");
    assert_stopped_at_once(&res, "gateway");

    // denvd back, the environment destroyed: the refuser goes with the network.
    let rt = Runtime::new(RuntimeConfig::new(tmp.path().join("data")))
        .await
        .expect("runtime again");
    assert_eq!(
        denvd::runtime::refuser::running(&b, gw),
        Some(pid),
        "a restarted denvd starts no second refuser"
    );
    rt.destroy(&env).await.unwrap();
    for _ in 0..40 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the refuser outlived its network"
    );
}

/// A probe that cannot run fails the create and stops the stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, nftables and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn a_probe_that_cannot_run_stops_the_stack() {
    require_docker();
    let tmp = tempfile::Builder::new()
        .prefix("denvd-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut cfg = RuntimeConfig::new(tmp.path().join("data"));
    cfg.egress_probe_target = "http://names-are-never-resolved.example/".into();
    let rt = Runtime::new(cfg).await.expect("runtime");
    let env = env_id("noprobe");
    let _c = Cleanup(vec![env.clone()]);
    let (p, _rx) = progress();
    let e = rt
        .create(
            &env,
            &spec(vec![svc("box", BUSYBOX)], &[], Egress::Deny),
            &p,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("egress probe failed to run: "), "{e}");
    let st = rt
        .docker()
        .inspect_container(&container_name(&env, "box"), None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert_ne!(st.running, Some(true), "the stack was left running");
    rt.destroy(&env).await.unwrap();
}

/// Many denied environments created at once: each proven, none waiting on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Docker, nftables and the stand-in images (./e2e/setup-host.sh); run with --include-ignored"]
async fn parallel_denied_creates_are_each_proven() {
    let (rt, _t) = runtime("dir").await;
    let envs: Vec<String> = (0..4).map(|i| env_id(&format!("par{i}"))).collect();
    let _c = Cleanup(envs.clone());
    let (p, _rx) = progress();
    let sp = spec(vec![svc("box", BUSYBOX)], &[], Egress::Deny);
    let t0 = std::time::Instant::now();
    let rs = futures::future::join_all(envs.iter().map(|e| rt.create(e, &sp, &p))).await;
    let took = t0.elapsed();
    for r in rs {
        let r = r.expect("create");
        assert_eq!(r.egress, "denied (verified)");
        assert!(
            r.egress_probe.took_us < 50_000,
            "{}",
            r.egress_probe.took_us
        );
    }
    assert!(took < Duration::from_secs(30), "4 creates took {took:?}");
    for e in &envs {
        rt.destroy(e).await.unwrap();
    }
}
