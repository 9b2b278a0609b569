"""Self-tests of the fake NVML's GPM calls, driven through the real nvidia-ml-py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from tests.fakenvml import Device, FakeNvml, MigInstance, NvmlState, Pattern
from tests.fakenvml.test_fakenvml import Interactive, run

pytestmark = pytest.mark.fakenvml

GPM_PRELUDE = '''
def metrics(a, b, ids):
    """[[id, nvmlReturn, value], ...] between samples a and b, or "ERR:<name>"."""
    req = N.c_nvmlGpmMetricsGet_t()
    req.version = N.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(ids)
    req.sample1, req.sample2 = a, b
    for i, m in enumerate(ids):
        req.metrics[i].metricId = m
    got = call(N.nvmlGpmMetricsGet, req)
    if isinstance(got, str):
        return got
    return [[req.metrics[i].metricId, req.metrics[i].nvmlReturn, round(req.metrics[i].value, 6)]
            for i in range(len(ids))]
'''


def test_pynvml_structs_have_the_layout_the_fake_is_built_with() -> None:
    """fake_nvml.c asserts the header's layout; nvidia-ml-py's ctypes must be the same."""
    import pynvml

    metric = pynvml.c_nvmlGpmMetric_t
    request = pynvml.c_nvmlGpmMetricsGet_t
    assert ctypes.sizeof(metric) == 40
    assert metric.value.offset == 8
    assert request.sample1.offset == 8 and request.metrics.offset == 24
    assert ctypes.sizeof(pynvml.c_nvmlGpmSupport_t) == 8


def test_gpm_support_is_per_gpu_and_mig_handles_follow_their_parent(fake: FakeNvml) -> None:
    fake.write(NvmlState(devices=[Device(0), Device(1, gpm={}, mig=[MigInstance(1)])]))
    got = run(fake, GPM_PRELUDE + '''
import ctypes
N.nvmlInit()
h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
mig = N.nvmlDeviceGetMigDeviceHandleByIndex(h1, 0)
s = N.nvmlGpmSampleAlloc()
bad = N.c_nvmlGpmSupport_t(); bad.version = 9
query = N._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
out([N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice for h in (h0, h1, mig)]
    + [call(N.nvmlGpmSampleGet, h0, s), call(N.nvmlGpmMigSampleGet, h1, 5, s),
       query(h1, ctypes.byref(bad))])
''')
    not_supported, not_found, mismatch = "ERR:NOT_SUPPORTED", "ERR:NOT_FOUND", 25
    assert got == [0, 1, 1, not_supported, not_found, mismatch]


def test_metrics_are_exact_means_between_two_samples_per_gpu_and_mig_instance(
    fake: FakeNvml,
) -> None:
    state = NvmlState(devices=[
        Device(0, gpm={"sm_util": 10.0, "tensor": Pattern.constant(40), "pcie_tx": 2500.0}),
        Device(1, gpm={"sm_util": 99.0}, mig=[MigInstance(1, gpm={"sm_util": 25.0}),
                                              MigInstance(2, gpm={"dram": 60.0})]),
    ])  # fmt: skip
    fake.write(state)
    session = Interactive(fake, GPM_PRELUDE + '''
import ctypes
N.nvmlInit()
h0, h1 = N.nvmlDeviceGetHandleByIndex(0), N.nvmlDeviceGetHandleByIndex(1)
a, b, c, d, m1, m2 = (N.nvmlGpmSampleAlloc() for _ in range(6))
N.nvmlGpmSampleGet(h0, a); time.sleep(0.15); N.nvmlGpmSampleGet(h0, b)
N.nvmlGpmMigSampleGet(h1, 1, m1); time.sleep(0.15); N.nvmlGpmMigSampleGet(h1, 1, m2)
first = metrics(a, b, [2, 5, 10, 20, 21, 1000])
mig1 = metrics(m1, m2, [2, 10, 20])
N.nvmlGpmMigSampleGet(h1, 2, m1); time.sleep(0.15); N.nvmlGpmMigSampleGet(h1, 2, m2)
mig2 = metrics(m1, m2, [2, 10])
mixed = metrics(a, m2, [2])
backwards = metrics(b, a, [2])
stray = metrics(a, ctypes.cast(ctypes.c_void_p(16), N.c_nvmlGpmSample_t), [2])
sync()  # the test changes SM activity to 50 %
time.sleep(0.15); N.nvmlGpmSampleGet(h0, c); time.sleep(0.15); N.nvmlGpmSampleGet(h0, d)
out([first, mig1, mig2, mixed, backwards, stray, metrics(c, d, [2]), metrics(b, d, [2])])
''')
    session.wait_ready()
    state.devices[0].gpm = {"sm_util": 50.0}
    fake.write(state)
    session.go()
    got, _ = session.finish()
    first, mig1, mig2, mixed, backwards, stray, after, across = got
    ok, not_supported = 0, 3
    assert first == [[2, ok, 10.0], [5, ok, 40.0], [10, ok, 0.0], [20, ok, 2500.0],
                     [21, ok, 0.0], [1000, not_supported, 0.0]]
    # Each MIG GPU instance has its own figures, none of its parent's; no traffic per instance.
    assert mig1 == [[2, ok, 25.0], [10, ok, 0.0], [20, not_supported, 0.0]]
    assert mig2 == [[2, ok, 0.0], [10, ok, 60.0]]
    assert mixed == backwards == stray == "ERR:INVALID_ARGUMENT"
    # A rewrite applies from then on; an interval across it gets the time-weighted mean.
    assert after == [[2, ok, 50.0]]
    assert 10.0 < across[0][2] < 50.0


def test_gpm_calls_take_injected_errors_once(fake: FakeNvml) -> None:
    fake.write(NvmlState(devices=[Device(0, gpm={"sm_util": 30.0},
                                         errors_once={"nvmlGpmSampleGet": "UNKNOWN",
                                                      "nvmlGpmMetricsGet": "GPU_IS_LOST"})]))
    got = run(fake, GPM_PRELUDE + '''
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
a, b = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
first = call(N.nvmlGpmSampleGet, h, a)
N.nvmlGpmSampleGet(h, a); time.sleep(0.12); N.nvmlGpmSampleGet(h, b)
out([first, metrics(a, b, [2]), metrics(a, b, [2]), call(N.nvmlGpmSampleFree, a),
     call(N.nvmlGpmSampleFree, a)])
''')
    assert got == ["ERR:UNKNOWN", "ERR:GPU_IS_LOST", [[2, 0, 30.0]], None,
                   "ERR:INVALID_ARGUMENT"]


def test_render_rejects_unknown_gpm_metrics_and_traffic_per_mig_instance(tmp_path: Path) -> None:
    fake = FakeNvml(tmp_path)
    with pytest.raises(ValueError, match="unknown GPM metric"):
        fake.render(NvmlState(devices=[Device(0, gpm={"warp_speed": 1.0})]))
    with pytest.raises(ValueError, match="whole GPUs only"):
        fake.render(NvmlState(devices=[Device(0, gpm={}, mig=[
            MigInstance(1, gpm={"pcie_tx": 1.0})])]))  # fmt: skip
    with pytest.raises(ValueError, match="within"):
        fake.render(NvmlState(devices=[Device(0, gpm={"sm_util": 150.0})]))
    text = fake.render(NvmlState(devices=[Device(0, gpm={"pcie_rx": 30000.0})]))
    assert "gpm_support 1" in text and "gpm - 21 0.0 0.0 1 1.0:30000.0" in text


def test_a_mig_device_handle_samples_its_own_gpu_instance(fake: FakeNvml) -> None:
    fake.write(NvmlState(devices=[Device(0, gpm={"sm_util": 90.0}, mig=[
        MigInstance(3, gpm={"sm_util": 15.0}), MigInstance(5, gpm={"sm_util": 45.0})])]))
    got = run(fake, GPM_PRELUDE + '''
N.nvmlInit()
parent = N.nvmlDeviceGetHandleByIndex(0)
second = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
a, b, c = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
N.nvmlGpmSampleGet(second, a); time.sleep(0.12); N.nvmlGpmSampleGet(second, b)
N.nvmlGpmMigSampleGet(parent, 5, c)
out([metrics(a, b, [2]), metrics(a, c, [2])])
''')
    assert got == [[[2, 0, 45.0]], [[2, 0, 45.0]]]  # the same GPU instance either way
