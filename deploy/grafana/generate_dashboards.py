#!/usr/bin/env python3
"""Write the Grafana dashboards in dashboards/ (job, user, cluster, node).

The JSON in dashboards/ is what sites import or provision; this script is how it is
kept consistent (one datasource variable, one label filter, stable uids, one node-name
join: dashboard_parts.py). Edit here and rerun it:  python3 deploy/grafana/generate_dashboards.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboard_parts import (
    DS,
    JOB,
    JOB_LINK,
    JOB_NODES,
    NODE,
    USER,
    C,
    Panel,
    cluster_var,
    dashboard,
    job_nodes_var,
    named,
    node_vars,
    panel,
    ratio_thresholds,
    target,
    var_query,
    with_ratio_colours,
)

OUT = Path(__file__).resolve().parent / "dashboards"


def job_dashboard() -> dict:
    per_gpu = "cluster, instance, gpu"
    held = f"slurm_job_gpu_allocated_seconds_total{{{JOB}}}"
    busy = f"slurm_job_gpu_busy_seconds_total{{{JOB}}}"
    sm_active = f"slurm_job_gpu_sm_active_seconds_total{{{JOB}}}"
    # SM activity (NVML GPM) is over the time held on the GPUs that measure it.
    held_gpm = (f"last_over_time({held}[$__range])"
                f" and on (cluster, instance, gpu) last_over_time({sm_active}[$__range])")
    panels = [
        panel("table", "Job", [target(
            f"max by (cluster, jobid, user, account, partition, name, array_job_id, "
            f"array_task_id, source) (slurm_job_info{{{JOB}}})", instant=True)], 24, 4,
            transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value": True}}}]),
        with_ratio_colours(panel("stat", "Mean GPU busy / SM active over the job's life", [
            target(f"sum(last_over_time({busy}[$__range]))"
                   f" / sum(last_over_time({held}[$__range]))", "busy", instant=True),
            target(f"sum(last_over_time({sm_active}[$__range]))"
                   f" / sum({held_gpm})", "SM active",
                   instant=True)], 6, 5, "percentunit",
            "Busy seconds / held seconds from the job's own counters: exact, whatever the "
            "scrape interval. SM active: the share of SMs busy (NVML GPM, Hopper and later; "
            "absent without it), over the time held on the GPUs that measure it.")),
        panel("stat", "GPUs held / held idle now", [
            target(f"sum(slurm_job_gpus{{{JOB}}})", "held", instant=True),
            target(f"count(rate({busy}[5m]) == 0 and rate({held}[5m]) > 0) or vector(0)",
                   "held idle", instant=True)], 6, 5),
        panel("stat", "Energy: GPU / CPU and DRAM", [
            target(f"sum(last_over_time(slurm_job_gpu_energy_joules_total{{{JOB}}}[$__range]))"
                   " / 3.6e6", "GPU", instant=True),
            target(f"sum(last_over_time(slurm_job_cpu_energy_joules_total{{{JOB}}}[$__range]))"
                   " / 3.6e6", "CPU and DRAM", instant=True, ref="B")], 6, 5, "kwatth",
            "GPU: measured by the driver, split by busy share on a shared GPU (by SM share on "
            "MIG). CPU and DRAM: the node's RAPL energy shared by CPU time, an estimate."),
        panel("stat", "Peak memory / GPU memory", [
            target(f"max(max_over_time(slurm_job_memory_peak_bytes{{{JOB}}}[$__range]))",
                   "host memory peak", instant=True),
            target(f"max(max_over_time(slurm_job_gpu_memory_peak_bytes{{{JOB}}}[$__range]))",
                   "GPU memory peak (one GPU)", instant=True)], 6, 5, "bytes"),
        with_ratio_colours(panel("timeseries", "GPU busy and SM active per GPU", [
            target(named(f"sum by ({per_gpu}) (rate({busy}[$__rate_interval]))"
                         f" / sum by ({per_gpu}) (rate({held}[$__rate_interval]))",
                         JOB_NODES), "{{slurm_node}} GPU {{gpu}} busy"),
            target(named(f"sum by ({per_gpu}) (rate({sm_active}[$__rate_interval]))"
                         f" / sum by ({per_gpu}) (rate({held}[$__rate_interval]))",
                         JOB_NODES), "{{slurm_node}} GPU {{gpu}} SM active")],
            12, 8, "percentunit",
            "Busy: some kernel ran. SM active: the share of SMs that did (NVML GPM, Hopper "
            "and later; on a GPU the job has to itself or a MIG instance).")),
        with_ratio_colours(panel("bargauge", "GPU busy per GPU over the job's life "
            "(red: held idle)", [target(named(
                f"sum by ({per_gpu}) (last_over_time({busy}[$__range]))"
                f" / sum by ({per_gpu}) (last_over_time({held}[$__range]))", JOB_NODES),
            "{{slurm_node}} GPU {{gpu}}", instant=True)], 12, 8, "percentunit",
            options={"displayMode": "basic", "orientation": "horizontal"})),
        panel("timeseries", "GPU memory used against total", [
            target(named(f"sum by ({per_gpu}) (slurm_job_gpu_memory_used_bytes{{{JOB}}})",
                         JOB_NODES), "{{slurm_node}} GPU {{gpu}} used"),
            target(named(f"max by ({per_gpu}) (slurm_gpu_memory_total_bytes{{{C}}} and on "
                         f"(cluster, instance, gpu) slurm_job_gpu_memory_used_bytes{{{JOB}}})",
                         JOB_NODES), "{{slurm_node}} GPU {{gpu}} total")], 12, 8, "bytes"),
        panel("timeseries", "GPU power", [
            target(named(f"sum by ({per_gpu}) (rate("
                         f"slurm_job_gpu_energy_joules_total{{{JOB}}}[$__rate_interval]))",
                         JOB_NODES), "{{slurm_node}} GPU {{gpu}} job's share"),
            target(named(f"max by ({per_gpu}) (slurm_gpu_power_watts{{{C}}} and on (cluster, "
                         f"instance, gpu) slurm_job_gpu_allocated_seconds_total{{{JOB}}})",
                         JOB_NODES), "{{slurm_node}} GPU {{gpu}} device")], 12, 8, "watt"),
        panel("timeseries", "CPU used against allocated", [
            target(f"sum(rate(slurm_job_cpu_seconds_total{{{JOB}}}[$__rate_interval]))",
                   "cores used"),
            target(f"sum(slurm_job_cpus{{{JOB}}})", "cores allocated")], 12, 8, "short"),
        panel("timeseries", "CPU and DRAM power (the job's share)", [target(named(
            f"sum by (cluster, instance, domain) "
            f"(rate(slurm_job_cpu_energy_joules_total{{{JOB}}}[$__rate_interval]))",
            JOB_NODES), "{{slurm_node}} {{domain}}")], 12, 8, "watt",
            "The node's RAPL energy times the job's share of the node's busy CPU time."),
        panel("timeseries", "Memory used against limit", [
            target(f"sum(slurm_job_memory_used_bytes{{{JOB}}})", "used"),
            target(f"sum(slurm_job_memory_limit_bytes{{{JOB}}})", "limit")], 12, 8, "bytes"),
        *gpu_events_row(busy),
        *training_row(),
    ]
    return dashboard(
        "slurm-gpu-job", "Slurm GPU: job",
        "One Slurm job: its GPUs' busy time, memory, power and energy, what slowed its "
        "GPUs and the errors they reported, its CPU and memory against what it asked for, "
        "and the training progress its scripts publish.",
        [cluster_var(), var_query("jobid", "Job",
                                  'label_values(slurm_job_info{cluster=~"$cluster"}, jobid)'),
         job_nodes_var(),
         {"name": "mlflow", "label": "MLflow", "type": "textbox", "query": "", "hide": 0,
          "current": {"text": "", "value": ""},
          "description": "The MLflow tracking server's URL: the MLflow runs table links there"}],
        panels, time_from="now-3h", annotations=[xid_annotation()])


XID_LAST = f"slurm_job_gpu_xid_last_timestamp_seconds{{{JOB}}}"


def gpu_events_row(busy: str) -> list[Panel]:
    """What slowed the job's GPUs (throttled share by reason) and the Xids they raised."""
    throttled = f"slurm_job_gpu_throttled_seconds_total{{{JOB}}}"
    errors = "|".join(("ecc_errors", "remapped_rows", "pcie_replays", "nvlink_errors"))
    return [
        panel("bargauge", "GPU slowed: share of its busy time, by reason", [target(named(
            f"sum by (cluster, instance, gpu, reason) (last_over_time({throttled}[$__range]))"
            f" / on (cluster, instance, gpu) group_left sum by (cluster, instance, gpu) "
            f"(last_over_time({busy}[$__range]))", JOB_NODES),
            "{{slurm_node}} GPU {{gpu}} {{reason}}", instant=True)], 12, 8, "percentunit",
            "Seconds the GPU ran below its clocks for each reason (NVML's clock-event "
            "reasons: power, thermal, board_limit, reliability, sync_boost, "
            "low_utilization, app_clocks, base_clocks) over the seconds it was busy, over "
            "the job's life. power and thermal while busy: the GPU, not the code, held the "
            "job back. low_utilization follows from idleness. A reason the GPU does not "
            "report has no bar.",
            options={"displayMode": "basic", "orientation": "horizontal"},
            fieldConfig={"defaults": {"unit": "percentunit", "min": 0, "max": 1},
                         "overrides": []}),
        panel("table", "GPU errors while the job held the GPU (Xid: last at)", [
            target(named(f"max by (cluster, instance, gpu, xid) "
                         f"(last_over_time({XID_LAST}[$__range])) * 1000", JOB_NODES),
                   instant=True),
            target(named(f"max by (cluster, instance, gpu, xid) (last_over_time("
                         f"slurm_job_gpu_xid_errors_total{{{JOB}}}[$__range]))", JOB_NODES),
                   instant=True),
            # The counter's name as a label: the join drops __name__.
            target(named(f"max by (counter, cluster, instance, gpu, type, cause, kind) "
                         f"(label_join({{__name__=~\"slurm_job_gpu_({errors})_total\", "
                         f'{JOB}}}, "counter", "", "__name__")) > 0', JOB_NODES),
                   instant=True)], 12, 8, "",
            "Xid codes with the time of the job's last one and how many; ECC errors, "
            "remapped rows, PCIe replays and NVLink errors where non-zero. Empty when "
            "nothing went wrong.",
            transformations=[{"id": "merge", "options": {}}, {"id": "organize", "options": {
                "excludeByName": {"Time": True, "instance": True},
                "renameByName": {"Value #A": "last Xid at", "Value #B": "Xids",
                                 "Value #C": "errors", "slurm_node": "node"}}}],
            fieldConfig={"defaults": {}, "overrides": [
                {"matcher": {"id": "byName", "options": "last Xid at"},
                 "properties": [{"id": "unit", "value": "dateTimeAsIso"}]}]}),
    ]


def xid_annotation() -> dict:
    """A mark on every time panel at each Xid's time, from the series' own value."""
    return {"name": "Xid", "datasource": DS, "enable": True, "iconColor": "red",
            "expr": named(f"max by (cluster, instance, gpu, xid) ({XID_LAST}) * 1000",
                          JOB_NODES),
            "useValueForTime": True, "step": "60s",
            "titleFormat": "Xid {{xid}}", "textFormat": "GPU {{gpu}} on {{slurm_node}}",
            "tagKeys": "xid,gpu"}


def training_row() -> list[Panel]:
    """The job's training progress, as its scripts publish it through the agent (empty for
    a job that publishes nothing)."""
    samples = f"slurm_job_training_samples_total{{{JOB}}}"
    steps = f"slurm_job_training_steps_total{{{JOB}}}"
    return [
        panel("row", "Training (published by the job's scripts)", [], 24, 1,
              collapsed=False, panels=[]),
        panel("stat", "Since the last step", [target(
            f"time() - max(slurm_job_training_last_step_timestamp_seconds{{{JOB}}})",
            instant=True)], 6, 8, "s",
            "Seconds since the script last called training.step(); the "
            "SlurmJobTrainingStalled alert fires past 15 minutes while the job holds GPUs.",
            fieldConfig={"defaults": {"unit": "s", "thresholds": {"mode": "absolute", "steps": [
                {"color": "green", "value": None}, {"color": "orange", "value": 300},
                {"color": "red", "value": 900}]}, "color": {"mode": "thresholds"}},
                "overrides": []}),
        panel("timeseries", "Loss", [target(
            named(f"max by (cluster, instance) (slurm_job_training_loss{{{JOB}}})"),
            "{{slurm_node}}")],
            6, 8, "short"),
        panel("timeseries", "Throughput", [
            target(f"sum(rate({samples}[$__rate_interval]))", "samples/s"),
            target(f"sum(rate({steps}[$__rate_interval]))", "steps/s")], 6, 8, "short",
            "Samples and steps per second from the counters the script reports; the "
            "SlurmJobTrainingThroughputDrop alert compares samples/s with its 1-hour mean."),
        panel("timeseries", "Learning rate", [target(
            named(f"max by (cluster, instance) (slurm_job_training_learning_rate{{{JOB}}})"),
            "{{slurm_node}}")], 6, 8, "short"),
        mlflow_runs(),
    ]


def mlflow_runs() -> Panel:
    """The MLflow runs the job's scripts had active (docs/training.md), each linked to
    the run on the tracking server the dashboard's MLflow variable names."""
    return panel("table", "MLflow runs", [target(
        f"max by (run_id, experiment_id) "
        f"(last_over_time(slurm_job_mlflow_run_info{{{JOB}}}[$__range]))", instant=True)],
        24, 4, description="Runs of the job's scripts that logged to MLflow; the run is "
        "tagged slurm.job_id, and slurm-gpu-report mlflow writes the job's figures into it "
        "after the job ends. Set the MLflow variable to the tracking server's URL to link "
        "each run.",
        transformations=[{"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True}}}],
        fieldConfig={"defaults": {}, "overrides": [
            {"matcher": {"id": "byName", "options": "run_id"}, "properties": [
                {"id": "links", "value": [{
                    "title": "MLflow run ${__data.fields.run_id}",
                    "url": "${mlflow}/#/experiments/${__data.fields.experiment_id}"
                           "/runs/${__data.fields.run_id}", "targetBlank": True}]}]}]})


def user_dashboard() -> dict:
    held = f"slurm_job_gpu_allocated_seconds_total{{{USER}}}"
    busy = f"slurm_job_gpu_busy_seconds_total{{{USER}}}"
    hours = "/ 3600"
    panels = [
        panel("stat", "GPU-hours held", [target(
            f"sum(increase({held}[$__range])) {hours}", instant=True)], 6, 5, "short"),
        panel("stat", "GPU-hours busy", [target(
            f"sum(increase({busy}[$__range])) {hours}", instant=True)], 6, 5, "short"),
        panel("stat", "GPU-hours held idle", [target(
            f"avg_over_time(user:slurm_job_gpu_idle_seconds:rate5m{{{USER}}}[$__range])"
            f" * $__range_s {hours}", instant=True)], 6, 5, "short",
            "Held and not busy, from the recorded 5-minute rates."),
        panel("stat", "Energy: GPU / CPU and DRAM", [
            target(f"sum(increase(slurm_job_gpu_energy_joules_total{{{USER}}}[$__range]))"
                   " / 3.6e6", "GPU", instant=True),
            target(f"sum(increase(slurm_job_cpu_energy_joules_total{{{USER}}}[$__range]))"
                   " / 3.6e6", "CPU and DRAM", instant=True, ref="B")], 6, 5, "kwatth"),
        with_ratio_colours(panel("timeseries", "GPU busy share", [target(
            f"user:slurm_job_gpu_busy:ratio_rate5m{{{USER}}}", "{{cluster}}")],
            12, 8, "percentunit")),
        panel("timeseries", "GPUs held and held idle", [
            target(f"user:slurm_job_gpu_allocated_seconds:rate5m{{{USER}}}",
                   "held {{cluster}}"),
            target(f"user:slurm_job_gpus_held_idle:count_rate5m{{{USER}}}",
                   "held idle {{cluster}}")], 12, 8, "short"),
        panel("table", "Jobs (click a job for its dashboard)", [
            target(f"max by (cluster, jobid, account, partition, name) "
                   f"(max_over_time(slurm_job_info{{{USER}}}[$__range]))", instant=True),
            target(f"sum by (cluster, jobid) (last_over_time({busy}[$__range]))"
                   f" / sum by (cluster, jobid) (last_over_time({held}[$__range]))",
                   instant=True),
            target(f"min by (cluster, jobid) "
                   f"(min_over_time(slurm_job_start_time_seconds{{{USER}}}[$__range])) * 1000",
                   instant=True),
            target(f"max by (cluster, jobid) (max_over_time("
                   f"timestamp(slurm_job_info{{{USER}}})[$__range:$__interval])) * 1000",
                   instant=True)],
            24, 10,
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": {"Value #A": "info", "Value #B": "mean GPU busy",
                                     "Value #C": "start", "Value #D": "last seen"}}}],
            fieldConfig={"defaults": {}, "overrides": [
                {"matcher": {"id": "byName", "options": "jobid"}, "properties": [
                    {"id": "links", "value": [{
                        "title": "Job ${__data.fields.jobid}",
                        "url": JOB_LINK + "&from=${__data.fields.start}"
                                          "&to=${__data.fields[\"last seen\"]}"}]}]},
                {"matcher": {"id": "byName", "options": "mean GPU busy"},
                 "properties": [{"id": "unit", "value": "percentunit"},
                                {"id": "thresholds", "value": ratio_thresholds()},
                                {"id": "custom.cellOptions",
                                 "value": {"type": "color-background"}}]},
                {"matcher": {"id": "byName", "options": "start"},
                 "properties": [{"id": "unit", "value": "dateTimeAsIso"}]},
                {"matcher": {"id": "byName", "options": "last seen"},
                 "properties": [{"id": "unit", "value": "dateTimeAsIso"}]},
                {"matcher": {"id": "byName", "options": "info"},
                 "properties": [{"id": "custom.hidden", "value": True}]}]}),
    ]
    return dashboard(
        "slurm-gpu-user", "Slurm GPU: user",
        "One user's GPU-hours held, busy and idle, energy, and jobs.",
        [cluster_var(), var_query("user", "User",
                                  'label_values(slurm_job_info{cluster=~"$cluster"}, user)')],
        panels, time_from="now-7d")


def cluster_dashboard() -> dict:
    panels = [
        panel("stat", "GPUs", [target(f"sum(cluster:slurm_gpus:count{{{C}}})",
                                      instant=True)], 4, 5),
        panel("stat", "GPUs held", [target(
            f"sum(cluster:slurm_job_gpu_allocated_seconds:rate5m{{{C}}})", instant=True)],
            4, 5, "short"),
        panel("stat", "GPUs held idle", [target(
            f"sum(cluster:slurm_job_gpus_held_idle:count_rate5m{{{C}}}) or vector(0)",
            instant=True)], 4, 5, "short",
            fieldConfig={"defaults": {"color": {"mode": "thresholds"}, "thresholds": {
                "mode": "absolute", "steps": [{"color": "green", "value": None},
                                              {"color": "red", "value": 1}]}},
                "overrides": []}),
        with_ratio_colours(panel("stat", "Held GPUs busy", [target(
            f"sum(cluster:slurm_job_gpu_busy_seconds:rate5m{{{C}}})"
            f" / sum(cluster:slurm_job_gpu_allocated_measured_seconds:rate5m{{{C}}})",
            instant=True)], 4, 5, "percentunit")),
        panel("stat", "GPU power", [target(
            f"sum(cluster:slurm_gpu_energy_joules:rate5m{{{C}}})", instant=True)],
            4, 5, "watt"),
        panel("stat", "Agents up", [target(
            f'sum(up{{job="slurm-gpu-exporter", {C}}}) '
            f'/ count(up{{job="slurm-gpu-exporter", {C}}})', instant=True)],
            4, 5, "percentunit"),
        panel("timeseries", "GPUs: total, held, busy, held idle", [
            target(f"sum(cluster:slurm_gpus:count{{{C}}})", "total"),
            target(f"sum(cluster:slurm_job_gpu_allocated_seconds:rate5m{{{C}}})", "held"),
            target(f"sum(cluster:slurm_job_gpu_busy_seconds:rate5m{{{C}}})", "busy"),
            target(f"sum(cluster:slurm_job_gpus_held_idle:count_rate5m{{{C}}})",
                   "held idle")], 24, 8, "short"),
        panel("bargauge", "Top wasters by user: GPU-hours held idle", [target(
            f"topk(10, sum by (user) (avg_over_time("
            f"user:slurm_job_gpu_idle_seconds:rate5m{{{C}}}[$__range])) * $__range_s / 3600)",
            "{{user}}", instant=True)], 12, 9, "short",
            options={"displayMode": "basic", "orientation": "horizontal"}),
        panel("bargauge", "Top wasters by account: GPU-hours held idle", [target(
            f"topk(10, sum by (account) (avg_over_time("
            f"account:slurm_job_gpu_idle_seconds:rate5m{{{C}}}[$__range])) * $__range_s / 3600)",
            "{{account}}", instant=True)], 12, 9, "short",
            options={"displayMode": "basic", "orientation": "horizontal"}),
        panel("table", "Jobs holding idle GPUs now (click a job)", [target(
            f"jobid_user:slurm_job_gpus_held_idle:count_rate5m{{{C}}} > 0",
            instant=True)], 12, 9,
            fieldConfig={"defaults": {"links": [{"title": "Job ${__data.fields.jobid}",
                                                 "url": JOB_LINK}]}, "overrides": []}),
        panel("timeseries", "GPU memory used outside Slurm jobs, by user",
              [target(f"user:slurm_gpu_unattributed_memory_bytes:sum{{{C}}}",
                      "{{cluster}} {{user}}")], 12, 9, "bytes",
              "GPU processes of no Slurm job (ssh sessions, daemons), by their owner."),
        panel("table", "Exporter health", [
            target(named(f'max by (cluster, instance) (up{{job="slurm-gpu-exporter", {C}}})'),
                   instant=True),
            target(named(f"max by (cluster, instance) (slurm_gpu_exporter_nvml_up{{{C}}})"),
                   instant=True),
            target(named(f"max by (cluster, instance) (time() - "
                         f"slurm_gpu_exporter_last_sample_timestamp_seconds{{{C}}})"),
                   instant=True),
            target(named(f"sum by (cluster, instance) (increase("
                         f"slurm_gpu_exporter_sample_errors_total{{{C}}}[1h]))"),
                   instant=True)],
            24, 8, "Each agent by its Slurm node (its target where it names none) and its "
            "scrape target.",
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {
                    "indexByName": {"cluster": 0, "slurm_node": 1, "instance": 2},
                    "excludeByName": {"Time": True, "__name__": True, "job": True},
                    "renameByName": {"slurm_node": "node", "instance": "target",
                                     "Value #A": "up", "Value #B": "NVML up",
                                     "Value #C": "snapshot age (s)",
                                     "Value #D": "sample errors (1h)"}}}]),
    ]
    return dashboard(
        "slurm-gpu-cluster", "Slurm GPU: cluster",
        "GPUs held and idle, top wasters by user and account, GPU use outside jobs, and "
        "the agents' health.", [cluster_var()], panels, time_from="now-24h")


def node_dashboard() -> dict:
    gpu = "{{slurm_node}} GPU {{gpu}}"
    job_link = JOB_LINK.replace("${__data.fields.cluster}", "$cluster")
    panels = [
        with_ratio_colours(panel("timeseries", "GPU utilization", [target(
            named(f"slurm_gpu_utilization_ratio{{{NODE}}}"), gpu)], 12, 8, "percentunit")),
        panel("table", "Jobs on the GPUs now", [target(named(
            f"max by (cluster, instance, gpu, jobid, user) "
            f"(slurm_job_gpu_utilization_ratio{{{NODE}}})"), instant=True)], 12, 8,
            transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "instance": True},
                "renameByName": {"slurm_node": "node", "Value": "utilization"}}}],
            fieldConfig={"defaults": {"links": [{"title": "Job ${__data.fields.jobid}",
                                                 "url": job_link}]},
                         "overrides": []}),
        panel("timeseries", "GPU memory used", [
            target(named(f"slurm_gpu_memory_used_bytes{{{NODE}}}"), gpu),
            target(named(f"max by (cluster, instance) (slurm_gpu_memory_total_bytes{{{NODE}}})"),
                   "{{slurm_node}} total")], 12, 8, "bytes"),
        panel("timeseries", "GPU temperature", [target(
            named(f"slurm_gpu_temperature_celsius{{{NODE}}}"), gpu)], 12, 8, "celsius"),
        panel("timeseries", "GPU power", [target(
            named(f"slurm_gpu_power_watts{{{NODE}}}"), gpu)], 12, 8, "watt"),
        panel("timeseries", "CPU and DRAM power: jobs and outside jobs", [
            target(named(f"sum by (cluster, instance, jobid) (rate("
                         f"slurm_job_cpu_energy_joules_total{{{NODE}}}[$__rate_interval]))"),
                   "{{slurm_node}} job {{jobid}}"),
            target(named(f"sum by (cluster, instance) (rate("
                         f"slurm_cpu_outside_jobs_energy_joules_total{{{NODE}}}"
                         "[$__rate_interval]))"), "{{slurm_node}} outside jobs", ref="B"),
            target(named(f"sum by (cluster, instance) "
                         f"(rate(slurm_cpu_energy_joules_total{{{NODE}}}[$__rate_interval]))"),
                   "{{slurm_node}} measured (RAPL)", ref="C")], 12, 8, "watt",
            "Measured: the sockets' RAPL counters. Each job's share is by its CPU time; the "
            "rest (idle power, processes outside jobs) is outside jobs."),
        panel("timeseries", "Node power: jobs and outside jobs", [
            target(named(f"sum by (cluster, instance, jobid) (rate("
                         f"slurm_job_node_energy_joules_total{{{NODE}}}[$__rate_interval]))"),
                   "{{slurm_node}} job {{jobid}}"),
            target(named(f"sum by (cluster, instance) (rate("
                         f"slurm_node_outside_jobs_energy_joules_total{{{NODE}}}"
                         "[$__rate_interval]))"), "{{slurm_node}} outside jobs", ref="B"),
            target(named(f"sum by (cluster, instance) (slurm_node_power_watts{{{NODE}}})"),
                   "{{slurm_node}} measured (meter)", ref="C")],
            12, 8, "watt",
            "Measured: the node's power meter (hwmon or the site's command). Each job's share "
            "is by its GPU energy plus its CPU share, an estimate; the rest is outside jobs."),
        panel("timeseries", "CPU cores used per job", [target(named(
            f"sum by (cluster, instance, jobid) "
            f"(rate(slurm_job_cpu_seconds_total{{{NODE}}}[$__rate_interval]))"),
            "{{slurm_node}} job {{jobid}}")], 12, 8, "short"),
        panel("timeseries", "GPU processes outside Slurm jobs", [target(
            named(f"slurm_gpu_unattributed_processes{{{NODE}}}"), gpu + " {{user}}")],
            12, 8, "short"),
        panel("table", "GPU errors in the time range", [
            target(named(f"sum by (cluster, instance, gpu) (increase(slurm_gpu_ecc_errors_total"
                         f'{{{NODE}, type="uncorrected"}}[$__range]))'), instant=True),
            target(named(f"sum by (cluster, instance, gpu) "
                         f"(increase(slurm_gpu_xid_errors_total{{{NODE}}}[$__range]))"
                         f" or sum by (cluster, instance, gpu) (slurm_gpu_info{{{NODE}}}) * 0"),
                   instant=True),
            target(named(f"max by (cluster, instance, gpu) (slurm_gpu_lost{{{NODE}}})"),
                   instant=True)], 12, 8,
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {
                    "excludeByName": {"Time": True, "instance": True},
                    "renameByName": {"slurm_node": "node", "Value #A": "uncorrected ECC",
                                     "Value #B": "Xid", "Value #C": "lost"}}}]),
        panel("timeseries", "Agent sample duration by source", [target(
            named(f"slurm_gpu_exporter_sample_duration_seconds{{{NODE}}}"),
            "{{slurm_node}} {{source}}")], 24, 7, "s"),
    ]
    return dashboard(
        "slurm-gpu-node", "Slurm GPU: node",
        "Slurm nodes' GPUs, the jobs on them, and the agent. Nodes are picked and shown "
        "by their Slurm names (an agent that publishes none: by its scrape target).",
        [cluster_var(), *node_vars()], panels)


DASHBOARDS = {"job": job_dashboard, "user": user_dashboard,
              "cluster": cluster_dashboard, "node": node_dashboard}


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"slurm-gpu-{name}.json": json.dumps(build(), indent=2) + "\n"
            for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUT, help="directory to write to")
    args = parser.parse_args(argv)
    try:
        args.output.mkdir(parents=True, exist_ok=True)
        for name, text in render_all().items():
            (args.output / name).write_text(text)
    except OSError as exc:
        print(f"generate_dashboards: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
