"""Saving the training on a faulty GPU: ``Requeuer`` signals the jobs that hold it when
``remediate`` drains the node, and requeues them after a grace.

Off unless ``--requeue-opt`` says ``all`` or ``opt-in`` (``requeue_policy.py``). For each
new firing episode of a drained node, the jobs that Prometheus shows on the faulty GPU
(``holders.py``) and Slurm lists RUNNING on that node get ``--requeue-signal`` (default
USR1, ``scancel --signal``) once; after ``--requeue-grace`` seconds each one Slurm lets
requeue (not ``--no-requeue``), still the run that was signalled and not ended by its
user, is requeued (``scontrol requeue``). What was done goes to the job's AdminComment,
the log and ``slurm_gpu_remediate_jobs_total``. The grace is an asyncio task, never a
wait in the webhook; what is due is in a file (``pending.py``), and a restart requeues
the overdue jobs at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain, slurm_value
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate.confirm import Fault
from slurm_gpu_exporter.report.remediate.holders import holders, holders_query
from slurm_gpu_exporter.report.remediate.pending import PendingRequeue, RequeueBook
from slurm_gpu_exporter.report.remediate.requeue_policy import Choice, RequeuePolicy, choose
from slurm_gpu_exporter.report.slurm.actions import (
    listed_jobs,
    record_reason,
    requeue_job,
    signal_job,
)
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob

log = logging.getLogger(__name__)

# States a signalled job is requeued from: still running, or ended on its own (it wrote
# its checkpoint and exited, or the GPU made it fail). A user's cancel, a time limit or
# a preemption is left as it is.
REQUEUE_FROM = frozenset({"RUNNING", "SUSPENDED", "COMPLETED", "FAILED", "NODE_FAIL"})
RETRY_S = 30.0  # Slurm did not answer, or the job is still completing: ask again
MAX_TRIES = 10


def requeue_verdict(jobs: list[SlurmJob], due: PendingRequeue) -> tuple[str, str]:
    """What to do, after the grace, with the job ``due`` names, given what Slurm lists
    under its target now: ``("requeue", …)``, ``("wait", …)`` or a reason to leave it."""
    if not jobs:
        return "gone", "Slurm no longer lists it"
    lead = min(jobs, key=lambda j: int(j.ident.het_job_offset or 0)  # type: ignore[union-attr]
               if j.ident is not None else 0)
    if lead.start != due.start or lead.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD",
                                                 "REQUEUE_FED"):
        return "requeued_already", "it was requeued since (by itself or someone else)"
    if lead.requeue is not True:
        return "no_requeue", "Slurm does not let it requeue (sbatch --no-requeue)"
    if lead.state == "COMPLETING":
        return "wait", "it is still completing"
    if lead.state not in REQUEUE_FROM:
        return "ended", f"it ended {plain(lead.state, 40)}"
    return "requeue", "requeued"


@dataclass
class Requeuer:
    """Signals and requeues the jobs on a faulty GPU, as ``policy`` says."""

    policy: RequeuePolicy
    book: RequeueBook
    query: Callable[[str], Awaitable[list[Sample]]]  # an instant query, now
    count: Callable[[str, str], None] = lambda action, reason: None
    node_label: str | None = None
    dry_run: bool = False
    listed: Callable[[], dict[str, SlurmJob]] = listed_jobs
    signal: Callable[..., None] = signal_job
    requeue: Callable[..., None] = requeue_job
    record: Callable[..., None] = record_reason
    clock: Callable[[], float] = time.time
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def on_faults(self, faults: list[Fault]) -> None:
        """Signal the jobs on each fault's GPU and schedule their requeues."""
        if not self.policy.enabled:
            return
        for fault in faults:
            try:
                await self._on_fault(fault)
            except ReportError as exc:
                log.error("cannot signal the jobs on the faulty GPU of %s: %s", fault.node,
                          plain(exc))
                self.count("failed", "lookup")

    async def _on_fault(self, fault: Fault) -> None:
        now = self.clock()
        holding: set[str] = set()
        for episode, _ in fault.episodes:
            query = holders_query(episode, self.node_label)
            if query is not None:
                holding |= holders(await self.query(query), episode, now)
        gpus = ", ".join(sorted({f"gpu {e.label('gpu', '?')} {e.label('uuid')}".strip()
                                 for e, _ in fault.episodes}))
        if not holding:
            log.info("no job holds the faulty GPU of %s (%s) in Prometheus: none signalled",
                     fault.node, plain(gpus, 200))
            return
        listed = await self._blocking(self.listed)
        for choice in choose(self.policy, fault.node, holding, listed, self.book):
            if choice.act:
                await self._act(choice, fault, gpus, now)
            else:
                log.info("not signalling for the GPU fault on %s: %s", fault.node,
                         plain(choice.text, 300))
                self.count("skipped", choice.reason)

    async def _act(self, choice: Choice, fault: Fault, gpus: str, now: float) -> None:
        ident = choice.jobs[0].ident
        episode, alert = fault.episodes[-1]
        requeues = all(j.requeue is True for j in choice.jobs)
        sig = self.policy.signal if self.policy.signals else ""
        why = slurm_value(
            f"slurm-gpu-exporter: {alert} on {fault.node} {gpus} since {episode.since_text}: "
            + (f"sent SIG{sig}, " if sig else "")
            + ("requeue due" if requeues else "not requeued (--no-requeue)"), 400)
        if self.dry_run:
            log.info("dry run: would %s job %s (%s)", f"send SIG{sig} to" if sig else
                     "requeue", choice.target, plain(why, 300))
            self.book.acted(choice.key, now, None)
            self.count("dry_run", "dry_run")
            return
        if sig:
            try:
                await self._blocking(self.signal, ident, sig, self.policy.scope)
                self.count("signalled", sig)
                log.info("sent SIG%s to job %s (%s): %s", sig, choice.target,
                         self.policy.scope, plain(why, 300))
            except ReportError as exc:
                log.error("cannot signal job %s: %s", choice.target, plain(exc))
                self.count("failed", "signal")
        await self._record(ident, why)
        due = None
        if requeues:
            due = PendingRequeue(choice.key, choice.target, choice.jobs[0].start or 0.0,
                                 now + (self.policy.grace_s if sig else 0.0), fault.node, why)
        else:
            log.info("will not requeue job %s: Slurm does not let it requeue (sbatch "
                     "--no-requeue)", choice.target)
            self.count("skipped", "no_requeue")
        self.book.acted(choice.key, now, due)
        if due is not None:
            self.schedule(due)

    def resume(self) -> None:
        """Schedule the requeues a previous run left due (overdue ones run at once)."""
        for due in list(self.book.pending.values()):
            self.schedule(due)

    def schedule(self, due: PendingRequeue, tries: int = 0) -> None:
        task = asyncio.get_running_loop().create_task(self._when_due(due, tries))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _when_due(self, due: PendingRequeue, tries: int) -> None:
        await asyncio.sleep(max(0.0, due.due - self.clock()))
        await self.requeue_now(due, tries)

    async def requeue_now(self, due: PendingRequeue, tries: int = 0) -> None:
        """Requeue the job ``due`` names if Slurm still holds the run that was signalled
        and lets it requeue; else say why not."""
        try:
            listed = await self._blocking(self.listed)
            jobs = [j for j in listed.values()
                    if j.ident is not None and j.ident.target == due.target]
            verdict, why = requeue_verdict(jobs, due)
            if verdict == "wait":
                return self._again(due, tries, why)
            if verdict != "requeue":
                log.info("not requeueing job %s: %s", due.target, why)
                self.count("skipped", verdict)
            else:
                ident = jobs[0].ident
                await self._blocking(self.requeue, ident)
                log.info("requeued job %s after the GPU fault on %s", due.target, due.node)
                self.count("requeued", "requeued")
                await self._record(ident, slurm_value(due.why.replace(
                    "requeue due", f"requeued at {time.strftime('%H:%M:%SZ', time.gmtime())}"),
                    400))
        except ReportError as exc:
            log.error("cannot requeue job %s: %s", due.target, plain(exc))
            self.count("failed", "requeue")
            return self._again(due, tries, "Slurm failed")
        self.book.finished(due.key)

    def _again(self, due: PendingRequeue, tries: int, why: str) -> None:
        if tries + 1 >= MAX_TRIES:
            log.error("gave up requeueing job %s: %s", due.target, why)
            self.book.finished(due.key)
            return
        self.schedule(PendingRequeue(due.key, due.target, due.start,
                                     self.clock() + RETRY_S, due.node, due.why), tries + 1)

    async def _record(self, ident: Any, why: str) -> None:
        try:
            await self._blocking(self.record, ident, why)
        except ReportError as exc:  # a finished job may refuse it: the log has it
            log.warning("cannot record in job %s's AdminComment: %s",
                        ident.display if ident else "?", plain(exc))

    @staticmethod
    async def _blocking(fn: Callable[..., Any], *args: Any) -> Any:
        # Slurm's commands block: off the event loop, so the webhook keeps answering.
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def close(self) -> None:
        """Stop waiting; what is due stays in the book for the next start."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
