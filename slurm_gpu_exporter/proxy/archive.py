"""The job archive behind the proxy (``--archive.url``): ``GET /slurm-gpu/v1/jobs/<jobid>``
answers a job that ended past Prometheus' retention with its archived summary, under
the same identity rules as the queries: a user sees their own jobs (a coordinator
those of their accounts' users), an admin every job.

The archive is an optional part (the ``archive`` extra): it is imported here, inside
functions, so a plain install runs the proxy without it. Reads are synchronous
SQLAlchemy, so they run in threads, at most ``MAX_READS`` at a time: a flood of
requests gets 503 at once instead of a queue that starves the queries.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_gpu_exporter.model.extras import archive_install_hint, missing_archive_library
from slurm_gpu_exporter.model.ids import NAMED_JOB
from slurm_gpu_exporter.proxy.query.restrict import Scope

ROUTE = "/slurm-gpu/v1/jobs/{jobid}"
# Slurm's job ids: a number, an array task (123_4) or a heterogeneous component
# (123+1); nothing else reaches the database, however it is encoded.
JOBID = re.compile(NAMED_JOB)
CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_READS = 4
READ_TIMEOUT_S = 20.0


class ArchiveUnavailable(Exception):
    """The archive could not be read (message for the client and the log)."""


class ArchiveSetupError(Exception):
    """``--archive.url`` cannot be used; the message says how to fix it."""


@dataclass(frozen=True)
class ArchivedJob:
    """One archived job (one cluster's) as the endpoint sends it."""

    user: str
    cluster: str
    archived_at: float
    detail: dict[str, Any]  # figures/detail_data: what ``job`` renders


def may_see(scope: Scope, owner: str) -> bool:
    """The queries' rule for one job: an admin sees all; others the users in scope."""
    return scope.admin or owner in scope.users


class ArchiveReader:
    """Reads jobs from the archive at ``url`` (read only: the proxy never writes it)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        try:
            from slurm_gpu_exporter.report.archive.store import parse_db_url, shown
            from slurm_gpu_exporter.report.errors import ReportError
        except ModuleNotFoundError as exc:
            library = missing_archive_library(exc)
            if library is None:
                raise
            raise ArchiveSetupError(f"--archive.url needs the job archive's libraries, "
                                    f"which are not installed (no module {library!r}): "
                                    f"{archive_install_hint()}") from None
        try:
            self.where = shown(parse_db_url(url))
        except ReportError as exc:
            raise ArchiveSetupError(str(exc).replace("--db", "--archive.url")) from None
        self.url = url
        self.timeout_s = timeout_s
        self._reading = 0

    @property
    def busy(self) -> bool:
        return self._reading >= MAX_READS

    async def job(self, jobid: str, cluster: str | None) -> list[ArchivedJob]:
        """The archived jobs with this id (one per cluster; none: not archived)."""
        self._reading += 1
        task = asyncio.create_task(asyncio.to_thread(self._read, jobid, cluster))
        task.add_done_callback(self._done)  # counted until the thread ends, not the wait
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                return await asyncio.shield(task)
        except TimeoutError:
            raise ArchiveUnavailable(f"the archive {self.where} did not answer within "
                                     f"{READ_TIMEOUT_S:g} s") from None

    def _done(self, _task: asyncio.Task[Any]) -> None:
        self._reading -= 1

    def check(self) -> str | None:
        """Why the archive cannot be read now, or None (for the start-up log)."""
        from slurm_gpu_exporter.report.archive.store import ArchiveStore
        from slurm_gpu_exporter.report.errors import ReportError

        try:
            with ArchiveStore(self.url, write=False, timeout_s=self.timeout_s):
                return None
        except ReportError as exc:
            return str(exc)

    def _read(self, jobid: str, cluster: str | None) -> list[ArchivedJob]:
        from slurm_gpu_exporter.report.archive.store import ArchiveStore
        from slurm_gpu_exporter.report.errors import ReportError
        from slurm_gpu_exporter.report.figures.detail_data import detail_to_data

        try:
            with ArchiveStore(self.url, write=False, timeout_s=self.timeout_s) as store:
                found = store.details([jobid], cluster)
        except ReportError as exc:
            raise ArchiveUnavailable(str(exc)) from None
        return [ArchivedJob(user=detail.usage.user, cluster=detail.usage.cluster,
                            archived_at=archived_at, detail=detail_to_data(detail))
                for detail, archived_at in found.get(jobid, [])]


def answer(found: list[ArchivedJob], scope: Scope, jobid: str,
           refuse: Callable[[int, str, str], Exception]) -> dict[str, Any]:
    """The endpoint's JSON for the jobs found; ``refuse(status, reason, message)``
    makes the exception for a missing job (404) or another user's (403)."""
    if not found:
        raise refuse(404, "not_archived", f"job {jobid} is not in the job archive; check "
                     "the id (a job is archived once it has ended)")
    seen = [job for job in found if may_see(scope, job.user)]
    if not seen:
        raise refuse(403, "not_yours", f"job {jobid} is not yours: the proxy shows each "
                     "user only their own jobs; ask the job's owner or an admin")
    return {"status": "success", "data": {"jobs": [
        {"cluster": job.cluster, "user": job.user, "archived_at": job.archived_at,
         "detail": job.detail} for job in seen]}}
