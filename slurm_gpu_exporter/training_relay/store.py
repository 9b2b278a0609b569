"""Per-job training series: parse what a job pushed, check it against the limits, keep it.

Pure logic, no sockets: the listener hands in (job, payload) pairs it has authenticated.
Each push carries a sender's whole current state, so a push replaces the values of
the series it names and keeps the job's others; a job's series go with ``forget``.
Thread-safe: the listener thread writes, the sampler thread reads ``families()``.
The checks are ``payload.py``, the series ``series.py``, the limits and rate budgets
``limits.py``; this module holds them together under one lock, with the counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_exporter.training_relay.limits import REASONS, RateBudgets, RelayLimits
from slurm_gpu_exporter.training_relay.payload import check_family, created_companions, lines_of
from slurm_gpu_exporter.training_relay.series import JobIdentity, SeriesBook


class TrainingStore:
    """The training series of the jobs on this node, bounded per job."""

    def __init__(self, limits: RelayLimits | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or RelayLimits()
        self._clock = clock
        self._lock = threading.Lock()
        self._series = SeriesBook(self.limits)
        self._budgets = RateBudgets(self.limits)
        self._errors = dict.fromkeys(REASONS, 0)
        self._accepted = 0
        # Bumped on every change to the series; families() is rebuilt only after one,
        # since scripts push less often than the agent samples.
        self._version = 0
        self._built: tuple[int, list[Metric]] = (0, [])

    # -- counts ---------------------------------------------------------------------

    def count(self, reason: str, n: int = 1) -> None:
        """Count ``n`` refusals for ``reason`` (one of REASONS)."""
        with self._lock:
            self._errors[reason] += n

    def accepted(self) -> int:
        """Messages parsed and merged so far (in part, when some series were refused)."""
        with self._lock:
            return self._accepted

    def error_counts(self) -> dict[str, int]:
        """Refusals so far, by reason (all of REASONS present)."""
        with self._lock:
            return dict(self._errors)

    # -- writing --------------------------------------------------------------------

    def admit(self, jobid: str, lines: int = 1) -> float:
        """Take a message of ``lines`` lines from the job's budgets.

        Returns 0.0, or the seconds until the budgets would have room; a refusal is
        counted under "rate".
        """
        now = self._clock()
        with self._lock:
            wait = self._budgets.take(jobid, lines, now)
            if wait > 0:
                self._errors["rate"] += 1
            return wait

    def ingest(self, job: JobIdentity, payload: bytes) -> bool:
        """Parse one message of ``job`` and merge it in; False when it was refused whole.

        Each reason a message breaks is counted once for that message.
        """
        if (len(payload) > self.limits.max_message_bytes
                or lines_of(payload) > self.limits.max_lines_per_message):
            self.count("size")
            return False
        try:
            families = list(text_string_to_metric_families(payload.decode("utf-8")))
        except Exception:  # the parser raises ValueError and friends on bad text
            self.count("parse")
            return False
        reasons: set[str] = set()
        companions = created_companions(families)
        checked = [c for c in (check_family(f, self.limits, reasons) for f in families
                               if f.name not in companions) if c]
        with self._lock:
            self._version += 1
            self._series.merge(job, checked, reasons)
            for reason in reasons:
                self._errors[reason] += 1
            self._accepted += 1
        return True

    def forget(self, jobid: str) -> None:
        """Drop the job's series and rate budget (its linger has passed)."""
        with self._lock:
            self._budgets.forget(jobid)
            if self._series.forget(jobid):
                self._version += 1

    # -- reading --------------------------------------------------------------------

    def known_jobs(self) -> set[str]:
        """Jobs with series or a rate budget here: what ``forget`` would drop."""
        with self._lock:
            return set(self._series.jobs()) | self._budgets.jobs()

    def jobs(self) -> dict[str, int]:
        """Series held per job."""
        with self._lock:
            return self._series.jobs()

    def families(self) -> list[Metric]:
        """The jobs' series as prometheus-client families, labelled with jobid and user.

        The same list is returned until the series change; callers must not modify it.
        """
        with self._lock:
            if self._built[0] != self._version:
                self._built = (self._version, self._series.families())
            return self._built[1]
