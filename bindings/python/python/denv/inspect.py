"""The ``denv`` sandbox environment for Inspect (spec pages ``05-inspect-howto.md``,
``14-ref-python.md``).

Select it in a task with any of::

    Task(..., sandbox="denv")                                  # DENV_SANDBOX_IMAGE, default python:3.12-slim
    Task(..., sandbox=("denv", "denv.yaml"))                   # a config file
    Task(..., sandbox=("denv", DenvSandboxConfig(image="…")))  # inline
    Task(..., sandbox=("denv", "ver_01…"))                     # a fork of a version

A ``denv.yaml`` or ``denv.yml`` next to the task is picked up automatically. The
provider is registered through the ``inspect_ai`` entry point (``denv._inspect_registry``),
so no import is needed in a task file.

An eval's own Docker configuration is used too: a ``compose.yaml`` (or
``docker-compose.yaml`` …) next to the task, ``sandbox=("denv", "compose.yaml")``, an
Inspect ``ComposeConfig``, or a task declared with ``sandbox="docker"`` and run with
``--sandbox denv``: the compose file is deployed as one environment and every service
becomes a sandbox (the ``default`` one first). A ``Dockerfile`` (discovered next to
the task, or ``sandbox=("denv", "path/Dockerfile")``) becomes the compose file Inspect's
docker provider writes for one (service ``default`` built from the Dockerfile's
directory, ``tail -f /dev/null``, no network). Every ``build:`` context is packed
(``.dockerignore`` honoured, 32 MiB at most) and built on the denv host; relative
contexts are relative to the compose file's directory (the current directory for an
inline ``ComposeConfig`` or dict).

Caps: ``DenvSandboxConfig(cpus=…, memory=…, pids=…, disk=…)`` (or the same keys in
``denv.yaml``) set the sandbox's resources: the image and version forms pass them as the
sandbox request's ``resources``; the compose form sets them on the default service
(``cpus``, ``mem_limit``, ``pids_limit``) and ``disk`` as ``x-denv.disk``. A compose
file's own ``cpus``/``mem_limit``/``deploy.resources.limits`` apply as written.

Each sample gets its own environment at ``sample_init`` (one ``POST /v1/sandboxes``, or
one deploy of the compose file), destroyed at ``sample_cleanup``. The environment id is
on the sandbox as ``_env_id``.

``exec(cmd, input, cwd, env, user, timeout)`` has the docker provider's semantics: the
argv runs as given (no shell), ``user`` and ``cwd`` are the engine's own exec user and
working directory (``docker exec --user/--workdir``; a relative ``cwd`` is joined to the
sandbox's working directory), ``input`` is stdin and ``env`` the extra variables.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import shlex
import tarfile
import time
import uuid
from typing import Any, Literal, Union, overload

import anyio
import yaml
from pydantic import BaseModel

from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from inspect_ai.util._subprocess import ExecResult

from denv.client import ROLLOUT_TTL_SEC, Client, build_contexts
from denv.errors import status_of

__all__ = ["DenvSandbox", "DenvSandboxEnvironment", "DenvSandboxConfig", "resolve_config"]

#: Image used by ``sandbox="denv"`` without a config (overridden by ``DENV_SANDBOX_IMAGE``).
DEFAULT_IMAGE = "python:3.12-slim"
#: Default exec timeout in seconds when Inspect passes none.
DEFAULT_EXEC_TIMEOUT = 300
#: Longest command line passed inline (bytes); longer ones travel as a file.
_MAX_INLINE_COMMAND = 64 * 1024


class DenvSandboxConfig(BaseModel, frozen=True):
    """The ``denv.yaml`` keys.

    Exactly one of ``image`` (one container from this image running ``sleep infinity``),
    ``from_version`` (a fork of a healthy version, data included) or ``compose`` (the
    text of a compose file, set from an eval's own compose file) is set. The model is
    frozen and hashable (Inspect hashes sandbox configs).
    """

    image: str | None = None
    """One container from this image, command ``sleep infinity``."""
    from_version: str | None = None
    """Or: fork this version (``ver_…``)."""
    compose: str | None = None
    """Or: a compose file's text, deployed as one environment per sample."""
    egress: Literal["deny", "allow"] = "deny"
    """``deny`` (default) or ``allow``."""
    service: str = "main"
    """The service ``exec`` runs in (image and version forms)."""
    volumes: tuple[str, ...] = ("/work",)
    """Paths that persist across snapshot and fork (image form)."""
    ttl_sec: int | None = ROLLOUT_TTL_SEC
    """Destroy the sample's environment this many seconds after it was created (default
    7200; ``null`` for none), so an interrupted eval leaves nothing running."""
    context_dir: str | None = None
    """Compose form: the directory relative ``build:`` contexts are resolved against
    (set to the compose file's or Dockerfile's directory when the config is a file; the
    current directory when unset)."""
    cpus: float | None = None
    """CPUs for the sandbox (the agent service, or the compose file's default service)."""
    memory: str | None = None
    """Memory cap, compose ``mem_limit`` syntax (``"512m"``, ``"2g"``)."""
    pids: int | None = None
    """Process and thread cap."""
    disk: str | None = None
    """The environment's disk quota (``"2g"``; enforced on btrfs and zfs hosts)."""

    def resources(self) -> dict[str, Any]:
        """The caps that are set, as the sandbox request's ``resources`` mapping."""
        out: dict[str, Any] = {}
        for key in ("cpus", "memory", "pids", "disk"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def _default_config() -> DenvSandboxConfig:
    return DenvSandboxConfig(image=os.environ.get("DENV_SANDBOX_IMAGE") or DEFAULT_IMAGE)


#: Compose file names discovered next to a task, as Inspect's docker provider does.
COMPOSE_FILES = ["compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml"]
#: Config files discovered next to a task, in order: denv's own, then an eval's Docker ones.
CONFIG_FILES = ["denv.yaml", "denv.yml", *COMPOSE_FILES, "Dockerfile"]



def dockerfile_compose(dockerfile: str) -> str:
    """The compose file Inspect's docker provider writes for a task that has only a
    Dockerfile: service ``default`` built from the Dockerfile's directory, running
    ``tail -f /dev/null`` with no network."""
    doc = {
        "services": {
            "default": {
                "build": {"context": ".", "dockerfile": os.path.basename(dockerfile)},
                "command": "tail -f /dev/null",
                "init": True,
                "network_mode": "none",
            }
        }
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _is_dockerfile(path: str) -> bool:
    name = os.path.basename(path)
    return name == "Dockerfile" or name.endswith(".Dockerfile") or name.startswith("Dockerfile.")


def resolve_config(config: SandboxEnvironmentConfigType | None) -> DenvSandboxConfig:
    """Turn any accepted config form into a :class:`DenvSandboxConfig`.

    Accepts ``None`` (the default image), a :class:`DenvSandboxConfig`, a dict of its
    keys, an Inspect ``ComposeConfig``, a path to a YAML file (a ``denv.yaml`` or a
    compose file: a mapping with ``services``), or a version id ``ver_…``.

    Raises:
        ValueError: a string that is neither an existing file nor a ``ver_`` id, a
            file that is not a YAML mapping, a compose file without services, or not
            exactly one of ``image``, ``from_version`` and ``compose``.
    """
    if config is None:
        cfg = _default_config()
    elif isinstance(config, DenvSandboxConfig):
        cfg = config
    elif isinstance(config, BaseModel):
        data = config.model_dump(mode="json", exclude_none=True, by_alias=True)
        if isinstance(data.get("services"), dict):
            cfg = DenvSandboxConfig(compose=yaml.safe_dump(data, sort_keys=False), context_dir=os.getcwd())
        else:
            cfg = DenvSandboxConfig.model_validate(data)
    elif isinstance(config, dict):
        if isinstance(config.get("services"), dict):
            cfg = DenvSandboxConfig(compose=yaml.safe_dump(config, sort_keys=False), context_dir=os.getcwd())
        else:
            cfg = DenvSandboxConfig.model_validate(config)
    elif isinstance(config, str):
        here = os.path.dirname(os.path.abspath(config))
        if _is_dockerfile(config):
            if not os.path.isfile(config):
                raise ValueError(f"denv sandbox config {config}: no such Dockerfile")
            cfg = DenvSandboxConfig(compose=dockerfile_compose(config), context_dir=here)
        elif os.path.isfile(config):
            with open(config, encoding="utf-8") as f:
                text = f.read()
            data = yaml.safe_load(text)
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise ValueError(f"denv sandbox config {config} is not a mapping")
            if "services" in data:
                cfg = DenvSandboxConfig(compose=text, context_dir=here)
            else:
                cfg = DenvSandboxConfig.model_validate(data)
                if cfg.image is None and cfg.from_version is None and cfg.compose is None:
                    cfg = cfg.model_copy(update={"image": _default_config().image})
        elif config.startswith("ver_"):
            cfg = DenvSandboxConfig(from_version=config)
        else:
            raise ValueError(
                f"denv sandbox config {config!r} is neither a file nor a version id (ver_…); "
                "put an image in denv.yaml or pass DenvSandboxConfig(image=...)"
            )
    else:
        raise ValueError(f"unsupported denv sandbox config: {config!r}")
    if sum(x is not None for x in (cfg.image, cfg.from_version, cfg.compose)) != 1:
        raise ValueError("denv sandbox config needs exactly one of image, from_version or compose")
    if cfg.compose is not None:
        adapt_compose(cfg.compose, cfg.egress)
    return cfg


def adapt_compose(
    text: str, egress: str = "deny", caps: dict[str, Any] | None = None
) -> tuple[str, list[str], dict[str, str]]:
    """An eval's compose file as denv deploys it.

    Returns ``(compose_text, services, working_dirs)``: ``services`` in sandbox order
    (the ``default`` service, or the one with ``x-default: true``, else the first, then
    the rest), ``working_dirs`` each service's ``working_dir`` (removed from the file:
    denv applies it as the exec working directory, as ``docker exec`` would). Inspect's
    ``network_mode: none`` becomes ``x-denv.egress: deny`` (denv's own network, no way
    out); otherwise ``x-denv.egress`` defaults to ``egress``. ``caps``
    (:meth:`DenvSandboxConfig.resources`) go on the default service (``cpus``,
    ``mem_limit``, ``pids_limit``, replacing the file's) and ``disk`` to ``x-denv.disk``.
    ``build:`` is kept: the sidecar builds it.

    Raises:
        ValueError: not a mapping with a ``services`` mapping, or a service that is
            not a mapping.
    """
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict) or not doc["services"]:
        raise ValueError("denv: the compose file has no services mapping")
    services: dict[str, Any] = doc["services"]
    workdirs: dict[str, str] = {}
    deny = False
    for name, svc in services.items():
        if not isinstance(svc, dict):
            raise ValueError(f"denv: compose service {name!r} is not a mapping")
        wd = svc.pop("working_dir", None)
        if wd:
            workdirs[str(name)] = str(wd)
        if svc.get("network_mode") == "none":
            svc.pop("network_mode")
            deny = True
    default = next(
        (str(n) for n, s in services.items() if n == "default" or s.get("x-default") is True),
        str(next(iter(services))),
    )
    order = [default] + [str(n) for n in services if str(n) != default]
    xd = doc.get("x-denv")
    if not isinstance(xd, dict):
        xd = {}
    caps = caps or {}
    main = services[next(n for n in services if str(n) == default)]
    limits = ((main.get("deploy") or {}).get("resources") or {}).get("limits")
    # Our keys are also the `deploy.resources.limits` spellings, which would compete.
    for key, compose_key in (("cpus", "cpus"), ("memory", "mem_limit"), ("pids", "pids_limit")):
        if key in caps:
            main[compose_key] = caps[key]
            if isinstance(limits, dict):
                limits.pop(key, None)
    if "disk" in caps:
        xd["disk"] = caps["disk"]
    if deny:
        xd["egress"] = "deny"
    else:
        xd.setdefault("egress", egress)
    doc["x-denv"] = xd
    return yaml.safe_dump(doc, sort_keys=False), order, workdirs


async def _run(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: fn(*args))


@sandboxenv(name="denv")
class DenvSandbox(SandboxEnvironment):
    """One denv environment serving one Inspect sample.

    Attributes:
        _env_id: the environment id (``env_…``), for ``Client().verify(env_id)``.
        _service: the service ``exec`` runs in.
    """

    @classmethod
    def config_files(cls) -> list[str]:
        """``denv.yaml``, ``denv.yml``, then the docker provider's compose files and
        ``Dockerfile``: discovered next to the task, in this order."""
        return list(CONFIG_FILES)

    @classmethod
    def is_docker_compatible(cls) -> bool:
        """True: Inspect hands a task's compose file / ``ComposeConfig`` / Dockerfile
        to this provider instead of dropping it."""
        return True

    @classmethod
    def default_concurrency(cls) -> int | None:
        """8 sandboxes per eval (raise with ``--max-sandboxes``)."""
        return 8

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """A :class:`DenvSandboxConfig` from its dict form (eval logs)."""
        return DenvSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Check the credential and the config before any model call.

        Raises ``RuntimeError("DENV_API_KEY is not set")`` or ``ValueError``.
        """
        Client()
        resolve_config(config)

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        """Create one environment for the sample; returns ``{"default": DenvSandbox}``."""
        cfg = resolve_config(config)
        client = Client()
        if cfg.compose is not None:
            return await cls._compose_init(client, cfg)
        if cfg.image is not None:
            sbx = await _run(
                lambda: client.sandbox(
                    image=cfg.image,
                    cmd=["sleep", "infinity"],
                    egress=cfg.egress,
                    volumes=list(cfg.volumes),
                    ttl_sec=cfg.ttl_sec,
                    resources=cfg.resources() or None,
                )
            )
        else:
            sbx = await _run(
                lambda: client.sandbox(
                    from_version=cfg.from_version,
                    ttl_sec=cfg.ttl_sec,
                    resources=cfg.resources() or None,
                )
            )
        env = cls(client, sbx.id, cfg.service)
        try:
            await env._init_working_dir()
        except BaseException:
            await _run(client.destroy, sbx.id)
            raise
        return {"default": env}

    @classmethod
    async def _compose_init(
        cls, client: Client, cfg: DenvSandboxConfig
    ) -> dict[str, SandboxEnvironment]:
        """Deploy the eval's compose file as environment ``inspect-<id>`` of project
        ``sandboxes``; one sandbox per service, the default one first."""
        assert cfg.compose is not None
        text, order, workdirs = adapt_compose(cfg.compose, cfg.egress, cfg.resources())
        base = cfg.context_dir or os.getcwd()
        env_id = await _run(lambda: _deploy_compose(client, text, cfg.ttl_sec, base))
        envs: dict[str, SandboxEnvironment] = {}
        try:
            for name in order:
                env = cls(client, env_id, name)
                if name in workdirs:
                    # The engine creates a service's working_dir at start; so does this.
                    wd = workdirs[name]
                    await _run(lambda: client.exec(env_id, name, ["mkdir", "-p", "--", wd], 60, user="root"))
                    env._fixed_working_dir = wd
                await env._init_working_dir()
                envs[name] = env
        except BaseException:
            await _run(client.destroy, env_id)
            raise
        return envs

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Destroy every environment of the sample (once each: a compose sample's
        services share one)."""
        done: set[str] = set()
        for env in environments.values():
            if isinstance(env, DenvSandbox) and env._env_id not in done:
                done.add(env._env_id)
                await _run(env._client.destroy, env._env_id)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        """No-op: every sample's environment is destroyed at ``sample_cleanup``."""

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """No-op (``inspect sandbox cleanup denv`` is not yet available)."""

    def __init__(self, client: Client, env_id: str, service: str = "main") -> None:
        super().__init__()
        self._client = client
        self._env_id = env_id
        self._service = service
        self._working_dir = "/"
        self._fixed_working_dir: str | None = None
        self._uid = 0
        self._gid = 0
        self._has_timeout = False

    def __repr__(self) -> str:
        return f"DenvSandbox(env_id={self._env_id!r}, service={self._service!r})"

    async def _init_working_dir(self) -> None:
        """Learn the default user's working directory, uid and gid, and whether
        ``/usr/bin/timeout`` exists (the docker provider's in-container timeout)."""
        probe = "pwd; id -u; id -g; if [ -x /usr/bin/timeout ]; then echo t; else echo -; fi"
        r = await _run(
            lambda: self._client.exec(
                self._env_id, self._service, ["sh", "-c", probe], 60, cwd=self._fixed_working_dir
            )
        )
        lines = r.stdout.split()
        if r.exit_code == 0 and len(lines) >= 4:
            self._working_dir = lines[0] or "/"
            self._uid, self._gid = int(lines[1]), int(lines[2])
            self._has_timeout = lines[3] == "t"
        if self._fixed_working_dir:
            self._working_dir = self._fixed_working_dir

    def _path(self, file: str) -> str:
        if posixpath.isabs(file):
            return posixpath.normpath(file)
        return posixpath.normpath(posixpath.join(self._working_dir, file))

    # ------------------------------------------------------------------ exec

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` in the sample's service, as Inspect's docker provider does.

        The argv runs as given through the engine's exec (no shell): ``user`` is the
        exec user (``"root"`` is root even when the image's default user is not),
        ``cwd`` the working directory (relative: under the sandbox's working
        directory; ``None``: that directory), ``env`` extra variables, ``input`` stdin.
        ``timeout`` (default 300 s) runs the command under ``/usr/bin/timeout -k 5s``
        when the image has it and is always enforced by the server too.

        Raises:
            TimeoutError: the command ran past ``timeout``.
            PermissionError: the command is not executable (exit 126).
            OutputLimitExceededError: stdout or stderr exceeds Inspect's exec limit or
                the server's 4 MiB per stream.
        """
        if not cmd:
            raise ValueError("exec: empty command")
        t = int(timeout) if timeout is not None else DEFAULT_EXEC_TIMEOUT
        argv = [str(c) for c in cmd]
        if len(shlex.join(argv)) > _MAX_INLINE_COMMAND:
            # One argv element is capped at 128 KiB (MAX_ARG_STRLEN): ship the command
            # line as a file and evaluate it in the shell instead.
            cmd_path = f"/tmp/.denv_cmd.{uuid.uuid4().hex}"
            await _run(self._put_file, cmd_path, shlex.join(argv).encode("utf-8"), 0o644)
            q = shlex.quote(cmd_path)
            argv = ["sh", "-c", f'__denv_c="$(cat {q})"; rm -f {q}; eval "$__denv_c"']
        server_t = t
        if timeout is not None and self._has_timeout:
            argv = ["/usr/bin/timeout", "-k", "5s", f"{t}s", *argv]
            server_t = t + 10
        if cwd is None:
            workdir = self._working_dir
        else:
            workdir = cwd if posixpath.isabs(cwd) else posixpath.join(self._working_dir, cwd)
        started = time.monotonic()
        r = await _run(
            lambda: self._client.exec(
                self._env_id,
                self._service,
                argv,
                server_t,
                user=user,
                cwd=workdir,
                input=input,
                env=env,
            )
        )
        elapsed = time.monotonic() - started
        code, stdout, stderr = r.exit_code, r.stdout, r.stderr
        if r.timed_out or (
            timeout is not None
            and (code == 124 or (code in (137, 143) and elapsed >= t))
        ):
            err = TimeoutError(f"Command timed out after {t} seconds")
            if stdout or stderr:
                setattr(err, "truncated_output", stdout + stderr)
            raise err
        out = (stdout.strip() or stderr.strip()).lower()
        if code == 126 and "permission denied" in out and len(out.splitlines()) == 1:
            raise PermissionError(errno.EACCES, f"Permission denied: {out}", str(cmd[0]))
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        for stream, cut in ((stdout, r.stdout_truncated), (stderr, r.stderr_truncated)):
            if cut:
                raise OutputLimitExceededError("4 MiB", stream)
            if len(stream.encode("utf-8", "surrogatepass")) > limit:
                raise OutputLimitExceededError(
                    SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, stream[-limit:]
                )
        return ExecResult(success=code == 0, returncode=code, stdout=stdout, stderr=stderr)

    # ------------------------------------------------------------------ files

    def _put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        parent, base = posixpath.split(path)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            info = tarfile.TarInfo(base)
            info.size = len(data)
            info.mode = mode
            info.uid, info.gid = self._uid, self._gid
            info.mtime = int(time.time())
            tf.addfile(info, io.BytesIO(data))
        self._client.put_tar(self._env_id, self._service, parent or "/", buf.getvalue())

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write a text (UTF-8) or binary file; parent directories are created.

        The file is owned by the service's default user.

        Raises:
            IsADirectoryError: ``file`` is an existing directory.
            PermissionError: the existing file is not writable by the default user.
        """
        path = self._path(file)
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        probe = (
            'if [ -d "$1" ]; then exit 21; fi; '
            'if [ -e "$1" ] && [ ! -w "$1" ]; then exit 13; fi; exit 0'
        )
        r = await _run(
            self._client.exec, self._env_id, self._service, ["sh", "-c", probe, "sh", path], 60
        )
        if r.exit_code == 21:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if r.exit_code == 13:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        await _run(self._put_file, path, data, 0o644)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        """Read a file as text (UTF-8, newlines preserved) or bytes.

        Raises:
            FileNotFoundError: no such file.
            IsADirectoryError: ``file`` is a directory.
            PermissionError: the owner cannot read it.
            OutputLimitExceededError: larger than Inspect's read limit.
        """
        if posixpath.basename(file.rstrip("/")) in (".", ".."):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        path = self._path(file)
        try:
            blob = await _run(self._client.get_tar, self._env_id, self._service, path)
        except RuntimeError as e:
            msg = str(e).lower()
            if "no such file" in msg or "not found" in msg or status_of(e) == 404:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from e
            if "archive larger than" in msg:
                raise OutputLimitExceededError(
                    SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None
                ) from e
            raise
        data = _single_file(blob, file)
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """``denv exec [--user <user>] --service <service> <env> -- sh``."""
        u = f"--user {shlex.quote(user)} " if user else ""
        return SandboxConnection(
            type="denv",
            command=f"denv exec {u}--service {self._service} {self._env_id} -- sh",
        )


def _single_file(blob: bytes, original: str) -> bytes:
    if not any(blob[: tarfile.BLOCKSIZE]):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", original)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tf:
        member = tf.next()
        if member is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", original)
        if member.isdir():
            raise IsADirectoryError(errno.EISDIR, "Is a directory", original)
        if not member.isreg():
            raise OSError(errno.EINVAL, "not a regular file", original)
        if member.size > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        if not member.mode & 0o400:
            raise PermissionError(errno.EACCES, "Permission denied", original)
        f = tf.extractfile(member)
        return f.read() if f is not None else b""


#: Alias: the provider class under Inspect's naming convention.
DenvSandboxEnvironment = DenvSandbox


#: Project that holds the environments of eval compose files (created on first use).
COMPOSE_PROJECT = "sandboxes"


def _deploy_compose(client: Client, compose: str, ttl_sec: int | None, context_dir: str) -> str:
    """Deploy ``compose`` as a new environment ``inspect-<id>``, its ``build:`` contexts
    (relative to ``context_dir``) packed and sent along; returns its id once healthy.

    Raises:
        RuntimeError: the deploy is refused or fails (a failed build names the log's tail).
        ValueError: a build context is larger than 32 MiB.
        NotADirectoryError: a build context is not a directory."""
    try:
        client._call("CreateProject", {"name": COMPOSE_PROJECT})
    except RuntimeError as e:
        if status_of(e) != 409:
            raise
    req: dict[str, Any] = {
        "project": COMPOSE_PROJECT,
        "env": f"inspect-{uuid.uuid4().hex[:12]}",
        "compose": compose,
    }
    contexts = build_contexts(yaml.safe_load(compose), context_dir)
    if contexts:
        req["contexts"] = contexts
    if ttl_sec:
        req["ttl_sec"] = int(ttl_sec)
    started = client._call("Deploy", req)
    env_id = str((started.get("deployment") or {}).get("EnvID") or "")
    try:
        client._finish(started, 900, "deploy")
    except BaseException:
        if env_id:
            client.destroy(env_id)
        raise
    return env_id
