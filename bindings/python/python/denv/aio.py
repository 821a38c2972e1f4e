"""Async wrapper over :class:`denv.Client` for async frameworks (Harbor, Inspect).

Every method of :class:`AsyncClient` runs the synchronous method in a worker thread
(``asyncio.to_thread``); the native module releases the GIL while it waits, so many
calls proceed concurrently. Arguments, return values and errors are those of
:class:`denv.Client`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Mapping

from denv.client import Client, EnvInfo, ExecResult, LogFollower, LogLine, Sandbox, Verdict

__all__ = ["AsyncClient", "AsyncLogFollower"]


class AsyncLogFollower:
    """:class:`denv.client.LogFollower` for ``async for``; each line is read in a worker
    thread. ``aclose()`` (or leaving ``async with``) ends the follow."""

    def __init__(self, follower: LogFollower) -> None:
        self.sync = follower

    def __aiter__(self) -> "AsyncLogFollower":
        return self

    async def __anext__(self) -> LogLine:
        line = await asyncio.to_thread(self.sync.next)
        if line is None:
            raise StopAsyncIteration
        return line

    async def next(self, timeout_sec: float | None = None) -> LogLine | None:
        """See :meth:`LogFollower.next`."""
        return await asyncio.to_thread(self.sync.next, timeout_sec)

    async def aclose(self) -> None:
        """End the follow."""
        self.sync.close()

    async def __aenter__(self) -> "AsyncLogFollower":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.sync.close()


class AsyncClient:
    """``Client`` with coroutine methods. ``client`` wraps an existing ``Client``."""

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        timeout: float = 900.0,
        *,
        client: Client | None = None,
        ca_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.sync: Client = client or Client(
            server=server, api_key=api_key, timeout=timeout, ca_file=ca_file
        )

    async def sandbox(self, **kwargs: Any) -> Sandbox:
        """See :meth:`Client.sandbox`."""
        return await asyncio.to_thread(lambda: self.sync.sandbox(**kwargs))

    async def destroy(self, env_id: str) -> None:
        """See :meth:`Client.destroy`."""
        await asyncio.to_thread(self.sync.destroy, env_id)

    async def list_envs(
        self, project: str | None = None, status: str | None = None, all: bool = False
    ) -> list[EnvInfo]:
        """See :meth:`Client.list_envs`."""
        return await asyncio.to_thread(self.sync.list_envs, project, status, all)

    async def delete_project(self, project: str, force: bool = False, timeout_sec: int = 660) -> dict[str, Any]:
        """See :meth:`Client.delete_project`."""
        return await asyncio.to_thread(self.sync.delete_project, project, force, timeout_sec)

    async def logs(
        self,
        env_id: str,
        service: str | None = None,
        *,
        tail: int = 100,
        follow: bool = False,
        timestamps: bool = False,
        timeout_sec: float = 120.0,
    ) -> list[LogLine] | AsyncLogFollower:
        """See :meth:`Client.logs`; with ``follow=True`` an :class:`AsyncLogFollower`."""
        out = await asyncio.to_thread(
            lambda: self.sync.logs(
                env_id,
                service,
                tail=tail,
                follow=follow,  # type: ignore[call-overload]
                timestamps=timestamps,
                timeout_sec=timeout_sec,
            )
        )
        if isinstance(out, LogFollower):
            return AsyncLogFollower(out)
        return out

    async def get_env(self, env_id: str) -> Sandbox:
        """See :meth:`Client.get_env`."""
        return await asyncio.to_thread(self.sync.get_env, env_id)

    async def current_version(self, env_id: str) -> str:
        """See :meth:`Client.current_version`."""
        return await asyncio.to_thread(self.sync.current_version, env_id)

    async def snapshot(self, env_id: str, timeout_sec: int = 300) -> str:
        """See :meth:`Client.snapshot`."""
        return await asyncio.to_thread(self.sync.snapshot, env_id, timeout_sec)

    async def fork(
        self,
        env_id: str,
        name: str | None = None,
        timeout_sec: int = 600,
        live: bool = True,
        ttl_sec: float | None = None,
        pool: int | None = None,
        resources: Mapping[str, Any] | None = None,
    ) -> Sandbox:
        """See :meth:`Client.fork`."""
        return await asyncio.to_thread(
            self.sync.fork, env_id, name, timeout_sec, live, ttl_sec, pool, resources
        )

    async def promote(
        self,
        project: str,
        from_env: str,
        to_env: str,
        version: str | None = None,
        timeout_sec: int = 3600,
    ) -> dict[str, Any]:
        """See :meth:`Client.promote`."""
        return await asyncio.to_thread(
            self.sync.promote, project, from_env, to_env, version, timeout_sec
        )

    async def sheet(self, env_or_version: str) -> dict[str, Any]:
        """See :meth:`Client.sheet`."""
        return await asyncio.to_thread(self.sync.sheet, env_or_version)

    async def verify(self, env_id: str, resume: bool = False, timeout_sec: int = 900) -> Verdict:
        """See :meth:`Client.verify`."""
        return await asyncio.to_thread(self.sync.verify, env_id, resume, timeout_sec)

    async def exec(
        self,
        env_id: str,
        service: str,
        cmd: list[str],
        timeout_sec: int = 120,
        *,
        user: str | int | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """See :meth:`Client.exec`."""
        return await asyncio.to_thread(
            lambda: self.sync.exec(
                env_id, service, cmd, timeout_sec, user=user, cwd=cwd, input=input, env=env
            )
        )

    async def put_tar(self, env_id: str, service: str, path: str, tar_bytes: bytes) -> None:
        """See :meth:`Client.put_tar`."""
        await asyncio.to_thread(self.sync.put_tar, env_id, service, path, tar_bytes)

    async def get_tar(self, env_id: str, service: str, path: str) -> bytes:
        """See :meth:`Client.get_tar`."""
        return await asyncio.to_thread(self.sync.get_tar, env_id, service, path)

    async def put_file(self, env_id: str, service: str, source: str | os.PathLike[str], target_path: str) -> None:
        """See :meth:`Client.put_file`."""
        await asyncio.to_thread(self.sync.put_file, env_id, service, source, target_path)

    async def put_bytes(self, env_id: str, service: str, target_path: str, data: bytes) -> None:
        """See :meth:`Client.put_bytes`."""
        await asyncio.to_thread(self.sync.put_bytes, env_id, service, target_path, data)

    async def put_dir(self, env_id: str, service: str, source_dir: str | os.PathLike[str], target_dir: str) -> None:
        """See :meth:`Client.put_dir`."""
        await asyncio.to_thread(self.sync.put_dir, env_id, service, source_dir, target_dir)

    async def get_file(self, env_id: str, service: str, source_path: str, target: str | os.PathLike[str]) -> None:
        """See :meth:`Client.get_file`."""
        await asyncio.to_thread(self.sync.get_file, env_id, service, source_path, target)

    async def get_bytes(self, env_id: str, service: str, source_path: str) -> bytes:
        """See :meth:`Client.get_bytes`."""
        return await asyncio.to_thread(self.sync.get_bytes, env_id, service, source_path)

    async def get_dir(self, env_id: str, service: str, source_dir: str, target_dir: str | os.PathLike[str]) -> None:
        """See :meth:`Client.get_dir`."""
        await asyncio.to_thread(self.sync.get_dir, env_id, service, source_dir, target_dir)


