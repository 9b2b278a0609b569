"""``slurm-gpu-exporter check [--format text|json]`` with the agent's own flags."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from slurm_gpu_exporter.agent.flags import build_parser as agent_parser
from slurm_gpu_exporter.check.findings import Finding, exit_code, render_json, render_text
from slurm_gpu_exporter.check.gpus import check_gpus
from slurm_gpu_exporter.check.node import check_cgroups, check_jobs, check_trust, read_spool
from slurm_gpu_exporter.check.slurmconf import check_config, parse_config
from slurm_gpu_exporter.check.slurmside import LOCAL, SlurmAccess, check_lookup, read_config
from slurm_gpu_exporter.check.training import check_training
from slurm_gpu_exporter.gpu.backend import GpuBackend
from slurm_gpu_exporter.node.cgroup import CgroupFS


def build_parser() -> argparse.ArgumentParser:
    """The agent's parser (so ``check`` looks where the agent would) plus the check's flags."""
    p = agent_parser()
    p.prog = "slurm-gpu-exporter check"
    p.description = ("Print what the agent sees on this node and what stands between it and "
                     "right numbers; exit 1 when something does. Takes the agent's flags.")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="one line per finding, or JSON")
    p.add_argument("--slurm-conf", type=Path, metavar="FILE",
                   help="read this slurm.conf instead of asking scontrol show config")
    return p


def _nvml() -> GpuBackend:
    from slurm_gpu_exporter.gpu.nvml.backend import NvmlBackend

    return NvmlBackend()


def run_checks(args: argparse.Namespace, *, slurm: SlurmAccess = LOCAL,
               gpu: Callable[[], GpuBackend] = _nvml) -> list[Finding]:
    """Every finding, in the order the text output shows them."""
    trusted = frozenset({0, os.geteuid()})
    spool_dir, state_dir = Path(args.spool_dir), Path(args.state_dir)
    findings = check_lookup(slurm, args.slurm_lookup)
    cgroups = CgroupFS(args.cgroup_root)
    text, source = read_config(slurm, args.slurm_conf)
    findings.append(source)
    if text is not None:
        findings.extend(check_config(parse_config(text), cgroups.version()))
    trust = check_trust(spool_dir, state_dir, trusted)
    records = {} if any(f.severity == "block" and f.area == "spool" for f in trust) \
        else read_spool(str(spool_dir), trusted)
    jobs = cgroups.find_jobs(expected=[r.sluid or j for j, r in records.items()])
    findings.extend(check_cgroups(cgroups, args.node_name, jobs, len(records)))
    findings.extend(check_jobs(records, jobs, spool_dir.is_dir()))
    findings.extend(trust)
    findings.extend(check_training(spool_dir, args.training_relay))
    findings.extend(check_gpus(gpu(), args.proc_root))
    return findings


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    findings = run_checks(args)
    out = render_json(findings) if args.format == "json" else render_text(findings)
    sys.stdout.write(out)
    return exit_code(findings)
