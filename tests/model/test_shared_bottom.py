"""The bottom layer every product imports (``model/``): the forms of a job id each caller
takes, the two sets of user names, the munge wire format and the optional extras. Each
caller's check is the model's, and each set is what that caller took before it moved
here (the differences between the sets are on purpose, and shown below)."""

from __future__ import annotations

import re

import pytest

from slurm_gpu_exporter.mail import summary
from slurm_gpu_exporter.model import extras, ids, munge_wire, users
from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.proxy import archive
from slurm_gpu_exporter.report.prometheus import array_tasks, queries
from slurm_gpu_exporter.report.slurm import actions

# Each caller's compiled check, by the model's pattern it compiles.
CALLERS = [
    (archive.JOBID, ids.NAMED_JOB),
    (summary.JOBID, ids.JOB_ID_DIGITS),
    (queries._JOBID_RE, ids.JOB_ID_CHARS),
    (array_tasks.ARRAY_TASK_RE, ids.ARRAY_TASK),
]


@pytest.mark.parametrize(("compiled", "pattern"), CALLERS)
def test_each_caller_checks_job_ids_with_the_models_pattern(compiled: re.Pattern[str],
                                                            pattern: str) -> None:
    assert compiled.pattern == pattern


# text: (proxy's archive, mail, report's PromQL, array task), as each took it before.
ACCEPTED = {
    "1234": (True, True, True, False),
    "123456789012": (True, True, True, False),
    "1234567890123": (False, False, True, False),
    "0": (False, True, True, False),
    "0123": (False, True, True, False),
    "1234_5": (True, False, True, True),
    "1234_05": (True, False, True, True),
    "1234_1234567890": (False, False, True, True),
    "1234+1": (True, False, True, False),
    "1234+12345": (False, False, True, False),
    "1234.0": (False, False, True, False),
    "sEKNKTV3WPV500": (False, False, True, False),
    "\u0661\u0662": (False, True, False, False),  # Arabic-Indic digits: re's \d
    "12 OR 1": (False, False, False, False),
    '1"}': (False, False, False, False),
    "": (False, False, False, False),
}


@pytest.mark.parametrize("text", sorted(ACCEPTED))
def test_each_caller_takes_the_job_ids_it_always_took(text: str) -> None:
    taken = tuple(compiled.fullmatch(text) is not None for compiled, _ in CALLERS)
    assert taken == ACCEPTED[text]


def test_array_task_groups_are_the_array_and_the_task() -> None:
    match = re.fullmatch(ids.ARRAY_TASK, "1234_5")
    assert match is not None and match.groups() == ("1234", "5")


@pytest.mark.parametrize(("text", "named"), [
    ("1234", True), ("1234_5", True), ("1234_0", True), ("4294967293", True),
    ("4294967294", False), ("0", False), ("0123_4", False), ("1234_", False),
    ("1234_x", False), ("1234_\u0661", False), ("_5", False), ("1234+1", False),
    ("-1", False), ("", False),
])
def test_a_job_target_is_a_job_id_or_an_array_task(text: str, named: bool) -> None:
    assert ids.is_job_target(text) is named


def test_every_target_slurm_job_id_makes_is_one() -> None:
    for ident in (SlurmJobId("7"), SlurmJobId("8", "7", "0"), SlurmJobId("9", "7", "12"),
                  SlurmJobId("10", het_job_id="10", het_job_offset="0"),
                  SlurmJobId("11", het_job_id="10", het_job_offset="1")):
        assert ident.target is not None and ids.is_job_target(ident.target), ident
    assert actions._checked_target(SlurmJobId("9", "7", "12")) == "7_12"


@pytest.mark.parametrize(("name", "caller", "mailable"), [
    ("alice", True, True),
    ("_svc", True, True),
    ("a.b-c_1", True, True),
    ("alice@example.org", True, False),  # a Grafana login: not a mail address's user
    ("a+b", True, False),
    ("a" * 64, True, True),
    ("a" * 65, True, False),
    ("a" * 128, True, False),
    ("a" * 129, False, False),
    ("-alice", False, False),
    (".alice", False, False),
    ("al ice", False, False),
    ("a,b", False, False),
    ("<a>", False, False),
    ("", False, False),
    ("\u00e9mile", False, False),
])
def test_user_names_the_proxy_and_the_mail_take(name: str, caller: bool,
                                                mailable: bool) -> None:
    assert users.is_user_name(name) is caller
    assert users.is_mailable_user(name) is mailable


def test_the_munge_header_carries_one_credential_both_ways() -> None:
    credential = "MUNGE:AwQFAAB+abc/9==:"
    header = munge_wire.authorization(credential)
    assert header == "Munge MUNGE:AwQFAAB+abc/9==:"
    assert munge_wire.credential_in(header) == credential
    assert munge_wire.credential_in(header + "  ") == credential
    assert munge_wire.credential_in("Munge ") == ""
    for other in ("Basic YTpi", "Bearer x", "munge MUNGE:x:", "MungeMUNGE:x:"):
        assert munge_wire.credential_in(other) is None


def test_a_credential_is_munges_text_form_within_the_cap() -> None:
    body = "A" * (munge_wire.MAX_CREDENTIAL_CHARS - len("MUNGE::"))
    assert munge_wire.is_credential(f"MUNGE:{body}:")
    assert not munge_wire.is_credential(f"MUNGE:{body}A:")
    assert not munge_wire.is_credential("MUNGE:abc")


def test_the_payload_names_the_proxy_in_its_canonical_form() -> None:
    assert munge_wire.payload("HTTPS://Proxy.example.org:443/") == \
        "slurm-gpu-proxy https://proxy.example.org"


@pytest.mark.parametrize(("name", "library"), [
    ("sqlalchemy", "sqlalchemy"), ("sqlalchemy.orm", "sqlalchemy"), ("psycopg", "psycopg"),
    ("psycopg_binary", "psycopg_binary"), ("greenlet", "greenlet"),
    ("yaml", None), ("slurm_gpu_exporter.report.archive.store", None), (None, None),
])
def test_a_missing_archive_library_is_told_apart_from_a_bug(name: str | None,
                                                            library: str | None) -> None:
    assert extras.missing_archive_library(ModuleNotFoundError("x", name=name)) == library


def test_the_install_hint_names_this_environments_pip_and_the_extra() -> None:
    hint = extras.archive_install_hint()
    assert hint.endswith("/bin/pip install 'slurm-gpu-exporter[archive]'")
