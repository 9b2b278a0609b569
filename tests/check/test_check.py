"""``slurm-gpu-exporter check`` over the synthetic cgroup layouts, with Slurm and NVML
given in-process (the real CLI runs in tests/check/test_check_slurm.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from slurm_gpu_exporter.check.command import build_parser, run_checks
from slurm_gpu_exporter.check.findings import Finding, exit_code, render_json, render_text
from slurm_gpu_exporter.check.slurmconf import parse_config
from slurm_gpu_exporter.check.slurmside import SlurmAccess
from slurm_gpu_exporter.check.training import check_training
from slurm_gpu_exporter.gpu.backend import GpuUnavailable
from slurm_gpu_exporter.gpu.readings import DeviceReading, MigInstance
from slurm_gpu_exporter.hooks.spool import JobRecord, open_spool_dir, write_record
from slurm_gpu_exporter.training_relay.socketfile import bind_socket
from tests.support import FIXTURES

LAYOUTS = FIXTURES / "cgroup-layouts"


def _no_pyslurm() -> ModuleType:
    raise ImportError("no pyslurm")


def _no_scontrol() -> str:
    raise RuntimeError("scontrol is not on PATH")


SLURM = SlurmAccess(lambda: "slurm 24.11.1", _no_scontrol, _no_pyslurm)


class Gpus:
    """A GpuBackend that hands out fixed readings."""

    def __init__(self, *devices: DeviceReading, unavailable: bool = False) -> None:
        self.devices = list(devices)
        self.unavailable = unavailable

    def init(self) -> str:
        if self.unavailable:
            raise GpuUnavailable("NVML failed to initialise: NVML Shared Library Not Found")
        return "570.86"

    def read(self, cursors: dict[str, tuple[int, int]]) -> list[DeviceReading]:
        return self.devices

    def wait_xid(self, timeout_ms: int) -> list[object]:
        return []

    def shutdown(self) -> None:
        pass


def gpu(index: int, minor: int | None, **kw: object) -> DeviceReading:
    return DeviceReading(index=index, uuid=f"GPU-{index}", name="NVIDIA H100", minor=minor,
                         pci_bus_id=f"0000:{index:02x}:00.0", **kw)  # type: ignore[arg-type]


def hooks(tmp: Path, prolog: bool = True, flags: str = "Alloc,Contain",
          gather: str = "jobacct_gather/cgroup") -> Path:
    """A slurm.conf whose Prolog/Epilog are the shipped wrappers over an install prefix."""
    prefix = tmp / "prefix"
    (prefix / "bin").mkdir(parents=True)
    lines = [f"PrologFlags={flags}", f"JobAcctGatherType={gather}"]
    for kind in ("prolog", "epilog"):
        entry = prefix / "bin" / f"slurm-gpu-exporter-{kind}"
        entry.write_text("#!/bin/sh\n")
        entry.chmod(0o755)
        script = tmp / f"{kind}.sh"
        script.write_text(f"#!/bin/sh\nprefix={prefix}\ndefaults={tmp}/none\n"
                          f'exec "$prefix/bin/slurm-gpu-exporter-{kind}"\n')
        script.chmod(0o755)
        if kind == "epilog" or prolog:
            lines.append(f"{kind.capitalize()}={script}  # the exporter's hook")
    conf = tmp / "slurm.conf"
    conf.write_text("ClusterName=test\n" + "\n".join(lines) + "\n")
    return conf


def args_for(tmp: Path, cgroup_root: Path, *extra: str) -> argparse.Namespace:
    tmp.mkdir(parents=True, exist_ok=True)
    spool, state = tmp / "spool", tmp / "state"
    for d in (spool, state):
        d.mkdir(mode=0o700, exist_ok=True)
    return build_parser().parse_args([
        "--cgroup-root", str(cgroup_root), "--spool-dir", str(spool), "--state-dir", str(state),
        "--proc-root", str(tmp / "proc"), *extra])


def check(tmp: Path, layout: str, *extra: str, gpus: Gpus | None = None,
          conf: Path | None = None) -> list[Finding]:
    conf = conf or hooks(tmp / "hooks")
    args = args_for(tmp, LAYOUTS / layout, "--slurm-conf", str(conf), *extra)
    backend = gpus or Gpus(gpu(0, 0))
    return run_checks(args, slurm=SLURM, gpu=lambda: backend)


def lines(findings: list[Finding], severity: str | None = None) -> list[str]:
    return [f"{f.area}: {f.message}" for f in findings
            if severity is None or f.severity == severity]


# layout -> (node name, cgroup version, Slurm roots, job cgroups found, by SLUID)
LAYOUT_FACTS = {
    "v1-slurm": ("node01", 1, 6, 2, 0),
    "v1-node-prefix": ("node01", 1, 4, 1, 0),
    "v2-system-slice": ("node01", 2, 1, 2, 0),
    "v2-custom-slice": ("node01", 2, 1, 1, 0),
    "v2-node-scope": ("node01", 2, 1, 1, 0),
    "v2-multi-slurmd": ("node02", 2, 3, 3, 0),
    "v2-sluid": ("node01", 2, 1, 2, 2),
}


def test_every_synthetic_layout_is_in_the_table() -> None:
    assert set(LAYOUT_FACTS) == {p.name for p in LAYOUTS.iterdir() if p.is_dir()}


@pytest.mark.parametrize("layout", sorted(LAYOUT_FACTS))
def test_each_layout_shows_its_version_roots_and_jobs_and_nothing_blocks(
        tmp_path: Path, layout: str) -> None:
    node, version, roots, jobs, sluid = LAYOUT_FACTS[layout]
    findings = check(tmp_path, layout, "--node-name", node)
    text = lines(findings)
    assert f"cgroup: cgroup v{version} at {LAYOUTS / layout}" in text
    assert sum(t.startswith("cgroup: Slurm root ") for t in text) == roots
    by = f"{sluid} by SLUID, {jobs - sluid} by job id" if sluid else f"{jobs} by job id"
    assert f"cgroup: {jobs} job cgroup(s) found ({by})" in text
    # No prolog ran in the fixtures: every job is found through its cgroup alone.
    assert sum("no spool record" in t for t in lines(findings, "warn")) == jobs
    assert lines(findings, "block") == []
    assert exit_code(findings) == 0


def test_v1_prefix_names_the_node_and_a_wrong_node_name_is_a_warning(tmp_path: Path) -> None:
    findings = check(tmp_path, "v1-node-prefix", "--node-name", "gpu7")
    assert any("roots are node node01's but --node-name is gpu7" in t and
               "--node-name node01" in t for t in lines(findings, "warn"))
    assert exit_code(findings) == 0


def test_v1_without_cpuacct_job_cgroups_warns_that_cpu_time_is_missing(tmp_path: Path) -> None:
    warned = lines(check(tmp_path, "v1-node-prefix", "--node-name", "node01"), "warn")
    assert any("no job has a cpuacct cgroup" in t for t in warned)
    # (cgroup findings only: the test's own path, in the training finding, says cpuacct)
    assert not any("cpuacct" in t for t in lines(check(tmp_path / "b", "v1-slurm"), "warn")
                   if t.startswith("cgroup: "))


def test_multiple_slurmd_roots_are_noted(tmp_path: Path) -> None:
    notes = lines(check(tmp_path, "v2-multi-slurmd", "--node-name", "node02"), "note")
    assert any("several slurmd instances (node01, node02, node03)" in t for t in notes)


def test_job_with_spool_record_and_cgroup_is_shown_with_both(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir(mode=0o700)
    fd = open_spool_dir(str(tmp_path / "spool"))
    try:
        write_record(fd, JobRecord(jobid="401", uid=1000, user="alice", job_gpus="0",
                                   start_time=1.0))
        write_record(fd, JobRecord(jobid="409", uid=1000, user="alice", start_time=1.0))
    finally:
        os.close(fd)
    findings = check(tmp_path, "v2-system-slice")
    ok = lines(findings, "ok")
    assert any(t.startswith("jobs: job 401 (user alice, GPUs 0): spool record and cgroup ")
               for t in ok)
    assert any("job 409" in t and "no cgroup yet" in t for t in lines(findings, "note"))
    assert any("job 402" in t and "no spool record" in t for t in lines(findings, "warn"))
    assert exit_code(findings) == 0


def test_running_job_without_any_slurm_cgroup_root_blocks(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    shutil.copytree(LAYOUTS / "v2-system-slice", root,
                    ignore=shutil.ignore_patterns("slurmstepd.scope"))
    (tmp_path / "spool").mkdir(mode=0o700)
    fd = open_spool_dir(str(tmp_path / "spool"))
    write_record(fd, JobRecord(jobid="7", uid=1000, start_time=1.0))
    os.close(fd)
    args = args_for(tmp_path, root, "--slurm-conf", str(hooks(tmp_path / "h")))
    findings = run_checks(args, slurm=SLURM, gpu=lambda: Gpus(gpu(0, 0)))
    assert any("no Slurm cgroup root" in t and "--cgroup-root" in t
               for t in lines(findings, "block"))
    assert exit_code(findings) == 1


def test_spool_dir_writable_by_others_blocks_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool").chmod(0o777)
    findings = check(tmp_path, "v2-system-slice")
    blocked = lines(findings, "block")
    assert len(blocked) == 1
    assert blocked[0].startswith("spool: the agent refuses to start: --spool-dir ")
    assert f"fix: chmod go-w {tmp_path / 'spool'}" in blocked[0]
    assert exit_code(findings) == 1


def test_prolog_missing_from_slurm_conf_blocks(tmp_path: Path) -> None:
    conf = hooks(tmp_path / "h", prolog=False)
    findings = check(tmp_path, "v2-system-slice", conf=conf)
    assert [t for t in lines(findings, "block") if "Prolog" in t] == [
        "slurm.conf: no Prolog is set, so jobs' GPUs and users are known only through their "
        "processes; set Prolog=/opt/slurm-gpu-exporter/prolog/slurm-gpu-exporter.sh (or call "
        "it from your prolog)"]
    assert any(t.startswith("slurm.conf: Epilog ") and "reaches" in t
               for t in lines(findings, "ok"))
    assert exit_code(findings) == 1


def test_prolog_whose_entry_point_is_missing_blocks(tmp_path: Path) -> None:
    conf = hooks(tmp_path / "h")
    (tmp_path / "h" / "prefix" / "bin" / "slurm-gpu-exporter-prolog").unlink()
    blocked = lines(check(tmp_path, "v2-system-slice", conf=conf), "block")
    assert len(blocked) == 1 and "execs" in blocked[0] and "SLURM_GPU_EXPORTER_PREFIX" in blocked[0]


def test_prolog_of_another_script_and_a_non_executable_one_block(tmp_path: Path) -> None:
    other = tmp_path / "site-prolog.sh"
    other.write_text("#!/bin/sh\nexit 0\n")
    conf = hooks(tmp_path / "h")
    conf.write_text(conf.read_text().replace("Prolog=", f"Prolog={other}\n#Prolog="))
    blocked = lines(check(tmp_path, "v2-system-slice", conf=conf), "block")
    assert len(blocked) == 1 and "does not run slurm-gpu-exporter-prolog" in blocked[0]
    (tmp_path / "h" / "prolog.sh").chmod(0o644)
    conf.write_text(conf.read_text().replace(f"Prolog={other}\n#", ""))
    blocked = lines(check(tmp_path / "b", "v2-system-slice", conf=conf), "block")
    assert len(blocked) == 1 and "is not executable" in blocked[0]


def test_prolog_flags_without_alloc_and_v1_without_cgroup_gathering_warn(tmp_path: Path) -> None:
    conf = hooks(tmp_path / "h", flags="Contain", gather="jobacct_gather/linux")
    findings = check(tmp_path, "v1-slurm", conf=conf)
    warned = lines(findings, "warn")
    assert any("PrologFlags lacks Alloc" in t for t in warned)
    assert any("JobAcctGatherType=jobacct_gather/linux on cgroup v1" in t for t in warned)
    assert exit_code(findings) == 0


def test_gpu_whose_minor_differs_from_its_nvml_index_is_noted(tmp_path: Path) -> None:
    gpus = Gpus(gpu(0, 1), gpu(1, 0, gpm_supported=True,
                                mig=(MigInstance(1, 0, "MIG-a", "1g.10gb", 10, 0),)))
    findings = check(tmp_path, "v2-system-slice", gpus=gpus)
    notes = lines(findings, "note")
    assert any(t.startswith("gpu: GPU 0: NVIDIA H100, UUID GPU-0, minor 1, no GPM: NVML index "
                            "0 is /dev/nvidia1, Slurm's GPU 1") for t in notes)
    assert any("GPU 1: NVIDIA H100, UUID GPU-1, minor 0, MIG: 1 instance(s), GPM" in t
               for t in notes)
    assert exit_code(findings) == 0


def test_lost_gpu_blocks_and_missing_nvml_warns(tmp_path: Path) -> None:
    lost = check(tmp_path, "v2-system-slice", gpus=Gpus(gpu(0, 0), gpu(1, None, lost=True)))
    assert [t for t in lines(lost, "block")] == [
        "gpu: GPU 1 is lost (NVML cannot read it), so its jobs have no GPU figures; check "
        "nvidia-smi and the kernel log, then reset or drain the node"]
    none = check(tmp_path / "b", "v2-system-slice", gpus=Gpus(unavailable=True))
    assert any("NVML failed to initialise" in t for t in lines(none, "warn"))
    assert exit_code(none) == 0


def test_profiling_restriction_is_read_from_the_driver_params(tmp_path: Path) -> None:
    params = tmp_path / "proc" / "driver" / "nvidia" / "params"
    params.parent.mkdir(parents=True)
    params.write_text("ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: 1\n")
    notes = lines(check(tmp_path, "v2-system-slice"), "note")
    assert "gpu: GPU profiling is open to admins (RmProfilingAdminOnly=1)" in notes


def test_slurm_version_and_lookup_path_are_shown(tmp_path: Path) -> None:
    pyslurm = ModuleType("pyslurm")
    pyslurm.__version__ = "24.11.0"  # type: ignore[attr-defined]
    access = SlurmAccess(lambda: "slurm 24.11.1", _no_scontrol, lambda: pyslurm)
    args = args_for(tmp_path, LAYOUTS / "v2-system-slice")
    findings = run_checks(args, slurm=access, gpu=lambda: Gpus())
    text = lines(findings)
    assert "slurm: slurm 24.11.1" in text and "slurm: look-ups through pyslurm 24.11.0" in text
    assert any("slurm.conf: not checked: scontrol is not on PATH" in t for t in text)
    args = args_for(tmp_path, LAYOUTS / "v2-system-slice", "--slurm-lookup", "cli")
    text = lines(run_checks(args, slurm=SLURM, gpu=lambda: Gpus()))
    assert "slurm: look-ups through the Slurm CLI (squeue/scontrol)" in text
    none = SlurmAccess(lambda: None, _no_scontrol, _no_pyslurm)
    warned = lines(run_checks(args, slurm=none, gpu=lambda: Gpus()), "warn")
    assert any("no Slurm version" in t and "install the Slurm client commands" in t
               for t in warned)


def test_both_config_formats_are_parsed() -> None:
    show = ("Prolog                  = /a/prolog.sh\nPrologFlags             = Alloc,Contain\n"
            "Epilog                  = (null)\nJobAcctGatherType       = jobacct_gather/cgroup\n")
    assert parse_config(show) == {"prolog": ["/a/prolog.sh"], "prologflags": ["Alloc,Contain"],
                                  "jobacctgathertype": ["jobacct_gather/cgroup"]}
    conf = "# Prolog=/old\nprolog=/a.sh # ours\nProlog=/b.sh\nNodeName=n1 Gres=gpu:4\n"
    assert parse_config(conf) == {"prolog": ["/a.sh", "/b.sh"]}


def test_prolog_directory_holding_the_wrapper_reaches_it(tmp_path: Path) -> None:
    conf = hooks(tmp_path / "h")
    d = tmp_path / "prolog.d"
    d.mkdir()
    (tmp_path / "h" / "prolog.sh").rename(d / "50-gpu.sh")
    conf.write_text(conf.read_text().replace(f"Prolog={tmp_path / 'h' / 'prolog.sh'}",
                                             f"Prolog={d}"))
    findings = check(tmp_path, "v2-system-slice", conf=conf)
    assert any(t.startswith(f"slurm.conf: Prolog {d / '50-gpu.sh'} reaches ")
               for t in lines(findings, "ok"))


def test_text_has_one_line_per_finding_and_json_carries_the_exit_code() -> None:
    findings = [Finding("ok", "cgroup", "cgroup v2 at /x\x1b[2J"),
                Finding("block", "spool", "bad; fix: chmod go-w /s")]
    text = render_text(findings).splitlines()
    assert text == ["OK    cgroup: cgroup v2 at /x\\x1b[2J", "BLOCK spool: bad; fix: chmod go-w /s",
                    "1 finding(s) block right numbers; fix those marked BLOCK (0 warning(s))"]
    data = json.loads(render_json(findings))
    assert data["exit_code"] == 1
    assert data["findings"][1] == {"severity": "block", "area": "spool",
                                   "message": "bad; fix: chmod go-w /s"}


def _training(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.severity, f.message) for f in findings if f.area == "training"]


def _reachable_spool(tmp_path: Path) -> Path:
    # pytest's own temporary root is mode 0700: the relay's socket needs a path others pass.
    spool = Path("/var/tmp") / f"sge-check-{os.getpid()}-{tmp_path.name}"
    spool.mkdir(mode=0o755)
    return spool


def test_training_relay_off_is_a_note_and_a_missing_socket_too(tmp_path: Path) -> None:
    spool = _reachable_spool(tmp_path)
    try:
        assert _training([*check_training(spool, enabled=False)]) == [
            ("note", "the training relay is off (--no-training.relay): no slurm_job_training_* "
                     "series from job scripts")]
        assert _training(check_training(spool, enabled=True)) == [
            ("note", f"no socket at {spool}/training.sock yet: the agent makes it when it starts")]
    finally:
        shutil.rmtree(spool)


def test_training_socket_served_or_left_behind(tmp_path: Path) -> None:
    spool = _reachable_spool(tmp_path)
    try:
        listener, _ = bind_socket(str(spool / "training.sock"))
        assert _training(check_training(spool, enabled=True)) == [
            ("ok", f"the agent serves {spool}/training.sock; job scripts can reach it")]
        listener.close()  # the socket file stays, as after an agent that was killed
        [(severity, message)] = _training(check_training(spool, enabled=True))
        assert severity == "warn" and message.startswith(f"nothing listens on {spool}/")
    finally:
        shutil.rmtree(spool)


def test_training_socket_behind_a_private_directory_or_too_long_warns(tmp_path: Path) -> None:
    base = _reachable_spool(tmp_path)
    try:
        private = base / "private"
        (private / "spool").mkdir(parents=True)
        private.chmod(0o700)
        assert _training(check_training(private / "spool", enabled=True)) == [
            ("warn", f"{private} is not searchable by other users, so training scripts in jobs "
                     f"cannot reach {private}/spool/training.sock; chmod o+x {private}")]
    finally:
        shutil.rmtree(base)
    deep = Path("/var/tmp") / ("d" * 120)
    [(severity, message)] = _training(check_training(deep, enabled=True))
    assert severity == "warn" and "use a shorter --spool-dir" in message
