"""The sample's sources as one protocol: the sampler runs any source by it, in order,
each seeing the parts before it; crash, health and state come from the protocol alike."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_exporter.agent.flags import build_parser
from slurm_gpu_exporter.agent.sources import SOURCE_TABLE, Node, build_sources
from slurm_gpu_exporter.jobs.source import SampleContext, SampleSource, SourceDefaults
from slurm_gpu_exporter.jobs.stats import JobStatsCollector
from slurm_gpu_exporter.jobs.tracker import JobTracker
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.slurm.lookup import SlurmMetadata
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import StateStore
from slurm_gpu_exporter.sampling.sampler import Sampler
from slurm_gpu_exporter.sim.synthnode import SynthNode


class Counting(SourceDefaults):
    """A made-up source: counts the jobs the tracker found, keeps a running total as its
    state, and is down when told to be."""

    name = "nodepower"  # borrows a health name: SOURCES is the one list of them
    health_names = ("nodepower",)
    state_key = "made_up"

    def __init__(self) -> None:
        self.total = 0
        self.seen: list[dict[str, Any]] = []
        self.good = True
        self.crash = False

    def take(self, ctx: SampleContext) -> int:
        self.seen.append(dict(ctx.parts))
        if self.crash:
            raise RuntimeError("made-up failure")
        self.total += len(ctx.jobs)
        return len(ctx.jobs)

    def failed_part(self) -> int:
        return -1

    def up(self, part: int) -> bool:
        return self.good and part >= 0

    def snapshot_fields(self, part: int) -> dict[str, Any]:
        return {"node_power_watts": float(part)}

    def export_state(self) -> dict[str, Any]:
        return {"total": self.total}

    def import_state(self, data: dict[str, Any]) -> None:
        self.total = int(data.get("total", 0))


def _rig(tmp_path: Path, made_up: Counting, errors: SourceErrors
         ) -> tuple[SynthNode, Sampler]:
    node = SynthNode(tmp_path)
    cgroups = CgroupFS(node.cgroup_root)
    tracker = JobTracker(str(node.spool_dir), cgroups, SlurmMetadata(None), errors,
                         proc_root=node.proc_root, trusted_uids=frozenset({0, os.geteuid()}))
    sampler = Sampler([tracker, JobStatsCollector(cgroups, node.proc_root, errors), made_up],
                      errors, 5.0, state=StateStore(node.state_dir))
    return node, sampler


def test_a_source_sees_the_parts_of_those_before_it_and_fills_its_fields(
        tmp_path: Path) -> None:
    made_up = Counting()
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    node.add_job(4102, [5002])
    _, sampler = _rig(tmp_path, made_up, SourceErrors())
    snapshot = sampler.sample_once()
    assert list(made_up.seen[0]) == ["registry", "cgroup"]  # in order, not after
    assert [j.jobid for j in made_up.seen[0]["registry"]] == ["4101", "4102"]
    assert snapshot.node_power_watts == 2.0
    assert [s.name for s in snapshot.steps] == ["registry", "cgroup", "nodepower", "state"]
    assert {s.name: s.ok for s in snapshot.sources}["nodepower"] is True


def test_a_crash_or_a_bad_part_is_that_source_down_alone(tmp_path: Path) -> None:
    made_up, errors = Counting(), SourceErrors()
    _, sampler = _rig(tmp_path, made_up, errors)
    made_up.crash = True
    snapshot = sampler.sample_once()
    ok = {s.name: s.ok for s in snapshot.sources}
    assert ok == {"spool": True, "cgroup": True, "slurm": True, "state": True,
                  "nodepower": False}
    assert snapshot.errors["nodepower"] == 1 and snapshot.node_power_watts == -1.0
    made_up.crash, made_up.good = False, False
    snapshot = sampler.sample_once()
    assert {s.name: s.ok for s in snapshot.sources}["nodepower"] is False
    assert snapshot.errors["nodepower"] == 1  # down, but nothing more counted
    made_up.good = True
    assert {s.name: s.ok for s in sampler.sample_once().sources}["nodepower"] is True


def test_a_sources_state_is_saved_under_its_key_and_restored(tmp_path: Path) -> None:
    made_up = Counting()
    node = SynthNode(tmp_path)
    node.add_job(4101, [5001])
    _, sampler = _rig(tmp_path, made_up, SourceErrors())
    sampler.sample_once()
    sampler.sample_once()
    assert StateStore(node.state_dir).load()["made_up"] == {"total": 2}
    again = Counting()
    _rig(tmp_path, again, SourceErrors())
    assert again.total == 2


def test_two_sources_of_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unique"):
        Sampler([Counting(), Counting()], SourceErrors(), 5.0)


def test_every_row_of_the_table_builds_a_source_of_the_protocol(tmp_path: Path) -> None:
    node = SynthNode(tmp_path)
    args: argparse.Namespace = build_parser().parse_args([
        "--spool-dir", str(node.spool_dir), "--proc-root", str(node.proc_root),
        "--cgroup-root", str(node.cgroup_root), "--powercap-root", str(tmp_path / "rapl"),
        "--hwmon-root", str(tmp_path / "hwmon"), "--slurm-lookup", "off"])
    with contextlib.ExitStack() as stack:
        sources = build_sources(Node(args, CgroupFS(node.cgroup_root), SourceErrors(),
                                     frozenset({0, os.geteuid()}), stack))
        assert [s.name for s in sources] == ["registry", "cgroup", "powercap", "nvml",
                                             "nodepower", "training"]
        assert len(sources) == len(SOURCE_TABLE)
        for source in sources:
            assert isinstance(source, SampleSource)
        for source in sources:
            source.close()
