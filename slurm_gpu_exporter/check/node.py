"""What the agent's own readers find on the node: cgroup layout, running jobs and
the trust of the spool and state dirs."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from slurm_gpu_exporter.agent.trust import UntrustedPathError, check_private_dir
from slurm_gpu_exporter.check.findings import Finding
from slurm_gpu_exporter.hooks.spool import JobRecord
from slurm_gpu_exporter.node.cgroup import CgroupFS, JobCgroup
from slurm_gpu_exporter.node.cgroup.files import UNIFIED
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.spool_reader import SpoolReader

_V1_PREFIX = "slurm_"
_V2_SUFFIX = "_slurmstepd.scope"


def root_node(root: Path) -> str | None:
    """The NodeName a multiple-slurmd root carries (``slurm_<node>``,
    ``<node>_slurmstepd.scope``), or None for a plain ``slurm`` / ``slurmstepd.scope``."""
    name = root.name
    if name.startswith(_V1_PREFIX):
        return name[len(_V1_PREFIX):]
    if name.endswith(_V2_SUFFIX):
        return name[: -len(_V2_SUFFIX)]
    return None


def check_trust(spool_dir: Path, state_dir: Path, trusted_uids: frozenset[int]) -> list[Finding]:
    """The agent's start-up checks on --spool-dir and --state-dir (it refuses to start
    on either failing)."""
    findings = []
    for flag, path, area in (("--spool-dir", spool_dir, "spool"),
                             ("--state-dir", state_dir, "state")):
        try:
            check_private_dir(path, flag, trusted_uids)
        except UntrustedPathError as exc:
            findings.append(Finding("block", area, f"the agent refuses to start: {exc}"))
            continue
        there = "" if path.is_dir() else " (not there yet: the agent creates it)"
        findings.append(Finding("ok", area, f"{flag} {path} is writable only by trusted "
                                            f"users{there}"))
    return findings


def check_cgroups(cgroups: CgroupFS, node_name: str,
                  jobs: Mapping[str, JobCgroup], running: int) -> list[Finding]:
    """Cgroup version, Slurm's roots and their layout; ``running``: jobs the spool says
    run here (a node with none may have no Slurm root yet)."""
    version = cgroups.version()
    roots = cgroups.slurm_roots()
    findings = [Finding("ok", "cgroup", f"cgroup v{version} at {cgroups.root}")]
    if not roots:
        severity = "block" if running else "warn"
        findings.append(Finding(severity, "cgroup",
                                f"no Slurm cgroup root under {cgroups.root} ({running} job(s) "
                                f"in the spool), so no process can be tied to a job; check "
                                f"--cgroup-root and that slurmd uses proctrack/cgroup and "
                                f"task/cgroup (slurmd makes some roots only at its first job)"))
        return findings
    for root in roots:
        findings.append(Finding("ok", "cgroup", f"Slurm root {root}"))
    nodes = {n for n in (root_node(r) for r in roots) if n is not None}
    if len(nodes) > 1:
        findings.append(Finding("note", "cgroup",
                                f"several slurmd instances ({', '.join(sorted(nodes))}): a job "
                                f"found under several counts once, with its figures added up"))
    elif nodes and node_name not in nodes:
        (other,) = nodes
        findings.append(Finding("warn", "cgroup",
                                f"the cgroup roots are node {other}'s but --node-name is "
                                f"{node_name}, so look-ups of discovered jobs ask about the "
                                f"wrong node; pass --node-name {other}"))
    sluid = sum(j.is_sluid for j in jobs.values())
    paths = (f"{sluid} by SLUID, {len(jobs) - sluid} by job id" if sluid
             else f"{len(jobs)} by job id")
    findings.append(Finding("ok", "cgroup", f"{len(jobs)} job cgroup(s) found ({paths})"))
    if version == 1 and jobs and not any("cpuacct" in j.dirs for j in jobs.values()):
        findings.append(Finding("warn", "cgroup",
                                "no job has a cpuacct cgroup, so jobs' CPU time is missing; "
                                "set JobAcctGatherType=jobacct_gather/cgroup in slurm.conf"))
    return findings


def read_spool(spool_dir: str, trusted_uids: frozenset[int]) -> dict[str, JobRecord]:
    """The spool's records of jobs that have not ended, read as the agent reads them."""
    quiet = logging.getLogger("slurm_gpu_exporter.node.spool_reader")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the check reports a missing spool itself
    try:
        records = SpoolReader(spool_dir, SourceErrors(), trusted_uids).read()
    finally:
        quiet.setLevel(level)
    return {jobid: rec for jobid, (_, rec) in records.items() if rec.end_time is None}


def _where(job: JobCgroup) -> str:
    path = job.dirs.get(UNIFIED) or job.dirs.get("freezer") or next(iter(job.dirs.values()))
    return os.fspath(path)


def check_jobs(records: Mapping[str, JobRecord], jobs: Mapping[str, JobCgroup],
               spool_exists: bool) -> list[Finding]:
    """Each running job and where it was found: spool record, cgroup, or both."""
    findings = []
    if not spool_exists:
        findings.append(Finding("note", "jobs", "the spool dir does not exist yet; the prolog "
                                                "creates it at the first job"))
    by_key = {rec.sluid or jobid: jobid for jobid, rec in records.items()}
    for jobid, rec in sorted(records.items()):
        key = rec.sluid or jobid
        cgroup = jobs.get(key) or jobs.get(jobid)
        gpus = rec.job_gpus or "none"
        if cgroup is None:
            findings.append(Finding("note", "jobs",
                                    f"job {jobid} (user {rec.user or rec.uid}, GPUs {gpus}): "
                                    f"spool record, no cgroup yet (starting or ending)"))
        else:
            findings.append(Finding("ok", "jobs",
                                    f"job {jobid} (user {rec.user or rec.uid}, GPUs {gpus}): "
                                    f"spool record and cgroup {_where(cgroup)}"))
    for key, cgroup in sorted(jobs.items()):
        if key in by_key or key in records:
            continue
        findings.append(Finding("warn", "jobs",
                                f"job {key}: cgroup {_where(cgroup)} only, no spool record, so "
                                f"its GPUs are known only through its processes; check that "
                                f"the Prolog runs slurm-gpu-exporter-prolog"))
    return findings
