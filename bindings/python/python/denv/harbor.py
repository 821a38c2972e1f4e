"""Harbor environment backend on denv (spec pages ``04-harbor-howto.md``,
``31-blog-harbor.md``, ``14-ref-python.md``)::

    harbor run -p ./tasks/my-task -a oracle -e denv.harbor:DenvEnvironment

:class:`DenvEnvironment` implements Harbor's ``BaseEnvironment`` (checked against
harbor 0.26): ``type``, ``_validate_definition``, ``start``, ``stop``, ``exec``,
``upload_file``, ``upload_dir``, ``download_file``, ``download_dir``, plus the
per-service operations a compose-capable backend must offer.

| Task input | On denv |
|---|---|
| ``environment/docker-compose.yaml`` (or ``.yml``) | deployed as environment ``harbor-<session>`` of project ``sandboxes``; the agent runs in service ``main`` |
| ``[environment] docker_image`` | ``sandbox(image, cmd=["sleep","infinity"], volumes=["/app","/logs", workdir?])`` |
| only a ``Dockerfile`` | refused at ``_validate_definition`` |
| ``network_mode = "public"`` (``allow_internet = true``) | ``egress: allow``; ``no-network`` is ``deny`` |

With ``[verifier] environment_mode = "separate"`` the agent's environment is
snapshotted when Harbor stops it, and the verifier's environment is a fork of that
snapshot (the agent's processes do not survive into it); the agent's environment is
left as Harbor asked.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import threading
from pathlib import Path
from typing import Any

import yaml

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode

from denv.client import ROLLOUT_TTL_SEC, Client, shell_command, ttl_arg

__all__ = ["DenvEnvironment", "DOCKERFILE_ONLY_MESSAGE"]

#: The refusal for tasks that ship only a Dockerfile.
DOCKERFILE_ONLY_MESSAGE = (
    "denv: this task has only a Dockerfile. Set [environment] docker_image in task.toml "
    "(or add a compose file) until denv ships host-side builds."
)
#: Project that holds compose tasks' environments.
PROJECT = "sandboxes"
#: Service the agent runs in.
MAIN_SERVICE = "main"
#: Default exec timeout (seconds).
DEFAULT_EXEC_TIMEOUT = 600
#: Directories created in the agent's service after start.
HARBOR_DIRS = ["/logs/agent", "/logs/verifier", "/logs/artifacts", "/tests", "/solution", "/app"]
COMPOSE_FILES = ["docker-compose.yaml", "docker-compose.yml"]

# Separate-verifier handoff: trial name -> (environment_dir, version id of the agent's
# final state), written by the agent environment's stop(), read by the verifier's start().
_HANDOFF: dict[str, tuple[str, str, str | None]] = {}
_HANDOFF_LOCK = threading.Lock()


def _env_name(session_id: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", session_id.lower()).strip("-")
    return ("harbor-" + s)[:63].rstrip("-")


def _trial_name(session_id: str) -> tuple[str, str]:
    """``(trial, role)`` from Harbor's session ids ``<trial>__env`` / ``<trial>__verifier__<k>``."""
    if "__verifier__" in session_id:
        return session_id.split("__verifier__", 1)[0], "verifier"
    if session_id.endswith("__env"):
        return session_id[: -len("__env")], "agent"
    return session_id, "agent"


class DenvEnvironment(BaseEnvironment):
    """A Harbor environment backed by one denv environment.

    Extra keyword arguments (``--ek``): ``server``, ``api_key`` (else ``DENV_SERVER``,
    ``DENV_API_KEY``), ``ttl_sec`` (default 7200: an environment Harbor does not delete is
    destroyed two hours after it started; ``none`` or ``0`` for no TTL). Construction raises ``RuntimeError("DENV_API_KEY is not set")``
    without a key and ``ValueError`` for a Dockerfile-only task.

    Attributes:
        env_id: the denv environment id once started (``None`` before).
        service: the agent's service (``main``).
    """

    def __init__(
        self,
        *args: Any,
        server: str | None = None,
        api_key: str | None = None,
        ttl_sec: Any = ROLLOUT_TTL_SEC,
        **kwargs: Any,
    ) -> None:
        self._client = Client(server=server, api_key=api_key)
        self.ttl_sec: float | None = ttl_arg(ttl_sec)
        self.env_id: str | None = None
        self.service: str = MAIN_SERVICE
        self._forked_from: str | None = None
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ identity

    @staticmethod
    def type() -> str:
        """``"denv"``."""
        return "denv"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """``disable_internet`` and ``docker_compose``; not ``mounted`` (Harbor downloads logs)."""
        return EnvironmentCapabilities(disable_internet=True, docker_compose=True)

    @property
    def _compose_path(self) -> Path | None:
        for name in COMPOSE_FILES:
            p = self.environment_dir / name
            if p.is_file():
                return p
        return None

    @property
    def _uses_compose(self) -> bool:
        return self._compose_path is not None

    def _validate_definition(self) -> None:
        """Accept a compose file or ``docker_image``; refuse a Dockerfile-only task.

        Raises:
            ValueError: only a ``Dockerfile`` (:data:`DOCKERFILE_ONLY_MESSAGE`).
            FileNotFoundError: no environment definition at all.
        """
        if self._compose_path is not None or self.task_env_config.docker_image:
            return
        if (self.environment_dir / "Dockerfile").exists():
            raise ValueError(DOCKERFILE_ONLY_MESSAGE)
        raise FileNotFoundError(
            f"task environment directory {self.environment_dir} has no environment definition: "
            "set [environment] docker_image or add environment/docker-compose.yaml"
        )

    @property
    def _egress(self) -> str:
        return "allow" if self.network_policy.network_mode == NetworkMode.PUBLIC else "deny"

    # ------------------------------------------------------------------ lifecycle

    async def start(self, force_build: bool) -> None:
        """Create the environment, wait until healthy, create Harbor's directories and,
        for ``docker_image`` tasks that ship files in ``environment/``, upload them."""
        trial, role = _trial_name(self.session_id)
        handoff = None
        if role == "verifier":
            with _HANDOFF_LOCK:
                handoff = _HANDOFF.pop(trial, None)
        if handoff is not None and handoff[0] != str(self.environment_dir):
            if handoff[2] is not None:  # not this verifier's world: the agent's env goes
                await asyncio.to_thread(self._client.destroy, handoff[2])
            handoff = None
        if handoff is not None:
            self._forked_from = handoff[1]
            try:
                sbx = await asyncio.to_thread(
                    lambda: self._client.sandbox(
                        from_version=handoff[1],
                        name=_env_name(self.session_id),
                        ttl_sec=self.ttl_sec,
                    )
                )
            finally:
                # The agent's environment (kept until its snapshot was forked) goes now.
                if handoff[2] is not None:
                    await asyncio.to_thread(self._client.destroy, handoff[2])
            self.env_id = sbx.id
        elif self._compose_path is not None:
            self.env_id = await asyncio.to_thread(self._deploy_compose, self._compose_path)
        else:
            self.env_id = await asyncio.to_thread(self._create_image_sandbox)
        try:
            await self._make_dirs()
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

    def _create_image_sandbox(self) -> str:
        volumes = ["/app", "/logs"]
        workdir = self.task_env_config.workdir
        if workdir and workdir not in volumes:
            volumes.append(workdir)
        sbx = self._client.sandbox(
            image=self.task_env_config.docker_image,
            cmd=["sleep", "infinity"],
            env=self._startup_env(),
            egress=self._egress,
            volumes=volumes,
            name=_env_name(self.session_id),
            ttl_sec=self.ttl_sec,
        )
        return sbx.id

    def _deploy_compose(self, path: Path) -> str:
        doc = yaml.safe_load(path.read_text()) or {}
        if not isinstance(doc, dict):
            raise ValueError(f"{path} is not a compose mapping")
        xd = doc.setdefault("x-denv", {}) or {}
        doc["x-denv"] = xd
        xd.setdefault("egress", self._egress)
        compose = yaml.safe_dump(doc, sort_keys=False)
        try:
            self._client._call("CreateProject", {"name": PROJECT})
        except RuntimeError as e:
            if not str(e).startswith("denv 409"):
                raise
        req: dict[str, Any] = {"project": PROJECT, "env": _env_name(self.session_id), "compose": compose}
        if self.ttl_sec:
            req["ttl_sec"] = int(self.ttl_sec)
        started = self._client._call("Deploy", req)
        dep = self._client._finish(started, 900, "deploy")
        return str(dep.get("EnvID") or "")

    async def _make_dirs(self) -> None:
        logs = [d for d in HARBOR_DIRS if d.startswith("/logs/")]
        writable = [t for t in self._mount_targets(writable_only=True) if t not in logs]
        others = [d for d in HARBOR_DIRS if not d.startswith("/logs/")]
        if self.task_env_config.workdir:
            others.append(self.task_env_config.workdir)
        q = " ".join(shlex.quote(d) for d in logs + writable)
        script = f"mkdir -p {q} {' '.join(shlex.quote(d) for d in others)} && chmod 777 {q}"
        r = await self.exec(script, user="root", timeout_sec=120)
        if r.return_code != 0:
            raise RuntimeError(f"denv: creating harbor directories failed: {r.stderr or r.stdout}")

    async def stop(self, delete: bool) -> None:
        """Destroy the environment when ``delete``; otherwise leave it running.

        In separate-verifier mode the agent's final state is snapshotted first so
        the verifier's environment can fork it.
        """
        if self.env_id is None:
            return
        env_id = self.env_id
        trial, role = _trial_name(self.session_id)
        if role == "agent" and self._separate_verifier():
            try:
                version = await asyncio.to_thread(self._client.snapshot, env_id)
                # The agent's environment is destroyed by the verifier's start, once the
                # fork of its snapshot exists (a destroy takes the environment's
                # snapshots with it); if no verifier starts, its TTL ends it.
                with _HANDOFF_LOCK:
                    _HANDOFF[trial] = (
                        str(self.environment_dir),
                        version,
                        env_id if delete else None,
                    )
                if delete:
                    self.env_id = None
                return
            except Exception as e:  # the verifier then starts from the definition
                self.logger.warning(f"denv: snapshot for the separate verifier failed: {e}")
        if delete:
            self.env_id = None
            await asyncio.to_thread(self._client.destroy, env_id)

    def _separate_verifier(self) -> bool:
        task_toml = self.environment_dir.parent / "task.toml"
        if not task_toml.is_file():
            return False
        try:
            from harbor.models.task.config import TaskConfig, VerifierEnvironmentMode
            from harbor.models.task.verifier_mode import resolve_task_verifier_mode

            cfg = TaskConfig.model_validate_toml(task_toml.read_text())
            return resolve_task_verifier_mode(cfg) == VerifierEnvironmentMode.SEPARATE
        except Exception:
            return False

    # ------------------------------------------------------------------ exec

    def _require(self) -> str:
        if self.env_id is None:
            raise RuntimeError("denv: environment not started")
        return self.env_id

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run a shell string in service ``main`` through :func:`shell_command` with
        Harbor's merged env and resolved user (default timeout 600 s)."""
        return await self._exec_in(self.service, command, cwd, env, timeout_sec, user)

    async def _exec_in(
        self,
        service: str,
        command: str,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_sec: int | None,
        user: str | int | None,
    ) -> ExecResult:
        env_id = self._require()
        argv = shell_command(
            command,
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env),
            user=self._resolve_user(user),
        )
        t = int(timeout_sec) if timeout_sec else DEFAULT_EXEC_TIMEOUT
        r = await asyncio.to_thread(self._client.exec, env_id, service, argv, t)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=r.exit_code)

    async def service_exec(
        self,
        command: str,
        *,
        service: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run a command in a compose service (default ``main``)."""
        return await self._exec_in(service or self.service, command, cwd, env, timeout_sec, user)

    # ------------------------------------------------------------------ files

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Upload one local file to the file path ``target_path``."""
        await asyncio.to_thread(self._client.put_file, self._require(), self.service, source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Upload a local directory's contents into ``target_dir``."""
        await asyncio.to_thread(self._client.put_dir, self._require(), self.service, source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Download one file to the local path ``target_path``."""
        await asyncio.to_thread(self._client.get_file, self._require(), self.service, source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Download a directory's contents under ``target_dir`` (``docker cp src/.``)."""
        await asyncio.to_thread(self._client.get_dir, self._require(), self.service, source_dir, target_dir)

    async def service_download_file(
        self, source_path: str, target_path: Path | str, *, service: str | None = None
    ) -> None:
        """Download a file from a compose service (default ``main``)."""
        await asyncio.to_thread(
            self._client.get_file, self._require(), service or self.service, source_path, target_path
        )

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        """Download a directory from a compose service (default ``main``)."""
        await asyncio.to_thread(
            self._client.get_dir, self._require(), service or self.service, source_dir, target_dir
        )

    async def stop_service(self, service: str) -> None:
        """Stop one compose service's processes (the agent before sidecar collection).

        denv has no per-service stop: every process of the service except PID 1 is
        killed, so nothing the agent left running can touch the evidence.
        """
        await self._exec_in(
            service,
            "for p in /proc/[0-9]*; do n=${p#/proc/}; "
            '[ "$n" = 1 ] || [ "$n" = $$ ] || kill -9 "$n" 2>/dev/null; done; true',
            None,
            None,
            60,
            "root",
        )
