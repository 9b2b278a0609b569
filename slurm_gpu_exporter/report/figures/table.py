"""Every job figure the reports know, one row each (sacct's ``fields[]`` habit).

A row says where a figure comes from (the agent's series and the PromQL shape over
the window), where it lands (the detail of a node or a GPU, and how a job sums it),
whether the archive keeps it (its columns, from which schema version), and how the
outputs name it (the ``job`` summary, ``usage``, MLflow, the mail). The queries, the
answers' reading, the archive's schema, rows and upserts, the renderers and the MLflow
writer read these rows; a figure no row names cannot be asked for (``figure()``).

Shapes (the PromQL of each is in ``report/prometheus/job_figures.py``):
- ``counter``: a per-job counter that starts at 0 with the job; its largest value in
  the window, less its value at the window's start (``job``; ``archive`` needs none);
- ``peak``/``first``: a gauge's largest/smallest value in the window;
- ``device``: a device's gauge (``slurm_gpu_…``) on the GPUs the jobs held.

How a job sums its GPUs' (or nodes') values (``job``): ``sum`` of the known ones,
``gpm`` the sum over the GPUs that measure SM activity (NVML GPM, the ratios'
denominator), ``max``, ``min``; ``""`` leaves it on the node or GPU alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from operator import attrgetter
from typing import Any

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobUsage, NodeDetail

SHAPES = ("counter", "peak", "first", "device")
GIB = 2**30  # bytes
KWH = 3.6e6  # joules
SCOPES = ("node", "gpu")
COMBINE = ("", "sum", "gpm", "max", "min")


@dataclass(frozen=True)
class Figure:
    """One job figure: its source, its place in the report model, archive and outputs."""

    name: str  # the query's name and the figure's name everywhere else
    metric: str  # the agent's series
    unit: str  # of the values stored: seconds, bytes, joules, cpus, unix seconds
    shape: str  # SHAPES
    scope: str  # SCOPES: one value per (job, node) or per (job, node, GPU)
    attr: str = ""  # the NodeDetail/GpuDetail field it fills ("" for none)
    job_attr: str = ""  # the JobUsage field the job's value goes to ("" for none)
    combine: str = ""  # COMBINE: how the job's value is made of its nodes' or GPUs'
    job_sum: bool = False  # the job's value is its nodes' or GPUs' sum (no job_attr)
    whole: bool = False  # a count: int, not float
    split: str = ""  # a label that splits its series (their differences are summed)
    archived: bool = True  # the archive asks for it and keeps it
    job_column: str = ""  # its archive_jobs column, where it has one
    gpu_column: str = ""  # its archive_gpus column
    rollup: bool = False  # summed in archive_usage_monthly (and `usage`)
    since: int = 1  # the archive schema version its columns came with
    label: str = ""  # its line in the `job` summary, "" for none
    text: str = ""  # how that line shows its value (``{:.0f} °C``); a GPM ratio: a share
    json: str = ""  # its key in `job --format json` (the job's and each GPU's); a GPM
    # activity's is its ratio's
    json_per: float = 1.0  # that value is the stored one over this (GiB, kWh)
    usage_heading: str = ""  # its `usage` column heading (GPU-hours), "" for none
    mlflow: str = ""  # its MLflow metric (under ``slurm.``; the stored value), "" for none
    mail: str = ""  # its line in the job-end mail, "" for none

    @property
    def ratio(self) -> str:
        """The name of its ratio to the time held (``tensor_active_ratio``)."""
        return self.name + "_ratio"


def _gpm(name: str, metric: str, since: int, label: str, heading: str, mail: str) -> Figure:
    """An NVML GPM activity: integrated seconds per GPU, shown as a share of the time
    held on the GPUs that measure it."""
    return Figure(name, metric, "seconds", "counter", "gpu", attr=f"{name}_s",
                  job_attr=f"{name}_s", combine="gpm", job_column=f"{name}_s",
                  gpu_column=f"{name}_s", rollup=True, since=since, label=label,
                  usage_heading=heading, mlflow=f"{name}_ratio", mail=mail)


# In the order the queries are sent (the archive leaves out what it does not keep).
FIGURES: tuple[Figure, ...] = (
    Figure("start", "slurm_job_start_time_seconds", "unix seconds", "first", "node",
           job_attr="start", combine="min", job_column="start_time"),
    Figure("end", "slurm_job_end_time_seconds", "unix seconds", "peak", "node",
           job_attr="end", combine="max", job_column="end_time"),
    Figure("cpus", "slurm_job_cpus", "cpus", "peak", "node", attr="cpus", whole=True),
    Figure("cpu", "slurm_job_cpu_seconds_total", "seconds", "counter", "node", attr="cpu_s",
           job_sum=True, job_column="cpu_s", rollup=True),
    Figure("memory_peak", "slurm_job_memory_peak_bytes", "bytes", "peak", "node",
           attr="memory_peak", job_sum=True, job_column="memory_peak",
           json="memory_peak_gib", json_per=GIB, mlflow="memory_peak_bytes"),
    Figure("memory_limit", "slurm_job_memory_limit_bytes", "bytes", "peak", "node",
           attr="memory_limit"),
    Figure("allocated", "slurm_job_gpu_allocated_seconds_total", "seconds", "counter", "gpu",
           attr="allocated_s", job_attr="allocated_s", combine="sum",
           job_column="allocated_s", gpu_column="allocated_s", rollup=True),
    # held, not measured (the driver's samples may be lost): not in "allocated"
    Figure("unknown", "slurm_job_gpu_unknown_seconds_total", "seconds", "counter", "gpu",
           attr="unknown_s", job_attr="unknown_s", combine="sum", archived=False),
    Figure("busy", "slurm_job_gpu_busy_seconds_total", "seconds", "counter", "gpu",
           attr="busy_s", job_attr="busy_s", combine="sum", job_column="busy_s",
           gpu_column="busy_s", rollup=True),
    Figure("energy", "slurm_job_gpu_energy_joules_total", "joules", "counter", "gpu",
           attr="energy_j", job_sum=True, job_column="energy_j", gpu_column="energy_j",
           rollup=True, json="energy_kwh", json_per=KWH, mlflow="gpu_energy_joules"),
    # by RAPL domain (package, dram): the domains' differences summed per node
    Figure("cpu_energy", "slurm_job_cpu_energy_joules_total", "joules", "counter", "node",
           attr="cpu_energy_j", split="domain", job_sum=True, job_column="cpu_energy_j",
           rollup=True, since=3, json="cpu_energy_kwh", json_per=KWH,
           mlflow="cpu_energy_joules"),
    Figure("sm_active", "slurm_job_gpu_sm_active_seconds_total", "seconds", "counter", "gpu",
           attr="sm_active_s", job_attr="sm_active_s", combine="gpm",
           job_column="sm_active_s", gpu_column="sm_active_s", rollup=True,
           usage_heading="SM-active GPU-h", mlflow="sm_active_ratio", mail="SM active"),
    _gpm("tensor_active", "slurm_job_gpu_tensor_active_seconds_total", 2,
         "GPU tensor active", "Tensor GPU-h", "Tensor active"),
    _gpm("dram_active", "slurm_job_gpu_dram_active_seconds_total", 2,
         "GPU DRAM active", "DRAM-active GPU-h", "DRAM active"),
    Figure("gpu_memory_peak", "slurm_job_gpu_memory_peak_bytes", "bytes", "peak", "gpu",
           attr="memory_peak", job_attr="gpu_memory_peak", combine="max",
           job_column="gpu_memory_peak", gpu_column="memory_peak", json="gpu_memory_peak_gib",
           json_per=GIB, mlflow="gpu_memory_peak_bytes"),
    Figure("gpu_memory_total", "slurm_gpu_memory_total_bytes", "bytes", "device", "gpu",
           attr="memory_total", gpu_column="memory_total"),
)
BY_NAME = {f.name: f for f in FIGURES}


def figure(name: str) -> Figure:
    """The row of the figure ``name``; ReportError for a figure no row declares."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ReportError(f"no job figure {name!r}: declare it in report/figures/table.py "
                          f"(known: {', '.join(BY_NAME)})") from None


def value_of(holder: Any, attr: str) -> Any:
    """A figure's value on a JobUsage, NodeDetail or GpuDetail: its field, or its entry
    in ``more`` where the figure has no field of its own."""
    if hasattr(holder, attr):
        return getattr(holder, attr)
    return holder.more.get(attr) if holder.more else None


def reader(kind: type, attr: str) -> Callable[[Any], Any]:
    """``value_of`` for one figure of one dataclass, picked once (the reports read
    figures per GPU of thousands of jobs)."""
    if attr in {f.name for f in fields(kind)}:
        return attrgetter(attr)
    return lambda holder: holder.more.get(attr) if holder.more else None


def dict_reader(kind: type, pairs: tuple[tuple[str, str], ...]
                ) -> Callable[[Any], dict[str, Any]]:
    """A function making ``{key: value of attr}`` of one dataclass for (key, attr) pairs:
    an archive row's figures, for each of thousands of jobs, nodes and GPUs. It is
    compiled once from the rows (as ``dataclasses`` makes ``__init__``), so it costs what
    a dict written out by hand does (a comprehension over the pairs took twice as long:
    the GPU rows of 2,000 jobs, 4 ms by hand, took 8.7)."""
    own = {f.name for f in fields(kind)}
    items = []
    for key, attr in pairs:
        if not (attr.isidentifier() and key.isidentifier()):
            raise ReportError(f"figure field {attr!r} or key {key!r} is not a name")
        items.append(f"{key!r}: h.{attr}" if attr in own
                     else f"{key!r}: h.more.get({attr!r}) if h.more else None")
    namespace: dict[str, Any] = {}
    exec(f"def read(h):\n    return {{{', '.join(items)}}}\n", namespace)
    return namespace["read"]  # type: ignore[no-any-return]


def set_value(holder: Any, attr: str, value: Any) -> None:
    """Set a figure's value (see ``value_of``)."""
    if hasattr(holder, attr):
        setattr(holder, attr, value)
    elif value is None:  # not measured: absent, as in a detail that never had it
        if holder.more:
            holder.more.pop(attr, None)
            holder.more = holder.more or None
    elif holder.more is None:
        holder.more = {attr: value}
    else:
        holder.more[attr] = value


@cache
def job_reader(fig: Figure) -> Callable[[Any], float | None]:
    """How the whole job's value of a figure is read from its JobDetail: its own
    (``job_attr``), the sum of its nodes' or GPUs' known values (``job_sum``; None where
    none is known), else None. Made once per figure (the archive reads thousands)."""
    if fig.job_attr:
        read_usage = reader(JobUsage, fig.job_attr)
        return lambda detail: read_usage(detail.usage)  # type: ignore[no-any-return]
    if not fig.job_sum:
        return lambda detail: None
    read = reader(NodeDetail if fig.scope == "node" else GpuDetail, fig.attr)
    if fig.scope == "node":
        return lambda detail: _known_sum([read(n) for n in detail.nodes])
    return lambda detail: _known_sum([read(g) for n in detail.nodes for g in n.gpus])


def _known_sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def job_value(detail: Any, fig: Figure) -> float | None:
    """The whole job's value of a figure (see ``job_reader``)."""
    return job_reader(fig)(detail)


def json_value(value: float | None, fig: Figure) -> float | None:
    """A stored value as ``job --format json`` shows it (GiB, kWh)."""
    return value / fig.json_per if value is not None and fig.json_per != 1.0 else value


# job_shown's figures with their readers, made once: the archive's notes read them for
# each of thousands of jobs (hashing a Figure for each call doubled their cost)
_JOB_SHOWN = tuple((f, job_reader(f)) for f in FIGURES
                   if f.json and f.combine != "gpm" and (f.job_attr or f.job_sum))


def job_shown(detail: Any) -> dict[str, float | None]:
    """The job's figures as ``job --format json`` shows them, by their JSON keys (GiB,
    kWh), in the table's order: those the job has a value of (``JobDetail``)."""
    return {f.json: json_value(read(detail), f) for f, read in _JOB_SHOWN}


def shown() -> tuple[Figure, ...]:
    """The figures other than the GPM activities that `job` shows (``json``)."""
    return tuple(f for f in FIGURES if f.json and f.combine != "gpm")


def archived() -> tuple[Figure, ...]:
    """The figures the archive asks for and keeps, in query order."""
    return tuple(f for f in FIGURES if f.archived)


def gpm_activities() -> tuple[Figure, ...]:
    """The GPM activities shown as ratios beside SM activity (tensor, DRAM)."""
    return tuple(f for f in FIGURES if f.combine == "gpm" and f.label)
