"""The child process that parses and restricts queries for the proxy (check_pool.py).

promql-parser holds the GIL while it parses, so a slow parse in a thread still stops
the proxy's event loop; in a process of its own it stops nothing but itself, and the
proxy kills it when it runs past its time. It reads requests on stdin and answers on
stdout, each a 4-byte big-endian length and a JSON object:

    {"kind": "query" | "selector", "text": ..., "admin": bool, "users": [...], "public": [...]}
    -> {"text": <what to send upstream>} | {"refused": <message>, "reason": <reason>}

It exits when stdin closes (the proxy stopped, even by SIGKILL).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from typing import BinaryIO

from slurm_gpu_exporter.proxy.query.restrict import (
    QueryRefused,
    Scope,
    restrict_query,
    restrict_series_selector,
)

# The parser recurses once per level; the deepest query the limits let through
# (limits.py: about 400 levels) needs well under this.
PARSER_STACK_BYTES = 64 * 1024 * 1024
HEADER = struct.Struct(">I")


def read_message(stream: BinaryIO) -> dict | None:
    """The next message, or None at the end of the stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    body = stream.read(HEADER.unpack(head)[0])
    return json.loads(body)


def encode_message(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return HEADER.pack(len(body)) + body


def answer(request: dict) -> dict:
    """What the proxy should do with one request."""
    scope = Scope(admin=bool(request["admin"]), users=frozenset(request["users"]),
                  public=frozenset(request["public"]))
    check = restrict_series_selector if request["kind"] == "selector" else restrict_query
    try:
        return {"text": check(request["text"], scope)}
    except QueryRefused as exc:
        return {"refused": str(exc), "reason": exc.reason}


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    while (request := read_message(requests)) is not None:
        answers.write(encode_message(answer(request)))
        answers.flush()


def main() -> int:
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    # Anything a library prints goes to stderr (the proxy's log), never into an answer.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    threading.stack_size(PARSER_STACK_BYTES)
    worker = threading.Thread(target=serve, args=(requests, answers), name="promql")
    worker.start()
    worker.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
