"""What ``enforce`` does with each job: warn, cancel, nothing, or skip and why.

Pure: from the jobs the metrics show, the jobs Slurm lists, the warnings already sent
and the policy. Every doubt about the data turns into a skip, never into an action.
Order of the checks: running in Slurm, same user in Slurm and the metrics, exempt,
the same nodes and GPUs in Slurm and in fresh series, data doubts now, old enough,
then the idle windows. The two sources must agree: a node of the job without fresh
series (an agent not deployed, a target missing from service discovery), fewer GPUs
with fresh series than Slurm allocated, or a job Slurm does not list as RUNNING while
its series are fresh, makes the job doubtful.

Series and Slurm's jobs meet on each job's own id (an array task's and a het
component's too: the agent sees ``SLURM_JOB_ID``). An action names exactly one job as
Slurm resolves it (``SlurmJobId.target``): an array task as ``A_T``. A het job is
cancelled only as a whole, and only when every component Slurm lists is due for its
cancel; a component due while another is not (busy, not yet due, no GPU series to
judge) is doubtful.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from slurm_gpu_exporter.report.enforce.idle_window import JobIdleness
from slurm_gpu_exporter.report.enforce.policy import Policy, span
from slurm_gpu_exporter.report.slurm.actions import SlurmJob, acted_on

Action = Literal["warn", "cancel", "none", "skip"]
# States of a job that has ended or is ending: its series linger, nothing is doubtful.
ENDED_STATES = frozenset({"COMPLETED", "COMPLETING", "CANCELLED", "FAILED", "TIMEOUT",
                          "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
                          "DEADLINE"})


@dataclass(frozen=True)
class Decision:
    jobid: str
    user: str
    account: str
    partition: str
    name: str
    gpus: int
    nodes: tuple[str, ...]
    idle_for_s: float | None
    action: Action
    reason: str
    warning: int | None = None  # the warning's number, for "warn"
    cancel_at: float | None = None  # earliest cancel, for "warn"
    doubtful: bool = False  # skipped because the data cannot be trusted
    forget_warnings: bool = False  # used its GPUs again: a new idle spell starts over
    slurm: SlurmJob | None = None  # the job as Slurm listed it in this run
    # For "cancel": every job the cancel reaches as Slurm listed it (each het component)
    components: tuple[SlurmJob, ...] = ()

    @property
    def shown(self) -> str:
        """The job as users know it: ``1234_5`` for an array task, ``1234+1`` for a het
        component, else its id."""
        return self.slurm.shown if self.slurm is not None else self.jobid

    @property
    def target(self) -> str:
        """What an action names: ``A_T`` for an array task, the het job's leader id for
        a het component (the whole het job), else the job id."""
        ident = self.slurm.ident if self.slurm is not None else None
        return (ident.target if ident is not None else None) or self.jobid


def decide(jobs: list[JobIdleness], slurm: dict[str, SlurmJob],
           warnings_sent: dict[str, list[float]], policy: Policy, now: float
           ) -> list[Decision]:
    """One decision per job the metrics show, in job id order; the cap applied."""
    decisions = [_decide(job, slurm.get(job.jobid), warnings_sent.get(job.jobid, []),
                         policy, now) for job in jobs]
    decisions = [replace(d, components=acted_on(d.slurm, slurm))
                 if d.action == "cancel" and d.slurm is not None else d for d in decisions]
    return _cap(_whole_het_jobs(decisions), policy.max_cancels_per_run)


def _decide(job: JobIdleness, slurm: SlurmJob | None, sent: list[float], policy: Policy,
            now: float) -> Decision:
    # Who and what from Slurm where it runs the job; the metrics' user otherwise.
    base: dict[str, Any] = {
        "jobid": job.jobid, "user": slurm.user if slurm else job.user,
        "account": slurm.account if slurm else "",
        "partition": slurm.partition if slurm else "", "name": slurm.name if slurm else "",
        "gpus": len(job.gpus), "nodes": tuple(job.nodes), "slurm": slurm}

    def skip(reason: str, doubtful: bool = False, idle: float | None = None) -> Decision:
        return Decision(**base, idle_for_s=idle, action="skip", reason=reason,
                        doubtful=doubtful)

    if slurm is None or slurm.state in ENDED_STATES:
        if slurm is None and job.fresh:
            return skip("Slurm does not list the job, yet its series are fresh",
                        doubtful=True)
        return skip("not running in Slurm (ended, or not a job of this cluster)")
    if not slurm.running:
        return skip(f"Slurm lists it as {slurm.state}, not RUNNING", doubtful=True)
    if slurm.ident is None or slurm.ident.target is None:
        return skip("Slurm's answer does not say which array task or het job component "
                    "it is, so no id names it alone", doubtful=True)
    if slurm.user != job.user:
        return skip(f"Slurm says the job is {slurm.user}'s, the metrics {job.user}'s",
                    doubtful=True)
    exempt = policy.exempt.reason(slurm.user, slurm.account, slurm.partition, slurm.qos,
                                  slurm.name)
    if exempt is not None:
        return skip(f"exempt ({exempt})")
    doubts = _disagreements(job, slurm) + job.doubts
    if doubts:
        return skip("; ".join(doubts), doubtful=True)
    age = job.age(now)
    if age is not None and age < policy.min_job_age_s:
        return skip(f"younger than min_job_age ({span(policy.min_job_age_s)})")
    idle, doubt = job.idle_for(now)
    if doubt is not None:
        return skip(doubt, doubtful=True, idle=idle)
    return _by_idle_time(base, idle, sent, policy, now)


def _disagreements(job: JobIdleness, slurm: SlurmJob) -> list[str]:
    """Where Slurm's view of the job and its fresh series differ."""
    found = []
    if slurm.nodes is None:
        found.append("Slurm's answer does not say which nodes the job runs on")
    else:
        missing = sorted(set(slurm.nodes) - job.fresh_nodes)
        if missing:
            found.append(f"Slurm runs it on {', '.join(missing)} too, with no fresh series "
                         "of it from there (agent or scrape target missing?)")
    if slurm.gpus is None:
        found.append("Slurm's answer does not say how many GPUs the job holds")
    elif slurm.gpus > len(job.fresh):
        found.append(f"Slurm allocated {slurm.gpus} GPU(s), fresh series show "
                     f"{len(job.fresh)}")
    return found


def _by_idle_time(base: dict[str, Any], idle: float, sent: list[float], policy: Policy,
                  now: float) -> Decision:
    warn_after = policy.warn_after_s
    first = warn_after[0] if warn_after else policy.cancel_after_s
    if idle < first:
        used = "used its GPUs" if idle == 0 else f"idle for {span(idle)} only"
        return Decision(**base, idle_for_s=idle, action="none",
                        reason=f"{used} in the last {span(first)}",
                        forget_warnings=bool(sent))
    due = sum(1 for t in warn_after if t <= idle)
    # The last warning gives the user the time between it and the cancel, whenever
    # it was sent (a late first run must not warn and cancel at once).
    gap = policy.cancel_after_s - warn_after[-1] if warn_after else 0.0
    if len(sent) < due:
        number = len(sent) + 1
        wait = policy.cancel_after_s - idle
        if number == len(warn_after):
            wait = max(wait, gap)
        return Decision(**base, idle_for_s=idle, action="warn", warning=number,
                        cancel_at=now + wait,
                        reason=f"idle for {span(idle)}: warning {number} of {len(warn_after)}")
    if idle >= policy.cancel_after_s:
        if sent and now - sent[-1] < gap:
            return Decision(**base, idle_for_s=idle, action="none",
                            reason=f"idle for {span(idle)}; the last warning was "
                                   f"{span(now - sent[-1])} ago, cancel after {span(gap)}")
        return Decision(**base, idle_for_s=idle, action="cancel",
                        reason=f"idle for {span(idle)} (busy under "
                               f"{policy.busy_fraction:.0%}) after {len(sent)} warning(s)")
    return Decision(**base, idle_for_s=idle, action="none",
                    reason=f"idle for {span(idle)}; warning {len(sent)} sent, cancel at "
                           f"{span(policy.cancel_after_s)} idle")


def _whole_het_jobs(decisions: list[Decision]) -> list[Decision]:
    """One cancel per het job, and only when every component Slurm lists is due for it;
    otherwise each component due is doubtful, with the component that is not."""
    by_jobid = {d.jobid: d for d in decisions}
    done: dict[str, Decision] = {}  # jobid -> its decision, changed
    for decision in decisions:
        ident = decision.slurm.ident if decision.slurm is not None else None
        if decision.action != "cancel" or ident is None or not ident.is_het_component \
                or decision.jobid in done:
            continue
        het = ident.het_job_id
        parts = decision.components
        holdout = next((p for p in parts if p.jobid not in by_jobid
                        or by_jobid[p.jobid].action != "cancel"), None)
        if holdout is not None or not parts:
            why = ("no component is listed" if holdout is None else
                   f"{holdout.shown} has no GPU series to judge" if holdout.jobid not in
                   by_jobid else f"{holdout.shown} is not due ({by_jobid[holdout.jobid].action}"
                                 f": {by_jobid[holdout.jobid].reason})")
            for part in parts or (decision.slurm,):  # type: ignore[assignment]
                mine = by_jobid.get(part.jobid)
                if mine is not None and mine.action == "cancel":
                    done[part.jobid] = replace(
                        mine, action="skip", doubtful=True, components=(),
                        reason=f"{mine.reason}; but het job {het} is cancelled only "
                               f"whole, when every component is idle, and {why}")
            continue
        first, *others = parts
        done[first.jobid] = replace(
            by_jobid[first.jobid], components=parts,
            reason=f"{by_jobid[first.jobid].reason}; het job {het}: all {len(parts)} "
                   "components idle")
        for part in others:
            done[part.jobid] = replace(by_jobid[part.jobid], action="skip", components=(),
                                       reason=f"goes with the cancel of its het job {het} "
                                              f"(under {first.shown})")
    return [done.get(d.jobid, d) for d in decisions]


def _cap(decisions: list[Decision], cap: int) -> list[Decision]:
    # The longest idle first: the cap defers the jobs that waste least.
    order = sorted((d for d in decisions if d.action == "cancel"),
                   key=lambda d: (-(d.idle_for_s or 0.0), len(d.jobid), d.jobid))
    deferred = {d.jobid for d in order[cap:]}
    return [replace(d, action="skip",
                    reason=f"{d.reason}; deferred: max_cancels_per_run ({cap}) reached")
            if d.jobid in deferred else d for d in decisions]
