"""A denv sandbox client for verifiers' ``SandboxEnv`` (spec page
``34-blog-verifiers.md``, "Path 2").

verifiers' ``SandboxEnv`` (checked with verifiers 0.2.1 and prime-sandboxes 0.2.36;
0.3.x's cannot be constructed since it needs prime-sandboxes >= 0.2.39, which refuses
its string ``start_command``; 0.4.0 removed it) builds Prime's sandbox client in its constructor and calls
``create``, ``wait_for_creation``, ``execute_command``, ``delete``, ``bulk_delete`` and
``teardown`` on its ``sandbox_client`` attribute. :class:`DenvSandboxClient` has those
methods (and ``upload_file``, ``download_file``, ``read_file``, ``run_background_job``
that verifiers' sandbox mixin uses), so a ``SandboxEnv`` runs on denv by replacing that
attribute::

    env = vf.load_environment("my-sandbox-env")           # any SandboxEnv subclass
    env.sandbox_client = DenvSandboxClient(from_version="ver_01…")

or, since ``SandboxEnv`` itself takes no ``sandbox_client`` argument, with the
subclass :class:`DenvSandboxEnv`, which does::

    env = DenvSandboxEnv(sandbox_client=DenvSandboxClient(image="python:3.12-slim"), ...)

Each rollout gets its own denv environment (``create``), destroyed by the
``@vf.cleanup`` hook (``delete``) or, if the trainer dies first, by its TTL.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from denv.client import ROLLOUT_TTL_SEC, Client, shell_command

__all__ = ["DenvSandboxClient", "DenvSandboxEnv", "DenvSandbox", "CommandResult", "FileContent"]

#: Service commands run in for image sandboxes.
MAIN_SERVICE = "main"


@dataclass
class DenvSandbox:
    """What ``create`` returns: ``id`` is the denv environment id (``env_…``)."""

    id: str
    name: str
    status: str
    expires_at: str = ""


@dataclass
class CommandResult:
    """Prime's ``CommandResponse`` shape: ``stdout``, ``stderr``, ``exit_code``."""

    stdout: str
    stderr: str
    exit_code: int


@dataclass
class FileContent:
    """Prime's ``ReadFileResponse`` shape as verifiers reads it: ``content``."""

    content: str


def _timeout_error(sandbox_id: str, command: str, timeout: int) -> Exception:
    """Prime's ``CommandTimeoutError`` when ``prime_sandboxes`` is installed (verifiers
    catches that type), else ``TimeoutError``."""
    try:
        from prime_sandboxes import CommandTimeoutError

        return CommandTimeoutError(sandbox_id, command, timeout)
    except ImportError:
        return TimeoutError(f"Command {command!r} timed out after {timeout}s in sandbox {sandbox_id}")


def _field(req: Any, name: str) -> Any:
    if isinstance(req, Mapping):
        return req.get(name)
    return getattr(req, name, None)


def request_resources(req: Any) -> dict[str, Any]:
    """The denv caps of a Prime ``CreateSandboxRequest``: ``cpu_cores`` → ``cpus``,
    ``memory_gb`` → ``memory`` and ``disk_size_gb`` → ``disk`` (in MiB, ``"<n>m"``),
    each only when set and positive.

    Raises:
        ValueError: ``gpu_count`` above 0 (denv has no GPU passthrough yet).
    """
    gpus = _field(req, "gpu_count")
    if gpus:
        raise ValueError(f"denv: gpu_count={gpus} is not supported (no GPU passthrough)")
    out: dict[str, Any] = {}
    cpus = _field(req, "cpu_cores")
    if cpus:
        out["cpus"] = float(cpus)
    for key, field in (("memory", "memory_gb"), ("disk", "disk_size_gb")):
        gb = _field(req, field)
        if gb:
            out[key] = f"{max(1, round(float(gb) * 1024))}m"
    return out


class DenvSandboxClient:
    """Prime's ``AsyncSandboxClient`` surface, backed by denv. All methods are
    coroutines running the synchronous :class:`~denv.Client` in a worker thread.

    Args:
        image: the image of every sandbox; default: the request's ``docker_image``.
        from_version: fork this version (``ver_…``) for every rollout instead; the
            request's image and start command are then ignored.
        service: the service commands run in (default ``main``; name the agent's
            service for a version whose compose file calls it otherwise).
        egress: ``deny`` (default) or ``allow``.
        ttl_sec: each sandbox's TTL in seconds; default: the request's
            ``timeout_minutes`` (Prime's lifetime of a sandbox) when set, else 7200.
            ``None`` with no ``timeout_minutes``: no TTL.
        volumes: persisted paths of image sandboxes (default ``["/work"]``).
        client: a :class:`~denv.Client` (else one from ``DENV_SERVER``/``DENV_API_KEY``).

    Raises:
        ValueError: both ``image`` and ``from_version``.
        RuntimeError: ``DENV_API_KEY is not set``.
    """

    def __init__(
        self,
        *,
        image: str | None = None,
        from_version: str | None = None,
        service: str | None = None,
        egress: str = "deny",
        ttl_sec: float | None = ROLLOUT_TTL_SEC,
        volumes: Sequence[str] | None = None,
        client: Client | None = None,
    ) -> None:
        if image and from_version:
            raise ValueError("give image or from_version, not both")
        self.client = client or Client()
        self.image = image
        self.from_version = from_version
        self.service = service
        self.egress = egress
        self.ttl_sec = ttl_sec
        self.volumes = list(volumes) if volumes is not None else None
        #: sandbox id -> the service its commands run in.
        self.services: dict[str, str] = {}

    def __repr__(self) -> str:
        src = f"from_version={self.from_version!r}" if self.from_version else f"image={self.image!r}"
        return f"DenvSandboxClient({src}, server={self.client.server!r})"

    # ------------------------------------------------------------------ lifecycle

    def _ttl_for(self, request: Any) -> float | None:
        minutes = _field(request, "timeout_minutes")
        if minutes:
            return float(minutes) * 60.0
        return self.ttl_sec

    def _create(self, request: Any) -> DenvSandbox:
        name = _field(request, "name")
        ttl = self._ttl_for(request)
        caps = request_resources(request) or None
        if self.from_version:
            sbx = self.client.sandbox(from_version=self.from_version, ttl_sec=ttl, resources=caps)
        else:
            image = self.image or _field(request, "docker_image")
            if not image:
                raise ValueError("no image: give DenvSandboxClient(image=...) or a request with docker_image")
            start = _field(request, "start_command") or "sleep infinity"
            sbx = self.client.sandbox(
                image=image,
                cmd=["sh", "-c", str(start)],
                env=_field(request, "environment_vars") or None,
                egress=self.egress,
                volumes=self.volumes,
                ttl_sec=ttl,
                resources=caps,
            )
        self.services[sbx.id] = self.service or MAIN_SERVICE
        del name  # denv names sandboxes itself; Prime's name is not unique per rollout
        return DenvSandbox(id=sbx.id, name=sbx.name, status=sbx.status, expires_at=sbx.expires_at)

    async def create(self, request: Any) -> DenvSandbox:
        """Create one sandbox (``POST /v1/sandboxes``) from a Prime
        ``CreateSandboxRequest`` (or a mapping with its fields): ``docker_image``,
        ``start_command`` (run with ``sh -c``), ``environment_vars``,
        ``timeout_minutes`` (the TTL), and ``cpu_cores``, ``memory_gb``,
        ``disk_size_gb`` as the sandbox's caps (:func:`request_resources`; a
        ``gpu_count`` above 0 is ``ValueError``). ``team_id`` and ``labels`` are not
        passed on. Returns when it is healthy."""
        return await asyncio.to_thread(self._create, request)

    async def wait_for_creation(self, sandbox_id: str, *args: Any, **kwargs: Any) -> None:
        """Returns at once for a healthy sandbox (``create`` already waited);
        ``RuntimeError`` when it is not healthy."""
        env = await asyncio.to_thread(self.client.get_env, sandbox_id)
        if env.status != "healthy":
            raise RuntimeError(f"denv: sandbox {sandbox_id} is {env.status or 'unknown'}, not healthy")

    async def delete(self, sandbox_id: str) -> dict[str, Any]:
        """Destroy the sandbox (``DELETE /v1/envs/{id}``)."""
        await asyncio.to_thread(self.client.destroy, sandbox_id)
        self.services.pop(sandbox_id, None)
        return {"id": sandbox_id, "status": "destroying"}

    async def bulk_delete(self, sandbox_ids: Sequence[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Destroy each of ``sandbox_ids`` (labels and team filters are not supported:
        ``ValueError`` when given without ids)."""
        if not sandbox_ids:
            if any(kwargs.get(k) for k in ("labels", "team_id", "user_id", "all_users")):
                raise ValueError("denv: bulk_delete needs sandbox_ids (labels/team filters are not supported)")
            return {"succeeded": [], "failed": []}
        ok: list[str] = []
        failed: list[dict[str, str]] = []
        for sid in sandbox_ids:
            try:
                await self.delete(sid)
                ok.append(sid)
            except RuntimeError as e:
                failed.append({"id": sid, "error": str(e)})
        return {"succeeded": ok, "failed": failed}

    def teardown(self, wait: bool = True) -> None:
        """Nothing to release (the gRPC channel closes with the process)."""

    # ------------------------------------------------------------------ exec

    def _svc(self, sandbox_id: str) -> str:
        return self.services.get(sandbox_id) or self.service or MAIN_SERVICE

    async def execute_command(
        self,
        sandbox_id: str,
        command: str,
        working_dir: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: int | None = None,
        user: str | None = None,
    ) -> CommandResult:
        """Run a shell string (bash when the image has it, else sh; ``cd`` to
        ``working_dir``) with ``env`` and ``user`` as the engine's exec env and user.
        A non-zero exit is returned; a command past ``timeout`` seconds (default 120)
        raises Prime's ``CommandTimeoutError`` (``TimeoutError`` without
        ``prime_sandboxes``)."""
        t = int(timeout) if timeout else 120
        argv = shell_command(command, cwd=working_dir)
        r = await asyncio.to_thread(
            lambda: self.client.exec(
                sandbox_id, self._svc(sandbox_id), argv, t, user=user, env=dict(env) if env else None
            )
        )
        if r.timed_out:
            raise _timeout_error(sandbox_id, command, t)
        return CommandResult(stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code)

    async def run_background_job(
        self,
        sandbox_id: str,
        command: str,
        timeout: int = 900,
        working_dir: str | None = None,
        env: Mapping[str, str] | None = None,
        poll_interval: int = 3,
    ) -> Any:
        """Run ``command`` to completion (one exec; denv's exec needs no polling) and
        return an object with ``completed``, ``exit_code``, ``stdout``, ``stderr``."""
        r = await self.execute_command(sandbox_id, command, working_dir, env, timeout)

        @dataclass
        class _Status:
            completed: bool
            exit_code: int
            stdout: str
            stderr: str

        return _Status(True, r.exit_code, r.stdout, r.stderr)

    # ------------------------------------------------------------------ files

    async def upload_file(
        self, sandbox_id: str, file_path: str, local_file_path: str | Path, timeout: int | None = None
    ) -> None:
        """Upload the local file to the file path ``file_path`` in the sandbox."""
        await asyncio.to_thread(self.client.put_file, sandbox_id, self._svc(sandbox_id), local_file_path, file_path)

    async def upload_bytes(
        self, sandbox_id: str, file_path: str, file_bytes: bytes, filename: str = "", timeout: int | None = None
    ) -> None:
        """Write ``file_bytes`` to ``file_path`` in the sandbox."""
        await asyncio.to_thread(self.client.put_bytes, sandbox_id, self._svc(sandbox_id), file_path, file_bytes)

    async def download_file(
        self, sandbox_id: str, file_path: str, local_file_path: str | Path, timeout: int | None = None
    ) -> None:
        """Download the sandbox file ``file_path`` to ``local_file_path``."""
        await asyncio.to_thread(self.client.get_file, sandbox_id, self._svc(sandbox_id), file_path, local_file_path)

    async def read_file(self, sandbox_id: str, file_path: str, timeout: int | None = None, **kwargs: Any) -> FileContent:
        """The file's text (UTF-8, undecodable bytes replaced) as ``.content``."""
        data = await asyncio.to_thread(self.client.get_bytes, sandbox_id, self._svc(sandbox_id), file_path)
        return FileContent(content=data.decode("utf-8", "replace"))

    # ------------------------------------------------------------------ the blog's names

    async def exec(self, sandbox_id: str, command: str, **kwargs: Any) -> CommandResult:
        """Alias of :meth:`execute_command`."""
        return await self.execute_command(sandbox_id, command, **kwargs)

    async def upload(self, sandbox_id: str, file_path: str, local_file_path: str | Path) -> None:
        """Alias of :meth:`upload_file`."""
        await self.upload_file(sandbox_id, file_path, local_file_path)

    async def download(self, sandbox_id: str, file_path: str, local_file_path: str | Path) -> None:
        """Alias of :meth:`download_file`."""
        await self.download_file(sandbox_id, file_path, local_file_path)

    async def destroy(self, sandbox_id: str) -> None:
        """Alias of :meth:`delete`."""
        await self.delete(sandbox_id)


def _denv_sandbox_env_class() -> type:
    import verifiers as vf

    class DenvSandboxEnv(vf.SandboxEnv):  # type: ignore[misc, name-defined]
        """verifiers' ``SandboxEnv`` with a ``sandbox_client`` constructor argument
        (default: ``DenvSandboxClient()`` with the request's image). Its teardown
        destroys leftover sandboxes through that client rather than Prime's API."""

        def __init__(self, *args: Any, sandbox_client: DenvSandboxClient | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            try:  # the thread pool SandboxEnv made for Prime's client
                self.sandbox_client.teardown(wait=False)
            except Exception:
                pass
            self.sandbox_client = sandbox_client or DenvSandboxClient()

        @vf.teardown
        async def teardown_sandboxes(self) -> None:
            for sid in list(self.active_sandboxes):
                try:
                    await self.sandbox_client.delete(sid)
                except Exception as e:  # noqa: BLE001 - teardown goes on
                    self.logger.warning(f"denv: destroying {sid} failed: {e}")
                self.active_sandboxes.discard(sid)

    return DenvSandboxEnv


def __getattr__(name: str) -> Any:
    # verifiers is imported only when DenvSandboxEnv is asked for, so the client works
    # without it.
    if name == "DenvSandboxEnv":
        cls = _denv_sandbox_env_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
