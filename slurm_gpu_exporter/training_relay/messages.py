"""One turn of reading a connection: each message is held to the size limits and taken
from its job's rate budget before the store parses it."""

from __future__ import annotations

import socket
from collections.abc import Container

from slurm_gpu_exporter.training_relay.connections import Connection
from slurm_gpu_exporter.training_relay.payload import lines_of
from slurm_gpu_exporter.training_relay.store import TrainingStore

# Messages read from one connection before the others get a turn.
_READS_PER_TURN = 32


def read_messages(conn: Connection, store: TrainingStore, forgotten: Container[str]
                  ) -> float | None:
    """Read what an attached connection sent, up to a turn's worth, into the store.

    Returns None when the connection is done (the sender hung up, or reading failed:
    close it), the seconds to stop reading it for when its job is over its rate, or 0.0.
    A connection of a job in ``forgotten`` is left unread (it is closed at the end of
    the turn).
    """
    limits = store.limits
    for _ in range(_READS_PER_TURN):
        try:
            data, _, flags, _ = conn.sock.recvmsg(limits.max_message_bytes)
        except (BlockingIOError, InterruptedError):
            return 0.0
        except OSError:
            return None
        truncated = bool(flags & socket.MSG_TRUNC)
        if not data and not truncated:
            return None  # the sender hung up
        if conn.key in forgotten:
            return 0.0  # forgotten: closed at the end of this turn, nothing more kept
        # Every message counts against the rate, refused ones too: an oversized
        # flood must not cost more than a well-formed one.
        assert conn.job is not None  # only attached connections are read
        lines = lines_of(data)
        oversized = truncated or lines > limits.max_lines_per_message
        wait = store.admit(conn.key, 1 if oversized else lines)
        if wait > 0:
            return wait
        if oversized:
            store.count("size")  # (the kernel dropped the rest of a long one)
            continue
        store.ingest(conn.job, data)
    return 0.0
