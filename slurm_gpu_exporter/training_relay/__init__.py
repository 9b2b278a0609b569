"""The agent's side of the training relay: a unix socket training scripts push to.

``TrainingRelay`` (listener.py) serves ``training.sock``: ``admission.py`` proves which
job each sender runs in and caps the connections, ``connections.py`` keeps them.
``TrainingStore`` (store.py) checks each push (``payload.py``) against the limits and
rate budgets (``limits.py``) and keeps the series per job (``series.py``).
The client scripts import is ``slurm_gpu_exporter.training``. See docs/training.md.
"""

from slurm_gpu_exporter.training_relay.admission import JobOfKey, JobOfPid, PendingJob
from slurm_gpu_exporter.training_relay.limits import REASONS, RelayLimits
from slurm_gpu_exporter.training_relay.listener import TrainingRelay
from slurm_gpu_exporter.training_relay.series import JobIdentity
from slurm_gpu_exporter.training_relay.socketfile import SOCKET_NAME
from slurm_gpu_exporter.training_relay.store import TrainingStore

__all__ = ["REASONS", "SOCKET_NAME", "JobIdentity", "JobOfKey", "JobOfPid", "PendingJob",
           "RelayLimits", "TrainingRelay", "TrainingStore"]
