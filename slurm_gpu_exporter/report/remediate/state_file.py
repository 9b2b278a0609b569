"""The JSON files remediate keeps what it did in (the firings acted on, the jobs
signalled and their due requeues): read whole at start, written whole after each
change, owner-only."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.inert_text import plain
from slurm_gpu_exporter.report.private_file import write_private

log = logging.getLogger(__name__)

EXIT_STATE = 2


def load_state(path: Path, what: str, unread: str, parse: Callable[[Any], None]) -> None:
    """Hand the file's JSON to ``parse``; nothing where there is no file yet. A file that
    cannot be read or parsed stops the start (exit 2): ``unread`` says what would
    happen without it."""
    try:
        parse(json.loads(path.read_text()))
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"cannot read {what} {path}: {plain(exc)}; fix it or move it "
                          f"away ({unread})", EXIT_STATE) from None


def save_state(path: Path | None, data: dict[str, Any], what: str, unsaved: str) -> None:
    """Write ``data`` to the file; a failure is logged with ``unsaved`` (what a restart
    would then lose), and what is in memory holds until then."""
    if path is None:
        return
    body = json.dumps(data, indent=1, sort_keys=True) + "\n"
    try:
        write_private(path, body.encode(), what, EXIT_STATE)
    except ReportError as exc:
        log.error("%s: %s", plain(exc), unsaved)
