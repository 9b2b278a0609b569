"""A small client for the MLflow tracking server's REST API (2.0): the runs waiting for
their job's figures, and writing figures into a run. aiohttp only: mlflow is no
dependency of the package.

Authentication and TLS follow MLflow's own variables, so the settings that work for a
site's MLflow clients work here: ``MLFLOW_TRACKING_TOKEN`` (bearer),
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (basic),
``MLFLOW_TRACKING_SERVER_CERT_PATH`` (a CA bundle), ``MLFLOW_TRACKING_INSECURE_TLS``;
``user:password@`` in the URL is basic auth too, where the variables give none.
Every failure becomes a ReportError with one line that says what to do; no message
carries a credential (the URL is shown without its ``user:password@``, headers never).
A run that cannot be written (gone, deleted, not ours to edit) is a RunNotWritable, so
the caller skips that run alone.
"""

from __future__ import annotations

import json
import os
import re
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp

from slurm_gpu_exporter.report.basic_credentials import basic_authorization
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain

EXIT_TRACKING = 3
API = "/api/2.0/mlflow/"
PAGE = 1000  # runs/search pages (MLflow's own limit is 50,000)
MAX_PAGES = 100  # a bound on one invocation's work: 100,000 pending runs
# What a figure may say as a tag: MLflow keeps tag values up to 8,000 characters.
MAX_TAG_VALUE = 5000
# What MLflow answers about one run that the writer cannot write: it is gone or deleted
# (400/404), or the writer's user may not edit it (403).
GONE_CODES = frozenset({"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE",
                        "INVALID_STATE"})
_USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*@)")


class RunNotWritable(ReportError):
    """MLflow would not take a write into one run; ``forbidden`` where it said 403."""

    def __init__(self, message: str, forbidden: bool) -> None:
        super().__init__(message, EXIT_TRACKING)
        self.forbidden = forbidden


def redact(url: str) -> str:
    """``url`` without its ``user:password@`` (what every message shows of it)."""
    return _USERINFO_RE.sub(r"\1", url)


def _userinfo(url: str) -> tuple[str, str] | None:
    found = _USERINFO_RE.match(url)
    if found is None:
        return None
    user, _, password = found.group(2)[:-1].partition(":")
    return unquote(user), unquote(password)


class TrackingServer:
    """The tracking server at ``url``; use as ``async with``."""

    def __init__(self, url: str, timeout_s: float = 30.0,
                 environ: Mapping[str, str] = os.environ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ReportError(f"bad --tracking-uri {redact(url)!r}: give the tracking "
                              "server's http:// or https:// URL (a file store cannot be "
                              "written here)")
        self.url = redact(url).rstrip("/")  # requests go here; the credentials go apart
        self.requests = 0
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = _credentials(environ, _userinfo(url))
        self._ssl = _ssl(environ) if url.startswith("https:") else True
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> TrackingServer:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, method: str, body: dict[str, Any],
                   run_id: str | None = None) -> dict[str, Any]:
        """POST ``body`` to ``API + method``; the answer's JSON object. With ``run_id``
        (a write into that run), an answer that says the run cannot be written raises
        RunNotWritable instead of ending the invocation."""
        assert self._session is not None, "use TrackingServer as 'async with'"
        self.requests += 1
        where = f"{self.url}{API}{method}"
        try:
            async with self._session.post(where, json=body, ssl=self._ssl) as resp:
                text = await resp.text()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ReportError(f"cannot reach MLflow at {self.url} ({type(exc).__name__}: "
                              f"{redact(str(exc))}); check --tracking-uri and that the "
                              "tracking server runs", EXIT_TRACKING) from None
        if status != 200:
            code, message = _error_of(text)
            if run_id is not None and (status == 403 or (status in (400, 404)
                                                         and code in GONE_CODES)):
                raise RunNotWritable(f"MLflow answered {status} {code or 'PERMISSION_DENIED'}"
                                     f" to {method}: {message}", forbidden=status == 403)
            raise ReportError(f"MLflow at {self.url} answered {status} to {method}: "
                              f"{message}; check --tracking-uri and the MLFLOW_TRACKING_* "
                              "credentials", EXIT_TRACKING)
        try:
            answer = json.loads(text) if text.strip() else {}
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ReportError(f"MLflow at {self.url} answered {method} with something "
                              "other than a JSON object; is --tracking-uri an MLflow "
                              "tracking server?", EXIT_TRACKING)
        return answer

    async def experiment_ids(self) -> list[str]:
        """Every experiment's id, deleted ones too (a deleted run's job still ends)."""
        ids: list[str] = []
        token = ""
        for _ in range(MAX_PAGES):
            body: dict[str, Any] = {"max_results": PAGE, "view_type": "ALL"}
            if token:
                body["page_token"] = token
            answer = await self.call("experiments/search", body)
            ids.extend(str(e.get("experiment_id", "")) for e in answer.get("experiments", [])
                       if isinstance(e, dict))
            token = str(answer.get("next_page_token") or "")
            if not token:
                break
        return [i for i in ids if i]

    async def search_runs(self, experiment_ids: list[str], filter_: str
                          ) -> list[dict[str, Any]]:
        """The active runs of ``experiment_ids`` that ``filter_`` selects, every page (a
        deleted run cannot be written: MLflow takes writes into active runs only)."""
        runs: list[dict[str, Any]] = []
        for start in range(0, len(experiment_ids), 100):
            token = ""
            for _ in range(MAX_PAGES):
                body: dict[str, Any] = {"experiment_ids": experiment_ids[start:start + 100],
                                        "filter": filter_, "max_results": PAGE,
                                        "run_view_type": "ACTIVE_ONLY"}
                if token:
                    body["page_token"] = token
                answer = await self.call("runs/search", body)
                runs.extend(r for r in answer.get("runs", []) if isinstance(r, dict))
                token = str(answer.get("next_page_token") or "")
                if not token:
                    break
        return runs

    async def log_batch(self, run_id: str, metrics: Mapping[str, float],
                        tags: Mapping[str, str], timestamp_ms: int) -> None:
        """Metrics (step 0, at ``timestamp_ms``) and tags into one run, in one request;
        RunNotWritable where MLflow says that run cannot be written."""
        await self.call("runs/log-batch", run_id=run_id, body={
            "run_id": run_id,
            "metrics": [{"key": k, "value": v, "timestamp": timestamp_ms, "step": 0}
                        for k, v in metrics.items()],
            "tags": [{"key": k, "value": v[:MAX_TAG_VALUE]} for k, v in tags.items()]})

    async def set_tag(self, run_id: str, key: str, value: str) -> None:
        await self.call("runs/set-tag", {"run_id": run_id, "key": key, "value": value},
                        run_id=run_id)


def _credentials(environ: Mapping[str, str], in_url: tuple[str, str] | None
                 ) -> dict[str, str]:
    """The Authorization header of MLflow's variables, else of the URI's user:password
    (aiohttp drops it on a redirect to another origin)."""
    token = environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user = environ.get("MLFLOW_TRACKING_USERNAME")
    if user:
        return _basic(user, environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    if in_url is not None:
        return _basic(*in_url)
    return {}


def _basic(user: str, password: str) -> dict[str, str]:
    """HTTP Basic credentials; a user name with ':' cannot be sent."""
    if ":" in user:
        raise ReportError("the MLflow user name must not hold ':' (HTTP Basic "
                          "authentication splits user and password there)")
    return {"Authorization": basic_authorization(user, password)}


def _ssl(environ: Mapping[str, str]) -> ssl.SSLContext | bool:
    if environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return False
    ca = environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH")
    if not ca:
        return True
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ReportError(f"cannot read MLFLOW_TRACKING_SERVER_CERT_PATH {ca}: {exc}") from None


def _error_of(text: str) -> tuple[str, str]:
    """MLflow's own error code and message from an error answer, made short and plain."""
    try:
        answer = json.loads(text)
        code, message = str(answer.get("error_code", "")), str(answer.get("message", ""))
    except (ValueError, AttributeError):
        code, message = "", ""
    return plain(code, 60), plain(message or text, 200) or "no message"
