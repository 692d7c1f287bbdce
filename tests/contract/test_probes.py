"""The Probe contract, run against FakeProbe and NvmlProbe (over a simulated NVML here, the
real one where a GPU is present), then what is particular to each and to make_probe.

Contract: ``snapshot()`` never raises; GPUs come in index order with a stable uuid and a
timestamp; memory values are consistent or ``None``; a process holding memory on a card
shows in that card's free memory and process list; ``notice()`` is one line or ``None``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpusched.errors import PlanError
from gpusched.gpus import Probe
from gpusched.gpus.fake import FakeProbe, FakeUsage, parse_fake_spec
from gpusched.gpus.nvml import NvmlProbe
from gpusched.gpus.select import NoProbe, make_probe
from gpusched.model import GpuProcess, GpuState

MIB = 1024 * 1024
GIB_MIB = 1024


def nvml_error(code: int = pynvml.NVML_ERROR_UNKNOWN) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


# --------------------------------------------------------------------------- a simulated NVML


@dataclass
class SimDevice:
    total_mib: int
    used_mib: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    util: int = 7


@dataclass
class SimulatedNvml:
    """The real ``pynvml`` module with its device calls patched onto a table of devices,
    so that NvmlProbe's own code (retries, per-field fallbacks) runs unchanged."""

    devices: list[SimDevice]
    calls: list[str] = field(default_factory=list)
    memory_versions: list[Any] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)  # fallen off the bus: the handle is refused

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _device(self, handle: int) -> SimDevice:
        return self.devices[handle]

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.devices):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index in self.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-sim-{handle:04d}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA Simulated 24GB"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: Any = None) -> SimpleNamespace:
        self.memory_versions.append(version)
        dev = self._device(handle)
        used = dev.used_mib + sum((b or 0) // MIB for _, b in dev.compute)
        total = dev.total_mib * MIB
        return SimpleNamespace(total=total, used=used * MIB, free=total - used * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._device(handle).util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self._device(handle).compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self._device(handle).graphics]


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimulatedNvml:
    simulated = SimulatedNvml(devices=[SimDevice(total_mib=24 * GIB_MIB) for _ in range(2)])
    simulated.install(monkeypatch)
    return simulated


def fail(*_: Any, **__: Any) -> Any:
    raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)


def raiser(error: Exception) -> Callable[..., Any]:
    def raise_it(*_: Any, **__: Any) -> Any:
        raise error

    return raise_it


# --------------------------------------------------------------------------- the contract


@dataclass
class Harness:
    """One probe under the contract, with a way to put an outside process on a card."""

    probe: Probe
    gpus: int
    total_mib: int
    put_outside: Callable[[int, int, int], None]  # (gpu index, pid, MiB)
    break_backend: Callable[[], None]
    lose: Callable[[int], None]  # the card falls off the bus


def fake_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    state = tmp_path / "state.json"

    def put_outside(index: int, pid: int, mib: int) -> None:
        state.write_text(json.dumps({str(index): {"processes": [{"pid": pid, "used_mib": mib}]}}))

    def break_backend() -> None:
        state.write_text("{not json")

    def lose(index: int) -> None:
        data = json.loads(state.read_text()) if state.exists() else {}
        data.setdefault(str(index), {})["lost"] = True
        state.write_text(json.dumps(data))

    probe = FakeProbe.from_spec("2x24GiB", state_path=state)
    return Harness(probe, 2, 24 * GIB_MIB, put_outside, break_backend, lose)


def nvml_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    simulated = SimulatedNvml(devices=[SimDevice(total_mib=24 * GIB_MIB) for _ in range(2)])
    simulated.install(monkeypatch)

    def put_outside(index: int, pid: int, mib: int) -> None:
        simulated.devices[index].compute.append((pid, mib * MIB))

    def break_backend() -> None:
        for name in dir(simulated):
            if name.startswith("nvmlDevice"):
                monkeypatch.setattr(pynvml, name, fail)

    def lose(index: int) -> None:
        simulated.lost.add(index)

    return Harness(NvmlProbe(retry_wait_s=0.001), 2, 24 * GIB_MIB, put_outside, break_backend, lose)


@pytest.fixture(params=[fake_harness, nvml_harness], ids=["fake", "nvml-simulated"])
def harness(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    return request.param(tmp_path, monkeypatch)


def check_snapshot(states: list[GpuState], gpus: int, before: float) -> None:
    assert [s.index for s in states] == list(range(gpus))
    assert len({s.uuid for s in states}) == gpus and all(s.uuid for s in states)
    for state in states:
        assert isinstance(state.name, str) and state.name
        assert before <= state.sampled_at <= time.time()
        assert state.total_mib and state.total_mib > 0
        assert state.free_mib is not None and 0 <= state.free_mib <= state.total_mib
        assert state.used_mib is not None and 0 <= state.used_mib <= state.total_mib
        assert state.util_pct is None or 0 <= state.util_pct <= 100


def test_contract_snapshot_shape(harness: Harness) -> None:
    before = time.time()
    states = harness.probe.snapshot()
    check_snapshot(states, harness.gpus, before)
    assert all(s.total_mib == harness.total_mib and s.free_mib == harness.total_mib for s in states)
    assert [s.uuid for s in harness.probe.snapshot()] == [s.uuid for s in states]


def test_contract_outside_process_is_visible(harness: Harness) -> None:
    harness.put_outside(1, 4242, 5000)
    states = harness.probe.snapshot()
    assert states[1].free_mib == harness.total_mib - 5000
    assert states[1].used_mib == 5000
    assert GpuProcess(pid=4242, used_mib=5000) in states[1].processes
    assert states[0].free_mib == harness.total_mib and states[0].processes == ()


def test_contract_notice_is_one_line_or_none(harness: Harness) -> None:
    assert harness.probe.name in ("fake", "nvml", "none")
    notice = harness.probe.notice()
    assert notice is None or (notice and "\n" not in notice)


def test_contract_broken_backend_does_not_raise(harness: Harness) -> None:
    harness.probe.snapshot()
    harness.break_backend()
    states = harness.probe.snapshot()
    assert [s.index for s in states] == list(range(harness.gpus))
    for state in states:
        assert state.free_mib is None or 0 <= state.free_mib <= harness.total_mib


def test_contract_a_lost_card_reads_lost_and_the_others_as_before(harness: Harness) -> None:
    """One card off the bus is that card's fact: it keeps its identity (what a restarted
    status or the out-of-service record names), has no values, and the others read whole."""
    before = time.time()
    seen = harness.probe.snapshot()
    harness.put_outside(0, 4242, 5000)
    harness.lose(1)
    states = harness.probe.snapshot()
    assert [s.index for s in states] == [0, 1] and [s.lost for s in states] == [False, True]
    check_snapshot(states[:1], 1, before)
    assert GpuProcess(pid=4242, used_mib=5000) in states[0].processes
    lost = states[1]
    assert (lost.uuid, lost.name, lost.total_mib) == (seen[1].uuid, seen[1].name, seen[1].total_mib)
    assert (lost.free_mib, lost.used_mib, lost.util_pct, lost.processes) == (None, None, None, ())
    assert before <= lost.sampled_at <= time.time()
    notice = harness.probe.notice()
    assert notice is None or "NVML unavailable" not in notice  # the probe still works


# --------------------------------------------------------------------------- real NVML


def test_real_nvml_without_gpu_is_empty_and_says_why() -> None:
    if NvmlProbe.available():
        pytest.skip("an NVIDIA GPU is present: test_real_nvml_reads_gpus covers this machine")
    probe = NvmlProbe()
    assert probe.snapshot() == []
    notice = probe.notice()
    assert notice and notice.startswith("NVML unavailable: ") and notice.endswith("; placing by slots only")
    assert "\n" not in notice


def real_gpu_probe() -> NvmlProbe:
    probe = NvmlProbe()
    if not probe.is_available():
        pytest.skip(f"no NVIDIA GPU: NVML says {probe.problem!r}; run on a machine with a GPU and driver")
    return probe


@pytest.mark.gpu
def test_real_nvml_reads_gpus() -> None:
    probe = real_gpu_probe()
    before = time.time()
    states = probe.snapshot()
    assert states, probe.notice()
    check_snapshot(states, len(states), before)
    assert all(s.uuid and s.uuid.startswith(("GPU-", "MIG-")) for s in states)
    assert probe.notice() is None
    assert [s.uuid for s in probe.snapshot()] == [s.uuid for s in states]


@pytest.mark.gpu
def test_real_nvml_sees_memory_held_by_this_process() -> None:
    probe = real_gpu_probe()
    baseline = probe.snapshot()[0].free_mib
    assert baseline is not None
    with hold_gpu_memory(1024) as held:
        if held is None:
            pytest.skip("no NVIDIA GPU: libcuda could not allocate 1 GiB on GPU 0 through ctypes")
        # NVML's counters trail an allocation a little: poll, never a fixed sleep. The process
        # list is not checked: inside a container NVML may list host pids or none at all.
        assert retry_until(lambda: baseline - (probe.snapshot()[0].free_mib or baseline) >= 1000)


def retry_until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.gpu
def test_real_nvml_snapshot_is_fast() -> None:
    probe = real_gpu_probe()
    probe.snapshot()
    started = time.perf_counter()
    probe.snapshot()
    assert time.perf_counter() - started < 0.5


class _Cuda:
    """Just enough of the CUDA driver API, through ctypes, to hold memory without torch."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, result: int) -> None:
        if result != 0:
            raise OSError(f"CUDA driver error {result}")

    def alloc(self, mib: int) -> tuple[ctypes.c_void_p, ctypes.c_uint64]:
        ctx, ptr, dev = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_int()
        self.check(self.lib.cuInit(0))
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0))
        self.check(self.lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB)))
        return ctx, ptr

    def free(self, ctx: ctypes.c_void_p, ptr: ctypes.c_uint64) -> None:
        self.lib.cuMemFree_v2(ptr)
        self.lib.cuCtxDestroy_v2(ctx)


@contextlib.contextmanager
def hold_gpu_memory(mib: int) -> Iterator[int | None]:
    try:
        cuda = _Cuda()
        ctx, ptr = cuda.alloc(mib)
    except OSError:
        yield None
        return
    try:
        yield mib
    finally:
        cuda.free(ctx, ptr)


# --------------------------------------------------------------------------- NVML particulars


def test_nvml_asks_for_v2_memory(sim: SimulatedNvml) -> None:
    NvmlProbe().snapshot()
    assert sim.memory_versions and all(v == pynvml.nvmlMemory_v2 for v in sim.memory_versions)


def test_nvml_falls_back_to_v1_memory(sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    v1 = sim.nvmlDeviceGetMemoryInfo

    def only_v1(handle: int, version: Any = None) -> SimpleNamespace:
        if version is not None:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return v1(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", only_v1)
    states = NvmlProbe().snapshot()
    assert [s.free_mib for s in states] == [24 * GIB_MIB, 24 * GIB_MIB]


@pytest.mark.parametrize(
    ("call", "unknown"),
    [
        ("nvmlDeviceGetUUID", {"uuid": None}),
        ("nvmlDeviceGetName", {"name": None}),
        ("nvmlDeviceGetMemoryInfo", {"total_mib": None, "free_mib": None, "used_mib": None}),
        ("nvmlDeviceGetUtilizationRates", {"util_pct": None}),
        ("nvmlDeviceGetComputeRunningProcesses", {"processes": ()}),
    ],
)
def test_nvml_field_error_reads_as_unknown(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch, call: str, unknown: dict[str, Any]
) -> None:
    sim.devices[0].compute.append((77, 100 * MIB))
    good = NvmlProbe().snapshot()
    monkeypatch.setattr(pynvml, call, fail)
    states = NvmlProbe().snapshot()
    assert states[0] == good[0].evolve(sampled_at=states[0].sampled_at, **unknown)


def test_nvml_non_nvml_exception_in_a_field_is_unknown(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", raiser(UnicodeDecodeError("utf-8", b"", 0, 1, "x")))
    assert [s.name for s in NvmlProbe().snapshot()] == [None, None]


@pytest.mark.parametrize("not_available", [None, 2**64 - 1])
def test_nvml_process_memory_not_available_is_none(sim: SimulatedNvml, not_available: int | None) -> None:
    sim.devices[1].compute.append((9, not_available))
    assert NvmlProbe().snapshot()[1].processes == (GpuProcess(pid=9, used_mib=None),)


def test_nvml_compute_and_graphics_processes_merge_by_pid(sim: SimulatedNvml) -> None:
    sim.devices[0].compute += [(5, 300 * MIB), (3, None)]
    sim.devices[0].graphics += [(5, 200 * MIB), (8, 50 * MIB), (3, 10 * MIB)]
    processes = NvmlProbe().snapshot()[0].processes
    assert processes == (
        GpuProcess(pid=3, used_mib=10),
        GpuProcess(pid=5, used_mib=300),
        GpuProcess(pid=8, used_mib=50),
    )


def test_nvml_whole_read_failure_retries_then_lists_known_gpus(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = NvmlProbe()
    known = probe.snapshot()
    attempts: list[float] = []

    def count_fails() -> int:
        attempts.append(time.perf_counter())
        raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", count_fails)
    started = time.perf_counter()
    states = probe.snapshot()
    assert time.perf_counter() - started < 0.5
    assert len(attempts) == 3
    assert states == [
        GpuState(index=g.index, uuid=g.uuid, name=g.name, total_mib=g.total_mib, sampled_at=s.sampled_at)
        for g, s in zip(known, states, strict=True)
    ]
    assert probe.notice() == "NVML unavailable: reading GPUs failed: GPU is lost; placing by slots only"


def test_nvml_transient_failure_is_retried_away(sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    real_count, failures = sim.nvmlDeviceGetCount, [nvml_error(pynvml.NVML_ERROR_TIMEOUT)]

    def flaky() -> int:
        if failures:
            raise failures.pop()
        return real_count()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", flaky)
    probe = NvmlProbe()
    assert [s.free_mib for s in probe.snapshot()] == [24 * GIB_MIB, 24 * GIB_MIB]
    assert probe.notice() is None


def test_nvml_failure_with_nothing_known_is_empty(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", fail)
    probe = NvmlProbe(retry_wait_s=0.001)
    assert probe.snapshot() == []
    assert (probe.notice() or "").startswith("NVML unavailable: reading GPUs failed: Not Supported")


def test_nvml_recovers_after_a_failed_read(sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = NvmlProbe(retry_wait_s=0.001)
    with monkeypatch.context() as patch:
        patch.setattr(pynvml, "nvmlDeviceGetCount", fail)
        probe.snapshot()
        assert probe.notice() is not None
    assert len(probe.snapshot()) == 2
    assert probe.notice() is None


def test_nvml_init_failure_is_remembered_and_explained(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    inits: list[int] = []

    def no_driver() -> None:
        inits.append(1)
        raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    probe = NvmlProbe()
    assert probe.snapshot() == [] and probe.snapshot() == []
    assert not probe.is_available()
    assert probe.notice() == "NVML unavailable: Driver Not Loaded; placing by slots only"
    assert inits == [1]


def test_nvml_missing_library_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe = NvmlProbe()
    assert probe.snapshot() == []
    assert probe.notice() == "NVML unavailable: nvidia-ml-py (pynvml) is not installed; placing by slots only"


def test_nvml_zero_gpus(sim: SimulatedNvml) -> None:
    sim.devices.clear()
    probe = NvmlProbe()
    assert not NvmlProbe.available()
    assert probe.snapshot() == []
    assert probe.notice() == "NVML unavailable: the driver reports 0 GPUs; placing by slots only"


def test_nvml_initialises_once_and_lazily(sim: SimulatedNvml) -> None:
    probe = NvmlProbe()
    assert sim.calls == []
    probe.snapshot()
    probe.snapshot()
    probe.notice()
    assert sim.calls.count("init") == 1
    assert NvmlProbe.available()
    probe.close()
    assert sim.calls[-1] == "shutdown"


# --------------------------------------------------------------------------- fake particulars


@pytest.mark.parametrize(
    ("spec", "totals"),
    [
        ("4x24GiB", (24576,) * 4),
        ("2x80GiB,1x24GiB", (81920, 81920, 24576)),
        ("3x16000MiB", (16000,) * 3),
        ("8x24G", (24576,) * 8),
        (" 2 x 1.5 gib , 1x512m ", (1536, 1536, 512)),
        ("1x24GB", (24576,)),
    ],
)
def test_fake_spec_parses(spec: str, totals: tuple[int, ...]) -> None:
    assert parse_fake_spec(spec) == totals


@pytest.mark.parametrize(
    "spec", ["", "4", "x24GiB", "4x", "4x24", "4x24TB", "0x24GiB", "4x0GiB", "2x24GiB,", "65x1GiB", "4x-1GiB"]
)
def test_fake_spec_rejects(spec: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_fake_spec(spec)
    message = str(caught.value)
    assert "GPUSCHED_FAKE_GPUS" in message and "4x24GiB" in message and "\n" not in message


def test_fake_notice_and_identity() -> None:
    probe = FakeProbe.from_spec("2x80GiB,1x24GiB")
    assert probe.notice() == "fake GPUs: 2 x 80.0 GiB, 1 x 24.0 GiB (GPUSCHED_FAKE_GPUS)"
    assert FakeProbe.from_spec("4x24GiB").notice() == "fake GPUs: 4 x 24.0 GiB (GPUSCHED_FAKE_GPUS)"
    states = probe.snapshot()
    assert [s.uuid for s in states] == ["GPU-fake-0-81920mib", "GPU-fake-1-81920mib", "GPU-fake-2-24576mib"]
    assert {s.name for s in states} == {"Fake GPU"}


def test_fake_state_file_is_read_on_every_snapshot(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    probe = FakeProbe.from_spec("2x24GiB", state_path=state, clock=lambda: 123.0)
    assert [s.free_mib for s in probe.snapshot()] == [24576, 24576]
    state.write_text(json.dumps({"0": {"used_mib": 5000, "processes": [{"pid": 1, "used_mib": 5000}]}}))
    first = probe.snapshot()[0]
    assert (first.free_mib, first.used_mib, first.sampled_at) == (19576, 5000, 123.0)
    assert first.processes == (GpuProcess(pid=1, used_mib=5000),)
    state.unlink()
    assert [s.free_mib for s in probe.snapshot()] == [24576, 24576]


@pytest.mark.parametrize(
    ("content", "free"),
    [
        ("{broken", [24576, 24576]),
        ("[1, 2]", [24576, 24576]),
        ('{"x": {"used_mib": 5}, "1": "no", "0": {"used_mib": "lots"}}', [24576, 24576]),
        (
            '{"1": {"processes": [{"pid": 2, "used_mib": 100}, {"pid": 3, "used_mib": 50},'
            ' {"nopid": 1}, 7]}}',
            [24576, 24426],
        ),
        ('{"0": {"used_mib": 99999}}', [0, 24576]),
        ('{"0": {"used_mib": -5}}', [24576, 24576]),
        ('{"7": {"used_mib": 100}}', [24576, 24576]),
    ],
)
def test_fake_state_file_tolerates_bad_content(tmp_path: Path, content: str, free: list[int]) -> None:
    state = tmp_path / "state.json"
    state.write_text(content)
    assert [s.free_mib for s in FakeProbe.from_spec("2x24GiB", state_path=state).snapshot()] == free


def test_fake_usage_callable_adds_to_state_file(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"0": {"used_mib": 1000, "processes": [{"pid": 1, "used_mib": 1000}]}}))
    usage = {0: FakeUsage(used_mib=2000, processes=(GpuProcess(pid=2, used_mib=2000),), util_pct=90)}
    gpu0 = FakeProbe.from_spec("1x24GiB", state_path=state, usage=lambda: usage).snapshot()[0]
    assert (gpu0.used_mib, gpu0.util_pct) == (3000, 90)
    assert [p.pid for p in gpu0.processes] == [1, 2]


def test_fake_usage_callable_that_raises_is_no_usage() -> None:
    def broken() -> dict[int, FakeUsage]:
        raise RuntimeError("simulator bug")

    assert FakeProbe.from_spec("1x24GiB", usage=broken).snapshot()[0].free_mib == 24576


# --------------------------------------------------------------------------- make_probe


def test_make_probe_explicit_specs(tmp_path: Path) -> None:
    fake = make_probe("fake:3x16000MiB", environ={"GPUSCHED_FAKE_GPUS": "1x8GiB"})
    assert isinstance(fake, FakeProbe) and len(fake.snapshot()) == 3
    assert isinstance(make_probe("nvml", environ={}), NvmlProbe)
    none = make_probe(" NONE ", environ={"GPUSCHED_FAKE_GPUS": "1x8GiB"})
    assert isinstance(none, NoProbe)
    assert none.snapshot() == [] and none.notice() == "no NVIDIA GPU found: placing by slots only"


@pytest.mark.parametrize("spec", ["cuda", "fake", "fake:", "nvml:0", "none:x"])
def test_make_probe_rejects_unknown_specs(spec: str) -> None:
    with pytest.raises(PlanError, match="'fake:4x24GiB', 'nvml' or 'none'"):
        make_probe(spec, environ={})


def test_make_probe_explicit_bad_fake_names_the_spec() -> None:
    with pytest.raises(PlanError, match=r"probe 'fake:4x': '4x' is not a fake GPU list"):
        make_probe("fake:4x", environ={})


def test_make_probe_env_fake_with_state(tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"1": {"used_mib": 4096}}))
    probe = make_probe(environ={"GPUSCHED_FAKE_GPUS": "2x8GiB", "GPUSCHED_FAKE_GPU_STATE": str(state)})
    assert isinstance(probe, FakeProbe)
    assert [s.free_mib for s in probe.snapshot()] == [8192, 4096]


def test_make_probe_bad_env_spec_names_the_variable() -> None:
    with pytest.raises(PlanError, match="GPUSCHED_FAKE_GPUS: '4 x' is not a fake GPU list"):
        make_probe(environ={"GPUSCHED_FAKE_GPUS": "4 x"})


def test_make_probe_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_FAKE_GPUS", "1x24GiB")
    assert isinstance(make_probe(), FakeProbe)


def test_make_probe_prefers_nvml_when_it_finds_a_gpu(sim: SimulatedNvml) -> None:
    probe = make_probe(environ={})
    assert isinstance(probe, NvmlProbe) and len(probe.snapshot()) == 2


def test_make_probe_without_gpu_is_no_probe_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pynvml, "nvmlInit", raiser(nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)))
    probe = make_probe(environ={})
    assert isinstance(probe, NoProbe) and probe.snapshot() == []
    assert probe.notice() == "no NVIDIA GPU found (NVML Shared Library Not Found): placing by slots only"


def test_make_probe_on_this_machine_never_raises() -> None:
    probe = make_probe(environ={k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")})
    assert probe.name in ("nvml", "none")
    assert isinstance(probe.snapshot(), list)


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED])
def test_nvml_a_card_lost_in_any_field_is_lost_not_unknown(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A card that answers its handle but refuses its memory as lost (or needing a reset) is
    lost; any other refusal of a field stays that field's unknown value."""
    memory = sim.nvmlDeviceGetMemoryInfo

    def lost_on_0(handle: int, version: Any = None) -> SimpleNamespace:
        if handle == 0:
            raise nvml_error(code)
        return memory(handle, version)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lost_on_0)
    probe = NvmlProbe()
    states = probe.snapshot()
    assert [s.lost for s in states] == [True, False]
    assert states[0].uuid is None and states[1].free_mib == 24 * GIB_MIB  # nothing known of it before
    assert probe.problem is None


def test_nvml_any_other_handle_error_still_makes_the_read_unknown(
    sim: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a lost card is read around: a handle refused for another reason may be NVML's
    hiccup, and the read is retried, then unknown as a whole (the probe says why)."""
    probe = NvmlProbe(retry_wait_s=0.001)
    probe.snapshot()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", raiser(nvml_error(pynvml.NVML_ERROR_UNKNOWN)))
    states = probe.snapshot()
    assert [(s.lost, s.free_mib) for s in states] == [(False, None), (False, None)]
    assert probe.problem is not None and "reading GPUs failed" in probe.problem
