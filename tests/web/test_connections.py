"""The connection guard's rules, with fake transports and a fake clock."""

from __future__ import annotations

import asyncio
import logging
import resource

import pytest

from slurm_gpu_exporter.web.connections import (
    ConnectionGuard,
    ConnectionLimits,
    _Connection,
    connection_cap,
    held_files_budget,
)
from slurm_gpu_exporter.web.logthrottle import RepeatFilter


class FakeTransport(asyncio.BaseTransport):
    def __init__(self, peer: str = "10.0.0.1") -> None:
        super().__init__({"peername": (peer, 40000)})
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Inner(asyncio.Protocol):
    made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Inner.made += 1

    def data_received(self, data: bytes) -> None:
        pass


def _guard(limit: int, now: list[float], per_client: int = 0) -> ConnectionGuard:
    return ConnectionGuard(ConnectionLimits(max_connections=limit, max_per_client=per_client,
                                            header_timeout=10, keepalive_timeout=15,
                                            request_timeout=60),
                           product="slurm-gpu-exporter", clock=lambda: now[0])


def _connect(guard: ConnectionGuard, data: bytes = b"", peer: str = "10.0.0.1"
             ) -> tuple[_Connection, FakeTransport]:
    conn, transport = _Connection(guard, Inner), FakeTransport(peer)
    conn.connection_made(transport)
    if data:
        conn.data_received(data)
    return conn, transport


def test_a_silent_connection_is_closed_after_the_header_timeout_and_a_used_one_after_keepalive(
        ) -> None:
    now = [0.0]
    guard = _guard(100, now)
    _, silent = _connect(guard)
    _, kept = _connect(guard, b"GET /")
    with guard.request(kept):
        now[0] = 11.0
        guard.sweep()
    assert silent.aborted and not kept.aborted  # busy: not idle meanwhile
    now[0] = 25.0
    guard.sweep()
    assert not kept.aborted
    now[0] = 26.5
    guard.sweep()
    assert kept.aborted and len(guard) == 0


def test_a_request_past_the_request_timeout_is_closed() -> None:
    now = [0.0]
    guard = _guard(100, now)
    _, transport = _connect(guard, b"GET /")
    with guard.request(transport):
        now[0] = 61.0
        guard.sweep()
    assert transport.aborted


def test_over_half_the_cap_a_new_connection_closes_the_oldest_silent_one() -> None:
    now = [0.0]
    guard = _guard(4, now)
    _, first = _connect(guard)
    _, second = _connect(guard, b"GET /")  # has spoken: spared while a silent one is left
    now[0] = 1.0
    _, third = _connect(guard)
    assert first.aborted and not second.aborted and len(guard) == 2
    now[0] = 2.0
    _connect(guard)
    assert third.aborted and not second.aborted


def test_at_the_cap_with_every_connection_in_a_request_the_new_one_is_refused() -> None:
    now = [0.0]
    guard = _guard(2, now)
    busy = [_connect(guard, b"GET /")[1] for _ in range(2)]
    with guard.request(busy[0]), guard.request(busy[1]):
        _, refused = _connect(guard)
    assert refused.aborted and len(guard) == 2


def test_one_client_past_its_own_cap_closes_its_own_idle_connection_not_anothers() -> None:
    now = [0.0]
    guard = _guard(100, now, per_client=2)
    _, other = _connect(guard, peer="10.0.0.2")
    _, first = _connect(guard)
    _, second = _connect(guard)
    now[0] = 1.0
    _, third = _connect(guard)
    assert first.aborted and not second.aborted and not third.aborted
    assert not other.aborted and len(guard) == 3


def test_one_client_with_every_connection_busy_is_refused_another_is_let_in() -> None:
    now = [0.0]
    guard = _guard(100, now, per_client=2)
    busy = [_connect(guard, b"GET /")[1] for _ in range(2)]
    with guard.request(busy[0]), guard.request(busy[1]):
        _, refused = _connect(guard)
        _, other = _connect(guard, peer="10.0.0.2")
    assert refused.aborted and not other.aborted and len(guard) == 3


def test_a_connection_that_never_speaks_gets_no_http_protocol() -> None:
    Inner.made = 0
    guard = _guard(10, [0.0])
    _connect(guard)
    assert Inner.made == 0
    _connect(guard, b"GET /")
    assert Inner.made == 1


def test_the_cap_leaves_room_for_the_agents_own_files() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10**9) <= soft - 256


def test_held_cgroup_files_take_half_the_room_the_connections_leave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    limit = [8192]
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limit[0], limit[0]))
    assert held_files_budget(256) == (8192 - 256 - 128 - 256) // 2 == 3776
    assert connection_cap(256) == 256, "the connections keep theirs"
    limit[0] = 1024  # a bare shell's limit
    assert held_files_budget(256) == 192
    limit[0] = 600
    assert held_files_budget(256) == 0, "nothing held where there is no room"
    limit[0] = 1 << 20
    assert held_files_budget(256) == 4096


def test_repeated_log_lines_are_let_through_once_a_minute_with_a_count() -> None:
    now = [0.0]
    flt = RepeatFilter(60.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    assert flt.filter(record("accept failed"))
    assert not any(flt.filter(record("accept failed")) for _ in range(1000))
    assert flt.filter(record("another message"))
    now[0] = 61.0
    later = record("accept failed")
    assert flt.filter(later) and "1000 more like this" in later.getMessage()


def test_the_sweeper_sleeps_while_no_connection_is_open_and_sweeps_once_one_is() -> None:
    now = [0.0]
    guard = _guard(8, now)
    sweeps: list[float] = []
    real_sweep = guard.sweep
    guard.sweep = lambda: (sweeps.append(now[0]), real_sweep())[1]  # type: ignore[method-assign]

    async def run() -> None:
        guard.wrap(Inner)  # starts the sweeper
        await asyncio.sleep(1.3)
        assert sweeps == []  # nothing open: the event loop is not woken every second
        _, transport = _connect(guard)
        await asyncio.sleep(1.3)
        assert len(sweeps) == 1
        now[0] += 11  # past the header timeout: the sweep closes it
        await asyncio.sleep(1.0)
        assert transport.aborted
        count = len(sweeps)
        await asyncio.sleep(1.2)
        assert len(sweeps) == count  # closed and logged: asleep again
        guard.stop()

    asyncio.run(run())


def test_the_guards_log_line_names_the_server_it_guards(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    guard = ConnectionGuard(ConnectionLimits(max_connections=2), product="slurm-gpu-proxy",
                            clock=lambda: now[0])
    busy = [_connect(guard, b"GET /")[1] for _ in range(2)]
    with guard.request(busy[0]), guard.request(busy[1]):
        _connect(guard)
    with caplog.at_level(logging.WARNING, logger="slurm_gpu_exporter.web.connections"):
        guard.sweep()
    assert "HTTP connections closed by slurm-gpu-proxy in the last minute: 1 refused" \
        in caplog.text
    assert "the agent" not in caplog.text


def test_the_server_is_told_of_each_refused_and_each_evicted_connection() -> None:
    now = [0.0]
    told: list[str] = []
    guard = ConnectionGuard(ConnectionLimits(max_connections=2, max_per_client=1),
                            product="slurm-gpu-proxy", clock=lambda: now[0],
                            on_refused=lambda: told.append("refused"),
                            on_evicted=lambda: told.append("evicted"))
    _connect(guard, peer="10.0.0.2")
    now[0] = 1.0
    _connect(guard, peer="10.0.0.3")  # past half the cap: the idle one makes room
    assert told == ["evicted"]
    now[0] = 2.0
    _connect(guard, peer="10.0.0.3")  # its own cap: its own idle one, not counted
    assert told == ["evicted"]
    _, busy = _connect(guard, b"GET /", peer="10.0.0.4")
    with guard.request(busy):
        _connect(guard, peer="10.0.0.4")  # its only connection is in a request
    assert told == ["evicted", "refused"]
