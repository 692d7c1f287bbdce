"""Example trainer for gpusched: LoRA fine-tuning of a small GLA-style classifier.

A real torch training loop at toy scale, shaped like the seed-004 GLA LoRA runs: an
embedding, N blocks of gated linear attention + SwiGLU MLP, a classification head over
the last token. Base weights are frozen (they stand for a pretrained model; here they are
seeded random weights); only the LoRA adapters on q/k/v/o and the head train. The data is
synthetic GLUE-style classification, generated from the task name and seed (no downloads).

    python launchers/train_glue.py --config CONFIG.yaml

Config keys (YAML mapping; unknown keys are listed once and ignored):
  data                        task name, e.g. glue-tvt_qnli (3 labels when it names mnli, else 2)
  seed                        model init, data and sample order
  batch_size                  micro-batch
  gradient_accumulation_steps micro-batches per optimizer step
  gradient_checkpointing      recompute each block in backward (torch.utils.checkpoint)
  logits_to_keep              run the head on the last k positions only; 0 = all
  num_data_workers            DataLoader workers
  dataloader_prefetch_factor  passed only when num_data_workers > 0
  max_steps, learning_rate (constant), max_grad_norm, log_every
  precision                   fp32 | bf16 | fp16 (autocast; fp16 needs CUDA, falls back to fp32)
  output_dir, save_every      checkpoints: output_dir/checkpoint-<step>/state.pt (every
                              save_every steps and at the end; the newest 2 kept)
  is_keep_training            resume from the newest checkpoint in output_dir, if any
  resume_from_checkpoint      a checkpoint dir or state.pt (or true: the newest in output_dir)
  model                       {hidden_size, num_layers, num_heads, seq_len, vocab_size,
                               lora_rank, lora_alpha}
  train_examples, eval_examples
  simulate_oom_above_batch, simulate_oom_after_step   tests only, see _simulated_cuda_oom
  gpu_memory_gib              cap this process's CUDA memory (emulate a smaller card)
The defaults are tiny (20 steps in seconds on a CPU); configs/gla_lora_base.yaml is GPU-sized.

A checkpoint holds the trainable weights, the optimizer, the step and how many samples were
consumed: a resumed run, even at another micro-batch (a gpusched tier), continues the same
data stream and, with the same effective batch, the same optimisation.

Output: ``step 12/200 loss 0.6931 micro_batch 8 accum 2`` every log_every steps, then
``done: steps=200 final_loss=0.1234 eval_acc=0.9102``. Under gpusched the run is wrapped in
``gpusched.runtime.guard()`` (CUDA OOM -> exit 86) and reports progress to runtime.json.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Sampler, TensorDataset

runtime: ModuleType | None
try:
    from gpusched import runtime
except ImportError:
    _checkout = Path(__file__).resolve().parents[1]
    if (_checkout / "gpusched" / "runtime.py").is_file():  # run from a gpusched source checkout
        sys.path.insert(0, str(_checkout))
        from gpusched import runtime
    else:  # a training env without gpusched: train anyway; OOM is then known from the log only
        runtime = None

CHUNK = 16  # GLA chunk length: intra-chunk terms in parallel, state carried across chunks
GATE_NORMALIZER = 16.0  # as in GLA: keeps per-token decay close to 1 so memory is long
CLS, SEP, FIRST_WORD = 1, 2, 3  # token ids; 0 is unused padding


class ConfigError(Exception):
    pass


# --------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    seq_len: int = 32
    vocab_size: int = 512
    lora_rank: int = 4
    lora_alpha: float = 8.0


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    data: str = "glue-tvt_sst2"
    seed: int = 0
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    logits_to_keep: int = 0
    num_data_workers: int = 0
    dataloader_prefetch_factor: int = 2
    max_steps: int = 20
    learning_rate: float = 2e-3
    max_grad_norm: float = 1.0
    log_every: int = 10
    save_every: int = 0
    precision: str = "fp32"
    output_dir: str | None = None
    is_keep_training: bool = False
    resume_from_checkpoint: str | bool | None = None
    train_examples: int = 4096
    eval_examples: int = 256
    simulate_oom_above_batch: int | None = None
    simulate_oom_after_step: int = 0
    gpu_memory_gib: float | None = None  # cap this process's CUDA memory: emulate a smaller card
    model: ModelConfig = field(default_factory=ModelConfig)

    @property
    def num_labels(self) -> int:
        return 3 if "mnli" in self.data.lower() else 2


def load_config(path: str) -> tuple[TrainConfig, list[str]]:
    """The validated config and the keys it ignored."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping")
    model_raw = raw.get("model") or {}
    if not isinstance(model_raw, Mapping):
        raise ConfigError(f"{path}: 'model' must be a mapping of sizes (hidden_size, num_layers, ...)")
    model = ModelConfig(**_coerce(ModelConfig, model_raw, f"{path}: model."))
    top = {k: v for k, v in raw.items() if k != "model"}
    cfg = TrainConfig(model=model, **_coerce(TrainConfig, top, f"{path}: "))
    _validate(cfg, path)
    known = {f.name for f in fields(TrainConfig)} | {f"model.{f.name}" for f in fields(ModelConfig)}
    keys = [k for k in top] + [f"model.{k}" for k in model_raw]
    return cfg, sorted(k for k in keys if k not in known)


def _coerce(cls: type, raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Known keys of ``raw`` converted by their field's declared type; None keeps the default."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        value = raw.get(f.name)
        if f.name == "model" or value is None:
            continue
        try:
            out[f.name] = _CONVERTERS[str(f.type)](value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}{f.name}: {value!r} is not valid ({exc})") from None
    return out


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or float(value) != int(value):  # YAML "yes" or 2.5 is a typo here
        raise ValueError("expected an integer")
    return int(value)


def _to_bool(value: Any) -> bool:
    # a shell-made override may arrive as the string "true"
    text = str(value).strip().lower()
    if text in {"true", "1", "yes", "on"}:
        return True
    if text in {"false", "0", "no", "off"}:
        return False
    raise ValueError("expected true or false")


def _path_or_flag(value: Any) -> str | bool:
    return value if isinstance(value, bool) else str(value)


# keyed by the annotation text (this module uses postponed annotations)
_CONVERTERS: dict[str, Any] = {
    "int": _to_int,
    "int | None": _to_int,
    "float": float,
    "float | None": float,
    "bool": _to_bool,
    "str": str,
    "str | None": str,
    "str | bool | None": _path_or_flag,
}


def _validate(cfg: TrainConfig, path: str) -> None:
    positive = ["batch_size", "gradient_accumulation_steps", "log_every", "train_examples", "eval_examples"]
    for key in positive:
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{path}: {key} must be >= 1, got {getattr(cfg, key)}")
    for key in ["max_steps", "save_every", "num_data_workers", "logits_to_keep"]:
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{path}: {key} must be >= 0, got {getattr(cfg, key)}")
    if cfg.precision not in {"fp32", "bf16", "fp16"}:
        raise ConfigError(f"{path}: precision must be fp32, bf16 or fp16, got {cfg.precision!r}")
    m = cfg.model
    if m.hidden_size % (2 * m.num_heads):
        raise ConfigError(f"{path}: model.hidden_size must be a multiple of 2 * model.num_heads")
    if m.vocab_size < FIRST_WORD + 8 * cfg.num_labels + 8 or m.seq_len < 8:
        raise ConfigError(f"{path}: model.vocab_size or model.seq_len too small for the synthetic task")


# --------------------------------------------------------------------------- data


def synthetic_glue(
    task: str, seed: int, n: int, cfg: ModelConfig, num_labels: int, split: str
) -> TensorDataset:
    """Deterministic GLUE-style pairs: ``a ... SEP b ... CLS``. Each label owns a few "cue"
    words; an example holds three cues of its label and one of another label, so the label
    is a majority vote the model must carry to the last token through its recurrent state."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{task}/{seed}".encode()))  # the task: shared by splits
    cues = FIRST_WORD + torch.randperm(cfg.vocab_size - FIRST_WORD, generator=g)[: 8 * num_labels]
    cues = cues.view(num_labels, 8)
    g.manual_seed(zlib.crc32(f"{task}/{seed}/{split}".encode()))  # the examples of this split
    labels = torch.randint(num_labels, (n,), generator=g)
    ids = torch.randint(FIRST_WORD, cfg.vocab_size, (n, cfg.seq_len), generator=g)
    decoy = (labels + torch.randint(1, num_labels, (n,), generator=g)) % num_labels
    owners = torch.stack([labels, labels, labels, decoy], dim=1)
    words = cues[owners, torch.randint(8, owners.shape, generator=g)]
    positions = torch.rand(n, cfg.seq_len - 2, generator=g).argsort(dim=1)[:, :4]
    ids.scatter_(1, positions, words)
    ids[:, cfg.seq_len // 2 - 1] = SEP
    ids[:, -1] = CLS
    return TensorDataset(ids, labels)


class ResumableSampler(Sampler[int]):
    """An endless index stream: epoch e is a permutation seeded by (seed, e). Starting at
    ``start`` skips what earlier attempts consumed, so a resumed run - even at another
    micro-batch size - continues the same data stream."""

    def __init__(self, n: int, seed: int, start: int = 0) -> None:
        self.n, self.seed, self.start = n, seed, start

    def __iter__(self) -> Iterator[int]:
        epoch, offset = divmod(self.start, self.n)
        while True:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            yield from torch.randperm(self.n, generator=g)[offset:].tolist()
            epoch, offset = epoch + 1, 0


def make_loader(ds: TensorDataset, cfg: TrainConfig, start: int, pin: bool) -> DataLoader:
    extra: dict[str, Any] = {}
    if cfg.num_data_workers > 0:  # DataLoader rejects prefetch_factor without workers
        extra["prefetch_factor"] = cfg.dataloader_prefetch_factor
    return DataLoader(
        ds,
        batch_size=cfg.batch_size,
        sampler=ResumableSampler(len(ds), cfg.seed, start),
        num_workers=cfg.num_data_workers,
        pin_memory=pin,
        **extra,
    )


# --------------------------------------------------------------------------- model


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update ``B @ A`` (B starts at zero,
    so training starts from the base model exactly)."""

    def __init__(self, d_in: int, d_out: int, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out, bias=False)
        self.rank, self.scaling = rank, alpha / max(rank, 1)
        if rank > 0:
            self.lora_a = nn.Parameter(torch.empty(rank, d_in))
            self.lora_b = nn.Parameter(torch.zeros(d_out, rank))
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.rank > 0:
            y = y + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling
        return y


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def gla_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_a: torch.Tensor) -> torch.Tensor:
    """Gated linear attention, chunkwise-parallel form, in float32.

    Recurrence: ``S_t = diag(a_t) S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t`` with ``a_t =
    exp(log_a_t)``. q, k, log_a: (B, H, T, dk); v: (B, H, T, dv). Inside a chunk the decays
    are relative (``exp(b_i - b_j)``, j <= i, never above 1), so nothing overflows.
    """
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, log_a = (t.float() for t in (q, k, v, log_a))
        b_, h_, t_, _ = q.shape
        pad = -t_ % CHUNK  # zero k/v and a=1 at the end change no earlier output
        q, k, v, log_a = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_a))
        q, k, v, log_a = (t.unflatten(2, (-1, CHUNK)) for t in (q, k, v, log_a))  # (B,H,N,C,d)
        b = log_a.cumsum(-2)
        causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
        rel = (b.unsqueeze(-2) - b.unsqueeze(-3)).masked_fill(~causal[..., None], -math.inf).exp()
        out = torch.einsum("bhnid,bhnjd,bhnijd->bhnij", q, k, rel) @ v
        q_in, k_out = q * b.exp(), k * (b[..., -1:, :] - b).exp()
        state = q.new_zeros(b_, h_, q.shape[-1], v.shape[-1])
        carried = []
        for n in range(q.shape[2]):
            carried.append(q_in[:, :, n] @ state)
            state = b[:, :, n, -1, :, None].exp() * state + k_out[:, :, n].transpose(-1, -2) @ v[:, :, n]
        out = out + torch.stack(carried, dim=2)
        return out.flatten(2, 3)[:, :, :t_]


class GatedLinearAttention(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.heads, key_dim = m.num_heads, m.hidden_size // 2  # GLA uses half-width keys
        self.q, self.k = (LoRALinear(m.hidden_size, key_dim, m.lora_rank, m.lora_alpha) for _ in range(2))
        self.v, self.o = (
            LoRALinear(m.hidden_size, m.hidden_size, m.lora_rank, m.lora_alpha) for _ in range(2)
        )
        self.gate_k = nn.Sequential(nn.Linear(m.hidden_size, 16, bias=False), nn.Linear(16, key_dim))
        self.gate_out = nn.Linear(m.hidden_size, m.hidden_size, bias=False)
        self.head_norm = RMSNorm(m.hidden_size // m.num_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        log_a = heads(F.logsigmoid(self.gate_k(x)) / GATE_NORMALIZER)
        o = self.head_norm(gla_chunked(q * q.shape[-1] ** -0.5, k, v, log_a).to(x.dtype))
        return self.o(o.transpose(1, 2).flatten(2) * F.silu(self.gate_out(x)))


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(m.hidden_size), RMSNorm(m.hidden_size)
        self.attn = GatedLinearAttention(m)
        self.gate_up = nn.Linear(m.hidden_size, 2 * 4 * m.hidden_size, bias=False)
        self.down = nn.Linear(4 * m.hidden_size, m.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class GLAClassifier(nn.Module):
    def __init__(self, m: ModelConfig, num_labels: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(m.vocab_size, m.hidden_size)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m.num_layers))
        self.norm = RMSNorm(m.hidden_size)
        self.head = nn.Linear(m.hidden_size, num_labels)
        for name, p in self.named_parameters():  # LoRA: only adapters and the new head learn
            p.requires_grad_("lora_" in name or name.startswith("head."))

    def forward(
        self, ids: torch.Tensor, logits_to_keep: int = 0, checkpointing: bool = False
    ) -> torch.Tensor:
        """Logits (B, k, num_labels) for the last ``logits_to_keep`` positions (0: all T)."""
        h = self.embed(ids)
        recompute = checkpointing and self.training  # trade backward compute for activation memory
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if recompute else block(h)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return self.head(self.norm(h))


# --------------------------------------------------------------------------- checkpoints


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every complete checkpoint, oldest first."""
    found = []
    for d in output_dir.glob("checkpoint-*"):
        step = d.name.removeprefix("checkpoint-")
        if step.isdigit() and (d / "state.pt").is_file():
            found.append((int(step), d))
    return sorted(found)


def save_checkpoint(output_dir: Path, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``checkpoint-<step>/state.pt`` via a hidden temp dir and a rename, so a job
    killed mid-save never leaves a checkpoint that looks complete; keep the newest ``keep``."""
    final = output_dir / f"checkpoint-{state['step']}"
    tmp = output_dir / f".checkpoint-{state['step']}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for _, old in checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resume_source(cfg: TrainConfig) -> Path | None:
    """The state.pt to resume from, or None to start fresh."""
    explicit = cfg.resume_from_checkpoint
    if isinstance(explicit, str):
        path = Path(explicit)
        path = path / "state.pt" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"resume_from_checkpoint: {explicit} has no state.pt")
        return path
    if not (cfg.is_keep_training or explicit is True):
        return None
    found = checkpoints(Path(cfg.output_dir)) if cfg.output_dir else []
    if not found:
        print(f"train_glue: no checkpoint in output_dir={cfg.output_dir}; starting at step 0", flush=True)
        return None
    return found[-1][1] / "state.pt"


# --------------------------------------------------------------------------- training


def report(**values: Any) -> None:
    """gpusched.runtime.report, when gpusched is importable."""
    if runtime is not None:
        runtime.report(**values)


@dataclass
class Progress:
    step: int = 0
    samples_seen: int = 0
    loss: float = math.nan


def _simulated_cuda_oom(cfg: TrainConfig, step: int) -> None:
    """TEST-ONLY stand-in for a real GPU OOM on CPU-only machines: raise a genuine
    torch.OutOfMemoryError with the message CUDA prints, when ``batch_size`` exceeds
    ``simulate_oom_above_batch`` and ``simulate_oom_after_step`` steps are done. It is
    checked at the first forward of a step, after the previous step's checkpoint is
    saved, so with save_every <= simulate_oom_after_step a checkpoint survives the OOM."""
    limit = cfg.simulate_oom_above_batch
    if limit is None or cfg.batch_size <= limit or step < cfg.simulate_oom_after_step:
        return
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    raise oom(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of "
        "which 28.25 MiB is free. Including non-PyTorch memory, this process has 23.62 GiB memory in "
        "use. Of the allocated memory 21.87 GiB is allocated by PyTorch, and 1.21 GiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
        "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        # an indexed device: torch's memory calls (set_per_process_memory_fraction) refuse a bare "cuda"
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        if cfg.gpu_memory_gib and self.device.type == "cuda":
            # benchmarks/gpu_oom_ladder.py: a 24 GiB card emulated on a bigger one; past the cap
            # the caching allocator raises a genuine torch.OutOfMemoryError
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, cfg.gpu_memory_gib * 2**30 / total), self.device
            )
        self.dtype = self._autocast_dtype()
        torch.manual_seed(cfg.seed)
        self.model = GLAClassifier(cfg.model, cfg.num_labels).to(self.device)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=0.0)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.progress = Progress()

    def _autocast_dtype(self) -> torch.dtype | None:
        if self.cfg.precision == "fp16" and self.device.type != "cuda":
            print("train_glue: precision fp16 needs CUDA; running fp32 on CPU", file=sys.stderr)
            return None
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.cfg.precision)

    @property
    def precision(self) -> str:
        """The precision in effect (fp16 requested on CPU runs as fp32)."""
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")  # type: ignore[arg-type]

    def describe(self) -> str:
        n_all = sum(p.numel() for p in self.model.parameters())
        n_train = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        c = self.cfg
        return (
            f"train_glue: data={c.data} labels={c.num_labels} seed={c.seed} device={self.device} "
            f"precision={self.precision} "
            f"params trainable={n_train}/{n_all} gradient_checkpointing={c.gradient_checkpointing} "
            f"logits_to_keep={c.logits_to_keep} num_data_workers={c.num_data_workers}"
        )

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: the trainable weights only (LoRA + head). The frozen base
        is rebuilt from (model sizes, seed), which load() checks, so a checkpoint stays small."""
        p, trainable = self.progress, {n for n, w in self.model.named_parameters() if w.requires_grad}
        return {
            "step": p.step,
            "samples_seen": p.samples_seen,
            "loss": p.loss,
            "data": self.cfg.data,
            "seed": self.cfg.seed,
            "model_config": asdict(self.cfg.model),
            "trainable": {n: w for n, w in self.model.state_dict().items() if n in trainable},
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load(self, path: Path) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        saved = (state["model_config"], state["seed"], state["data"])
        if saved != (asdict(self.cfg.model), self.cfg.seed, self.cfg.data):
            raise ConfigError(
                f"{path}: saved for model={saved[0]} seed={saved[1]} data={saved[2]}, which this config "
                "does not match; point output_dir elsewhere or remove the checkpoint"
            )
        missing, unexpected = self.model.load_state_dict(state["trainable"], strict=False)
        trainable = {n for n, w in self.model.named_parameters() if w.requires_grad}
        if unexpected or trainable & set(missing):  # strict=False only lets the frozen base be absent
            raise ConfigError(f"{path}: weights do not fit this model ({unexpected or missing})")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(step=state["step"], samples_seen=state["samples_seen"], loss=state["loss"])

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def train_step(self, batches: Iterator[list[torch.Tensor]]) -> float:
        """One optimizer step over gradient_accumulation_steps micro-batches; the mean loss."""
        cfg, total = self.cfg, torch.zeros((), device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        for micro in range(cfg.gradient_accumulation_steps):
            ids, labels = (t.to(self.device, non_blocking=True) for t in next(batches))
            if micro == 0:
                _simulated_cuda_oom(cfg, self.progress.step)
            with self.autocast():
                logits = self.model(ids, cfg.logits_to_keep, cfg.gradient_checkpointing)
            loss = F.cross_entropy(logits[:, -1].float(), labels) / cfg.gradient_accumulation_steps
            self.scaler.scale(loss).backward()
            total += loss.detach()  # no .item() here: it would sync the GPU every micro-batch
        self.scaler.unscale_(self.optimizer)
        nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return float(total)

    @torch.no_grad()
    def evaluate(self, ds: TensorDataset) -> float:
        self.model.eval()
        correct = 0
        # in the tier's micro-batch: a fixed batch here OOMed at every tier of the ladder on a real
        # H200 (benchmarks/gpu_oom_ladder.py), since no tier could shrink it
        for ids, labels in DataLoader(ds, batch_size=self.cfg.batch_size):
            with self.autocast():
                logits = self.model(ids.to(self.device), logits_to_keep=1)
            correct += int((logits[:, -1].argmax(-1).cpu() == labels).sum())
        self.model.train()
        return correct / len(ds)


def progress_line(cfg: TrainConfig, p: Progress) -> str:
    """The line gpusched shows as a job's last line; keep its shape, tools parse it."""
    return (
        f"step {p.step}/{cfg.max_steps} loss {p.loss:.4f} "
        f"micro_batch {cfg.batch_size} accum {cfg.gradient_accumulation_steps}"
    )


def train(cfg: TrainConfig) -> None:
    trainer = Trainer(cfg)
    print(trainer.describe(), flush=True)
    out = Path(cfg.output_dir) if cfg.output_dir else None
    if out is None and cfg.save_every:
        print("train_glue: no output_dir, checkpoints disabled", file=sys.stderr)
    source = resume_source(cfg)
    if source is not None:
        trainer.load(source)
        print(f"resumed from {source.parent} at step {trainer.progress.step}", flush=True)
    p = trainer.progress
    report(steps_done=p.step)
    m = cfg.model
    train_ds = synthetic_glue(cfg.data, cfg.seed, cfg.train_examples, m, cfg.num_labels, "train")
    loader = make_loader(train_ds, cfg, p.samples_seen, pin=trainer.device.type == "cuda")
    batches = iter(loader)
    while p.step < cfg.max_steps:
        p.loss = trainer.train_step(batches)
        p.step += 1
        p.samples_seen += cfg.batch_size * cfg.gradient_accumulation_steps
        if p.step % cfg.log_every == 0 or p.step == cfg.max_steps:
            print(progress_line(cfg, p), flush=True)
        if out is not None and cfg.save_every and (p.step % cfg.save_every == 0 or p.step == cfg.max_steps):
            save_checkpoint(out, trainer.state())
        report(steps_done=p.step)
    del batches  # stop DataLoader workers before evaluating
    eval_ds = synthetic_glue(cfg.data, cfg.seed, cfg.eval_examples, m, cfg.num_labels, "eval")
    acc = trainer.evaluate(eval_ds)
    report(steps_done=p.step, final_loss=p.loss, eval_acc=acc)
    print(f"done: steps={p.step} final_loss={p.loss:.4f} eval_acc={acc:.4f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML config (see the module docstring)")
    # the deepspeed launcher adds --local_rank; this single-process trainer has nothing to do with it
    parser.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        cfg, ignored = load_config(args.config)
        if ignored:
            print(f"train_glue: ignoring unknown config keys: {', '.join(ignored)}", file=sys.stderr)
        train(cfg)
    except (ConfigError, OSError, yaml.YAMLError) as exc:
        print(f"train_glue: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    if runtime is None:
        print(
            "train_glue: gpusched is not importable here: no OOM exit code, no runtime.json", file=sys.stderr
        )
        sys.exit(main())
    sys.exit(runtime.run(main))
