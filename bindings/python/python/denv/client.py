"""The synchronous denv client (spec page ``14-ref-python.md``).

:class:`Client` talks gRPC to the control plane through the native module
``denv._native`` (Rust, ``crates/denv-client``). Messages cross the boundary as
JSON text shaped like the REST API's bodies (stored objects use the capitalised field
names ``ID``, ``Name``, ``CurrentVersionID`` ...), and tar archives as ``bytes``.

Errors: every failure the server reports raises :class:`denv.DenvError`, a
``RuntimeError`` whose text is ``denv <status>: <message>`` and which carries
``status``, the HTTP status the server sent with the error (the REST API's: ``404``,
``400``, ``502``, ``504`` ...), and ``code`` (see ``denv.errors``).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence, overload

__all__ = [
    "Client",
    "Sandbox",
    "ExecResult",
    "Verdict",
    "LogLine",
    "LogFollower",
    "EnvInfo",
    "shell_command",
    "DEFAULT_SERVER",
]

#: Control plane used when neither ``server=`` nor ``DENV_SERVER`` is given.
DEFAULT_SERVER = "http://localhost:8080"

_FINAL = ("succeeded", "failed", "rolled_back")


@dataclass
class Sandbox:
    """An environment as returned by ``sandbox()`` / ``fork()``.

    ``endpoints`` maps a service name to ``"127.0.0.1:<port>"`` (published ports, under
    either egress); ``raw`` is the environment object as the server returned it
    (REST field names: ``ID``, ``Name``, ``Status``, ``CurrentVersionID`` ...).
    """

    id: str
    name: str
    status: str
    endpoints: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    #: When its TTL destroys it (RFC 3339), ``""`` when it has none.
    expires_at: str = ""


@dataclass
class ExecResult:
    """The outcome of one command. A non-zero ``exit_code`` is not an error.

    Each stream keeps its first 4 MiB; ``stdout_truncated``/``stderr_truncated`` say
    that more was written (the text carries no marker). ``timed_out``: the command ran
    past its timeout and was killed (``exit_code`` 124).
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False


@dataclass
class Verdict:
    """The outcome of ``verify()``: the verify deployment's ``verdict`` phase.

    ``reward`` is ``None`` when the deployment failed; ``refused`` lists
    ``"<path>: <reason>"``; ``source`` is ``reward.txt``, ``stdout``, ``refused`` or
    ``error``; ``status`` is the deployment's status (``succeeded``, ``failed``,
    ``rolled_back``); ``evidence`` is the verdict phase's evidence as returned.
    """

    deployment_id: str
    reward: float | None
    refused: list[str]
    missing: list[str]
    source: str
    status: str
    evidence: dict[str, Any]


@dataclass
class LogLine:
    """One line of a service's container output (:meth:`Client.logs`).

    ``service`` is set by the control plane from the host command the line came from,
    never from the line's text; ``stream`` is ``"stdout"`` or ``"stderr"``; ``line`` has
    no newline (invalid UTF-8 replaced); ``timestamp`` is the engine's RFC 3339 time with
    ``timestamps=True``, else ``""``. ``truncated`` marks a last entry (no line) of a
    service whose output reached the 8 MiB cap of one call.
    """

    service: str
    stream: str
    line: str
    timestamp: str = ""
    truncated: bool = False


@dataclass
class EnvInfo:
    """One environment of :meth:`Client.list_envs` (``GET /v1/envs``)."""

    id: str
    name: str
    project_id: str
    project: str
    status: str
    current_version: str
    stage: str = ""
    raw: dict[str, Any] = field(default_factory=dict)


def _log_line(j: Mapping[str, Any]) -> LogLine:
    return LogLine(
        service=str(j.get("service") or ""),
        stream=str(j.get("stream") or ""),
        line=str(j.get("line") or ""),
        timestamp=str(j.get("timestamp") or ""),
        truncated=bool(j.get("truncated")),
    )


class LogFollower:
    """The lines of ``Client.logs(..., follow=True)`` as they are written.

    Iterate it (each item a :class:`LogLine`); :meth:`next` takes a timeout. Iteration
    ends when every followed container stopped or the follow's 24 h passed. ``close()``
    (or leaving a ``with`` block) ends the call, and the control plane stops reading the
    containers' logs on the host.
    """

    def __init__(self, native_stream: Any) -> None:
        self._s = native_stream

    def next(self, timeout_sec: float | None = None) -> LogLine | None:
        """The next line; ``None`` at the end; ``TimeoutError`` when none came within
        ``timeout_sec`` (the follow goes on)."""
        out = self._s.next_json(timeout_sec)
        return None if out is None else _log_line(json.loads(out))

    def __iter__(self) -> Iterator[LogLine]:
        while True:
            line = self.next()
            if line is None:
                return
            yield line

    def close(self) -> None:
        """End the follow."""
        self._s.close()

    def __enter__(self) -> "LogFollower":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------- shell


def _bash_or_sh(inner: str) -> str:
    """A POSIX sh script that runs ``inner`` with bash when present, sh otherwise."""
    q = shlex.quote(inner)
    return (
        "if command -v bash >/dev/null 2>&1; "
        f"then exec bash -c {q}; else exec sh -c {q}; fi"
    )


def shell_command(
    script: str,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    user: str | int | None = None,
) -> list[str]:
    """Build one argv that runs ``script`` in a service.

    The script runs through ``bash -c`` when the image has bash and ``sh -c``
    otherwise, with every ``env`` entry exported first and ``cwd`` applied (``cd``;
    a missing directory fails the command with the shell's exit code).

    The user is not part of the argv: pass it to :meth:`Client.exec` (``user=``), the
    engine's own exec user, which works whatever the image's default user is.

    Raises:
        ValueError: an environment variable name that is not a shell identifier.
        TypeError: ``user`` given (it is :meth:`Client.exec`'s argument now; running
            as another user from inside the command needed ``su``, which asks for a
            password when the image's default user is not root).
    """
    if user is not None:
        raise TypeError("shell_command() no longer takes user=; pass user= to Client.exec")
    lines: list[str] = []
    for key, value in (env or {}).items():
        if not key.isidentifier() or not key.isascii():
            raise ValueError(f"invalid environment variable name: {key!r}")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    if cwd:
        lines.append(f"cd {shlex.quote(str(cwd))} || exit $?")
    lines.append(script)
    return ["sh", "-c", _bash_or_sh("\n".join(lines))]


# --------------------------------------------------------------------------- tar helpers


def _tar_of_file(data: bytes, name: str, mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tar_of_dir(source_dir: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for child in sorted(source_dir.iterdir()):
            tf.add(str(child), arcname=child.name, recursive=True)
    return buf.getvalue()


#: Largest build context sent with a deploy, bytes (the control plane refuses more).
MAX_CONTEXT_BYTES = 32 * 1024 * 1024


def pack_context(context_dir: Path | str, dockerfile: str | Sequence[str] | None = None) -> bytes:
    """An uncompressed, deterministic tar of a build context directory (compose
    ``build:``; ``13-ref-compose.md`` "Builds"), byte for byte what ``denv deploy`` sends
    (both use the native module's packer): ``.dockerignore`` at the context root is
    honoured as ``docker build`` does (what it excludes is neither sent nor counted
    towards the limit), the Dockerfile(s) in use (``dockerfile``, relative to the context;
    default ``Dockerfile``) and ``.dockerignore`` itself are always sent; members in byte
    order of their paths, owner 0:0, mtime 0, permission bits kept, symlinks stored as
    links (never followed); sockets, fifos and devices are left out. The same files give
    the same bytes, so the sidecar's build cache hits.

    Raises:
        NotADirectoryError: ``context_dir`` is not a directory.
        ValueError: the archive would pass 32 MiB (``build context <dir> is larger than
            32 MiB (stopped at <path>); leave large files out of it``), or a
            ``.dockerignore`` line does not parse (``<dir>/.dockerignore line <n>:
            pattern "<p>" does not parse: <reason>``).
        OSError: a file of the context cannot be read.
    """
    from denv import _native

    dockerfiles = [dockerfile] if isinstance(dockerfile, str) else list(dockerfile or [])
    return _native.pack_context(Path(context_dir), dockerfiles)


def build_contexts(
    compose: Mapping[str, Any], base_dir: Path | str, root: Path | str | None = None
) -> dict[str, str]:
    """The deploy request's ``contexts`` for a parsed compose mapping: for each service
    with a ``build:``, the context as written (``"."`` when unset) → base64 of
    :func:`pack_context` of that directory (relative to ``base_dir``, or absolute), keeping
    the ``dockerfile`` of every service that builds from it (as ``denv deploy`` does).

    With ``root``, every context must resolve (symlinks followed) inside ``root``:
    ``ValueError`` naming the context otherwise, before anything is read."""
    import base64

    dockerfiles: dict[str, list[str]] = {}
    services = compose.get("services") or {}
    if not isinstance(services, Mapping):
        return {}
    for svc in services.values():
        if not isinstance(svc, Mapping) or "build" not in svc or svc["build"] is None:
            continue
        b = svc["build"]
        ctx = b if isinstance(b, str) else (b.get("context") if isinstance(b, Mapping) else None)
        ctx = str(ctx).strip() if ctx not in (None, "") else "."
        df = b.get("dockerfile") if isinstance(b, Mapping) else None
        df = str(df).strip() if df not in (None, "") else "Dockerfile"
        dockerfiles.setdefault(ctx, []).append(df)
    if root is not None:
        top = Path(root).resolve()
        for ctx in dockerfiles:
            where = (Path(base_dir) / ctx).resolve()
            if where != top and top not in where.parents:
                raise ValueError(
                    f"compose: build context {ctx!r} resolves to {where}, outside {top}"
                )
    return {
        ctx: base64.b64encode(pack_context(Path(base_dir) / ctx, dfs)).decode()
        for ctx, dfs in dockerfiles.items()
    }


def _first_regular_file(tar_bytes: bytes) -> bytes | None:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:*") as tf:
        for member in tf:
            if member.isfile():
                f = tf.extractfile(member)
                if f is not None:
                    return f.read()
    return None


def _extract_contents(tar_bytes: bytes, target_dir: Path) -> None:
    """Extract the archive of a directory so its *contents* land in ``target_dir``.

    The server archives ``/a/b`` with entries under ``b/``; the first path component
    is stripped (``docker cp src/.`` semantics). Links and special files are skipped,
    and no entry may escape ``target_dir``.
    """
    target_dir.mkdir(parents=True, exist_ok=True)
    root = target_dir.resolve()
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:*") as tf:
        members = tf.getmembers()
        prefix = _common_root(members)
        for m in members:
            name = m.name.lstrip("/")
            if prefix is not None:
                if name == prefix or name == prefix + "/":
                    continue
                name = name[len(prefix) + 1 :]
            name = name.rstrip("/")
            if not name or name == ".":
                continue
            dest = (root / name).resolve()
            if dest != root and root not in dest.parents:
                continue
            if m.isdir():
                dest.mkdir(parents=True, exist_ok=True)
            elif m.isfile():
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tf.extractfile(m)
                if src is None:
                    continue
                with open(dest, "wb") as out:
                    out.write(src.read())
                try:
                    os.chmod(dest, m.mode & 0o777)
                except OSError:
                    pass


def _common_root(members: Sequence[tarfile.TarInfo]) -> str | None:
    """The single top-level directory every entry lives under, if there is one."""
    tops = set()
    top_is_dir = False
    for m in members:
        name = m.name.lstrip("/").rstrip("/")
        if name.startswith("./"):
            name = name[2:]
        if not name or name == ".":
            continue
        first = name.split("/", 1)[0]
        tops.add(first)
        if name == first and m.isdir():
            top_is_dir = True
        if "/" in name:
            top_is_dir = True
    if len(tops) == 1 and top_is_dir:
        return tops.pop()
    return None


def _split_path(path: str) -> tuple[str, str]:
    p = path.rstrip("/")
    parent, _, base = p.rpartition("/")
    if not base:
        raise ValueError(f"not a file path: {path!r}")
    return (parent or "/"), base


# --------------------------------------------------------------------------- client


class Client:
    """A denv control-plane client. All methods are synchronous.

    Args:
        server: control plane base URL; default ``$DENV_SERVER``, else
            ``http://localhost:8080``. gRPC and REST share this one port.
        api_key: team API key ``dak_…``; default ``$DENV_API_KEY``.
        timeout: default per-call timeout in seconds (900). Calls that wait for a
            deployment use the larger of this and their own ``timeout_sec``.
        ca_file: for an ``https://`` server, a PEM file of the CA certificates its
            certificate must chain to, instead of the built-in and system roots;
            default ``$DENV_CA_FILE``. Read on first use: a missing file or one without
            a certificate raises :class:`denv.DenvError` (status 400) then.

    Raises:
        RuntimeError: ``"DENV_API_KEY is not set"`` when no key is given or set.

    The connection is opened on first use, so constructing a client never blocks.
    """

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        timeout: float = 900.0,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.server: str = (server or os.environ.get("DENV_SERVER") or DEFAULT_SERVER).rstrip("/")
        key = api_key or os.environ.get("DENV_API_KEY")
        if not key:
            raise RuntimeError("DENV_API_KEY is not set")
        self.api_key: str = key
        self.timeout: float = float(timeout)
        ca = os.fspath(ca_file) if ca_file is not None else os.environ.get("DENV_CA_FILE")
        self.ca_file: str | None = ca or None
        self._native_client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Client(server={self.server!r})"

    # ---- native plumbing

    @property
    def _n(self) -> Any:
        if self._native_client is None:
            with self._lock:
                if self._native_client is None:
                    from denv import _native

                    self._native_client = _native.Client(
                        self.server, self.api_key, None, self.timeout, self.ca_file
                    )
        return self._native_client

    def _call(self, method: str, request: Mapping[str, Any], timeout_sec: float | None = None) -> dict[str, Any]:
        out = self._n.call(method, json.dumps(request), timeout_sec)
        return json.loads(out) if out else {}

    def _wait(self, deployment_id: str, timeout_sec: float) -> dict[str, Any]:
        """Wait until the deployment is final; returns ``{deployment, phases}``."""
        out = self._n.wait_deployment(deployment_id, float(timeout_sec))
        return json.loads(out)

    def _deadline(self, timeout_sec: float) -> float:
        return max(self.timeout, float(timeout_sec) + 60.0)

    # ---- sandboxes and versions

    def sandbox(
        self,
        *,
        image: str | None = None,
        from_version: str | None = None,
        cmd: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        ports: Sequence[int | str] | None = None,
        egress: str = "deny",
        volumes: Sequence[str] | None = None,
        name: str | None = None,
        project: str | None = None,
        timeout_sec: int = 600,
        ttl_sec: float | None = None,
        pool: int | None = None,
        resources: Mapping[str, Any] | None = None,
    ) -> Sandbox:
        """Create one environment for one episode (``POST /v1/sandboxes``).

        Exactly one of ``image`` (one container from this image, ``cmd``, ``env``,
        ``ports`` and ``volumes`` apply; ``volumes`` default ``["/work"]``) or
        ``from_version`` (fork a healthy version, data included) is required.
        ``ports`` are container ports to publish on the host's loopback; they work under
        ``egress="deny"`` too (inbound only: the environment still opens no connection out).
        Returns when every service is healthy; waits at most ``timeout_sec`` seconds.
        ``ttl_sec`` destroys the sandbox that many seconds after the call (reason ``ttl``;
        its host enforces it even while the control plane is unreachable); ``None``: no
        TTL. If the call is interrupted before it returns, the sandbox is destroyed.
        ``pool`` (``from_version`` only, 0 to 64): keep that many forks of the version
        warm from now on; later sandboxes of it are handed out from the warm pool
        (docs/reference/deployments.md "Warm pool"). ``None`` leaves the pool as it is.
        ``resources`` (either form): caps for this sandbox, any of ``{"cpus": 0.5,
        "memory": "512m", "pids": 256, "disk": "2g"}`` (sizes like compose's
        ``mem_limit``; a bare number is bytes). ``cpus``/``memory``/``pids`` replace the
        agent service's caps (``main`` in the image form), ``disk`` the environment's
        quota (docs/reference/rest-api.md "Resources"). The server refuses invalid values
        or values above the host's capacity with ``denv 400: resources.<key> …``.

        Raises:
            ValueError: neither or both of ``image`` and ``from_version``; ``ttl_sec``
                below 1; ``resources`` not a mapping.
            RuntimeError: ``denv 502: …`` when the deployment failed, ``denv 504: …``
                on timeout, other statuses as the server reports them.
        """
        if (image is None) == (from_version is None) or (image == "" or from_version == ""):
            raise ValueError("exactly one of image or from_version is required")
        if egress not in ("deny", "allow"):
            raise ValueError(f"egress must be deny or allow, not {egress!r}")
        req: dict[str, Any] = {"egress": egress, "timeout_sec": int(timeout_sec)}
        ttl = _ttl(ttl_sec)
        if ttl:
            req["ttl_sec"] = ttl
        if image is not None:
            req["image"] = image
            req["cmd"] = list(cmd or [])
            req["env"] = {str(k): str(v) for k, v in (env or {}).items()}
            req["ports"] = [str(p) for p in (ports or [])]
            req["volumes"] = list(volumes) if volumes is not None else ["/work"]
        else:
            req["from_version"] = from_version
        if pool is not None:
            req["pool"] = int(pool)
        caps = _resources(resources)
        if caps:
            req["resources"] = caps
        if name:
            req["name"] = name
        if project:
            req["project"] = project
        resp = self._call("CreateSandbox", req, self._deadline(timeout_sec))
        return _sandbox_of(resp.get("environment") or {})

    def destroy(self, env_id: str) -> None:
        """Start destroying an environment (``DELETE /v1/envs/{id}``); does not wait."""
        self._call("Destroy", {"env": env_id})

    def list_envs(
        self, project: str | None = None, status: str | None = None, all: bool = False
    ) -> list[EnvInfo]:
        """The team's environments across projects, oldest first (``GET /v1/envs``).

        ``project`` (a name or id) and ``status`` (``pending``, ``deploying``,
        ``healthy``, ``failed``, ``destroying``, ``destroyed``) filter; destroyed
        environments are left out unless ``all`` or ``status="destroyed"``. An unknown
        status raises ``denv 400: unknown status …`` naming the allowed ones, an unknown
        project ``denv 404``.
        """
        req: dict[str, Any] = {"all": bool(all)}
        if project:
            req["project"] = project
        if status:
            req["status"] = status
        resp = self._call("ListAllEnvs", req)
        return [
            EnvInfo(
                id=str(e.get("ID") or ""),
                name=str(e.get("Name") or ""),
                project_id=str(e.get("ProjectID") or ""),
                project=str(e.get("Project") or ""),
                status=str(e.get("Status") or ""),
                current_version=str(e.get("CurrentVersionID") or ""),
                stage=str(e.get("Stage") or ""),
                raw=dict(e),
            )
            for e in resp.get("environments") or []
        ]

    def delete_project(self, project: str, force: bool = False, timeout_sec: int = 660) -> dict[str, Any]:
        """Delete a project (``DELETE /v1/projects/{project}``); returns
        ``{project, deleted, destroyed}``.

        Raises ``denv 409: project … has N environment(s) that are not destroyed: …``
        while it has live environments, unless ``force``, which destroys each through its
        normal destroy deployment and waits for them (at most 10 minutes) first.
        """
        return self._call(
            "DeleteProject", {"project": project, "force": bool(force)}, self._deadline(timeout_sec)
        )

    @overload
    def logs(
        self,
        env_id: str,
        service: str | None = ...,
        *,
        tail: int = ...,
        follow: Literal[False] = ...,
        timestamps: bool = ...,
        timeout_sec: float = ...,
    ) -> list[LogLine]: ...

    @overload
    def logs(
        self,
        env_id: str,
        service: str | None = ...,
        *,
        tail: int = ...,
        follow: Literal[True],
        timestamps: bool = ...,
        timeout_sec: float = ...,
    ) -> LogFollower: ...

    def logs(
        self,
        env_id: str,
        service: str | None = None,
        *,
        tail: int = 100,
        follow: bool = False,
        timestamps: bool = False,
        timeout_sec: float = 120.0,
    ) -> list[LogLine] | LogFollower:
        """A service's container output (``GET /v1/envs/{env}/logs``), every service's
        when ``service`` is ``None``.

        ``tail`` lines of backlog per service (0: none; at most 10000). Without
        ``follow`` returns the lines (at most 8 MiB per service; a cut service ends with
        a ``truncated`` entry). With ``follow=True`` returns a :class:`LogFollower` that
        yields the backlog and then new lines as they are written. An unknown service
        raises ``denv 400`` naming the environment's services; a destroyed environment
        ``denv 409``; a host that is away ``denv 502``.
        """
        if tail < 0:
            raise ValueError("tail must be 0 or more lines")
        req: dict[str, Any] = {
            "env": env_id,
            "tail": -1 if tail == 0 else int(tail),
            "follow": bool(follow),
            "timestamps": bool(timestamps),
        }
        if service:
            req["service"] = service
        stream = self._n.logs(json.dumps(req), float(timeout_sec))
        follower = LogFollower(stream)
        if follow:
            return follower
        try:
            out = []
            while True:
                line = follower.next(float(timeout_sec))
                if line is None:
                    return out
                out.append(line)
        finally:
            follower.close()

    def get_env(self, env_id: str) -> Sandbox:
        """The environment as a :class:`Sandbox` (``GET /v1/envs/{id}``)."""
        resp = self._call("GetEnv", {"env": env_id})
        return _sandbox_of(resp.get("environment") or {})

    def current_version(self, env_id: str) -> str:
        """The environment's ``CurrentVersionID`` (``""`` before its first deploy)."""
        return str(self.get_env(env_id).raw.get("CurrentVersionID") or "")

    def snapshot(self, env_id: str, timeout_sec: int = 300) -> str:
        """Capture live state as a new version and return its id (``ver_…``).

        Raises ``RuntimeError`` when the snapshot deployment does not succeed.
        """
        started = self._call("Snapshot", {"env": env_id})
        dep = self._finish(started, timeout_sec, "snapshot")
        return str(dep.get("VersionID") or "")

    def fork(
        self,
        env_id: str,
        name: str | None = None,
        timeout_sec: int = 600,
        live: bool = True,
        ttl_sec: float | None = None,
        pool: int | None = None,
        resources: Mapping[str, Any] | None = None,
    ) -> Sandbox:
        """A new environment from ``env_id``'s state.

        With ``live=True`` (default) the live state is snapshotted first and the child
        is a sandbox from that version; with ``live=False`` the current version is
        forked (``POST /v1/envs/{id}/fork``). Returns when the child is healthy.
        ``ttl_sec``: the child's TTL, as in :meth:`sandbox`. ``pool`` (``live=False``
        only): keep that many forks of the current version warm from now on.
        ``resources``: the child's own caps, as in :meth:`sandbox` (a fork with caps of
        its own is never handed out from the warm pool).
        """
        ttl = _ttl(ttl_sec)
        caps = _resources(resources)
        if live and pool is not None:
            raise ValueError("pool needs live=False (a live fork's snapshot is a new version)")
        if live:
            version = self.snapshot(env_id, timeout_sec=min(int(timeout_sec), 300) or 300)
            return self.sandbox(
                from_version=version,
                name=name,
                timeout_sec=timeout_sec,
                ttl_sec=ttl or None,
                resources=caps or None,
            )
        req: dict[str, Any] = {"env": env_id}
        if caps:
            req["resources"] = caps
        if pool is not None:
            req["pool"] = int(pool)
        if ttl:
            req["ttl_sec"] = ttl
        if name:
            req["name"] = name
        started = self._call("Fork", req)
        dep = self._finish(started, timeout_sec, "fork")
        return self.get_env(str(dep.get("EnvID") or ""))

    def verify(self, env_id: str, resume: bool = False, timeout_sec: int = 900) -> Verdict:
        """Grade the environment with its declared verifier (``POST …/verify``).

        Waits for the verify deployment and reads its ``verdict`` phase. The agent's
        processes stay frozen unless ``resume``.

        Raises:
            RuntimeError: the deployment failed without a verdict (``reward`` is
                ``None`` and nothing was refused), or a server error.
        """
        started = self._call("Verify", {"env": env_id, "resume": bool(resume)})
        dep_id = str((started.get("deployment") or {}).get("ID") or "")
        final = self._wait(dep_id, self._deadline(timeout_sec))
        dep = final.get("deployment") or {}
        status = str(dep.get("Status") or "")
        evidence: dict[str, Any] = {}
        for phase in final.get("phases") or []:
            if phase.get("Name") == "verdict" and isinstance(phase.get("Evidence"), dict):
                evidence = phase["Evidence"]
        verdict = _verdict_of(dep_id, status, evidence)
        if status != "succeeded" and verdict.reward is None and not verdict.refused:
            raise RuntimeError(f"denv verify {status}: {dep.get('Error') or 'no verdict'}")
        return verdict

    def promote(
        self,
        project: str,
        from_env: str,
        to_env: str,
        version: str | None = None,
        timeout_sec: int = 3600,
    ) -> dict[str, Any]:
        """Run the promote gates on ``from_env``'s version and, when they pass, make
        ``to_env`` run it (``POST /v1/projects/{project}/promote``; see the deployments
        reference, "promote"). ``from_env`` is an environment id or name of ``project``;
        ``to_env`` a name (created when missing); ``version`` a version of the source or
        its lineage instead of its current one.

        Returns the finished ``{deployment, phases}``. Raises ``RuntimeError`` naming the
        gate when a gate fails (``denv promote failed: gate.replay: …``): the target is
        then left as it was.
        """
        req: dict[str, Any] = {"project": project, "from": from_env, "to": to_env}
        if version:
            req["version"] = version
        started = self._call("Promote", req)
        dep_id = str((started.get("deployment") or {}).get("ID") or "")
        final = self._wait(dep_id, self._deadline(timeout_sec))
        dep = final.get("deployment") or {}
        if dep.get("Status") != "succeeded":
            raise RuntimeError(f"denv promote {dep.get('Status') or 'unknown'}: {dep.get('Error') or dep_id}")
        return final

    def sheet(self, env_or_version: str) -> dict[str, Any]:
        """The data sheet of a version (``ver_…``) or of an environment's current
        version (``GET /v1/versions/{id}/sheet``, ``GET /v1/envs/{id}/sheet``): images and
        their pinned ids, the capture, dataset digests, the egress proof, caps, clock,
        protections and the newest promote's gates. Whole numbers come back as ``int``.
        """
        key = "version" if env_or_version.startswith("ver_") else "env"
        resp = self._call("GetSheet", {key: env_or_version})
        return _whole_numbers(resp.get("sheet") or {})

    def _finish(self, started: Mapping[str, Any], timeout_sec: float, what: str) -> dict[str, Any]:
        dep = started.get("deployment") or {}
        dep_id = str(dep.get("ID") or "")
        if dep.get("Status") not in _FINAL:
            dep = self._wait(dep_id, self._deadline(timeout_sec)).get("deployment") or {}
        if dep.get("Status") != "succeeded":
            raise RuntimeError(
                f"denv {what} {dep.get('Status') or 'unknown'}: {dep.get('Error') or dep_id}"
            )
        return dict(dep)

    # ---- inside an environment

    def exec(
        self,
        env_id: str,
        service: str,
        cmd: list[str],
        timeout_sec: int = 120,
        *,
        user: str | int | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (an argv, no shell) in ``service`` (``POST …/exec``).

        ``user`` (a name, uid, ``name:group`` or ``uid:gid``) and ``cwd`` (an absolute
        path) are the engine's own exec user and working directory, like ``docker exec
        --user/--workdir``; ``None`` keeps the service's. ``user="root"`` runs as uid 0
        even in an agent service: the API caller (the trainer or framework) may ask for
        it, the agent inside cannot. ``input`` (text is UTF-8 encoded; at most 32 MiB)
        is the command's stdin, closed after it; ``env`` adds variables.

        A non-zero exit code is returned, not raised; ``denv 502: …`` means the host
        could not run it, ``denv 400: …`` names a refused ``user``/``cwd``/``env``.
        Output is decoded as UTF-8 by the server.
        """
        if isinstance(cmd, str):
            raise TypeError("cmd must be a list of strings; use shell_command() for a script")
        req: dict[str, Any] = {
            "env": env_id,
            "service": service,
            "cmd": [str(c) for c in cmd],
            "timeout_sec": int(timeout_sec),
        }
        if user is not None and str(user) != "":
            req["user"] = str(user)
        if cwd is not None and str(cwd) != "":
            req["workdir"] = str(cwd)
        if input is not None:
            data = input.encode("utf-8") if isinstance(input, str) else bytes(input)
            if data:
                req["stdin"] = base64.b64encode(data).decode("ascii")
        if env:
            req["env_vars"] = {str(k): str(v) for k, v in env.items()}
        resp = self._call("Exec", req, self._deadline(timeout_sec))
        return ExecResult(
            exit_code=int(resp.get("exit_code") or 0),
            stdout=str(resp.get("stdout") or ""),
            stderr=str(resp.get("stderr") or ""),
            stdout_truncated=bool(resp.get("stdout_truncated")),
            stderr_truncated=bool(resp.get("stderr_truncated")),
            timed_out=bool(resp.get("timed_out")),
        )

    def put_tar(self, env_id: str, service: str, path: str, tar_bytes: bytes) -> None:
        """Extract a tar archive (at most 32 MiB) into directory ``path`` (``PUT …/files``)."""
        self._n.put_files(env_id, service, path, bytes(tar_bytes), None)

    def get_tar(self, env_id: str, service: str, path: str) -> bytes:
        """A tar archive of ``path`` (``GET …/files``); entries are under ``basename(path)``."""
        return bytes(self._n.get_files(env_id, service, path, None))

    def put_bytes(self, env_id: str, service: str, target_path: str, data: bytes) -> None:
        """Write ``data`` to the file ``target_path`` (parent directories are created)."""
        parent, base = _split_path(target_path)
        self.put_tar(env_id, service, parent, _tar_of_file(bytes(data), base))

    def put_file(self, env_id: str, service: str, source: str | os.PathLike[str], target_path: str) -> None:
        """Upload one local file to the file path ``target_path`` (mode kept)."""
        src = Path(source)
        parent, base = _split_path(target_path)
        mode = src.stat().st_mode & 0o777
        self.put_tar(env_id, service, parent, _tar_of_file(src.read_bytes(), base, mode))

    def put_dir(self, env_id: str, service: str, source_dir: str | os.PathLike[str], target_dir: str) -> None:
        """Upload a local directory's contents into ``target_dir`` (created if missing)."""
        src = Path(source_dir)
        if not src.is_dir():
            raise NotADirectoryError(str(src))
        self.put_tar(env_id, service, target_dir, _tar_of_dir(src))

    def get_bytes(self, env_id: str, service: str, source_path: str) -> bytes:
        """The content of the file ``source_path``.

        Raises ``FileNotFoundError`` when the archive holds no regular file (a
        directory); a missing path is the server's ``denv 502: …``.
        """
        data = _first_regular_file(self.get_tar(env_id, service, source_path))
        if data is None:
            raise FileNotFoundError(source_path)
        return data

    def get_file(self, env_id: str, service: str, source_path: str, target: str | os.PathLike[str]) -> None:
        """Download one file to the local path ``target`` (parents created)."""
        data = self.get_bytes(env_id, service, source_path)
        t = Path(target)
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_bytes(data)

    def get_dir(self, env_id: str, service: str, source_dir: str, target_dir: str | os.PathLike[str]) -> None:
        """Extract the directory's contents under ``target_dir`` (``docker cp src/.``)."""
        _extract_contents(self.get_tar(env_id, service, source_dir.rstrip("/") or "/"), Path(target_dir))


def _whole_numbers(v: Any) -> Any:
    """Floats that are whole numbers as ints, recursively (protobuf ``Struct`` values
    carry every number as a double)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 9e15:
        return int(v)
    if isinstance(v, dict):
        return {k: _whole_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_whole_numbers(x) for x in v]
    return v


def _sandbox_of(env: Mapping[str, Any]) -> Sandbox:
    return Sandbox(
        id=str(env.get("ID") or ""),
        name=str(env.get("Name") or ""),
        status=str(env.get("Status") or ""),
        endpoints={str(k): str(v) for k, v in (env.get("Endpoints") or {}).items()},
        raw=dict(env),
        expires_at=str(env.get("ExpiresAt") or ""),
    )


#: The TTL the Harbor, Inspect and OpenEnv adapters give the environments they create
#: unless told otherwise (2 hours): a crashed trainer or eval leaves nothing running
#: for long.
ROLLOUT_TTL_SEC = 7200


def ttl_arg(v: Any) -> float | None:
    """A TTL given as a number or a string (``--ek ttl_sec=3600``): ``None`` for
    ``None``, ``0``, ``""``, ``"none"``; ``ValueError`` for anything else that is not a
    positive number of seconds."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "0")):
        return None
    try:
        n = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"ttl_sec must be a number of seconds, not {v!r}") from None
    if n == 0:
        return None
    _ttl(n)
    return n


def _resources(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    """A request's ``resources`` object: keys with ``None`` values dropped; the server
    validates the rest (``denv 400: resources.<key> …``)."""
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise ValueError(f"resources must be a mapping like {{'cpus': 1, 'memory': '2g'}}, not {resources!r}")
    return {str(k): v for k, v in resources.items() if v is not None}


def _ttl(ttl_sec: float | None) -> int:
    """``ttl_sec`` as the wire's whole seconds (0 = none); ``ValueError`` when not positive."""
    if ttl_sec is None:
        return 0
    if isinstance(ttl_sec, bool) or not isinstance(ttl_sec, (int, float)) or ttl_sec < 1:
        raise ValueError(f"ttl_sec must be a number of seconds >= 1, not {ttl_sec!r}")
    return int(ttl_sec)


def _strings(v: Any) -> list[str]:
    if not isinstance(v, list):
        return []
    out: list[str] = []
    for item in v:
        if isinstance(item, dict):
            path = item.get("path") or item.get("Path") or ""
            reason = item.get("reason") or item.get("Reason") or ""
            out.append(f"{path}: {reason}" if reason else str(path))
        else:
            out.append(str(item))
    return out


def _verdict_of(dep_id: str, status: str, evidence: Mapping[str, Any]) -> Verdict:
    reward = evidence.get("reward")
    try:
        reward_f = float(reward) if reward is not None else None
    except (TypeError, ValueError):
        reward_f = None
    refused = _strings(evidence.get("refused"))
    source = str(evidence.get("source") or ("refused" if refused else "error" if reward_f is None else ""))
    return Verdict(
        deployment_id=dep_id,
        reward=reward_f,
        refused=refused,
        missing=_strings(evidence.get("missing")),
        source=source,
        status=status,
        evidence=dict(evidence),
    )
