"""enforce at the edges the other fast tests leave: het jobs after a plain one, the user a
doubtful decision names, names that are printable but not ASCII, doubts of two targets and
windows of two GPUs, the agents named or not, a site's node label through a whole run, the
relay login of the policy, and the state file's own format and failure."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.enforce import run
from slurm_gpu_exporter.report.enforce.decisions import decide
from slurm_gpu_exporter.report.enforce.decisions_text import printable
from slurm_gpu_exporter.report.enforce.idle_window import (
    JobIdleness,
    WindowUsage,
    fetch_idleness,
    jobs_from_answers,
)
from slurm_gpu_exporter.report.enforce.policy import parse_policy, parse_policy_duration
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.notify.relay import PLAIN_SMTP
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters
from tests.report.enforce.test_decisions import WINDOWS, FakeJob, answers, slurm_of
from tests.report.enforce.test_enforce_decide_fast import POLICY, _het, _job, _one, _slurm
from tests.report.enforce.test_enforce_policy_fast import W, _answers
from tests.report.enforce.test_enforce_run_fast import (
    IDLE,
    Channel,
    Prometheus,
    _decision,
    _options,
)

NOW = 1_800_000_000.0
H = 3600.0
WINDOW_LOG = "slurm_gpu_exporter.report.enforce.idle_window"


def test_a_het_job_after_a_plain_one_is_still_cancelled_whole() -> None:
    jobs = [_job("5"), _job("40", idle_windows=3), _job("41", idle_windows=3)]
    sent = {j: [NOW - 3600, NOW - 1800] for j in ("40", "41")}
    decisions = decide(jobs, {"5": _slurm("5"), "40": _het(0), "41": _het(1)}, sent, POLICY,
                       NOW)
    assert [(d.jobid, d.action) for d in decisions] == [
        ("5", "none"), ("40", "cancel"), ("41", "skip")]


def test_a_doubtful_decision_names_slurms_user() -> None:
    assert _one(_job("1"), _slurm("1", user="bob")).user == "bob"
    assert _one(_job("1"), None).user == "ann"


def test_printable_text_that_is_not_ascii_is_kept_as_it_is() -> None:
    assert printable("café ✓\x1b\n") == "café ✓\\x1b\\n"


def test_doubts_of_every_target_of_a_job_are_said() -> None:
    gpu0 = {"jobid": "42", "user": "ann", "instance": "g1:9817", "gpu": "0"}
    gpu1 = gpu0 | {"instance": "g2:9817"}
    job = jobs_from_answers(_answers(
        held=[Sample(gpu0, 1.0), Sample(gpu1, 1.0)],
        fresh=[Sample(gpu0, NOW), Sample(gpu1, NOW)],
        up=[Sample({"instance": "g1:9817"}, 0.0), Sample({"instance": "g2:9817"}, 1.0)],
        last_sample=[]), (W,), 0.01, NOW)[0]
    assert job.doubts == ["the agent target g1:9817 is down",
                          "the agent on g2:9817 has no recent sample"]


def test_a_window_with_one_gpu_uncovered_and_one_busy_is_not_idle() -> None:
    gpu0 = {"jobid": "42", "user": "ann", "instance": "g1:9817", "gpu": "0"}
    gpu1 = gpu0 | {"gpu": "1"}
    job = jobs_from_answers(_answers(
        held=[Sample(gpu0, 1.0), Sample(gpu1, 1.0)],
        allocated_3600s=[Sample(gpu0, 10.0), Sample(gpu1, W)],
        busy_3600s=[Sample(gpu0, 0.0), Sample(gpu1, W)]), (W,), 0.01, NOW)[0]
    assert job.windows == [WindowUsage(
        W, False, "the counters of GPU 0 on g1:9817 do not cover the last 1h")]


@pytest.mark.parametrize(("count", "more"), [(3, ""), (4, " and 1 more")])
def test_only_the_agents_that_name_no_node_are_listed(caplog: pytest.LogCaptureFixture,
                                                      count: int, more: str) -> None:
    jobs = [FakeJob(str(i), age=4 * H, instance=f"gpu0{i}:9817") for i in range(1, count + 1)]
    got = answers([*jobs, FakeJob("9", age=4 * H, instance="gpu09:9817")])
    got["held"] = [Sample(s.labels | {"slurm_node": "n9"}, s.value)
                   if s.labels["jobid"] == "9" else s for s in got["held"]]
    with caplog.at_level(logging.WARNING, WINDOW_LOG):
        asyncio.run(fetch_idleness(Prometheus(got), WINDOWS, Filters(), 0.01, NOW))  # type: ignore[arg-type]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"the agents at gpu01:9817, gpu02:9817, gpu03:9817{more} name no "
                           "one Slurm node")


def test_a_sites_node_label_names_the_jobs_nodes_through_a_whole_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    got = answers([IDLE])
    got["held"] = [Sample(s.labels | {"host": "n7"}, s.value) for s in got["held"]]
    prom = Prometheus(got, node_label="host")
    found = asyncio.run(fetch_idleness(prom, WINDOWS, Filters(), 0.01, NOW, "host"))  # type: ignore[arg-type]
    assert found[0].nodes == ["n7"]
    monkeypatch.setattr(run, "listed_jobs", lambda: slurm_of(IDLE, nodes=("n7",)))
    Channel(monkeypatch)
    options = run.EnforceOptions(parse_policy(""), cancel=False, state_path=tmp_path / "s",
                                 filters=Filters(), node_label="host")
    done = asyncio.run(run.run_enforce(Prometheus(got, node_label="host"), options, NOW))  # type: ignore[arg-type]
    assert [(d.nodes, d.action) for d in done.decisions] == [(("n7",), "warn")]


def test_a_run_records_its_own_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run, "listed_jobs", lambda: slurm_of(IDLE))
    channel = Channel(monkeypatch)
    state = EnforceState(tmp_path / "enforce.json")
    state.add_warning("42", NOW - 2 * H)
    state.add_warning("42", NOW - 1.5 * H)
    asyncio.run(run.run_enforce(Prometheus(answers([IDLE])), _options(tmp_path), NOW))  # type: ignore[arg-type]
    assert channel.calls[0] == ("record", "42", "slurm-gpu-report enforce: cancelled "
                                                "2027-01-15 08:00 UTC, GPUs idle for 2h (busy "
                                                "under 1%) after 2 warning(s)")
    assert EnforceState(tmp_path / "enforce.json").jobs["42"]["cancelled"] == NOW


def test_both_messages_go_with_the_relay_login(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    channel, state = Channel(monkeypatch), EnforceState(tmp_path / "enforce.json")
    run.act_on(_decision("warn", warning=1), state, _options(tmp_path), NOW)
    run.act_on(_decision("cancel"), state, _options(tmp_path), NOW)
    assert [login for _, _, _, login in channel.sent] == [PLAIN_SMTP, PLAIN_SMTP]


def test_the_policys_relay_login_and_its_smallest_times() -> None:
    policy = parse_policy('[idle]\nwarn_after = []\ncancel_after = "1s"\n'
                          '[notify]\nsmtp_user = "gpu-report"\nsmtp_starttls = true\n')
    assert policy.cancel_after_s == 1.0
    assert (policy.relay.user, policy.relay.starttls) == ("gpu-report", True)
    with pytest.raises(ReportError) as caught:
        parse_policy_duration("90m and more", "idle.cancel_after")
    assert "is not a duration" in str(caught.value)


def test_the_state_file_is_sorted_json_written_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "enforce.json"
    state = EnforceState(path)
    state.add_cancel("9", 2.0)
    state.add_warning("10", 1.0)
    assert path.read_text() == ('{\n "jobs": {\n  "10": {\n   "warnings": [\n    1.0\n   ]\n'
                                '  },\n  "9": {\n   "cancelled": 2.0\n  }\n }\n}\n')
    assert path.stat().st_mode & 0o777 == 0o600
    (tmp_path / "file").write_text("")
    state.path = tmp_path / "file" / "enforce.json"
    with pytest.raises(ReportError) as caught:
        state.save()
    assert str(caught.value) == f"cannot write the enforce state in {tmp_path}/file: File exists"
    assert caught.value.exit_code == 2


def test_a_window_past_the_jobs_life_is_not_counted_for_a_doubt() -> None:
    young = JobIdleness("1", "u", NOW - H, windows=[WindowUsage(H, True, None),
                                                    WindowUsage(2 * H, False, "NVML down")])
    assert young.idle_for(NOW) == (H, None)
