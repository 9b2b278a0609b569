"""The agent's flags (``build_parser``): the agent and ``slurm-gpu-exporter check`` parse
the same ones, so ``check`` looks where the agent would."""

from __future__ import annotations

import argparse
import math
import os
import shlex
from collections.abc import Callable
from pathlib import Path

from slurm_gpu_exporter import __version__
from slurm_gpu_exporter.hooks.spool import DEFAULT_SPOOL_DIR
from slurm_gpu_exporter.web.reload import DEFAULT_RELOAD_INTERVAL

DEFAULT_LISTEN = ":9817"
DEFAULT_HWMON_ROOT = "/sys/class/hwmon"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default once, and none for flags without a value of their own."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def _seconds(*, positive: bool) -> Callable[[str], float]:
    """An argparse type for a duration in seconds: finite, and > 0 or >= 0."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "greater than 0" if positive else "0 or more"
            raise argparse.ArgumentTypeError(f"{text!r}: seconds must be {bound}")
        return value

    return parse


def _command_line(text: str) -> list[str]:
    """An argparse type for a command line, split like a shell's (no shell runs it)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    if not argv:
        raise argparse.ArgumentTypeError("the command is empty")
    return argv


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slurm-gpu-exporter",
        description="Per-job GPU, CPU and memory metrics of a Slurm node, for Prometheus. "
                    "'slurm-gpu-exporter check --help': what the node shows the agent.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--web.listen-address", dest="listen", action="append", metavar="ADDRESS",
                   help=f"address to serve on, [host]:port; repeat for several "
                        f"(default: {DEFAULT_LISTEN}, all addresses)")
    p.add_argument("--web.config.file", dest="web_config", type=Path, metavar="FILE",
                   help="exporter-toolkit web config (TLS, client certificates, basic auth); "
                        "re-read when it changes and on SIGHUP")
    p.add_argument("--web.config.reload-interval", dest="web_config_reload",
                   type=_seconds(positive=True), default=DEFAULT_RELOAD_INTERVAL, metavar="SECONDS",
                   help="seconds between checks of the web config file for changes")
    p.add_argument("--web.max-connections", dest="max_connections", type=int, default=256,
                   metavar="N",
                   help="most HTTP connections open at once (fewer where the file limit "
                        "leaves no room); over it, the connection idle longest is closed")
    p.add_argument("--web.header-timeout", dest="header_timeout",
                   type=_seconds(positive=True), default=10.0,
                   metavar="SECONDS",
                   help="seconds a connection may take to send a request, and may then idle "
                        "(kept alive) between requests")
    p.add_argument("--spool-dir", default=DEFAULT_SPOOL_DIR, metavar="DIR",
                   help="where the prolog/epilog write job records")
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   default=Path("/var/lib/slurm-gpu-exporter"),
                   help="where counters are kept across restarts")
    p.add_argument("--cgroup-root", type=Path, metavar="DIR", default=Path("/sys/fs/cgroup"),
                   help="cgroup filesystem root")
    p.add_argument("--proc-root", type=Path, metavar="DIR", default=Path("/proc"),
                   help="procfs root")
    p.add_argument("--powercap-root", metavar="DIR", default="/sys/class/powercap",
                   help="powercap root, where the CPU package and DRAM energy (RAPL) is read; "
                        "'' switches CPU energy off")
    p.add_argument("--hwmon-root", metavar="DIR", default=DEFAULT_HWMON_ROOT,
                   help="hwmon root, where the node's power meter is read (the devices "
                        "--node-power.hwmon-name names); '' switches it off")
    p.add_argument("--node-power.hwmon-name", dest="node_power_hwmon_names", action="append",
                   metavar="NAME",
                   help="a hwmon device name whose power*_input (or power*_average) is the "
                        "node's power; repeat for several, summed (default: power_meter, "
                        "the ACPI power meter)")
    p.add_argument("--node-power.command", dest="node_power_command", metavar="COMMAND",
                   type=_command_line,
                   help="a command that prints the node's power (ipmitool dcmi power "
                        "reading, or one number of watts); split like a shell line, run "
                        "without a shell; replaces the hwmon meter; off unless given")
    p.add_argument("--node-power.command-interval", dest="node_power_interval",
                   type=_seconds(positive=True), default=30.0, metavar="SECONDS",
                   help="seconds between runs of --node-power.command (at most one run at "
                        "a time)")
    p.add_argument("--node-power.command-timeout", dest="node_power_timeout",
                   type=_seconds(positive=True), default=10.0, metavar="SECONDS",
                   help="seconds a run of --node-power.command may take before it is killed "
                        "and the meter counts as down")
    p.add_argument("--sample-interval", type=_seconds(positive=True), metavar="SECONDS",
                   default=5.0,
                   help="seconds between samples")
    p.add_argument("--job-linger", type=_seconds(positive=False), metavar="SECONDS", default=120.0,
                   help="seconds an ended job's series stay (longer than the scrape interval)")
    p.add_argument("--cgroup-grace", type=_seconds(positive=False), metavar="SECONDS", default=30.0,
                   help="seconds a job's cgroup may be gone, with no epilog, before the job "
                        "counts as ended")
    p.add_argument("--slurm-lookup", choices=("auto", "cli", "off"), default="auto",
                   help="how to fill job metadata the prolog lacked: pyslurm where it matches "
                        "the local Slurm, else the Slurm CLI (auto); the CLI only; or never")
    p.add_argument("--node-name", metavar="NAME", default=os.uname().nodename.split(".")[0],
                   help="this node's Slurm NodeName (for GPU indices of discovered jobs)")
    p.add_argument("--training.relay", dest="training_relay", default=True,
                   action=argparse.BooleanOptionalAction,
                   help="serve training.sock in the spool dir, where training scripts in jobs "
                        "publish their progress (docs/training.md); on unless "
                        "--no-training.relay")
    p.add_argument("--simulate", action="store_true",
                   help="run over a synthetic node (no GPU or Slurm needed)")
    p.add_argument("--log.level", dest="log_level", default="info", metavar="LEVEL",
                   choices=("debug", "info", "warn", "error"),
                   help="least severe messages to log to stderr: debug, info, warn or error")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p
