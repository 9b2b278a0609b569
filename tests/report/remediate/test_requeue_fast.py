"""remediate's requeue at its edges, in words: the policy's checks and each skipped job's
reason, what is decided after the grace, and what the Requeuer signals, records, counts
and logs on each path (a dry run, a failed signal, a failed or refused requeue, a
look-up that keeps failing), with Slurm's commands as recording fakes and a set clock."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from slurm_gpu_exporter.model.slurm_id import SlurmJobId
from slurm_gpu_exporter.report.errors import ReportError
from slurm_gpu_exporter.report.prometheus.client import Sample
from slurm_gpu_exporter.report.remediate import requeue_policy
from slurm_gpu_exporter.report.remediate.confirm import Episode, Fault
from slurm_gpu_exporter.report.remediate.pending import PendingRequeue, RequeueBook
from slurm_gpu_exporter.report.remediate.requeue_policy import (
    RequeuePolicy,
    choose,
    job_key,
    opted,
)
from slurm_gpu_exporter.report.remediate.requeuer import Requeuer, requeue_verdict
from slurm_gpu_exporter.report.slurm.squeue import SlurmJob

NOW = 1796119200.0  # 2026-12-01T10:00:00Z
START = NOW - 3600
ALL = RequeuePolicy("all", grace_s=60.0)
EPISODE = Episode.of({"alertname": "SlurmGpuLost", "instance": "gpu07:9817", "gpu": "1",
                      "uuid": "GPU-one"}, NOW - 60)
LOG = "slurm_gpu_exporter.report.remediate.requeuer"


def job(jobid: str, state: str = "RUNNING", start: float | None = START,
        ident: SlurmJobId | None = None, requeue: bool | None = True,
        batch: bool | None = True, comment: str = "", nodes: tuple[str, ...] | None = ("gpu07",)
        ) -> SlurmJob:
    return SlurmJob(jobid, "alice", "a", "p", "q", "train", state, nodes, 1, start,
                    ident if ident is not None else SlurmJobId(jobid), comment, requeue, batch)


# -- the policy ---------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mode": "some"}, "bad --requeue-opt 'some': give off, all, opt-in"),
    ({"signal": "KILL"}, "bad --requeue-signal 'KILL': give one of CONT, HUP, INT, QUIT, "
                         "TERM, URG, USR1, USR2 or NONE"),
    ({"scope": "all"}, "bad --requeue-signal-to 'all': give batch, steps, full"),
    ({"grace_s": -1.0}, "bad --requeue-grace: give 0 to 86400 seconds"),
    ({"grace_s": 86400.5}, "bad --requeue-grace: give 0 to 86400 seconds"),
])
def test_a_bad_policy_says_what_to_give(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        RequeuePolicy(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_the_policys_edges_are_allowed() -> None:
    assert RequeuePolicy(grace_s=0.0).grace_s == 0.0
    assert RequeuePolicy(grace_s=86400.0).grace_s == 86400.0
    none = RequeuePolicy("all", signal="NONE")
    assert none.enabled and not none.signals
    assert RequeuePolicy() == RequeuePolicy("off", "USR1", 120.0, "full")
    assert RequeuePolicy("opt-in").enabled and RequeuePolicy().signals


@pytest.mark.parametrize(("comment", "out"), [
    ("slurm-gpu:no-requeue", True), ("SLURM-GPU:NO-REQUEUE.", True),
    ("(slurm-gpu:no-requeue)", True), ("a slurm-gpu:no-requeue b", True),
    ("slurm-gpu:no-requeue-later", False), ("xslurm-gpu:no-requeue", False),
    ("slurm-gpu:no-requeue_", False), (":slurm-gpu:no-requeue", False),
    ("slurm-gpu-no-requeue", False), ("", False),
])
def test_the_opt_out_word_is_bounded_by_its_own_characters(comment: str, out: bool) -> None:
    assert opted(comment, "all") is not out


def test_a_word_is_matched_whole_in_any_case_bounded_by_its_own_characters() -> None:
    """The pattern builder itself (the module builds its two words on import)."""
    word = requeue_policy._word("a-b:c")
    assert word.pattern == r"(?<![\w\-:])a\-b:c(?![\w\-:])"
    assert [bool(word.search(t)) for t in ("A-B:C", "x a-b:c.", "a-b:c-", ":a-b:c", "a-b:cd")
            ] == [True, True, False, False, False]
    assert requeue_policy._word("plain").pattern == r"(?<![\w])plain(?![\w])"


def test_opt_in_needs_the_word_and_no_opt_out() -> None:
    assert opted("slurm-gpu:requeue", "opt-in")
    assert not opted("slurm-gpu:requeue slurm-gpu:no-requeue", "opt-in")
    assert not opted("slurm-gpu:requeue", "off") and not opted("", "off")


def test_a_job_is_counted_once_by_its_target_and_start() -> None:
    assert job_key(job("10", start=1234.4)) == "10@1234"
    assert job_key(job("31", ident=SlurmJobId("31", "30", "1"))) == f"30_1@{START:.0f}"
    assert job_key(job("10", start=None)) is None
    unsplit = job("30", ident=SlurmJobId("30", "30"))  # an array's pending remainder
    assert unsplit.ident is not None and unsplit.ident.target is None
    assert job_key(unsplit) is None
    no_ident = SlurmJob("10", "u", "a", "p", "q", "n", start=START)
    assert job_key(no_ident) is None


def test_each_skipped_job_says_why() -> None:
    listed = {
        "1": job("1", nodes=None), "2": job("2", state="PENDING", nodes=None),
        "3": job("3", ident=SlurmJobId("30", "30")), "4": job("4", batch=None),
        "5": job("5", requeue=None), "6": job("6", comment="slurm-gpu:no-requeue"),
        "7": job("7"), "8": job("8", start=START - 1)}
    done = {f"7@{START:.0f}"}
    choices = choose(ALL, "gpu07", {"1", "2", "3", "4", "5", "6", "7", "8", "9"}, listed, done)
    assert [(c.jobid, c.act, c.reason, c.text) for c in choices] == [
        ("1", False, "not_on_node", "job 1: Slurm lists it RUNNING on ?, not running on gpu07"),
        ("2", False, "not_on_node", "job 2: Slurm lists it PENDING on ?, not running on gpu07"),
        ("3", False, "no_target", "job 30: no Slurm id names it alone"),
        ("4", False, "not_batch", "job 4: not a batch job (salloc or srun): Slurm cannot "
                                  "requeue it"),
        ("5", False, "no_requeue", "job 5: Slurm does not let it requeue (sbatch --no-requeue)"),
        ("6", False, "opted_out", "job 6: opted out (--requeue-opt all)"),
        ("7", False, "acted_before", "job 7: signalled for a GPU fault before"),
        ("8", True, "picked", "job 8"),
        ("9", False, "not_listed", "job 9: Slurm lists no such job")]
    assert [c.key for c in choices] == ["", "", "", f"4@{START:.0f}", f"5@{START:.0f}",
                                        f"6@{START:.0f}", f"7@{START:.0f}",
                                        f"8@{START - 1:.0f}", ""]
    assert choices[-2].target == "8" and choices[0].target == ""
    opt_in = choose(RequeuePolicy("opt-in"), "gpu07", {"7"}, listed, set())
    assert [(c.reason, c.text) for c in opt_in] == [
        ("not_opted_in", "job 7: not opted in (--requeue-opt opt-in)")]


def test_jobs_are_looked_at_in_the_order_of_their_ids() -> None:
    listed = {j: job(j, nodes=("gpu08",)) for j in ("9", "10", "100")}
    choices = choose(ALL, "gpu07", ["100", "9", "10", "9"], listed, set())
    assert [c.jobid for c in choices] == ["9", "10", "100"]


def test_a_het_job_is_acted_on_as_a_whole_however_its_parts_are_named() -> None:
    lead = job("40", ident=SlurmJobId("40", het_job_id="40", het_job_offset="0"))
    part = job("41", ident=SlurmJobId("41", het_job_id="40", het_job_offset="1"),
               requeue=False)
    (choice,) = choose(ALL, "gpu07", {"41", "40"}, {"41": part, "40": lead}, set())
    assert (choice.jobid, choice.reason) == ("40", "no_requeue")  # one part may not


# -- after the grace -------------------------------------------------------------------

def _due(target: str = "40", start: float = START, due: float = NOW) -> PendingRequeue:
    return PendingRequeue(f"{target}@{start:.0f}", target, start, due, "gpu07",
                          "slurm-gpu-exporter: SlurmGpuLost on gpu07: sent SIGUSR1, requeue due")


@pytest.mark.parametrize(("state", "verdict", "why"), [
    ("RUNNING", "requeue", "requeued"), ("SUSPENDED", "requeue", "requeued"),
    ("FAILED", "requeue", "requeued"), ("NODE_FAIL", "requeue", "requeued"),
    ("COMPLETING", "wait", "it is still completing"),
    ("TIMEOUT", "ended", "it ended TIMEOUT"),
    ("OUT_OF_MEMORY\x1b[2J", "ended", "it ended OUT_OF_MEMORY\ufffd[2J"),
    ("REQUEUED", "requeued_already", "it was requeued since (by itself or someone else)"),
    ("REQUEUE_HOLD", "requeued_already", "it was requeued since (by itself or someone else)"),
    ("REQUEUE_FED", "requeued_already", "it was requeued since (by itself or someone else)"),
])
def test_after_the_grace_the_state_decides(state: str, verdict: str, why: str) -> None:
    assert requeue_verdict([job("40", state=state)], _due()) == (verdict, why)


def test_after_the_grace_the_het_leader_decides_wherever_it_is_listed() -> None:
    part = job("41", state="PENDING", start=NOW,
               ident=SlurmJobId("41", het_job_id="40", het_job_offset="1"))
    lead = job("40", ident=SlurmJobId("40", het_job_id="40", het_job_offset="0"))
    assert requeue_verdict([part, lead], _due()) == ("requeue", "requeued")
    assert requeue_verdict([job("40", requeue=None)], _due()) == (
        "no_requeue", "Slurm does not let it requeue (sbatch --no-requeue)")
    assert requeue_verdict([], _due()) == ("gone", "Slurm no longer lists it")


# -- the Requeuer ------------------------------------------------------------------------

class Slurm:
    """Slurm's commands for the Requeuer, recording what they were asked."""

    def __init__(self, jobs: dict[str, SlurmJob]) -> None:
        self.jobs = jobs
        self.calls: list[tuple[str, ...]] = []
        self.fail: set[str] = set()

    def listed(self) -> dict[str, SlurmJob]:
        if "listed" in self.fail:
            raise ReportError("squeue failed")
        return self.jobs

    def signal(self, ident: SlurmJobId, sig: str, scope: str) -> None:
        if "signal" in self.fail:
            raise ReportError("scancel: Invalid job id")
        self.calls.append(("signal", ident.display, sig, scope))

    def requeue(self, ident: SlurmJobId) -> None:
        if "requeue" in self.fail:
            raise ReportError("scontrol: slurmctld down")
        self.calls.append(("requeue", ident.display))

    def record(self, ident: SlurmJobId, why: str) -> None:
        if "record" in self.fail:
            raise ReportError("job already finished")
        self.calls.append(("record", ident.display, why))


def _requeuer(slurm: Slurm, policy: RequeuePolicy = ALL, book: RequeueBook | None = None,
              samples: list[Sample] | None = None, dry_run: bool = False,
              counted: list[tuple[str, str]] | None = None,
              asked: list[str] | None = None) -> Requeuer:
    async def query(q: str) -> list[Sample]:
        (asked if asked is not None else []).append(q)
        return samples if samples is not None else [
            Sample({"jobid": "40", "gpu": "1", "uuid": "GPU-one"}, NOW - 5)]
    tally = counted if counted is not None else []
    return Requeuer(policy, book or RequeueBook(None), query,
                    lambda a, r: tally.append((a, r)), dry_run=dry_run,
                    listed=slurm.listed, signal=slurm.signal, requeue=slurm.requeue,
                    record=slurm.record, clock=lambda: NOW)


FAULT = Fault("gpu07", ((EPISODE, "SlurmGpuLost"),))
HEAD = "slurm-gpu-exporter: SlurmGpuLost on gpu07 gpu 1 GPU-one since 2026-12-01T09:59:00Z: "


def _on(req: Requeuer, faults: list[Fault]) -> bool:
    async def go() -> bool:
        try:
            return await req.on_faults(faults)
        finally:
            await req.close()
    return asyncio.run(go())


def test_a_picked_job_is_signalled_recorded_and_its_requeue_booked(
        caplog: pytest.LogCaptureFixture) -> None:
    slurm, book, counted, asked = Slurm({"40": job("40")}), RequeueBook(None), [], []
    req = _requeuer(slurm, book=book, counted=counted, asked=asked)
    with caplog.at_level(logging.INFO, LOG):
        assert _on(req, [FAULT])
    assert asked == ['timestamp(slurm_job_gpu_allocated_seconds_total{instance="gpu07:9817"})']
    assert slurm.calls == [("signal", "40", "USR1", "full"),
                           ("record", "40", HEAD + "sent SIGUSR1, requeue due")]
    assert counted == [("signalled", "USR1")]
    key = f"40@{START:.0f}"
    assert book.pending == {key: PendingRequeue(key, "40", START, NOW + 60.0, "gpu07",
                                                HEAD + "sent SIGUSR1, requeue due")}
    assert book.done == {key: NOW} and book.open == {}
    assert [r.getMessage() for r in caplog.records] == [
        f"sent SIGUSR1 to job 40 (full): {HEAD}sent SIGUSR1, requeue due"]


def test_without_a_signal_the_requeue_is_due_at_once() -> None:
    slurm, book = Slurm({"40": job("40")}), RequeueBook(None)
    assert _on(_requeuer(slurm, RequeuePolicy("all", signal="NONE"), book), [FAULT])
    (due,) = book.pending.values()
    assert due.due == NOW and due.why == HEAD + "requeue due"
    assert slurm.calls[0] == ("record", "40", HEAD + "requeue due")


def test_a_dry_run_signals_nothing_and_books_no_requeue(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    slurm, book, counted = Slurm({"40": job("40")}), RequeueBook(None), []
    with caplog.at_level(logging.INFO, LOG):
        _on(_requeuer(slurm, book=book, dry_run=True, counted=counted), [FAULT])
    assert slurm.calls == [] and book.pending == {} and book.done == {f"40@{START:.0f}": NOW}
    assert counted == [("dry_run", "dry_run")]
    assert [r.getMessage() for r in caplog.records] == [
        f"dry run: would send SIGUSR1 to job 40 ({HEAD}sent SIGUSR1, requeue due)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, LOG):
        _on(_requeuer(Slurm({"40": job("40")}), RequeuePolicy("all", signal="NONE"),
                      dry_run=True), [FAULT])
    assert [r.getMessage() for r in caplog.records] == [
        f"dry run: would requeue job 40 ({HEAD}requeue due)"]


def test_a_failed_signal_is_recorded_and_its_requeue_dropped(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    slurm, book, counted = Slurm({"40": job("40")}), RequeueBook(None), []
    slurm.fail.add("signal")
    with caplog.at_level(logging.INFO, LOG):
        assert _on(_requeuer(slurm, book=book, counted=counted), [FAULT])
    assert slurm.calls == [("record", "40", HEAD + "SIGUSR1 failed (scancel: Invalid job "
                                                   "id), not requeued")]
    assert counted == [("failed", "signal")] and book.pending == {}
    assert [r.getMessage() for r in caplog.records] == [
        "cannot signal job 40: scancel: Invalid job id; not requeueing it (it had no chance "
        "to checkpoint)"]


def test_a_comment_slurm_refuses_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    slurm = Slurm({"40": job("40")})
    slurm.fail.add("record")
    with caplog.at_level(logging.WARNING, LOG):
        _on(_requeuer(slurm), [FAULT])
    assert [r.getMessage() for r in caplog.records] == [
        "cannot record in job 40's AdminComment: job already finished"]


def test_skipped_jobs_and_gpus_nobody_holds_are_logged(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    counted: list[tuple[str, str]] = []
    with caplog.at_level(logging.INFO, LOG):
        _on(_requeuer(Slurm({}), counted=counted), [FAULT])
        _on(_requeuer(Slurm({}), samples=[]), [FAULT])
    assert counted == [("skipped", "not_listed")]
    assert [r.getMessage() for r in caplog.records] == [
        "not signalling for the GPU fault on gpu07: job 40: Slurm lists no such job",
        "no job holds the faulty GPU of gpu07 (gpu 1 GPU-one) in Prometheus: none signalled"]


def test_a_failed_look_up_leaves_the_fault_open_and_says_so(caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    slurm, book, counted = Slurm({}), RequeueBook(None), []
    slurm.fail.add("listed")
    with caplog.at_level(logging.ERROR, LOG):
        assert not _on(_requeuer(slurm, book=book, counted=counted), [FAULT])
    assert counted == [("failed", "lookup")] and book.is_open(EPISODE)
    assert [r.getMessage() for r in caplog.records] == [
        "cannot signal the jobs on the faulty GPU of gpu07: squeue failed; left open, the "
        "next post of the alert tries again (for 12 h)"]


def test_an_episode_open_twelve_hours_is_given_up(caplog: pytest.LogCaptureFixture) -> None:
    book, counted = RequeueBook(None), []
    book.opened([EPISODE], NOW - 12 * 3600)
    other = Episode.of({"gpu": "2", "instance": "gpu07:9817"}, NOW - 30)
    book.opened([other], NOW - 12 * 3600 + 1)
    slurm = Slurm({"40": job("40")})
    repeat = Fault("gpu07", ((EPISODE, "SlurmGpuLost"), (other, "SlurmGpuLost")), repeat=True)
    with caplog.at_level(logging.ERROR, LOG):
        assert _on(_requeuer(slurm, book=book, counted=counted, samples=[]), [repeat])
    assert counted == [("failed", "gave_up")] and book.open == {}
    assert [r.getMessage() for r in caplog.records] == [
        "gave up signalling the jobs on the faulty GPU of gpu07: the look-ups failed for 12 h"]


def test_off_the_requeuer_does_nothing() -> None:
    slurm = Slurm({"40": job("40")})
    assert _on(_requeuer(slurm, RequeuePolicy()), [FAULT]) and slurm.calls == []


def _now(req: Requeuer, due: PendingRequeue) -> list[asyncio.Task[None]]:
    async def go() -> list[asyncio.Task[None]]:
        await req.requeue_now(due)
        tasks = list(req._tasks)
        await req.close()
        return tasks
    return asyncio.run(go())


def test_a_due_requeue_is_run_and_recorded(caplog: pytest.LogCaptureFixture) -> None:
    slurm, book, counted = Slurm({"40": job("40")}), RequeueBook(None), []
    due = _due()
    book.acted(due.key, NOW, due)
    with caplog.at_level(logging.INFO, LOG):
        assert _now(_requeuer(slurm, book=book, counted=counted), due) == []
    assert slurm.calls[0] == ("requeue", "40")
    assert slurm.calls[1][:2] == ("record", "40")
    assert re.fullmatch(r"slurm-gpu-exporter: SlurmGpuLost on gpu07: sent SIGUSR1, requeued "
                        r"at \d\d:\d\d:\d\dZ", slurm.calls[1][2])
    assert counted == [("requeued", "requeued")] and book.pending == {}
    assert [r.getMessage() for r in caplog.records] == [
        "requeued job 40 after the GPU fault on gpu07"]


def test_a_due_requeue_slurm_would_not_do_is_skipped_in_words(caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    slurm, book, counted = Slurm({"40": job("40", state="CANCELLED")}), RequeueBook(None), []
    book.acted("40@1", NOW, _due())
    with caplog.at_level(logging.INFO, LOG):
        _now(_requeuer(slurm, book=book, counted=counted), _due())
    assert slurm.calls == [] and counted == [("skipped", "ended")]
    assert [r.getMessage() for r in caplog.records] == [
        "not requeueing job 40: it ended CANCELLED"]


def test_a_completing_job_is_asked_about_again_in_30_s() -> None:
    slurm = Slurm({"40": job("40", state="COMPLETING")})
    book = RequeueBook(None)
    due = _due()
    book.acted(due.key, NOW, due)
    assert len(_now(_requeuer(slurm, book=book), due)) == 1
    assert book.pending == {due.key: due}  # kept for a restart meanwhile


def test_a_failed_requeue_is_tried_again_then_given_up(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    slurm, counted = Slurm({"40": job("40")}), []
    slurm.fail.add("requeue")
    book = RequeueBook(None)
    due = _due(due=NOW - 1800 + 30)  # retried up to 1800 s past its due time
    book.acted(due.key, NOW, due)
    with caplog.at_level(logging.ERROR, LOG):
        assert len(_now(_requeuer(slurm, book=book, counted=counted), due)) == 1
    assert counted == [("failed", "requeue")] and due.key in book.pending
    late = _due(due=NOW - 1800 + 29)
    with caplog.at_level(logging.ERROR, LOG):
        assert _now(_requeuer(slurm, book=book, counted=counted), late) == []
    assert counted[-2:] == [("failed", "requeue"), ("failed", "gave_up")]
    assert late.key not in book.pending
    assert [r.getMessage() for r in caplog.records] == [
        "cannot requeue job 40: scontrol: slurmctld down",
        "cannot requeue job 40: scontrol: slurmctld down",
        "gave up requeueing job 40: Slurm failed for 1800 s past its due time (requeue it "
        "by hand: scontrol requeue 40)"]


def test_a_restart_schedules_what_was_due() -> None:
    book = RequeueBook(None)
    book.acted("40@1", NOW, _due(due=NOW + 3600))
    book.acted("41@1", NOW, PendingRequeue("41@1", "41", START, NOW + 7200, "gpu07", "w"))

    async def go() -> int:
        req = _requeuer(Slurm({}), book=book)
        req.resume()
        count = len(req._tasks)
        await req.close()
        return count
    assert asyncio.run(go()) == 2 and len(book.pending) == 2
