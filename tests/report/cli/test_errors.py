"""Every failure is one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slurm_gpu_exporter.report.cli.main import main
from tests.support import free_port, require

Answer = Callable[[BaseHTTPRequestHandler], None]


def _json(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture
def server() -> Iterator[Callable[[Answer], str]]:
    """A stand-in HTTP API that answers every POST with the given behaviour."""
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Answer) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer(self)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # the client gave up (a timeout, a cancelled query): expected here

        httpd = Server(("127.0.0.1", free_port()), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *words: str) -> None:
    assert err.count("\n") == 1, err
    assert err.startswith("slurm-gpu-report: ") and "Traceback" not in err
    for word in words:
        assert word in err, err


def test_prometheus_down(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run(capsys, "low-util", "--prometheus-url", url)
    assert code == 3 and out == ""
    assert_one_line(err, "cannot reach Prometheus", "--prometheus-url")


def test_prometheus_too_slow(capsys: pytest.CaptureFixture[str],
                             server: Callable[[Answer], str]) -> None:
    url = server(lambda h: (time.sleep(3), _json(h, 200, {"status": "success"})))
    started = time.monotonic()
    code, _, err = run(capsys, "low-util", "--prometheus-url", url, "--timeout", "0.5")
    assert code == 3 and time.monotonic() - started < 2.5
    assert_one_line(err, "did not answer within 0.5 s", "--timeout")


def test_prometheus_http_error_with_its_message(capsys: pytest.CaptureFixture[str],
                                                server: Callable[[Answer], str]) -> None:
    url = server(lambda h: _json(h, 503, {"status": "error", "errorType": "unavailable",
                                          "error": "TSDB not ready"}))
    # One retry (0.5 s): the default three would wait 3.5 s for the same line.
    code, _, err = run(capsys, "job", "12", "--prometheus-url", url, "--retries", "1")
    assert code == 4
    assert_one_line(err, "HTTP 503", "TSDB not ready", "2 tries")


def test_http_error_without_an_api_answer(capsys: pytest.CaptureFixture[str],
                                          server: Callable[[Answer], str]) -> None:
    def unauthorized(h: BaseHTTPRequestHandler) -> None:
        h.send_response(401)
        h.send_header("Content-Length", "0")
        h.end_headers()

    code, _, err = run(capsys, "low-util", "--prometheus-url", server(unauthorized))
    assert code == 4
    assert_one_line(err, "HTTP 401", "credentials")


def test_partial_data_is_refused(capsys: pytest.CaptureFixture[str],
                                 server: Callable[[Answer], str]) -> None:
    url = server(lambda h: _json(h, 200, {
        "status": "success", "warnings": ["store 10.0.0.7:10901 unreachable"],
        "data": {"resultType": "vector", "result": []}}))
    code, out, err = run(capsys, "low-util", "--prometheus-url", url)
    assert code == 4 and out == ""
    assert_one_line(err, "partial data", "10.0.0.7")


@pytest.mark.parametrize(("args", "words"), [
    (["--since", "7x"], ["bad duration '7x'"]),
    (["--since", "0s"], ["empty"]),
    (["--start", "2026-11-02", "--end", "2026-11-01"], ["--start must be before --end"]),
    (["--start", "yesterday"], ["bad time 'yesterday'"]),
    (["--since", "1d", "--start", "2026-11-01"], ["either --since or --start"]),
    (["--end", "2999-01-01"], ["in the future"]),
])
def test_bad_window(capsys: pytest.CaptureFixture[str], args: list[str],
                    words: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never reached: the window is checked first
    code, _, err = run(capsys, "low-util", "--prometheus-url", url, *args)
    assert code == 2
    assert_one_line(err, *words)


def test_bad_job_id_and_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "job", "12;drop", "--prometheus-url", "http://127.0.0.1:1")
    assert code == 2
    assert_one_line(err, "bad job id")
    code, _, err = run(capsys, "low-util", "--prometheus-url", "localhost:9090")
    assert code == 2
    assert_one_line(err, "must start with http://")


def test_basic_auth_and_bearer_token_are_sent(capsys: pytest.CaptureFixture[str],
                                              server: Callable[[Answer], str],
                                              tmp_path: Path) -> None:
    seen: list[str | None] = []

    def record(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.headers.get("Authorization"))
        _json(h, 200, {"status": "success", "data": {"resultType": "vector", "result": []}})

    url = server(record)
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    code, out, _ = run(capsys, "low-util", "--prometheus-url", url, "--username", "ops",
                       "--password-file", str(secret))
    assert code == 0 and "No job under the threshold" in out
    assert set(seen) == {"Basic b3BzOnMzY3JldA=="}
    seen.clear()
    code, _, _ = run(capsys, "low-util", "--prometheus-url", url,
                     "--bearer-token-file", str(secret))
    assert code == 0 and set(seen) == {"Bearer s3cret"}


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    require(openssl is not None, "openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([str(openssl), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.mark.process
def test_tls_with_the_site_ca_and_a_clear_error_without_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            _json(self, 200, {"status": "success",
                              "data": {"resultType": "vector", "result": []}})

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # the refused handshake of the test without the CA

    httpd = Server(("127.0.0.1", free_port()), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    try:
        code, out, err = run(capsys, "low-util", "--prometheus-url", url, "--ca-file", str(cert))
        assert code == 0 and "No job under the threshold" in out, err
        code, _, err = run(capsys, "low-util", "--prometheus-url", url)
        assert code == 3
        assert_one_line(err, "cannot reach Prometheus", "certificate")
        code, out, _ = run(capsys, "low-util", "--prometheus-url", url, "--insecure-skip-verify")
        assert code == 0
    finally:
        httpd.shutdown()
        httpd.server_close()



@pytest.mark.process
def test_a_closed_stdout_ends_a_report_quietly(server: Callable[[Answer], str]) -> None:
    """``| head`` that closed early: exit 0, nothing on stderr (enforce, whose exit status
    says what it did: tests/report/enforce/test_enforce_slurm.py)."""
    url = server(lambda h: _json(h, 200, {"status": "success",
                                           "data": {"resultType": "vector", "result": []}}))
    read_end, write_end = os.pipe()
    os.close(read_end)
    report = Path(sys.executable).with_name("slurm-gpu-report")
    proc = subprocess.run([str(report), "low-util", "--prometheus-url", url], stdout=write_end,
                          stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == ""
