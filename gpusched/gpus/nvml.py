"""The real probe: nvidia-ml-py (module ``pynvml``), imported lazily so that importing
gpusched never loads NVML.

This module is the one boundary where NVML errors become "unknown" (STYLE #9):

- a failing field (one call on one device) reads as ``None`` (or no processes);
- a failing whole read (device count, a device handle) is retried a few times within about
  0.1 s (through tenacity, imported only then: a read that works, as nearly all do, does not
  pay its ~15 ms of imports on every ``status``), then gives an "unknown" snapshot: the GPUs
  seen last time with ``None`` values, or ``[]`` when none was ever seen;
- no driver, no library, no GPU: ``[]`` and a one-line :meth:`NvmlProbe.notice`;
- a card the driver calls lost (GPU_IS_LOST, RESET_REQUIRED) is that card's fact, not a
  failed read: it comes back ``lost`` (with the uuid, name and size seen last), and every
  other card is read as usual, so one card off the bus does not blind placement on the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from gpusched.model import GpuProcess, GpuState

_BYTES_PER_MIB = 1024 * 1024
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
_PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")
_LOST_CODES = (15, 16)  # NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED


class NvmlProbe:
    """Reads every GPU NVML sees. NVML is initialised once, on first use; a failed
    initialisation is remembered (the notice says why) and is not retried."""

    name = "nvml"

    def __init__(
        self,
        *,
        attempts: int = 3,
        retry_wait_s: float = 0.02,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._attempts = max(1, attempts)
        self._retry_wait_s = retry_wait_s
        self._clock = clock
        self._sleep = sleep
        self._nvml: ModuleType | None = None
        self._init_tried = False
        self._problem: str | None = None
        self._known: tuple[GpuState, ...] = ()

    @classmethod
    def available(cls) -> bool:
        """True when NVML initialises and reports at least one GPU. Never raises."""
        return cls().is_available()

    def is_available(self) -> bool:
        """This instance's view of :meth:`available` (initialises NVML if needed)."""
        nvml = self._ensure_init()
        if nvml is None:
            return False
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as err:
            self._problem = f"cannot count GPUs: {describe_error(err)}"
            return False
        if count <= 0:
            self._problem = "the driver reports 0 GPUs"
        return count > 0

    def snapshot(self) -> list[GpuState]:
        """Every GPU, index order; never raises (see the module docstring)."""
        try:
            nvml = self._ensure_init()
            return [] if nvml is None else self._read_with_retry(nvml)
        except Exception as err:
            self._problem = f"reading GPUs failed: {describe_error(err)}"
            return self._unknown_snapshot()

    def notice(self) -> str | None:
        """``None`` when NVML works, else ``"NVML unavailable: <reason>; placing by slots only"``."""
        if self._problem is None and not self._known:
            self.is_available()
        if self._problem is None:
            return None
        return f"NVML unavailable: {self._problem}; placing by slots only"

    @property
    def problem(self) -> str | None:
        """Why NVML gives nothing (no library, no driver, 0 GPUs, last read failed), or ``None``."""
        return self._problem

    def close(self) -> None:
        """Release NVML (optional; NVML counts its initialisations)."""
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml, self._init_tried = None, False

    # ------------------------------------------------------------------ internals

    def _ensure_init(self) -> ModuleType | None:
        if not self._init_tried:
            self._init_tried = True
            self._nvml = self._init()
        return self._nvml

    def _init(self) -> ModuleType | None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as err:  # ImportError, NVMLError, OSError from ctypes...
            self._problem = describe_error(err)
            return None
        return pynvml

    def _read_with_retry(self, nvml: ModuleType) -> list[GpuState]:
        try:
            states = read_all(nvml, self._clock(), self._known)
        except Exception:
            if self._attempts == 1:
                raise
            states = self._retry(nvml)
        self._known = tuple(states)
        self._problem = None if states else "the driver reports 0 GPUs"
        return states

    def _retry(self, nvml: ModuleType) -> list[GpuState]:
        """The reads after a failed first one: waits of ``retry_wait_s``, then 2x, 4x... (at
        most 0.2 s), ``attempts`` reads in all; the last one's error is raised."""
        from tenacity import Retrying, stop_after_attempt, wait_exponential

        self._sleep(min(self._retry_wait_s, 0.2))
        retrying = Retrying(
            stop=stop_after_attempt(self._attempts - 1),
            wait=wait_exponential(multiplier=2 * self._retry_wait_s, max=0.2),
            sleep=self._sleep,
            reraise=True,
        )
        states: list[GpuState] = retrying(read_all, nvml, self._clock(), self._known)
        return states

    def _unknown_snapshot(self) -> list[GpuState]:
        now = self._clock()
        return [
            GpuState(index=g.index, uuid=g.uuid, name=g.name, total_mib=g.total_mib, sampled_at=now)
            for g in self._known
        ]


def read_all(nvml: Any, now: float, known: Iterable[GpuState] = ()) -> list[GpuState]:
    """One read of every device. Raises when the device list itself cannot be read, or a
    device's handle for any reason but the card being lost: a lost one is :func:`lost_device`,
    from what ``known`` (the last snapshot) says of it."""
    count = int(nvml.nvmlDeviceGetCount())
    last = {g.index: g for g in known}
    states = []
    for i in range(count):
        try:
            states.append(read_device(nvml, i, nvml.nvmlDeviceGetHandleByIndex(i), now))
        except Exception as err:
            if not is_lost(err):
                raise
            states.append(lost_device(i, last.get(i), now))
    return states


def lost_device(index: int, last: GpuState | None, now: float) -> GpuState:
    """A card the driver calls lost: what was known of it (uuid, name, size), nothing else."""
    if last is None:
        return GpuState(index=index, sampled_at=now, lost=True)
    return GpuState(
        index=index, uuid=last.uuid, name=last.name, total_mib=last.total_mib, sampled_at=now, lost=True
    )


def is_lost(err: BaseException) -> bool:
    """True for NVML's "the card is gone until reset" errors (GPU_IS_LOST, RESET_REQUIRED)."""
    return type(err).__name__.startswith("NVMLError") and getattr(err, "value", None) in _LOST_CODES


def read_device(nvml: Any, index: int, handle: Any, now: float) -> GpuState:
    """One device; each field that NVML refuses is ``None``. Raises when NVML says the card
    is lost (see :func:`is_lost`)."""
    memory = read_memory(nvml, handle)
    util = _call(nvml.nvmlDeviceGetUtilizationRates, handle)
    return GpuState(
        index=index,
        uuid=_text(_call(nvml.nvmlDeviceGetUUID, handle)),
        name=_text(_call(nvml.nvmlDeviceGetName, handle)),
        total_mib=to_mib(getattr(memory, "total", None)),
        free_mib=to_mib(getattr(memory, "free", None)),
        used_mib=to_mib(getattr(memory, "used", None)),
        util_pct=_int(getattr(util, "gpu", None)),
        processes=read_processes(nvml, handle),
        sampled_at=now,
    )


def read_memory(nvml: Any, handle: Any) -> Any:
    """The v2 memory record (its ``used`` leaves out driver-reserved memory) where this
    nvidia-ml-py and driver have it, else v1; ``None`` when neither answers."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        memory = _call(nvml.nvmlDeviceGetMemoryInfo, handle, version=version)
        if memory is not None:
            return memory
    return _call(nvml.nvmlDeviceGetMemoryInfo, handle)


def read_processes(nvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes, one entry per pid (the larger known usage wins)."""
    by_pid: dict[int, GpuProcess] = {}
    for proc in _raw_processes(nvml, handle):
        pid = _int(getattr(proc, "pid", None))
        if pid is not None:
            by_pid[pid] = _merge_process(by_pid.get(pid), pid, to_mib(getattr(proc, "usedGpuMemory", None)))
    return tuple(by_pid[pid] for pid in sorted(by_pid))


def _raw_processes(nvml: Any, handle: Any) -> Iterable[Any]:
    for call_name in _PROCESS_CALLS:
        call = getattr(nvml, call_name, None)
        yield from (_call(call, handle) or []) if call is not None else []


def _merge_process(old: GpuProcess | None, pid: int, used_mib: int | None) -> GpuProcess:
    if old is None or old.used_mib is None:
        return GpuProcess(pid=pid, used_mib=used_mib)
    return GpuProcess(pid=pid, used_mib=max(old.used_mib, used_mib or 0))


def to_mib(value: Any) -> int | None:
    """Bytes -> MiB; ``None`` for missing values and NVML_VALUE_NOT_AVAILABLE."""
    number = _int(value)
    if number is None or number == _NOT_AVAILABLE or number < 0:
        return None
    return number // _BYTES_PER_MIB


def describe_error(err: BaseException) -> str:
    """A short reason for the notice: NVML's own words where it has them."""
    if isinstance(err, ImportError):
        return "nvidia-ml-py (pynvml) is not installed"
    text = str(err).strip()
    return text if text and type(err).__name__.startswith("NVMLError") else f"{type(err).__name__}: {text}"


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Per-field boundary: NVML raises NVMLError subclasses, ctypes may raise others. A lost
    # card is not a field's failure: it goes up to read_all, which marks the card.
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        if is_lost(err):
            raise
        return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
