"""Suite-wide rules for the Python package's tests.

A test that cannot run its real subject (no Docker, a framework package missing, not
root) reports a skip with its reason. Under ``CI=true`` the machine is expected to run
everything, so any skip turns into a failure at the end of the session: a suite that
passes there ran every test.
"""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") == "true" and _skipped:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if os.environ.get("CI") == "true" and _skipped:
        terminalreporter.section("skips are failures under CI=true")
        for line in _skipped:
            terminalreporter.write_line(f"SKIPPED {line}")
