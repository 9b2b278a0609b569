"""Which jobs a GPU fault signals and requeues: the pure decision of ``--requeue-opt``.

A job is picked only where both sources agree: Prometheus shows fresh series of it on
the faulty GPU (``holders.py``) and Slurm lists it RUNNING on that node. It is named by
its one target (``SlurmJobId.target``: ``A_T`` for an array task, a het job only as a
whole), acted on once (a key of its target and start time: a requeued job that starts
again is a new run), only where Slurm can requeue it (a batch job, not ``--no-requeue``:
a job that cannot be requeued is not signalled either), and only as the site's policy and
the job's own opt word say. The opt word is a whole word of the job's comment (``sbatch
--comment``) in any case, the user's own free text about their own job: it is searched
for, never parsed for anything else.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable
from dataclasses import dataclass

from slurm_gpu_exporter.report.slurm.actions import SIGNAL_SCOPES, SIGNALS, acted_on
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob

POLICIES = ("off", "all", "opt-in")
OPT_IN_WORD = "slurm-gpu:requeue"
OPT_OUT_WORD = "slurm-gpu:no-requeue"
NO_SIGNAL = "NONE"  # --requeue-signal NONE: requeue at once, signal nothing


def _word(word: str) -> re.Pattern[str]:
    """The word in any case, bounded by anything but a word character or one of the
    word's own (``-``, ``:``): ``slurm-gpu:requeue.`` holds it, ``xslurm-gpu:requeue``
    and ``slurm-gpu:requeue-later`` do not."""
    own = re.escape("".join(sorted({c for c in word if not (c.isalnum() or c == "_")})))
    edge = rf"[\w{own}]"
    return re.compile(rf"(?<!{edge}){re.escape(word)}(?!{edge})", re.IGNORECASE)


@dataclass(frozen=True)
class RequeuePolicy:
    """The site's policy: off (the default), every job (``all``: a job may opt out) or
    only the jobs that opt in (``opt-in``); the signal, its scope and the grace."""

    mode: str = "off"
    signal: str = "USR1"
    grace_s: float = 120.0
    scope: str = "full"

    def __post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ValueError(f"bad --requeue-opt {self.mode!r}: give {', '.join(POLICIES)}")
        if self.signal != NO_SIGNAL and self.signal not in SIGNALS:
            raise ValueError(f"bad --requeue-signal {self.signal!r}: give one of "
                             f"{', '.join(sorted(SIGNALS))} or {NO_SIGNAL}")
        if self.scope not in SIGNAL_SCOPES:
            raise ValueError(f"bad --requeue-signal-to {self.scope!r}: give "
                             f"{', '.join(SIGNAL_SCOPES)}")
        if not 0 <= self.grace_s <= 86400:
            raise ValueError("bad --requeue-grace: give 0 to 86400 seconds")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def signals(self) -> bool:
        return self.signal != NO_SIGNAL


def opted(comment: str, mode: str) -> bool:
    """Whether the job's own comment lets the policy act on it: under ``all`` unless it
    holds the word ``slurm-gpu:no-requeue``, under ``opt-in`` only if it holds
    ``slurm-gpu:requeue``; never when off."""
    out = _OPT_OUT.search(comment) is not None
    if mode == "all":
        return not out
    return mode == "opt-in" and _OPT_IN.search(comment) is not None and not out


_OPT_IN, _OPT_OUT = _word(OPT_IN_WORD), _word(OPT_OUT_WORD)


def job_key(job: SlurmJob) -> str | None:
    """What "once per job" counts: its target and when it started; None where either is
    not known."""
    target = job.ident.target if job.ident is not None else None
    if target is None or job.start is None:
        return None
    return f"{target}@{job.start:.0f}"


@dataclass(frozen=True)
class Choice:
    """What to do with one job the faulty GPU's series name."""

    jobid: str  # the agent's jobid label
    act: bool
    reason: str  # a short fixed word, for the counter
    text: str
    jobs: tuple[SlurmJob, ...] = ()  # the job, or every component of its het job
    key: str = ""

    @property
    def target(self) -> str:
        ident = self.jobs[0].ident if self.jobs else None
        return (ident.target or "") if ident is not None else ""


def choose(policy: RequeuePolicy, node: str, holding: Iterable[str],
           listed: dict[str, SlurmJob], done: Container[str]) -> list[Choice]:
    """Each job Prometheus shows on the faulty GPU of ``node``: acted on, or skipped
    with the reason. ``listed`` is squeue's answer, ``done`` the keys acted on before."""
    if not policy.enabled:
        return []
    choices: list[Choice] = []
    picked: set[str] = set()
    for jobid in sorted(set(holding), key=lambda j: (len(j), j)):
        job = listed.get(jobid)
        if job is None:
            choices.append(Choice(jobid, False, "not_listed",
                                  f"job {jobid}: Slurm lists no such job"))
            continue
        if not job.running or job.nodes is None or node not in job.nodes:
            where = ",".join(job.nodes or ("?",))
            choices.append(Choice(jobid, False, "not_on_node",
                                  f"job {job.shown}: Slurm lists it {job.state} on {where}, "
                                  f"not running on {node}"))
            continue
        jobs, key = acted_on(job, listed), job_key(job)
        if not jobs or key is None or jobs[0].ident is None or jobs[0].ident.target is None:
            choices.append(Choice(jobid, False, "no_target",
                                  f"job {job.shown}: no Slurm id names it alone"))
            continue
        if key in picked:
            continue  # a het job, or two MIG instances of the GPU: one action
        picked.add(key)
        if key in done:
            choices.append(Choice(jobid, False, "acted_before", f"job {job.shown}: "
                                  "signalled for a GPU fault before", jobs, key))
        elif jobs[0].batch is not True:
            # Slurm requeues batch jobs only: a signal would end the session for nothing.
            choices.append(Choice(jobid, False, "not_batch", f"job {job.shown}: not a batch "
                                  "job (salloc or srun): Slurm cannot requeue it", jobs, key))
        elif any(j.requeue is not True for j in jobs):
            choices.append(Choice(jobid, False, "no_requeue", f"job {job.shown}: Slurm does "
                                  "not let it requeue (sbatch --no-requeue)", jobs, key))
        elif not opted(job.comment, policy.mode):
            word = "opted_out" if policy.mode == "all" else "not_opted_in"
            choices.append(Choice(jobid, False, word, f"job {job.shown}: {word.replace('_', ' ')} "
                                  f"(--requeue-opt {policy.mode})", jobs, key))
        else:
            choices.append(Choice(jobid, True, "picked", f"job {job.shown}", jobs, key))
    return choices
