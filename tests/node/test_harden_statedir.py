"""The state dir full (a 64 KiB tmpfs) or read-only: the agent keeps serving, counts
the error, and saves again once the dir is usable."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.node.state_dir import STATE_FILE
from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, fake_nvml_or_skip
from tests.support import require, wait_until
from tests.support.agent import Agent, series

pytestmark = pytest.mark.fakenvml


def _value(text: str, name: str, **labels: str) -> float:
    [v] = [v for lab, v in series(text, name) if all(lab.get(k) == x for k, x in labels.items())]
    return v


def _until(agent: Agent, check: Callable[[str], bool], what: str, timeout: float = 15) -> str:
    return wait_until(lambda: (lambda t: t if check(t) else None)(agent.metrics()), timeout,
                      what, poll=0.1, log=agent.log)


@pytest.fixture()
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    require(shutil.which("mount") is not None, "mount (util-linux) is not installed")
    mnt = tmp_path / "state"
    mnt.mkdir(mode=0o755)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs",
                           str(mnt)], capture_output=True, text=True, check=False)
    require(done.returncode == 0, f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: the dir is full
        pass
    finally:
        os.close(fd)
    return filler


def test_a_full_or_read_only_state_dir_is_counted_and_recovered(
        tmp_path: Path, small_tmpfs: Path) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    fake.write(NvmlState(devices=[Device(0)]))
    node = SynthNode(tmp_path / "node")
    node.add_job(91, [9101], job_gpus="0")
    filler = _fill(small_tmpfs)
    args = node.agent_args(0.2)
    args[args.index("--state-dir") + 1] = str(small_tmpfs)
    agent = Agent(args, env=fake.env(), log_path=tmp_path / "agent.log")
    state_errors = "slurm_gpu_exporter_sample_errors_total"
    try:
        agent.wait_ready()
        text = _until(agent, lambda t: _value(t, state_errors, source="state") >= 2,
                      "state errors while the dir is full")
        assert _value(text, "slurm_gpu_exporter_source_up", source="state") == 0
        assert _value(text, "slurm_job_gpus", jobid="91") == 1  # still serving jobs

        filler.unlink()  # space returns
        text = _until(agent, lambda t: _value(t, "slurm_gpu_exporter_source_up",
                                              source="state") == 1, "recovery")
        assert (small_tmpfs / STATE_FILE).exists()

        subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
        before = _value(text, state_errors, source="state")
        _until(agent, lambda t: _value(t, state_errors, source="state") > before + 1,
               "state errors on a read-only dir")
        subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
        _until(agent, lambda t: _value(t, "slurm_gpu_exporter_source_up", source="state") == 1,
               "recovery from read-only")
        assert agent.proc.poll() is None
    finally:
        agent.stop()
