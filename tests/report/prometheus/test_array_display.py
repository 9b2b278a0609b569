"""Reports show an array task as users know it (``1234_5``, sacct's JobID), from the
agent's ``slurm_job_info`` array labels; a plain job, or labels that are not Slurm's
ids, show the bare job id."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest

from slurm_gpu_exporter.report.figures.detail_data import detail_from_data, detail_to_data
from slurm_gpu_exporter.report.figures.shapes import JobUsage
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.array_tasks import (
    array_task_query,
    array_tasks_from_answer,
)
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import (
    Filters,
    _by_job,
    low_util_queries,
)
from slurm_gpu_exporter.report.render.html import job_html, low_util_html
from slurm_gpu_exporter.report.render.text import (
    job_json,
    job_markdown,
    job_table,
    low_util_csv,
    low_util_json,
    low_util_table,
)
from tests.report.sample_data import job_details, low_util_report

# Task 0 of array 81230, with its own job id 81234 (the first row of the sample report).
TASK = {"array_job_id": "81230", "array_task_id": "0"}


@pytest.mark.parametrize(("labels", "shown"), [
    (TASK, "81230_0"),
    ({"array_job_id": "81234", "array_task_id": "7"}, "81234_7"),  # holds the array's id
    ({}, "81234"),
    ({"array_job_id": "", "array_task_id": ""}, "81234"),
    ({"array_job_id": "81230; rm -rf /", "array_task_id": "0"}, "81234"),
    ({"array_job_id": "81230", "array_task_id": "0-3"}, "81234"),
    ({"array_job_id": "81230", "array_task_id": "\x1b[2J"}, "81234"),
])
def test_a_job_is_shown_by_its_array_task_where_the_labels_say_one(
        labels: dict[str, str], shown: str) -> None:
    assert JobUsage("81234", **labels).shown == shown


def test_low_util_asks_for_the_array_labels() -> None:
    info = low_util_queries(Window(0.0, 3600.0), Filters())["info"]
    assert "array_job_id" in info and "array_task_id" in info


def test_the_info_series_that_names_the_array_task_wins() -> None:
    """The prolog's record on Slurm 22.05 has no array fields; the agent learns them from
    Slurm later, so one job can have an info series without them and one with them."""
    bare = Sample({"jobid": "81234", "array_job_id": "", "array_task_id": ""}, 1)
    named = Sample({"jobid": "81234", **TASK}, 1)
    for samples in ([bare, named], [named, bare]):
        assert _by_job(samples, "cluster")["", "81234"] is named


def test_low_util_outputs_show_the_array_task() -> None:
    report = low_util_report()
    report.flagged = [replace(j, **TASK) if j.jobid == "81234" else j for j in report.flagged]
    table = low_util_table(report)
    assert "81230_0" in table and "81234" not in table
    rows = list(csv.DictReader(io.StringIO(low_util_csv(report))))
    assert "81230_0" in [r["job"] for r in rows] and "81234" not in [r["job"] for r in rows]
    data = json.loads(low_util_json(report))
    assert "81230_0" in json.dumps(data) and "81234" not in json.dumps(data)
    html = low_util_html(report)
    assert "Job 81230_0" in html


def test_job_outputs_show_the_array_task() -> None:
    details = job_details()
    details[0].usage = replace(details[0].usage, array_job_id="80970", array_task_id="3")
    for text in (job_table(details), job_markdown(details).replace("\\_", "_"),
                 job_html(details)):
        assert "80970_3" in text and "80977" not in text
    assert json.loads(job_json(details, 5))["jobs"][0]["job"] == "80970_3"


def test_detail_data_carries_the_array_and_leaves_it_out_for_a_plain_job() -> None:
    """An archive answer about a plain job reads as before in an older client."""
    plain, array = job_details()[0], job_details()[0]
    array.usage = replace(array.usage, array_job_id="80970", array_task_id="3")
    assert "array_job_id" not in detail_to_data(plain)["usage"]
    back = detail_from_data(json.loads(json.dumps(detail_to_data(array))))
    assert back == array and back.usage.shown == "80970_3"


def test_an_array_task_asked_by_name_is_resolved_to_its_own_job_id() -> None:
    answer = [Sample({"jobid": "81234", **TASK}, 1),
              Sample({"jobid": "81231", "array_job_id": "81230", "array_task_id": "1"}, 1),
              Sample({"jobid": "81299", "array_job_id": "99", "array_task_id": "0"}, 1)]
    got = array_tasks_from_answer(["81230_0", "81230_1", "81230_2"], answer)
    assert got == {"81230_0": "81234", "81230_1": "81231"}  # task 2: no series, unresolved


def test_an_array_task_two_ids_answer_for_is_left_unresolved() -> None:
    # A requeued task keeps its id; two ids for one name is not Slurm's: refuse to guess.
    answer = [Sample({"jobid": "81234", **TASK}, 1), Sample({"jobid": "81235", **TASK}, 1)]
    assert array_tasks_from_answer(["81230_0"], answer) == {}


def test_the_array_task_query_asks_only_for_the_arrays_named() -> None:
    query = array_task_query(Window(0.0, 3600.0), ["81230_0", "81230_3", "77_1", "5"],
                             Filters(user="alice"))
    assert query == ('last_over_time(slurm_job_info{user="alice",array_job_id=~"77|81230"}'
                     '[3600s])')
