"""Serve a simulated fleet: one process, one listening port per node on 127.0.0.1.

Each node is its own scrape target (its own address, so a ``hashmod`` over the address
spreads nodes over Prometheus shards as it spreads real ones). A node's exposition is
rendered by the agent's ``Exposition`` the first time a scrape asks for it in a sample
interval and served from that render until the next one, as the agent does.

    python -m slurm_gpu_exporter.sim.fleet_server --nodes 200 --targets-file /tmp/t.json

The targets file (Prometheus file-based discovery, JSON) is written once every port
listens; it is the sign the fleet is up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric

from slurm_gpu_exporter.exposition.rendered import Exposition
from slurm_gpu_exporter.sim.fleet import FleetMix, snapshot
from slurm_gpu_exporter.web.serve import stop_signals

MAX_REQUEST_BYTES = 8192
READ_TIMEOUT_S = 10.0


class _Families:
    """Families collected once, shared by every node's exposition of one tick."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


@dataclass
class Fleet:
    """Every node's latest render, made on demand once per sample interval."""

    mix: FleetMix
    sample_interval: float = 5.0
    renders: int = 0
    scrapes: int = 0
    _bodies: dict[int, tuple[float, bytes]] = field(default_factory=dict)
    _process: tuple[float, _Families] | None = None

    def tick(self, now: float) -> float:
        return now - now % self.sample_interval

    def body(self, node: int, now: float) -> bytes:
        tick = self.tick(now)
        cached = self._bodies.get(node)
        if cached is not None and cached[0] == tick:
            return cached[1]
        if self._process is None or self._process[0] != tick:
            # The server's own process figures stand for each agent's (one read a tick).
            self._process = (tick, _Families(list(ProcessCollector(registry=None).collect())))
        body = Exposition(snapshot(self.mix, node, tick), (self._process[1],)).text
        self._bodies[node] = (tick, body)
        self.renders += 1
        return body


async def _serve_one(fleet: Fleet, node: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            if len(head) > MAX_REQUEST_BYTES:
                break
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if path.split(b"?")[0] == b"/metrics":
                body = fleet.body(node, time.time())
                fleet.scrapes += 1
                status, ctype = b"200 OK", b"text/plain; version=0.0.4; charset=utf-8"
            else:
                body, status, ctype = b"not found\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype +
                         b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
            ConnectionError):
        pass
    finally:
        writer.close()


def _raise_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


async def serve(fleet: Fleet, targets_file: Path, cluster: str, host: str = "127.0.0.1",
                stop_after: float | None = None) -> None:
    """Listen for every node, write the targets file, serve until stopped."""
    _raise_file_limit(fleet.mix.nodes * 2 + 256)
    servers = []
    for node in range(fleet.mix.nodes):
        def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    node: int = node) -> asyncio.Future:
            return asyncio.ensure_future(_serve_one(fleet, node, r, w))
        servers.append(await asyncio.start_server(handler, host, 0, backlog=16))
    addresses = [f"{host}:{s.sockets[0].getsockname()[1]}" for s in servers]
    tmp = targets_file.with_name(targets_file.name + ".tmp")
    tmp.write_text(json.dumps([{"targets": addresses, "labels": {"cluster": cluster}}]))
    os.replace(tmp, targets_file)
    async with stop_signals(stop_after=stop_after) as stop:
        await stop.wait()
        for s in servers:
            s.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Serve N simulated GPU nodes, one port each.")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--jobs-per-node", type=int, default=8)
    p.add_argument("--churn-per-hour", type=float, default=0.0,
                   help="job starts per node and hour (0: jobs never end)")
    p.add_argument("--mig-share", type=float, default=0.0)
    p.add_argument("--linger", type=float, default=60.0, help="seconds an ended job stays")
    p.add_argument("--jobs-end-after", type=float, default=None,
                   help="every job ends this many seconds after the start (none start after)")
    p.add_argument("--name-pad", type=int, default=0, help="characters added to job names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample-interval", type=float, default=5.0)
    p.add_argument("--targets-file", type=Path, required=True)
    p.add_argument("--cluster", default="simfleet")
    p.add_argument("--stop-after", type=float, default=None, help="exit after this many s")
    a = p.parse_args(argv)
    started = time.time()
    mix = FleetMix(nodes=a.nodes, gpus_per_node=a.gpus_per_node, jobs_per_node=a.jobs_per_node,
                   churn_per_hour=a.churn_per_hour, mig_share=a.mig_share, linger_s=a.linger,
                   stop_at=None if a.jobs_end_after is None else started + a.jobs_end_after,
                   name_pad=a.name_pad, seed=a.seed, epoch=started)
    asyncio.run(serve(Fleet(mix, a.sample_interval), a.targets_file, a.cluster,
                      stop_after=a.stop_after))


if __name__ == "__main__":
    main()
