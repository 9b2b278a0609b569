"""The summary added to a job's end mail: ``slurm-gpu-report job JOBID --format json``
in a subprocess of its own (its own session, killed whole at the deadline), its figures
as a few plain lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

from slurm_gpu_exporter.mail.config import MailConfig
from slurm_gpu_exporter.model.ids import JOB_ID_DIGITS

# What Slurm puts in a mail's environment (slurmctld, 21.08 on).
END_STATES = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED",
                        "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL"})
END_MAIL_TYPES = frozenset({"ended", "failed", "reached_time_limit", "time_limit",
                            "out_of_memory", "end", "fail"})
JOBID = re.compile(JOB_ID_DIGITS)
EXIT_UNKNOWN_JOB = 5  # slurm-gpu-report: no metrics for the job (report/reports.py)
MAX_REPORT_BYTES = 4 << 20
# Control characters (terminal escapes, newlines) never reach the mail from a figure.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class NoSummary(Exception):
    """Why the mail goes as Slurm wrote it (logged, one line)."""


def jobid_to_summarize(env: Mapping[str, str]) -> str:
    """The job whose end this mail tells of, or NoSummary (a start mail, no job id)."""
    state = env.get("SLURM_JOB_STATE", "").strip().upper().split(" ")[0]
    mail_type = env.get("SLURM_JOB_MAIL_TYPE", "").strip().lower().replace(" ", "_")
    if not (state in END_STATES or (not state and mail_type in END_MAIL_TYPES)):
        raise NoSummary(f"not an end-of-job mail (type {mail_type or '-'}, state "
                        f"{state or '-'})")
    jobid = env.get("SLURM_JOB_ID", "")
    if not JOBID.fullmatch(jobid):
        raise NoSummary("no job id in SLURM_JOB_ID")
    return jobid


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
    if len(out) > MAX_REPORT_BYTES:
        raise NoSummary("the report's answer is too large")
    try:
        jobs = json.loads(out)["jobs"]
        job = next(j for j in jobs if str(j.get("job")) == jobid)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise NoSummary("the report's answer has no figures for the job") from None
    if not isinstance(job, dict):
        raise NoSummary("the report's answer has no figures for the job")
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
