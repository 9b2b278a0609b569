"""What one job may hold and send through the relay, why a message is refused, and the
per-job rate budgets that hold a job to its message and line rates."""

from __future__ import annotations

from dataclasses import dataclass

# Why a message, connection or series was refused; each is one count in error_counts().
REASONS = (
    "refused",  # the sender's process is in no job on this node
    "connections",  # too many connections, in all or from one job
    "size",  # message over max_message_bytes or max_lines_per_message
    "rate",  # over the job's message rate
    "parse",  # not Prometheus text exposition
    "labels",  # a bad metric name, too many labels, a label name or value too long
    "type",  # a family's type clashes with the same name elsewhere
    "series",  # the job is at its series or bytes limit
)


@dataclass(frozen=True)
class RelayLimits:
    """What one job may hold and send. Defaults fit a training loop with room to spare."""

    max_message_bytes: int = 65536
    max_series_per_job: int = 200  # families() costs about 2 µs a series
    max_bytes_per_job: int = 131072
    max_labels: int = 8  # besides jobid and user
    max_label_length: int = 128  # label names and values
    max_name_length: int = 128  # metric names, prefix included
    max_help_length: int = 256  # longer help text is cut, not refused
    # Per job, all its connections together. Parsing costs about 45 µs a line, so the
    # line budget is what bounds the agent's CPU under a flood.
    messages_per_second: float = 2.0
    message_burst: int = 20
    lines_per_second: float = 500.0
    line_burst: int = 5000
    max_lines_per_message: int = 2000
    max_connections: int = 512
    max_connections_per_job: int = 32
    # Per uid (SO_PEERCRED), so that one user's many jobs leave room for the others.
    max_connections_per_user: int = 128
    # Refusing a process in no job costs a look-up in /proc; a uid refused this often
    # in a second is refused without one for the rest of that second, and past the
    # global number the relay stops accepting until the second is over.
    refusals_per_user_per_second: int = 20
    max_refusals_per_second: int = 200
    # How long a connection from a job the agent has not taken in yet waits for it
    # (the agent learns of a job at its next sample); then it is refused.
    pending_seconds: float = 30.0


class _Bucket:
    __slots__ = ("at", "lines", "messages")

    def __init__(self, messages: float, lines: float, at: float) -> None:
        self.messages = messages
        self.lines = lines
        self.at = at


class RateBudgets:
    """Each job's message and line budgets, refilled at the limits' rates up to their
    bursts. Not locked: the store calls it under its own lock."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self._buckets: dict[str, _Bucket] = {}

    def take(self, jobid: str, lines: int, now: float) -> float:
        """Take a message of ``lines`` lines from the job's budgets: 0.0, or the seconds
        until the budgets would have room (nothing taken)."""
        limits = self.limits
        lines = max(1, min(lines, limits.line_burst))
        bucket = self._buckets.get(jobid)
        if bucket is None:
            bucket = self._buckets[jobid] = _Bucket(
                float(limits.message_burst), float(limits.line_burst), now)
        elapsed, bucket.at = now - bucket.at, now
        bucket.messages = min(float(limits.message_burst),
                              bucket.messages + elapsed * limits.messages_per_second)
        bucket.lines = min(float(limits.line_burst),
                           bucket.lines + elapsed * limits.lines_per_second)
        if bucket.messages >= 1.0 and bucket.lines >= lines:
            bucket.messages -= 1.0
            bucket.lines -= lines
            return 0.0
        return max((1.0 - bucket.messages) / limits.messages_per_second,
                   (lines - bucket.lines) / limits.lines_per_second, 0.001)

    def forget(self, jobid: str) -> None:
        self._buckets.pop(jobid, None)

    def jobs(self) -> set[str]:
        """Jobs with a budget."""
        return set(self._buckets)
