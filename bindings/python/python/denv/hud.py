"""HUD runtime on denv (spec page ``35-blog-hud.md``), checked against ``hud`` 0.6
(the package ``hud-python`` was renamed ``hud`` on PyPI; ``pip install hud``)::

    from denv.hud import DenvRuntime
    job = await task.run(agent, runtime=DenvRuntime("you/ops-env:v2"))

In HUD 0.6 a runtime is a *provider*: called with the task being placed, it brings up
the environment's control channel and yields a :class:`hud.eval.Runtime` (its
``tcp://`` address); HUD's client connects to it, runs the task's template (prompt,
agent loop, reward) and the provider tears the substrate down afterwards.
:class:`DenvRuntime` does that with one denv sandbox per rollout:

- **start**: ``POST /v1/sandboxes {image, ports: [port], egress}`` (or a fork of
  ``from_version``); the control port (HUD's 8765) is published on the host's
  loopback and HUD's client retries its handshake until the environment serves.
- **stop**: ``DELETE /v1/envs/{id}``; the sandbox also has a TTL (default 2 hours, or
  the task's ``limits.run_timeout_s``), so a crashed trainer leaves nothing running.

The yielded :class:`DenvEndpoint` adds denv's operations to HUD's runtime:
``await rt.fork()`` (snapshot the live environment, a new endpoint bound to the child)
and ``await rt.grade()`` (``denv verify``: the agent frozen in a fork, the declared
paths collected, the verifier image run; a HUD :class:`~hud.eval.Grade`).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, ClassVar, Mapping, Sequence

from hud.eval.runtime import Runtime, RuntimeConfig

from denv.client import ROLLOUT_TTL_SEC, Client

if TYPE_CHECKING:
    from hud.eval import Grade, Task

__all__ = ["DenvRuntime", "DenvEndpoint", "HUD_PORT"]

#: The control-channel port HUD environments serve in containers (as DockerRuntime).
HUD_PORT = 8765


@dataclass(frozen=True, kw_only=True)
class DenvEndpoint(Runtime):
    """HUD's ``Runtime`` (``url = "tcp://127.0.0.1:<port>"``) of one denv sandbox.

    Attributes:
        env_id: the denv environment (``env_…``).
        service: the service whose port is the control channel.
    """

    transports_sessions: ClassVar[bool] = False

    env_id: str
    service: str
    port: int = HUD_PORT
    ttl_sec: float | None = ROLLOUT_TTL_SEC
    client: Client | None = None

    def _c(self) -> Client:
        return self.client or Client()

    async def fork(self, name: str | None = None, timeout_sec: int = 600) -> "DenvEndpoint":
        """Snapshot the live environment and return an endpoint bound to a new sandbox
        of that snapshot (files and volumes carry over, processes restart from the
        image's command). The child is not destroyed by the provider: call
        :meth:`destroy` (its TTL ends it otherwise). A child that published no port
        for the control service raises ``RuntimeError`` (and is destroyed)."""
        c = self._c()
        child = await asyncio.to_thread(lambda: c.fork(self.env_id, name=name, timeout_sec=timeout_sec, ttl_sec=self.ttl_sec))
        try:
            addr = _endpoint(child.endpoints, self.service)
        except RuntimeError:
            await asyncio.to_thread(c.destroy, child.id)
            raise
        return DenvEndpoint(
            url=f"tcp://{addr}",
            params=dict(self.params),
            config=self.config,
            env_id=child.id,
            service=self.service,
            port=self.port,
            ttl_sec=self.ttl_sec,
            client=self.client,
        )

    async def grade(self, resume: bool = False, timeout_sec: int = 900) -> "Grade":
        """Grade the environment with its declared ``x-denv.verifier`` (``denv verify``;
        the environment must come from an ``rl-environment`` version). Returns HUD's
        ``Grade``: ``reward`` is the verifier's reward (0 when refused), ``is_error``
        when there was none; ``info`` holds ``deployment_id``, ``source``,
        ``refused`` and ``missing``. The agent's processes stay frozen unless
        ``resume``."""
        from hud.eval import Grade

        c = self._c()
        v = await asyncio.to_thread(lambda: c.verify(self.env_id, resume=resume, timeout_sec=timeout_sec))
        info = {"deployment_id": v.deployment_id, "source": v.source, "refused": v.refused, "missing": v.missing}
        return Grade(
            reward=float(v.reward) if v.reward is not None else 0.0,
            content=f"denv verify: {v.source}",
            info=info,
            is_error=v.reward is None,
            raw={"score": float(v.reward or 0.0), "info": info},
        )

    async def destroy(self) -> None:
        """Destroy the sandbox (``DELETE /v1/envs/{id}``)."""
        await asyncio.to_thread(self._c().destroy, self.env_id)


def _endpoint(endpoints: Mapping[str, str], service: str | None) -> str:
    if service:
        if service in endpoints:
            return endpoints[service]
        raise RuntimeError(f"denv: service {service!r} published no port (published: {sorted(endpoints) or 'none'})")
    if len(endpoints) == 1:
        return next(iter(endpoints.values()))
    raise RuntimeError(
        f"denv: cannot tell the control service: published {sorted(endpoints) or 'none'}; pass service="
    )


def runtime_resources(resources: Any) -> dict[str, Any] | None:
    """The denv caps of a HUD ``RuntimeResources`` (``None`` when none is set): ``cpu`` →
    ``cpus``, ``memory_mb`` → ``memory: "<n>m"``, ``storage_mb`` → ``disk: "<n>m"``.

    Raises:
        ValueError: ``gpu``, ``tpu`` or ``os`` is set (``DenvRuntime does not support
            runtime_config.resources.gpu``).
    """
    if resources is None:
        return None
    given = resources.model_dump(exclude_none=True)
    refused = sorted(k for k in given if k not in ("cpu", "memory_mb", "storage_mb"))
    if refused:
        fields = ", ".join(f"runtime_config.resources.{k}" for k in refused)
        raise ValueError(f"DenvRuntime does not support {fields}")
    caps: dict[str, Any] = {}
    if "cpu" in given:
        caps["cpus"] = float(given["cpu"])
    if "memory_mb" in given:
        caps["memory"] = f"{int(given['memory_mb'])}m"
    if "storage_mb" in given:
        caps["disk"] = f"{int(given['storage_mb'])}m"
    return caps or None


class DenvRuntime:
    """HUD's runtime provider on denv: one sandbox per placed task.

    Args:
        image: the environment image (its command serves HUD's control channel on
            ``0.0.0.0:<port>``, as for HUD's ``DockerRuntime``); or the task's
            ``runtime_config.image``.
        from_version: instead, fork this denv version (``ver_…``) per rollout; the
            control port must be published by the version's compose file.
        port: the control-channel port in the container (8765).
        service: the service serving it (image sandboxes: ``main``; versions: the
            only service publishing a port unless given).
        cmd: override the image's command.
        env_vars: environment of the image sandbox.
        egress: ``deny`` (default; the published port still serves) or ``allow``.
        volumes: persisted paths of the image sandbox (default ``["/work"]``): what
            :meth:`DenvEndpoint.fork` carries over.
        ttl_sec: TTL of each sandbox (default 7200 s; ``limits.run_timeout_s`` when
            smaller); ``None``: none unless the task sets ``run_timeout_s``.
        runtime_config: HUD ``RuntimeConfig`` (or mapping) merged under the task's.
        client: a :class:`~denv.Client` (default from ``DENV_SERVER``/``DENV_API_KEY``).

    ``runtime_config.resources`` become the sandbox's caps (``cpu`` → ``cpus``,
    ``memory_mb`` → ``memory``, ``storage_mb`` → ``disk``); ``gpu``, ``tpu`` and ``os``
    are refused with ``ValueError``, and so is ``compose``: compose environments run on
    denv as versions (``from_version``).
    """

    def __init__(
        self,
        image: str | None = None,
        *,
        from_version: str | None = None,
        port: int = HUD_PORT,
        service: str | None = None,
        cmd: Sequence[str] | None = None,
        env_vars: Mapping[str, str] | None = None,
        egress: str = "deny",
        volumes: Sequence[str] | None = None,
        ttl_sec: float | None = ROLLOUT_TTL_SEC,
        runtime_config: RuntimeConfig | Mapping[str, Any] | None = None,
        client: Client | None = None,
    ) -> None:
        if image and from_version:
            raise ValueError("give image or from_version, not both")
        self.from_version = from_version
        self.port = int(port)
        self.service = service
        self.cmd = list(cmd) if cmd is not None else None
        self.env_vars = dict(env_vars or {})
        self.egress = egress
        self.volumes = list(volumes) if volumes is not None else None
        self.ttl_sec = ttl_sec
        self.client = client
        config = RuntimeConfig(image=image) if image else RuntimeConfig()
        if runtime_config is not None:
            config = config.with_overrides(RuntimeConfig.model_validate(runtime_config))
        #: HUD reads this to resolve the effective config of a placement.
        self.runtime_config: RuntimeConfig | None = config if config.model_dump(exclude_none=True) else None

    def __repr__(self) -> str:
        src = f"from_version={self.from_version!r}" if self.from_version else f"image={getattr(self.runtime_config, 'image', None)!r}"
        return f"DenvRuntime({src}, port={self.port})"

    @asynccontextmanager
    async def __call__(self, task: "Task") -> AsyncIterator[DenvEndpoint]:
        config = (self.runtime_config or RuntimeConfig()).with_overrides(task.runtime_config)
        caps = runtime_resources(config.resources)
        if config.compose is not None:
            raise ValueError("DenvRuntime runs compose environments as denv versions: deploy it and pass from_version=")
        startup = config.limits.startup_timeout_s if config.limits is not None else None
        run_timeout = config.limits.run_timeout_s if config.limits is not None else None
        ttl = self.ttl_sec
        if run_timeout is not None:
            ttl = min(float(run_timeout), ttl) if ttl else float(run_timeout)
        params: dict[str, Any] = {"ready_timeout": startup} if startup is not None else {}
        c = self.client or Client()
        timeout = int(startup) if startup else 600
        if self.from_version:
            sbx = await asyncio.to_thread(
                lambda: c.sandbox(from_version=self.from_version, ttl_sec=ttl, timeout_sec=timeout, resources=caps)
            )
            service = self.service
        else:
            if not config.image:
                raise ValueError("DenvRuntime requires an image (DenvRuntime(image) or the task's runtime_config.image)")
            image = config.image
            sbx = await asyncio.to_thread(
                lambda: c.sandbox(
                    image=image,
                    cmd=self.cmd,
                    env=self.env_vars,
                    ports=[self.port],
                    egress=self.egress,
                    volumes=self.volumes,
                    ttl_sec=ttl,
                    timeout_sec=timeout,
                    resources=caps,
                )
            )
            service = self.service or "main"
        try:
            addr = _endpoint(sbx.endpoints, service)
            svc = service or next(k for k, v in sbx.endpoints.items() if v == addr)
            yield DenvEndpoint(
                url=f"tcp://{addr}",
                params=params,
                config=config if config.model_dump(exclude_none=True) else None,
                env_id=sbx.id,
                service=svc,
                port=self.port,
                ttl_sec=ttl,
                client=c,
            )
        finally:
            await asyncio.to_thread(c.destroy, sbx.id)
