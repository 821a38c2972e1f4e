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

Each sample gets its own environment at ``sample_init`` (one ``POST /v1/sandboxes``),
destroyed at ``sample_cleanup``. The environment id is on the sandbox as ``_env_id``.
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
from pydantic import BaseModel, Field

from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from inspect_ai.util._subprocess import ExecResult

from denv.client import ROLLOUT_TTL_SEC, Client, shell_command

__all__ = ["DenvSandbox", "DenvSandboxEnvironment", "DenvSandboxConfig", "resolve_config"]

#: Image used by ``sandbox="denv"`` without a config (overridden by ``DENV_SANDBOX_IMAGE``).
DEFAULT_IMAGE = "python:3.12-slim"
#: Default exec timeout in seconds when Inspect passes none.
DEFAULT_EXEC_TIMEOUT = 300
#: Longest command line passed inline (bytes); longer ones travel as a file.
_MAX_INLINE_COMMAND = 64 * 1024
#: Config files discovered next to a task.
CONFIG_FILES = ["denv.yaml", "denv.yml"]


class DenvSandboxConfig(BaseModel, frozen=True):
    """The ``denv.yaml`` keys.

    Exactly one of ``image`` (one container from this image running ``sleep infinity``)
    or ``from_version`` (a fork of a healthy version, data included) is set.
    """

    image: str | None = None
    """One container from this image, command ``sleep infinity``."""
    from_version: str | None = None
    """Or: fork this version (``ver_…``)."""
    egress: Literal["deny", "allow"] = "deny"
    """``deny`` (default) or ``allow``."""
    service: str = "main"
    """The service ``exec`` runs in."""
    volumes: list[str] = Field(default_factory=lambda: ["/work"])
    """Paths that persist across snapshot and fork (image form)."""
    ttl_sec: int | None = ROLLOUT_TTL_SEC
    """Destroy the sample's environment this many seconds after it was created (default
    7200; ``null`` for none), so an interrupted eval leaves nothing running."""


def _default_config() -> DenvSandboxConfig:
    return DenvSandboxConfig(image=os.environ.get("DENV_SANDBOX_IMAGE") or DEFAULT_IMAGE)


def resolve_config(config: SandboxEnvironmentConfigType | None) -> DenvSandboxConfig:
    """Turn any accepted config form into a :class:`DenvSandboxConfig`.

    Accepts ``None`` (the default image), a :class:`DenvSandboxConfig`, a dict of its
    keys, a path to a YAML file (``denv.yaml``/``denv.yml`` or any existing file), or a
    version id ``ver_…``.

    Raises:
        ValueError: a string that is neither an existing file nor a ``ver_`` id, a
            file that is not a YAML mapping, or neither/both of ``image`` and
            ``from_version``.
    """
    if config is None:
        cfg = _default_config()
    elif isinstance(config, DenvSandboxConfig):
        cfg = config
    elif isinstance(config, BaseModel):
        cfg = DenvSandboxConfig.model_validate(config.model_dump())
    elif isinstance(config, dict):
        cfg = DenvSandboxConfig.model_validate(config)
    elif isinstance(config, str):
        if os.path.isfile(config):
            with open(config, encoding="utf-8") as f:
                data = yaml.safe_load(f)
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise ValueError(f"denv sandbox config {config} is not a mapping")
            cfg = DenvSandboxConfig.model_validate(data)
            if cfg.image is None and cfg.from_version is None:
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
    if (cfg.image is None) == (cfg.from_version is None):
        raise ValueError("denv sandbox config needs exactly one of image or from_version")
    return cfg


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
        """``denv.yaml``, ``denv.yml``: discovered next to the task."""
        return list(CONFIG_FILES)

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
        if cfg.image is not None:
            sbx = await _run(
                lambda: client.sandbox(
                    image=cfg.image,
                    cmd=["sleep", "infinity"],
                    egress=cfg.egress,
                    volumes=list(cfg.volumes),
                    ttl_sec=cfg.ttl_sec,
                )
            )
        else:
            sbx = await _run(
                lambda: client.sandbox(from_version=cfg.from_version, ttl_sec=cfg.ttl_sec)
            )
        env = cls(client, sbx.id, cfg.service)
        try:
            await env._init_working_dir()
        except BaseException:
            await _run(client.destroy, sbx.id)
            raise
        return {"default": env}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Destroy every environment of the sample."""
        for env in environments.values():
            if isinstance(env, DenvSandbox):
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
        self._uid = 0
        self._gid = 0

    def __repr__(self) -> str:
        return f"DenvSandbox(env_id={self._env_id!r}, service={self._service!r})"

    async def _init_working_dir(self) -> None:
        r = await _run(
            self._client.exec, self._env_id, self._service, ["sh", "-c", "pwd; id -u; id -g"], 60
        )
        lines = r.stdout.split()
        if r.exit_code == 0 and len(lines) >= 3:
            self._working_dir = lines[0] or "/"
            self._uid, self._gid = int(lines[1]), int(lines[2])

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
        """Run ``cmd`` in the sample's service.

        The argv is joined with ``shlex.quote``; ``input`` is written to a file under
        ``/tmp`` and redirected in; ``env`` is exported and ``cwd`` applied by
        :func:`denv.client.shell_command`, which also honours a non-root ``user``
        with ``su``. ``timeout`` (default 300 s) is enforced in the container with
        ``timeout`` when present and by the server.

        Raises:
            TimeoutError: the command ran past ``timeout``.
            PermissionError: the command is not executable (exit 126).
            OutputLimitExceededError: stdout or stderr exceeds Inspect's exec limit.
        """
        if not cmd:
            raise ValueError("exec: empty command")
        t = int(timeout) if timeout is not None else DEFAULT_EXEC_TIMEOUT
        run = cmd_line = shlex.join([str(c) for c in cmd])
        if len(cmd_line) > _MAX_INLINE_COMMAND:
            # One argv element is capped at 128 KiB (MAX_ARG_STRLEN): ship the command
            # line as a file and evaluate it in the shell instead.
            cmd_path = f"/tmp/.denv_cmd.{uuid.uuid4().hex}"
            await _run(self._put_file, cmd_path, run.encode("utf-8"), 0o644)
            q = shlex.quote(cmd_path)
            run = f'__denv_c="$(cat {q})"; rm -f {q}; eval "$__denv_c"'
        if timeout is not None:
            # The command under `timeout` must be a program: a shell for the eval form.
            timed = run if len(cmd_line) <= _MAX_INLINE_COMMAND else f"sh -c {shlex.quote(run)}"
            run = (
                f"if command -v timeout >/dev/null 2>&1; then timeout -k 5 {t} {timed}; "
                f"else {run}; fi"
            )
        if input is not None:
            data = input.encode("utf-8") if isinstance(input, str) else bytes(input)
            stdin_path = f"/tmp/.denv_stdin.{uuid.uuid4().hex}"
            await _run(self._put_file, stdin_path, data, 0o644)
            q = shlex.quote(stdin_path)
            script = f"{{ rm -f {q}; {run}; }} < {q}"
        else:
            script = f"{run} < /dev/null"
        workdir = self._working_dir if cwd is None else self._path(cwd)
        argv = shell_command(script, cwd=workdir, env=env, user=user)
        started = time.monotonic()
        r = await _run(self._client.exec, self._env_id, self._service, argv, t + 10)
        elapsed = time.monotonic() - started
        code, stdout, stderr = r.exit_code, r.stdout, r.stderr
        server_timeout = code == 124 and "denvd: command timed out" in stderr
        if (code == 124 and (timeout is not None or server_timeout)) or (
            timeout is not None and code in (137, 143) and elapsed >= t
        ):
            err = TimeoutError(f"Command timed out after {t} seconds")
            if stdout or stderr:
                setattr(err, "truncated_output", stdout + stderr)
            raise err
        if code == 126 and "permission denied" in stderr.lower():
            raise PermissionError(errno.EACCES, f"Permission denied: {stderr.strip()}", str(cmd[0]))
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        for stream in (stdout, stderr):
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
            if "no such file" in msg or "not found" in msg or "404" in msg:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", file) from e
            if "archive larger than" in msg:
                raise OutputLimitExceededError(
                    SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None
                ) from e
            raise
        data = _single_file(blob, file)
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """``denv exec <env> --service <service> -- sh``."""
        return SandboxConnection(
            type="denv",
            command=f"denv exec {self._env_id} --service {self._service} -- sh",
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
