"""Driver sample cursors in the state dir carry their boot and driver (state.py)."""

from __future__ import annotations

from pathlib import Path

from slurm_gpu_exporter.gpu.source import GpuSampler
from slurm_gpu_exporter.node.source_health import SourceErrors
from slurm_gpu_exporter.node.state_dir import (
    BOOT_ID_PATH,
    of_this_boot,
    read_boot_id,
    stamp_boot,
)
from tests.gpu.fake_gpu import FakeBackend, StubMapper


def boot(proc_root: Path, boot_id: str) -> None:
    path = proc_root / BOOT_ID_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def test_the_boot_id_is_read_from_the_proc_root_and_none_where_it_is_missing(
    tmp_path: Path,
) -> None:
    assert read_boot_id(tmp_path) is None
    boot(tmp_path, "6f1c0f58-0b0e-4a53-9a0e-3c8f2d1b7a11")
    assert read_boot_id(tmp_path) == "6f1c0f58-0b0e-4a53-9a0e-3c8f2d1b7a11"


def test_cursors_are_good_for_their_own_boot_only() -> None:
    saved = stamp_boot({"GPU-a": {"device": 5}}, "boot-1", "550.54.15")
    assert of_this_boot(saved, "boot-1") == ({"GPU-a": {"device": 5}}, "550.54.15")
    assert of_this_boot(saved, "boot-2") == ({}, None)
    for odd in (None, [], {"gpus": []}, {"boot_id": "boot-1"}):
        assert of_this_boot(odd, "boot-1") == ({}, None)


def sampler(proc_root: Path, backend: FakeBackend) -> GpuSampler:
    s = GpuSampler(backend, proc_root, SourceErrors(), clock=lambda: backend.t)
    s.mapper = StubMapper({})  # type: ignore[assignment]
    return s


def test_a_restart_keeps_the_of_this_boot_and_drops_another_boots(
    tmp_path: Path,
) -> None:
    backend = FakeBackend()
    boot(tmp_path, "boot-1")
    first = sampler(tmp_path, backend)
    for _ in range(2):
        backend.advance(1.0)
        first.sample([], backend.t)
    saved = first.export_state()
    first.close()
    assert saved["sample_cursors"]["boot_id"] == "boot-1"
    assert saved["sample_cursors"]["driver"] == "test"
    again = sampler(tmp_path, backend)
    again.import_state(saved)
    assert again.devices.driver_cursors() == first.devices.driver_cursors()
    again.close()
    boot(tmp_path, "boot-2")  # a reboot
    rebooted = sampler(tmp_path, backend)
    rebooted.import_state(saved)
    assert rebooted.devices.driver_cursors() == {}
    rebooted.close()


def test_cursors_of_another_driver_or_a_reinitialised_nvml_are_dropped(
    tmp_path: Path,
) -> None:
    backend = FakeBackend()
    s = sampler(tmp_path, backend)
    s.import_state({"sample_cursors": stamp_boot(
        {backend.uuid: {"device": 1, "counted": 1, "period": 0}}, None, "535.104.05")})
    assert s.devices.driver_cursors()
    backend.advance(1.0)
    s.sample([], backend.t)  # init: the driver is "test" now
    assert s.devices.driver_cursors()[backend.uuid][0] != 1  # started afresh
    backend.advance(1.0)
    s.sample([], backend.t)
    assert s.devices.driver_cursors()
    busy = s.devices.device_busy[backend.uuid]
    s.link.close()  # as after a failed read: NVML is initialised again a minute later
    backend.advance(61.0)
    s.sample([], backend.t)
    assert backend.inits == 2
    # A first look again: nothing counted from a cursor of the driver before.
    assert s.devices.device_busy[backend.uuid] == busy
    s.close()
