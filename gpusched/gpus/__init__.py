"""GPU probes: what each card holds right now. One small interface, a real NVML
implementation and a fake one for tests, demos and laptops."""

from __future__ import annotations

from typing import Protocol

from gpusched.model import GpuState


class Probe(Protocol):
    """Reports the machine's GPUs. Contract: ``snapshot()`` never raises; values it cannot
    read are ``None``; a machine without GPUs or without a driver gives ``[]``."""

    name: str  # "nvml", "fake", "none"

    def snapshot(self) -> list[GpuState]: ...

    def notice(self) -> str | None:
        """One line for the user when the probe is degraded (no driver, fake GPUs...)."""
        ...
