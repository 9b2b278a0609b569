"""The report's default configuration, as the TOML a site copies and edits.

Thresholds follow Princeton's jobstats and Job Defense Shield: GPU utilization
red under 15 %, MIG-eligible at 1 GPU, ≤ 15 % busy, ≤ 10 GiB of GPU memory and
≤ 32 GiB of CPU memory; CPU efficiency red under 65 %; memory used under 70 % of
the request suggests ``--mem`` with 20 % headroom; under 10 % of the time limit
used suggests a shorter ``--time``.
"""

DEFAULT_CONFIG = '''\
# slurm-gpu-report configuration. Every key is optional; a [[notes]] entry with the
# name of a default note replaces it, "enabled = false" turns it off.

[low_util]
threshold = 0.25        # flag jobs whose GPU busy ratio is under this (0..1)
min_gpu_hours = 0.0     # ... and that held at least this many GPU-hours
chart_jobs = 10         # flagged jobs charted over time in the HTML report
slowed_share = 0.2      # mark a flagged job slowed by its GPU (power, thermal, board
                        # limit, reliability) from this share of its busy GPU time

[facts]
memory_headroom = 0.2   # --mem suggestions: the peak plus this share
time_headroom = 0.2     # --time suggestions: the run time plus this share

[energy]
# Grid carbon intensity in gCO2e per kWh (your grid operator's or your supplier's
# figure): the job report and the job-end summary show each job's energy times it.
# 0 shows no emissions. Nothing is fetched from anywhere.
emissions_gco2e_per_kwh = 0
# Or a series in Prometheus that the site fills (a metric name or a PromQL selector of
# one series, in gCO2e/kWh, say from its grid operator): each step's energy times the
# series then. Where it has no data, the constant above stands in (the report says so).
emissions_series = ""

[notify]
repeat_after_days = 7   # a job is not reported to its user again within this
# The mail relay's login, for --notify smtp:// and --report-to (each --smtp-* flag wins
# over its key): STARTTLS with the server's certificate checked (system CAs, or this CA
# file), then SMTP AUTH with the password in that file (never the password here).
smtp_starttls = false
smtp_ca_file = ""
smtp_user = ""
smtp_password_file = ""
subject = "GPU jobs flagged for low utilization ({count})"
template = """
Hello {user},

{count} of your jobs held GPUs without using them much between {start} and {end}:

{jobs}

Together they held {gpu_hours:.1f} GPU-hours, of which {wasted_gpu_hours:.1f} were idle.
Run "slurm-gpu-report job JOBID" for the details of one job.
"""
job_line = "  job {jobid} ({name}): {gpus} GPU(s), {gpu_hours:.1f} GPU-h, busy {busy_ratio:.0%}"

# A note fires when every condition in "when" holds; a fact that is unknown never
# satisfies a condition. Operators: < <= == != >= >. "stop = true" hides later notes.

[[notes]]
name = "gpu-errors"
when = [{fact = "gpu_xid_errors", op = ">=", value = 1}]
message = """The GPUs reported errors while the job ran ({gpu_error_list}): if the job \
failed, the GPU may be at fault rather than your code; the admins see these too."""

[[notes]]
name = "too-short"
when = [{fact = "runtime_s", op = "<", value = 300}]
message = "The job ran {runtime} only: too short to judge its efficiency."
stop = true

[[notes]]
name = "gpu-never-used"
when = [{fact = "gpu_busy_ratio", op = "==", value = 0}]
message = """GPU never used: the job held {gpus} GPU(s) for {gpu_hours:.1f} GPU-hours and ran \
nothing on them. Check that your code sees the GPU, or run it without --gres=gpu."""

[[notes]]
name = "idle-gpus"
when = [{fact = "idle_gpus", op = ">=", value = 1}, {fact = "used_gpus", op = ">=", value = 1}]
message = """{idle_gpus} of the job's {gpus} GPUs were never used: request \
--gres=gpu:{used_gpus}, or make the code use all of them."""

[[notes]]
name = "gpu-slowed"
when = [{fact = "gpu_slowed_ratio", op = ">=", value = 0.1}]
message = """GPU {slowed_gpu} was {slowed_reason} {gpu_slowed_ratio:.0%} of the time it \
was busy: the GPU, not the job's code, held it back. Tell the admins if it recurs."""

[[notes]]
name = "low-gpu-utilization"
when = [{fact = "gpu_busy_ratio", op = ">", value = 0},
        {fact = "gpu_busy_ratio", op = "<", value = 0.15}]
message = """GPU utilization is low ({gpu_busy_ratio:.0%}): profile the job, feed the GPU \
faster (more data-loader workers), or use a smaller GPU."""

[[notes]]
name = "mig-eligible"
when = [{fact = "gpus", op = "==", value = 1},
        {fact = "gpu_busy_ratio", op = "<=", value = 0.15},
        {fact = "gpu_memory_peak_gib", op = "<=", value = 10},
        {fact = "memory_peak_gib", op = "<=", value = 32}]
message = """This job could run on a MIG slice: it used {gpu_busy_ratio:.0%} of one GPU, \
{gpu_memory_peak_gib:.1f} GiB of GPU memory and {memory_peak_gib:.1f} GiB of CPU memory."""

[[notes]]
name = "low-cpu-efficiency"
when = [{fact = "cpu_efficiency", op = "<", value = 0.65}, {fact = "cpus", op = ">", value = 1}]
message = """CPU efficiency is {cpu_efficiency:.0%} of {cpus} CPUs: request fewer CPUs \
(--cpus-per-task) or use more of them."""

[[notes]]
name = "memory-overrequested"
when = [{fact = "finished", op = "==", value = 1},
        {fact = "memory_used_ratio", op = "<", value = 0.70}]
message = """The job used {memory_peak_gib:.1f} GiB of the {memory_request_gib:.1f} GiB it \
requested: request less memory next time, --mem={suggested_memory_gib}G."""

[[notes]]
name = "time-overrequested"
when = [{fact = "finished", op = "==", value = 1},
        {fact = "time_used_ratio", op = "<", value = 0.10}]
message = """The job ran {runtime} of its {time_limit} time limit: request less time, \
--time={suggested_time}, and it will start sooner."""
'''
