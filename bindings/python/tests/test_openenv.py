"""The OpenEnv provider against the installed openenv-core (no server needed)."""

from __future__ import annotations

import http.server
import threading

import pytest

pytest.importorskip("openenv.core.containers.runtime.providers")

from openenv.core.containers.runtime.providers import ContainerProvider  # noqa: E402

from denv import Client, Sandbox  # noqa: E402
from denv.openenv import DenvProvider, _pick_endpoint  # noqa: E402


def client() -> Client:
    return Client(server="http://127.0.0.1:9", api_key="dak_unit")


def test_is_a_container_provider() -> None:
    p = DenvProvider(client=client())
    assert isinstance(p, ContainerProvider)
    assert DenvProvider.__abstractmethods__ == frozenset()
    assert p.egress == "deny" and p.env_id is None and p.base_url is None
    p.stop_container()  # not started: no-op, no network
    with pytest.raises(RuntimeError, match="before start_container"):
        p.fork()
    with pytest.raises(ValueError):
        DenvProvider(client=client(), egress="open")


def test_binds_the_published_endpoint() -> None:
    p = DenvProvider(client=client(), egress="allow")
    p._bind(Sandbox(id="env_1", name="n", status="healthy", endpoints={"main": "127.0.0.1:41234"}))
    assert (p.env_id, p.base_url) == ("env_1", "http://127.0.0.1:41234")
    p._bind(Sandbox(id="env_2", name="n", status="healthy", endpoints={}))
    assert p.base_url is None
    assert _pick_endpoint({"db": "127.0.0.1:1", "main:8000": "127.0.0.1:2"}, 8000) == "127.0.0.1:2"


class _Health(http.server.BaseHTTPRequestHandler):
    codes: list[int] = []

    def do_GET(self) -> None:  # noqa: N802
        code = self.codes.pop(0) if self.codes else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *a) -> None:  # silence
        pass


def test_wait_for_ready_polls_until_below_500() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        _Health.codes = [503, 503, 404]
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        DenvProvider(client=client()).wait_for_ready(url, timeout_s=10)
        assert _Health.codes == []  # three polls happened: 503, 503, then 404 (<500)
        _Health.codes = [500] * 100
        with pytest.raises(TimeoutError):
            DenvProvider(client=client()).wait_for_ready(url, timeout_s=1.2)
    finally:
        srv.shutdown()


def test_swarm_resource_kwargs_become_caps() -> None:
    from denv.openenv import start_resources

    assert start_resources({}) == {}
    assert start_resources({"cpu_limit": 0.5, "memory_limit": "512M"}) == {"cpus": 0.5, "memory": "512M"}
    assert start_resources({"resources": {"memory": "1g", "pids": 64}, "memory_limit": "512M"}) == {
        "memory": "1g",
        "pids": 64,
    }
