"""A Slurm job's identity: what squeue and the agent print, the one target an action
names, the id users know, and what is refused."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId

UNSET = {"set": False, "infinite": False, "number": 0}


def num(n: int) -> dict[str, object]:
    return {"set": True, "infinite": False, "number": n}


# What squeue --json printed on Slurm 22.05 (ints, 0 or null for none: an array of two
# whose task 1 started last and kept the array's id, a het job of two), and prints on 23.11+.
PLAIN_2205 = {"job_id": 240, "array_job_id": 0, "array_task_id": None,
              "het_job_id": 0, "het_job_offset": 0}
TASK_2205 = {"job_id": 243, "array_job_id": 243, "array_task_id": 1,
             "het_job_id": 0, "het_job_offset": 0}
SIBLING_2205 = {"job_id": 244, "array_job_id": 243, "array_task_id": 0,
                "het_job_id": 0, "het_job_offset": 0}
HET_2205 = {"job_id": 301, "array_job_id": 0, "array_task_id": None, "het_job_id": 300,
            "het_job_offset": 1, "het_job_id_set": "300-301"}
PLAIN_2311 = {"job_id": 240, "array_job_id": num(0), "array_task_id": UNSET,
              "het_job_id": num(0), "het_job_offset": UNSET}
TASK_2311 = {"job_id": 243, "array_job_id": num(243), "array_task_id": num(1),
             "het_job_id": num(0), "het_job_offset": UNSET}
REMAINDER_2311 = {"job_id": 250, "array_job_id": num(250), "array_task_id": UNSET,
                  "array_task_string": "2-5"}
HET_2311 = {"job_id": 300, "array_job_id": num(0), "array_task_id": UNSET,
            "het_job_id": num(300), "het_job_offset": num(0), "sluid": "sEKNKTV3WPV500"}


@pytest.mark.parametrize(("record", "want"), [
    (PLAIN_2205, SlurmJobId("240")),
    (TASK_2205, SlurmJobId("243", "243", "1")),
    (SIBLING_2205, SlurmJobId("244", "243", "0")),
    (HET_2205, SlurmJobId("301", het_job_id="300", het_job_offset="1")),
    (PLAIN_2311, SlurmJobId("240")),
    (TASK_2311, SlurmJobId("243", "243", "1")),
    (REMAINDER_2311, SlurmJobId("250", "250")),
    (HET_2311, SlurmJobId("300", het_job_id="300", het_job_offset="0",
                          sluid="sEKNKTV3WPV500")),
    ({"job_id": 7}, SlurmJobId("7")),  # a release that prints none of the fields
    ({"job_id": 7, "array_job_id": 0, "array_task_id": 4294967294}, SlurmJobId("7")),
    ({"job_id": 7, "step_id": {"sluid": "s0000000000000"}},
     SlurmJobId("7", sluid="s0000000000000")),
])
def test_squeue_json_of_every_release_gives_the_identity(record: dict[str, object],
                                                        want: SlurmJobId) -> None:
    assert SlurmJobId.from_squeue(record) == want


@pytest.mark.parametrize(("ident", "target", "display"), [
    (SlurmJobId("240"), "240", "240"),
    # The task holding the array's id: its bare id would name every task of the array.
    (SlurmJobId("243", "243", "1"), "243_1", "243_1"),
    (SlurmJobId("244", "243", "0"), "243_0", "243_0"),
    # A het component is acted on only as its whole het job, under the leader's id.
    (SlurmJobId("301", het_job_id="300", het_job_offset="1"), "300", "300+1"),
    (SlurmJobId("300", het_job_id="300", het_job_offset="0"), "300", "300+0"),
    # The array's unsplit remainder: no id names it alone.
    (SlurmJobId("250", "250"), None, "250"),
])
def test_target_names_exactly_the_job_and_display_is_as_users_know_it(
        ident: SlurmJobId, target: str | None, display: str) -> None:
    assert (ident.target, ident.display) == (target, display)


def test_the_agents_labels_give_the_same_identity_as_squeue() -> None:
    labels = {"jobid": "243", "array_job_id": "243", "array_task_id": "1", "user": "ann"}
    assert SlurmJobId.from_labels(labels) == SlurmJobId.from_squeue(TASK_2205)
    assert SlurmJobId.from_labels({"jobid": "240", "array_job_id": "",
                                   "array_task_id": ""}) == SlurmJobId("240")
    # A task id without its array says nothing about which array.
    assert SlurmJobId.from_labels({"jobid": "240", "array_task_id": "3"}) == SlurmJobId("240")


@pytest.mark.parametrize("fields", [
    {"job_id": ""}, {"job_id": "0"}, {"job_id": "012"}, {"job_id": "-1"},
    {"job_id": "1_2"}, {"job_id": "1 "}, {"job_id": "4294967294"}, {"job_id": "\u0661"},
    {"job_id": "1", "array_job_id": "1;x"}, {"job_id": "1", "array_job_id": "--all"},
    {"job_id": "1", "array_job_id": "1", "array_task_id": "1-3"},
    {"job_id": "1", "array_job_id": "1", "array_task_id": "4294967294"},
    {"job_id": "1", "array_task_id": "2"},  # a task without its array
    {"job_id": "1", "het_job_id": "1"},  # a het job without its offset
    {"job_id": "1", "het_job_offset": "0"},
    {"job_id": "2", "het_job_id": "1", "het_job_offset": "+1"},
    {"job_id": "1", "array_job_id": "1", "array_task_id": "0", "het_job_id": "1",
     "het_job_offset": "0"},  # Slurm has no het arrays
    {"job_id": "1", "sluid": "sekNKTV3WPV500"}, {"job_id": "1", "sluid": "x"},
])
def test_values_that_are_not_slurms_are_refused(fields: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        SlurmJobId(**fields)


@pytest.mark.parametrize("record", [
    {}, {"job_id": None}, {"job_id": "243"}, {"job_id": True}, {"job_id": -1},
    {"job_id": 1.5}, {"job_id": 243, "array_job_id": "243"},
    {"job_id": 243, "array_job_id": {"number": 243}},  # no "set": a shape we do not know
    {"job_id": 243, "array_job_id": 243, "array_task_id": "1"},
    {"job_id": 301, "het_job_id": 300},  # a component without its offset
    {"job_id": 301, "het_job_id": 300, "het_job_offset": UNSET},
    {"job_id": 1, "sluid": "not a sluid"},
])
def test_squeue_records_that_do_not_make_an_identity_are_refused(
        record: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SlurmJobId.from_squeue(record)
