"""Array tasks asked for as users know them (``1234_5``): the job id Slurm gave each task,
from the agents' ``slurm_job_info`` array labels, in one query for all of them."""

from __future__ import annotations

import re
from collections.abc import Iterable

from slurm_gpu_exporter.model.ids import ARRAY_TASK
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.client import PrometheusClient, Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters, selector

ARRAY_TASK_RE = re.compile(ARRAY_TASK)


def array_task_query(window: Window, names: Iterable[str], filters: Filters) -> str:
    """The info series of the arrays that ``A_T`` names belong to, over the window."""
    arrays = sorted({m.group(1) for n in names if (m := ARRAY_TASK_RE.fullmatch(n))})
    sel = selector("slurm_job_info", filters.matchers(), {"array_job_id": "|".join(arrays)})
    return f"last_over_time({sel}[{window.range}])"


def array_tasks_from_answer(names: Iterable[str], samples: list[Sample]) -> dict[str, str]:
    """``A_T`` -> the task's own job id, as the agents' info series say; a name no series
    (or more than one id) answers is left out."""
    ids: dict[str, set[str]] = {}
    for sample in samples:
        name = f"{sample.labels.get('array_job_id', '')}_{sample.labels.get('array_task_id', '')}"
        if sample.labels.get("jobid"):
            ids.setdefault(name, set()).add(sample.labels["jobid"])
    return {n: next(iter(ids[n])) for n in names if len(ids.get(n, ())) == 1}


async def resolve_array_tasks(prom: PrometheusClient, window: Window, names: list[str],
                              filters: Filters) -> list[str]:
    """``names`` with each array task named as users know it (``A_T``) replaced by the
    job id Slurm gave that task (the agents' ``jobid``), one query for all of them; a
    name Prometheus cannot resolve is kept as it was (and then reported unknown)."""
    tasks = [n for n in names if ARRAY_TASK_RE.fullmatch(n)]
    if not tasks:
        return names
    answer = await prom.instant(array_task_query(window, tasks, filters), window.end)
    resolved = array_tasks_from_answer(tasks, answer)
    return [resolved.get(n, n) for n in names]
