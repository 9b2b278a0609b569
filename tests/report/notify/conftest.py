"""The relay and a stand-in Prometheus the notify tests mail through and query."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.report.notify.relay_server import Relay, start_relay
from tests.support import free_port


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    """A relay as sites run one: STARTTLS required, then AUTH required."""
    found, stop = start_relay(tmp_path, starttls=True)
    try:
        yield found
    finally:
        stop()


@pytest.fixture
def clear_relay(tmp_path: Path) -> Iterator[Relay]:
    """A server that offers no STARTTLS and would take a password in clear."""
    found, stop = start_relay(tmp_path, starttls=False)
    try:
        yield found
    finally:
        stop()


@pytest.fixture
def prometheus() -> Iterator[str]:
    """A stand-in Prometheus that knows no job: the review still goes out."""
    class Handler(BaseHTTPRequestHandler):
        def _empty(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            data = json.dumps({"status": "success",
                               "data": {"resultType": "vector", "result": []}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _empty

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
