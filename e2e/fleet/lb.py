#!/usr/bin/env python3
"""A TCP load balancer for the fleet test: what stands in front of several denv-cp
replicas in production (a Kubernetes Service, an L4 balancer). It passes bytes through
untouched (TLS ends at the replica), sends each new connection to the next backend in
turn, and skips a backend that refuses the connection, so clients and sidecars reach a
live replica after one dies.

    python3 lb.py [LISTEN_ADDR:]LISTEN_PORT BACKEND_PORT [BACKEND_PORT...]

Listens on LISTEN_ADDR (default 127.0.0.1); backends are on 127.0.0.1. Prints
`lb listening on <addr>:<port>` once it accepts connections. With LB_BYTES_FILE set,
writes there every half second the bytes it has passed to the backends and back,
`<to backends> <from backends>`: every byte the replicas read from or send to a client
or a sidecar. Each accepted
connection is logged as `conn <n> -> <backend port>` on stdout (line-buffered), so a
test can see that both replicas were used.
"""

import asyncio
import itertools
import os
import sys


MOVED = [0, 0]  # to the backends, from the backends


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: int) -> None:
    try:
        while data := await reader.read(65536):
            MOVED[way] += len(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main() -> None:
    addr, _, port = sys.argv[1].rpartition(":")
    addr, listen = addr or "127.0.0.1", int(port)
    backends = [int(p) for p in sys.argv[2:]]
    turn = itertools.count()

    async def serve(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        n = next(turn)
        for i in range(len(backends)):
            port = backends[(n + i) % len(backends)]
            try:
                br, bw = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            print(f"conn {n} -> {port}", flush=True)
            await asyncio.gather(pipe(cr, bw, 0), pipe(br, cw, 1))
            return
        print(f"conn {n}: no backend accepted", flush=True)
        cw.close()

    count_file = os.environ.get("LB_BYTES_FILE")

    async def count() -> None:
        while True:
            with open(count_file + ".tmp", "w") as f:
                f.write(f"{MOVED[0]} {MOVED[1]}\n")
            os.replace(count_file + ".tmp", count_file)
            await asyncio.sleep(0.5)

    if count_file:
        asyncio.get_running_loop().create_task(count())
    server = await asyncio.start_server(serve, addr, listen)
    print(f"lb listening on {addr}:{listen}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
