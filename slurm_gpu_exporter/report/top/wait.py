"""Waiting for a job's first sample: ``top`` on a job that Slurm has just started (or is
about to start) and that Prometheus does not hold yet.

No I/O of its own: what Slurm lists for the job, the probe (one try of the first frame),
the clock and the sleep come in, so a test drives the wait without Slurm, Prometheus or
time. Which states wait: RUNNING and CONFIGURING (its first sample is a scrape or two
away), and PENDING (``sbatch`` then ``top`` often finds the job pending for its first
moments; the bound keeps a job that queues for hours from holding the terminal). Any
other state (suspended, completing, ended), a job Slurm does not list, or a Slurm that
cannot be asked: no wait, the job is unknown as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

# Two scrapes at the monitoring role's 30 s interval: by then an agent on the job's node
# has sampled it and Prometheus has scraped that sample.
WAIT_S = 60.0
WAITING_STATES = {"RUNNING": "is running", "CONFIGURING": "is starting",
                  "PENDING": "is pending"}

T = TypeVar("T")


@dataclass(frozen=True)
class SlurmSays:
    """What Slurm lists for the job ``top`` was asked for."""

    jobid: str  # its own job id (an array task's too): the agents' ``jobid`` label
    user: str  # "" where Slurm's answer did not say
    state: str  # RUNNING, PENDING, ...
    start: float | None = None  # when it started (Unix time); a pending job's is a guess


def wait_left(job: SlurmSays | None, bound_s: float, now: float) -> float:
    """Seconds worth waiting for the job's first sample: none for a job Slurm does not
    list or whose state brings no sample; for a running job, until ``bound_s`` after its
    start (one that has run longer has no agent sampling it, or is filtered out: waiting
    cannot help); for a pending one, ``bound_s`` from now."""
    if job is None or job.state not in WAITING_STATES:
        return 0.0
    if job.state != "PENDING" and job.start is not None:
        # min: a start ahead of our clock (another host's) waits no more than the bound
        return max(0.0, min(bound_s, job.start + bound_s - now))
    return bound_s


def waiting_line(shown: str, job: SlurmSays, left_s: float) -> str:
    """The one line ``top`` prints while it waits."""
    what = ("for it to start and send its first sample to Prometheus"
            if job.state == "PENDING" else "for its first sample in Prometheus")
    return (f"job {shown} {WAITING_STATES[job.state]}; waiting {what} (up to "
            f"{left_s:.0f} s, --wait)")


def no_sample_hint(job: SlurmSays | None, bound_s: float) -> str:
    """What to add to "no metrics for job" when Slurm lists the job: what to do next."""
    if job is None or job.state not in WAITING_STATES:
        return ""
    if job.state == "PENDING":
        return ("; it was pending in Slurm: run top again once squeue shows it running, "
                "or give --wait more seconds")
    return (f"; Slurm runs it, yet no sample came within {bound_s:g} s of its start: check "
            "that slurm-gpu-exporter runs on its nodes and Prometheus scrapes them (and "
            "--cluster), or give --wait more seconds")


async def first_sample(probe: Callable[[], Awaitable[T | None]], left_s: float,
                       poll_s: float, clock: Callable[[], float] = time.time,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
                       ) -> T | None:
    """``probe()`` every ``poll_s`` seconds until it answers (not None), for ``left_s``
    seconds at most, the last try at the bound; None when no try answered."""
    deadline = clock() + left_s
    while (remaining := deadline - clock()) > 0:
        await sleep(min(poll_s, remaining))
        got = await probe()
        if got is not None:
            return got
    return None
