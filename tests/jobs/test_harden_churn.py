"""1,000 jobs registered and ended on a synthetic node, in batches of 50, each ended as
soon as the agent has shown it: as fast as the agent samples.

Every job shows up, none stays after the linger, the jobs still running at the end
are exactly those exposed, and the agent's memory does not grow with each churn.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, fake_nvml_or_skip
from tests.jobs.churn import end_job, rss_kib
from tests.support import wait_until
from tests.support.agent import Agent, series

pytestmark = pytest.mark.fakenvml

JOBS = 1000
BATCH = 50
LINGER = 2.0
SAMPLE = 0.5


def _jobids(text: str) -> set[str]:
    return {labels["jobid"] for labels, _ in series(text, "slurm_job_info")}


def _next_sample(agent: Agent, after: float) -> str:
    """The first scrape of a sample the agent began after ``after`` (its timestamp is
    taken before it looks for jobs), so it shows what was on the node by then."""
    def sampled() -> str | None:
        text = agent.metrics()
        stamps = [v for _, v in series(text, "slurm_gpu_exporter_last_sample_timestamp_seconds")]
        return text if stamps and stamps[0] > after else None

    return wait_until(sampled, 30, "the agent's next sample", poll=0.05, log=agent.log)


def _churn(node: SynthNode, agent: Agent, first: int, count: int, seen: set[str]) -> None:
    """Start ``count`` jobs in batches, two or three live at a time; a batch ends once a
    sample that began after it was added has been scraped, so every job is seen
    however slowly the agent samples, and no sooner."""
    live: list[tuple[float, list[int]]] = []  # (when it was on the node, the batch)
    for start in range(first, first + count, BATCH):
        batch = list(range(start, min(start + BATCH, first + count)))
        for jobid in batch:
            node.add_job(jobid, [jobid])
        live.append((time.time(), batch))
        if len(live) > 2:
            added, oldest = live.pop(0)
            seen |= _jobids(_next_sample(agent, added))
            for jobid in oldest:
                end_job(node, jobid)
    if live:
        seen |= _jobids(_next_sample(agent, live[-1][0]))
    for _, batch in live:
        for jobid in batch:
            end_job(node, jobid)


def _settle(agent: Agent, running: set[str], timeout: float = 30.0) -> str:
    last = [""]

    def settled() -> str | None:
        last[0] = agent.metrics()
        return last[0] if _jobids(last[0]) == running else None

    return wait_until(settled, timeout, "the exposed jobs to be the running ones", poll=0.2,
                      log=lambda: f"exposed {sorted(_jobids(last[0]) - running)[:20]} stale, "
                                  f"{sorted(running - _jobids(last[0]))[:20]} missing")


def test_thousand_jobs_churn_exactly_and_memory_returns(tmp_path: Path) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    fake.write(NvmlState(devices=[Device(0)]))
    node = SynthNode(tmp_path / "node")
    agent = Agent(node.agent_args(SAMPLE, "--job-linger", str(LINGER)), env=fake.env(),
                  log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()
        # Warm-up: a churn of the same shape fills caches and the allocator's pools to
        # this load's peak (a shorter one left the measured churn to grow them: 5.1 and
        # 5.6 MiB in parallel runs, 3.1 alone), so what is measured is what stays.
        warm: set[str] = set()
        _churn(node, agent, 100_000, JOBS, warm)
        _settle(agent, set())
        baseline = rss_kib(agent.proc.pid)

        started = time.monotonic()
        seen: set[str] = set()
        _churn(node, agent, 200_000, JOBS, seen)
        churn_s = time.monotonic() - started
        _settle(agent, set())
        after_one = rss_kib(agent.proc.pid)
        _churn(node, agent, 300_000, JOBS, seen)
        keep = {str(j) for j in range(400_000, 400_010)}
        for jobid in keep:
            node.add_job(int(jobid), [int(jobid)])
        text = _settle(agent, keep)
        seen |= _jobids(text)
        end = rss_kib(agent.proc.pid)
    finally:
        agent.stop()
    first, second = after_one - baseline, end - after_one
    print(f"churn: {JOBS} jobs in {churn_s:.1f} s; RSS baseline {baseline} KiB, growth "
          f"{first} KiB over the first churn, {second} KiB over the second")
    assert {str(j) for j in range(200_000, 200_000 + JOBS)} <= seen
    assert {str(j) for j in range(300_000, 300_000 + JOBS)} <= seen
    # What a churn leaves behind grows with each churn, so a leak shows in both; the
    # allocator's pools can still grow once past the warm-up's peak on a loaded machine
    # (2.1 MiB seen in one churn, 8 to 20 KiB in most).
    assert min(first, second) < 2 * 1024, (first, second)
