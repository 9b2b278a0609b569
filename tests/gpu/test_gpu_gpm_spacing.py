"""GPM samples of one stream are never taken closer than NVML's 100 ms (gpu/nvml/gpm.py).

pynvml's GPM calls are replaced by counters here: what is checked is when the reader
samples, not what NVML computes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from slurm_gpu_exporter.gpu.nvml.gpm import GpmReader


def test_a_poll_within_100_ms_of_the_last_gpm_sample_keeps_it_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[float] = []
    now = [0.0]
    monkeypatch.setattr(pynvml, "nvmlGpmQueryDeviceSupport",
                        lambda handle: SimpleNamespace(isSupportedDevice=1))
    monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", lambda: pynvml.c_nvmlGpmSample_t())
    monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", lambda sample: None)
    monkeypatch.setattr(pynvml, "nvmlGpmSampleGet", lambda handle, s: taken.append(now[0]))
    monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", lambda request: request)
    reader = GpmReader(clock=lambda: now[0])

    def read_at(t: float) -> Any:
        now[0] = t
        return reader.read(0, "GPU-a", object(), (), [])[1]

    assert read_at(10.0) is None  # the first sample starts the interval
    assert read_at(10.05) is None  # too soon: no sample taken
    figures = read_at(11.0)
    assert taken == [10.0, 11.0]
    assert figures is not None and figures.seconds == pytest.approx(1.0)
