"""``slurm-gpu-report enforce`` on real parts: Slurm jobs, the agent over the fake NVML,
a real Prometheus scraping it every second, a webhook that gets the warnings.

One scenario for the module, with the policy's windows in seconds (warn at 10 s and
15 s idle, cancel at 20 s, at most one cancel per run; 10 s is about the shortest
window whose counters a 1 s scrape covers to the 80 % the policy asks, see
test_enforce_faults). Four one-GPU jobs start together: A (a hostile name) and B idle
from the start, C busy until A and B are cancelled and idle since (so it cannot fall
due while A and B are handled, however slow the machine), D busy all along. The
scenario runs enforce until each step is seen and keeps every run; then it breaks the
data (NVML down, the agent stopped, Prometheus stopped) and runs it again. The tests
read what the runs and Slurm show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakenvml import Pattern, Process
from tests.support import wait_until
from tests.support.daemons import Prometheus, WebhookReceiver
from tests.support.rig import Rig, Scrape
from tests.support.slurmcluster import SlurmCluster

pytestmark = [pytest.mark.process, pytest.mark.slurm, pytest.mark.every_release,
              pytest.mark.fakenvml,
              pytest.mark.prometheus]

REPORT = Path(sys.executable).parent / "slurm-gpu-report"
# User text that would do harm if it reached a shell, a command line or a terminal.
HOSTILE_NAME = "idle-a $(touch /tmp/enforce-pwned) --uid=0 \x1b[2J;x"
POLICY = """
[idle]
busy_fraction = 0.01
warn_after = ["10s", "15s"]
cancel_after = "20s"
min_job_age = "5s"
max_cancels_per_run = 1

[exempt]
job_names = [{exempt}]
"""


@dataclass
class Run:
    label: str
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    at: float

    @property
    def decisions(self) -> dict[str, dict[str, Any]]:
        return {d["jobid"]: d for d in json.loads(self.stdout)["decisions"]}

    def action(self, jobid: str) -> str:
        return self.decisions[jobid]["action"]


@dataclass
class Scenario:
    cluster: SlurmCluster
    jobs: dict[str, str]  # role (a, b, c, d) -> job id
    webhook: WebhookReceiver
    state_file: Path
    runs: list[Run] = field(default_factory=list)
    marks: dict[str, Run] = field(default_factory=dict)  # a step -> the run that shows it
    slurm_states: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def states(self) -> dict[str, str | None]:
        return {role: self.cluster.state(int(j)) for role, j in self.jobs.items()}

    def warned(self, role: str) -> int:
        if not self.state_file.exists():
            return 0
        entry = json.loads(self.state_file.read_text())["jobs"].get(self.jobs[role], {})
        return len(entry.get("warnings", []))


def _enforce(scenario: Scenario, prom_url: str, policy: Path, *extra: str,
             label: str = "", fmt: str = "json") -> Run:
    argv = [str(REPORT), "enforce", "--policy", str(policy), "--format", fmt,
            "--prometheus-url", prom_url, "--timeout", "5", "--node-label", "node",
            "--state-file",
            str(scenario.state_file), "--notify", f"{scenario.webhook.url}/notify", *extra]
    env = {**os.environ, **scenario.cluster.env}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    run = Run(label, argv, proc.returncode, proc.stdout, proc.stderr, time.time())
    scenario.runs.append(run)
    return run


@pytest.fixture(scope="module")
def scenario(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Scenario]:
    began = time.monotonic()
    base = tmp_path_factory.mktemp("enforce")
    policy, exempt_policy = base / "policy.toml", base / "exempt.toml"
    policy.write_text(POLICY.format(exempt='"keep-*"'))
    exempt_policy.write_text(POLICY.format(exempt='"idle-*"'))
    started: list[Any] = []
    jobids: list[int] = []
    try:
        rig = Rig(base, cluster=slurm_cluster,
                  command=slurm_cluster.site_command("slurm-gpu-exporter"),
                  scrape=Scrape("slurm-gpu-exporter", {"node": slurm_cluster.node_name},
                                timeout="1s"))
        started.append(rig)
        prom = rig.prom
        webhook = WebhookReceiver()
        started.append(webhook)
        for name in (HOSTILE_NAME, "idle-b", "phase-c", "busy-d"):
            jobids.append(slurm_cluster.submit("sleep 300\n", gres="gpu:1",
                                               extra_args=[f"--job-name={name}"]))
        jobs = dict(zip("abcd", map(str, jobids), strict=True))
        gpu_of: dict[str, int] = {}
        pid_of: dict[str, int] = {}
        for role, jobid in jobs.items():
            slurm_cluster.wait_state(int(jobid), "RUNNING", timeout=30)
            pid_of[role] = min(slurm_cluster.wait_for_process(int(jobid), "batch"))
            record = wait_until(lambda j=jobid: slurm_cluster.gpu_record(j), 15,
                                f"the prolog's spool record of job {jobid}")
            gpu_of[role] = int(record["job_gpus"])
        for role, sm in (("a", None), ("b", None), ("c", Pattern.constant(80)),
                         ("d", Pattern.constant(80))):
            rig.devices[gpu_of[role]].processes = [Process(pid_of[role], 1 << 30, sm=sm)]
        rig.write_nvml()
        prom.wait_for("slurm_job_gpu_allocated_seconds_total", timeout=30, min_results=4)
        sc = Scenario(slurm_cluster, jobs, webhook, base / "enforce.json")
        url = prom.url

        def cancel_run(label: str, pol: Path = policy) -> Run:
            return _enforce(sc, url, pol, "--cancel", label=label)

        # Warnings, in the runs of a timer, until A and B have both.
        wait_until(lambda: cancel_run("warnings") and sc.warned("a") == 2
                   and sc.warned("b") == 2, 60, "both warnings to A and B", poll=0.5)
        sc.marks["table"] = _enforce(sc, url, policy, label="table", fmt="table")
        # A dry run until it would cancel one of A and B and defer the other (the cap).
        sc.marks["dry_due"] = wait_until(
            lambda: (r := _enforce(sc, url, policy, label="dry"))
            and sorted(r.action(j) for j in (jobs["a"], jobs["b"])) == ["cancel", "skip"]
            and r, 30, "a dry run that cancels A or B", poll=0.5)
        sc.slurm_states["after_dry"] = sc.states()
        sc.marks["exempt"] = cancel_run("exempt", exempt_policy)
        sc.slurm_states["after_exempt"] = sc.states()
        # A run may skip a job once when a scrape came late (exit 7, nothing done): the
        # timer's next run acts. Wait for the run that cancels one of A and B.
        sc.marks["cap"] = wait_until(
            lambda: (r := cancel_run("cap"))
            and any(r.action(j) == "cancel" for j in (jobs["a"], jobs["b"])) and r,
            30, "a run that cancels A or B", poll=0.5)
        first = next(j for j in (jobs["a"], jobs["b"]) if sc.marks["cap"].action(j) == "cancel")
        slurm_cluster.wait_finished(int(first), timeout=30)
        sc.slurm_states["after_cap"] = sc.states()
        sc.marks["second"] = cancel_run("second")
        for role in "ab":
            slurm_cluster.wait_finished(int(jobs[role]), timeout=30)
        # C, busy so far, goes idle: warned from its idle window, then due for its cancel.
        rig.devices[gpu_of["c"]].processes = [Process(pid_of["c"], 1 << 30)]
        rig.write_nvml()
        wait_until(lambda: cancel_run("warnings c") and sc.warned("c") == 2, 60,
                   "both warnings to C", poll=0.5)
        sc.marks["dry_c"] = wait_until(
            lambda: (r := _enforce(sc, url, policy, label="dry c"))
            and r.action(jobs["c"]) == "cancel" and r, 30, "a dry run that cancels C",
            poll=0.5, log=lambda: f"last run: {sc.runs[-1].stdout[-2000:]}"
                                  f"{sc.runs[-1].stderr[-1000:]}")
        # Now break the data under C, due for its cancel: nothing may be cancelled.
        rig.nvml.errors = {"*": "UNKNOWN"}
        rig.write_nvml()
        prom.wait_for('slurm_gpu_exporter_source_up{source="nvml"} == 0', timeout=30)
        sc.marks["nvml_down"] = cancel_run("nvml down")
        rig.agent.stop()
        prom.wait_for('up{job="slurm-gpu-exporter"} == 0', timeout=30)
        sc.marks["target_down"] = cancel_run("target down")
        prom.stop()
        sc.marks["prometheus_down"] = cancel_run("prometheus down")
        sc.slurm_states["end"] = sc.states()
        _summary(sc)
        print(f"enforce scenario: {time.monotonic() - began:.1f} s")
        yield sc
    finally:
        for jobid in jobids:
            slurm_cluster.cancel(jobid)
        for thing in reversed(started):
            thing.stop()


def _summary(sc: Scenario) -> None:
    """What each run decided, on the test's output (shown with -s or on a failure)."""
    t0 = sc.runs[0].at
    for run in sc.runs:
        actions = ({r: run.decisions[j]["action"] for r, j in sc.jobs.items()
                    if j in run.decisions} if run.stdout.startswith("{") else {})
        print(f"{run.at - t0:6.1f}s {run.label:16} rc={run.rc} {actions}")


def _warnings_to(scenario: Scenario, role: str) -> list[dict[str, Any]]:
    return [payload for path, payload in scenario.webhook.notifications
            if path == "/notify" and payload["jobs"] == [scenario.jobs[role]]]


def _admin_comment(cluster: SlurmCluster, jobid: str) -> str:
    """The recorded reason: through sacct where the cluster keeps accounting, else scontrol."""
    config = cluster.run(["scontrol", "show", "config"])
    if "accounting_storage/none" not in config:
        return cluster.run(["sacct", "-n", "-X", "-P", "-j", jobid, "-o", "AdminComment"]).strip()
    out = cluster.run(["scontrol", "show", "job", jobid])
    return out.split("AdminComment=", 1)[1].split("\n", 1)[0] if "AdminComment=" in out else ""


def test_idle_job_gets_its_warnings_in_order_then_is_cancelled_with_the_reason_recorded(
        scenario: Scenario) -> None:
    for role in "ab":
        texts = [p["subject"] for p in _warnings_to(scenario, role)]
        assert [t.split("(")[-1] for t in texts[:2]] == ["warning 1 of 2)", "warning 2 of 2)"]
        assert "cancelled" in texts[-1]
        assert scenario.slurm_states["end"][role] == "CANCELLED"
        jobid = scenario.jobs[role]
        assert any(f"slurm-gpu-report: warned job {jobid} (sgeuser): warning 2 of 2" in r.stderr
                   for r in scenario.runs)
        reason = _admin_comment(scenario.cluster, jobid)
        assert "slurm-gpu-report enforce" in reason and "idle for 20s" in reason, reason


def test_hostile_job_name_stays_text_in_messages_table_and_slurm(scenario: Scenario) -> None:
    warning = _warnings_to(scenario, "a")[0]
    assert HOSTILE_NAME in warning["text"]  # the user's own name, verbatim, in the mail
    assert not Path("/tmp/enforce-pwned").exists()
    table = scenario.marks["table"].stdout
    assert "\x1b" not in table and "\\x1b[2J" in table
    reason = _admin_comment(scenario.cluster, scenario.jobs["a"])
    assert "$(" not in reason and "--uid" not in reason


def test_busy_job_is_never_warned_nor_cancelled(scenario: Scenario) -> None:
    assert _warnings_to(scenario, "d") == []
    assert scenario.slurm_states["end"]["d"] == "RUNNING"
    assert not any(r.decisions[scenario.jobs["d"]]["action"] in ("warn", "cancel")
                   for r in scenario.runs if r.stdout.startswith("{"))


def test_job_busy_at_first_and_idle_since_is_caught_by_the_window(scenario: Scenario) -> None:
    texts = [p["subject"] for p in _warnings_to(scenario, "c")]
    assert len(texts) == 2 and "warning 2 of 2" in texts[1]
    due = scenario.marks["dry_c"].decisions[scenario.jobs["c"]]
    assert due["action"] == "cancel" and due["idle_for_seconds"] == 20


def test_exempt_job_is_untouched(scenario: Scenario) -> None:
    run = scenario.marks["exempt"]
    for role in "ab":
        decision = run.decisions[scenario.jobs[role]]
        assert decision["action"] == "skip" and "exempt" in decision["reason"]
    assert scenario.slurm_states["after_exempt"]["a"] == "RUNNING"
    assert scenario.slurm_states["after_exempt"]["b"] == "RUNNING"


def test_dry_run_cancels_nothing_and_prints_the_decisions_cancel_then_takes(
        scenario: Scenario) -> None:
    dry, cap = scenario.marks["dry_due"], scenario.marks["cap"]
    assert json.loads(dry.stdout)["dry_run"] is True
    assert scenario.slurm_states["after_dry"]["a"] == "RUNNING"
    assert scenario.slurm_states["after_dry"]["b"] == "RUNNING"
    for role in "ab":
        jobid = scenario.jobs[role]
        assert dry.action(jobid) == cap.action(jobid)


def test_cap_on_cancellations_holds(scenario: Scenario) -> None:
    cap = scenario.marks["cap"]
    actions = sorted(cap.action(scenario.jobs[r]) for r in "ab")
    assert actions == ["cancel", "skip"]
    assert sorted(scenario.slurm_states["after_cap"][r] or "" for r in "ab") == [
        "CANCELLED", "RUNNING"]
    cancelled = next(j for j in scenario.jobs.values() if cap.action(j) == "cancel")
    lines = [ln for ln in cap.stderr.splitlines() if ln.startswith("slurm-gpu-report: ")]
    assert [ln for ln in lines if "cancelled job" in ln] == [
        f"slurm-gpu-report: cancelled job {cancelled} (sgeuser): "
        f"{cap.decisions[cancelled]['reason']}"]
    for run in scenario.runs:
        if run.stdout.startswith("{"):
            assert sum(d["action"] == "cancel" for d in run.decisions.values()) <= 1


def test_a_job_cancelled_a_moment_ago_is_over_not_doubtful(scenario: Scenario) -> None:
    """The run right after the cap's cancel: the job's series are still fresh, and Slurm
    still holds it as ended. squeue --json hides such a job since 24.05 unless asked
    --states=all; read as not listed, it made the run doubtful (exit 7)."""
    cap = scenario.marks["cap"]
    cancelled = next(j for j in scenario.jobs.values() if cap.action(j) == "cancel")
    decision = scenario.marks["second"].decisions.get(cancelled)
    assert decision is not None and not decision["doubtful"], (
        decision, scenario.marks["second"].stderr)
    assert decision["action"] == "skip"


def test_query_count_is_fixed(scenario: Scenario) -> None:
    counts = {json.loads(r.stdout)["queries"] for r in scenario.runs
              if r.stdout and r.rc in (0, 7) and r.stdout.startswith("{")}
    assert counts == {3 * 3 + 5}


@pytest.mark.parametrize(("step", "code", "words"), [
    ("nvml_down", 7, "NVML was down"),
    ("target_down", 7, "is down"),
])
def test_doubtful_data_cancels_nothing_says_why_and_exits_non_zero(
        scenario: Scenario, step: str, code: int, words: str) -> None:
    run = scenario.marks[step]
    assert run.rc == code, run.stderr
    decision = run.decisions[scenario.jobs["c"]]
    assert decision["action"] == "skip" and decision["doubtful"]
    assert words in decision["reason"]
    assert "cannot be trusted" in run.stderr
    assert scenario.slurm_states["end"]["c"] == "RUNNING"


def test_prometheus_down_acts_on_nothing_and_exits_3(scenario: Scenario) -> None:
    run = scenario.marks["prometheus_down"]
    assert run.rc == 3 and run.stdout == ""
    assert "cannot reach Prometheus" in run.stderr and len(run.stderr.splitlines()) == 1
    assert scenario.slurm_states["end"]["c"] == "RUNNING"


def test_a_closed_stdout_is_one_line_on_stderr_and_exit_1(slurm_cluster: SlurmCluster,
                                                          tmp_path: Path) -> None:
    """enforce's exit status says what it did: a reader that closed stdout early does not
    turn it into 0, nor into a traceback."""
    prom = Prometheus("prometheus", {"global": {"scrape_interval": "1s"}}, tmp_path / "prom")
    try:
        prom.wait_ready()
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY.format(exempt=""))
        read_end, write_end = os.pipe()
        os.close(read_end)
        proc = subprocess.run(
            [str(REPORT), "enforce", "--policy", str(policy), "--prometheus-url", prom.url,
             "--state-file", str(tmp_path / "state.json")],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
            env={**os.environ, **slurm_cluster.env})
        os.close(write_end)
    finally:
        prom.stop()
    assert proc.stderr.splitlines() == [
        "slurm-gpu-report: stdout was closed before the output was written; what was done "
        "is on stderr and in the state file"]
    assert proc.returncode == 1
