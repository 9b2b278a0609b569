"""The wrapper's config: a wrong key costs only itself (above all, never the site's
mailer), times are clamped into slurmctld's 120 s, and ``--check`` names every problem's
key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurm_gpu_exporter.mail.budget import mailer_time, summary_time_left
from slurm_gpu_exporter.mail.check import check_main
from slurm_gpu_exporter.mail.config import MailConfig, load_mail_config

SITE_MAILER = "/opt/site/bin/sendmail-wrapper"


def _load(tmp_path: Path, text: str):
    path = tmp_path / "mail.toml"
    path.write_text(text)
    return load_mail_config(path)


def _keys(loaded) -> list[str]:
    return [problem.key for problem in loaded.problems]


def test_an_absent_file_is_the_defaults_without_a_problem(tmp_path: Path) -> None:
    loaded = load_mail_config(tmp_path / "absent.toml")
    assert (loaded.config, loaded.problems, loaded.found) == (MailConfig(), (), False)
    assert loaded.config.mailer == "/usr/bin/mail"


def test_a_clean_file_is_read_whole(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f'mailer = "{SITE_MAILER}"\nsummary_timeout_seconds = 5\n'
                             'report_args = ["--no-sacct"]\nmailer_timeout_seconds = 30\n'
                             'log_file = "/var/log/m.log"\nprometheus_url = "http://p:9090"\n')
    assert loaded.problems == ()
    config = loaded.config
    assert (config.mailer, config.summary_timeout_s, config.mailer_timeout_s,
            config.report_args, config.log_file, config.prometheus_url) == (
        SITE_MAILER, 5.0, 30.0, ("--no-sacct",), Path("/var/log/m.log"), "http://p:9090")


def test_a_misspelt_key_keeps_the_mailer_and_every_other_setting(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f'mailer = "{SITE_MAILER}"\nsumary_timeout_seconds = 5\n'
                             'report_args = ["--no-sacct"]\n')
    assert loaded.config.mailer == SITE_MAILER
    assert loaded.config.report_args == ("--no-sacct",)
    assert loaded.config.summary_timeout_s == 10.0  # the misspelt one: its default
    [problem] = loaded.problems
    assert problem.key == "sumary_timeout_seconds"
    assert "did you mean 'summary_timeout_seconds'" in problem.message
    assert problem.line(tmp_path / "mail.toml").startswith(
        f"{tmp_path / 'mail.toml'}: sumary_timeout_seconds: ")


@pytest.mark.parametrize("bad, key", [
    ('summary_timeout_seconds = "5"\n', "summary_timeout_seconds"),
    ("summary_timeout_seconds = 0\n", "summary_timeout_seconds"),
    ("mailer_timeout_seconds = true\n", "mailer_timeout_seconds"),
    ('report_args = "--no-sacct"\n', "report_args"),
    ("report_args = [1]\n", "report_args"),
    ('report = "slurm-gpu-report"\n', "report"),
    ('log_file = "mail.log"\n', "log_file"),
    ('[mail]\nmailer = "/x"\n', "mail"),  # a table: an unknown key, its mailer no mailer
])
def test_a_wrong_value_costs_only_its_own_key(tmp_path: Path, bad: str, key: str) -> None:
    loaded = _load(tmp_path, f'mailer = "{SITE_MAILER}"\nprometheus_url = "http://p:9090"\n'
                             f"{bad}")
    assert (loaded.config.mailer, loaded.config.prometheus_url) == (SITE_MAILER,
                                                                    "http://p:9090")
    assert _keys(loaded) == [key]


def test_a_wrong_type_of_a_time_falls_back_to_its_default_alone(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f'mailer = "{SITE_MAILER}"\nmailer_timeout_seconds = "30"\n'
                             "summary_timeout_seconds = 7\n")
    assert (loaded.config.mailer, loaded.config.summary_timeout_s,
            loaded.config.mailer_timeout_s) == (SITE_MAILER, 7.0, 40.0)
    assert _keys(loaded) == ["mailer_timeout_seconds"]


@pytest.mark.parametrize("mailer", ['"mail"', '"sendmail -t"', "42", '""'])
def test_a_mailer_that_is_no_absolute_path_falls_back_to_usr_bin_mail(
        tmp_path: Path, mailer: str) -> None:
    loaded = _load(tmp_path, f"mailer = {mailer}\nsummary_timeout_seconds = 7\n")
    assert loaded.config.mailer == "/usr/bin/mail"
    assert loaded.config.summary_timeout_s == 7.0
    assert _keys(loaded) == ["mailer"]
    assert "/usr/bin/mail" in loaded.problems[0].message


def test_a_quoted_key_cannot_start_a_log_line_of_its_own(tmp_path: Path) -> None:
    loaded = _load(tmp_path, '"x\\njob 1: mail sent" = 1\n')
    [line] = [problem.line(tmp_path / "m.toml") for problem in loaded.problems]
    assert "\n" not in line and line.startswith(f"{tmp_path / 'm.toml'}: x?job 1: mail sent: ")


def test_a_syntax_error_keeps_a_plain_mailer_line(tmp_path: Path) -> None:
    loaded = _load(tmp_path, f'# site\nmailer = "{SITE_MAILER}"   # ours\n'
                             "prometheus_url = http://unquoted:9090\n")
    assert loaded.config == MailConfig(mailer=SITE_MAILER)
    [problem] = loaded.problems
    assert "not valid TOML" in problem.message and SITE_MAILER in problem.message


def test_a_file_that_is_not_utf8_keeps_its_plain_mailer_line(tmp_path: Path) -> None:
    path = tmp_path / "mail.toml"
    path.write_bytes(f'mailer = "{SITE_MAILER}"\n# caf\xe9\n'.encode("latin-1"))
    loaded = load_mail_config(path)
    assert loaded.config.mailer == SITE_MAILER
    assert "not valid TOML (not UTF-8)" in loaded.problems[0].message


@pytest.mark.parametrize("text", [
    'mailer = "/a"\nmailer = "/b"\nx = \n',  # which one? neither
    '[table]\nmailer = "/a"\nx = \n',  # not the top-level key
    'mailer = "/a\\"b"\nx = \n',  # an escape: not the plain form
    "mailer = 'relative'\nx = \n",
    'mailer = "/a" trailing\n',
])
def test_a_syntax_error_reads_back_no_mailer_it_is_not_sure_of(tmp_path: Path,
                                                               text: str) -> None:
    loaded = _load(tmp_path, text)
    assert loaded.config.mailer == "/usr/bin/mail"
    assert len(loaded.problems) == 1


def test_times_over_their_most_are_clamped_not_dropped(tmp_path: Path) -> None:
    loaded = _load(tmp_path, "summary_timeout_seconds = 600\nmailer_timeout_seconds = 30\n")
    assert (loaded.config.summary_timeout_s, loaded.config.mailer_timeout_s) == (60.0, 30.0)
    assert _keys(loaded) == ["summary_timeout_seconds"]
    loaded = _load(tmp_path, "mailer_timeout_seconds = 120\n")  # the old documented default
    assert (loaded.config.summary_timeout_s, loaded.config.mailer_timeout_s) == (10.0, 90.0)
    assert _keys(loaded) == ["mailer_timeout_seconds"]


def test_summary_and_mailer_over_the_shared_budget_cut_the_summary(tmp_path: Path) -> None:
    loaded = _load(tmp_path, "summary_timeout_seconds = 50\nmailer_timeout_seconds = 80\n")
    # 100 s for both: the mailer keeps its 80, the summary gets the 20 left
    assert (loaded.config.summary_timeout_s, loaded.config.mailer_timeout_s) == (20.0, 80.0)
    assert _keys(loaded) == ["summary_timeout_seconds"]
    assert "the summary gets 20" in loaded.problems[0].message
    within = _load(tmp_path, "summary_timeout_seconds = 60\nmailer_timeout_seconds = 40\n")
    assert within.problems == () and within.config.summary_timeout_s == 60.0


def test_every_accepted_config_ends_inside_slurmctlds_120_seconds(tmp_path: Path) -> None:
    for summary in (1, 10, 30, 60, 600):
        for mailer in (1, 40, 89, 90, 120, 3600):
            config = _load(tmp_path, f"summary_timeout_seconds = {summary}\n"
                                     f"mailer_timeout_seconds = {mailer}\n").config
            # the worst case: the summary runs to its very end, the mailer to its limit
            summary_end = summary_time_left(config.summary_timeout_s,
                                            config.mailer_timeout_s, 0.0)
            mailer_s = mailer_time(config.mailer_timeout_s, summary_end)
            assert summary_end + mailer_s <= 100, (summary, mailer)
            assert mailer_s == config.mailer_timeout_s  # the mailer keeps its whole time


def test_the_summary_gets_what_the_mailer_leaves_and_the_mailer_its_time() -> None:
    assert summary_time_left(10, 40, 0.0) == 10
    assert summary_time_left(10, 40, 4.0) == 6  # stdin and the config took 4 s
    assert summary_time_left(60, 90, 1.0) == 9  # 100 - 90 - 1
    assert summary_time_left(10, 40, 9.8) == 0  # too little left to try
    assert mailer_time(40, 12.0) == 40
    assert mailer_time(40, 95.0) == 15  # a summary far past its end: stop by 110 s
    assert mailer_time(40, 500.0) == 1


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    status = check_main(["--check", *args])
    out, err = capsys.readouterr()
    return status, err.splitlines(), out


def test_check_names_each_problems_key_and_exits_non_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mail.toml"
    path.write_text(f'mailr = "{sys.executable}"\nsummary_timeout_seconds = 600\n'
                    'report_args = "--no-sacct"\n')
    status, lines, _ = _check(capsys, "--config", str(path))
    assert status == 1
    assert lines[0] == (f"{path}: mailr: unknown key, ignored (did you mean 'mailer'?)")
    assert lines[1].startswith(f"{path}: summary_timeout_seconds: 600 is over the most")
    assert lines[2].startswith(f"{path}: report_args: must be a list of strings")
    assert len(lines) == 3 or all(": mailer: " in line for line in lines[3:])


def test_check_flags_a_mailer_that_is_not_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mail.toml"
    path.write_text(f'mailer = "{tmp_path}/no-such-mailer"\n')
    status, lines, _ = _check(capsys, f"--config={path}")
    assert status == 1 and lines == [f"{path}: mailer: {tmp_path}/no-such-mailer does not exist"]
    (tmp_path / "not-executable").write_text("")
    path.write_text(f'mailer = "{tmp_path}/not-executable"\n')
    assert _check(capsys, "--config", str(path))[1] == [
        f"{path}: mailer: {tmp_path}/not-executable is not executable"]


def test_check_passes_a_clean_config(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mail.toml"
    report = Path(sys.executable).parent / "slurm-gpu-report"
    path.write_text(f'mailer = "{sys.executable}"\nreport = "{report}"\n'
                    f'log_file = "{tmp_path}/mail.log"\n')
    status, lines, out = _check(capsys, "--config", str(path))
    assert (status, lines) == (0, [])
    assert out == f"{path}: ok (mailer {sys.executable})\n"


def test_check_of_a_named_file_that_is_missing_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, _ = _check(capsys, "--config", str(tmp_path / "mial.toml"))
    assert status == 1 and lines[0] == f"{tmp_path / 'mial.toml'}: does not exist"
