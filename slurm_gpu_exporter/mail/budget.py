"""The wrapper's time: slurmctld gives MailProg 120 s (``MAIL_PROG_TIMEOUT`` in its
src/slurmctld/agent.c, the timeout of the mail script it runs) and then gives up on it,
mail or no mail. The summary and the mailer share one budget inside that, and the
mailer's share is kept for it: a slow summary can only cut the summary short."""

from __future__ import annotations

SLURM_MAIL_PROG_TIMEOUT_S = 120.0
# What the summary and the mailer may take together; the rest of slurmctld's 120 s is
# for starting Python on a loaded controller and for killing a late report.
TOTAL_BUDGET_S = 100.0
DEFAULT_SUMMARY_TIMEOUT_S = 10.0
MAX_SUMMARY_TIMEOUT_S = 60.0
DEFAULT_MAILER_TIMEOUT_S = 40.0
# The summary keeps at least TOTAL_BUDGET_S - this.
MAX_MAILER_TIMEOUT_S = 90.0
# The mailer is stopped by then at the latest: before slurmctld gives up, so that the
# wrapper, not slurmctld, says what became of the mail.
MAILER_END_S = 110.0
# Less than this left: no summary is tried (a report cannot answer in less).
MIN_SUMMARY_S = 0.5
# The mailer is never given less, even when the budget is spent (slurmctld's own limit
# still ends it).
MIN_MAILER_S = 1.0


def fit_summary(summary_s: float, mailer_s: float) -> float:
    """The summary's time once the mailer's is set aside within the total budget."""
    return min(summary_s, TOTAL_BUDGET_S - mailer_s)


def summary_time_left(summary_s: float, mailer_s: float, elapsed_s: float) -> float:
    """Seconds the summary may still take, ``elapsed_s`` after the wrapper started
    (0 when there is no time for one)."""
    left = fit_summary(summary_s, mailer_s) - elapsed_s
    return left if left >= MIN_SUMMARY_S else 0.0


def mailer_time(mailer_s: float, elapsed_s: float) -> float:
    """The mailer's time limit, ``elapsed_s`` after the wrapper started: its configured
    time, cut only where that would run past slurmctld's own limit."""
    return max(MIN_MAILER_S, min(mailer_s, MAILER_END_S - elapsed_s))
