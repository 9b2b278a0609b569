"""The agent's own process figures: what prometheus_client's ProcessCollector exports."""

from __future__ import annotations

from prometheus_client import ProcessCollector

from slurm_gpu_exporter.exposition.own_process import OwnProcess


def test_the_families_are_process_collectors_names_help_types_and_values() -> None:
    own = OwnProcess()
    ours = own.families(own.read())
    theirs = list(ProcessCollector(registry=None).collect())
    assert [(m.name, m.documentation, m.type) for m in ours] == [
        (m.name, m.documentation, m.type) for m in theirs]
    for a, b in zip(ours, theirs, strict=True):
        [sa], [sb] = a.samples, b.samples
        assert (sa.name, sa.labels) == (sb.name, sb.labels)
        if a.name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                      "process_virtual_memory_bytes"):
            assert abs(sa.value - sb.value) <= max(0.05 * sb.value, 0.02), a.name  # read apart
        else:
            assert sa.value == sb.value, a.name


def test_without_proc_there_are_no_figures(tmp_path) -> None:  # type: ignore[no-untyped-def]
    own = OwnProcess(str(tmp_path))
    assert own.read() is None
    assert own.families(None) == []
