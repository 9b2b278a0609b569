"""Saving the training on a faulty GPU: ``Requeuer`` signals the jobs that hold it when
``remediate`` drains the node, and requeues them after a grace.

Off unless ``--requeue-opt`` says ``all`` or ``opt-in`` (``requeue_policy.py``). For each
new firing episode of a drained node, the jobs that Prometheus shows on the faulty GPU
(``holders.py``) and Slurm lists RUNNING on that node, that Slurm can requeue (batch jobs
not submitted with ``--no-requeue``), get ``--requeue-signal`` (default USR1, ``scancel
--signal``) once; after ``--requeue-grace`` seconds each one still the run that was
signalled is requeued (``scontrol requeue``) if it still runs or ended on its own
(``REQUEUE_FROM``). What was done goes to the job's AdminComment, the log and
``slurm_gpu_remediate_jobs_total``.

At least once, never twice: the episode is opened in the book (``pending.py``) before
its jobs are looked for and settled once each was decided, and a job's decision (its
target, start and due time) is written before it is signalled. A failed look-up leaves
the episode open to the next post of the alert (Alertmanager's retry of the 503, or its
repeat); a restart requeues what was due; a job already in the book is never signalled
again, and a run requeued since (another start) is never requeued again. A job whose
signal failed is not requeued (it had no chance to checkpoint). The grace is an asyncio
task, never a wait in the webhook.
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
from slurm_gpu_exporter.report.remediate.confirm import Episode, Fault
from slurm_gpu_exporter.report.remediate.holders import holders, holders_query
from slurm_gpu_exporter.report.remediate.pending import REOPEN_S, PendingRequeue, RequeueBook
from slurm_gpu_exporter.report.remediate.requeue_policy import Choice, RequeuePolicy, choose
from slurm_gpu_exporter.report.slurm.actions import (
    listed_jobs,
    record_reason,
    requeue_job,
    signal_job,
)
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob

log = logging.getLogger(__name__)

# States a signalled job is requeued from after the grace: still running, or ended on
# its own: COMPLETED (it wrote its checkpoint and exited, as the signal asked), FAILED or
# NODE_FAIL (the broken GPU, or the signal it did not trap, took it down; its last
# checkpoint is the best it has). A person's cancel (CANCELLED), its own time limit, a
# preemption or an out-of-memory end is a decision or a fault a requeue would not undo.
REQUEUE_FROM = frozenset({"RUNNING", "SUSPENDED", "COMPLETED", "FAILED", "NODE_FAIL"})
RETRY_S = 30.0  # Slurm did not answer, or the job is still completing: ask again
# How long after its due time a requeue is still retried: past a slurmctld failover
# (SlurmctldTimeout, 120 s by default, plus the backup taking over) with room to spare.
RETRY_FOR_S = 1800.0


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
    retry_for_s: float = RETRY_FOR_S
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def on_faults(self, faults: list[Fault]) -> bool:
        """Signal the jobs on each fault's GPU and schedule their requeues; False where
        some work was left open by a failed look-up (a repeat of the post tries again)."""
        if not self.policy.enabled:
            return True
        done = True
        for fault in faults:
            episodes = self._to_work(fault)
            if not episodes:
                continue
            try:
                await self._on_fault(Fault(fault.node, episodes))
            except ReportError as exc:
                log.error("cannot signal the jobs on the faulty GPU of %s: %s; left open, "
                          "the next post of the alert tries again (for %g h)", fault.node,
                          plain(exc), REOPEN_S / 3600)
                self.count("failed", "lookup")
                done = False
                continue
            self.book.settled(e for e, _ in episodes)
        return done

    def _to_work(self, fault: Fault) -> tuple[tuple[Episode, str], ...]:
        """The episodes of ``fault`` whose requeue work is open: all of a new fault
        (opened now), those a failure left open of a repeat; those open too long are
        given up."""
        now = self.clock()
        if not fault.repeat:
            self.book.opened((e for e, _ in fault.episodes), now)
        work, stale = [], []
        for episode, alert in fault.episodes:
            since = self.book.opened_at(episode)
            if since is None:
                continue
            (stale if now - since >= REOPEN_S else work).append((episode, alert))
        if stale:
            log.error("gave up signalling the jobs on the faulty GPU of %s: the look-ups "
                      "failed for %g h", fault.node, REOPEN_S / 3600)
            self.count("failed", "gave_up")
            self.book.settled(e for e, _ in stale)
        return tuple(work)

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
        sig = self.policy.signal if self.policy.signals else ""
        head = (f"slurm-gpu-exporter: {alert} on {fault.node} {gpus} since "
                f"{episode.since_text}: ")
        why = slurm_value(head + (f"sent SIG{sig}, " if sig else "") + "requeue due", 400)
        if self.dry_run:
            log.info("dry run: would %s job %s (%s)", f"send SIG{sig} to" if sig else
                     "requeue", choice.target, plain(why, 300))
            self.book.acted(choice.key, now, None)
            self.count("dry_run", "dry_run")
            return
        due = PendingRequeue(choice.key, choice.target, choice.jobs[0].start or 0.0,
                             now + (self.policy.grace_s if sig else 0.0), fault.node, why)
        # Decided, and written, before acting: whatever fails after, the job is never
        # signalled again and a restart requeues it when due.
        self.book.acted(choice.key, now, due)
        if sig:
            try:
                await self._blocking(self.signal, ident, sig, self.policy.scope)
            except ReportError as exc:
                log.error("cannot signal job %s: %s; not requeueing it (it had no chance "
                          "to checkpoint)", choice.target, plain(exc))
                self.count("failed", "signal")
                self.book.finished(choice.key)
                await self._record(ident, slurm_value(
                    head + f"SIG{sig} failed ({plain(exc, 120)}), not requeued", 400))
                return
            self.count("signalled", sig)
            log.info("sent SIG%s to job %s (%s): %s", sig, choice.target,
                     self.policy.scope, plain(why, 300))
        await self._record(ident, why)
        self.schedule(due)

    def resume(self) -> None:
        """Schedule the requeues a previous run left due (overdue ones run at once)."""
        for due in list(self.book.pending.values()):
            self.schedule(due)

    def schedule(self, due: PendingRequeue, at: float | None = None) -> None:
        """Requeue at ``at`` (default: when due)."""
        task = asyncio.get_running_loop().create_task(
            self._when_due(due, due.due if at is None else at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _when_due(self, due: PendingRequeue, at: float) -> None:
        await asyncio.sleep(max(0.0, at - self.clock()))
        await self.requeue_now(due)

    async def requeue_now(self, due: PendingRequeue) -> None:
        """Requeue the job ``due`` names if Slurm still holds the run that was signalled
        and lets it requeue; else say why not."""
        try:
            listed = await self._blocking(self.listed)
            jobs = [j for j in listed.values()
                    if j.ident is not None and j.ident.target == due.target]
            verdict, why = requeue_verdict(jobs, due)
            if verdict == "wait":
                return self._again(due, why)
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
            return self._again(due, "Slurm failed")
        self.book.finished(due.key)

    def _again(self, due: PendingRequeue, why: str) -> None:
        """Ask again in ``RETRY_S``, until ``retry_for_s`` past its due time; the book
        keeps it meanwhile, so a restart asks again too."""
        now = self.clock()
        if now + RETRY_S > due.due + self.retry_for_s:
            log.error("gave up requeueing job %s: %s for %g s past its due time "
                      "(requeue it by hand: scontrol requeue %s)", due.target, why,
                      self.retry_for_s, due.target)
            self.count("failed", "gave_up")
            self.book.finished(due.key)
            return
        self.schedule(due, now + RETRY_S)

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
