"""Prolog and epilog wall time as slurmd runs them: bare environment, fresh process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import percentile, record

BIN = Path(sys.executable).parent
ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice",
       "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
       "SLURMD_NODENAME": "node1", "SLURM_CLUSTER_NAME": "c1"}
RUNS = 40


def main() -> None:
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as spool:
        for kind in ("prolog", "epilog"):
            times = []
            for _ in range(RUNS):
                t0 = time.perf_counter()
                subprocess.run([str(BIN / f"slurm-gpu-exporter-{kind}"), "--spool-dir", spool],
                               env=ENV, check=True)
                times.append((time.perf_counter() - t0) * 1000)
            figures[f"{kind}_wall_ms_p50"] = round(percentile(times, 50), 1)
            figures[f"{kind}_wall_ms_p99"] = round(percentile(times, 99), 1)
        # Through prolog/slurm-gpu-exporter.sh, as slurm.conf runs it. The agent being
        # up or down makes no difference: the hooks never talk to it.
        wrapper = Path(__file__).resolve().parents[1] / "prolog" / "slurm-gpu-exporter.sh"
        times = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            subprocess.run(["/bin/sh", str(wrapper)], capture_output=True, check=True,
                           env={**ENV, "SLURM_GPU_EXPORTER_SPOOL_DIR": spool})
            times.append((time.perf_counter() - t0) * 1000)
        figures["prolog_via_shell_wrapper_ms_p99"] = round(percentile(times, 99), 1)
    record("hooks", figures)


if __name__ == "__main__":
    main()
