"""OpenEnv container provider on denv (spec pages ``06-openenv-howto.md``, ``14-ref-python.md``).

Written for openenv-core 0.3, whose clients are async (``from_docker_image``, ``reset``,
``step`` and ``close`` are coroutines; ``env.sync()`` wraps them) and keep the provider
privately, so hold on to the provider you pass::

    from denv.openenv import DenvProvider
    provider = DenvProvider()     # egress="deny" by default; the port is still published
    env = await MyEnv.from_docker_image("org/my-env:v1", provider=provider)
    branch = await provider.fork_client(MyEnv)   # a client of a fork of the live env

The server's port is published on the host under either egress: with ``egress="deny"``
(the default) the environment serves on its port and is still denied the internet, the
host and other environments.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import httpx

from openenv.core.containers.runtime.providers import ContainerProvider

from denv.client import ROLLOUT_TTL_SEC, Client, Sandbox, ttl_arg

__all__ = ["DenvProvider"]

#: The port an OpenEnv server listens on inside its image.
DEFAULT_PORT = 8000


def start_resources(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The caps of ``start_container(**kwargs)``: ``resources``, plus OpenEnv's swarm
    spellings ``cpu_limit`` → ``cpus`` and ``memory_limit`` → ``memory`` where
    ``resources`` does not set them."""
    caps = dict(kwargs.get("resources") or {})
    if kwargs.get("cpu_limit") is not None:
        caps.setdefault("cpus", kwargs["cpu_limit"])
    if kwargs.get("memory_limit") is not None:
        caps.setdefault("memory", kwargs["memory_limit"])
    return caps


class DenvProvider(ContainerProvider):
    """OpenEnv's ``ContainerProvider`` backed by one denv environment.

    Args:
        client: a :class:`denv.Client`; default ``Client()`` (``DENV_SERVER``,
            ``DENV_API_KEY``; ``RuntimeError`` without a key).
        egress: ``"deny"`` (default) or ``"allow"``; the server's port is published
            under either.

    Attributes:
        env_id: the environment id once started (``None`` before).
        base_url: ``http://<host>:<port>`` once started (``None`` before).
        sandbox: the :class:`denv.Sandbox` once started.
    """

    def __init__(
        self,
        client: Client | None = None,
        egress: str = "deny",
        ttl_sec: float | None = ROLLOUT_TTL_SEC,
    ) -> None:
        if egress not in ("deny", "allow"):
            raise ValueError(f"egress must be deny or allow, not {egress!r}")
        self.client: Client = client or Client()
        self.egress: str = egress
        #: The TTL of every environment this provider creates (default 7200 s; ``None``:
        #: none); ``start_container(ttl_sec=…)`` overrides it.
        self.ttl_sec: float | None = ttl_arg(ttl_sec)
        self.env_id: Optional[str] = None
        self.base_url: Optional[str] = None
        self.sandbox: Optional[Sandbox] = None
        self.port: int = DEFAULT_PORT

    def __repr__(self) -> str:
        return f"DenvProvider(env_id={self.env_id!r}, base_url={self.base_url!r})"

    def start_container(
        self,
        image: str,
        port: Optional[int] = None,
        env_vars: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> str:
        """Create a sandbox from ``image`` publishing container port ``port`` (8000).

        ``kwargs``: ``cmd`` (argv), ``volumes``, ``name``, ``project``, ``timeout_sec``,
        ``ttl_sec`` (default the provider's), ``resources`` (caps, as
        :meth:`denv.Client.sandbox`), and OpenEnv's ``DockerSwarmProvider`` spellings
        ``cpu_limit`` (CPUs) and ``memory_limit`` (a size like ``512M``), which become
        ``resources["cpus"]`` / ``resources["memory"]`` unless ``resources`` sets them.
        Returns ``base_url`` once the environment is healthy.

        Raises:
            RuntimeError: no endpoint was published for ``port``, or a server error.
        """
        self.port = int(port or DEFAULT_PORT)
        extra = {k: kwargs[k] for k in ("volumes", "name", "project", "timeout_sec") if k in kwargs}
        extra["ttl_sec"] = ttl_arg(kwargs["ttl_sec"]) if "ttl_sec" in kwargs else self.ttl_sec
        caps = start_resources(kwargs)
        if caps:
            extra["resources"] = caps
        sbx = self.client.sandbox(
            image=image,
            cmd=kwargs.get("cmd"),
            env=env_vars or {},
            ports=[self.port],
            egress=self.egress,
            **extra,
        )
        self._bind(sbx)
        if self.base_url is None:
            self.client.destroy(sbx.id)
            self.env_id = None
            raise RuntimeError(
                f"denv: environment {sbx.id} published no endpoint for port {self.port}"
            )
        return self.base_url

    def _bind(self, sbx: Sandbox) -> None:
        self.sandbox = sbx
        self.env_id = sbx.id
        self.base_url = None
        if sbx.endpoints:
            addr = _pick_endpoint(sbx.endpoints, self.port)
            if addr:
                self.base_url = addr if "://" in addr else f"http://{addr}"

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Poll ``GET <base_url>/health`` until it answers below 500.

        Raises ``TimeoutError`` after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + float(timeout_s)
        last: str = "no answer"
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            while True:
                try:
                    r = http.get(f"{base_url.rstrip('/')}/health")
                    if r.status_code < 500:
                        return
                    last = f"status {r.status_code}"
                except httpx.HTTPError as e:
                    last = str(e) or type(e).__name__
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"environment at {base_url} did not become ready within {timeout_s}s ({last})"
                    )
                time.sleep(0.5)

    def fork(
        self, name: str | None = None, timeout_sec: int = 600, ready_timeout_s: float = 60.0
    ) -> "DenvProvider":
        """Snapshot the live environment and return a provider bound to a fork of it.

        The child has its own ``env_id`` and, when it published an endpoint, its own
        ``base_url``, and is returned once its server answers ``/health`` (at most
        ``ready_timeout_s`` seconds; ``0``: do not wait). Only ``volumes`` paths carry
        over; the server process restarts.

        Raises ``RuntimeError`` when not started or on a server error, ``TimeoutError``
        when the fork's server does not become ready (the fork is destroyed).
        """
        if self.env_id is None:
            raise RuntimeError("denv: fork() before start_container()")
        child = DenvProvider(client=self.client, egress=self.egress, ttl_sec=self.ttl_sec)
        child.port = self.port
        child._bind(
            self.client.fork(self.env_id, name=name, timeout_sec=timeout_sec, ttl_sec=self.ttl_sec)
        )
        if child.base_url and ready_timeout_s:
            try:
                child.wait_for_ready(child.base_url, timeout_s=ready_timeout_s)
            except BaseException:
                child.stop_container()
                raise
        return child

    async def fork_client(self, client_cls: Any, name: str | None = None, timeout_sec: int = 600) -> Any:
        """A connected OpenEnv client of a fork of the live environment.

        ``client_cls`` is the environment's client class (``MyEnv``); the result is
        ``client_cls(base_url=<fork's url>, provider=<fork's provider>)`` after
        ``connect()``, so its ``close()`` destroys the fork. Raises as :meth:`fork`, and
        ``RuntimeError`` when the fork published no endpoint.
        """
        import asyncio

        child = await asyncio.to_thread(self.fork, name, timeout_sec)
        if not child.base_url:
            child.stop_container()
            raise RuntimeError(f"denv: fork of {self.env_id} published no endpoint for port {self.port}")
        client = client_cls(base_url=child.base_url, provider=child)
        try:
            await client.connect()
        except BaseException:
            child.stop_container()
            raise
        return client

    def stop_container(self) -> None:
        """Destroy the environment (no-op when not started)."""
        if self.env_id is not None:
            env_id, self.env_id = self.env_id, None
            self.base_url = None
            self.client.destroy(env_id)

    def close(self) -> None:
        """Same as :meth:`stop_container`."""
        self.stop_container()


def _pick_endpoint(endpoints: dict[str, str], port: int) -> Optional[str]:
    """The endpoint for ``port``: keys may be a service or ``service:port``."""
    for key, addr in endpoints.items():
        if key.endswith(f":{port}") or key.endswith(f"/{port}"):
            return addr
    if len(endpoints) == 1:
        return next(iter(endpoints.values()))
    return endpoints.get("main") or next(iter(endpoints.values()), None)
