"""Checks on a rendered helm/denv-cp release (helm/test.sh runs it).

    python check-render.py CASE RENDERED.yaml

CASE is one of the functions below (default, replicas3_tls, existing_tls, single).
Prints one line per failed expectation and exits 1 when there is any; needs PyYAML.
"""

import base64
import sys

import yaml

PROBLEMS = []


def expect(cond, what):
    if not cond:
        PROBLEMS.append(what)
    return cond


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    return by_kind


def one(objs, kind):
    got = objs.get(kind, [])
    if not expect(len(got) == 1, f"want one {kind}, got {len(got)}"):
        return None
    return got[0]


def container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def env_of(dep):
    return {e["name"]: e for e in container(dep).get("env", [])}


def pod_labels(dep):
    return dep["spec"]["template"]["metadata"]["labels"]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def check_common(objs, replicas, scheme):
    """What every rendering has: the Deployment's shape, probes, security, Service."""
    dep = one(objs, "Deployment")
    if dep is None:
        return None
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    c = container(dep)
    expect(spec["replicas"] == replicas, f"Deployment replicas {spec['replicas']!r}, want {replicas}")
    expect(selects(spec["selector"]["matchLabels"], pod_labels(dep)), "Deployment selector does not select its pods")
    env = env_of(dep)
    drain = int(env.get("DENV_DRAIN", {}).get("value", "-1"))
    expect(drain >= 0, "no DENV_DRAIN")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    expect(grace > drain + 10, f"terminationGracePeriodSeconds {grace} not above DENV_DRAIN {drain} + 10")
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    expect(port == {scheme: 8080}, f"container ports {port}, want {{{scheme!r}: 8080}}")
    for probe in ("readinessProbe", "livenessProbe"):
        get = c.get(probe, {}).get("httpGet", {})
        expect(get.get("path") == "/health", f"{probe} path {get.get('path')!r}, want /health")
        expect(get.get("scheme") == scheme.upper(), f"{probe} scheme {get.get('scheme')!r}, want {scheme.upper()}")
        expect(get.get("port") == scheme, f"{probe} port {get.get('port')!r}, want {scheme}")
    psc, sc = pod.get("securityContext", {}), c.get("securityContext", {})
    expect(psc.get("runAsNonRoot") is True, "pod securityContext.runAsNonRoot is not true")
    expect(isinstance(psc.get("runAsUser"), int) and psc["runAsUser"] > 0, "pod securityContext.runAsUser is not a non-root uid")
    expect(sc.get("readOnlyRootFilesystem") is True, "container readOnlyRootFilesystem is not true")
    expect(sc.get("allowPrivilegeEscalation") is False, "container allowPrivilegeEscalation is not false")
    expect(sc.get("capabilities", {}).get("drop") == ["ALL"], "container capabilities.drop is not [ALL]")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    tmp = mounts.get("/tmp")
    expect(tmp is not None and "emptyDir" in vols.get(tmp["name"], {}), "no emptyDir mounted at /tmp")
    terms = (pod.get("affinity", {}).get("podAntiAffinity", {})
             .get("preferredDuringSchedulingIgnoredDuringExecution", []))
    expect(any(t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
               and selects(t["podAffinityTerm"]["labelSelector"]["matchLabels"], pod_labels(dep))
               for t in terms), "no preferred pod anti-affinity across nodes (kubernetes.io/hostname) on its own pods")
    svc = one(objs, "Service")
    if svc:
        expect(selects(svc["spec"]["selector"], pod_labels(dep)), "Service selector does not select the pods")
        expect([p["targetPort"] for p in svc["spec"]["ports"]] == [scheme], f"Service targetPort is not {scheme}")
    return dep


def check_replica_mode(objs, dep, scheme, secret, ttl, max_unavailable=1):
    env = env_of(dep)
    pod_ip = env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    expect(pod_ip == "status.podIP", f"POD_IP fieldRef {pod_ip!r}, want status.podIP")
    names = list(env)
    expect("POD_IP" in names and "DENV_REPLICA_URL" in names and names.index("POD_IP") < names.index("DENV_REPLICA_URL"),
           "POD_IP must come before DENV_REPLICA_URL (for $(POD_IP) to expand)")
    url = env.get("DENV_REPLICA_URL", {}).get("value")
    expect(url == f"{scheme}://$(POD_IP):8080", f"DENV_REPLICA_URL {url!r}, want {scheme}://$(POD_IP):8080")
    ref = env.get("DENV_REPLICA_SECRET", {}).get("valueFrom", {}).get("secretKeyRef")
    expect(ref == {"name": secret, "key": "secret"}, f"DENV_REPLICA_SECRET secretKeyRef {ref!r}, want {secret}/secret")
    got_ttl = env.get("DENV_LEASE_TTL", {}).get("value")
    expect(got_ttl == ttl, f"DENV_LEASE_TTL {got_ttl!r}, want {ttl!r}")
    strategy = dep["spec"].get("strategy", {})
    expect(strategy.get("type") == "RollingUpdate" and strategy.get("rollingUpdate", {}).get("maxUnavailable") == 0,
           f"strategy {strategy!r}, want RollingUpdate with maxUnavailable 0")
    pdb = one(objs, "PodDisruptionBudget")
    if pdb:
        expect(pdb["apiVersion"] == "policy/v1", f"PDB apiVersion {pdb['apiVersion']}")
        expect(pdb["spec"].get("maxUnavailable") == max_unavailable,
               f"PDB maxUnavailable {pdb['spec'].get('maxUnavailable')!r}, want {max_unavailable}")
        expect(selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(dep)), "PDB selector does not select the pods")


def check_tls(objs, dep, secret_name):
    env = env_of(dep)
    pod, c = dep["spec"]["template"]["spec"], container(dep)
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    tls_vols = [n for n, v in vols.items() if v.get("secret", {}).get("secretName") == secret_name]
    if not expect(len(tls_vols) == 1, f"want one volume of Secret {secret_name!r}, volumes: {list(vols)}"):
        return
    mount = [m for m in c.get("volumeMounts", []) if m["name"] == tls_vols[0]]
    if not expect(len(mount) == 1, "the TLS volume is not mounted"):
        return
    expect(mount[0].get("readOnly") is True, "the TLS volume is not mounted readOnly")
    base = mount[0]["mountPath"].rstrip("/")
    cert = env.get("DENV_TLS_CERT", {}).get("value")
    key = env.get("DENV_TLS_KEY", {}).get("value")
    expect(cert == f"{base}/tls.crt", f"DENV_TLS_CERT {cert!r}, want {base}/tls.crt")
    expect(key == f"{base}/tls.key", f"DENV_TLS_KEY {key!r}, want {base}/tls.key")


def default(objs):
    """Defaults plus replica.secretName=denv-replica: 2 replicas, replica mode, no TLS."""
    dep = check_common(objs, 2, "http")
    if dep is None:
        return
    check_replica_mode(objs, dep, "http", "denv-replica", "15s")
    env = env_of(dep)
    expect("DENV_TLS_CERT" not in env and "DENV_TLS_KEY" not in env, "TLS env without TLS values")
    expect("DENV_REPLICA_CA_FILE" not in env, "DENV_REPLICA_CA_FILE without TLS")
    expect("Secret" not in objs, "a Secret rendered without TLS values")


def replicas3_tls(objs):
    """replicaCount=3, leaseTtl=30s, tls.cert/tls.key from files: the chart's own TLS Secret."""
    dep = check_common(objs, 3, "https")
    if dep is None:
        return
    check_replica_mode(objs, dep, "https", "denv-replica", "30s")
    sec = one(objs, "Secret")
    if sec is None:
        return
    expect(sec.get("type") == "kubernetes.io/tls", f"Secret type {sec.get('type')!r}, want kubernetes.io/tls")
    data = sec.get("data", {})
    expect(set(data) == {"tls.crt", "tls.key"}, f"Secret keys {sorted(data)}, want tls.crt, tls.key")
    crt = base64.b64decode(data.get("tls.crt", "")).decode()
    expect("BEGIN CERTIFICATE" in crt, "tls.crt does not hold the certificate given")
    check_tls(objs, dep, sec["metadata"]["name"])


def existing_tls(objs):
    """tls.secretName=cp-tls, replica.caKey=ca.crt with 2 replicas: that Secret mounted,
    none rendered, the replicas trusting the CA in it."""
    dep = check_common(objs, 2, "https")
    if dep is None:
        return
    expect("Secret" not in objs, "a Secret rendered although tls.secretName names one")
    check_tls(objs, dep, "cp-tls")
    ca = env_of(dep).get("DENV_REPLICA_CA_FILE", {}).get("value")
    expect(ca == "/etc/denv/tls/ca.crt", f"DENV_REPLICA_CA_FILE {ca!r}, want /etc/denv/tls/ca.crt")


def single(objs):
    """replicaCount=1, no replica secret: one instance, no replica mode, no PDB."""
    dep = check_common(objs, 1, "http")
    if dep is None:
        return
    env = env_of(dep)
    for name in ("POD_IP", "DENV_REPLICA_URL", "DENV_REPLICA_SECRET", "DENV_LEASE_TTL"):
        expect(name not in env, f"{name} set outside replica mode")
    expect(dep["spec"].get("strategy", {}).get("type") == "Recreate", "one instance outside replica mode wants Recreate")
    expect("PodDisruptionBudget" not in objs, "a PDB for one replica (it would block node drains)")


CASES = {f.__name__: f for f in (default, replicas3_tls, existing_tls, single)}

if __name__ == "__main__":
    case, path = sys.argv[1], sys.argv[2]
    try:
        CASES[case](load(path))
    except Exception as e:  # a rendering without an expected field
        PROBLEMS.append(f"{type(e).__name__}: {e}")
    for p in PROBLEMS:
        print(p)
    if not PROBLEMS:
        print(CASES[case].__doc__)
    sys.exit(1 if PROBLEMS else 0)
