"""^C ends ``top`` at once whatever it is doing (``report/top/interrupt.py``): a step that
runs on, and one that swallows its cancel as a lost cancel once did in a loaded run."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.top.interrupt import interrupt_event, until_interrupted


async def forever() -> None:
    await asyncio.sleep(3600)


async def stubborn() -> None:
    """Swallows every cancel: the worst a step could do."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


def test_a_step_not_interrupted_gives_its_result() -> None:
    async def run() -> tuple[bool, int | None]:
        async def answer() -> int:
            await asyncio.sleep(0.01)
            return 42
        return await until_interrupted(answer(), asyncio.Event())

    assert asyncio.run(run()) == (False, 42)


def test_a_steps_error_is_raised() -> None:
    async def run() -> None:
        async def fails() -> None:
            raise ReportError("Prometheus is down")
        await until_interrupted(fails(), asyncio.Event())

    with pytest.raises(ReportError, match="Prometheus is down"):
        asyncio.run(run())


@pytest.mark.parametrize("step", [forever, stubborn])
def test_an_interrupt_ends_the_step_within_its_grace(step) -> None:  # type: ignore[no-untyped-def]
    async def run() -> tuple[tuple[bool, None], float]:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, event.set)
        began = time.monotonic()
        got = await until_interrupted(step(), event, grace_s=0.2)
        spent = time.monotonic() - began
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()  # the stubborn one is still there: asyncio.run would wait on it
            task.get_coro().close()  # type: ignore[union-attr]
        return got, spent

    got, spent = asyncio.run(run())
    assert got == (True, None)
    assert spent < 0.05 + 0.2 + 0.5  # the grace, and a loaded machine's slack


def test_once_interrupted_no_step_starts() -> None:
    started: list[bool] = []

    async def step() -> None:
        started.append(True)

    async def run() -> tuple[bool, None]:
        event = asyncio.Event()
        event.set()
        return await until_interrupted(step(), event)

    assert asyncio.run(run()) == (True, None) and started == []


def test_sigint_sets_the_event_instead_of_raising() -> None:
    seen_by_python: list[int] = []  # where the event's handler is missing: not the run's ^C
    previous = signal.signal(signal.SIGINT, lambda signum, _: seen_by_python.append(signum))

    async def run() -> bool:
        with interrupt_event() as interrupted:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.wait_for(interrupted.wait(), 5)
            return interrupted.is_set()

    try:
        assert asyncio.run(run())
        assert seen_by_python == []
        # Put back afterwards: ^C is Python's KeyboardInterrupt again.
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
