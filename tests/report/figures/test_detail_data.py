"""A job's detail as data and back (what the proxy's archive endpoint sends): the same
detail comes back, and data of the wrong shape is refused whole."""

from __future__ import annotations

import json

import pytest

from slurm_gpu_exporter.report.figures.detail_data import (
    DetailDataError,
    detail_from_data,
    detail_to_data,
)
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)


def _detail() -> JobDetail:
    gpu = GpuDetail(gpu="0.1", uuid="MIG-1", allocated_s=10.0, busy_s=5.0, sm_active_s=None)
    return JobDetail(usage=JobUsage(jobid="7_1", user="alice", gpus=1, allocated_s=10.0,
                                    busy_s=5.0, start=1.0, end=11.0),
                     nodes=[NodeDetail(node="n1", cpus=2, gpus=[gpu])],
                     accounting=Accounting(state="FAILED", exit_code="1:0"), now=11.0,
                     notes=["a note"])


def test_a_detail_comes_back_the_same_through_json() -> None:
    detail = _detail()
    assert detail_from_data(json.loads(json.dumps(detail_to_data(detail)))) == detail
    bare = JobDetail(usage=JobUsage(jobid="8"), nodes=[], accounting=None, now=0.0)
    assert detail_from_data(detail_to_data(bare)) == bare


@pytest.mark.parametrize("change", [
    lambda d: d["usage"].update(jobid=7),
    lambda d: d["usage"].update(gpus=True),
    lambda d: d["usage"].update(busy_s="5"),
    lambda d: d["usage"].pop("jobid"),
    lambda d: d["usage"].update(evil=1),
    lambda d: d.update(nodes={"n1": {}}),
    lambda d: d["nodes"][0]["gpus"][0].update(gpu=None),
    lambda d: d.update(notes=[1]),
    lambda d: d.update(notes=["x"] * 101),
    lambda d: d.update(accounting="COMPLETED"),
])
def test_data_of_the_wrong_shape_is_refused(change) -> None:  # type: ignore[no-untyped-def]
    data = detail_to_data(_detail())
    change(data)
    with pytest.raises(DetailDataError):
        detail_from_data(data)


def test_a_whole_number_is_a_float_and_null_only_where_allowed() -> None:
    data = detail_to_data(_detail())
    data["usage"]["busy_s"] = 5
    assert detail_from_data(data).usage.busy_s == 5.0
    data["now"] = None
    with pytest.raises(DetailDataError, match=r"job\.now: must not be null"):
        detail_from_data(data)
