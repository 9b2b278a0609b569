"""Prolog and epilog as slurmd runs them, on an installed node.

A wheel is built from the checkout (and from each ``--also DIR``, another checkout such as
the code before a change) and installed into a fresh venv, as the Ansible role installs it
in /opt/slurm-gpu-exporter. Then ``prolog/slurm-gpu-exporter.sh`` and
``epilog/slurm-gpu-exporter.sh`` of that checkout run with slurmd's bare environment (no
PATH, only SLURM_* variables and the GPU lists), the prefix set through a defaults file
of their own as /etc/default/slurm-gpu-exporter sets it, the spool through
SLURM_GPU_EXPORTER_SPOOL_DIR: one prolog and then the epilog of the same job is a pair.
The checkouts take turns pair by pair, so a shared machine's load falls on each alike.
Wall time and CPU time (shell and interpreter, from the children's rusage).

    .venv/bin/python bench/hooks.py [--pairs 60] [--also /tmp/before-checkout] [--tag X]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import percentile, record, yardstick

ROOT = Path(__file__).resolve().parents[1]
ENV = {"SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "physics",
       "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
       "GPU_DEVICE_ORDINAL": "0,1", "SLURMD_NODENAME": "node1", "SLURM_CLUSTER_NAME": "c1",
       "SLURM_JOB_QOS": "normal"}


class Install:
    """One checkout's wheel in its own venv, and its hook scripts reading their own
    defaults file (the prefix and the spool)."""

    def __init__(self, name: str, source: Path, base: Path) -> None:
        self.name = name
        self.spool = base / "spool"
        prefix = base / "prefix"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--wheel-dir", str(base / "dist"),
                        str(source)], check=True, timeout=600)
        (wheel,) = (base / "dist").glob("slurm_gpu_exporter-*.whl")
        # As the role makes it: `python -m venv` (pip and setuptools in it, so
        # site-packages holds their .pth files), then the wheel.
        subprocess.run([sys.executable, "-m", "venv", str(prefix)], check=True, timeout=300)
        subprocess.run([str(prefix / "bin" / "pip"), "install", "--quiet", "--no-deps",
                        "--no-index", str(wheel)], check=True, timeout=300)
        defaults = base / "defaults"
        defaults.write_text(f"SLURM_GPU_EXPORTER_PREFIX={prefix}\n")
        self.scripts = {}
        for kind in ("prolog", "epilog"):
            text = (source / kind / "slurm-gpu-exporter.sh").read_text()
            script = base / f"{kind}.sh"
            script.write_text(text.replace("/etc/default/slurm-gpu-exporter", str(defaults)))
            script.chmod(0o755)
            self.scripts[kind] = script
        self.times: dict[str, list[float]] = {"prolog": [], "epilog": [], "pair": [],
                                              "pair_cpu": []}

    def pair(self, jobid: int) -> None:
        # The spool through the environment, never the node's own defaults file (which
        # the entry points read: /etc/default/slurm-gpu-exporter).
        env = {**ENV, "SLURM_JOB_ID": str(jobid), "SLURM_GPU_EXPORTER_SPOOL_DIR": str(self.spool)}
        cpu0 = _children_cpu()
        walls = []
        for kind in ("prolog", "epilog"):
            t0 = time.perf_counter()
            proc = subprocess.run([str(self.scripts[kind])], env=env, capture_output=True,
                                  timeout=30, check=False)
            walls.append((time.perf_counter() - t0) * 1000)
            if proc.returncode != 0 or proc.stderr:
                raise RuntimeError(f"{self.name} {kind}: exit {proc.returncode}: "
                                   f"{proc.stderr.decode(errors='replace')}")
        self.times["pair_cpu"].append((_children_cpu() - cpu0) * 1000)
        self.times["prolog"].append(walls[0])
        self.times["epilog"].append(walls[1])
        self.times["pair"].append(sum(walls))
        if b'"end_time": null' in (self.spool / f"{jobid}.json").read_bytes():
            raise RuntimeError(f"{self.name}: the epilog did not mark job {jobid} ended")

    def figures(self) -> dict[str, float]:
        out = {}
        for key, values in self.times.items():
            unit = "cpu_ms" if key.endswith("_cpu") else "wall_ms"
            name = key.removesuffix("_cpu")
            out[f"{name}_{unit}_p50"] = round(percentile(values, 50), 1)
            out[f"{name}_{unit}_p10"] = round(percentile(values, 10), 1)
            out[f"{name}_{unit}_p90"] = round(percentile(values, 90), 1)
        return out


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--also", action="append", default=[], type=Path,
                        help="another checkout to measure alongside (e.g. the code before)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hooks-") as tmp:
        installs = [Install(str(src), src.resolve(), Path(tmp) / str(i))
                    for i, src in enumerate([ROOT, *args.also])]
        installs[0].name = "this checkout"
        before = yardstick()
        for n in range(args.pairs):
            for install in installs:
                install.pair(4200 + n)
        after = yardstick()
    figures: dict[str, object] = {
        "command": "python bench/hooks.py " + " ".join(sys.argv[1:]),
        "pairs": args.pairs,
        "yardstick_around_the_pairs": {"before": before, "after": after},
        "load_1m": round((before["load_1m"] + after["load_1m"]) / 2, 2),
    }
    for install in installs:
        figures[install.name] = install.figures()
    os.sync()
    record("hooks" + (f"_{args.tag}" if args.tag else ""), figures)


if __name__ == "__main__":
    main()
