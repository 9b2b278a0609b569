"""``slurm-gpu-exporter check`` as a program: on the real test cluster, with the
prolog taken out of its slurm.conf, and over the fake NVML with GPUs whose minor
numbers are not their NVML order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakenvml import Device, MigInstance, NvmlState, fake_nvml_or_skip
from tests.support import FIXTURES
from tests.support.slurmcluster import SlurmCluster

LAYOUTS = FIXTURES / "cgroup-layouts"
EXPORTER = Path(sys.executable).with_name("slurm-gpu-exporter")

pytestmark = pytest.mark.process


def run_check(args: list[str], env: dict[str, str]) -> tuple[int, dict[str, object], str]:
    """Exit code, the JSON output and the text output of two runs with the same flags."""
    js = subprocess.run([str(EXPORTER), "check", "--format", "json", *args], env=env,
                        capture_output=True, text=True, timeout=60, check=False)
    text = subprocess.run([str(EXPORTER), "check", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert js.returncode == text.returncode, (js.stderr, text.stderr)
    data = json.loads(js.stdout)
    assert data["exit_code"] == js.returncode
    # One line per finding, then the summary.
    assert len(text.stdout.splitlines()) == len(data["findings"]) + 1  # type: ignore[arg-type]
    return js.returncode, data, text.stdout


def messages(data: dict[str, object], severity: str) -> list[str]:
    return [f"{f['area']}: {f['message']}" for f in data["findings"]  # type: ignore[union-attr]
            if f["severity"] == severity]  # type: ignore[index]


def cluster_args(cluster: SlurmCluster, tmp_path: Path) -> list[str]:
    return ["--spool-dir", str(cluster.spool_dir), "--state-dir", str(tmp_path / "state"),
            "--cgroup-root", str(cluster.cgroup_root), "--node-name", cluster.node_name]


@pytest.mark.slurm
def test_check_on_the_healthy_test_cluster_exits_0(slurm_cluster: SlurmCluster,
                                                   tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "LD_LIBRARY_PATH": str(tmp_path)}  # no NVML here: a warning
    rc, data, text = run_check(cluster_args(slurm_cluster, tmp_path), env)
    assert rc == 0, text
    ok = messages(data, "ok")
    version = subprocess.run(["scontrol", "--version"], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert f"slurm: {version}" in ok
    assert "slurm.conf: read from scontrol show config" in ok
    hooks = Path(os.environ.get("SGE_TESTCLUSTER_DIR", slurm_cluster.state_dir)) / "hooks"
    assert any(m.startswith(f"slurm.conf: Prolog {hooks}/prolog.sh reaches ") for m in ok)
    assert any(m.startswith(f"slurm.conf: Epilog {hooks}/epilog.sh reaches ") for m in ok)
    assert "slurm.conf: PrologFlags=alloc,contain: the prolog runs when a job is allocated" in ok
    assert "cgroup: cgroup v1 at /sys/fs/cgroup" in ok
    assert any(m.startswith("spool: --spool-dir ") for m in ok)
    assert messages(data, "block") == []


@pytest.mark.slurm
def test_check_with_the_prolog_missing_from_slurm_conf_exits_1(slurm_cluster: SlurmCluster,
                                                               tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("".join(line for line in slurm_cluster.slurm_conf.read_text()
                            .splitlines(keepends=True) if not line.startswith("Prolog=")))
    rc, data, text = run_check([*cluster_args(slurm_cluster, tmp_path), "--slurm-conf",
                                str(conf)], slurm_cluster.env)
    assert rc == 1
    assert [m for m in messages(data, "block")] == [
        "slurm.conf: no Prolog is set, so jobs' GPUs and users are known only through their "
        "processes; set Prolog=/opt/slurm-gpu-exporter/prolog/slurm-gpu-exporter.sh (or call "
        "it from your prolog)"]
    assert "BLOCK slurm.conf: no Prolog is set" in text


@pytest.mark.fakenvml
def test_check_over_nvml_shows_each_gpus_minor_uuid_and_mig(tmp_path: Path) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    fake.write(NvmlState(devices=[
        Device(0, minor=1), Device(1, minor=0, mig=[MigInstance(1), MigInstance(2)]),
    ]))
    (tmp_path / "spool").mkdir(mode=0o700)
    conf = tmp_path / "slurm.conf"
    conf.write_text("PrologFlags=Alloc\n")
    args = ["--cgroup-root", str(LAYOUTS / "v2-system-slice"), "--spool-dir",
            str(tmp_path / "spool"), "--state-dir", str(tmp_path / "state"),
            "--slurm-conf", str(conf), "--slurm-lookup", "off"]
    rc, data, _ = run_check(args, fake.env())
    notes = messages(data, "note")
    gpu0 = [m for m in notes if m.startswith("gpu: GPU 0: ")]
    assert len(gpu0) == 1 and "minor 1" in gpu0[0]
    assert "NVML index 0 is /dev/nvidia1, Slurm's GPU 1" in gpu0[0]
    gpu1 = [m for m in notes if m.startswith("gpu: GPU 1: ")]
    assert len(gpu1) == 1 and "minor 0, MIG: 2 instance(s)" in gpu1[0] and "UUID GPU-" in gpu1[0]
    assert any(m.startswith("gpu: NVIDIA driver ") and m.endswith(", 2 GPU(s)")
               for m in messages(data, "ok"))
    # The prolog is missing from that slurm.conf: the only thing that blocks.
    assert [m.split(",")[0] for m in messages(data, "block")] == [
        "slurm.conf: no Prolog is set"]
    assert rc == 1
