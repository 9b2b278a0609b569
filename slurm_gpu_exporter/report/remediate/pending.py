"""The jobs a GPU fault signalled, the requeues still due after their grace, and the
firing episodes whose requeue work is not done yet: kept in a file so that a restart of
``remediate`` neither signals a job twice nor loses a requeue.

A JSON file next to ``--state-file`` (``remediate.json`` -> ``remediate.requeue.json``):
``{"done": {key: t}, "pending": [{key, target, start, due, node, why}, …],
"open": {episode: t}}``. ``done`` holds each job acted on (its target and start,
``requeue_policy.job_key``) and when, written before the signal: a job is never signalled
or requeued twice, whatever fails after. A key older than ``RETAIN_S`` is forgotten, at
most ``MAX_KEYS`` are kept. A pending requeue stays until it ran (or found nothing to do);
a restart runs the overdue ones at once. ``open`` holds each firing episode drained for
whose jobs were not all decided yet (a failed Prometheus or Slurm look-up), and since when:
a repeat of its post tries again until ``REOPEN_S`` has passed. Written whole, mode 0600
(``report/private_file.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_gpu_exporter.report.remediate.confirm import Episode
from slurm_gpu_exporter.report.remediate.state_file import load_state, save_state

RETAIN_S = 7 * 86400.0
MAX_KEYS = 10_000
# How long a firing episode whose requeue work failed stays open to the repeats of its
# post: three of Alertmanager's default repeat_interval (4h), so a few repeats get a try.
REOPEN_S = 12 * 3600.0


def episode_key(episode: Episode) -> str:
    """An episode as the file names it: its labels and active-since time."""
    return json.dumps([list(map(list, episode.labels)), episode.since], sort_keys=True)


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
        self.open: dict[str, float] = {}  # episode_key -> when it was opened
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
            # A file of an earlier release has no open episodes.
            self.open = {str(k): float(v) for k, v in dict(data.get("open", {})).items()}

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

    def opened(self, episodes: Iterable[Episode], now: float) -> None:
        """Episodes whose jobs are about to be looked for: open until ``settled``."""
        keys = [episode_key(e) for e in episodes]
        if any(k not in self.open for k in keys):
            self.open.update((k, now) for k in keys if k not in self.open)
            self.save()

    def is_open(self, episode: Episode) -> bool:
        return episode_key(episode) in self.open

    def opened_at(self, episode: Episode) -> float | None:
        return self.open.get(episode_key(episode))

    def settled(self, episodes: Iterable[Episode]) -> None:
        """Every job of these episodes was decided (or they were given up on)."""
        keys = [episode_key(e) for e in episodes if episode_key(e) in self.open]
        for key in keys:
            del self.open[key]
        if keys:
            self.save()

    def finished(self, key: str) -> None:
        """A due requeue ran (or found nothing to do)."""
        if self.pending.pop(key, None) is not None:
            self.save()

    def _forget_old(self, now: float) -> None:
        self.done = {k: t for k, t in self.done.items()
                     if now - t < RETAIN_S or k in self.pending}
        self.open = {k: t for k, t in self.open.items() if now - t < RETAIN_S}
        if len(self.done) > MAX_KEYS:
            self.done = dict(sorted(self.done.items(), key=lambda kv: kv[1])[-MAX_KEYS:])

    def save(self) -> None:
        """Write the file; a failure is logged (the memory holds until a restart)."""
        save_state(self.path, {"done": self.done, "open": self.open,
                               "pending": [asdict(p) for p in self.pending.values()]},
                   "the requeue state", "after a restart remediate would lose its due requeues")
