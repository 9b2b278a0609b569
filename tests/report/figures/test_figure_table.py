"""The job figure table (``report/figures/table.py``): every row is whole, the places
that read it agree with it, and a figure without a row cannot be asked for."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_gpu_exporter.mail.summary import summary_text
from slurm_gpu_exporter.report.archive.rollup import SUMS
from slurm_gpu_exporter.report.archive.schema import gpus, jobs, usage_monthly
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.figures.table import COMBINE, FIGURES, SCOPES, SHAPES, figure
from slurm_gpu_exporter.report.figures.window import Window
from slurm_gpu_exporter.report.prometheus.job_figures import job_queries
from slurm_gpu_exporter.report.prometheus.queries import Filters

WINDOW = Window(1_796_000_000.0, 1_796_086_400.0)


def test_a_figure_without_a_row_is_a_clear_error_not_none() -> None:
    with pytest.raises(ReportError, match=r"no job figure 'gpu_fan_speed'.*table\.py"):
        figure("gpu_fan_speed")


@pytest.mark.parametrize("fig", FIGURES, ids=lambda f: f.name)
def test_each_row_names_real_shapes_and_fields(fig) -> None:  # type: ignore[no-untyped-def]
    assert fig.shape in SHAPES and fig.scope in SCOPES and fig.combine in COMBINE
    assert fig.metric.startswith(("slurm_job_", "slurm_gpu_"))
    # A figure without a field of its own lives in the holder's ``more``.
    detail = GpuDetail if fig.scope == "gpu" else NodeDetail
    assert "more" in {f.name for f in dataclasses.fields(detail)}
    assert "more" in {f.name for f in dataclasses.fields(JobUsage)}
    # ... and never under the name of a property or method (value_of would read that)
    for holder, attr in ((detail, fig.attr), (JobUsage, fig.job_attr)):
        assert not attr or attr in {f.name for f in dataclasses.fields(holder)} \
            or not hasattr(holder, attr)
    assert bool(fig.combine) == bool(fig.job_attr)
    assert not (fig.job_sum and fig.job_attr)  # the job's own, or its parts' sum
    assert not fig.label or fig.combine == "gpm" or (fig.text and fig.json)
    # a job's MLflow metric and JSON key need a job value (the GPU rows' JSON the GPU's)
    assert not fig.mlflow or fig.job_attr or fig.job_sum
    assert not fig.json or fig.job_attr or fig.job_sum or fig.scope == "gpu"
    # the archive's job column holds the job's value
    assert not fig.job_column or fig.job_attr or fig.job_sum


@pytest.mark.parametrize("fig", [f for f in FIGURES if f.archived], ids=lambda f: f.name)
def test_each_archived_figure_has_its_columns(fig) -> None:  # type: ignore[no-untyped-def]
    if fig.job_column:
        assert fig.job_column in jobs.c
    if fig.gpu_column:
        assert fig.gpu_column in gpus.c and fig.scope == "gpu"
    if fig.rollup:
        assert fig.job_column in usage_monthly.c and fig.job_column in SUMS


def test_job_asks_each_figure_once_and_each_counter_s_baseline() -> None:
    queries = job_queries(WINDOW, ["7"], Filters())
    for fig in FIGURES:
        assert fig.metric in queries[fig.name]
        assert (f"{fig.name}_base" in queries) == (fig.shape == "counter")


@pytest.mark.parametrize("fig", [f for f in FIGURES if f.mail], ids=lambda f: f.name)
def test_the_mail_carries_the_figures_the_table_says(fig) -> None:  # type: ignore[no-untyped-def]
    # The mail wrapper reads the report's JSON (it imports no report code): its line
    # for the figure is there when the JSON has the figure's ratio.
    job = {"job": "7", "gpus": 1, "gpu_hours": 1.0, fig.ratio: 0.25}
    assert f"  {fig.mail}:" in summary_text(job)
    assert f"  {fig.mail}:" not in summary_text({**job, fig.ratio: None})


def test_a_figure_without_a_field_travels_in_more_through_the_detail_data() -> None:
    from slurm_gpu_exporter.report.figures.detail_data import detail_from_data, detail_to_data
    from slurm_gpu_exporter.report.figures.shapes import JobDetail

    gpu = GpuDetail(gpu="0", uuid="GPU-a", more={"temperature_peak": 83.0})
    detail = JobDetail(usage=JobUsage(jobid="7", more={"gpu_temperature_peak": 83.0}),
                       nodes=[NodeDetail(node="n1", gpus=[gpu])], accounting=None, now=0.0)
    assert detail_from_data(detail_to_data(detail)) == detail
    plain = JobDetail(usage=JobUsage(jobid="7"), nodes=[NodeDetail(node="n1")],
                      accounting=None, now=0.0)
    assert "more" not in detail_to_data(plain)["usage"]  # an older reader takes it whole


def test_more_is_made_by_the_first_figure_set_and_dropped_with_the_last() -> None:
    # ``more`` stays None on the thousands of parts that have no such figure (a dict
    # each costs the archive GC time); setting and clearing one leaves it as it was.
    from slurm_gpu_exporter.report.figures.detail_data import detail_from_data, detail_to_data
    from slurm_gpu_exporter.report.figures.shapes import JobDetail
    from slurm_gpu_exporter.report.figures.table import reader, set_value, value_of

    gpu = GpuDetail(gpu="0", uuid="GPU-a")
    assert gpu.more is None
    assert value_of(gpu, "temperature_peak") is None
    assert reader(GpuDetail, "temperature_peak")(gpu) is None
    set_value(gpu, "temperature_peak", None)  # not measured: nothing to make
    assert gpu.more is None
    set_value(gpu, "temperature_peak", 83.0)
    set_value(gpu, "clock_peak", 1410.0)
    assert gpu.more == {"temperature_peak": 83.0, "clock_peak": 1410.0}
    assert value_of(gpu, "temperature_peak") == reader(GpuDetail, "temperature_peak")(gpu) == 83.0
    set_value(gpu, "temperature_peak", None)
    assert gpu.more == {"clock_peak": 1410.0}
    set_value(gpu, "clock_peak", None)
    assert gpu.more is None
    detail = JobDetail(usage=JobUsage(jobid="7"), nodes=[NodeDetail(node="n1", gpus=[gpu])],
                       accounting=None, now=0.0)
    assert "more" not in detail_to_data(detail)["nodes"][0]["gpus"][0]
    assert detail_from_data(detail_to_data(detail)) == detail
    gpu.more = {}  # an empty one (an older writer's) reads as none
    assert "more" not in detail_to_data(detail)["nodes"][0]["gpus"][0]


def test_a_dict_reader_reads_fields_and_more_as_value_of_does() -> None:
    # The archive's rows are made by functions compiled from the table's rows: each key
    # holds what value_of reads, a field or an entry of ``more``, None where absent.
    from slurm_gpu_exporter.report.figures.table import dict_reader, value_of

    read = dict_reader(GpuDetail, (("busy", "busy_s"), ("peak_c", "temperature_peak")))
    plain = GpuDetail(gpu="0", uuid="GPU-a", busy_s=12.5)
    hot = GpuDetail(gpu="1", uuid="GPU-b", busy_s=3.0, more={"temperature_peak": 83.0})
    assert read(plain) == {"busy": 12.5, "peak_c": None}
    assert read(hot) == {"busy": 3.0, "peak_c": 83.0}
    assert read(hot)["peak_c"] == value_of(hot, "temperature_peak")
    # a name that is not one is refused, never compiled
    with pytest.raises(ReportError, match="not a name"):
        dict_reader(GpuDetail, (("busy", "busy_s)or(1"),))
    with pytest.raises(ReportError, match="not a name"):
        dict_reader(GpuDetail, (("x'", "busy_s"),))


def test_low_util_asks_its_figures_summed_by_job_as_their_rows_combine_them() -> None:
    from slurm_gpu_exporter.report.prometheus.figure_promql import per_job_queries

    got = per_job_queries(("busy", "gpu_memory_peak"), lambda m: f"{m}{{}}", "1h",
                          "jobid, cluster")
    assert got == {
        "busy": "sum by (jobid, cluster) (max_over_time(slurm_job_gpu_busy_seconds_total{}"
                "[1h]))",
        "busy_base": "sum by (jobid, cluster) (last_over_time("
                     "slurm_job_gpu_busy_seconds_total{}[5m] offset 1h))",
        "gpu_memory_peak": "max by (jobid, cluster) (max_over_time("
                           "slurm_job_gpu_memory_peak_bytes{}[1h]))",
    }
    # a device's gauge, or a figure a job does not combine, has no per-job value
    for name in ("gpu_memory_total", "energy"):
        with pytest.raises(ReportError, match="no per-job value"):
            per_job_queries((name,), lambda m: m, "1h", "jobid")
