"""A plain PyTorch training loop that reports its progress to the node's slurm-gpu-exporter.

Run it inside a Slurm job (``sbatch --gres=gpu:1 --wrap "python pytorch_train.py"``).
The agent credits the series to the job the process runs in; nothing here names the
job. Needs torch (not a dependency of slurm-gpu-exporter).
"""

from __future__ import annotations

import os

import torch
from prometheus_client import Counter

from slurm_gpu_exporter import training

RANK = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))

# Metrics of your own, if you have them: relay() sends the registry they live in
# (instead of prometheus_client.start_http_server(port)). The agent adds jobid and
# user only, so give per-rank series a label of their own.
SAMPLES_SEEN = Counter("rank_samples", "Samples seen by this rank.", ["rank"]).labels(RANK)
training.relay()


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000, gamma=0.5)
    loss_fn = torch.nn.CrossEntropyLoss()
    batch = 256
    for _ in range(5000):
        x = torch.randn(batch, 512, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        SAMPLES_SEEN.inc(batch)
        # step() series have no rank label: report from one rank, with the global
        # batch size, or ranks overwrite each other's values.
        if RANK == 0:
            # loss.item() waits for the GPU; do it every N steps if that matters to you.
            training.step(1, samples=batch, loss=loss.item(), lr=scheduler.get_last_lr()[0])


if __name__ == "__main__":
    main()
