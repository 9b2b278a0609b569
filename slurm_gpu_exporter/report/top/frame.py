"""One frame of ``top``: the job now and over its life, per node and GPU, as text.

No I/O: the figures come in (``JobDetail`` from the ``job`` report's queries, ``JobNow``
from ``now``), text goes out. User text (job, user and node names, notes) is made
inert for the terminal (``render.inert.terminal``), as in every other output.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich import box
from rich.console import Console
from rich.table import Table

from slurm_gpu_exporter.report.figures.shapes import JobDetail
from slurm_gpu_exporter.report.prometheus.nodes import node_name
from slurm_gpu_exporter.report.render.inert import terminal
from slurm_gpu_exporter.report.render.values import duration
from slurm_gpu_exporter.report.top.now import GpuNow, JobNow, NodeNow

GIB = 1024**3
COLUMNS = ("Node", "GPU", "Busy now", "Busy job", "SM now", "SM job", "Mem now", "Mem peak",
           "Power now", "Temp")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f} GiB"


def _named(now: JobNow, detail: JobDetail) -> tuple[dict[tuple[str, str], GpuNow],
                                                    dict[str, NodeNow]]:
    """``now``'s figures keyed by the node names the job report gives its nodes' targets
    (the Slurm node, or the whole target where two targets give one node; the host for
    a detail that names no targets)."""
    targets = {n.target: n.node for n in detail.nodes if n.target}
    names = {n.node for n in detail.nodes}

    def name(instance: str) -> str:
        return targets.get(instance) or (instance if instance in names
                                         else node_name(instance))

    return ({(name(i), g): v for (i, g), v in now.gpus.items()},
            {name(i): v for i, v in now.nodes.items()})


def frame(detail: JobDetail, now: JobNow, at: float, interval_s: float | None,
          width: int = 110, color: bool = False) -> str:
    """The job's frame at ``at``; ``interval_s`` None: a single frame (``--once``)."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system="standard" if color else None,
                      force_terminal=color, highlight=False, emoji=False)
    usage = detail.usage
    gpus_now, nodes_now = _named(now, detail)
    every = f", every {interval_s:g} s" if interval_s else ""
    console.print(f"Job {terminal(usage.jobid)}"
                  + (f" ({terminal(usage.name)})" if usage.name else "")
                  + f"  user {terminal(usage.user)}  run time {duration(detail.elapsed_s)}",
                  style="bold")
    # to the second: a frame whose figures all held still still shows it is live
    clock = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    console.print(f"at {clock}{every}; last sample "
                  + (f"{max(0.0, at - now.last_sample):.0f} s ago" if now.last_sample
                     else "none"), style="dim" if color else None)
    table = Table(box=box.SIMPLE_HEAD)
    for i, heading in enumerate(COLUMNS):
        table.add_column(heading, justify="left" if i < 2 else "right")
    for node in detail.nodes:
        for gpu in node.gpus:
            live = gpus_now.get((node.node, gpu.gpu), GpuNow())
            table.add_row(terminal(node.node), terminal(gpu.gpu), _pct(live.busy),
                          _pct(gpu.busy_ratio), _pct(live.sm_active), _pct(gpu.sm_active_ratio),
                          _gib(live.memory_used), _gib(gpu.memory_peak),
                          "-" if live.power_w is None else f"{live.power_w:.0f} W",
                          "-" if live.temperature_c is None else f"{live.temperature_c:.0f} C")
    console.print(table)
    for label, value in _job_lines(detail, nodes_now):
        console.print(f"{label:<8}{value}")
    if detail.notes:
        console.print("Notes", style="bold")
        for note in detail.notes:
            console.print(f"  * {terminal(note)}")
    return out.getvalue()


def _job_lines(detail: JobDetail, nodes_now: dict[str, NodeNow]) -> list[tuple[str, str]]:
    """CPU and memory, now and over the job, against what the job holds."""
    cores = [nodes_now[n.node].cpu_cores for n in detail.nodes
             if n.node in nodes_now and nodes_now[n.node].cpu_cores is not None]
    used = [nodes_now[n.node].memory_used for n in detail.nodes
            if n.node in nodes_now and nodes_now[n.node].memory_used is not None]
    cpus = detail.cpus
    cpu = (f"{sum(c for c in cores if c is not None):.1f} cores busy now" if cores
           else "- now")
    cpu += f" of {cpus} CPUs" if cpus else ""
    cpu += f"; {_pct(detail.cpu_efficiency)} over the job"
    request = detail.memory_request
    mem = (_gib(sum(u for u in used if u is not None)) if used else "-") + " now"
    mem += f" of {_gib(request)}" if request else ""
    mem += f"; peak {_gib(detail.memory_peak)}"
    return [("CPU", cpu), ("Memory", mem)]
