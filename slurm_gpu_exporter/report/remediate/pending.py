"""The jobs a GPU fault signalled, and the requeues still due after their grace: kept
in a file so that a restart of ``remediate`` neither signals a job twice nor loses a
requeue.

A JSON file next to ``--state-file`` (``remediate.json`` -> ``remediate.requeue.json``):
``{"done": {key: t}, "pending": [{key, target, start, due, node, why}, …]}``. ``done``
holds each job acted on (its target and start, ``requeue_policy.job_key``) and when; a
key older than ``RETAIN_S`` is forgotten, at most ``MAX_KEYS`` are kept. A pending
requeue stays until it ran (or found nothing to do); a restart runs the overdue ones at
once. Written whole, mode 0600 (``report/private_file.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_gpu_exporter.report.remediate.state_file import load_state, save_state

RETAIN_S = 7 * 86400.0
MAX_KEYS = 10_000


def requeue_state_path(state_file: Path) -> Path:
    """Where the requeue book of ``--state-file`` lives."""
    return state_file.with_name(state_file.stem + ".requeue.json")


@dataclass(frozen=True)
class PendingRequeue:
    """A job signalled for a GPU fault, to be requeued at ``due``."""

    key: str
    target: str  # as Slurm resolves it: A_T, a het leader, a plain id
    start: float  # the run that was signalled: a job requeued since has another start
    due: float
    node: str
    why: str  # what is recorded in its AdminComment


class RequeueBook:
    """Jobs acted on and requeues due; ``path`` None keeps them in memory (dry run)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.done: dict[str, float] = {}
        self.pending: dict[str, PendingRequeue] = {}
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        def parse(data: dict) -> None:  # type: ignore[type-arg]
            self.done = {str(k): float(v) for k, v in dict(data["done"]).items()}
            for entry in data["pending"]:
                item = PendingRequeue(str(entry["key"]), str(entry["target"]),
                                      float(entry["start"]), float(entry["due"]),
                                      str(entry["node"]), str(entry["why"]))
                self.pending[item.key] = item

        load_state(path, "the requeue state", "jobs signalled would be signalled again, "
                   "due requeues lost", parse)

    def __contains__(self, key: object) -> bool:
        return key in self.done

    def acted(self, key: str, now: float, pending: PendingRequeue | None) -> None:
        """Record a job acted on now, and its requeue where one is due."""
        self.done[key] = now
        if pending is not None:
            self.pending[key] = pending
        self._forget_old(now)
        self.save()

    def finished(self, key: str) -> None:
        """A due requeue ran (or found nothing to do)."""
        if self.pending.pop(key, None) is not None:
            self.save()

    def _forget_old(self, now: float) -> None:
        self.done = {k: t for k, t in self.done.items()
                     if now - t < RETAIN_S or k in self.pending}
        if len(self.done) > MAX_KEYS:
            self.done = dict(sorted(self.done.items(), key=lambda kv: kv[1])[-MAX_KEYS:])

    def save(self) -> None:
        """Write the file; a failure is logged (the memory holds until a restart)."""
        save_state(self.path, {"done": self.done,
                               "pending": [asdict(p) for p in self.pending.values()]},
                   "the requeue state", "after a restart remediate would lose its due requeues")
