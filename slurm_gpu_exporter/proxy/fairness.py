"""Each user's share of the proxy's shared resources, so that one user cannot slow the rest.

``PerUser`` bounds how many of one user's requests are in flight at a resource (the
query checkers, the upstream connections); a few more of theirs wait in turn, briefly,
and the rest are told to retry (503). Other users' requests never wait behind them.
``Backoff`` makes a user whose queries keep being killed for time wait a growing
period before the proxy checks another of theirs (429): a flood of slow queries then
costs the checkers a kill now and then, not two busy workers for as long as it lasts.
Both forget a user once nothing of theirs is held, so their memory is bounded by the
requests in flight and the users penalised recently.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FairLimits:
    """Per-user limits (flags ``--limits.*``, docs/proxy.md)."""

    checks_per_user: int = 1  # queries of one user being checked at once
    # A dashboard asks for all its panels at once (30 or so): they wait their turn,
    # as long as a check waits for a worker (check_pool.WAIT_LIMIT_S).
    upstream_per_user: int = 16  # one user's requests to the store at once
    waiting_per_user: int = 64  # more of theirs that may wait for a slot
    wait_seconds: float = 5.0  # how long one waits before a 503
    backoff_first_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    backoff_forget_seconds: float = 300.0
    upstream_body_bytes: int = 64 * 1024 * 1024
    admin_upstream_connections: int = 16
    user_upstream_connections: int = 64


class Busy(Exception):
    """The user has as many requests in flight and waiting as they may: retry (503)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackingOff(Exception):
    """The user's queries were killed for time recently: wait ``retry_after`` s (429)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Share:
    running: int = 0
    waiting: collections.deque[asyncio.Future[None]] = field(
        default_factory=collections.deque)


class PerUser:
    """At most ``limit`` of a user's requests at once in ``slot``; up to ``max_waiting``
    more wait in turn for ``wait_limit`` seconds; past either, Busy."""

    def __init__(self, what: str, limit: int, max_waiting: int, wait_limit: float) -> None:
        self.what, self.limit = what, limit
        self.max_waiting, self.wait_limit = max_waiting, wait_limit
        self._shares: dict[str, _Share] = {}

    def running(self, user: str) -> int:
        share = self._shares.get(user)
        return share.running if share else 0

    def __len__(self) -> int:
        """Users with something running or waiting."""
        return len(self._shares)

    @contextlib.asynccontextmanager
    async def slot(self, user: str) -> AsyncIterator[None]:
        share = self._shares.setdefault(user, _Share())
        if share.running < self.limit and not share.waiting:
            share.running += 1
        else:
            await self._wait(user, share)
        try:
            yield
        finally:
            self._hand_on(user, share)

    async def _wait(self, user: str, share: _Share) -> None:
        retry = max(1, math.ceil(self.wait_limit))
        if len(share.waiting) >= self.max_waiting:
            self._forget_if_idle(user, share)
            raise Busy(f"you have {share.running} {self.what} in progress and "
                       f"{len(share.waiting)} waiting, the most one user may", retry)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        share.waiting.append(waiter)
        try:
            async with asyncio.timeout(self.wait_limit):
                await waiter  # set when a slot is handed to it (running stays counted)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._hand_on(user, share)  # handed a slot just as the wait ended
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    share.waiting.remove(waiter)
                self._forget_if_idle(user, share)
            if isinstance(exc, TimeoutError):
                raise Busy(f"your other {self.what} took all of your share for "
                           f"{self.wait_limit:g} s", retry) from None
            raise

    def _hand_on(self, user: str, share: _Share) -> None:
        while share.waiting:
            waiter = share.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: running is unchanged
                return
        share.running -= 1
        self._forget_if_idle(user, share)

    def _forget_if_idle(self, user: str, share: _Share) -> None:
        if share.running == 0 and not share.waiting and self._shares.get(user) is share:
            del self._shares[user]


class Backoff:
    """A user whose query is killed for time waits ``first`` seconds before the next is
    checked, twice as long after each further kill, ``longest`` at most; kills older
    than ``forget`` seconds are forgiven."""

    def __init__(self, first: float = 1.0, longest: float = 60.0, forget: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first, self.longest, self.forget, self.clock = first, longest, forget, clock
        self._strikes: dict[str, tuple[int, float, float]] = {}  # strikes, last, until

    def check(self, user: str) -> None:
        """Raise BackingOff while ``user`` is to wait."""
        entry = self._strikes.get(user)
        if entry is None:
            return
        left = entry[2] - self.clock()
        if left > 0:
            raise BackingOff(f"your queries took too long to check {entry[0]} times "
                             f"lately; wait {math.ceil(left)} s and simplify them",
                             max(1, math.ceil(left)))

    def strike(self, user: str) -> float:
        """Count a kill for ``user``; the seconds they now wait."""
        now = self.clock()
        strikes, last, _ = self._strikes.get(user, (0, now, now))
        if now - last > self.forget:
            strikes = 0
        strikes += 1
        wait = min(self.longest, self.first * 2 ** min(strikes - 1, 30))
        self._strikes[user] = (strikes, now, now + wait)
        if len(self._strikes) > 1024:  # drop the forgiven
            self._strikes = {u: e for u, e in self._strikes.items()
                             if now - e[1] <= self.forget}
        return wait
