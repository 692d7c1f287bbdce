"""Pick the probe for this machine. A machine without GPUs is never an error: it gets
:class:`NoProbe` and gpusched places jobs by slots only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpusched.errors import PlanError
from gpusched.gpus import Probe
from gpusched.gpus.fake import SPEC_ENV, STATE_ENV, FakeProbe
from gpusched.model import GpuState

if TYPE_CHECKING:  # imported where used: pynvml and tenacity cost ~15 ms, fake probes need neither
    from gpusched.gpus.nvml import NvmlProbe

SPEC_FORMS = "'fake:4x24GiB', 'nvml' or 'none'"


class NoProbe:
    """No GPU to watch: an empty snapshot and a notice saying placement uses slots only."""

    name = "none"

    def __init__(self, *, detail: str | None = None) -> None:
        self.detail = detail

    def snapshot(self) -> list[GpuState]:
        return []

    def notice(self) -> str | None:
        why = f" ({self.detail})" if self.detail else ""
        return f"no NVIDIA GPU found{why}: placing by slots only"


def make_probe(spec: str | None = None, environ: Mapping[str, str] | None = None) -> Probe:
    """The probe to use, first match wins: an explicit ``spec`` (``"fake:4x24GiB"``,
    ``"nvml"``, ``"none"``) > ``GPUSCHED_FAKE_GPUS`` > NVML when it finds a GPU > :class:`NoProbe`.

    Raises :class:`PlanError` only for a malformed ``spec`` or ``GPUSCHED_FAKE_GPUS``; an
    explicit ``"nvml"`` is returned even when NVML is unavailable (its notice says why)."""
    env = os.environ if environ is None else environ
    if spec is not None and spec.strip():
        return _from_spec(spec.strip(), env)
    if env.get(SPEC_ENV, "").strip():
        return FakeProbe.from_spec(env[SPEC_ENV], state_path=_state_path(env))
    from gpusched.gpus.nvml import NvmlProbe

    nvml = NvmlProbe()
    if nvml.is_available():
        return nvml
    return NoProbe(detail=_nvml_reason(nvml))


def _from_spec(spec: str, env: Mapping[str, str]) -> Probe:
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "fake" and rest.strip():
        return FakeProbe.from_spec(rest, state_path=_state_path(env), source=f"probe {spec!r}")
    if kind == "nvml" and not rest:
        from gpusched.gpus.nvml import NvmlProbe

        return NvmlProbe()
    if kind == "none" and not rest:
        return NoProbe()
    raise PlanError(f"GPU probe {spec!r} is not known: use {SPEC_FORMS}")


def _state_path(env: Mapping[str, str]) -> str | None:
    return env.get(STATE_ENV) or None


def _nvml_reason(nvml: NvmlProbe) -> str | None:
    problem = nvml.problem
    if not problem:
        return None
    return problem if problem.startswith("NVML") else f"NVML: {problem}"
