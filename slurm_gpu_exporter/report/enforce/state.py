"""What ``enforce`` remembers between runs: the warnings sent to each job, and cancels.

A JSON file ``{"jobs": {"<jobid>": {"warnings": [t1, t2], "cancelled": t}}}``. Each
warning is added after it was sent, so a failed send is retried on the next run and a
sent one is never repeated. Jobs Slurm no longer runs are forgotten. Written whole,
mode 0600 whatever the umask (``report/private_file.py``): a crash leaves the old
state or the new one.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.private_file import write_private

EXIT_STATE = 2


class EnforceState:
    """The warnings and cancels recorded per job id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
            jobs = data["jobs"]
            if not isinstance(jobs, dict):
                raise ValueError("jobs is not an object")
        except FileNotFoundError:
            jobs = {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"cannot read the enforce state {path}: {exc}; fix it or move "
                              "it away (warnings already sent would be sent again)",
                              EXIT_STATE) from None
        self.jobs: dict[str, dict[str, Any]] = jobs

    def warnings(self) -> dict[str, list[float]]:
        """When each warning was sent, per job id."""
        return {jobid: [float(t) for t in entry.get("warnings", [])]
                for jobid, entry in self.jobs.items()}

    def add_warning(self, jobid: str, at: float) -> None:
        self.jobs.setdefault(jobid, {}).setdefault("warnings", []).append(at)
        self.save()

    def forget_warnings(self, jobid: str) -> None:
        if self.jobs.pop(jobid, None) is not None:
            self.save()

    def add_cancel(self, jobid: str, at: float) -> None:
        self.jobs.setdefault(jobid, {})["cancelled"] = at
        self.save()

    def keep_only(self, running: Collection[str]) -> None:
        """Forget the jobs that no longer run (the file stays small)."""
        gone = [jobid for jobid in self.jobs if jobid not in running]
        for jobid in gone:
            del self.jobs[jobid]
        if gone:
            self.save()

    def save(self) -> None:
        body = (json.dumps({"jobs": self.jobs}, indent=1, sort_keys=True) + "\n").encode()
        write_private(self.path, body, "the enforce state", EXIT_STATE)
