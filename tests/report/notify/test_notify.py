"""--notify: one message per flagged user over real SMTP (aiosmtpd) or a webhook; no
job reported twice within the repeat period."""

from __future__ import annotations

import json
import threading
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.figures.rules import load_config
from slurm_gpu_exporter.report.notify.notices import NotifyState, messages
from slurm_gpu_exporter.report.notify.send import dry_run_text, send
from tests.report.sample_data import END, low_util_report
from tests.support import free_port

CONFIG = load_config(None)
DAY = 86400.0


def test_one_message_per_user_with_only_their_jobs(tmp_path: Path) -> None:
    state = NotifyState(tmp_path / "state.json")
    todo = messages(low_util_report(), CONFIG, state, END, "{user}@example.org")
    users = {m.user: (m, jobs) for m, jobs in todo}
    assert sorted(users) == ["alice", "bob", "carol", "dave", "erin"]
    carol, jobs = users["carol"]
    assert carol.to == "carol@example.org"
    assert set(carol.jobids) == {"81234", "81502"} == {j.jobid for j in jobs}
    assert carol.subject == "GPU jobs flagged for low utilization (2)"
    assert "job 81234 (sweep-17): 4 GPU(s), 120.0 GPU-h, busy 2%" in carol.text
    assert "81410" not in carol.text  # bob's job
    assert dry_run_text(carol).startswith("To: carol@example.org\nSubject: ")


def test_a_job_is_not_reported_again_within_seven_days(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    report = low_util_report()
    state = NotifyState(path)
    first = messages(report, CONFIG, state, END, "{user}")
    for _, jobs in first:
        state.mark(jobs, END, 7 * DAY)
    again = NotifyState(path)  # what the next run reads
    assert messages(report, CONFIG, again, END + 7 * DAY - 1, "{user}") == []
    later = messages(report, CONFIG, again, END + 7 * DAY, "{user}")
    assert len(later) == len(first)


def test_mail_goes_through_a_real_smtp_server(smtp_inbox: tuple[str, list[bytes]],
                                              tmp_path: Path) -> None:
    target, inbox = smtp_inbox
    todo = messages(low_util_report(), CONFIG, NotifyState(tmp_path / "s.json"), END,
                    "{user}@example.org")
    for message, _ in todo:
        send(message, target, "gpu-report@example.org")
    assert len(inbox) == len(todo)
    mails = {message_from_bytes(raw)["To"]: message_from_bytes(raw) for raw in inbox}
    erin = mails["erin@example.org"]
    assert erin["From"] == "gpu-report@example.org"
    assert "job 80977 (fold-batch)" in erin.get_payload()


def test_webhook_gets_json(tmp_path: Path) -> None:
    received: list[dict] = []  # type: ignore[type-arg]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        message, _ = messages(low_util_report(), CONFIG, NotifyState(tmp_path / "s.json"),
                              END, "{user}")[0]
        send(message, f"http://127.0.0.1:{httpd.server_address[1]}/hook", "x")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert received[0]["user"] == message.user and received[0]["jobs"] == list(message.jobids)


def test_unreachable_smtp_server_is_a_clear_error(tmp_path: Path) -> None:
    message, _ = messages(low_util_report(), CONFIG, NotifyState(tmp_path / "s.json"), END,
                          "{user}")[0]
    with pytest.raises(ReportError, match="cannot send mail"):
        send(message, f"smtp://127.0.0.1:{free_port()}", "x")
    with pytest.raises(ReportError, match="use smtp://"):
        send(message, "ftp://host", "x")


def test_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(ReportError, match="fix or remove it"):
        NotifyState(path)
