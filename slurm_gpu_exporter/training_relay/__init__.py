"""The agent's side of the training relay: a unix socket training scripts push to.

``TrainingRelay`` (listener.py) serves ``training.sock`` and proves which job each
sender runs in; ``TrainingStore`` (store.py) checks and keeps the series per job.
The client scripts import is ``slurm_gpu_exporter.training``. See docs/training.md.
"""

from slurm_gpu_exporter.training_relay.listener import (
    SOCKET_NAME,
    JobOfKey,
    JobOfPid,
    PendingJob,
    TrainingRelay,
)
from slurm_gpu_exporter.training_relay.store import (
    REASONS,
    JobIdentity,
    RelayLimits,
    TrainingStore,
)

__all__ = ["REASONS", "SOCKET_NAME", "JobIdentity", "JobOfKey", "JobOfPid", "PendingJob",
           "RelayLimits", "TrainingRelay", "TrainingStore"]
