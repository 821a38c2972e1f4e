"""denv benchmarks against a running stack (DENV_SERVER, DENV_API_KEY, `denv` on PATH).

Prints medians over repeated trials, as a table, and merges them into a JSON file:
- sandbox create (image form, default egress deny, returns when healthy and proven) vs
  `docker run -d` + `docker exec` of the same image, and the egress probe's own time
  (targets: probe <= 50 ms, create <= 1.5x the docker baseline);
- fork of a version with 10 MiB / 100 MiB / 1 GiB of volume data, each next to a
  `cp -a --reflink=auto` of the same volume interleaved with the forks (target on `dir`:
  fork <= copy + 1.0 s; on btrfs/zfs 1 GiB <= 1.2x 10 MiB);
- the snapshot's frozen window (from the phase evidence) and the snapshot wall time;
- `denv verify` end to end, accepted and refused (target: refused <= 0.5 s), each next to
  the same steps by hand with the docker CLI (pause, copy out, grader run, unpause);
- 16 parallel forks of one version (a GRPO group) vs 16 fresh deploys of the same file;
- `quickfork`: a fork of the quickstart world to a usable child (an exec in `box` works and
  Postgres answers in `db`), p50, next to the same work done by hand with the docker CLI in
  the same run (reflink copy of the two volume directories, `docker network create`, two
  `docker run -d`, `pg_isready` polled every 50 ms, the same two `docker exec`s);
- `execs`: 10 concurrent `sleep 0.5` execs on one environment through the API vs 10
  concurrent `docker exec` of the same command in the same container (target <= 1.3x);
- `frozen`: the snapshot's frozen window with 1 GiB in the volume and 9 MiB changed since
  the last snapshot (target <= 300 ms on dir) vs a full `cp -a` of that 1 GiB;
- `envs`: BENCH_ENVS (default 200) live 2-service environments: the last create vs the
  10th (target <= 2x), all answering exec, denvd and denv-cp RSS (target <= 50 MiB each),
  nothing left after teardown.
- `build`: a compose `build:` deploy that builds vs the same deploy again (cache hit),
  next to `docker build` of the same Dockerfile with new content.
- `pool`: a fork of the quickstart world handed out from the warm pool (POST fork until
  the deployment is `succeeded`; and until usable: an exec in `box` and Postgres
  answering), p50, next to cold forks of the same version measured in the same run with
  the pool drained (target: hand-out <= 100 ms p50).
- `hosts`: forks per second of one version with three hosts vs one (`hosts.py`: two more
  `denvd` joined for the step; the first group on three hosts includes shipping the
  snapshot to the two new hosts).
- `ship`: 1 GiB of random data shipped host to host (`crates/denvd/benches/ship.rs`: host
  A's data port, host B's `snapshot.receive` fetching, unpacking and checking it) next to
  `tar -cf - | tar -xf -` of the same volume over the same TCP link, measured in the
  same run (target: at most 1.25x).
"""
import argparse, json, os, shutil, socket, statistics, subprocess, sys, time, concurrent.futures as cf
import urllib.request

import hosts

SERVER = os.environ["DENV_SERVER"]
KEY = os.environ["DENV_API_KEY"]
TRIALS = int(os.environ.get("BENCH_TRIALS", "5"))
SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "10,100,1024").split(",")]


def api(method, path, body=None):
    req = urllib.request.Request(SERVER + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + KEY, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)


def denv(*args):
    r = subprocess.run(["denv", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"denv {' '.join(args)}: {r.stderr or r.stdout}")
    return r.stdout


def timed(fn):
    t = time.monotonic(); v = fn(); return time.monotonic() - t, v


def destroy(env):
    api("DELETE", f"/v1/envs/{env}")


def wait_all_destroyed(envs):
    for e in envs:
        for _ in range(600):
            if api("GET", f"/v1/envs/{e}")["environment"]["Status"] == "destroyed":
                break
            time.sleep(0.2)


def exec_(env, svc, cmd):
    r = api("POST", f"/v1/envs/{env}/exec", {"service": svc, "cmd": cmd, "timeout_sec": 600})
    if r["exit_code"] != 0:
        raise RuntimeError(f"exec {cmd}: {r}")
    return r["stdout"]


def deployment(dep):
    return api("GET", f"/v1/deployments/{dep}")


def wait_dep(dep):
    """Follows the deployment (`GET /v1/deployments/{id}/events`, JSON lines) to its final state."""
    req = urllib.request.Request(SERVER + f"/v1/deployments/{dep}/events?format=jsonl",
                                 headers={"Authorization": "Bearer " + KEY})
    last = None
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            line = line.strip()
            if not line:
                continue
            last = json.loads(line)
            if "error" in last:
                raise RuntimeError(f"following {dep}: {last['error']}")
    if last is None or last["deployment"]["Status"] not in ("succeeded", "failed", "rolled_back"):
        raise RuntimeError(f"the stream of {dep} ended before a final status: {last}")
    return last


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def bench_sandbox_vs_docker(res):
    """A default (egress deny) image sandbox, returned when healthy and proven denied, vs
    `docker run -d` + `docker exec` of the same image, interleaved in the same run; and
    the egress probe's own time from the sandbox's `prepare` evidence."""
    sb, dr, probe = [], [], []
    for _ in range(TRIALS):
        t, r = timed(lambda: api("POST", "/v1/sandboxes", {"image": "python:3.12-slim", "cmd": ["sleep", "infinity"]}))
        sb.append(t)
        d = deployment(r["deployment"]["ID"])
        ev = phase(d, "prepare")["Evidence"]
        assert ev["egress"] == "denied (verified)", ev
        probe.append(ev["egress_probe"]["took_us"] / 1000.0)
        destroy(r["environment"]["ID"])

        def docker_run_exec():
            cid = subprocess.run(["docker", "run", "-d", "--rm", "python:3.12-slim", "sleep", "infinity"],
                                 check=True, capture_output=True, text=True).stdout.strip()
            subprocess.run(["docker", "exec", cid, "true"], check=True, capture_output=True)
            return cid
        t, cid = timed(docker_run_exec)
        dr.append(t)
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    res["sandbox_create_s"] = med(sb)
    res["docker_run_exec_s"] = med(dr)
    res["sandbox_vs_docker_x"] = med(sb) / med(dr)
    res["egress_probe_ms"] = med(probe)


def deploy(project, compose):
    api("POST", "/v1/projects", {"name": project})
    r = api("POST", f"/v1/projects/{project}/deploy", {"compose": compose})
    d = wait_dep(r["deployment"]["ID"])
    assert d["deployment"]["Status"] == "succeeded", d
    env = d["deployment"]["EnvID"]
    return env, d


BOX = "services:\n  box:\n    image: busybox:1.36\n    command: [\"sleep\", \"1000000\"]\n    volumes: [\"w:/work\"]\nvolumes: { w: {} }\n"


def fork(env, name):
    r = api("POST", f"/v1/envs/{env}/fork", {"name": name})
    d = wait_dep(r["deployment"]["ID"])
    assert d["deployment"]["Status"] == "succeeded", d
    return d["deployment"]["EnvID"]


def snapshot(env):
    r = api("POST", f"/v1/envs/{env}/snapshot")
    return wait_dep(r["deployment"]["ID"])


def phase(d, name):
    return [p for p in d["phases"] if p["Name"] == name][0]


def bench_fork_sizes(res, tag):
    for mib in SIZES:
        env, _ = deploy(f"bench-fork-{mib}-{tag}", BOX)
        exec_(env, "box", ["sh", "-c", f"dd if=/dev/urandom of=/work/data bs=1M count={mib} 2>/dev/null; sync"])
        t_snap, d = timed(lambda: snapshot(env))
        frozen = phase(d, "snapshot")["Evidence"].get("frozen_for")
        # The baseline, interleaved with the forks so both meet the same page cache and
        # writeback: `cp -a --reflink=auto` of the volume next to it (what a fork on
        # `dir` has to do at least; constant time where reflinks work).
        src = [m for m in json.loads(sh("docker", "inspect", f"{env.lower()}-box-1").stdout)[0]["Mounts"]
               if m["Destination"] == "/work"][0]["Source"]
        times, copies, forks = [], [], []
        for i in range(TRIALS if mib < 1024 else max(2, TRIALS // 2)):
            t, f = timed(lambda: fork(env, f"f{i}"))
            times.append(t); forks.append(f)
            dst = os.path.join(os.path.dirname(src), f".bench-copy-{os.getpid()}-{i}")
            t, _ = timed(lambda: sh("cp", "-a", "--reflink=auto", src, dst))
            copies.append(t)
            shutil.rmtree(dst)
        res[f"fork_{mib}MiB_s"] = med(times)
        res[f"copy_{mib}MiB_s"] = med(copies)
        res[f"fork_{mib}MiB_minus_copy_s"] = med(times) - med(copies)
        res[f"snapshot_{mib}MiB_s"] = t_snap
        res[f"snapshot_{mib}MiB_frozen_ms"] = frozen
        for f in forks:
            destroy(f)
        destroy(env)
        wait_all_destroyed(forks + [env])


QUICK = open(os.path.join(os.path.dirname(__file__), "..", "fixtures", "quickstart.compose.yaml")).read()


def by_hand_verify(env, grade):
    """The same steps with the docker CLI: pause the agent, copy the answer out, (grade:
    run the grader image over the copy, read-only), unpause."""
    box = f"{env.lower()}-box-1"
    tmp = subprocess.run(["mktemp", "-d"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["docker", "pause", box], check=True, capture_output=True)
    subprocess.run(["docker", "cp", f"{box}:/home/agent/answer.txt", f"{tmp}/answer.txt"], check=True, capture_output=True)
    if grade:
        out = subprocess.run(["docker", "run", "--rm", "-v", f"{tmp}:/submission:ro", "busybox:1.36",
                              "sh", "-c", "[ \"$(cat /submission/answer.txt)\" = 42 ] && echo 1 || echo 0"],
                             check=True, capture_output=True, text=True).stdout.strip()
        assert out == "1", out
    subprocess.run(["docker", "unpause", box], check=True, capture_output=True)
    subprocess.run(["rm", "-rf", tmp], check=True)


def bench_verify(res, tag):
    """`denv verify --resume` end to end (accepted: collect, snapshot, fork, grade;
    refused: a symlinked answer, decided at collect) next to the same steps by hand with
    the docker CLI in the same run (target: refused <= 0.5 s)."""
    env, _ = deploy(f"bench-verify-{tag}", QUICK)
    exec_(env, "box", ["sh", "-c", "echo 42 > /home/agent/answer.txt"])
    ts, hand, phases = [], [], {}
    for _ in range(TRIALS):
        t, d = timed(lambda: wait_dep(api("POST", f"/v1/envs/{env}/verify", {"resume": True})["deployment"]["ID"]))
        assert phase(d, "verdict")["Evidence"]["reward"] == 1, d
        ts.append(t)
        for p in d["phases"]:
            phases.setdefault(p["Name"], []).append(phase_ms(d, p["Name"]))
        hand.append(timed(lambda: by_hand_verify(env, True))[0])
    res["verify_s"] = med(ts)
    res["verify_by_hand_docker_s"] = med(hand)
    # Where an accepted verify's time goes: each phase's median.
    for name, xs in phases.items():
        res[f"verify_phase_{name}_ms"] = med(xs)
    exec_(env, "box", ["sh", "-c", "mv /home/agent/answer.txt /home/agent/real; ln -s /etc/passwd /home/agent/answer.txt"])
    ts, hand = [], []
    for _ in range(TRIALS):
        t, d = timed(lambda: wait_dep(api("POST", f"/v1/envs/{env}/verify", {"resume": True})["deployment"]["ID"]))
        ev = phase(d, "verdict")["Evidence"]
        assert ev["reward"] == 0 and ev["source"] == "refused", ev
        assert phase(d, "snapshot")["Status"] == "skipped", d
        ts.append(t)
        hand.append(timed(lambda: by_hand_verify(env, False))[0])
    res["verify_refused_s"] = med(ts)
    res["verify_refused_by_hand_docker_s"] = med(hand)
    destroy(env)
    wait_all_destroyed([env])


def bench_group(res, tag):
    """A GRPO group: 16 forks of the quickstart world at once, each to a usable child,
    next to the same 16 forks by hand with the docker CLI, also at once."""
    env, _ = deploy(f"bench-group-{tag}", QUICK)
    exec_(env, "db", ["psql", "-U", "postgres", "-c", "create table t(x int); insert into t values (1)"])
    snapshot(env)
    base, src = by_hand_source(env, f"group-{tag}")
    def ours_one(i):
        f = fork(env, f"g{i}")
        usable(f)
        return f
    with cf.ThreadPoolExecutor(16) as ex:
        t, forks = timed(lambda: list(ex.map(ours_one, range(16))))
    res["16_parallel_forks_s"] = t
    for f in forks:
        destroy(f)
    wait_all_destroyed(forks)
    names = [f"denv-bench-group-{os.getpid()}-{i}" for i in range(16)]
    try:
        with cf.ThreadPoolExecutor(16) as ex:
            t, _ = timed(lambda: list(ex.map(lambda n: by_hand_fork(base, src, n), names)))
        res["16_parallel_forks_by_hand_docker_s"] = t
        res["16_parallel_forks_vs_docker_x"] = res["16_parallel_forks_s"] / t
    finally:
        for n in names:
            by_hand_cleanup(base, n)
        sh("rm", "-rf", base, check=False)
    def fresh(i):
        return deploy(f"bench-fresh-{tag}-{i}", QUICK)[0]
    with cf.ThreadPoolExecutor(16) as ex:
        t, envs = timed(lambda: list(ex.map(fresh, range(16))))
    res["16_fresh_deploys_s"] = t
    for e in envs + [env]:
        destroy(e)
    wait_all_destroyed(envs + [env])


def p50(xs):
    return statistics.median(xs) if xs else float("nan")


DENVD_LOG = os.path.join(os.environ.get("STACK_DIR", "/nonexistent"), "denvd.log")


def log_offset():
    """Where denvd's log ends now (the stack writes it to $STACK_DIR/denvd.log)."""
    return os.path.getsize(DENVD_LOG) if os.path.exists(DENVD_LOG) else 0


def fork_steps(since, res, prefix):
    """Median time of each step of the forks logged by denvd after byte `since`, from its
    timed progress lines: `cloned N volume(s) in X ms`, `starting services (Y ms for
    images, datasets, network and containers)`, `<svc> started in A ms`, `<svc> ready B
    ms after its start`. Written as `<prefix>_<step>_ms`."""
    import re
    steps = {}
    with open(DENVD_LOG, "rb") as f:
        f.seek(since)
        text = f.read().decode("utf-8", "replace")
    for pat, key in ((r"cloned \d+ volume\(s\) in (\d+) ms", "clone"),
                     (r"starting services \((\d+) ms for", "prepare"),
                     (r"denvd::runtime: (\w[\w.-]*) started in (\d+) ms", "start_{}"),
                     (r"denvd::runtime: (\w[\w.-]*) ready (\d+) ms after its start", "ready_{}")):
        for m in re.finditer(pat, text):
            k = key.format(m.group(1)) if "{}" in key else key
            steps.setdefault(k, []).append(int(m.groups()[-1]))
    for k, xs in sorted(steps.items()):
        res[f"{prefix}_{k}_ms"] = p50(xs)


def phase_ms(d, name):
    """A phase's duration in ms from its StartedAt/FinishedAt (RFC 3339, ms)."""
    from datetime import datetime
    p = phase(d, name)
    if not p.get("StartedAt") or not p.get("FinishedAt"):
        return float("nan")
    f = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))
    return (f(p["FinishedAt"]) - f(p["StartedAt"])).total_seconds() * 1000.0


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def usable(env):
    """The child is usable: an exec in the agent box works and Postgres answers."""
    assert exec_(env, "box", ["true"]) == ""
    assert exec_(env, "db", ["psql", "-U", "postgres", "-tAc", "select count(*) from t"]).strip() == "1"


def by_hand_source(env, tag):
    """The by-hand baseline's source for forks of the quickstart world `env`: the volume
    contents of a fork of it, copied once (on the stack's own file system). Returns
    (base directory, source directory); the fork is destroyed."""
    data = open(os.path.join(os.environ["STACK_DIR"], "data-path")).read().strip()
    base = os.path.join(data, f"bench-by-hand-{tag}")
    os.makedirs(base, exist_ok=True)
    src = os.path.join(base, "src")
    first = fork(env, f"src-{tag}")
    usable(first)
    lc = first.lower()
    sh("docker", "pause", f"{lc}-db-1", f"{lc}-box-1")
    for vol, ctr in (("pg", "db"), ("home", "box")):
        mnt = [m for m in json.loads(sh("docker", "inspect", f"{lc}-{ctr}-1").stdout)[0]["Mounts"] if m["Type"] == "bind"][0]
        os.makedirs(src, exist_ok=True)
        sh("cp", "-a", "--reflink=auto", mnt["Source"], os.path.join(src, vol))
    sh("docker", "unpause", f"{lc}-db-1", f"{lc}-box-1")
    destroy(first)
    wait_all_destroyed([first])
    return base, src


def by_hand_fork(base, src, name):
    """What a fork of the quickstart world is, with the docker CLI: copy (reflink) both
    volumes, a network, the two containers, then wait until an exec in the box works and
    Postgres answers the query."""
    dst = os.path.join(base, name)
    os.makedirs(dst)
    for vol in ("pg", "home"):
        sh("cp", "-a", "--reflink=auto", os.path.join(src, vol), os.path.join(dst, vol))
    sh("docker", "network", "create", name)
    sh("docker", "run", "-d", "--name", f"{name}-db", "--network", name, "--network-alias", "db",
       "-e", "POSTGRES_PASSWORD=world", "-v", f"{dst}/pg:/var/lib/postgresql/data", "postgres:16-alpine")
    sh("docker", "run", "-d", "--name", f"{name}-box", "--network", name, "--user", "1000:1000",
       "-e", "HOME=/home/agent", "-v", f"{dst}/home:/home/agent", "python:3.12-slim", "sleep", "infinity")
    while sh("docker", "exec", f"{name}-db", "pg_isready", "-U", "postgres", check=False).returncode != 0:
        time.sleep(0.05)
    sh("docker", "exec", f"{name}-box", "true")
    # pg_isready can answer before the server accepts queries: retry the query like a user would.
    for _ in range(200):
        r = sh("docker", "exec", f"{name}-db", "psql", "-U", "postgres", "-tAc", "select count(*) from t", check=False)
        if r.returncode == 0:
            assert r.stdout.strip() == "1", r.stdout
            return
        time.sleep(0.05)
    raise RuntimeError("by-hand postgres never answered")


def by_hand_cleanup(base, name):
    sh("docker", "rm", "-f", f"{name}-db", f"{name}-box", check=False)
    sh("docker", "network", "rm", name, check=False)
    sh("rm", "-rf", os.path.join(base, name), check=False)


def bench_quickfork(res, tag):
    """Fork of the quickstart world to a usable child vs the docker CLI by hand."""
    env, _ = deploy(f"bench-qf-{tag}", QUICK)
    exec_(env, "db", ["psql", "-U", "postgres", "-c", "create table t(x int); insert into t values (1)"])
    snapshot(env)
    base, src = by_hand_source(env, f"qf-{tag}")
    ours, hand, forks = [], [], []
    since = log_offset()
    for i in range(TRIALS):
        def ours_once():
            f = fork(env, f"qf{i}")
            usable(f)
            return f
        t, f = timed(ours_once)
        ours.append(t); forks.append(f)
        name = f"denv-bench-hand-{os.getpid()}-{i}"
        try:
            t, _ = timed(lambda: by_hand_fork(base, src, name))
            hand.append(t)
        finally:
            by_hand_cleanup(base, name)
    sh("rm", "-rf", base, check=False)
    res["quickstart_fork_usable_p50_s"] = p50(ours)
    res["quickstart_fork_by_hand_docker_p50_s"] = p50(hand)
    res["quickstart_fork_vs_docker_x"] = p50(ours) / p50(hand)
    # Where a fork's time goes (denvd's timed progress lines of the forks above).
    fork_steps(since, res, "quickstart_fork")
    for f in forks:
        destroy(f)
    destroy(env)
    wait_all_destroyed(forks + [env])


def fork_final(env, body):
    """POST fork, then poll only when the 202 is not final yet (a warm hand-out is)."""
    r = api("POST", f"/v1/envs/{env}/fork", body)
    if r["deployment"]["Status"] not in ("succeeded", "failed", "rolled_back"):
        r = wait_dep(r["deployment"]["ID"])
    assert r["deployment"]["Status"] == "succeeded", r
    return r


def pool_members(project, version, healthy_only=True):
    envs = api("GET", f"/v1/projects/{project}/envs")["environments"]
    return [e for e in envs if e["Stage"] == "pool" and e["Status"] != "destroyed"
            and (not healthy_only or (e["Status"] == "healthy" and e["ParentVersionID"] == version))]


def wait_pool(project, version, n):
    for _ in range(3000):
        if len(pool_members(project, version)) >= n and len(pool_members(project, version, False)) == n:
            return
        time.sleep(0.1)
    raise RuntimeError(f"pool of {version} never reached {n}")


def bench_pool(res, tag):
    """Warm pool hand-out vs cold fork of the same version, same run (target <= 100 ms)."""
    project = f"bench-pool-{tag}"
    env, d = deploy(project, QUICK)
    exec_(env, "db", ["psql", "-U", "postgres", "-c", "create table t(x int); insert into t values (1)"])
    version = snapshot(env)["deployment"]["VersionID"]
    forks, hot, hot_usable, cold, cold_usable = [], [], [], [], []
    # Pool of one: each hand-out is measured with the pool refilled and idle.
    first = fork_final(env, {"name": "pool-on", "pool": 1})
    forks.append(first["deployment"]["EnvID"])
    for i in range(TRIALS):
        wait_pool(project, version, 1)
        t0 = time.monotonic()
        r = fork_final(env, {"name": f"hot{i}"})
        t1 = time.monotonic()
        f = r["deployment"]["EnvID"]
        usable(f)
        t2 = time.monotonic()
        assert r["deployment"]["Params"].get("pool") == "hit", r["deployment"]
        hot.append(t1 - t0); hot_usable.append(t2 - t0); forks.append(f)
    # The baseline: the pool off (drained), cold forks of the same version.
    wait_pool(project, version, 1)
    forks.append(fork_final(env, {"name": "pool-off", "pool": 0})["deployment"]["EnvID"])
    for _ in range(3000):
        if not pool_members(project, version, False):
            break
        time.sleep(0.1)
    for i in range(TRIALS):
        t0 = time.monotonic()
        r = fork_final(env, {"name": f"cold{i}"})
        t1 = time.monotonic()
        f = r["deployment"]["EnvID"]
        usable(f)
        t2 = time.monotonic()
        assert r["deployment"]["Params"].get("pool") is None, r["deployment"]
        cold.append(t1 - t0); cold_usable.append(t2 - t0); forks.append(f)
    res["pool_handout_p50_ms"] = p50(hot) * 1000
    res["pool_cold_fork_p50_ms"] = p50(cold) * 1000
    res["pool_handout_usable_p50_ms"] = p50(hot_usable) * 1000
    res["pool_cold_fork_usable_p50_ms"] = p50(cold_usable) * 1000
    res["pool_handout_vs_cold_x"] = p50(hot) / p50(cold)
    for f in forks:
        destroy(f)
    destroy(env)
    wait_all_destroyed(forks + [env])


def bench_execs(res, tag):
    """10 concurrent `sleep 0.5` execs on one environment vs 10 concurrent `docker exec`."""
    env, _ = deploy(f"bench-ex-{tag}", BOX)
    ctr = f"{env.lower()}-box-1"
    ours, theirs = [], []
    for _ in range(TRIALS):
        with cf.ThreadPoolExecutor(10) as ex:
            t, _ = timed(lambda: list(ex.map(lambda i: exec_(env, "box", ["sleep", "0.5"]), range(10))))
        ours.append(t)
        with cf.ThreadPoolExecutor(10) as ex:
            t, _ = timed(lambda: list(ex.map(lambda i: sh("docker", "exec", ctr, "sleep", "0.5"), range(10))))
        theirs.append(t)
    res["10_concurrent_execs_s"] = p50(ours)
    res["10_concurrent_docker_execs_s"] = p50(theirs)
    res["10_concurrent_execs_vs_docker_x"] = p50(ours) / p50(theirs)
    destroy(env)
    wait_all_destroyed([env])


def bench_frozen(res, tag):
    """The snapshot's frozen window with 1 GiB in a volume and under 10 MiB changed since the
    last snapshot (target <= 300 ms on dir), next to the time to copy that 1 GiB in full
    (`cp -a --reflink=auto` of the volume on the same file system, what the frozen window
    cost before the pre-copy). Changes older than the pre-copy's 5 s margin are kept out of
    the frozen window, so each trial waits 6 s, then changes 9 MiB (8 MiB rewritten in
    place in one file, 1 MiB in a new file, one file deleted) and snapshots."""
    env, _ = deploy(f"bench-frozen-{tag}", BOX)
    exec_(env, "box", ["sh", "-c", "for i in $(seq 0 63); do dd if=/dev/urandom of=/work/f$i bs=1M count=16 2>/dev/null; done; sync"])
    src = [m for m in json.loads(sh("docker", "inspect", f"{env.lower()}-box-1").stdout)[0]["Mounts"]
           if m["Destination"] == "/work"][0]["Source"]
    copies = []
    for i in range(3):
        dst = os.path.join(os.path.dirname(src), f".bench-copy-{os.getpid()}-{i}")
        t, _ = timed(lambda: sh("cp", "-a", "--reflink=auto", src, dst))
        copies.append(t)
        shutil.rmtree(dst)
    d = snapshot(env)
    assert d["deployment"]["Status"] == "succeeded", d
    frozen, walls = [], []
    for i in range(TRIALS):
        time.sleep(6)
        exec_(env, "box", ["sh", "-c", f"dd if=/dev/urandom of=/work/f{i} bs=1M count=8 conv=notrunc 2>/dev/null; "
                                       f"dd if=/dev/urandom of=/work/new{i} bs=1M count=1 2>/dev/null; rm -f /work/f{63 - i}; sync"])
        t, d = timed(lambda: snapshot(env))
        assert d["deployment"]["Status"] == "succeeded", d
        frozen.append(phase(d, "snapshot")["Evidence"]["frozen_for"])
        walls.append(t)
    res["full_copy_1GiB_ms"] = p50(copies) * 1000
    res["snapshot_1GiB_9MiB_changed_frozen_ms"] = p50(frozen)
    res["snapshot_1GiB_9MiB_changed_frozen_max_ms"] = max(frozen)
    res["snapshot_1GiB_9MiB_changed_wall_s"] = p50(walls)
    destroy(env)
    wait_all_destroyed([env])


ENVS = int(os.environ.get("BENCH_ENVS", "200"))
TWO = ("services:\n  db:\n    image: redis:7-alpine\n    volumes: [\"d:/data\"]\n"
       "  box:\n    image: busybox:1.36\n    command: [\"sleep\", \"1000000\"]\n    volumes: [\"w:/work\"]\n"
       "volumes: { d: {}, w: {} }\n")


def rss_mib(pid_file):
    pid = open(os.path.join(os.environ["STACK_DIR"], pid_file)).read().strip()
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_envs(res, tag):
    """BENCH_ENVS (default 200) live 2-service environments (redis with a volume, busybox
    with a volume), created one after another: each create's time, the 10th next to the
    last (target last <= 2x the 10th), every environment answering an exec in both services,
    denvd and denv-cp RSS before and with all of them (target <= 50 MiB each), then all
    destroyed and nothing of them left (containers, networks, data directories)."""
    rss0 = {"denvd": rss_mib("denvd.pid"), "denv-cp": rss_mib("cp.pid")}
    api("POST", "/v1/projects", {"name": f"bench-envs-{tag}"})
    times, envs = [], []
    for i in range(ENVS):
        def create():
            r = api("POST", f"/v1/projects/bench-envs-{tag}/deploy", {"env": f"e{i:03d}", "compose": TWO})
            return wait_dep(r["deployment"]["ID"])
        t, d = timed(create)
        assert d["deployment"]["Status"] == "succeeded", d
        times.append(t); envs.append(d["deployment"]["EnvID"])
        if (i + 1) % 10 == 0:
            print(f"  {i + 1} environments, last create {t:.2f}s, denvd {rss_mib('denvd.pid'):.0f} MiB, "
                  f"denv-cp {rss_mib('cp.pid'):.0f} MiB", file=sys.stderr, flush=True)
    t_exec, answered = timed(lambda: sum(1 for e in envs for svc in ("db", "box")
                                         if api("POST", f"/v1/envs/{e}/exec", {"service": svc, "cmd": ["true"]})["exit_code"] == 0))
    rss1 = {"denvd": rss_mib("denvd.pid"), "denv-cp": rss_mib("cp.pid")}
    res["envs"] = ENVS
    res["envs_create_10th_s"] = times[min(9, ENVS - 1)]
    res["envs_create_last_s"] = times[-1]
    res["envs_create_last_vs_10th_x"] = times[-1] / times[min(9, ENVS - 1)]
    res["envs_create_p50_first10_s"] = p50(times[:10])
    res["envs_create_p50_last10_s"] = p50(times[-10:])
    res["envs_exec_answered"] = f"{answered}/{2 * ENVS}"
    res["envs_exec_all_s"] = t_exec
    res["envs_denvd_rss_before_mib"] = rss0["denvd"]
    res["envs_denvd_rss_mib"] = rss1["denvd"]
    res["envs_cp_rss_before_mib"] = rss0["denv-cp"]
    res["envs_cp_rss_mib"] = rss1["denv-cp"]
    t_down, _ = timed(lambda: ([destroy(e) for e in envs], wait_all_destroyed(envs)))
    data = open(os.path.join(os.environ["STACK_DIR"], "data-path")).read().strip()
    res["envs_teardown_s"] = t_down
    left = [e for e in envs
            if sh("docker", "ps", "-aq", "--filter", f"label=denv.env={e}").stdout.strip()
            or sh("docker", "network", "ls", "-q", "--filter", f"name={e.lower()}_").stdout.strip()
            or any(os.path.exists(os.path.join(data, sub, e)) for sub in ("envs", "snaps"))]
    res["envs_left_after_teardown"] = len(left)
    assert answered == 2 * ENVS, f"only {answered} of {2 * ENVS} services answered"
    assert not left, f"left on the engine after teardown: {left[:5]}"


def bench_build(res, tag):
    """`build`: a compose `build:` service deployed twice (REST, the context as a tar):
    the first deploy builds (the build's own time from `prepare` evidence, and the
    deploy's wall time), the second reuses `denv-build/<key>` (cache hit); next to
    `docker build` of the same Dockerfile with new file content, in the same run."""
    import base64, io, tarfile, tempfile, uuid
    df = "FROM python:3.12-slim\nWORKDIR /app\nCOPY . /app\nRUN python3 -c 'print(1)' > /app/out\n"
    cold, warm, cold_wall, warm_wall, docker_b = [], [], [], [], []
    api("POST", "/v1/projects", {"name": f"bench-build-{tag}"})
    for i in range(TRIALS):
        nonce = uuid.uuid4().hex
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, data in (("Dockerfile", df.encode()), ("n.txt", nonce.encode())):
                ti = tarfile.TarInfo(name); ti.size = len(data); tf.addfile(ti, io.BytesIO(data))
        body = {"compose": "services:\n  main:\n    build: .\n    command: [sleep, infinity]\n",
                "env": f"b{i}", "contexts": {".": base64.b64encode(buf.getvalue()).decode()}}
        tags = []
        for cached, walls, builds in ((False, cold_wall, cold), (True, warm_wall, warm)):
            t, r = timed(lambda: wait_dep(api("POST", f"/v1/projects/bench-build-{tag}/deploy", body)["deployment"]["ID"]))
            assert r["deployment"]["Status"] == "succeeded", r
            b = phase(r, "prepare")["Evidence"]["builds"]["main"]
            assert b["cached"] is cached, b
            walls.append(t); builds.append(b["took_ms"]); tags.append(b["tag"])
        destroy(r["deployment"]["EnvID"])
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "Dockerfile"), "w").write(df)
            open(os.path.join(d, "n.txt"), "w").write(uuid.uuid4().hex)
            t, _ = timed(lambda: sh("docker", "build", "-q", "-t", f"denv-bench-build:{nonce}", d))
            docker_b.append(t)
        sh("docker", "rmi", "-f", f"denv-bench-build:{nonce}", tags[0], check=False)
    res["build_cold_ms"] = med(cold)
    res["build_cached_ms"] = med(warm)
    res["docker_build_s"] = med(docker_b)
    res["build_deploy_cold_s"] = med(cold_wall)
    res["build_deploy_cached_s"] = med(warm_wall)
    res["build_cold_vs_docker_x"] = med(cold) / 1000.0 / med(docker_b)


def machine():
    load = open("/proc/loadavg").read().split()[:3]
    return {"cpus": os.cpu_count(), "load_avg_at_start": " ".join(load),
            "memory_mb": int(open("/proc/meminfo").readline().split()[1]) // 1024,
            "kernel": os.uname().release}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_second_denvd(tag, name="host2"):
    """One more `denvd` joined to the stack (data under $STACK_DIR/<name>-<tag>); returns
    (process, host id) once it is connected and has reported its load."""
    before = {h["ID"] for h in api("GET", "/v1/hosts")["hosts"]}
    token = json.loads(denv("host", "join-token"))["token"]
    d = os.path.join(os.environ["STACK_DIR"], f"{name}-{tag}")
    os.makedirs(d, exist_ok=True)
    p = subprocess.Popen(["denvd", "join", "--server", SERVER, "--token", token, "--state", f"{d}/host.json",
                          "--data", f"{d}/data", "--data-addr", f"127.0.0.1:{free_port()}"],
                         stdout=subprocess.DEVNULL, stderr=open(f"{d}/denvd.log", "w"))
    for _ in range(300):
        new = [h for h in api("GET", "/v1/hosts")["hosts"] if h["ID"] not in before and h.get("connected")]
        if new:
            time.sleep(2)  # its first load report
            return p, new[0]["ID"]
        time.sleep(0.2)
    p.kill()
    raise RuntimeError(f"the denvd {name} did not connect")


def bench_ship(res, tag):
    """Host to host: `crates/denvd/benches/ship.rs` (two sidecar runtimes, host A's data
    port, host B's `snapshot.receive`) against `tar | tar` over the same TCP link, in the
    same run; its figures are merged into the results."""
    mib = os.environ.get("BENCH_SHIP_MIB", "1024")
    out = os.path.join(os.environ.get("STACK_DIR", "/tmp"), f"ship-{tag}.json")
    env = dict(os.environ, DENV_BENCH_SHIP_MIB=mib, DENV_BENCH_SHIP_JSON=out,
               DENV_BENCH_SHIP_TRIALS=os.environ.get("BENCH_SHIP_TRIALS", "3"))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    r = subprocess.run(["cargo", "bench", "-q", "-p", "denvd", "--bench", "ship"], cwd=root, env=env,
                       capture_output=True, text=True)
    print(r.stdout, file=sys.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"cargo bench ship: {r.stderr[-500:]}")
    res.update(json.load(open(out)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--storage", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    tag = a.storage
    res = {"machine": machine(), "trials": TRIALS}
    if a.only and os.path.exists(a.out):
        # Only some steps run: the other steps' figures of this backend are kept, and each
        # step run says when and on what it was measured (`<step>_machine`).
        kept = json.load(open(a.out)).get(tag, {})
        res = {k: v for k, v in kept.items() if k not in ("machine", "trials")} | {"trials": TRIALS}
    steps = [("quickfork", lambda r: bench_quickfork(r, tag)), ("execs", lambda r: bench_execs(r, tag)),
             ("sandbox", bench_sandbox_vs_docker), ("fork", lambda r: bench_fork_sizes(r, tag)),
             ("verify", lambda r: bench_verify(r, tag)), ("group", lambda r: bench_group(r, tag)),
             ("frozen", lambda r: bench_frozen(r, tag)), ("envs", lambda r: bench_envs(r, tag)),
             ("build", lambda r: bench_build(r, tag)),
             ("pool", lambda r: bench_pool(r, tag)), ("ship", lambda r: bench_ship(r, tag)),
             ("hosts", lambda r: hosts.bench_hosts(sys.modules[__name__], r, tag))]
    failed = []
    for name, fn in steps:
        if a.only and name not in a.only.split(","):
            continue
        print(f"[{tag}] {name} ...", file=sys.stderr, flush=True)
        if a.only:
            res[f"{name}_machine"] = dict(machine(), date=time.strftime("%Y-%m-%d"))
        # A step that fails is recorded as `<step>_error` and the others still run; the
        # results so far are written after every step, so an interrupted run keeps them.
        try:
            fn(res)
        except Exception as e:  # noqa: BLE001 - any failure of a step is its result
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            failed.append(name)
            print(f"[{tag}] {name} failed: {res[name + '_error']}", file=sys.stderr, flush=True)
        allres = json.load(open(a.out)) if os.path.exists(a.out) else {}
        allres[tag] = res
        json.dump(allres, open(a.out, "w"), indent=2)
    print(f"\n{'benchmark (' + tag + ', median of ' + str(TRIALS) + ')':<44} {'value':>12}")
    for k, v in res.items():
        if k in ("machine", "trials") or isinstance(v, dict):
            print(f"{k:<44} {v}")
            continue
        unit = "/s" if k.endswith("_per_s") else "ms" if k.endswith("_ms") else "x" if k.endswith("_x") else "MiB" if k.endswith("_mib") else "" if k in ("envs", "envs_left_after_teardown") else "s"
        if isinstance(v, int) and not unit:
            print(f"{k:<44} {v:>12}")
            continue
        print(f"{k:<44} {v if v is not None else float('nan'):>11.3f}{unit}" if isinstance(v, (int, float)) else f"{k:<44} {v!s:>12}")
    if failed:
        print(f"failed steps: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
