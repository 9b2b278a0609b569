"""Text from Slurm and users is inert in every report format and in notifications.

Job, user and account names are chosen by users (``sbatch -J``, and sites without
accounting take any account). Each is rendered by the real renderers, then read by
what reads that format: rich writing to a terminal, markdown-it (CommonMark) turning
the Markdown into HTML, Python's csv reader, a real SMTP server.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from email import message_from_bytes
from pathlib import Path

from markdown_it import MarkdownIt

from slurm_gpu_exporter.report.figures.rules import load_config
from slurm_gpu_exporter.report.notify.notices import NotifyState, messages
from slurm_gpu_exporter.report.notify.send import send
from slurm_gpu_exporter.report.render.text import (
    job_csv,
    job_markdown,
    job_table,
    low_util_csv,
    low_util_markdown,
    low_util_table,
)
from tests.report.sample_data import END, job_details, low_util_report

MARKUP = "[/oops] [link=https://evil.example]click[/link] [bold red]x"
ESCAPES = "\x1b]8;;https://evil.example\x1b\\hi\x1b]8;;\x1b\\ \x1b[2J\x1b[31mred\x07"
HTML = '<img src=x onerror="alert(1)"><a href="javascript:alert(2)">x</a>'
LINK = "[click](javascript:alert(3)) ![i](https://evil.example/t.png) **bold** |col|"
FORMULA = '=HYPERLINK("https://evil.example","x")'


def _hostile_details() -> list:
    idle, busy = job_details()
    idle = dataclasses.replace(idle, usage=dataclasses.replace(
        idle.usage, name=MARKUP + ESCAPES, user=HTML, account=FORMULA))
    busy = dataclasses.replace(busy, usage=dataclasses.replace(
        busy.usage, name=LINK, account="+cmd|' /C calc'!A0", partition="@SUM(A1)"))
    return [idle, busy]


def _hostile_report():  # type: ignore[no-untyped-def]
    report = low_util_report()
    names = [MARKUP + ESCAPES, HTML, LINK, FORMULA, "-2+3", "@x"]
    flagged = [dataclasses.replace(job, user=name if i % 2 else job.user,
                                   account=name, name=name)
               for i, (job, name) in enumerate(zip(report.flagged, names, strict=False))]
    return dataclasses.replace(report, flagged=flagged)


def test_the_terminal_table_prints_markup_and_escapes_as_text() -> None:
    for color in (False, True):
        out = job_table(_hostile_details(), width=200, color=color)  # raised MarkupError
        assert "[/oops]" in out and "[link=https://evil.example]click[/link]" in out
        assert "\x1b]8;" not in out  # no live link (OSC 8)
        assert "\x1b[2J" not in out and "\x1b[31mred" not in out and "\x07" not in out
        low = low_util_table(_hostile_report(), width=300, color=color)
        assert "[/oops]" in low and "\x1b]8;" not in low and "\x1b[2J" not in low


def test_markdown_output_renders_to_html_without_tags_or_links_from_names() -> None:
    for text in (job_markdown(_hostile_details()), low_util_markdown(_hostile_report())):
        html = MarkdownIt("commonmark").enable("table").render(text)
        # The text stays, as text: never a tag, a link, an image or emphasis.
        assert "<img" not in html and "<a " not in html and "<strong>bold" not in html
        assert "&lt;img src=x" in html  # the name is shown, as text


def test_csv_cells_that_spreadsheets_run_as_formulas_are_quoted() -> None:
    for text in (job_csv(_hostile_details()), low_util_csv(_hostile_report())):
        cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
        assert not [c for c in cells if c[:1] in ("=", "+", "-", "@")], text
        assert "'" + FORMULA in cells


def test_a_user_name_holding_more_recipients_gets_no_mail(
        smtp_inbox: tuple[str, list[bytes]], tmp_path: Path) -> None:
    target, inbox = smtp_inbox
    report = low_util_report()
    evil = "alice, attacker@example.org"
    report = dataclasses.replace(report, flagged=[
        dataclasses.replace(job, user=evil) if job.user == "alice" else job
        for job in report.flagged])
    todo = messages(report, load_config(None), NotifyState(tmp_path / "s.json"), END,
                    "{user}@example.org")
    assert evil not in {m.user for m, _ in todo} and todo
    for message, _ in todo:
        send(message, target, "gpu-report@example.org")
    recipients = [message_from_bytes(raw)["To"] for raw in inbox]
    assert recipients and not [r for r in recipients if "attacker" in r or "," in r]
