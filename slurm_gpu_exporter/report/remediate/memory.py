"""The firing episodes ``remediate`` acted on (drained the node, or found it drained), so
that it acts once per episode, also across its own restarts.

A JSON file ``{"episodes": [{"labels": {…}, "since": t, "seen": t}, …]}``: the labels
of the alert series as Prometheus has them, its active-since time, and when remediate
last heard of the episode. An episode not heard of for ``RETAIN_S`` is forgotten (it
resolved long ago: a new firing has a new start), and at most ``MAX_EPISODES`` are kept
(the least recently heard of go first), so the file stays small whatever is posted.
Written whole, mode 0600 (``report/private_file.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from slurm_gpu_exporter.report.remediate.confirm import Episode
from slurm_gpu_exporter.report.remediate.state_file import load_state, save_state

RETAIN_S = 7 * 86400.0
MAX_EPISODES = 10_000
# A repeat refreshes "seen" at most this often: Alertmanager's repeats cost no write each.
REFRESH_S = 3600.0


class ActedOn:
    """Episodes acted on, by episode; ``path`` None keeps them in memory only (dry run)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: dict[Episode, float] = {}
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        def parse(data: dict) -> None:  # type: ignore[type-arg]
            for entry in data["episodes"]:
                labels = {str(k): str(v) for k, v in dict(entry["labels"]).items()}
                self._seen[Episode.of(labels, float(entry["since"]))] = float(entry["seen"])

        load_state(path, "the remediate state", "alerts acted on would drain their node "
                   "again", parse)

    def __contains__(self, episode: Episode) -> bool:
        return episode in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, episodes: Iterable[Episode], now: float) -> None:
        """Record episodes acted on now (and forget the old ones)."""
        for episode in episodes:
            self._seen[episode] = now
        self._forget_old(now)
        self.save()

    def heard_of(self, episodes: Iterable[Episode], now: float) -> None:
        """A known episode was posted again: it is still going, keep it."""
        stale = [e for e in episodes if e in self._seen and now - self._seen[e] >= REFRESH_S]
        if stale:
            self.remember(stale, now)

    def _forget_old(self, now: float) -> None:
        for episode in [e for e, seen in self._seen.items() if now - seen >= RETAIN_S]:
            del self._seen[episode]
        if len(self._seen) > MAX_EPISODES:
            newest = sorted(self._seen.items(), key=lambda item: item[1])[-MAX_EPISODES:]
            self._seen = dict(newest)

    def save(self) -> None:
        """Write the file; a failure is logged (the episodes stay known until a restart)."""
        save_state(self.path, {"episodes": [
            {"labels": dict(e.labels), "since": e.since, "seen": seen}
            for e, seen in self._seen.items()]}, "the remediate state",
            "after a restart remediate would drain for these alerts again")
