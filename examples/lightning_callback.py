"""A PyTorch Lightning callback that reports training progress to slurm-gpu-exporter.

    trainer = lightning.Trainer(callbacks=[SlurmGpuExporterProgress()])

Reports from global rank 0 only, with the global batch size, so the job's series are
not overwritten by each rank. Needs lightning (not a dependency of slurm-gpu-exporter).
"""

from __future__ import annotations

from typing import Any

import lightning as L

from slurm_gpu_exporter import training


class SlurmGpuExporterProgress(L.Callback):
    """Calls training.step() after every training batch on global rank 0."""

    def __init__(self, loss_key: str = "loss") -> None:
        self.loss_key = loss_key

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank != 0:
            return
        loss = None
        if isinstance(outputs, dict) and self.loss_key in outputs:
            loss = outputs[self.loss_key].detach().item()
        elif outputs is not None and hasattr(outputs, "item"):
            loss = outputs.detach().item()
        lr = None
        if trainer.optimizers:
            lr = trainer.optimizers[0].param_groups[0]["lr"]
        training.step(1, samples=_batch_size(batch) * trainer.world_size, loss=loss, lr=lr)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        training.close()  # send the final values now rather than at interpreter exit


def _batch_size(batch: Any) -> int:
    """The leading dimension of the batch's first tensor (0 when there is none)."""
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0
