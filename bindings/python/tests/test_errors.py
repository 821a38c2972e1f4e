"""Status → exception: ``denv.errors.error_for`` is the one place a failure's HTTP status
(the control plane's own, from ``x-denv-http-status``) becomes an exception, and the
native module raises what it builds."""

from __future__ import annotations

import pickle

import pytest

import denv
from denv.errors import DenvError, error_for, status_of


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (504, "DeadlineExceeded", "timed out after 11s"),
        (502, "Unavailable", "host host_1 is not connected"),
        (404, "NotFound", "environment env_1 not found"),
        (409, "AlreadyExists", "project sandboxes already exists"),
        # These share a gRPC code with another status: a table keyed by the code gave
        # 412 for both 410 and 428, and 413 for 429.
        (410, "FailedPrecondition", "device key already handed out"),
        (428, "FailedPrecondition", "authorization_pending"),
        (429, "ResourceExhausted", "rate limited: too many requests for this credential; retry in 1 s"),
    ],
)
def test_every_status_is_a_denv_error_carrying_it(status: int, code: str, message: str) -> None:
    e = error_for(status, code, message)
    assert type(e) is DenvError
    assert isinstance(e, RuntimeError)
    assert (e.status, e.code, e.message) == (status, code, message)
    assert str(e) == f"denv {status}: {message}"
    assert status_of(e) == status


def test_an_unknown_status_is_zero_and_left_out_of_the_text() -> None:
    for status in (None, 0):
        e = error_for(status, "Unknown", "stream reset")
        assert e.status == 0
        assert str(e) == "denv: stream reset"


def test_a_pickled_error_keeps_its_status() -> None:
    e = pickle.loads(pickle.dumps(error_for(504, "DeadlineExceeded", "timed out after 11s")))
    assert (e.status, e.code, e.message, str(e)) == (
        504,
        "DeadlineExceeded",
        "timed out after 11s",
        "denv 504: timed out after 11s",
    )


def test_status_of_other_exceptions_is_zero() -> None:
    assert status_of(RuntimeError("denv 404: looks like one")) == 0
    assert status_of(ValueError("x")) == 0


def test_the_package_exports_the_one_class() -> None:
    assert denv.DenvError is DenvError
    with pytest.raises(RuntimeError, match=r"^denv 504: timed out after 11s$"):
        raise error_for(504, "DeadlineExceeded", "timed out after 11s")


def test_the_native_module_raises_what_error_for_builds() -> None:
    native = pytest.importorskip("denv._native")
    assert native.DenvError is DenvError
    c = native.Client("http://127.0.0.1:9", "dak_x", None, 5.0)
    # Refused before sending: the client's own status.
    with pytest.raises(DenvError) as bad:
        c.call("GetEnv", "[1]")
    assert (bad.value.status, bad.value.code) == (400, "InvalidArgument")
    assert str(bad.value).startswith("denv 400: bad request: ")
    # Nothing listens on port 9: the server was never reached.
    with pytest.raises(DenvError) as away:
        c.call("GetEnv", '{"env": "env_1"}')
    assert (away.value.status, away.value.code) == (502, "Unavailable")
    assert away.value.message.startswith("cannot reach http://127.0.0.1:9")
