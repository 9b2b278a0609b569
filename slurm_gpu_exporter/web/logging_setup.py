"""The one logging set-up of the servers: the level their ``--log.level`` names and
their line format, to stderr (journald takes it from there)."""

from __future__ import annotations

import logging
import sys

from slurm_gpu_exporter.web.logthrottle import throttle_client_driven_logs

PACKAGE_LOGGER = "slurm_gpu_exporter"
# The agent's lines, logfmt-like as other exporters log; the proxy's, shorter.
AGENT_FORMAT = "%(asctime)s level=%(levelname)s source=%(name)s msg=%(message)s"
PROXY_FORMAT = "%(levelname)s %(name)s: %(message)s"


def level_number(level: str) -> int:
    """``debug``, ``info``, ``warn`` (or ``warning``), ``error`` as logging's number."""
    return {"warn": logging.WARNING}.get(level, getattr(logging, level.upper()))


def setup_logging(level: str, line_format: str | None = None, *,
                  throttle_clients: bool = False) -> None:
    """Log from ``level`` up to stderr in ``line_format``. Without a format the handlers
    the command set up stay (``slurm-gpu-report``'s), and only the package's own loggers
    log from ``level`` up. ``throttle_clients``: lines a remote client can cause at will
    come at most once a minute each (logthrottle.py)."""
    if line_format is None:
        logging.getLogger(PACKAGE_LOGGER).setLevel(level_number(level))
    else:
        logging.basicConfig(level=level_number(level), format=line_format, stream=sys.stderr)
    if throttle_clients:
        throttle_client_driven_logs()
