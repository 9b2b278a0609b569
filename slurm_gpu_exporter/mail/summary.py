"""The summary added to a job's end mail: ``slurm-gpu-report job JOBID --format json``
in a subprocess of its own (its own session, killed whole at the deadline), its figures
as a few plain lines. An array task is asked for as the report names it, ``A_T``; an
array's summary mail (all its tasks at once) gets no summary: no one task's figures are
its."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_gpu_exporter.mail.config import MailConfig
from slurm_gpu_exporter.model.ids import JOB_ID_DIGITS
from slurm_gpu_exporter.model.slurm_id import SlurmJobId

# What Slurm puts in a mail's environment (slurmctld, 21.08 on).
END_STATES = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED",
                        "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL"})
END_MAIL_TYPES = frozenset({"ended", "failed", "reached_time_limit", "time_limit",
                            "out_of_memory", "end", "fail"})
JOBID = re.compile(JOB_ID_DIGITS)
# Slurm's own start of a MailProg subject (src/slurmctld/agent.c, mail_job_info), up to
# the job name a user chose: which of an array's mails this is. Matched at the start only.
ARRAY_SUMMARY_SUBJECT = re.compile(r"Slurm Array Summary Job_id=[0-9]+_\* \([0-9]+\) Name=")
ARRAY_TASK_SUBJECT = re.compile(r"Slurm Array Task Job_id=([0-9]+)_([0-9]+) \(([0-9]+)\) Name=")
EXIT_UNKNOWN_JOB = 5  # slurm-gpu-report: no metrics for the job (report/reports.py)
MAX_REPORT_BYTES = 4 << 20
# Control characters (terminal escapes, newlines) never reach the mail from a figure.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class NoSummary(Exception):
    """Why the mail goes as Slurm wrote it (logged, one line)."""


def mail_subject(argv: Sequence[str]) -> str:
    """The subject of Slurm's ``-s SUBJECT USER`` ("" for any other command line)."""
    return argv[1] if len(argv) >= 2 and argv[0] == "-s" else ""


def jobid_to_summarize(env: Mapping[str, str], subject: str = "") -> str:
    """The job whose end this mail tells of, as the report names it (``1234_5`` for an
    array task, else SLURM_JOB_ID), or NoSummary: a start mail, no job id, an array's
    summary mail. ``subject``: the mail's (``mail_subject``), which alone tells an
    array's summary from its last task's mail (both carry the array's id and the last
    task's)."""
    state = env.get("SLURM_JOB_STATE", "").strip().upper().split(" ")[0]
    mail_type = env.get("SLURM_JOB_MAIL_TYPE", "").strip().lower().replace(" ", "_")
    if not (state in END_STATES or (not state and mail_type in END_MAIL_TYPES)):
        raise NoSummary(f"not an end-of-job mail (type {mail_type or '-'}, state "
                        f"{state or '-'})")
    jobid = env.get("SLURM_JOB_ID", "")
    if not JOBID.fullmatch(jobid):
        raise NoSummary("no job id in SLURM_JOB_ID")
    if ARRAY_SUMMARY_SUBJECT.match(subject):
        raise NoSummary("an array's summary mail (all its tasks): no one task's figures "
                        "to add; --mail-type=ARRAY_TASKS mails each task with its own")
    task = _array_task(env, jobid)
    named = ARRAY_TASK_SUBJECT.match(subject)
    if named:
        if task is None or named.groups() != (task.array_job_id, task.array_task_id, jobid):
            raise NoSummary("the subject's array task is not the one SLURM_JOB_ID and "
                            "SLURM_ARRAY_* name")
    elif task is not None and task.job_id == task.array_job_id:
        # The array's own record: its summary mail or its last task's; only the
        # subject tells which, and it does not.
        raise NoSummary("an array's mail that may be its summary (the subject does not "
                        "say it is one task's)")
    return jobid if task is None else task.display


def _array_task(env: Mapping[str, str], jobid: str) -> SlurmJobId | None:
    """The array task that SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID name with
    SLURM_JOB_ID; None for a plain job and for values that are not Slurm's ids (the
    job is then asked for by SLURM_JOB_ID, as before)."""
    array_job = env.get("SLURM_ARRAY_JOB_ID", "")
    task = env.get("SLURM_ARRAY_TASK_ID", "")
    if not array_job and not task:
        return None
    try:
        found = SlurmJobId(jobid, array_job, task)
    except ValueError:
        return None
    return found if found.is_array_task else None


def report_json(config: MailConfig, jobid: str, timeout_s: float) -> dict[str, Any]:
    """The report's JSON for ``jobid``, within ``timeout_s`` seconds."""
    argv = [config.report, "job", jobid, "--format", "json"]
    if config.prometheus_url:
        argv += ["--prometheus-url", config.prometheus_url]
    argv += list(config.report_args)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise NoSummary(f"cannot run {config.report}: {exc.strerror}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # sacct and the like with it
        proc.communicate()
        raise NoSummary(f"the report did not answer within {timeout_s:.1f} s") from None
    if proc.returncode == EXIT_UNKNOWN_JOB:
        raise NoSummary("no metrics for the job (shorter than a sample, or not scraped)")
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise NoSummary(f"the report failed ({proc.returncode}): {last[:300]}")
    return job_in_answer(out, jobid)


def job_in_answer(out: bytes, jobid: str) -> dict[str, Any]:
    """The figures of ``jobid`` (as the report names it: ``1234_5`` for an array task) in
    the report's JSON answer ``out``; NoSummary when it holds none."""
    if len(out) > MAX_REPORT_BYTES:
        raise NoSummary("the report's answer is too large")
    try:
        jobs = json.loads(out)["jobs"]
        job = next(j for j in jobs if isinstance(j, dict) and str(j.get("job")) == jobid)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise NoSummary("the report's answer has no figures for the job") from None
    return job


def _ratio(value: Any) -> str | None:
    return f"{value:.0%}" if isinstance(value, int | float) else None


def _gib(value: Any) -> str | None:
    return f"{value:.1f} GiB" if isinstance(value, int | float) else None


def _inert(text: object, most: int = 200) -> str:
    return CONTROL.sub(" ", str(text))[:most]


def _listed(job: Mapping[str, Any], key: str, label: str) -> list[tuple[str, str | None]]:
    """One line per text of the report's list ``key`` (a few at most)."""
    found = job.get(key)
    texts = [t for t in found if isinstance(t, str)][:8] if isinstance(found, list) else []
    return [(label, text) for text in texts]


def summary_text(job: Mapping[str, Any]) -> str:
    """The lines added to the mail (figures the report does not know are left out)."""
    lines: list[tuple[str, str | None]] = []
    gpus = job.get("gpus")
    if isinstance(gpus, int | float) and gpus:
        held = f"{gpus:g}"
        if isinstance(job.get("gpu_hours"), int | float):
            held += f" ({job['gpu_hours']:.2f} GPU-hours)"
        lines.append(("GPUs held", held))
        lines.append(("GPU busy", _ratio(job.get("busy_ratio"))))
        lines.append(("SM active", _ratio(job.get("sm_active_ratio"))))
        lines.append(("Tensor active", _ratio(job.get("tensor_active_ratio"))))
        lines.append(("DRAM active", _ratio(job.get("dram_active_ratio"))))
        lines.append(("GPU memory peak", _gib(job.get("gpu_memory_peak_gib"))))
        energy = job.get("energy_kwh")
        lines.append(("GPU energy", f"{energy:.3f} kWh"
                      if isinstance(energy, int | float) else None))
        cpu_energy = job.get("cpu_energy_kwh")
        lines.append(("CPU+DRAM energy", f"{cpu_energy:.3f} kWh (estimate)"
                      if isinstance(cpu_energy, int | float) else None))
        emissions = job.get("emissions_gco2e")
        lines.append(("Emissions", f"{emissions:.0f} gCO2e"
                      if isinstance(emissions, int | float) else None))
        power = job.get("gpu_power_mean_w")
        lines.append(("GPU power", f"{power:.0f} W mean per GPU"
                      if isinstance(power, int | float) else None))
    lines.append(("CPU efficiency", _ratio(job.get("cpu_efficiency"))))
    peak, request = _gib(job.get("memory_peak_gib")), _gib(job.get("memory_request_gib"))
    lines.append(("Memory peak", f"{peak} of {request} requested" if peak and request
                  else peak))
    lines += _listed(job, "gpu_throttled", "GPU throttled")
    lines += _listed(job, "gpu_errors", "GPU error")
    shown = [(label, value) for label, value in lines if value is not None]
    if not shown:
        raise NoSummary("the report knows no figure of the job")
    width = max(len(label) for label, _ in shown) + 1
    out = [f"GPU and CPU efficiency of job {_inert(job.get('job'), 20)} "
           "(slurm-gpu-report):", ""]
    out += [f"  {label + ':':<{width}} {_inert(value)}" for label, value in shown]
    notes = [n for n in job.get("notes") or [] if isinstance(n, str)][:20]
    if notes:
        out += ["", "  Notes:"] + [f"  - {_inert(note, 300)}" for note in notes]
    out += ["", f"  Details: slurm-gpu-report job {_inert(job.get('job'), 20)}"]
    return "\n".join(out) + "\n"
