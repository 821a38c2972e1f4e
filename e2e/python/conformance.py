#!/usr/bin/env python3
"""Conformance suite of the denv Python package against a running control plane and
sidecar (spec page ``14-ref-python.md``, "Conformance suite").

    DENV_SERVER=http://127.0.0.1:8080 DENV_API_KEY=dak_… python conformance.py [CHECK...]

Checks (all by default): ``client``, ``verify``, ``inspect``, ``inspect_users``,
``inspect_compose``, ``inspect_dockerfile``, ``selfcheck``, ``harbor``, ``harbor_reuse``, ``openenv``, ``openenv_quickstart``,
``verifiers``, ``hud`` (the last two run ``verifiers_check.py`` and ``hud_check.py`` with
the ``vf`` and ``hud`` venvs' python). Each prints ``<name> PASS`` or ``<name> FAIL: <reason>`` and the last line
is ``N passed, N failed``; the exit code is non-zero on any failure. Needs the
frameworks installed (the ``py312`` venv of ``e2e/python/setup.sh``, with
``bindings/python`` installed into it) and the local images ``python:3.12-slim``,
``busybox:1.36``, ``redis:7-alpine`` and ``denv-e2e/openenv-echo:0.3.0``
(``fixtures/openenv-echo/build.sh``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
ROOT = HERE.parent.parent
WORK = ROOT / "e2e" / ".work" / "conformance"
ECHO_IMAGE = os.environ.get("OPENENV_ECHO_IMAGE", "denv-e2e/openenv-echo:0.3.0")

CHECKS: dict[str, Callable[[], None]] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def tag() -> str:
    return uuid.uuid4().hex[:8]


def wait_destroyed(client, env_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        try:
            status = client.get_env(env_id).status
        except RuntimeError as e:  # a destroyed environment may be gone entirely
            if str(e).startswith("denv 404"):
                return "destroyed"
            raise
        if status == "destroyed":
            return status
        time.sleep(0.5)
    return status


# --------------------------------------------------------------------------- client


@check
def check_client() -> None:
    """exec, files, fork carries /work, fork is isolated, errors."""
    from denv import Client

    c = Client()
    sbx = c.sandbox(image="python:3.12-slim", cmd=["sleep", "infinity"], name=f"pyconf-client-{tag()}")
    child = None
    try:
        expect(sbx.id.startswith("env_") and sbx.status == "healthy", f"sandbox {sbx}")
        r = c.exec(sbx.id, "main", ["sh", "-c", "echo out; echo err >&2; exit 3"])
        expect((r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n"), f"exec {r}")
        expect(not (r.stdout_truncated or r.stderr_truncated or r.timed_out), f"exec flags {r}")
        # The engine's exec user, working directory, stdin and environment (no shell).
        r = c.exec(sbx.id, "main", ["sh", "-c", "id -u; pwd; cat; echo \"$V\""],
                   user="nobody", cwd="/tmp", input="from stdin\n", env={"V": "a b $(x)"})
        expect(r.stdout == "65534\n/tmp\nfrom stdin\na b $(x)\n", f"exec user/cwd/input/env {r}")
        r = c.exec(sbx.id, "main", ["id", "-u"], user="root")
        expect(r.stdout == "0\n", f"exec as root {r}")
        try:
            c.exec(sbx.id, "main", ["true"], user="root;id")
            raise AssertionError("a user with a ; was accepted")
        except RuntimeError as e:
            expect(str(e).startswith("denv 400") and "is not a user" in str(e), f"bad user: {e}")
        r = c.exec(sbx.id, "main", ["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a"])
        expect(len(r.stdout) == 4 << 20 and r.stdout_truncated and set(r.stdout) == {"a"},
               f"cap reported in a field: len {len(r.stdout)} truncated {r.stdout_truncated}")
        r = c.exec(sbx.id, "main", ["sleep", "30"], timeout_sec=2)
        expect(r.timed_out and r.exit_code == 124, f"timed_out {r}")

        c.put_bytes(sbx.id, "main", "/work/a.txt", b"alpha")
        expect(c.exec(sbx.id, "main", ["cat", "/work/a.txt"]).stdout == "alpha", "put_bytes/cat")
        expect(c.get_bytes(sbx.id, "main", "/work/a.txt") == b"alpha", "get_bytes")

        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "src"
            (src / "sub").mkdir(parents=True)
            (src / "sub" / "b.txt").write_text("beta")
            (src / "c.bin").write_bytes(bytes(range(256)))
            c.put_dir(sbx.id, "main", src, "/work/tree")
            out = Path(d) / "out"
            c.get_dir(sbx.id, "main", "/work/tree", out)
            expect((out / "sub" / "b.txt").read_text() == "beta", "get_dir sub/b.txt")
            expect((out / "c.bin").read_bytes() == bytes(range(256)), "get_dir c.bin")
            c.put_file(sbx.id, "main", src / "c.bin", "/work/single.bin")
            c.get_file(sbx.id, "main", "/work/single.bin", Path(d) / "single.bin")
            expect((Path(d) / "single.bin").read_bytes() == bytes(range(256)), "put_file/get_file")
        # get_bytes returns the archive's first regular file; with none (an empty
        # directory) it raises FileNotFoundError (spec 14-ref-python.md).
        c.exec(sbx.id, "main", ["mkdir", "-p", "/work/emptydir"])
        try:
            c.get_bytes(sbx.id, "main", "/work/emptydir")
            raise AssertionError("get_bytes of an empty directory did not raise")
        except FileNotFoundError:
            pass
        except RuntimeError:
            pass  # an archive of a directory with files returns the first file; ok either way
        try:
            c.get_bytes(sbx.id, "main", "/no/such/file")
            raise AssertionError("missing file did not raise")
        except RuntimeError as e:
            expect(str(e).startswith("denv "), f"error text {e}")

        v0 = c.current_version(sbx.id)
        expect(v0.startswith("ver_"), f"current_version {v0!r}")

        # Before any snapshot the current version is the deployed one: /work was empty.
        cold = c.fork(sbx.id, live=False, name=f"pyconf-cold-{tag()}")
        try:
            r = c.exec(cold.id, "main", ["sh", "-c", "cat /work/a.txt 2>/dev/null || echo none"])
            expect(r.stdout.strip() == "none", f"live=False forks the version, not the live state: {r.stdout!r}")
        finally:
            c.destroy(cold.id)

        child = c.fork(sbx.id, name=f"pyconf-child-{tag()}")
        expect(child.id != sbx.id and child.status == "healthy", f"fork {child}")
        expect(c.exec(child.id, "main", ["cat", "/work/a.txt"]).stdout == "alpha", "fork carries /work")
        c.put_bytes(child.id, "main", "/work/a.txt", b"child")
        c.put_bytes(sbx.id, "main", "/work/b.txt", b"parent-after-fork")
        expect(c.get_bytes(sbx.id, "main", "/work/a.txt") == b"alpha", "parent unchanged by child")
        r = c.exec(child.id, "main", ["sh", "-c", "test -e /work/b.txt && echo yes || echo no"])
        expect(r.stdout.strip() == "no", "child isolated from parent")

    finally:
        if child is not None:
            c.destroy(child.id)
        c.destroy(sbx.id)
    expect(wait_destroyed(c, sbx.id) == "destroyed", "destroy")


@check
def check_promote_sheet() -> None:
    """Client.promote makes a new environment run a sandbox's version after the gates;
    Client.sheet shows the images, the egress proof and the gate record."""
    from denv import Client

    c = Client()
    sbx = c.sandbox(image="python:3.12-slim", cmd=["sleep", "infinity"], name=f"pyconf-prom-{tag()}")
    target = f"pyconf-promoted-{tag()}"
    promoted = None
    try:
        c.put_bytes(sbx.id, "main", "/work/state.txt", b"seeded")
        version = c.snapshot(sbx.id)
        project = str(sbx.raw.get("ProjectID") or "")
        final = c.promote(project, sbx.id, target)
        phases = {p["Name"]: p["Status"] for p in final["phases"]}
        expect(phases == {"gate.fork": "ok", "gate.consistency": "ok", "gate.replay": "skipped",
                          "gate.invariants": "skipped", "gate.soak": "skipped", "apply": "ok",
                          "verdict": "ok"}, f"phases {phases}")
        promoted = str(final["deployment"]["EnvID"])
        r = c.exec(promoted, "main", ["cat", "/work/state.txt"])
        expect(r.stdout == "seeded", f"the target runs the version's data: {r}")
        sheet = c.sheet(version)
        expect(sheet["version"]["id"] == version, f"sheet version {sheet['version']}")
        img = sheet["images"]["main"]
        expect(img["image"] == "python:3.12-slim" and img["image_id"].startswith("sha256:"), f"images {img}")
        expect(sheet["gates"]["status"] == "succeeded", f"gates {sheet['gates']}")
        expect(len(sheet["datasets"]) == 1, f"one volume (/work): {sheet['datasets']}")
        work = next(iter(sheet["datasets"].values()))
        expect(work["files"] == 1 and work["bytes"] == 6 and isinstance(work["files"], int), f"datasets {work}")
        expect(c.sheet(promoted)["version"]["id"] == version, "the target's sheet is the version's")
        try:
            c.promote(project, sbx.id, sbx.name)
            raise AssertionError("promoted an environment to itself")
        except RuntimeError as e:
            expect(str(e).startswith("denv 400") and "to itself" in str(e), f"self promote: {e}")
    finally:
        if promoted:
            c.destroy(promoted)
        c.destroy(sbx.id)
    expect(wait_destroyed(c, sbx.id) == "destroyed", "destroy")


# --------------------------------------------------------------------------- verify

VERIFY_COMPOSE = """
x-denv:
  kind: rl-environment
  agent:
    service: box
  verifier:
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /logs/verifier; [ \\"$(cat /submission/home/agent/answer.txt)\\" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"]
    collect: ["/home/agent/answer.txt"]
services:
  box:
    image: python:3.12-slim
    user: "1000:1000"
    command: ["sleep", "infinity"]
    environment: { HOME: /home/agent }
    volumes: ["home:/home/agent"]
volumes: { home: {} }
"""


@check
def check_verify() -> None:
    """a correct answer scores 1; a symlink and a FIFO score 0 and are refused; the
    agent stays frozen without resume."""
    from denv import Client

    c = Client()
    project = f"pyconf-verify-{tag()}"
    c._call("CreateProject", {"name": project})
    started = c._call("Deploy", {"project": project, "env": "alpha", "compose": VERIFY_COMPOSE})
    dep = c._finish(started, 600, "deploy")
    alpha = dep["EnvID"]
    version = c.current_version(alpha)
    cases = [
        ("correct", "echo 42 > /home/agent/answer.txt", 1.0, False),
        ("symlink", "ln -sf /etc/hostname /home/agent/answer.txt", 0.0, True),
        ("fifo", "mkfifo /home/agent/answer.txt", 0.0, True),
    ]
    try:
        for name, script, reward, refused in cases:
            sbx = c.sandbox(from_version=version, name=f"{project}-{name}")
            try:
                r = c.exec(sbx.id, "box", ["sh", "-c", script])
                expect(r.exit_code == 0, f"{name}: setup {r}")
                v = c.verify(sbx.id)
                expect(v.reward == reward, f"{name}: reward {v.reward} (evidence {v.evidence})")
                expect(bool(v.refused) == refused, f"{name}: refused {v.refused}")
                if refused:
                    expect(v.source == "refused", f"{name}: source {v.source}")
                    expect(any(name in x for x in v.refused), f"{name}: reason in {v.refused}")
                else:
                    expect(v.source == "reward.txt", f"{name}: source {v.source}")
                expect(v.status == "succeeded", f"{name}: status {v.status}")
                if name == "correct":
                    try:
                        c.exec(sbx.id, "box", ["true"])
                        raise AssertionError("agent not frozen after verify")
                    except RuntimeError as e:
                        expect("pause" in str(e).lower(), f"frozen agent error: {e}")
            finally:
                c.destroy(sbx.id)
        sbx = c.sandbox(from_version=version, name=f"{project}-resume")
        try:
            c.exec(sbx.id, "box", ["sh", "-c", "echo 42 > /home/agent/answer.txt"])
            v = c.verify(sbx.id, resume=True)
            expect(v.reward == 1.0, f"resume: reward {v.reward}")
            expect(c.exec(sbx.id, "box", ["true"]).exit_code == 0, "agent resumed")
        finally:
            c.destroy(sbx.id)
    finally:
        c.destroy(alpha)


# --------------------------------------------------------------------------- inspect


@check
def check_inspect() -> None:
    """an eval with mockllm/model reaches accuracy 1.0 through the entry point, and the
    sample's environment is destroyed afterwards."""
    from denv import Client

    expect("denv.inspect" not in sys.modules, "denv.inspect imported before the eval")
    sys.path.insert(0, str(FIXTURES / "inspect"))
    try:
        import marker_task
        from inspect_ai import eval as inspect_eval
    finally:
        sys.path.pop(0)
    marker_task.SEEN_ENVS.clear()
    with tempfile.TemporaryDirectory() as logs:
        [log] = inspect_eval(
            marker_task.marker_task(),
            model=marker_task.scripted_model(),
            log_dir=logs,
            display="none",
        )
        expect(log.status == "success", f"eval status {log.status}: {log.error}")
        acc = log.results.scores[0].metrics["accuracy"].value
        detail = ""
        if acc != 1.0 and log.samples:
            smp = log.samples[0]
            detail = f"; scores {smp.scores}; messages {[str(m.content)[:300] for m in smp.messages]}"
    expect(acc == 1.0, f"accuracy {acc}{detail}")
    expect("denv.inspect" in sys.modules, "provider loaded through the entry point")
    expect(len(marker_task.SEEN_ENVS) == 1 and marker_task.SEEN_ENVS[0].startswith("env_"),
           f"scorer saw {marker_task.SEEN_ENVS}")
    expect(wait_destroyed(Client(), marker_task.SEEN_ENVS[0]) == "destroyed", "sample env destroyed")


def _run_fixture_eval(task, model, **kw):
    from inspect_ai import eval as inspect_eval

    with tempfile.TemporaryDirectory() as logs:
        [log] = inspect_eval(task, model=model, log_dir=logs, display="none", **kw)
        expect(log.status == "success", f"eval status {log.status}: {str(log.error)[:3000]}")
        acc = log.results.scores[0].metrics["accuracy"].value
        detail = ""
        if acc != 1.0 and log.samples:
            smp = log.samples[0]
            detail = f"; scores {smp.scores}; messages {[str(m.content)[:300] for m in smp.messages]}"
    expect(acc == 1.0, f"accuracy {acc}{detail}")


def _ensure_nonroot_image(users_task) -> None:
    if image_present(users_task.NONROOT_IMAGE):
        return
    r = subprocess.run(
        ["docker", "build", "-q", "-t", users_task.NONROOT_IMAGE, "-"],
        input=users_task.NONROOT_DOCKERFILE, text=True, capture_output=True,
    )
    expect(r.returncode == 0, f"building {users_task.NONROOT_IMAGE}: {r.stderr[-2000:]}")


@check
def check_inspect_users() -> None:
    """on an image whose default user is uid 1000: Inspect's bash tool runs as 1000,
    its python tool built with user="root" runs as root (code through stdin), and
    sandbox().exec's user/cwd/input/env answer as the docker provider's do; the
    sandbox is the inline DenvSandboxConfig(image=...) form."""
    sys.path.insert(0, str(FIXTURES / "inspect"))
    try:
        import users_task
    finally:
        sys.path.pop(0)
    _ensure_nonroot_image(users_task)
    _run_fixture_eval(users_task.users_task(), users_task.users_model())


@check
def check_inspect_compose() -> None:
    """a task declared with sandbox=("docker", "compose.yaml") run with sandbox="denv":
    its compose file is deployed (two services, working_dir, network_mode: none), not
    dropped."""
    sys.path.insert(0, str(FIXTURES / "inspect" / "own-compose"))
    try:
        import compose_task
    finally:
        sys.path.pop(0)
    _run_fixture_eval(compose_task.compose_task(), compose_task.compose_model(), sandbox="denv")


@check
def check_inspect_dockerfile() -> None:
    """a task declared with sandbox="docker" and only a Dockerfile beside it, run with
    sandbox="denv": the Dockerfile is built on the denv host (its .dockerignore
    honoured) and the sample runs in that image."""
    sys.path.insert(0, str(FIXTURES / "inspect" / "own-dockerfile"))
    try:
        import dockerfile_task
    finally:
        sys.path.pop(0)
    _run_fixture_eval(dockerfile_task.dockerfile_task(), dockerfile_task.dockerfile_model(), sandbox="denv")


@check
def check_selfcheck() -> None:
    """Inspect's own SandboxEnvironment conformance tests (self_check.py) on a denv sandbox."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "inspect_self_check.py")],
        cwd=str(HERE),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
    print(tail)
    expect(r.returncode == 0, "self_check failures (see above)")


# --------------------------------------------------------------------------- harbor


def harbor_python() -> str:
    return sys.executable


def run_harbor_task(task: str, attempts: int = 1, path: Path | None = None) -> float | None:
    rewards = run_harbor_attempts(task, attempts, path)
    return rewards[0] if rewards else None


def run_harbor_attempts(task: str, attempts: int = 1, path: Path | None = None) -> list:
    jobs = WORK / "harbor-jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    job = f"{task}-{tag()}"
    env = {**os.environ, "HARBOR_TELEMETRY": "0", "PYTHONUNBUFFERED": "1"}
    harbor = str(Path(harbor_python()).parent / "harbor")
    cmd = [
        harbor, "run", "-p", str(path or FIXTURES / "harbor" / task), "-a", "oracle",
        "-e", "denv.harbor:DenvEnvironment", "-o", str(jobs), "--job-name", job,
        "-n", str(attempts), "-k", str(attempts), "-q", "-y",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    job_dir = jobs / job
    rewards = []
    for result in job_dir.glob("*/result.json"):
        data = json.loads(result.read_text())
        vr = data.get("verifier_result") or {}
        rw = (vr.get("rewards") or {}).get("reward")
        rewards.append(rw)
        if data.get("exception_info"):
            print(f"  {task}: trial exception: {json.dumps(data['exception_info'])[:2000]}")
    if r.returncode != 0 or not rewards:
        print((r.stdout + r.stderr)[-3000:])
    return rewards


@check
def check_harbor() -> None:
    """the oracle agent on fixture tasks (image, compose, separate verifier, and the two
    built on the host: a Dockerfile-only task and a compose task with ``build:``) scores
    1, each task unmodified."""
    def built() -> set[str]:
        out = subprocess.run(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "reference=denv-build/*"],
            capture_output=True, text=True,
        ).stdout
        return set(out.split())

    before = built()
    failures = []
    try:
        for task in ("hello-image", "hello-compose", "hello-separate", "hello-dockerfile", "hello-compose-build", "hello-users"):
            reward = run_harbor_task(task)
            print(f"  harbor {task}: reward {reward}")
            if reward != 1 and reward != 1.0:
                failures.append(f"{task}={reward}")
        new = built() - before
        print(f"  harbor: {len(new)} image(s) built on the host")
        if not failures:
            expect(len(new) >= 3, f"the Dockerfile and compose build: tasks built main, main and api: {sorted(new)}")
    finally:
        for t in sorted(built() - before):  # the images this check built
            subprocess.run(["docker", "rmi", "-f", t], capture_output=True)
    expect(not failures, f"rewards {failures}")


@check
def check_harbor_reuse() -> None:
    """``-k 3`` on one task: its definition is deployed once (one base environment
    ``harbor-base-<digest>``) and the three attempts' environments are sandboxes of
    that base's version, each scoring 1."""
    from denv import Client

    c = Client()
    with tempfile.TemporaryDirectory() as d:
        task = Path(d) / "hello-image"
        shutil.copytree(FIXTURES / "harbor" / "hello-image", task)
        # A definition no earlier run deployed (the task's env is part of it), so its
        # base is new.
        toml = (task / "task.toml").read_text()
        expect("[environment]\n" in toml, "hello-image has an [environment] table")
        (task / "task.toml").write_text(toml.replace("[environment]\n", f'[environment]\nenv = {{ DENV_NONCE = "{tag()}" }}\n', 1))

        def envs() -> list[dict]:
            try:
                return c._call("ListEnvs", {"project": "sandboxes"}).get("environments") or []
            except RuntimeError as e:  # a fresh stack has no sandboxes project yet
                if str(e).startswith("denv 404"):
                    return []
                raise

        before = {e["ID"] for e in envs()}
        t0 = time.monotonic()
        rewards = run_harbor_attempts("hello-image", 3, task)
        took = time.monotonic() - t0
        new = [e for e in envs() if e["ID"] not in before]
    bases = [e for e in new if e.get("Name", "").startswith("harbor-base-")]
    trials = [e for e in new if not e.get("Name", "").startswith("harbor-base-")]
    print(f"  harbor -k 3: rewards {rewards} in {took:.1f}s; bases {[b['Name'] for b in bases]}; "
          f"trial envs {[(t['Name'], t.get('Status')) for t in trials]}")
    expect(rewards == [1.0, 1.0, 1.0] or rewards == [1, 1, 1], f"rewards {rewards}")
    expect(len(bases) == 1, f"one base environment per task definition, got {[b['Name'] for b in bases]}")
    expect(len(trials) == 3, f"one environment per attempt, got {[t['Name'] for t in trials]}")
    base_version = bases[0].get("CurrentVersionID")
    expect(bool(base_version), f"base has no version: {bases[0]}")
    for t in trials:
        expect(t.get("ParentVersionID") == base_version,
               f"{t['Name']} comes from {t.get('ParentVersionID')!r}, not the base's version {base_version}")
    c.destroy(bases[0]["ID"])


def denv_cli(*args: str) -> str:
    """The denv CLI of this checkout (``target/debug/denv``, built by run.sh) against the
    stack of ``DENV_SERVER``/``DENV_API_KEY``; its stdout, raising with its output on
    failure."""
    binary = Path(os.environ.get("DENV_BIN_DIR", str(ROOT / "target" / "debug"))) / "denv"
    r = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"denv {' '.join(args)} exited {r.returncode}: {(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


@check
def check_harbor_export() -> None:
    """Harbor's own example-task shape (``hello-dockerfile``, built on the host) and a
    compose task (``hello-compose``: main and a redis sidecar) through ``denv import
    harbor`` (deployed as projects), then their versions through ``denv export
    --harbor``: the single-service one is pinned to the version's image id, the other is
    a compose task on pinned image ids, and the oracle agent scores 1 on each through
    ``-e denv.harbor:DenvEnvironment``."""
    from denv import Client

    c = Client()
    failures = []
    for fixture in ("hello-dockerfile", "hello-compose"):
        project = f"hx-{tag()}"
        alpha = None
        spec = {"services": []}
        try:
            with tempfile.TemporaryDirectory() as d:
                src = Path(d) / fixture
                shutil.copytree(FIXTURES / "harbor" / fixture, src)
                denv_cli("import", "harbor", "--project", project, str(src))
                envs = c._call("ListEnvs", {"project": project}).get("environments") or []
                alpha = [e for e in envs if e.get("Name") == "alpha"][0]
                version = alpha["CurrentVersionID"]
                spec = [v for v in c._call("ListVersions", {"env": alpha["ID"]})["versions"] if v["ID"] == version][0]["Spec"]
                ids = {s["name"]: s["image_id"] for s in spec["services"]}
                out = Path(d) / "dist"
                denv_cli("export", "--harbor", "--source", str(src), f"{project}@{version}", str(out))
                task = out / project
                toml = (task / "task.toml").read_text()
                if fixture == "hello-dockerfile":
                    expect(f'docker_image = "{ids["main"]}"' in toml, f"task.toml pins {ids['main']}: {toml}")
                else:
                    compose = (task / "environment" / "docker-compose.yaml").read_text()
                    expect("docker_image" not in toml and "single-container target" in toml, f"compose task: {toml}")
                    for name, image_id in ids.items():
                        expect(f"image: {image_id}" in compose, f"{name} pinned to {image_id}: {compose}")
                reward = run_harbor_task(fixture, path=task)
                print(f"  harbor exported {fixture} as {project}@{version}: reward {reward}")
                if reward not in (1, 1.0):
                    failures.append(f"{fixture}={reward}")
        finally:
            if alpha is not None:
                c.destroy(alpha["ID"])
            for s in spec["services"]:
                if s["image"].startswith("denv-build/"):
                    subprocess.run(["docker", "rmi", "-f", s["image"]], capture_output=True)
    expect(not failures, f"rewards {failures}")


# --------------------------------------------------------------------------- openenv


@check
def check_openenv() -> None:
    """python -m http.server through DenvProvider: started, ready, stopped; deny is
    refused clearly; OpenEnv's echo environment: reset, step, fork, close."""
    from denv import Client
    from denv.openenv import DenvProvider

    c = Client()
    p = DenvProvider(client=c, egress="allow")
    url = p.start_container("python:3.12-slim", port=8000, cmd=["python3", "-m", "http.server", "8000"])
    env_id = p.env_id
    try:
        expect(url.startswith("http://127.0.0.1:"), f"base_url {url}")
        p.wait_for_ready(url, timeout_s=60)
    finally:
        p.stop_container()
    expect(p.env_id is None and wait_destroyed(c, env_id) == "destroyed", "stopped")

    # Under the default egress (deny) the port is still published and serves (inbound
    # only: the environment opens no connection out).
    denied = DenvProvider(client=c)
    url = denied.start_container("python:3.12-slim", port=8000, cmd=["python3", "-m", "http.server", "8000"])
    env_id = denied.env_id
    try:
        expect(url.startswith("http://127.0.0.1:"), f"base_url under deny {url}")
        denied.wait_for_ready(url, timeout_s=60)
    finally:
        denied.stop_container()
    expect(denied.env_id is None and wait_destroyed(c, env_id) == "destroyed", "stopped (deny)")

    if not image_present(ECHO_IMAGE):
        raise AssertionError(f"{ECHO_IMAGE} missing: run e2e/python/fixtures/openenv-echo/build.sh")
    asyncio.run(_echo_roundtrip(c))


async def _echo_roundtrip(c) -> None:
    from denv.openenv import DenvProvider

    sys.path.insert(0, os.environ.get("OPENENV_ECHO_CTX", "/var/cache/denv/openenv-echo"))
    try:
        from echo_env.client import EchoEnv
        from echo_env.models import EchoAction
    finally:
        sys.path.pop(0)
    provider = DenvProvider(client=c, egress="allow")
    env = await EchoEnv.from_docker_image(ECHO_IMAGE, provider=provider)
    branch = None
    try:
        await env.reset()
        res = await env.step(EchoAction(message="hello denv"))
        expect(res.observation.echoed_message == "hello denv", f"echo {res.observation}")
        state = await env.state()
        expect(state.step_count == 1, f"state {state}")
        child = provider.fork()
        expect(child.env_id != provider.env_id and child.base_url and child.base_url != provider.base_url,
               f"fork provider {child}")
        child.wait_for_ready(child.base_url, timeout_s=60)
        branch = EchoEnv(base_url=child.base_url, provider=child)
        await branch.connect()
        res = await branch.step(EchoAction(message="from the branch"))
        expect(res.observation.echoed_message == "from the branch", "branch echo")
    finally:
        if branch is not None:
            await branch.close()
        await env.close()
    expect(provider.env_id is None, "close destroyed the environment")


@check
def check_openenv_export() -> None:
    """``denv export --openenv`` of a deployed version (the quickstart file): the
    package's Dockerfile builds on the agent service's pinned image id; its server, run
    with uvicorn, is driven through the package's own WebSocket client: ``reset`` forks
    the version, ``step`` runs a command in the fork's agent service (as its user),
    ``step(verify=True)`` scores 1 after the answer and 0 on a fresh fork without it,
    each reset destroys the previous fork and closing the session destroys the last."""
    import socket
    import urllib.request

    from denv import Client

    c = Client()
    project = f"oe-{tag()}"
    denv_cli("project", "create", project)
    denv_cli("deploy", "--project", project, "-f", str(ROOT / "e2e" / "fixtures" / "quickstart.compose.yaml"))
    alpha = [e for e in c._call("ListEnvs", {"project": project})["environments"] if e["Name"] == "alpha"][0]
    version = alpha["CurrentVersionID"]
    spec = [v for v in c._call("ListVersions", {"env": alpha["ID"]})["versions"] if v["ID"] == version][0]["Spec"]
    image_id = [s for s in spec["services"] if s["name"] == "box"][0]["image_id"]
    server = None
    try:
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "src" / "tasks" / "answer"
            src.mkdir(parents=True)
            (src / "instruction.md").write_text("Write 42 to /home/agent/answer.txt.\n")
            out = Path(d) / "dist"
            denv_cli("export", "--openenv", "--source", str(Path(d) / "src"), f"{project}@{version}", str(out))
            pkg = project.replace("-", "_") + "_env"
            dockerfile = (out / pkg / "server" / "Dockerfile").read_text()
            expect(f"\nFROM {image_id}\n" in dockerfile, f"the Dockerfile's base is {image_id}: {dockerfile}")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            log = open(Path(d) / "server.log", "w+")  # a file: a pipe nobody reads would fill
            server = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1", "--port", str(port)],
                cwd=out / pkg, stdout=log, stderr=subprocess.STDOUT, text=True,
            )
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    urllib.request.urlopen(base + "/health", timeout=2).read()
                    break
                except OSError:
                    if server.poll() is not None:
                        raise AssertionError(f"the server exited: {(Path(d) / 'server.log').read_text()}")
                    time.sleep(0.2)
            sys.path.insert(0, str(out))
            try:
                client_mod = __import__(f"{pkg}.client", fromlist=["DenvVersionEnv"])
                models = __import__(f"{pkg}.models", fromlist=["DenvAction"])
            finally:
                sys.path.pop(0)
            forks = asyncio.run(_export_roundtrip(client_mod.DenvVersionEnv, models.DenvAction, base, alpha["ID"]))
            for f in forks:
                expect(wait_destroyed(c, f) == "destroyed", f"fork {f} destroyed")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        c.destroy(alpha["ID"])


async def _export_roundtrip(Env, Action, base: str, alpha: str) -> list:
    env = Env(base_url=base)
    await env.connect()
    forks = []
    try:
        r = await env.reset()
        fork = r.observation.env_id
        forks.append(fork)
        expect(fork.startswith("env_") and fork != alpha, f"reset forked the version: {r.observation}")
        expect(r.observation.instruction == "Write 42 to /home/agent/answer.txt.\n", f"instruction {r.observation}")
        r = await env.step(Action(command=["sh", "-c", "id -u; echo 42 > /home/agent/answer.txt"]))
        expect(r.observation.exit_code == 0 and r.observation.stdout.strip() == "1000", f"exec in box: {r.observation}")
        r = await env.step(Action(verify=True))
        print(f"  openenv export: fork {fork}, verify reward {r.reward}")
        expect(r.done and r.reward == 1.0, f"verify after the answer: {r}")
        state = await env.state()
        expect(state.step_count == 2, f"state {state}")
        r = await env.reset()
        fork2 = r.observation.env_id
        forks.append(fork2)
        expect(fork2 != fork, "a new fork per reset")
        r = await env.step(Action(verify=True))
        expect(r.reward == 0.0, f"a fresh fork has no answer: {r}")
    finally:
        await env.close()
    return forks


QUICKSTART_IMAGE = "my-env:v1"
MY_ENV_SHIM = """# my_env for the OpenEnv how-to's snippets: OpenEnv's echo environment.
from echo_env.client import EchoEnv as MyEnv
from echo_env.models import EchoAction as MyAction
"""


@check
def check_openenv_quickstart() -> None:
    """the python blocks of docs/howto/openenv.md run verbatim with openenv-core as
    installed (my_env = OpenEnv's echo environment, my-env:v1 = its image), and leave
    no environment running."""
    import contextlib
    import io
    import re

    from denv import Client

    if not image_present(ECHO_IMAGE):
        raise AssertionError(f"{ECHO_IMAGE} missing: run e2e/python/fixtures/openenv-echo/build.sh")
    if not image_present(QUICKSTART_IMAGE):
        subprocess.run(["docker", "tag", ECHO_IMAGE, QUICKSTART_IMAGE], check=True)
    page = (ROOT / "docs" / "howto" / "openenv.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    expect(len(blocks) == 2, f"expected the quick-start and fork blocks, found {len(blocks)}")
    c = Client()
    before = {e["ID"] for e in c._call("ListEnvs", {"project": "sandboxes"}).get("environments", [])}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "my_env.py").write_text(MY_ENV_SHIM)
        sys.path[:0] = [d, os.environ.get("OPENENV_ECHO_CTX", "/var/cache/denv/openenv-echo")]
        try:
            for i, code in enumerate(blocks):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(code, f"docs/howto/openenv.md block {i + 1}", "exec"), {"__name__": "__main__"})
                text = out.getvalue()
                print(f"  block {i + 1}: {text.strip()[:300]}")
                want = "hello" if i == 0 else "from a branch"
                expect(text.count(want) == (1 if i == 0 else 2), f"block {i + 1} printed {text!r}")
        finally:
            del sys.path[:2]
            sys.modules.pop("my_env", None)
    after = c._call("ListEnvs", {"project": "sandboxes"}).get("environments", [])
    new = [e["ID"] for e in after if e["ID"] not in before]
    expect(new, "the snippets created no environment")
    live = [e for e in new if wait_destroyed(c, e) != "destroyed"]
    expect(not live, f"left running: {live}")


# --------------------------------------------------------------------------- verifiers, HUD

VENVS = Path(os.environ.get("DENV_VENV_DIR", "/var/cache/denv/venvs"))


def _run_in_venv(venv: str, script: str, *args: str, timeout: int = 900) -> None:
    py = VENVS / venv / "bin" / "python"
    expect(py.exists(), f"{py} missing: run e2e/python/setup.sh {venv}")
    env = {**os.environ, "HUD_TELEMETRY_ENABLED": "0", "HUD_CLI_ANALYTICS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([str(py), str(HERE / script), *args], capture_output=True, text=True, timeout=timeout, env=env)
    out = (r.stdout + r.stderr).strip()
    for line in r.stdout.splitlines():
        if line.startswith("  "):
            print(line)
    if r.returncode != 0 or not r.stdout.rstrip().endswith("OK"):
        print("\n".join(out.splitlines()[-40:]))
    expect(r.returncode == 0 and r.stdout.rstrip().endswith("OK"), f"{script} exited {r.returncode}")


@check
def check_verifiers() -> None:
    """verifiers 0.2.1's SandboxEnv (DenvSandboxEnv, and a plain SandboxEnv with its
    sandbox_client replaced) with a scripted model: the bash tool runs in a denv
    sandbox per rollout, the reward is read back through denv (1 right, 0 wrong), each
    sandbox had a TTL and is destroyed."""
    _run_in_venv("vf", "verifiers_check.py")


HUD_IMAGE = os.environ.get("HUD_ENV_IMAGE", "denv-e2e/hud-text:0.6.21")


@check
def check_hud() -> None:
    """a HUD 0.6 eval (OpenAIChatAgent, scripted model) placed by DenvRuntime: reward 1
    right, 0 wrong, one sandbox per rollout, destroyed; fork() serves HUD and carries
    /work; grade() is denv verify on a version whose agent service runs the env."""
    if not image_present(HUD_IMAGE):
        raise AssertionError(f"{HUD_IMAGE} missing: run e2e/python/fixtures/hud-env/build.sh")
    _run_in_venv("hud", "hud_check.py", HUD_IMAGE)


def image_present(image: str) -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


# --------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    names = argv or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        print(f"unknown checks: {unknown}; known: {list(CHECKS)}")
        return 2
    if not os.environ.get("DENV_API_KEY"):
        print("DENV_API_KEY is not set")
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    passed = failed = 0
    for name in names:
        t0 = time.monotonic()
        try:
            CHECKS[name]()
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            failed += 1
            traceback.print_exc()
            print(f"{name} FAIL: {e} ({time.monotonic() - t0:.1f}s)", flush=True)
        else:
            passed += 1
            print(f"{name} PASS ({time.monotonic() - t0:.1f}s)", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
