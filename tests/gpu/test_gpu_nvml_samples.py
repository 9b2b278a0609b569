"""What a read of one GPU's device sample buffer makes of the driver's answer."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from slurm_gpu_exporter.gpu.nvml import sample_buffers
from slurm_gpu_exporter.gpu.readings import BufferShape, UtilSample


def _driver(monkeypatch: pytest.MonkeyPatch, stamps: list[int]) -> None:
    # A ring buffer as a driver hands it over: whole, from 0, not in time order.
    raw = [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=t % 97))
           for t in stamps]

    def get_samples(handle: object, kind: int, since: int) -> tuple[int, list[object]]:
        assert since == 0  # the whole buffer, which is how its length is learned
        if not raw:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return 0, raw

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSamples", get_samples)


def test_only_the_samples_past_the_cursor_come_back_oldest_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _driver(monkeypatch, [700, 800, 900, 400, 500, 600])
    found, newest, shape = sample_buffers.util_samples(None, 650, [])  # type: ignore[misc]
    assert found == (UtilSample(700, 700 % 97), UtilSample(800, 800 % 97),
                     UtilSample(900, 900 % 97))
    assert newest is None and shape == BufferShape(6, 400)
    assert sample_buffers.util_samples_after(None, 850, []) == (
        (UtilSample(900, 900 % 97),), BufferShape(6, 400))


def test_none_past_the_cursor_gives_the_newest_the_buffer_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _driver(monkeypatch, [700, 800, 400])
    assert sample_buffers.util_samples(None, 800, []) == ((), 800, BufferShape(3, 400))
    assert sample_buffers.util_samples(None, 0, [])[0] == (  # first look: all of them
        UtilSample(400, 400 % 97), UtilSample(700, 700 % 97), UtilSample(800, 800 % 97))


def test_an_empty_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    _driver(monkeypatch, [])
    assert sample_buffers.util_samples(None, 800, []) == ((), None, BufferShape(0, None))
