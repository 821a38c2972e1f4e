"""denv: versioned, snapshotted, forkable environments for AI agents.

The public surface (spec page ``14-ref-python.md``):

- :class:`Client` with ``sandbox``, ``destroy``, ``current_version``, ``snapshot``,
  ``fork``, ``verify``, ``exec`` and the file helpers;
- the dataclasses :class:`Sandbox`, :class:`ExecResult`, :class:`Verdict`;
- :class:`AsyncClient`, the same methods as coroutines (run in a worker thread);
- adapters: ``denv.harbor.DenvEnvironment``, ``denv.inspect`` (the ``denv`` Inspect
  sandbox), ``denv.openenv.DenvProvider``.

The transport is the native module ``denv._native`` (Rust gRPC client over pyo3).
"""

from denv.client import (
    Client,
    EnvInfo,
    ExecResult,
    LogFollower,
    LogLine,
    Sandbox,
    Verdict,
    shell_command,
)
from denv.aio import AsyncClient

try:  # the native module is absent only in a source checkout that was never built
    from denv._native import DenvError
except ImportError:  # pragma: no cover - exercised only without the extension

    class DenvError(RuntimeError):  # type: ignore[no-redef]
        """A server error: ``status`` (HTTP-like) and ``code`` (gRPC code name)."""

        status: int = 0
        code: str = ""


__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "DenvError",
    "EnvInfo",
    "ExecResult",
    "LogFollower",
    "LogLine",
    "Sandbox",
    "Verdict",
    "shell_command",
    "__version__",
]
