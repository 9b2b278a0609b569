"""^C ends ``top`` within a second, whatever it is doing: a frame's queries, the wait
between frames or the wait for a job's first sample.

``asyncio.run`` turns the first ^C into a cancel of the main task; a cancel that lands
in the wrong instant can be lost on Python 3.11 (a loaded CI run saw ``top`` keep
drawing frames 30 s after ^C). Here ^C only sets an event, and each step of ``top``
races that event: the step's task is cancelled and not waited on for more than
``GRACE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Iterator
from typing import TypeVar

T = TypeVar("T")
GRACE_S = 1.0  # how long a cancelled step may take to close its requests


@contextlib.contextmanager
def interrupt_event() -> Iterator[asyncio.Event]:
    """An event ^C (SIGINT) sets while the block runs; SIGINT's handling is put back
    after it. Where the loop cannot take signal handlers, an event nothing sets."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, event.set)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        yield event
        return
    try:
        yield event
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def until_interrupted(step: Awaitable[T], interrupted: asyncio.Event,
                            grace_s: float = GRACE_S) -> tuple[bool, T | None]:
    """``(False, result)`` of ``step``, or ``(True, None)`` as soon as ``interrupted`` is
    set: the step is cancelled then and given ``grace_s`` to end, never more."""
    if interrupted.is_set():
        if asyncio.iscoroutine(step):
            step.close()  # never started
        return True, None
    task = asyncio.ensure_future(step)
    stop = asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if task.done() and not interrupted.is_set():
        return False, task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=grace_s)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: an error after ^C is not worth a traceback
    return True, None
