"""denv: versioned, snapshotted, forkable environments for AI agents.

The public surface (spec page ``14-ref-python.md``):

- :class:`Client` with ``sandbox``, ``destroy``, ``current_version``, ``snapshot``,
  ``fork``, ``verify``, ``exec`` and the file helpers;
- the dataclasses :class:`Sandbox`, :class:`ExecResult`, :class:`Verdict`;
- :class:`AsyncClient`, the same methods as coroutines (run in a worker thread);
- :class:`DenvError`, raised for every failure the server reports, with its ``status``
  (``denv.errors``);
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
from denv.errors import DenvError

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
