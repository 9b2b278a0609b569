"""Look jobs up through both paths of the agent's Slurm adapter; print them as JSON.

Run as a site's node would: where the release's daemons run, with the Python of its
pyslurm venv (``slurm-testcluster --slurm 25.11 exec /opt/pyslurm-.../bin/python``).
Arguments: the checkout, the node name, then job ids. Prints ``{"pyslurm_version",
"auto": the class make_lookup chose, "jobs": {jobid: {"cli": ..., "pyslurm": ...}}}``;
pyslurm's answer is its own (no fall-back to the CLI).
"""

from __future__ import annotations

import dataclasses
import json
import sys


def main() -> None:
    repo, node, *jobids = sys.argv[1:]
    sys.path.insert(0, repo)
    import pyslurm

    from slurm_gpu_exporter.node.slurm.lookup import PySlurm, SlurmCli, make_lookup

    cli = SlurmCli(node)
    through_pyslurm = PySlurm(node, pyslurm, cli)
    out: dict[str, object] = {"pyslurm_version": pyslurm.__version__,
                              "auto": type(make_lookup(node)).__name__, "jobs": {}}
    for jobid in jobids:
        answers = {"cli": cli(jobid), "pyslurm": through_pyslurm._load(jobid)}
        out["jobs"][jobid] = {k: dataclasses.asdict(v) if v is not None else None  # type: ignore[index]
                              for k, v in answers.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
