"""Harbor environment backend on denv (spec pages ``04-harbor-howto.md``,
``31-blog-harbor.md``, ``14-ref-python.md``)::

    harbor run -p ./tasks/my-task -a oracle -e denv.harbor:DenvEnvironment

:class:`DenvEnvironment` implements Harbor's ``BaseEnvironment`` (checked against
harbor 0.26): ``type``, ``_validate_definition``, ``start``, ``stop``, ``exec``,
``upload_file``, ``upload_dir``, ``download_file``, ``download_dir``, plus the
per-service operations a compose-capable backend must offer.

| Task input | On denv |
|---|---|
| ``environment/docker-compose.yaml`` (or ``.yml``) | Harbor's compose convention: the file is merged over Harbor's implicit ``main`` service (``build: {context: ${CONTEXT_DIR}}`` when ``environment/Dockerfile`` exists, else ``image: ${PREBUILT_IMAGE_NAME}``; ``command: sh -c "sleep infinity"``), ``${VAR}`` interpolated with Harbor's variables (``CONTEXT_DIR``, ``MAIN_IMAGE_NAME``, ``PREBUILT_IMAGE_NAME``, ``CPUS``, ``MEMORY``, the task's ``[environment].env``, then the process environment), ``main`` gets the task's env; deployed as environment ``harbor-<session>`` of project ``sandboxes`` with every ``build:`` context uploaded and built on the host; the agent runs in service ``main`` |
| ``[environment] docker_image`` | ``sandbox(image, cmd=["sleep","infinity"], volumes=["/app","/logs", workdir?])`` |
| only a ``Dockerfile`` | Harbor's implicit ``main`` alone, built on the host from ``environment/`` (as a compose task without a compose file) |
| ``network_mode = "public"`` (``allow_internet = true``) | ``egress: allow``; ``no-network`` is ``deny`` |
| ``cpus``, ``memory_mb`` (and ``--override-cpus``/``--override-memory-mb``) | the agent's caps, as Harbor's docker backend applies them to ``main``: the sandbox request's ``resources`` (``cpus``, ``memory: "<n>m"``) for a ``docker_image`` task; ``cpus``/``mem_limit`` on ``main`` of the deployed compose file otherwise. Harbor's resource modes apply (``ignore`` sends nothing) |
| ``storage_mb`` (``--override-storage-mb``) | the environment's disk quota: ``resources.disk`` / ``x-denv.disk`` (enforced on btrfs and zfs hosts, not on ``dir``) |

With ``[verifier] environment_mode = "separate"`` the agent's environment is
snapshotted when Harbor stops it, and the verifier's environment is a fork of that
snapshot (the agent's processes do not survive into it); the agent's environment is
left as Harbor asked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.models.task.config import NetworkMode
from harbor.models.trial.config import ResourceMode

from denv.client import ROLLOUT_TTL_SEC, Client, build_contexts, shell_command, ttl_arg
from denv.errors import status_of

__all__ = ["DenvEnvironment", "apply_caps", "harbor_compose", "interpolate"]
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

# Fork reuse across attempts: definition digest -> lock held while its base is looked up
# or deployed (trials of one `harbor run` share this process).
_BASE_LOCKS: dict[str, threading.Lock] = {}
_BASE_LOCKS_LOCK = threading.Lock()


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: The caller's environment variables a task's compose file may read: a comma-separated
#: list of names (``DENV_*`` names are never passed).
PASS_ENV = "DENV_HARBOR_PASS_ENV"


def _passed_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` named in its ``DENV_HARBOR_PASS_ENV``, without any
    ``DENV_*`` name (the API key and server stay with the caller)."""
    names = [n.strip() for n in environ.get(PASS_ENV, "").split(",")]
    return {n: environ[n] for n in names if n and not n.startswith("DENV_") and n in environ}


def _subst(expr: str, env: Mapping[str, str]) -> str:
    mm = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-+?])(.*))?", expr, re.S)
    if mm is None:
        raise ValueError(f"compose: invalid interpolation ${{{expr}}}")
    name, colon, op, arg = mm.group(1), mm.group(2), mm.group(3), mm.group(4) or ""
    val = env.get(name)
    present = val is not None and (val != "" or not colon)
    if op == "-":
        return val if present and val is not None else _interp_str(arg, env)
    if op == "+":
        return _interp_str(arg, env) if present else ""
    if op == "?" and not present:
        raise ValueError(f"compose: required variable {name} is missing a value: {arg}")
    return val or ""


def _interp_str(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            depth, j = 1, i + 2
            while j < n and depth:
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                j += 1
            if depth:
                raise ValueError(f"compose: unterminated interpolation in {text!r}")
            out.append(_subst(text[i + 2 : j - 1], env))
            i = j
        else:
            m = _NAME.match(text, i + 1)
            if m is None:
                out.append(c)
                i += 1
            else:
                out.append(env.get(m.group(0)) or "")
                i = m.end()
    return "".join(out)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's ``${VAR}`` interpolation over every string of a parsed compose value
    (keys included): ``$VAR``, ``${VAR}``, ``${VAR:-default}`` / ``${VAR-default}``
    (defaults may nest), ``${VAR:+alt}`` / ``${VAR+alt}``, ``${VAR:?message}`` /
    ``${VAR?message}`` (raises ``ValueError``), ``$$`` for a literal ``$``. An unset
    variable is ``""``, as in Compose."""
    if isinstance(value, str):
        return _interp_str(value, env)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {interpolate(k, env) if isinstance(k, str) else k: interpolate(v, env) for k, v in value.items()}
    return value


def _env_map(v: Any) -> dict[str, Any]:
    if isinstance(v, dict):
        return dict(v)
    out: dict[str, Any] = {}
    for item in v or []:
        k, sep, val = str(item).partition("=")
        out[k] = val if sep else None
    return out


def _merge(base: Any, over: Any, key: str = "") -> Any:
    """Compose's merge of two files: mappings merge key by key, ``environment`` and
    ``labels`` merge as mappings (list or mapping form), ``build`` given as a string is a
    context; anything else in the later file replaces the earlier value."""
    if key in ("environment", "labels") and base is not None and over is not None:
        return {**_env_map(base), **_env_map(over)}
    if key == "build":
        base = {"context": base} if isinstance(base, str) else base
        over = {"context": over} if isinstance(over, str) else over
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(out[k], v, str(k)) if k in out else v
        return out
    return over


def harbor_compose(
    environment_dir: Path,
    compose_path: Path | None,
    variables: Mapping[str, str],
    main_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The compose mapping Harbor's docker environment would run (harbor 0.26,
    ``environments/docker``): its implicit ``main`` service (``docker-compose-build.yaml``
    when ``environment/Dockerfile`` exists, else ``docker-compose-prebuilt.yaml``),
    the task's compose file merged over it, ``${VAR}`` interpolated with ``variables``,
    and ``main_env`` (the task's and trial's env) added to ``main``'s environment."""
    if (environment_dir / "Dockerfile").is_file():
        main: dict[str, Any] = {"build": {"context": "${CONTEXT_DIR}"}}
    else:
        main = {"image": "${PREBUILT_IMAGE_NAME}"}
    main["command"] = ["sh", "-c", "sleep infinity"]
    doc: dict[str, Any] = {"services": {MAIN_SERVICE: main}}
    if compose_path is not None:
        task = yaml.safe_load(compose_path.read_text()) or {}
        if not isinstance(task, dict):
            raise ValueError(f"{compose_path} is not a compose mapping")
        doc = _merge(doc, task)
    doc = interpolate(doc, variables)
    m = doc["services"][MAIN_SERVICE]
    if not m.get("image") and not m.get("build"):
        raise ValueError(
            f"task environment directory {environment_dir} has no environment definition: "
            "add environment/Dockerfile, set [environment] docker_image, or give service main an image"
        )
    if main_env:
        m["environment"] = {**_env_map(m.get("environment")), **main_env}
    return doc


def apply_caps(doc: dict[str, Any], caps: Mapping[str, Any]) -> dict[str, Any]:
    """Writes a task's caps (from ``DenvEnvironment._resource_caps``) into a compose
    mapping as Harbor's docker backend does (its resources override file): ``cpus`` and
    ``mem_limit`` on service ``main`` (replacing the file's), ``disk`` as ``x-denv.disk``."""
    main = doc["services"][MAIN_SERVICE]
    if "cpus" in caps:
        main["cpus"] = caps["cpus"]
    if "memory" in caps:
        main["mem_limit"] = caps["memory"]
    if "disk" in caps:
        xd = doc.get("x-denv")
        if not isinstance(xd, dict):
            xd = doc["x-denv"] = {}
        xd["disk"] = caps["disk"]
    return doc


def _env_name(session_id: str) -> str:
    s = re.sub(r"[^a-z0-9-]+", "-", session_id.lower()).strip("-")
    return ("harbor-" + s)[:63].rstrip("-")


def _sanitize_image_name(name: str) -> str:
    """Harbor's ``_sanitize_docker_image_name``."""
    name = name.lower()
    if not re.match(r"^[a-z0-9]", name):
        name = "0" + name
    return re.sub(r"[^a-z0-9._-]", "-", name)


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
    destroyed two hours after it started; ``none`` or ``0`` for no TTL), ``reuse``
    (default true: the task's definition is deployed once as a base environment
    ``harbor-base-<digest>`` and every attempt's environment is a fork of its version;
    ``false``: each trial deploys its own). Construction raises ``RuntimeError("DENV_API_KEY is not set")``
    without a key.

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
        reuse: Any = True,
        **kwargs: Any,
    ) -> None:
        self._client = Client(server=server, api_key=api_key)
        self.ttl_sec: float | None = ttl_arg(ttl_sec)
        self.reuse: bool = str(reuse).strip().lower() not in ("false", "0", "no", "off", "")
        #: The base environment this trial's environment was forked from (fork reuse).
        self.base_env_id: str | None = None
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

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        """CPU and memory are hard limits (cgroup caps), fractional CPUs allowed."""
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _resource_caps(self) -> dict[str, Any]:
        """The task's resources as denv caps: ``{"cpus": float, "memory": "<n>m",
        "disk": "<n>m"}``, each only when set. CPU and memory follow Harbor's resource
        modes as its docker backend does (a limit unless the mode is ``ignore``/``request``)."""
        out: dict[str, Any] = {}
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        if cpus:
            out["cpus"] = float(cpus)
        mem = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if mem:
            out["memory"] = f"{int(mem)}m"
        disk = self._effective_storage_mb
        if disk:
            out["disk"] = f"{int(disk)}m"
        return out

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
        """Accept a compose file, ``docker_image`` or ``environment/Dockerfile``.

        Raises:
            FileNotFoundError: no environment definition at all.
        """
        if self._compose_path is not None or self.task_env_config.docker_image:
            return
        if (self.environment_dir / "Dockerfile").is_file():
            return
        raise FileNotFoundError(
            f"task environment directory {self.environment_dir} has no environment definition: "
            "add environment/Dockerfile, set [environment] docker_image or add environment/docker-compose.yaml"
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
        elif self.reuse:
            self.env_id = await asyncio.to_thread(self._fork_of_base)
        elif self._compose_path is not None or not self.task_env_config.docker_image:
            self.env_id = await asyncio.to_thread(self._deploy_compose, self._compose_path, _env_name(self.session_id))
        else:
            self.env_id = await asyncio.to_thread(self._create_image_sandbox, _env_name(self.session_id))
        try:
            await self._make_dirs()
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

    # ------------------------------------------------------------------ fork reuse

    def _definition(self) -> tuple[str, dict[str, Any]]:
        """``(kind, request)``: what this task deploys, as the digest sees it."""
        if self._compose_path is not None or not self.task_env_config.docker_image:
            doc = self._compose_doc(self._compose_path)
            return "compose", {
                "compose": yaml.safe_dump(doc, sort_keys=True),
                "contexts": build_contexts(doc, self.environment_dir),
            }
        return "image", {
            "image": self.task_env_config.docker_image,
            "env": self._startup_env(),
            "egress": self._egress,
            "volumes": self._image_volumes(),
            # The base is created with the task's caps, and its forks keep them.
            "resources": self._resource_caps(),
        }

    def _fork_of_base(self) -> str:
        """This trial's environment: a sandbox from the version of the task's base
        environment (deployed by the first trial of this definition, found by name by
        later ones, in this process or another), named ``harbor-<session>``."""
        kind, req = self._definition()
        digest = hashlib.sha256(json.dumps([kind, req], sort_keys=True).encode()).hexdigest()
        base_name = f"harbor-base-{digest[:20]}"
        with _BASE_LOCKS_LOCK:
            lock = _BASE_LOCKS.setdefault(digest, threading.Lock())
        with lock:
            base_id, version = self._find_base(base_name)
            if not version:
                try:
                    if kind == "compose":
                        base_id = self._deploy_compose(self._compose_path, base_name)
                    else:
                        base_id = self._create_image_sandbox(base_name)
                    version = self._client.current_version(base_id)
                except RuntimeError as e:
                    if status_of(e) != 409:
                        raise
                    base_id, version = self._await_base(base_name)  # another process deploys it
        self.base_env_id = base_id
        sbx = self._client.sandbox(
            from_version=version, name=_env_name(self.session_id), ttl_sec=self.ttl_sec
        )
        return sbx.id

    def _await_base(self, name: str, timeout: float = 900) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            base_id, version = self._find_base(name)
            if base_id and version:
                return base_id, version
            time.sleep(1)
        raise RuntimeError(f"denv: base environment {name} did not become healthy in {timeout:.0f}s")

    def _find_base(self, name: str) -> tuple[str | None, str | None]:
        """A healthy base environment of that name in project ``sandboxes`` with a
        version, as ``(env id, version id)``; ``(None, None)`` when there is none."""
        try:
            envs = self._client._call("ListEnvs", {"project": PROJECT}).get("environments") or []
        except RuntimeError as e:
            if status_of(e) == 404:
                return None, None
            raise
        for e in envs:
            if e.get("Name") == name and e.get("Status") == "healthy" and e.get("CurrentVersionID"):
                return str(e["ID"]), str(e["CurrentVersionID"])
        return None, None

    def _image_volumes(self) -> list[str]:
        volumes = ["/app", "/logs"]
        workdir = self.task_env_config.workdir
        if workdir and workdir not in volumes:
            volumes.append(workdir)
        return volumes

    def _create_image_sandbox(self, name: str) -> str:
        sbx = self._client.sandbox(
            image=self.task_env_config.docker_image,
            cmd=["sleep", "infinity"],
            env=self._startup_env(),
            egress=self._egress,
            volumes=self._image_volumes(),
            name=name,
            ttl_sec=self.ttl_sec,
            resources=self._resource_caps() or None,
        )
        return sbx.id

    def _compose_variables(self) -> dict[str, str]:
        """The variables a task's compose file is interpolated with: the caller's
        variables named in ``DENV_HARBOR_PASS_ENV`` (never a ``DENV_*`` one), then the
        task's ``[environment].env``, then Harbor's own (``MAIN_IMAGE_NAME``,
        ``CONTEXT_DIR``, ``PREBUILT_IMAGE_NAME`` for a ``docker_image`` task, ``CPUS``
        and ``MEMORY`` when set).

        Unlike Harbor's docker environment, the rest of the process environment is not
        offered: the compose file comes from the task, and its world runs elsewhere, so
        ``${DENV_API_KEY}`` (or any other secret of the caller's shell) would hand it to
        the task. An unset variable interpolates as ``""``, as in compose."""
        out = _passed_variables(os.environ)
        out.update(self._startup_env())
        out["MAIN_IMAGE_NAME"] = _sanitize_image_name(f"hb__{self.environment_id}")
        out["CONTEXT_DIR"] = str(self.environment_dir.resolve().absolute())
        if self.task_env_config.docker_image:
            out["PREBUILT_IMAGE_NAME"] = self.task_env_config.docker_image
        cpus = getattr(self, "_effective_cpus", None)
        if cpus:
            out["CPUS"] = str(cpus)
        mem = getattr(self, "_effective_memory_mb", None)
        if mem:
            out["MEMORY"] = f"{mem}M"
        return out

    def _compose_doc(self, path: Path | None) -> dict[str, Any]:
        doc = harbor_compose(
            self.environment_dir, path, self._compose_variables(), self._startup_env()
        )
        xd = doc.setdefault("x-denv", {}) or {}
        doc["x-denv"] = xd
        xd.setdefault("egress", self._egress)
        apply_caps(doc, self._resource_caps())
        return doc

    def _deploy_compose(self, path: Path | None, name: str) -> str:
        doc = self._compose_doc(path)
        # Build contexts stay inside the task directory: a downloaded task must not
        # make this machine pack and upload its other directories.
        contexts = build_contexts(doc, self.environment_dir, root=self.environment_dir.parent)
        compose = yaml.safe_dump(doc, sort_keys=False)
        try:
            self._client._call("CreateProject", {"name": PROJECT})
        except RuntimeError as e:
            if status_of(e) != 409:
                raise
        req: dict[str, Any] = {
            "project": PROJECT,
            "env": name,
            "compose": compose,
            "contexts": contexts,
        }
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
        """Run a shell string in service ``main`` (bash when the image has it, else sh;
        ``cd`` to ``cwd`` or the task's workdir) with Harbor's merged env and resolved
        user as the engine's exec env and user, like ``docker compose exec -e -u`` in
        Harbor's docker backend (no ``su``: ``user="root"`` is root and a named user is
        that user whatever the image's default user is). Default timeout 600 s."""
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
        argv = shell_command(command, cwd=cwd or self.task_env_config.workdir)
        t = int(timeout_sec) if timeout_sec else DEFAULT_EXEC_TIMEOUT
        who = self._resolve_user(user)
        r = await asyncio.to_thread(
            lambda: self._client.exec(
                env_id,
                service,
                argv,
                t,
                user=None if who is None else str(who),
                env=self._merge_env(env) or None,
            )
        )
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
