"""Worker processes that parse and restrict queries, each with a hard time limit.

Every query and ``match[]`` selector is checked in one of a few child processes
(check_worker.py), never on the event loop: the parser holds the GIL, so a slow parse
in a thread would stop every other request. A check that runs past ``time_limit`` has
its worker killed (SIGKILL) and replaced, and the query is refused; a worker that dies
(a parser crash) is replaced the same way. Requests wait for a free worker in turn;
past ``max_waiting`` waiting requests, or after ``wait_limit`` seconds of waiting, a
request is told the proxy is busy (503). The proxy keeps a pool of its own for admins
(app.py), so users' slow queries cannot make an admin wait.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import sys

from slurm_gpu_exporter.proxy.query.check_worker import HEADER, encode_message
from slurm_gpu_exporter.proxy.query.restrict import QueryRefused, Scope

log = logging.getLogger(__name__)

# Parsing is CPU-bound: more workers would take cores from the event loop and the store.
WORKERS = 2
# The dashboards' queries are checked in under a millisecond, a thousand nested brackets
# or chained operators in about 0.2 s; what the text limits cannot bound (regexes, which
# the parser compiles) is cut off here.
TIME_LIMIT_S = 1.0
WAIT_LIMIT_S = 5.0
MAX_WAITING = 64
# A new worker imports the parser first; it takes a few tenths of a second.
START_LIMIT_S = 30.0
WORKER_COMMAND = (sys.executable, "-I", "-m", "slurm_gpu_exporter.proxy.query.check_worker")


class CheckBusy(Exception):
    """Every worker is taken and too many requests wait: retry shortly (503)."""


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ask(self, request: dict) -> dict:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(encode_message(request))
        await stdin.drain()
        size = HEADER.unpack(await stdout.readexactly(HEADER.size))[0]
        return json.loads(await stdout.readexactly(size))

    def signal_kill(self) -> None:
        """SIGKILL the worker without reaping it. ``Process.kill`` polls the child first
        (``Popen.send_signal``); that poll can reap a dead worker before asyncio's child
        watcher does, which then reports exit 255 and loses the real status."""
        if self.process.returncode is None:
            # asyncio has not seen it exit, so the pid is still this child's (a zombie
            # at most), bar the instant between its watcher's reap and the callback.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    async def kill(self) -> None:
        self.signal_kill()
        # Close both pipes (stdout by reading it to its end), so the transport closes
        # now rather than when it is collected, perhaps after its loop.
        if self.process.stdin is not None:
            self.process.stdin.close()
        await self.process.wait()
        if self.process.stdout is not None:
            with contextlib.suppress(TimeoutError, OSError):
                async with asyncio.timeout(1):
                    await self.process.stdout.read()


class CheckPool:
    """``check(kind, text, scope)``: the text to send upstream, or QueryRefused."""

    def __init__(self, workers: int = WORKERS, time_limit: float = TIME_LIMIT_S,
                 wait_limit: float = WAIT_LIMIT_S, max_waiting: int = MAX_WAITING,
                 command: tuple[str, ...] = WORKER_COMMAND) -> None:
        self.size, self.time_limit, self.wait_limit = workers, time_limit, wait_limit
        self.max_waiting, self.command = max_waiting, command
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._waiting: collections.deque[asyncio.Future[_Worker]] = collections.deque()
        self._replacing: set[asyncio.Task[None]] = set()
        self.killed = 0  # workers killed for running past the time limit
        self.closed = False

    async def start(self) -> None:
        for _ in range(self.size):
            self._release(await self._spawn())

    async def close(self) -> None:
        self.closed = True
        # Let replacements finish (a start at most): one cancelled half-way could leave
        # a process or a pipe behind.
        await asyncio.gather(*self._replacing, return_exceptions=True)
        for waiter in self._waiting:
            waiter.cancel()
        for worker in list(self._all):
            await worker.kill()
        self._all.clear()
        self._idle.clear()

    async def check(self, kind: str, text: str, scope: Scope) -> str:
        request = {"kind": kind, "text": text, "admin": scope.admin,
                   "users": sorted(scope.users), "public": sorted(scope.public)}
        worker = await self._acquire()
        try:
            async with asyncio.timeout(self.time_limit):
                reply = await worker.ask(request)
        except TimeoutError:
            self.killed += 1
            self._replace(worker, "ran past its time limit")
            raise QueryRefused(f"query took longer than {self.time_limit:g} s to check; "
                               "simplify it", reason="slow_query") from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._replace(worker, f"stopped ({type(exc).__name__}, exit "
                                  f"{worker.process.returncode})")
            raise QueryRefused("query could not be checked: the parser stopped on it; "
                               "simplify it", reason="parser_crash") from None
        except BaseException:  # cancelled mid-answer: its output is out of step now
            self._replace(worker, "was interrupted")
            raise
        self._release(worker)
        if "refused" in reply:
            raise QueryRefused(reply["refused"], reason=reply["reason"])
        return str(reply["text"])

    async def _spawn(self) -> _Worker:
        """A worker that has answered once (so it has imported the parser: a request's
        time limit is not spent on that)."""
        process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        worker = _Worker(process)
        try:
            async with asyncio.timeout(START_LIMIT_S):
                await worker.ask({"kind": "query", "text": "1", "admin": True, "users": [],
                                  "public": []})
        except BaseException as exc:  # cancelled too (the pool closing): no orphan left
            await worker.kill()
            if isinstance(exc, (TimeoutError, asyncio.IncompleteReadError, ConnectionError)):
                raise OSError(f"the query checker {' '.join(self.command)} did not start "
                              f"({type(exc).__name__}, exit {process.returncode})") from None
            raise
        self._all.add(worker)
        return worker

    async def _acquire(self) -> _Worker:
        if self._idle and not self._waiting:
            return self._idle.pop()
        if len(self._waiting) >= self.max_waiting:
            raise CheckBusy(f"{len(self._waiting)} queries wait to be checked")
        waiter: asyncio.Future[_Worker] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(self.wait_limit):
                return await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # handed a worker just as the wait ended
            else:
                waiter.cancel()
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise CheckBusy(f"no query checker was free for {self.wait_limit:g} s"
                                ) from None
            raise

    def _release(self, worker: _Worker) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    def _replace(self, worker: _Worker, why: str) -> None:
        log.warning("query checker %d %s; starting another", worker.process.pid, why)
        self._all.discard(worker)
        worker.signal_kill()  # now: it may be spinning on the CPU

        async def replace() -> None:
            await worker.kill()
            while not self.closed:
                try:
                    new = await self._spawn()
                except OSError as exc:  # out of processes or memory for now
                    log.error("cannot start a query checker (%s); retrying in 1 s", exc)
                    await asyncio.sleep(1)
                    continue
                if self.closed:
                    self._all.discard(new)
                    await new.kill()
                else:
                    self._release(new)
                return

        task = asyncio.get_running_loop().create_task(replace())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)
