"""Rendering a snapshot: families, labels, absent values, both formats."""

from __future__ import annotations

import gzip
import re

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_exporter.exposition.rendered import render
from slurm_gpu_exporter.exposition.snapshot import (
    GpuSample,
    JobGpuSample,
    JobInfo,
    JobSample,
    Snapshot,
    SourceStatus,
    StepTiming,
    UnattributedSample,
)
from slurm_gpu_exporter.node.source_health import SOURCES
from tests.support import REPO
from tests.support.agent import series

ROOT = REPO


def _snapshot(**overrides: object) -> Snapshot:
    job = JobInfo(jobid="42", uid=1001, user="alice", account="ml", partition="gpu",
              start_time=1000.0)
    fields: dict[str, object] = {
        "timestamp": 2000.0,
        "jobs": (JobSample(job=job, gpus=1, cpus=4, cpu_seconds=12.5,
                           memory_used_bytes=1024, memory_limit_bytes=None),),
        "job_gpus": (JobGpuSample(job=JobInfo(jobid="42", user="alice"), gpu="0", uuid="GPU-0",
                                  allocated_seconds=10.0, busy_seconds=None,
                                  utilization=0.5, memory_used_bytes=1, memory_peak_bytes=2,
                                  energy_joules=None, processes=1),),
        "gpus": (GpuSample(gpu="0", uuid="GPU-0", name="Fake", minor=0, pci_bus_id="0:1",
                           utilization=0.5, temperature_celsius=None),),
        "unattributed": (UnattributedSample(gpu="0", uuid="GPU-0", user="bob", processes=1,
                                            memory_bytes=7),),
        "nvml_up": True,
        "sources": tuple(SourceStatus(s, s != "slurm") for s in SOURCES),
        "steps": (StepTiming("registry", 0.001),),
        "errors": dict.fromkeys(SOURCES, 0) | {"slurm": 3},
        "sample_duration_seconds": 0.002,
    }
    fields.update(overrides)
    return Snapshot(**fields)  # type: ignore[arg-type]


def test_known_values_are_series_and_unknown_values_are_absent() -> None:
    text = render(_snapshot()).text.decode()
    assert series(text, "slurm_job_cpus") == [({"jobid": "42", "user": "alice"}, 4.0)]
    assert series(text, "slurm_job_cpu_seconds_total")[0][1] == 12.5
    assert series(text, "slurm_job_memory_limit_bytes") == []  # unlimited: no series
    assert series(text, "slurm_job_gpu_busy_seconds_total") == []  # not reported
    assert series(text, "slurm_job_gpu_energy_joules_total") == []


def test_job_info_carries_the_qos_and_an_empty_one_where_unknown() -> None:
    known = JobSample(job=JobInfo(jobid="43", user="bob", qos="high"))
    text = render(_snapshot(jobs=(*_snapshot().jobs, known))).text.decode()
    assert {labels["jobid"]: labels["qos"] for labels, _ in series(text, "slurm_job_info")} == {
        "42": "", "43": "high"}
    assert series(text, "slurm_gpu_temperature_celsius") == []
    assert series(text, "slurm_job_gpu_allocated_seconds_total")[0][0] == {
        "jobid": "42", "user": "alice", "gpu": "0", "uuid": "GPU-0"}
    assert series(text, "slurm_gpu_unattributed_memory_bytes") == [
        ({"gpu": "0", "uuid": "GPU-0", "user": "bob"}, 7.0)]


def test_every_job_series_carries_jobid_and_user() -> None:
    text = render(_snapshot()).text.decode()
    for family in text_string_to_metric_families(text):
        if family.name.startswith("slurm_job_"):
            for sample in family.samples:
                assert sample.labels["jobid"] and sample.labels["user"], sample


def test_source_values_and_their_states_are_exposed() -> None:
    text = render(_snapshot()).text.decode()
    up = {labels["source"]: value for labels, value in
          series(text, "slurm_gpu_exporter_source_up")}
    assert up == {s: (0.0 if s == "slurm" else 1.0) for s in SOURCES}
    errors = {labels["source"]: value for labels, value in
              series(text, "slurm_gpu_exporter_sample_errors_total")}
    assert errors["slurm"] == 3 and set(errors) == set(SOURCES)
    steps = {labels["source"] for labels, _ in
             series(text, "slurm_gpu_exporter_sample_duration_seconds")}
    assert steps == {"registry", "total"}


def test_without_a_gpu_backend_there_are_no_gpu_families() -> None:
    text = render(_snapshot(nvml_up=None, gpus=(), job_gpus=(), unattributed=())).text.decode()
    assert "slurm_gpu_info" not in text
    assert "slurm_gpu_exporter_nvml_up" not in text
    assert series(render(_snapshot(nvml_up=False)).text.decode(),
                  "slurm_gpu_exporter_nvml_up") == [({}, 0.0)]


def test_both_formats_carry_the_same_families_and_gzip_is_the_same_bytes() -> None:
    exposition = render(_snapshot())
    assert gzip.decompress(exposition.text_gzip) == exposition.text
    assert gzip.decompress(exposition.openmetrics_gzip) == exposition.openmetrics
    assert exposition.openmetrics.endswith(b"# EOF\n")
    plain = {f.name for f in text_string_to_metric_families(exposition.text.decode())}
    openmetrics = {f.name for f in parse_om(exposition.openmetrics.decode())}
    assert plain == openmetrics
    assert exposition.timestamp == 2000.0


def test_every_rendered_family_is_documented() -> None:
    docs = (ROOT / "docs" / "metrics.md").read_text()
    text = render(_snapshot()).text.decode()
    for family in text_string_to_metric_families(text):
        if family.name.startswith("process_") or family.name.startswith("python_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in docs, name


def test_documented_source_values_are_exactly_the_ones_the_agent_counts() -> None:
    docs = (ROOT / "docs" / "metrics.md").read_text()
    row = next(line for line in docs.splitlines()
               if line.startswith("| `slurm_gpu_exporter_sample_errors_total`"))
    documented = set(re.findall(r"`(\w+)` \(", row))
    assert documented == set(SOURCES)
    # ... and each one is counted somewhere in the agent, so none is documented but dead.
    code = "\n".join(p.read_text() for p in (ROOT / "slurm_gpu_exporter").rglob("*.py"))
    for source in SOURCES:
        assert re.search(rf'\.count\(\s*"{source}"', code), source


def test_serving_an_exposition_reads_no_file(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The agent's own process figures come from /proc/self: read with the sample, so
    # that a scrape touches nothing on the node.
    import slurm_gpu_exporter.exposition.rendered as metrics

    exposition = render(_snapshot())

    def no_reads():  # type: ignore[no-untyped-def]
        raise AssertionError("a scrape read /proc")

    monkeypatch.setattr(metrics._PROCESS_COLLECTOR, "read", no_reads)
    for openmetrics in (False, True):
        for gzipped in (False, True):
            body = exposition.body(openmetrics, gzipped)
            text = (gzip.decompress(body) if gzipped else body).decode()
            assert "process_resident_memory_bytes" in text
