"""Every parser of outside input, fuzzed: it returns or raises its own documented error,
in bounded time (the profile's deadline) and with a bounded result."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.hooks.jobhooks import record_from_env
from slurm_gpu_exporter.model.allocation import MAX_GPU_INDEX, parse_index_list
from slurm_gpu_exporter.node.cgroup import CgroupFS
from slurm_gpu_exporter.node.cgroup.files import parse_cpu_list
from slurm_gpu_exporter.node.cgroup.paths import parse_cgroup_path
from slurm_gpu_exporter.node.procfs import (
    ProcessGone,
    read_cgroup_paths,
    read_environ_values,
    read_stat,
)
from slurm_gpu_exporter.node.slurm.parse import (
    AmbiguousJobLine,
    expand_hostlist,
    gres_indices,
    parse_sacct,
    parse_scontrol_job,
    parse_scontrol_line,
)
from slurm_gpu_exporter.web.config import WebConfigError, load_web_config, parse_web_config
from tests.support import FIXTURES

LAYOUTS = FIXTURES / "cgroup-layouts"
# What a parser may hand back for an input of n bytes: far from "without bound".
MAX_ITEMS = 100_000

text = st.text(max_size=2000)
raw = st.binary(max_size=4000)
lines = st.lists(st.one_of(
    st.text(alphabet="0123456789:/-_.abcdefgjoptsu,=[] \n()|", max_size=200), text),
    max_size=20).map("\n".join)


# ----------------------------------------------------------------- /proc files

def _proc_file(name: str, content: bytes) -> Path:
    root = Path(tempfile.mkdtemp(prefix="sge-fuzz-proc-"))
    (root / "7").mkdir()
    (root / "7" / name).write_bytes(content)
    return root


@given(raw)
@example(b"7 (a) b) S 1 " + b"9" * 50 + b" 0" * 30)
@example(b"7 ()) " + b"x " * 30)
def test_proc_stat(content: bytes) -> None:
    root = _proc_file("stat", content)
    try:
        read_stat(root, 7)
    except (ValueError, ProcessGone):
        pass
    finally:
        shutil.rmtree(root)


@given(st.one_of(raw, lines.map(str.encode)))
@example(b"0::/system.slice/slurmstepd.scope/job_1/step_0/user/task_0\n")
def test_proc_cgroup_and_cgroup_paths(content: bytes) -> None:
    root = _proc_file("cgroup", content)
    try:
        paths = read_cgroup_paths(root, 7)
    finally:
        shutil.rmtree(root)
    assert len(paths) <= content.count(b"\n") + 1
    for path in paths:
        parse_cgroup_path(path)  # None or a reference; never raises


@given(st.one_of(text, lines))
@example("/slurm_node1/uid_1/job_12/step_0/task_0")
@example("/system.slice/x_slurmstepd.scope/job_5/step_batch/user/task_0")
def test_parse_cgroup_path(path: str) -> None:
    ref = parse_cgroup_path(path)
    assert ref is None or ref.job_key in path


@given(raw)
def test_proc_environ(content: bytes) -> None:
    root = _proc_file("environ", content)
    try:
        found = read_environ_values(root, 7, ["CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"])
    finally:
        shutil.rmtree(root)
    assert set(found) <= {"CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"}


@given(st.one_of(text, st.text(alphabet="0123456789-,\n ", max_size=40)))
@example("0-4294967295")
@example("0-99999999999999")
def test_cpu_list(value: str) -> None:
    try:
        cpus = parse_cpu_list(value)
    except ValueError:
        return
    assert len(cpus) <= MAX_ITEMS


@given(text)
@example("²")
@example("0-99999999999999")
@example("0-1023," * 50)
def test_gpu_index_list(value: str) -> None:
    indices = parse_index_list(value)  # never raises: the text is a job's environment
    assert len(indices) <= MAX_GPU_INDEX + 1
    assert all(0 <= i <= MAX_GPU_INDEX for i in indices)


# ------------------------------------------------------- cgroup stat files

_LAYOUT_COPIES: dict[str, Path] = {}


def _layout(name: str) -> Path:
    """One scratch copy of a layout per run; each example changes one file and puts it back."""
    if name not in _LAYOUT_COPIES:
        base = Path(tempfile.mkdtemp(prefix="sge-fuzz-cg-"))
        shutil.copytree(LAYOUTS / name, base / "root", symlinks=True)
        _LAYOUT_COPIES[name] = base / "root"
    return _LAYOUT_COPIES[name]


def _fuzz_cgroup_files(layout: str, content: bytes, which: int) -> None:
    root = _layout(layout)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "cgroup.controllers")
    target = files[which % len(files)]
    original = target.read_bytes()
    target.write_bytes(content)
    try:
        fs = CgroupFS(root)
        for job in fs.find_jobs().values():
            fs.read_stats(job)
    finally:
        target.write_bytes(original)


stat_content = st.one_of(
    raw,
    st.lists(st.tuples(st.sampled_from(["usage_usec", "total_rss", "anon", "oom_kill",
                                        "inactive_file", "max", "-1", ""]),
                       st.one_of(st.integers(), st.text(max_size=8))),
             max_size=10).map(lambda kv: "\n".join(f"{k} {v}" for k, v in kv).encode()),
    st.sampled_from([b"max\n", b"-1\n", b"18446744073709551615\n", b"0-4294967295\n",
                     b"\xff\xfe", b""]),
)


@given(stat_content, st.integers(min_value=0, max_value=500))
def test_cgroup_v1_stat_files(content: bytes, which: int) -> None:
    _fuzz_cgroup_files("v1-slurm", content, which)


@given(stat_content, st.integers(min_value=0, max_value=500))
def test_cgroup_v2_stat_files(content: bytes, which: int) -> None:
    _fuzz_cgroup_files("v2-system-slice", content, which)


# ------------------------------------------------------------ spool records

record_json = st.fixed_dictionaries(
    {"version": st.one_of(st.just(1), st.integers(), st.text(max_size=3)),
     "jobid": st.one_of(st.just("12"), st.text(max_size=12), st.integers()),
     "uid": st.one_of(st.integers(min_value=-5, max_value=2**33), st.text(max_size=4),
                      st.booleans(), st.none())},
    optional={k: st.one_of(st.text(max_size=50), st.integers(), st.floats(), st.none(),
                           st.lists(st.integers(), max_size=3))
              for k in ("user", "account", "partition", "job_gpus", "start_time",
                        "end_time", "cuda_visible_devices", "sluid")},
).map(lambda d: __import__("json").dumps(d).encode())


@given(st.one_of(raw, record_json))
def test_spool_record(content: bytes) -> None:
    try:
        rec = spool.parse_record(content, "12")
    except spool.SpoolError:
        return
    assert rec.jobid == "12"
    assert rec.to_json()  # what was accepted can be written back


@given(st.dictionaries(
    st.sampled_from(["SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_UID", "SLURM_JOB_USER",
                     "SLURM_JOB_ACCOUNT", "SLURM_JOB_PARTITION", "SLURM_JOB_GPUS",
                     "CUDA_VISIBLE_DEVICES", "SLURM_ARRAY_JOB_ID", "SLURM_JOB_NAME",
                     "SLURMD_NODENAME", "OTHER"]),
    st.one_of(text, st.from_regex(r"\A[0-9]{1,12}\Z")), max_size=12))
@example({"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "a\0b\nc"})
def test_prolog_environment(env: dict[str, str]) -> None:
    try:
        rec = record_from_env(env, 1.0, started=True)
    except spool.SpoolError:
        return
    spool.parse_record(rec.to_json(), rec.jobid)  # the prolog writes only what the agent reads


# -------------------------------------------------------- Slurm CLI output

scontrol = st.lists(st.tuples(
    st.sampled_from(["JobId", "UserId", "Account", "Partition", "JobName", "NodeList",
                     "StartTime", "EndTime", "GRES", "ArrayJobId", "ArrayTaskId", "Nodes",
                     "TRES", "JobState", "x"]),
    st.one_of(st.text(max_size=30),
              st.sampled_from(["node1", "node[1-3]", "node[0-99999999]", "a(1)",
                               "gpu:a100:2(IDX:0,2-3)", "gpu:2(IDX:0-99999999)",
                               "2026-01-01T00:00:00", "Unknown", "(null)"]))),
    max_size=15).map(lambda kv: " ".join(f"{k}={v}" for k, v in kv))


@given(st.one_of(text, scontrol))
@example("JobId=5 UserId=a(1) NodeList=node[0-99999999] GRES=gpu:2(IDX:0-99999999)")
def test_scontrol(line: str) -> None:
    pairs = parse_scontrol_line(line)
    assert len(pairs) <= len(line) + 1
    with contextlib.suppress(AmbiguousJobLine):  # the one documented exception
        parse_scontrol_job(line, "node1")  # else None or an info


@given(st.one_of(text, st.text(alphabet="node[]0123456789-,", max_size=40)))
@example("node[0-99999999]")
def test_hostlist_and_gres(expr: str) -> None:
    try:
        hosts = expand_hostlist(expr)
    except ValueError:
        return
    assert len(hosts) <= MAX_ITEMS
    gres_indices(expr)


@given(st.one_of(lines, st.lists(st.lists(st.text(alphabet="abc0129|:-T ", max_size=12),
                                          max_size=12).map("|".join), max_size=5)
                 .map("\n".join)))
def test_sacct(output: str) -> None:
    for jobid in ("12", output.split("|", 1)[0]):
        parse_sacct(output, jobid)


# --------------------------------------------------------------- web config

yaml_docs = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["tls_server_config", "basic_auth_users",
                                         "http_server_config", "cert_file", "key_file",
                                         "client_auth_type", "min_version", "headers",
                                         "client_allowed_sans", "prom", "x"]),
                        inner, max_size=5)),
    max_leaves=20)


@given(yaml_docs)
def test_web_config_documents(data: object) -> None:
    try:
        parse_web_config(data, Path("/nonexistent"))
    except WebConfigError:
        pass


# PyYAML takes seconds for 5,000 nested brackets on a loaded 2-core machine (tests
# run in parallel): bounded, but past the profile's 5 s.
@settings(deadline=timedelta(seconds=30))
@given(st.one_of(raw, yaml_docs.map(lambda d: yaml.safe_dump(d).encode())))
@example(b"a: &a [*a]\n")
@example(b"x: " + b"[" * 5000)
def test_web_config_files(content: bytes) -> None:
    fd, name = tempfile.mkstemp(prefix="sge-fuzz-web-")
    os.write(fd, content)
    os.close(fd)
    try:
        load_web_config(Path(name))
    except WebConfigError:
        pass
    finally:
        os.unlink(name)
