"""A stand-alone Prometheus API stand-in that is busy for its first answers.

    python -m tests.report.prometheus.busy_server --port-file PATH --busy 3

Its first ``--busy`` answers are refusals as the servers the report meets give them,
in turn: slurm-gpu-proxy's ``auth_busy`` (503, JSON, ``Retry-After: 1``),
VictoriaMetrics' full queue (503, plain text, ``Retry-After: 1``) and a gateway's 429
without a header. Every later query gets an empty success. ``GET /count`` says how
many answers of each kind went out. Listens on 127.0.0.1 only; the port is written
to ``--port-file`` once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REFUSALS: tuple[tuple[int, str, dict[str, str], str], ...] = (
    (503, "application/json", {"Retry-After": "1"},
     json.dumps({"status": "error", "errorType": "auth_busy",
                 "error": "too many password checks at once; retry in a second"})),
    (503, "text/plain", {"Retry-After": "1"},
     "cannot handle more than 1 concurrent search requests during 1s; possible solutions: "
     "increase -search.maxQueueDuration"),
    (429, "text/plain", {}, "Too Many Requests"),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--busy", type=int, default=3)
    args = parser.parse_args()
    lock = threading.Lock()
    counts = {"busy": 0, "ok": 0}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, ctype: str, headers: dict[str, str], body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with lock:
                body = json.dumps(counts)
            self._send(200, "application/json", {}, body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                n = counts["busy"]
                busy = n < args.busy
                counts["busy" if busy else "ok"] += 1
            if busy:
                self._send(*REFUSALS[n % len(REFUSALS)])
                return
            kind = "matrix" if self.path.endswith("query_range") else "vector"
            self._send(200, "application/json", {}, json.dumps(
                {"status": "success", "data": {"resultType": kind, "result": []}}))

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = args.port_file.with_name(args.port_file.name + ".tmp")
    tmp.write_text(str(httpd.server_address[1]))
    os.replace(tmp, args.port_file)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
