"""Archive records built in code, for the store tests and the kill test."""

from __future__ import annotations

from datetime import UTC, datetime

from slurm_gpu_exporter.report.archive.rows import ArchiveRecord
from slurm_gpu_exporter.report.figures.shapes import (
    Accounting,
    GpuDetail,
    JobDetail,
    JobUsage,
    NodeDetail,
)

NOV_1 = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
DEC_1 = datetime(2026, 12, 1, tzinfo=UTC).timestamp()


def record(jobid: str, *, user: str = "alice", account: str = "physics",
           partition: str = "gpu", cluster: str = "c1", gpus: int = 2, hours: float = 1.0,
           busy: float = 0.5, end: float = NOV_1 + 86400, state: str = "COMPLETED",
           exit_code: str = "0:0", nodes: int = 1) -> ArchiveRecord:
    """A job of ``gpus`` GPUs per node held ``hours`` and busy ``busy`` of that time."""
    held_s = hours * 3600
    node_details = []
    for n in range(nodes):
        node = NodeDetail(node=f"gpu{n:02d}", cpus=8, cpu_s=held_s * 4, memory_peak=2**33,
                          memory_limit=2**34)
        node.gpus = [GpuDetail(gpu=str(g), uuid=f"GPU-{jobid}-{n}-{g}", allocated_s=held_s,
                               busy_s=held_s * busy, memory_peak=2**30, memory_total=80 * 2**30,
                               energy_j=held_s * 300, sm_active_s=held_s * busy / 2,
                               tensor_active_s=held_s * busy / 4,
                               dram_active_s=held_s * busy / 3)
                     for g in range(gpus)]
        node_details.append(node)
    total = held_s * gpus * nodes
    usage = JobUsage(jobid=jobid, user=user, account=account, partition=partition,
                     name=f"train-{jobid}", cluster=cluster, gpus=gpus * nodes,
                     allocated_s=total, busy_s=total * busy, gpu_memory_peak=2**30,
                     start=end - held_s, end=end, sm_active_s=total * busy / 2,
                     gpm_allocated_s=total, tensor_active_s=total * busy / 4,
                     dram_active_s=total * busy / 3)
    acct = Accounting(state=state, time_limit_s=7200, requested_memory=2**34, cpus=8 * nodes,
                      nodes=nodes, start=end - held_s, end=end, exit_code=exit_code,
                      account=account, qos="normal", requested_gpus=gpus * nodes)
    detail = JobDetail(usage=usage, nodes=node_details, accounting=acct, now=end + 60,
                       notes=["a note"])
    models = {(n.node, g.gpu): "NVIDIA H100 80GB HBM3" for n in node_details for g in n.gpus}
    return ArchiveRecord(detail, models)
