"""Inspect's own ``self_check.py`` on :class:`denv.inspect.DenvSandbox`, carried over the
Docker CLI instead of a denv server.

This runs every exec and tar path of the adapter (argv as given, ``timeout`` wrapping,
the exec user and working directory, stdin, large command lines, read/write errors)
against a real container of the local ``python:3.12-slim`` image. The transport below
does what the sidecar does for ``exec``/``put``/``get`` (``docker exec`` with
``--user``/``--workdir``/``--env``/``-i``, archive copy in and out, ``mkdir -p`` first). Skipped without Docker or the image; the same checks against
a real server are ``e2e/python/conformance.py selfcheck``.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.util._sandbox.self_check import *  # noqa: E402,F403

from denv.client import ExecResult  # noqa: E402
from denv.inspect import DenvSandbox  # noqa: E402

IMAGE = "python:3.12-slim"


def _docker_ok() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not _docker_ok(), reason=f"needs docker and the {IMAGE} image"),
]

XFAIL = {
    "test_write_text_file_without_permissions": "default user is root; root ignores -w",
    "test_write_binary_file_without_permissions": "default user is root; root ignores -w",
}


class DockerTransport:
    """The four client calls the adapter makes, done with the Docker CLI."""

    def __init__(self, container: str) -> None:
        self.container = container

    def exec(
        self,
        env_id: str,
        service: str,
        argv: list[str],
        timeout_sec: int = 120,
        *,
        user=None,
        cwd=None,
        input=None,
        env=None,
    ) -> ExecResult:
        flags: list[str] = []
        if user:
            flags += ["--user", str(user)]
        if cwd:
            flags += ["--workdir", cwd]
        for k, v in (env or {}).items():
            flags += ["--env", f"{k}={v}"]
        data = input.encode("utf-8") if isinstance(input, str) else input
        if data:
            flags.append("-i")
        try:
            r = subprocess.run(
                ["docker", "exec", *flags, self.container, *argv],
                capture_output=True,
                timeout=timeout_sec,
                input=data or None,
            )
        except subprocess.TimeoutExpired:
            return ExecResult(124, "", f"denvd: command timed out after {timeout_sec}s", timed_out=True)
        cap = 4 << 20
        return ExecResult(
            r.returncode,
            r.stdout[:cap].decode("utf-8", "replace"),
            r.stderr[:cap].decode("utf-8", "replace"),
            stdout_truncated=len(r.stdout) > cap,
            stderr_truncated=len(r.stderr) > cap,
        )

    def put_tar(self, env_id: str, service: str, path: str, tar_bytes: bytes) -> None:
        subprocess.run(["docker", "exec", self.container, "mkdir", "-p", path], check=True)
        subprocess.run(["docker", "cp", "-", f"{self.container}:{path}"], input=tar_bytes, check=True, capture_output=True)

    def get_tar(self, env_id: str, service: str, path: str) -> bytes:
        r = subprocess.run(["docker", "cp", f"{self.container}:{path}", "-"], capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"denv 502: {service}: {path}: no such file or directory")
        return r.stdout

    def destroy(self, env_id: str) -> None:
        subprocess.run(["docker", "rm", "-f", self.container], capture_output=True)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def _box(anyio_backend):
    name = f"denvpy-selfcheck-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "run", "-d", "--name", name, IMAGE, "sleep", "infinity"], check=True, capture_output=True)
    transport = DockerTransport(name)
    sbx = DenvSandbox(transport, "env_docker", "main")  # type: ignore[arg-type]
    try:
        await sbx._init_working_dir()
        yield sbx
    finally:
        transport.destroy("env_docker")


@pytest.fixture
async def sandbox_env(request, _box):
    reason = XFAIL.get(request.node.originalname)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    yield _box
