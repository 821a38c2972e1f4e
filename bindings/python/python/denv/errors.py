"""The errors the control plane reports, as Python exceptions (spec page ``14-ref-python.md``).

A failed call raises :class:`DenvError`, a ``RuntimeError`` whose text is
``denv <status>: <message>``. ``status`` is the HTTP status the control plane itself
sent with the error (gRPC metadata ``x-denv-http-status``, the status the REST API
answers for the same failure), never derived here from the gRPC code: ``504`` (the host
did not answer in time), ``502`` (the host could not run the command), ``410``, ``428``
and ``429`` arrive as they are. Failures the native client makes itself carry their own
status (``502`` when the server cannot be reached, ``504`` when the call's deadline
passed, ``400`` for a request it would not send).

:func:`error_for` is the one place a status becomes an exception; the native module
calls it for every failure. :func:`status_of` reads the status back for code that
branches on it.
"""

from __future__ import annotations

__all__ = ["DenvError", "error_for", "status_of"]


class DenvError(RuntimeError):
    """A failure the control plane (or the native client, for its own) reported.

    ``str(e)`` is ``denv <status>: <message>`` (``denv: <message>`` when no status came
    with it).
    """

    status: int
    """The HTTP status the server sent (e.g. 404, 502, 504); 0 when none came with it."""
    code: str
    """The gRPC status code name (e.g. ``"DeadlineExceeded"``); ``""`` when unknown."""
    message: str
    """The server's message alone."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        self.message = message
        self.status = int(status or 0)
        self.code = code
        prefix = f"denv {self.status}" if self.status else "denv"
        super().__init__(f"{prefix}: {message}")

    def __reduce__(self) -> tuple[type[DenvError], tuple[str, int, str]]:
        # Pickled (e.g. across worker processes) with its status, not only its text.
        return (type(self), (self.message, self.status, self.code))


def error_for(status: int | None, code: str, message: str) -> DenvError:
    """The exception for a failure with HTTP ``status`` (``None`` or 0: unknown), gRPC
    ``code`` name and ``message``.

    Every status is a :class:`DenvError` carrying it; callers branch on ``e.status``
    (see :func:`status_of`) rather than on the text.
    """
    return DenvError(message, status or 0, code)


def status_of(e: BaseException) -> int:
    """The HTTP status a :class:`DenvError` carries; 0 for any other exception."""
    status = getattr(e, "status", 0) if isinstance(e, DenvError) else 0
    return status if isinstance(status, int) else 0
