"""User-chosen label values never break the exposition, and long ones are cut."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpu_exporter.exposition.labels import MAX_LABEL_VALUE_CHARS
from slurm_gpu_exporter.sim.synthnode import SynthNode
from tests.fakenvml import Device, NvmlState, fake_nvml_or_skip
from tests.support import require
from tests.support.agent import Agent

pytestmark = pytest.mark.fakenvml

# (user, account, partition) as a user could choose them; lone surrogates stand for
# invalid UTF-8 passed through (json.dumps writes them as \udcxx escapes).
HOSTILE = [
    ('quo"te', "acc'ount", 'part"ition'),
    ("back\\slash\\", "\\\\", "\\n"),
    ("new\nline", "tab\there", "cr\rlf\n"),  # see also job 107: 10 KB
    ("\udcff\udc80", "bad\ud800", "\udfff"),
    ("x" * 1024, "a" * 1000, '{}=,"' * 200),  # a record field holds at most 1024 chars
    ("ünïcödé 🚀", "\x00nul", "# HELP x"),
    ("u", "é" * 1000, "p"),
    ("x" * 10240, "a", "p"),  # refused by the spool; the job is still found by its cgroup
]


def _record(node: SynthNode, jobid: int, user: str, account: str, partition: str) -> None:
    fields = {"version": 1, "jobid": str(jobid), "uid": 1001, "start_time": time.time(),
              "node": node.node, "cluster": "synth", "user": user, "account": account,
              "partition": partition}
    (node.spool_dir / f"{jobid}.json").write_text(json.dumps(fields) + "\n")


def test_hostile_label_values_never_break_the_exposition(tmp_path: Path) -> None:
    fake = fake_nvml_or_skip(tmp_path / "nvml")
    fake.write(NvmlState(devices=[Device(index=0, minor=0)]))
    node = SynthNode(tmp_path / "node")
    for i, (user, account, partition) in enumerate(HOSTILE):
        jobid = 100 + i
        node.add_job(jobid, [5000 + i], record=False)
        _record(node, jobid, user, account, partition)
    agent = Agent(node.agent_args(1.0), env=fake.env(), log_path=tmp_path / "agent.log")
    try:
        agent.wait_ready()
        text = agent.wait_metrics(lambda t: t.count("slurm_job_info{") == len(HOSTILE), 20,
                                  f"the {len(HOSTILE)} jobs' info series")
        status, _, om = agent.get(headers={"Accept": "application/openmetrics-text"})
    finally:
        agent.stop()
    assert status == 200
    assert text.count("slurm_job_info{") == len(HOSTILE), agent.log()

    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool (Debian package prometheus) is not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    list(openmetrics_families(om.decode()))  # raises on anything malformed
    infos = parsed["slurm_job_info"].samples
    assert sorted(s.labels["jobid"] for s in infos) == [str(100 + i) for i in range(len(HOSTILE))]
    by_job = {s.labels["jobid"]: s.labels for s in infos}
    assert by_job["100"]["user"] == 'quo"te'
    assert by_job["102"]["user"] == "new\nline"
    assert by_job["103"]["user"] == "\ufffd\ufffd"  # invalid UTF-8 is replaced, not fatal
    long = by_job["104"]
    assert long["user"] == "x" * MAX_LABEL_VALUE_CHARS
    assert long["account"] == "a" * MAX_LABEL_VALUE_CHARS
    assert long["partition"] == ('{}=,"' * 100)[:MAX_LABEL_VALUE_CHARS]
    assert by_job["106"]["account"] == "é" * MAX_LABEL_VALUE_CHARS
    assert not by_job["107"]["user"].startswith("xxx")  # the refused record is not used
    for samples in (f.samples for f in parsed.values()):
        for sample in samples:
            assert all(len(v) <= MAX_LABEL_VALUE_CHARS for v in sample.labels.values())
