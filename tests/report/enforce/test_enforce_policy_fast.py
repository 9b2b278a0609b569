"""enforce's policy, idle windows and state file in words: every line a bad policy is
refused with, durations as people write them, the exact queries, what the answers make
of a job (its GPUs, doubts, windows at the coverage and staleness edges), and the state
file's JSON and its broken forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.enforce.idle_window import (
    JobIdleness,
    WindowUsage,
    idle_queries,
    jobs_from_answers,
)
from slurm_gpu_exporter.report.enforce.policy import (
    load_policy,
    parse_policy,
    parse_policy_duration,
    span,
)
from slurm_gpu_exporter.report.enforce.state import EnforceState
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.prometheus.queries import Filters

NOW = 1_800_000_000.0


def _refused(text: str, where: str = "the policy") -> str:
    with pytest.raises(ReportError) as caught:
        parse_policy(text, where)
    assert caught.value.exit_code == 2
    return str(caught.value)


@pytest.mark.parametrize(("text", "line"), [
    ("[idle]\nbusy_fraction = 1.0", "bad policy: idle.busy_fraction must be between 0 and 1, "
                                     "e.g. 0.01"),
    ('[idle]\nwarn_after = ["90m", "60m"]', "bad policy: idle.warn_after must grow: each "
                                            "warning after the one before"),
    ('[idle]\nwarn_after = ["60m", "60m"]', "bad policy: idle.warn_after must grow: each "
                                            "warning after the one before"),
    ('[idle]\nwarn_after = ["60m", "90m"]\ncancel_after = "90m"',
     "bad policy: idle.cancel_after must be later than the last idle.warn_after, so that "
     "users are warned before a cancel"),
    ('[idle]\nwarn_after = ["30m", "3h"]\ncancel_after = "2h"',
     "bad policy: idle.cancel_after must be later than the last idle.warn_after, so that "
     "users are warned before a cancel"),
    ('[idle]\nwarn_after = []\ncancel_after = "0s"', "bad policy: idle.warn_after and "
                                                     "idle.cancel_after must be longer than 0 s"),
    ('[idle]\nwarn_after = ["0s", "1m"]', "bad policy: idle.warn_after and idle.cancel_after "
                                          "must be longer than 0 s"),
    ("[idle]\nmax_cancels_per_run = -1", "bad policy: idle.max_cancels_per_run must be 0 or "
                                         "more"),
    ('[idle]\nwarn_after = ["1 h"]', 'bad policy: idle.warn_after = \'1 h\' is not a duration; '
                                     'use a number and a unit (s, m, h, d), e.g. "90m"'),
    ('[idle]\ncancel_after = "2x"', 'bad policy: idle.cancel_after = \'2x\' is not a duration; '
                                    'use a number and a unit (s, m, h, d), e.g. "90m"'),
    ('[idle]\nmin_job_age = "soon"', 'bad policy: idle.min_job_age = \'soon\' is not a '
                                     'duration; use a number and a unit (s, m, h, d), e.g. '
                                     '"90m"'),
    ('[idle]\nwarn_after = [60]', 'bad policy: idle.warn_after must be a string with a unit, '
                                  'e.g. "90m"'),
    ('[exempt]\njob_names = [""]', "bad policy: exempt.job_names must be a list of non-empty "
                                   "strings"),
    ("[exempt]\nusers = [1]", "bad policy: exempt.users must be a list of non-empty strings"),
    ("[exempt]\naccounts = [1]", "bad policy: exempt.accounts must be a list of non-empty "
                                 "strings"),
    ("[exempt]\npartitions = [1]", "bad policy: exempt.partitions must be a list of non-empty "
                                   "strings"),
    ("[exempt]\nqos = [1]", "bad policy: exempt.qos must be a list of non-empty strings"),
    ('[exempt]\njob_names = ["a[b"]', "bad policy: exempt.job_names has the bad pattern 'a[b' "
                                      "(unbalanced [ ]); use * ? and [abc]"),
    ('[exempt]\njob_names = ["a]b"]', "bad policy: exempt.job_names has the bad pattern 'a]b' "
                                      "(unbalanced [ ]); use * ? and [abc]"),
    ("[nope]\nx = 1", "bad policy: unknown section [nope]; known: idle, exempt, messages, "
                      "notify"),
    ("idle = 1", "bad policy: idle must be a table ([idle])"),
    ("[idle]\nbusy = 1", "bad policy: unknown key idle.busy; known: busy_fraction, warn_after, "
                         "cancel_after, min_job_age, max_cancels_per_run"),
    ('[idle]\nbusy_fraction = "x"', "bad policy: idle.busy_fraction has the wrong type (str)"),
    ("[idle]\nmax_cancels_per_run = true", "bad policy: idle.max_cancels_per_run has the "
                                           "wrong type (bool)"),
])
def test_a_bad_policy_is_refused_in_one_line(text: str, line: str) -> None:
    assert _refused(text) == line


def test_a_policy_that_is_no_toml_names_where_it_came_from(tmp_path: Path) -> None:
    assert _refused("[idle", "/etc/p.toml").startswith("bad TOML in /etc/p.toml: ")
    with pytest.raises(ReportError) as caught:
        parse_policy("[idle")
    assert str(caught.value).startswith("bad TOML in the policy: ")
    path = tmp_path / "p.toml"
    path.write_text("[idle")
    with pytest.raises(ReportError) as caught:
        load_policy(str(path))
    assert str(caught.value).startswith(f"bad TOML in {path}: ")
    with pytest.raises(ReportError) as caught:
        load_policy(str(tmp_path / "none.toml"))
    assert str(caught.value) == (f"cannot read the policy {tmp_path}/none.toml: No such file "
                                 "or directory; check --policy")


def test_a_policy_at_its_edges_is_taken_whole() -> None:
    policy = parse_policy('[idle]\nbusy_fraction = 0.5\nwarn_after = ["1s"]\n'
                          'cancel_after = "2s"\nmin_job_age = "0s"\nmax_cancels_per_run = 0\n'
                          '[exempt]\nusers = ["a"]\naccounts = ["b"]\npartitions = ["c"]\n'
                          'qos = ["d"]\njob_names = ["e*"]\n'
                          '[messages]\nwarning_subject = "ws"\nwarning = "w"\n'
                          'cancel_subject = "cs"\ncancel = "c"\n')
    assert (policy.busy_fraction, policy.warn_after_s, policy.cancel_after_s,
            policy.min_job_age_s, policy.max_cancels_per_run) == (0.5, (1.0,), 2.0, 0.0, 0)
    assert (policy.warning_subject, policy.warning, policy.cancel_subject, policy.cancel) == (
        "ws", "w", "cs", "c")
    exempt = policy.exempt
    assert (exempt.users, exempt.accounts, exempt.partitions, exempt.qos, exempt.job_names) == (
        {"a"}, {"b"}, {"c"}, {"d"}, ("e*",))
    assert exempt.reason("x", "x", "x,c", "x", "x") == "partition c"
    assert exempt.reason("x", "x", "x", "x", "eat") == "job name matches 'e*'"
    assert policy.relay is not None and policy.windows_s == (1.0, 2.0)


@pytest.mark.parametrize(("seconds", "text"), [
    (59, "59s"), (60, "1m"), (90, "90s"), (119, "119s"), (120, "2m"), (121, "2m"),
    (150, "2m"), (3600, "1h"), (5400, "1h30m"), (5430, "1h30m"), (86400, "24h"), (0, "0m"),
])
def test_a_span_as_people_write_it(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_durations_take_every_unit_and_sum_their_parts() -> None:
    assert parse_policy_duration(" 1h30m ", "k") == 5400.0
    assert parse_policy_duration("1.5d", "k") == 129600.0
    assert parse_policy_duration("90s", "k") == 90.0


# -- the queries and their answers --------------------------------------------------------

def test_the_queries_of_two_windows_with_a_site_node_label() -> None:
    sel = '{user="ann"}'
    busy, alloc = "slurm_job_gpu_busy_seconds_total", "slurm_job_gpu_allocated_seconds_total"
    assert idle_queries((3600.0, 5400.4), Filters(user="ann"), "host") == {
        "held": f"last_over_time({alloc}{sel}[5400s])",
        "fresh": f"timestamp({alloc}{sel})",
        "start": f"min by (jobid) (last_over_time(slurm_job_start_time_seconds{sel}[5400s]))",
        "up": f"max by (instance) (up{sel})",
        "last_sample": "max by (instance) "
                       f"(slurm_gpu_exporter_last_sample_timestamp_seconds{sel})",
        "busy_3600s": f"max_over_time({busy}{sel}[3600s]) - min_over_time({busy}{sel}[3600s])",
        "allocated_3600s": f"max_over_time({alloc}{sel}[3600s]) - "
                           f"min_over_time({alloc}{sel}[3600s])",
        "nvml_3600s": "min by (instance) (min_over_time(slurm_gpu_exporter_source_up"
                      '{source="nvml",user="ann"}[3600s]))',
        "busy_5400s": f"max_over_time({busy}{sel}[5400s]) - min_over_time({busy}{sel}[5400s])",
        "allocated_5400s": f"max_over_time({alloc}{sel}[5400s]) - "
                           f"min_over_time({alloc}{sel}[5400s])",
        "nvml_5400s": "min by (instance) (min_over_time(slurm_gpu_exporter_source_up"
                      '{source="nvml",user="ann"}[5400s]))'}
    assert "busy_1s" in idle_queries((0.4,), Filters())


def test_without_a_node_label_the_held_gpus_carry_their_agents_node() -> None:
    held = idle_queries((3600.0,), Filters())["held"]
    info = "last_over_time(slurm_gpu_exporter_node_info[3600s])"
    own = "last_over_time(slurm_job_gpu_allocated_seconds_total[3600s])"
    assert held == (
        f"(({own}) * on (instance, cluster) group_left (slurm_node) (max by (instance, "
        f"cluster, slurm_node) ({info}) and on (instance, cluster) (count by (instance, "
        f"cluster) (max by (instance, cluster, slurm_node) ({info})) == 1))) or ignoring "
        f"(slurm_node) ({own})")


W = 3600.0


def _answers(**over: list[Sample]) -> dict[str, list[Sample]]:
    gpu = {"jobid": "42", "user": "ann", "instance": "g1:9817", "gpu": "0"}
    base: dict[str, list[Sample]] = {
        "held": [Sample(gpu | {"slurm_node": "n1"}, 1.0)],
        "fresh": [Sample(gpu, NOW - 180)], "start": [Sample({"jobid": "42"}, NOW - 2 * W)],
        "up": [Sample({"instance": "g1:9817"}, 1.0)],
        "last_sample": [Sample({"instance": "g1:9817"}, NOW - 180)],
        "busy_3600s": [Sample(gpu, 28.0)], "allocated_3600s": [Sample(gpu, 0.8 * W)],
        "nvml_3600s": [Sample({"instance": "g1:9817"}, 1.0)]}
    return base | over


def _seen(answers: dict[str, list[Sample]]) -> JobIdleness:
    (job,) = jobs_from_answers(answers, (W,), 0.01, NOW)
    return job


def test_a_job_is_read_from_the_answers_at_the_edges_of_trust() -> None:
    job = _seen(_answers())
    assert (job.jobid, job.user, job.start, job.gpus, job.doubts) == (
        "42", "ann", NOW - 2 * W, [("g1:9817", "0")], [])
    assert job.node_of == {"g1:9817": "n1"} and job.fresh == [("g1:9817", "0")]
    assert job.nodes == ["n1"] and job.fresh_nodes == {"n1"}
    # 28 s busy of 2,880 s held is under 1 %; exactly 80 % of the window was covered.
    assert job.windows == [WindowUsage(W, True, None)]
    assert job.idle_for(NOW) == (W, None) and job.age(NOW) == 2 * W


def test_busy_exactly_at_the_fraction_is_not_idle() -> None:
    gpu = {"jobid": "42", "instance": "g1:9817", "gpu": "0"}
    job = _seen(_answers(busy_3600s=[Sample(gpu, 0.01 * 0.8 * W)]))
    assert job.windows == [WindowUsage(W, False, None)]


@pytest.mark.parametrize(("over", "doubts", "window"), [
    ({"fresh": [Sample({"jobid": "42", "instance": "g1:9817", "gpu": "0"}, NOW - 181)],
      "last_sample": [Sample({"instance": "g1:9817"}, NOW - 181)]},
     ["the agent on g1:9817 has no recent sample",
      "the series of GPU 0 on g1:9817 are stale or absent"], WindowUsage(W, True, None)),
    ({"up": [Sample({"instance": "g1:9817"}, 0.0)], "fresh": [], "start": []},
     ["the agent target g1:9817 is down", "the series of GPU 0 on g1:9817 are stale or absent",
      "no start time in the metrics"], WindowUsage(W, True, None)),
    ({"nvml_3600s": [Sample({"instance": "g1:9817"}, 0.0)]}, [],
     WindowUsage(W, False, "NVML was down on g1:9817 in the last 1h")),
    ({"allocated_3600s": [Sample({"jobid": "42", "instance": "g1:9817", "gpu": "0"},
                                 0.8 * W - 1)]}, [],
     WindowUsage(W, True, "the counters of GPU 0 on g1:9817 do not cover the last 1h")),
    ({"busy_3600s": []}, [],
     WindowUsage(W, True, "the counters of GPU 0 on g1:9817 do not cover the last 1h")),
])
def test_what_makes_a_job_doubtful_is_said(over: dict[str, list[Sample]], doubts: list[str],
                                           window: WindowUsage) -> None:
    job = _seen(_answers(**over))
    assert job.doubts == doubts and job.windows == [window]


def test_a_job_seen_on_two_gpus_lists_both_and_their_labels() -> None:
    two = {"jobid": "42", "user": "ann", "instance": "g1:9817", "gpu": "1"}
    job = _seen(_answers(held=_answers()["held"] + [Sample(two, 1.0)]))
    assert job.gpus == [("g1:9817", "0"), ("g1:9817", "1")]
    assert job.fresh == [("g1:9817", "0")]
    assert job.doubts == ["the series of GPU 1 on g1:9817 are stale or absent"]
    assert job.windows[0].doubt == "the counters of GPU 1 on g1:9817 do not cover the last 1h"


def test_a_window_longer_than_the_jobs_life_proves_nothing() -> None:
    job = JobIdleness("1", "u", NOW - W, windows=[WindowUsage(W, True, None),
                                                  WindowUsage(2 * W, True, None)])
    assert job.idle_for(NOW) == (W, None)
    assert JobIdleness("1", "u", None).age(NOW) is None
    assert JobIdleness("1", "u", NOW - W + 1, windows=[WindowUsage(W, True, None)]
                       ).idle_for(NOW) == (0.0, None)


# -- the state file ------------------------------------------------------------------------

def test_the_state_is_json_of_warnings_and_cancels(tmp_path: Path) -> None:
    path = tmp_path / "enforce.json"
    state = EnforceState(path)
    state.add_warning("42", 1.0)
    state.add_warning("42", 2.0)
    state.add_cancel("43", 3.0)
    assert json.loads(path.read_text()) == {"jobs": {"42": {"warnings": [1.0, 2.0]},
                                                     "43": {"cancelled": 3.0}}}
    assert EnforceState(path).warnings() == {"42": [1.0, 2.0], "43": []}
    state.keep_only({"43"})
    assert json.loads(path.read_text()) == {"jobs": {"43": {"cancelled": 3.0}}}
    path.unlink()
    state.keep_only({"43"})  # nothing gone: nothing written
    state.forget_warnings("nobody")
    assert not path.exists()


@pytest.mark.parametrize(("text", "why"), [
    ('{"jobs": []}', "jobs is not an object"), ('{"job": {}}', "'jobs'"),
    ("{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_a_broken_state_file_says_what_would_happen(tmp_path: Path, text: str,
                                                    why: str) -> None:
    path = tmp_path / "enforce.json"
    path.write_text(text)
    with pytest.raises(ReportError) as caught:
        EnforceState(path)
    assert str(caught.value) == (f"cannot read the enforce state {path}: {why}; fix it or move "
                                 "it away (warnings already sent would be sent again)")
    assert caught.value.exit_code == 2
