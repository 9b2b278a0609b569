"""Behaviour that mutants of report/render survived in the fast tier (bench/mutation.py,
issue 55): each test here fails on the mutant it names."""

from __future__ import annotations

import json
import re

from slurm_gpu_exporter.report.figures.shapes import GpuDetail, JobDetail, JobUsage, NodeDetail
from slurm_gpu_exporter.report.render.svg import histogram
from slurm_gpu_exporter.report.render.text import job_json
from slurm_gpu_exporter.report.render.values import job_header


def _ended_job(name: str = "") -> JobDetail:
    usage = JobUsage(jobid="42", user="alice", name=name, gpus=1, allocated_s=7200.0,
                     busy_s=3600.0, start=1_000.0, end=8_200.0, unknown_s=1800.0)
    return JobDetail(usage, [NodeDetail("n1", gpus=[GpuDetail("0", "GPU-0", 7200.0, 3600.0)])],
                     None, now=10_000.0)


def test_a_job_without_a_name_is_headed_by_its_id_alone():
    """mutmut: job_header's name suffix for a job without a name no longer empty."""
    assert dict(job_header(_ended_job()))["Job"] == "42"
    assert dict(job_header(_ended_job("train")))["Job"] == "42 (train)"


def test_the_json_of_an_ended_job_without_accounting_says_ended_and_its_unmeasured_hours():
    """mutmut: text._job_values' "ENDED" and its seconds-to-hours divisor (the mail and
    scripts read this JSON)."""
    (job,) = json.loads(job_json([_ended_job()], queries=1))["jobs"]
    assert job["state"] == "ENDED"
    assert job["unmeasured_gpu_hours"] == 0.5


def test_a_ratio_of_one_or_more_lands_in_the_histograms_last_bin():
    """mutmut: histogram's clamp to the last bin (bins + 1 indexes past the end)."""
    svg = histogram([1.0, 1.5], "busy", bins=10)
    heights = [float(h) for h in re.findall(r'class="bar"[^>]*height="([0-9.]+)"', svg)]
    assert len(heights) == 10 and heights[-1] > 0 and not any(heights[:-1])
