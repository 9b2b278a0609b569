"""The enforce policy: defaults, durations, and every bad policy refused naming its key."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.report.cli.main import main
from slurm_gpu_exporter.report.enforce.policy import DEFAULT_POLICY, parse_policy, span
from slurm_gpu_exporter.report.errors import ReportError


def test_default_policy_parses_with_the_jds_like_times() -> None:
    policy = parse_policy(DEFAULT_POLICY)
    assert policy.warn_after_s == (3600, 5400)
    assert policy.cancel_after_s == 7200
    assert policy.min_job_age_s == 1800
    assert policy.busy_fraction == 0.01
    assert policy.max_cancels_per_run == 10
    assert policy.windows_s == (3600, 5400, 7200)


def test_short_windows_in_seconds_are_accepted() -> None:
    policy = parse_policy('[idle]\nwarn_after = ["10s", "20s"]\ncancel_after = "30s"\n'
                          'min_job_age = "1m30s"\n')
    assert policy.windows_s == (10, 20, 30)
    assert policy.min_job_age_s == 90


@pytest.mark.parametrize(("text", "key"), [
    ('[idle]\nbusy_fractoin = 0.1\n', "idle.busy_fractoin"),
    ('[idel]\n', "[idel]"),
    ('[idle]\ncancel_after = "30m"\n', "idle.cancel_after"),  # below the 90m warning
    ('[idle]\nwarn_after = ["90m", "60m"]\n', "idle.warn_after"),
    ('[idle]\ncancel_after = "2 hours"\n', "idle.cancel_after"),
    ('[idle]\ncancel_after = 7200\n', "idle.cancel_after"),
    ('[idle]\nbusy_fraction = 1.5\n', "idle.busy_fraction"),
    ('[idle]\nmax_cancels_per_run = -1\n', "idle.max_cancels_per_run"),
    ('[idle]\nmax_cancels_per_run = true\n', "idle.max_cancels_per_run"),
    ('[exempt]\njob_names = ["jupyter[*"]\n', "exempt.job_names"),
    ('[exempt]\nusers = "ann"\n', "exempt.users"),
    ('[messages]\nwarning = "{jobid.__class__}"\n', "messages.warning"),
    ('[messages]\nwarning = "{secret}"\n', "messages.warning"),
])
def test_bad_policy_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(ReportError) as err:
        parse_policy(text)
    assert key in str(err.value)
    assert err.value.exit_code == 2
    assert "\n" not in str(err.value)


def test_bad_policy_exits_2_before_any_query(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    policy = tmp_path / "policy.toml"
    policy.write_text('[idle]\ncancel_after = "10m"\n')
    # Nothing listens on this port: a query would exit 3, not 2.
    code = main(["enforce", "--policy", str(policy), "--prometheus-url", "http://127.0.0.1:9"])
    assert code == 2
    assert "idle.cancel_after" in capsys.readouterr().err


def test_exemptions_match_user_account_partition_qos_and_name_glob() -> None:
    policy = parse_policy('[exempt]\nusers = ["ann"]\naccounts = ["vip"]\n'
                          'partitions = ["debug"]\nqos = ["long"]\njob_names = ["jupyter-*"]\n')
    exempt = policy.exempt
    assert exempt.reason("ann", "lab", "gpu", "normal", "x") == "user ann"
    assert exempt.reason("bo", "vip", "gpu", "normal", "x") == "account vip"
    assert exempt.reason("bo", "lab", "gpu,debug", "normal", "x") == "partition debug"
    assert exempt.reason("bo", "lab", "gpu", "long", "x") == "qos long"
    assert exempt.reason("bo", "lab", "gpu", "normal", "jupyter-lab") is not None
    assert exempt.reason("bo", "lab", "gpu", "normal", "my-jupyter-lab") is None
    assert exempt.reason("bo", "lab", "gpu", "normal", "train") is None


def test_spans_read_as_written() -> None:
    assert [span(s) for s in (10, 90, 900, 3600, 5400)] == ["10s", "90s", "15m", "1h", "1h30m"]


def test_default_policy_command_prints_a_policy_that_parses(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["default-policy"]) == 0
    assert parse_policy(capsys.readouterr().out).cancel_after_s == 7200
