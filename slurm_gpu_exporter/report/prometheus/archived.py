"""Jobs from the job archive behind slurm-gpu-proxy (``GET /slurm-gpu/v1/jobs/<jobid>``),
for the jobs Prometheus has no samples of: asked through the queries' own client
(client.py), so signed in the way they are (munge, basic auth, a bearer token, a client
certificate) and the proxy applies the same identity rules to them.

A URL with no such endpoint (a plain Prometheus, a proxy without ``--archive.url``)
is no error: the jobs stay unknown, as they were without it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp

from slurm_gpu_exporter.report.figures.detail_data import DetailDataError, detail_from_data
from slurm_gpu_exporter.report.figures.shapes import JobDetail
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient

log = logging.getLogger(__name__)

PATH = "/slurm-gpu/v1/jobs/"
# What a proxy without the archive, or anything that is not a proxy, answers.
NO_ARCHIVE_REASONS = {"no_archive", "not_found", "endpoint", "method"}
MAX_ANSWER_BYTES = 16 * 1024 * 1024


@dataclass
class ProxyArchive:
    """What the proxy's archive said of the jobs asked."""

    url: str
    found: dict[str, list[tuple[JobDetail, float]]] = field(default_factory=dict)
    not_yours: dict[str, str] = field(default_factory=dict)  # jobid -> the proxy's message
    problem: str | None = None  # why it could not be asked (None: asked, or none there)


async def archived_jobs(prom: PrometheusClient, jobids: list[str],
                        cluster: str | None = None) -> ProxyArchive:
    """Ask the proxy behind ``prom`` for each job, one request each (a munge credential
    is good for one request)."""
    url = prom.conn.url
    out = ProxyArchive(url=url)
    params = {"cluster": cluster} if cluster else {}
    for jobid in jobids:
        try:
            status, raw = await prom.get(PATH + quote(jobid, safe=""), params,
                                         MAX_ANSWER_BYTES)
        except (TimeoutError, aiohttp.ClientError) as exc:
            why = str(exc) or type(exc).__name__
            out.problem = f"the job archive at {url} did not answer ({why})"
            return out
        if not _take(out, jobid, status, raw, url):
            return out
    return out


def _take(out: ProxyArchive, jobid: str, status: int, raw: bytes, url: str) -> bool:
    """Record one answer; False when there is no archive to ask further."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict) or "status" not in body:
        log.info("%s has no job archive endpoint (HTTP %d)", url, status)
        return False
    reason = body.get("errorType")
    if status == 200 and body["status"] == "success":
        try:
            jobs = body["data"]["jobs"]
            out.found[jobid] = [(detail_from_data(job["detail"]), float(job["archived_at"]))
                                for job in jobs]
        except (KeyError, TypeError, ValueError, DetailDataError) as exc:
            out.problem = f"the job archive at {url} sent a job that is not one ({exc})"
            return False
        if not out.found[jobid]:
            del out.found[jobid]
        return True
    if status == 403 and reason == "not_yours":
        out.not_yours[jobid] = str(body.get("error", ""))
        return True
    if status in (400, 404) and reason in ("not_archived", "bad_jobid"):
        return True
    if reason in NO_ARCHIVE_REASONS:
        log.info("%s serves no job archive (%s)", url, reason)
        return False
    out.problem = (f"the job archive at {url} answered HTTP {status}: "
                   f"{reason or 'error'}: {body.get('error', '?')}")
    return False
