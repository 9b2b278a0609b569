"""The PromQL shape of each job figure (``figures/table.py``), for every report.

``job`` and ``archive`` ask a figure per node or GPU (``figure_queries``); ``low-util``
asks it summed by job server-side (``per_job_queries``), the way the figure's row says
a job combines it. A figure's shape is written here once:

- ``counter``: its largest value in the window (``max_over_time``); where the job may
  have started before the window, ``<name>_base`` is its value at the window's start
  (``last_over_time(... offset)``), subtracted from it;
- ``peak``/``first``: a gauge's largest/smallest value in the window;
- ``device``: a device's gauge, kept (in ``job``) to the GPUs the jobs held.
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.table import Figure, figure

# How far before the window's start a counter's value still counts as its value there.
BASELINE_LOOKBACK = "5m"
DEVICE_KEYS = ("instance", "uuid")
HELD = "allocated"  # the figure whose series are the GPUs a job held
# How a job's value is made server-side, by the row's ``combine``.
_JOB_AGGREGATE = {"sum": "sum", "gpm": "sum", "max": "max", "min": "min"}

Select = Callable[[str], str]  # a metric name -> its selector


def figure_query(fig: Figure, s: Select, d: str, device: Select, held: bool) -> str:
    """The figure's value over the window ``d``: ``s`` selects the jobs' series,
    ``device`` a device's; ``held`` keeps a device's series to the GPUs the jobs held."""
    if fig.shape == "device":
        query = (f"max by ({', '.join(DEVICE_KEYS)}) "
                 f"(last_over_time({device(fig.metric)}[{d}]))")
        if held:
            query += (f" and on ({', '.join(DEVICE_KEYS)}) "
                      f"last_over_time({s(figure(HELD).metric)}[{d}])")
        return query
    over = "min_over_time" if fig.shape == "first" else "max_over_time"
    return f"{over}({s(fig.metric)}[{d}])"


def baseline_query(fig: Figure, s: Select, d: str) -> str:
    """A counter's value at the window's start."""
    return f"last_over_time({s(fig.metric)}[{BASELINE_LOOKBACK}] offset {d})"


def figure_queries(figures: tuple[Figure, ...], s: Select, d: str, device: Select,
                   held: bool, baselines: bool) -> dict[str, str]:
    """One query per figure by its name, and ``<name>_base`` after each counter's."""
    queries = {}
    for fig in figures:
        queries[fig.name] = figure_query(fig, s, d, device, held)
        if baselines and fig.shape == "counter":
            queries[f"{fig.name}_base"] = baseline_query(fig, s, d)
    return queries


def per_job_queries(names: tuple[str, ...], s: Select, d: str, by: str) -> dict[str, str]:
    """``figure_queries`` of the named figures (with baselines), each combined ``by``
    job server-side as its row combines it: one answer per job, whatever its GPUs."""
    queries = {}
    for name in names:
        fig = figure(name)
        if fig.shape == "device" or fig.combine not in _JOB_AGGREGATE:
            raise ReportError(f"figure {name!r} has no per-job value to ask for")
        query = figure_query(fig, s, d, s, held=False)
        queries[name] = f"{_JOB_AGGREGATE[fig.combine]} by ({by}) ({query})"
        if fig.shape == "counter":
            queries[f"{name}_base"] = f"sum by ({by}) ({baseline_query(fig, s, d)})"
    return queries
