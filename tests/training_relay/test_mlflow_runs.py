"""The client's MLflow side (training_mlflow.py) and what the agent makes of the run it
names (training_relay/payload.py), without MLflow: a stand-in module in sys.modules."""

from __future__ import annotations

import types
from collections.abc import Mapping

import pytest

from slurm_gpu_exporter import training_mlflow as tm
from slurm_gpu_exporter.training_relay import JobIdentity, TrainingStore

RUN = "0123456789abcdef0123456789abcdef"
JOB = {"SLURM_JOB_ID": "4242", "SLURM_CLUSTER_NAME": "alpha"}


class FakeMlflow(types.ModuleType):
    """What the client reads of mlflow: active_run() and a run's info."""

    def __init__(self) -> None:
        super().__init__("mlflow")
        self.run: types.SimpleNamespace | None = None

    def start(self, run_id: str, experiment_id: str) -> None:
        self.run = types.SimpleNamespace(
            info=types.SimpleNamespace(run_id=run_id, experiment_id=experiment_id))

    def active_run(self) -> types.SimpleNamespace | None:
        return self.run


@pytest.fixture
def mlflow(monkeypatch: pytest.MonkeyPatch) -> FakeMlflow:
    fake = FakeMlflow()
    monkeypatch.setitem(__import__("sys").modules, "mlflow", fake)
    return fake


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(environ: Mapping[str, str], tagged: list) -> tuple[tm.RunWatch, Clock]:
    clock = Clock()
    return tm.RunWatch(environ, lambda run, tags: tagged.append((run, dict(tags))),
                       clock), clock


def test_job_tags_name_the_job_its_cluster_and_figures_pending():
    assert tm.job_tags(JOB) == {"slurm.job_id": "4242", "slurm.cluster": "alpha",
                                "slurm.figures": "pending"}


def test_an_array_task_is_tagged_with_its_own_id_and_as_users_name_it():
    tags = tm.job_tags({"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4200",
                        "SLURM_ARRAY_TASK_ID": "7"})
    assert tags["slurm.job_id"] == "4243" and tags["slurm.array_task"] == "4200_7"


def test_outside_a_job_there_are_no_tags():
    assert tm.job_tags({}) == {}
    assert tm.job_tags({"SLURM_JOB_ID": "12; rm"}) == {}


@pytest.mark.parametrize(("base", "link"), [
    ("", ""),
    ("grafana.example.org/d/job", ""),  # not a URL: no guess
    ("https://g.example.org/d/job?orgId=1", "https://g.example.org/d/job?orgId=1&var-jobid=4242"),
    ("https://g.example.org/d/job", "https://g.example.org/d/job?var-jobid=4242"),
    ("https://g.example.org/job/{jobid}/", "https://g.example.org/job/4242/"),
])
def test_the_dashboard_link_is_the_sites_url_or_none(base, link):
    assert tm.dashboard_link(base, "4242") == link
    assert (tm.TAG_DASHBOARD in tm.job_tags({**JOB, tm.DASHBOARD_ENV: base})) == bool(link)


def test_without_mlflow_imported_no_run_is_looked_for(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "mlflow", raising=False)
    tagged: list = []
    watch, _ = _watch(JOB, tagged)
    assert watch.observe() is False and list(watch.collect()) == []


def test_an_active_run_is_tagged_once_and_named_to_the_agent(mlflow):
    tagged: list = []
    watch, clock = _watch(JOB, tagged)
    assert watch.observe() is False  # no run active yet
    mlflow.start(RUN, "3")
    assert watch.observe() is False  # checked again only after the interval
    clock.now += tm.CHECK_INTERVAL
    assert watch.observe() is True
    watch.tag_new_runs()
    clock.now += tm.CHECK_INTERVAL
    assert watch.observe() is False  # the same run: nothing new
    watch.tag_new_runs()
    assert tagged == [(tm.ActiveRun(RUN, "3"), tm.job_tags(JOB))]
    [family] = watch.collect()
    assert family.name == "slurm_job_training_mlflow_run_info"
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"run_id": RUN, "experiment_id": "3"}, 1)]


def test_a_failed_tagging_is_logged_not_raised_and_the_run_still_named(mlflow, caplog):
    def refuse(run: tm.ActiveRun, tags: Mapping[str, str]) -> None:
        raise ConnectionError("tracking server down")

    watch = tm.RunWatch(JOB, refuse, Clock())
    mlflow.start(RUN, "0")
    assert watch.observe() is True
    watch.tag_new_runs()
    assert "not tagged with its Slurm job: tracking server down" in caplog.text
    assert len(list(watch.collect())) == 1


def test_outside_a_job_a_run_is_named_but_not_tagged(mlflow):
    tagged: list = []
    watch, _ = _watch({}, tagged)
    mlflow.start(RUN, "0")
    assert watch.observe() is True
    watch.tag_new_runs()
    assert tagged == []


# --- the agent's side --------------------------------------------------------------

ALICE = JobIdentity("101", "alice")


def _runs(text: str) -> tuple[dict, dict[str, int]]:
    store = TrainingStore()
    store.ingest(ALICE, text.encode())
    found = {tuple(sorted(s.labels.items())): s.value for f in store.families()
             for s in f.samples if s.name == "slurm_job_mlflow_run_info"}
    return found, store.error_counts()


def test_the_agent_shows_the_run_with_the_jobs_own_identity():
    found, errors = _runs(f'# TYPE slurm_job_training_mlflow_run_info gauge\n'
                          f'slurm_job_training_mlflow_run_info{{run_id="{RUN}",'
                          f'experiment_id="12",jobid="9",user="eve"}} 1\n')
    assert found == {(("experiment_id", "12"), ("jobid", "101"), ("run_id", RUN),
                      ("user", "alice")): 1}
    assert sum(errors.values()) == 0


@pytest.mark.parametrize("labels", [
    f'run_id="{RUN.upper()}",experiment_id="1"',  # MLflow's run ids are lower-case hex
    f'run_id="{RUN[:-1]}",experiment_id="1"',
    f'run_id="{RUN}",experiment_id="1x"',
    f'run_id="{RUN}",experiment_id="01"',
    f'run_id="{RUN}"',
    f'run_id="{RUN}",experiment_id="1",note="x"',
    'run_id="<script>",experiment_id="1"',
])
def test_a_run_label_of_another_shape_is_refused_and_counted(labels):
    found, errors = _runs(f"mlflow_run_info{{{labels}}} 1\n")
    assert found == {} and errors["labels"] == 1


def test_a_run_info_value_other_than_one_is_refused():
    found, errors = _runs(f'mlflow_run_info{{run_id="{RUN}",experiment_id="1"}} 2\n')
    assert found == {} and errors["labels"] == 1


def test_a_counter_under_the_run_info_name_is_refused():
    found, errors = _runs("# TYPE mlflow_run_info counter\nmlflow_run_info_total 1\n")
    assert found == {} and errors["type"] == 1
