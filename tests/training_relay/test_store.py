"""The store's checks and limits, on payloads given directly (no socket)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

from slurm_gpu_exporter.training_relay import JobIdentity, RelayLimits, TrainingStore

ALICE = JobIdentity("101", "alice")
BOB = JobIdentity("202", "bob")


def _values(store: TrainingStore) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in store.families() for s in f.samples}


def _ingest(store: TrainingStore, job: JobIdentity, text: str) -> bool:
    return store.ingest(job, text.encode())


def test_names_get_the_prefix_once_and_identity_labels_are_the_agents():
    store = TrainingStore()
    _ingest(store, ALICE, '# TYPE tokens_total counter\n'
                          'tokens_total{jobid="9",user="eve",k="v"} 4\n'
                          'slurm_job_training_loss 0.25\n')
    assert _values(store) == {
        ("slurm_job_training_tokens_total", (("jobid", "101"), ("k", "v"), ("user", "alice"))): 4,
        ("slurm_job_training_loss", (("jobid", "101"), ("user", "alice"))): 0.25,
    }


def test_a_push_updates_its_series_and_keeps_the_jobs_others():
    store = TrainingStore()
    _ingest(store, ALICE, "a 1\nb 1\n")
    _ingest(store, ALICE, "a 2\n")
    assert _values(store) == {
        ("slurm_job_training_a", (("jobid", "101"), ("user", "alice"))): 2,
        ("slurm_job_training_b", (("jobid", "101"), ("user", "alice"))): 1,
    }


def test_families_are_rebuilt_only_after_a_change():
    store = TrainingStore()
    _ingest(store, ALICE, "a 1\n")
    first = store.families()
    assert store.families() is first  # no push since: the same list, not a rebuild
    _ingest(store, ALICE, "a 2\n")
    second = store.families()
    assert second is not first and _values(store)[
        ("slurm_job_training_a", (("jobid", "101"), ("user", "alice")))] == 2
    store.forget(ALICE.jobid)
    assert store.families() == []


def test_created_companions_and_timestamps_are_left_out():
    store = TrainingStore()
    _ingest(store, ALICE, "# TYPE c_total counter\nc_total 3 1000\n# TYPE c_created gauge\n"
                          "c_created 1.7e9\n# TYPE h histogram\n"
                          'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_count 2\nh_sum 3\n'
                          "# TYPE h_created gauge\nh_created 1.7e9\n")
    names = {name for name, _ in _values(store)}
    assert names == {"slurm_job_training_c_total", "slurm_job_training_h_bucket",
                     "slurm_job_training_h_count", "slurm_job_training_h_sum"}
    assert all(s.timestamp is None for f in store.families() for s in f.samples)


def test_series_over_the_job_limit_are_refused_counted_once_per_message():
    store = TrainingStore(RelayLimits(max_series_per_job=3))
    _ingest(store, ALICE, "".join(f'x{{i="{i}"}} 1\n' for i in range(10)))
    _ingest(store, ALICE, "".join(f'x{{i="{i}"}} 2\n' for i in range(10)))
    assert store.jobs() == {"101": 3}
    assert store.error_counts()["series"] == 2
    # Series it holds still update at the limit.
    assert set(_values(store).values()) == {2}
    # Another job has its own budget.
    _ingest(store, BOB, "y 1\n")
    assert store.jobs() == {"101": 3, "202": 1}


def test_bytes_over_the_job_budget_are_refused():
    store = TrainingStore(RelayLimits(max_bytes_per_job=1000))
    _ingest(store, ALICE, "".join(f'x{{v="{"z" * 100}{i}"}} 1\n' for i in range(20)))
    assert 0 < store.jobs()["101"] < 20
    assert store.error_counts()["series"] == 1


def test_bad_names_and_labels_are_refused_and_the_rest_kept():
    store = TrainingStore(RelayLimits(max_labels=2, max_label_length=10, max_name_length=40))
    _ingest(store, ALICE, 'many{a="1",b="2",c="3"} 1\n'
                          'longvalue{a="12345678901"} 1\n'
                          'a_very_long_metric_name_that_goes_on 1\n'
                          '# TYPE h histogram\nh_bucket 1\nh_count 1\n'
                          'fine{a="1",b="2",jobid="x"} 1\n')
    assert set(_values(store)) == {
        ("slurm_job_training_fine", (("a", "1"), ("b", "2"), ("jobid", "101"), ("user", "alice"))),
        ("slurm_job_training_h_count", (("jobid", "101"), ("user", "alice"))),
    }
    assert store.error_counts()["labels"] == 1


def test_oversized_and_unparsable_messages_are_refused_whole():
    store = TrainingStore(RelayLimits(max_message_bytes=100))
    assert not store.ingest(ALICE, b"x 1\n" * 40)
    assert not store.ingest(ALICE, b"x{ 1\n")
    assert not store.ingest(ALICE, b"\xff\xfe 1\n")
    assert store.families() == []
    counts = store.error_counts()
    assert (counts["size"], counts["parse"]) == (1, 2)


def test_one_type_per_name_across_jobs_and_well_known_types_fixed():
    store = TrainingStore()
    _ingest(store, ALICE, "# TYPE shared gauge\nshared 1\n")
    _ingest(store, BOB, "# TYPE shared_total counter\nshared_total 1\n")
    _ingest(store, BOB, "# TYPE steps gauge\nsteps 5\n")  # steps is a counter
    assert store.jobs() == {"101": 1}
    assert store.error_counts()["type"] == 2  # once for each of BOB's messages
    store.forget("101")
    _ingest(store, BOB, "# TYPE shared_total counter\nshared_total 1\n")  # the name is free
    assert store.jobs() == {"202": 1}


def test_an_untyped_line_for_a_gauge_name_is_that_gauge():
    store = TrainingStore()
    _ingest(store, ALICE, "slurm_job_training_loss 0.5\n")
    _ingest(store, BOB, "# TYPE g gauge\ng 1\n")
    _ingest(store, ALICE, "g 2\n")
    assert {f.name: f.type for f in store.families()} == {
        "slurm_job_training_loss": "gauge", "slurm_job_training_g": "gauge"}
    assert store.jobs() == {"101": 2, "202": 1}


def test_a_job_changing_a_familys_type_replaces_it():
    store = TrainingStore()
    _ingest(store, ALICE, "# TYPE v gauge\nv 1\n")
    _ingest(store, ALICE, "# TYPE v_total counter\nv_total 2\n")
    assert _values(store) == {
        ("slurm_job_training_v_total", (("jobid", "101"), ("user", "alice"))): 2}
    assert store.jobs() == {"101": 1}


def test_forget_drops_series_and_rate_budget():
    clock = [0.0]
    store = TrainingStore(RelayLimits(messages_per_second=1, message_burst=1),
                          clock=lambda: clock[0])
    assert store.admit("101") == 0.0
    assert store.admit("101") == 1.0
    _ingest(store, ALICE, "x 1\n")
    store.forget("101")
    assert store.families() == []
    assert store.admit("101") == 0.0  # a fresh budget
    assert store.error_counts()["rate"] == 1


def test_line_budget_bounds_big_messages_and_long_ones_are_refused():
    clock = [0.0]
    store = TrainingStore(RelayLimits(lines_per_second=100, line_burst=300,
                                      max_lines_per_message=250), clock=lambda: clock[0])
    assert store.admit("101", 200) == 0.0
    assert store.admit("101", 200) == 1.0  # 100 lines left; 100 more come in 1 s
    clock[0] = 1.0
    assert store.admit("101", 200) == 0.0
    assert not store.ingest(ALICE, b"x 1\n" * 251)
    assert store.error_counts()["size"] == 1
    assert store.error_counts()["rate"] == 1


def test_rate_budget_refills_with_time():
    clock = [0.0]
    store = TrainingStore(RelayLimits(messages_per_second=2, message_burst=2),
                          clock=lambda: clock[0])
    assert [store.admit("101") for _ in range(3)] == [0.0, 0.0, 0.5]
    clock[0] = 0.5
    assert store.admit("101") == 0.0
    assert store.admit("101") == 0.5


def test_help_text_is_cut_to_the_limit():
    store = TrainingStore(RelayLimits(max_help_length=5))
    _ingest(store, ALICE, "# HELP x a long help text\nx 1\n")
    assert store.families()[0].documentation == "a lon"


def test_every_accepted_family_renders_as_valid_openmetrics():
    store = TrainingStore()
    _ingest(store, ALICE, '# TYPE c_total counter\nc_total{k="a\\"b"} 3\n'
                          "# TYPE g gauge\ng NaN\nuntyped_thing 4\n"
                          '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 2\nh_sum 3\n'
                          '# TYPE s summary\ns{quantile="0.5"} 1\ns_count 2\ns_sum 3\n')
    _ingest(store, BOB, "# TYPE c_total counter\nc_total 1\n")

    class Relayed:
        def collect(self):
            return store.families()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Relayed())
    parsed = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert set(parsed) == {"slurm_job_training_c", "slurm_job_training_g",
                           "slurm_job_training_untyped_thing", "slurm_job_training_h",
                           "slurm_job_training_s"}
    assert len(parsed["slurm_job_training_c"].samples) == 2
