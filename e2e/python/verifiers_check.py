#!/usr/bin/env python3
"""verifiers' ``SandboxEnv`` on denv (spec page ``34-blog-verifiers.md``), run with the
python of the ``vf`` venv (verifiers as published, with the denv package installed):

    DENV_SERVER=… DENV_API_KEY=… python verifiers_check.py

Two rollouts of a ``SandboxEnv`` (through :class:`denv.verifiers.DenvSandboxEnv`, and a
plain ``vf.SandboxEnv`` whose ``sandbox_client`` is replaced) against a scripted model
(``mock_openai.py``, no network LLM). The model's ``bash`` tool call writes a number
into the sandbox; the reward reads it back from the sandbox through denv before the
sandbox is destroyed. The correct rollout scores 1 and the wrong one 0; each ran in its
own denv environment, which had a TTL and is destroyed afterwards. Prints ``OK`` and
exits 0 on success.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mock_openai import MockModel  # noqa: E402

IMAGE = os.environ.get("VF_CHECK_IMAGE", "python:3.12-slim")


#: Prints the container's memory limit in bytes (cgroup v2, else v1).
MEMORY_LIMIT = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"

def policy(messages, tools):
    """First turn: call bash to write the number the question asks for, except for
    question 7 where the model writes 8 (a wrong answer). Then answer in text."""
    names = [t.get("function", {}).get("name") for t in tools]
    assert "bash" in names, f"the env offered no bash tool: {names}"
    if any(m.get("role") == "tool" for m in messages):
        return {"text": "done"}
    question = next(m["content"] for m in messages if m.get("role") == "user")
    n = int(re.search(r"Write (\d+)", str(question)).group(1))
    if n == 7:
        n = 8
    return {"tool": "bash", "args": {"command": f"mkdir -p /work && echo {n} > /work/answer.txt && id -u && cat /work/answer.txt"}}


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


async def main() -> None:
    import verifiers as vf
    from datasets import Dataset

    from denv import Client
    from denv.verifiers import DenvSandboxClient, DenvSandboxEnv

    seen: list[dict] = []

    async def post_rollout(env, state) -> None:
        sid = state["sandbox_id"]
        r = await env.sandbox_client.execute_command(sid, "cat /work/answer.txt")
        mem = await env.sandbox_client.execute_command(sid, MEMORY_LIMIT)
        info = env.sandbox_client.client.get_env(sid)
        state["denv_answer"] = r.stdout.strip()
        seen.append({"id": sid, "answer": r.stdout.strip(), "expires_at": info.expires_at,
                     "status": info.status, "memory": mem.stdout.strip()})

    async def answer_in_sandbox(state, answer, **kwargs) -> float:
        return 1.0 if state.get("denv_answer") == str(answer) else 0.0

    class OpsEnv(DenvSandboxEnv):
        async def post_rollout(self, state):
            await post_rollout(self, state)

    class PlainEnv(vf.SandboxEnv):
        async def post_rollout(self, state):
            await post_rollout(self, state)

    ds = Dataset.from_list(
        [
            {"question": "Write 42 into /work/answer.txt with the bash tool.", "answer": "42"},
            {"question": "Write 7 into /work/answer.txt with the bash tool.", "answer": "7"},
        ]
    )
    mock = MockModel(policy).start()
    os.environ["MOCK_MODEL_KEY"] = "mock"
    cfg = vf.ClientConfig(api_base_url=mock.base_url, api_key_var="MOCK_MODEL_KEY", max_retries=0)
    c = Client()
    try:
        # Each env's memory_gb (1, and SandboxEnv's default 2) is the sandbox's cap.
        for label, make, memory in (
            ("DenvSandboxEnv(sandbox_client=…)", lambda: OpsEnv(
                dataset=ds, eval_dataset=ds,
                rubric=vf.Rubric(funcs=[answer_in_sandbox]),
                sandbox_client=DenvSandboxClient(image=IMAGE),
                max_turns=4,
                memory_gb=1,
            ), str(1 << 30)),
            ("vf.SandboxEnv + env.sandbox_client", lambda: _plain(PlainEnv, ds, answer_in_sandbox, DenvSandboxClient), str(2 << 30)),
        ):
            seen.clear()
            n_req = len(mock.requests)
            t0 = time.monotonic()
            env = make()
            results = await env.evaluate(client=cfg, model="mock-model", num_examples=2, rollouts_per_example=1, max_concurrent=2)
            rewards = _rewards(results)
            print(f"  {label}: rewards {rewards} in {time.monotonic() - t0:.1f}s, sandboxes {json.dumps(seen)}")
            expect(len(mock.requests) - n_req == 4, f"{label}: model saw {len(mock.requests) - n_req} requests, want 4")
            expect(sorted(rewards) == [0.0, 1.0], f"{label}: rewards {rewards}")
            expect(sorted(s["answer"] for s in seen) == ["42", "8"], f"{label}: sandbox answers {seen}")
            ids = {s["id"] for s in seen}
            expect(len(ids) == 2 and all(i.startswith("env_") for i in ids), f"{label}: one environment per rollout: {ids}")
            expect(all(s["expires_at"] for s in seen), f"{label}: every rollout sandbox has a TTL: {seen}")
            expect(all(s["memory"] == memory for s in seen), f"{label}: memory_gb reached the cgroup ({memory}): {seen}")
            tool_out = [m for r in mock.requests[n_req:] for m in r["messages"] if m.get("role") == "tool"]
            expect(any("42" in str(m.get("content")) for m in tool_out), f"{label}: tool output {tool_out}")
            for i in ids:
                expect(_wait_destroyed(c, i), f"{label}: {i} not destroyed after the rollout")
            expect(not env.active_sandboxes, f"{label}: active sandboxes left {env.active_sandboxes}")
    finally:
        mock.stop()
    print("OK")


def _plain(cls, ds, fn, client_cls):
    import verifiers as vf

    env = cls(dataset=ds, eval_dataset=ds, rubric=vf.Rubric(funcs=[fn]), docker_image=IMAGE, max_turns=4)
    env.sandbox_client = client_cls()
    return env


def _rewards(results) -> list[float]:
    if isinstance(results, dict):
        outs = results.get("outputs") or results.get("rollouts") or []
        return [float(o["reward"]) for o in outs]
    if hasattr(results, "reward"):
        return [float(x) for x in results.reward]
    outs = getattr(results, "outputs", None) or results["outputs"]
    return [float(o["reward"]) for o in outs]


def _wait_destroyed(c, env_id: str, timeout: float = 60) -> bool:
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


if __name__ == "__main__":
    asyncio.run(main())
