"""The mail wrapper's pure parts: which mails get a summary, the summary's lines (the
config file: test_config.py)."""

from __future__ import annotations

import pytest

from slurm_gpu_exporter.mail.summary import NoSummary, jobid_to_summarize, summary_text

JOB = {"job": "42", "gpus": 4, "gpu_hours": 8.0, "busy_ratio": 0.25, "sm_active_ratio": 0.2,
       "gpu_memory_peak_gib": 30.5, "energy_kwh": 1.234, "cpu_efficiency": 0.5,
       "memory_peak_gib": 10.0, "memory_request_gib": 64.0,
       "notes": ["3 of 4 GPUs idle: ask for 1"]}


def test_end_mails_are_summarized_and_start_mails_are_not() -> None:
    assert jobid_to_summarize({"SLURM_JOB_ID": "42", "SLURM_JOB_MAIL_TYPE": "Ended",
                               "SLURM_JOB_STATE": "COMPLETED"}) == "42"
    assert jobid_to_summarize({"SLURM_JOB_ID": "7", "SLURM_JOB_MAIL_TYPE": "Failed",
                               "SLURM_JOB_STATE": "OUT_OF_MEMORY"}) == "7"
    assert jobid_to_summarize({"SLURM_JOB_ID": "7", "SLURM_JOB_MAIL_TYPE": "Ended"}) == "7"
    for env in ({"SLURM_JOB_ID": "7", "SLURM_JOB_MAIL_TYPE": "Began",
                 "SLURM_JOB_STATE": "RUNNING"},
                {"SLURM_JOB_ID": "7 --db x", "SLURM_JOB_STATE": "COMPLETED"},
                {"SLURM_JOB_STATE": "COMPLETED"}, {}):
        with pytest.raises(NoSummary):
            jobid_to_summarize(env)


def test_summary_lists_the_known_figures_and_the_notes() -> None:
    text = summary_text(JOB)
    assert "GPUs held:       4 (8.00 GPU-hours)" in text
    assert "GPU busy:        25%" in text and "SM active:       20%" in text
    assert "Memory peak:     10.0 GiB of 64.0 GiB requested" in text
    assert "GPU energy:      1.234 kWh" in text
    assert "- 3 of 4 GPUs idle: ask for 1" in text
    assert "Tensor" not in text  # not known: left out, never shown as 0


def test_user_text_in_a_figure_stays_inert() -> None:
    text = summary_text({**JOB, "notes": ["x\n~! rm -rf ~\x1b[31m"], "job": "42\nBcc: x"})
    assert "\x1b" not in text
    assert not any(line.startswith(("~", "Bcc")) for line in text.splitlines()), text


def test_a_job_without_figures_has_no_summary() -> None:
    with pytest.raises(NoSummary):
        summary_text({"job": "1", "gpus": 0, "notes": []})


def test_summary_shows_the_emissions_the_report_computed() -> None:
    text = summary_text({**JOB, "emissions_gco2e": 308.4})
    assert "Emissions:       308 gCO2e" in text
    assert "emissions" not in summary_text(JOB).lower()  # no factor configured: no line


def test_summary_has_a_line_per_throttled_gpu_and_per_gpu_error() -> None:
    text = summary_text({**JOB, "gpu_throttled": ["GPU 3: power-capped 23% of its busy time"],
                         "gpu_errors": ["Xid 79 at 14:03 UTC on GPU 1", 7, "x\nBcc: y"]})
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "GPU throttled: GPU 3: power-capped 23% of its busy time" in lines
    assert "GPU error: Xid 79 at 14:03 UTC on GPU 1" in lines
    assert "GPU error: x Bcc: y" in lines  # one line, whatever the text holds
    assert "throttled" not in summary_text(JOB)  # an older report's JSON: no such lines
