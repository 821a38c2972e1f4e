"""Type stubs for the native module ``denv._native`` (Rust, pyo3, over ``denv-client``).

Messages cross as JSON text shaped like the REST API's bodies; tar archives as bytes.
Every method releases the GIL while it waits on the network.
"""

import os

from denv.errors import DenvError as DenvError
# Every failure is raised as ``denv.errors.error_for(status, code, message)``: a
# ``DenvError`` whose ``status`` is the HTTP status the control plane sent (0: none).

class Client:
    """A gRPC connection to a control plane, opened lazily on first call."""

    def __init__(
        self,
        server: str,
        api_key: str,
        team: str | None = None,
        timeout_sec: float = 900.0,
        ca_file: str | None = None,
    ) -> None: ...
    def call(self, method: str, request_json: str, timeout_sec: float | None = None) -> str:
        """Call one unary RPC by name (``CreateSandbox``, ``GetEnv``, ``Exec`` …)."""
    def put_files(
        self, env: str, service: str, path: str, tar: bytes, timeout_sec: float | None = None
    ) -> str:
        """Extract a tar into ``path``; returns ``{"ok": true, "bytes": N}`` as JSON."""
    def get_files(
        self, env: str, service: str, path: str, timeout_sec: float | None = None
    ) -> bytes:
        """A tar archive of ``path``."""
    def wait_deployment(self, id: str, timeout_sec: float) -> str:
        """Wait until the deployment is final; returns ``{deployment, phases}`` as JSON."""
    def logs(self, request_json: str, timeout_sec: float | None = None) -> LogStream:
        """Start ``Logs`` with a JSON ``LogsRequest``; refusals raise here."""

class LogStream:
    """The lines of one ``Client.logs`` call."""

    def next_json(self, timeout_sec: float | None = None) -> str | None:
        """The next ``LogEntry`` as JSON; ``None`` at the end; ``TimeoutError`` when no
        line came within ``timeout_sec``."""
    def close(self) -> None:
        """End the call (a follow is cancelled on the host)."""

def methods() -> list[str]:
    """The RPC names ``Client.call`` accepts."""

def pack_context(dir: str | os.PathLike[str], dockerfiles: list[str] | None = None) -> bytes:
    """The uncompressed, deterministic tar of build context ``dir`` that ``denv deploy``
    sends (the same Rust code): ``.dockerignore`` honoured with Docker's rules, the
    ``dockerfiles`` (paths relative to ``dir``; ``None`` or empty: ``["Dockerfile"]``) and
    ``.dockerignore`` always sent, members in byte order of their paths, owner 0:0,
    mtime 0, permission bits kept, symlinks stored as links. Releases the GIL.

    Raises ``NotADirectoryError`` (``build context <dir> is not a directory``),
    ``ValueError`` past 32 MiB (``build context <dir> is larger than 32 MiB (stopped at
    <path>); leave large files out of it``) or for a bad pattern (``<dir>/.dockerignore
    line <n>: pattern "<p>" does not parse: <reason>``), ``OSError`` when a file cannot
    be read."""
