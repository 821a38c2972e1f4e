#!/usr/bin/env python3
"""HUD on denv (spec page ``35-blog-hud.md``), run with the python of the ``hud``
venv (``hud`` as published, with the denv package installed):

    DENV_SERVER=… DENV_API_KEY=… python hud_check.py IMAGE

``IMAGE`` serves ``fixtures/hud-env/env.py`` (built by ``fixtures/hud-env/build.sh``).
A HUD eval with HUD's own ``OpenAIChatAgent`` against a scripted model
(``mock_openai.py``, no network LLM), placed by :class:`denv.hud.DenvRuntime`: the right
answer scores 1 and a wrong one 0, each rollout in its own sandbox with a TTL,
destroyed afterwards. Then ``fork()`` of a live endpoint (the child serves HUD's
control channel and carries the parent's ``/work``) and ``grade()`` through denv's
verify on a version whose agent service runs the HUD environment. Prints ``OK``.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mock_openai import MockModel  # noqa: E402


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def policy(messages, tools):
    prompt = " ".join(str(m.get("content")) for m in messages if m.get("role") in ("user", "system"))
    word = re.search(r"exactly the word (\w+)", prompt).group(1)
    return {"text": word if word != "wrong" else "right"}


def _destroyed(c, env_id: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if c.get_env(env_id).status == "destroyed":
                return True
        except RuntimeError as e:
            if str(e).startswith("denv 404"):
                return True
            raise
        time.sleep(0.5)
    return False


VERIFY_COMPOSE = """
x-denv:
  kind: rl-environment
  agent:
    service: hud
  verifier:
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /logs/verifier; [ \\"$(cat /submission/work/answer.txt)\\" = denv ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"]
    collect: ["/work/answer.txt"]
services:
  hud:
    image: IMAGE
    user: "1000:1000"
    environment: { HOME: /tmp }
    ports: ["8765"]
    volumes: ["work:/work"]
volumes: { work: {} }
"""


#: Prints the container's memory limit in bytes (cgroup v2, else v1).
MEMORY_LIMIT = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"

async def main(image: str) -> None:
    import hud
    from hud.agents import OpenAIChatAgent
    from hud.agents.types import OpenAIChatConfig
    from hud.clients import connect

    from denv import Client
    from denv.hud import DenvEndpoint, DenvRuntime

    sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures" / "hud-env"))
    import env as text_env  # the same env.py the image serves; here only to mint Task rows

    c = Client()
    mock = MockModel(policy).start()
    seen: list[DenvEndpoint] = []

    class Recording(DenvRuntime):
        def __call__(self, task):
            cm = super().__call__(task)

            class _Wrap:
                async def __aenter__(self_inner):
                    rt = await cm.__aenter__()
                    seen.append(rt)
                    info = c.get_env(rt.env_id)
                    expect(bool(info.expires_at), f"sandbox {rt.env_id} has no TTL")
                    return rt

                async def __aexit__(self_inner, *exc):
                    return await cm.__aexit__(*exc)

            return _Wrap()

    def agent():
        return OpenAIChatAgent(OpenAIChatConfig(model="mock-model", base_url=mock.base_url, api_key="mock"))

    try:
        t0 = time.monotonic()
        for word, want in (("denv", 1.0), ("wrong", 0.0)):
            task = text_env.say_word(word=word)
            job = await task.run(agent(), runtime=Recording(image))
            runs = list(getattr(job, "runs", None) or [])
            rewards = [r.reward for r in runs]
            print(f"  hud eval say_word({word!r}): rewards {rewards} ({time.monotonic() - t0:.1f}s)")
            expect(rewards == [want], f"say_word({word}): rewards {rewards}, want [{want}]; runs {[getattr(r, 'evaluation', None) for r in runs]}")
        expect(len(seen) == 2 and len({rt.env_id for rt in seen}) == 2, f"one sandbox per rollout: {seen}")
        for rt in seen:
            expect(rt.url.startswith("tcp://127.0.0.1:"), f"url {rt.url}")
            expect(_destroyed(c, rt.env_id), f"{rt.env_id} not destroyed after the eval")
        expect(len(mock.requests) == 2, f"model calls {len(mock.requests)}")

        # fork(): the child serves HUD's control channel and carries /work.
        task = text_env.say_word(word="denv")
        async with DenvRuntime(image, runtime_config={"resources": {"memory_mb": 300}})(task) as rt:
            mem = c.exec(rt.env_id, rt.service, ["sh", "-c", MEMORY_LIMIT], 60).stdout.strip()
            expect(mem == str(300 << 20), f"runtime_config.resources.memory_mb=300 in the cgroup: {mem!r}")
            c.put_bytes(rt.env_id, rt.service, "/work/note.txt", b"before fork")
            child = await rt.fork()
            try:
                expect(child.env_id != rt.env_id and child.url != rt.url, f"fork {child}")
                async with connect(child) as hc:
                    expect(hc.manifest is not None, "child handshake")
                expect(c.get_bytes(child.env_id, child.service, "/work/note.txt") == b"before fork", "fork carries /work")
            finally:
                await child.destroy()
            parent_id = rt.env_id
        expect(_destroyed(c, parent_id) and _destroyed(c, child.env_id), "fork and parent destroyed")
        print(f"  fork: child {child.env_id} served HUD and carried /work; memory_mb=300 reached the cgroup")

        # grade(): denv verify on a version whose agent service runs the HUD env.
        project = f"hudconf-{os.urandom(4).hex()}"
        c._call("CreateProject", {"name": project})
        dep = c._finish(c._call("Deploy", {"project": project, "env": "alpha", "compose": VERIFY_COMPOSE.replace("IMAGE", image)}), 600, "deploy")
        alpha = dep["EnvID"]
        try:
            version = c.current_version(alpha)
            grades = {}
            for word in ("denv", "wrong"):
                holder: dict = {}

                class Keep(DenvRuntime):
                    def __call__(self, task):
                        cm = super().__call__(task)

                        class _W:
                            async def __aenter__(s):
                                holder["rt"] = await cm.__aenter__()
                                return holder["rt"]

                            async def __aexit__(s, *exc):
                                holder["grade"] = await holder["rt"].grade()
                                return await cm.__aexit__(*exc)

                        return _W()

                job = await text_env.say_word(word=word).run(agent(), runtime=Keep(from_version=version, service="hud"))
                g = holder["grade"]
                grades[word] = (g.reward, [r.reward for r in job.runs])
                expect(not g.is_error and g.info.get("source") == "reward.txt", f"grade {g}")
            print(f"  grade via denv verify: {grades}")
            expect(grades["denv"] == (1.0, [1.0]) and grades["wrong"] == (0.0, [0.0]), f"grades {grades}")
        finally:
            c.destroy(alpha)
    finally:
        mock.stop()
    print("OK")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
