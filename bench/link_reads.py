"""CPU time of the agent's NVML reads themselves: ``BackendLink.read``, in process.

2,000 reads one after another, CPU of the whole process (``time.process_time``, every
thread: the read's own thread too), best of 5 rounds, over two backends: a trivial one
(one prebuilt reading: what is left is the handing of the read to its thread and back)
and the simulated one (4 GPUs, no jobs, each read asking only for the samples since the
last, as the agent does). Each code runs in a child of its own, this checkout and
``--also DIR`` (e.g. the code before a change) in turns.

    .venv/bin/python bench/link_reads.py [--also DIR] [--tag X]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import record

READS = 2000
ROUNDS = 5
CHILD = """
import sys, time
from slurm_gpu_exporter.gpu.polling import BackendLink
from slurm_gpu_exporter.gpu.simulated import SimulatedBackend
from slurm_gpu_exporter.node.source_health import SourceErrors

class Trivial(SimulatedBackend):
    def __init__(self):
        super().__init__(1, lambda now: ())
        self.reading = super().read({})

    def read(self, cursors):
        return self.reading

backend = Trivial() if sys.argv[1] == "trivial" else SimulatedBackend(4, lambda now: ())
reads, rounds = int(sys.argv[2]), int(sys.argv[3])
link = BackendLink(backend, SourceErrors())
cursors = {}
best = float("inf")
for _ in range(rounds):
    cpu0 = time.process_time()
    for _ in range(reads):
        for r in link.read(cursors):
            if r.util_samples:
                cursors[r.uuid] = (r.util_samples[-1].timestamp_us, 0)
    best = min(best, time.process_time() - cpu0)
link.close()
import slurm_gpu_exporter
print(slurm_gpu_exporter.__file__)
print(f"{best / reads * 1e6:.2f}")
"""


def per_read_us(code: Path, backend: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(code))  # and cwd: ``-c`` puts it first on the path
    out = subprocess.run([sys.executable, "-c", CHILD, backend, str(READS), str(ROUNDS)],
                         env=env, cwd=code, check=True, capture_output=True, text=True,
                         timeout=600).stdout
    where, figure = out.strip().splitlines()[-2:]
    assert where.startswith(str(code)), f"{code}'s child imported {where}"
    return float(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--also", type=Path, help="another checkout, measured beside this one")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    args = parser.parse_args()
    codes = {"this": Path(__file__).resolve().parents[1],
             **({"also": args.also.resolve()} if args.also else {})}
    figures: dict[str, object] = {"reads": READS, "rounds": ROUNDS, "also": str(args.also)}
    for backend in ("trivial", "simulated"):
        for name, code in codes.items():
            figures[f"cpu_us_per_read_{backend}_{name}"] = per_read_us(code, backend)
    record("link_reads" + (f"_{args.tag}" if args.tag else ""), figures)


if __name__ == "__main__":
    main()
