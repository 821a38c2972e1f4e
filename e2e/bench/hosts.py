"""The `hosts` benchmark step (bench.py): forks per second with three hosts vs one.

A version of a small world (busybox, one volume holding 64 MiB) is forked GROUP times at
once (`POST /v1/sandboxes` with `from_version`, each returned when healthy, then one exec
reading the volume), first with the stack's one host, then with two more `denvd` joined
to the same control plane (`start_second_denvd`: their own data directories under
$STACK_DIR, `dir` storage):
- `hosts_1_forks_per_s`: GROUP forks / wall time, one host (the baseline, same run);
- `hosts_3_first_forks_per_s`: the same with three hosts, the first group: the hosts
  without the snapshot receive it first (shipping included);
- `hosts_3_forks_per_s`: a second group on three hosts (the snapshot is cached on all);
- `hosts_3_vs_1_x`: the second figure over the baseline;
- `hosts_3_spread`: how many of the second group each host got.
On one machine the three hosts share its CPUs and its Docker engine, so this measures
the control plane's spreading and the shipping cost, not added capacity.
"""
import concurrent.futures as cf
import os
import signal
import subprocess
import time
from collections import Counter

GROUP = int(os.environ.get("BENCH_HOSTS_GROUP", "24"))


def _group(b, version, tag, n):
    def one(i):
        r = b.api("POST", "/v1/sandboxes", {"from_version": version, "name": f"h{tag}-{n}-{i}", "timeout_sec": 600})
        env = r["environment"]["ID"]
        assert b.exec_(env, "box", ["cat", "/work/seed"]).strip() == "seed", env
        return env, r["environment"].get("HostID", "")
    with cf.ThreadPoolExecutor(GROUP) as ex:
        t, got = b.timed(lambda: list(ex.map(one, range(GROUP))))
    envs = [e for e, _ in got]
    for e in envs:
        b.destroy(e)
    b.wait_all_destroyed(envs)
    return GROUP / t, Counter(h for _, h in got)


def bench_hosts(b, res, tag):
    env, _ = b.deploy(f"bench-hosts-{tag}", b.BOX)
    b.exec_(env, "box", ["sh", "-c", "echo seed > /work/seed; dd if=/dev/urandom of=/work/data bs=1M count=64 2>/dev/null; sync"])
    version = b.snapshot(env)["deployment"]["VersionID"]
    res["hosts_1_forks_per_s"], _ = _group(b, version, tag, 1)
    extra = []
    try:
        for name in ("host2", "host3"):
            extra.append(b.start_second_denvd(tag, name)[0])
        time.sleep(11)  # a full heartbeat period: both report their load to placement
        res["hosts_3_first_forks_per_s"], _ = _group(b, version, tag, 2)
        res["hosts_3_forks_per_s"], spread = _group(b, version, tag, 3)
        res["hosts_3_vs_1_x"] = res["hosts_3_forks_per_s"] / res["hosts_1_forks_per_s"]
        res["hosts_3_spread"] = " ".join(str(n) for _, n in sorted(spread.items()))
    finally:
        b.destroy(env)
        b.wait_all_destroyed([env])
        for p in extra:
            p.send_signal(signal.SIGTERM)
        for p in extra:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
