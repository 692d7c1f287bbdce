"""How did an attempt end, and what happens to its job next.

Pure functions over plain values, no clock, file or process:

* :func:`classify` turns an exit record and the tail of the job's log into a
  :class:`~gpusched.model.Classification` (ok, GPU OOM, host OOM, error, cancelled, lost,
  timeout),
  with a reason a person can read and the log line that shows it;
* :func:`next_step` turns that classification and the job's history into a
  :class:`~gpusched.model.Step` (done, requeue at some tier, fail, cancel);
* :func:`past_limit` says whether a running attempt passed its suite's time or silence limit.

Every message that proves an out-of-memory death, or a GPU that failed under its job, is in
one table, :data:`SIGNATURES`; the messages that merely look like an OOM are in :data:`LOOK_ALIKES`.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Callable, Sequence

from msgspec import Struct

from gpusched.logs import plain
from gpusched.model import (
    OOM_EXIT_CODE,
    Classification,
    ExitRecord,
    Limits,
    Outcome,
    RetryPolicy,
    Step,
    StepKind,
    Tier,
)

__all__ = [
    "CONTENTION_SHARE",
    "LOOK_ALIKES",
    "MACHINE_WAIT_S",
    "SIGKILL_NOT_KERNEL",
    "SIGKILL_REASON",
    "SIGNATURES",
    "LookAlike",
    "Signature",
    "classify",
    "next_step",
    "oom_processes",
]

#: An OOM counts as *contention* when processes other than the job's own hold at least this
#: share of the card's total memory: the next attempt should go to another GPU.
CONTENTION_SHARE = 0.40

_REASON_MAX = 200
_LINE_MAX = 300
SIGKILL_REASON = "killed by SIGKILL (likely the kernel OOM killer)"
#: The reason instead, where the kernel's count of OOM kills shows it killed nothing while the job
#: ran (see :class:`gpusched.memwatch.OomKills`): still a host OOM, the likeliest sender being a
#: userspace OOM killer acting on memory pressure (Ubuntu's systemd-oomd, earlyoom).
SIGKILL_NOT_KERNEL = (
    "killed by SIGKILL, not by the kernel's OOM killer (it killed nothing while the job ran):"
    " a userspace OOM killer (systemd-oomd, earlyoom) or someone's kill -9"
)
#: After a write failed for want of room (``DISK_FULL``) or a connection failed (``NETWORK``), the
#: job waits this long before it runs again, doubling with each such failure of the job.
MACHINE_WAIT_S = 300.0
# Doubling the error backoff stops here, so a huge retry count cannot overflow a float.
_MAX_BACKOFF_DOUBLINGS = 30


# --------------------------------------------------------------------------- the table


class Signature(Struct, frozen=True, kw_only=True):
    """A message that proves how a job died.

    ``text`` is the message as its source prints it; matching is case-sensitive. ``pattern``
    is what is actually searched for in one log line (``text`` itself, unless a variant
    needs a regular expression). ``label`` is the sentence that becomes the reason."""

    text: str
    outcome: Outcome  # OOM, HOST_OOM or GPU_FAULT
    label: str
    source: str
    pattern: re.Pattern[str]


class LookAlike(Struct, frozen=True, kw_only=True):
    """A message that contains or resembles an OOM signature but is not an OOM death.
    A log line that matches one is never an OOM line."""

    text: str
    why: str
    pattern: re.Pattern[str]


def _literal(text: str) -> re.Pattern[str]:
    """``text`` exactly, not glued to a longer word on either side."""
    head = r"(?<!\w)" if text[0].isalnum() or text[0] == "_" else ""
    tail = r"(?!\w)" if text[-1].isalnum() or text[-1] == "_" else ""
    return re.compile(head + re.escape(text) + tail)


def _sig(text: str, outcome: Outcome, label: str, source: str, pattern: str | None = None) -> Signature:
    compiled = re.compile(pattern) if pattern is not None else _literal(text)
    return Signature(text=text, outcome=outcome, label=label, source=source, pattern=compiled)


_OOM, _HOST, _GPU, _DISK = Outcome.OOM, Outcome.HOST_OOM, Outcome.GPU_FAULT, Outcome.DISK_FULL

#: Every message that proves an out-of-memory death, most specific first: the first entry
#: that matches a line names it. GPU entries come from PyTorch's allocators and CUDA/ROCm
#: checks, cuBLAS/cuSOLVER/cuSPARSE/cuDNN status codes and NCCL/RCCL warnings; host entries
#: from PyTorch's CPU allocator, the DataLoader, Slurm's cgroup OOM notice and Python.
# fmt: off
SIGNATURES: tuple[Signature, ...] = (
    # text (as printed), outcome, label (-> reason), source, regex when the text alone is not enough
    _sig("would exceed allowed memory. (out of memory)", _OOM,
         "CUDA out of memory (cudaMallocAsync allocator)", "PyTorch CUDAMallocAsyncAllocator"),
    # The trailing period is part of the message; the end-of-line variant is how people
    # (and seed 003) quote it, and a sentence that merely mentions it rarely ends there.
    _sig("CUDA out of memory.", _OOM, "CUDA out of memory", "PyTorch CUDACachingAllocator",
         r"(?<!\w)CUDA out of memory(?:\.|$)"),
    _sig("HIP out of memory.", _OOM, "HIP out of memory", "PyTorch on ROCm",
         r"(?<!\w)HIP out of memory(?:\.|$)"),
    _sig("XPU out of memory.", _OOM, "XPU out of memory", "PyTorch XPU allocator",
         r"(?<!\w)XPU out of memory(?:\.|$)"),
    _sig("MPS backend out of memory", _OOM, "MPS backend out of memory", "PyTorch MPS allocator"),
    _sig("CUDA error: out of memory", _OOM, "CUDA error: out of memory", "C10_CUDA_CHECK"),
    _sig("HIP error: out of memory", _OOM, "HIP error: out of memory", "C10_HIP_CHECK"),
    _sig("hipErrorOutOfMemory", _OOM, "HIP out of memory (hipErrorOutOfMemory)", "ROCm runtime"),
    _sig("CUDA driver error: out of memory", _OOM, "CUDA driver error: out of memory",
         "C10_CUDA_DRIVER_CHECK"),
    _sig("CUBLAS_STATUS_ALLOC_FAILED", _OOM, "cuBLAS could not allocate GPU memory", "cuBLAS"),
    _sig("CUSOLVER_STATUS_ALLOC_FAILED", _OOM, "cuSOLVER could not allocate GPU memory", "cuSOLVER"),
    _sig("CUSPARSE_STATUS_ALLOC_FAILED", _OOM, "cuSPARSE could not allocate GPU memory", "cuSPARSE"),
    _sig("CUDNN_STATUS_ALLOC_FAILED", _OOM, "cuDNN could not allocate GPU memory", "cuDNN"),
    # NCCL >= 2.19 prints the error number too ("Cuda failure 2 'out of memory'"); RCCL says HIP.
    _sig("Cuda failure 'out of memory'", _OOM, "NCCL: CUDA out of memory", "NCCL / RCCL",
         r"(?<!\w)(?:Cuda|HIP) failure (?:\d+ )?'out of memory'"),
    _sig("Failed to CUDA calloc", _OOM, "NCCL could not allocate GPU memory", "NCCL"),
    _sig("cuda runtime error (2) : out of memory", _OOM, "CUDA out of memory", "PyTorch < 1.0 (THC)"),
    # Exception names last: a line that also carries a message is named by the message.
    _sig("torch.OutOfMemoryError", _OOM, "CUDA out of memory", "PyTorch >= 2.5"),
    _sig("torch.cuda.OutOfMemoryError", _OOM, "CUDA out of memory", "PyTorch 1.13 - 2.4"),
    _sig("DefaultCPUAllocator: can't allocate memory", _HOST,
         "host RAM exhausted (DefaultCPUAllocator could not allocate)", "PyTorch CPU allocator"),
    _sig("DefaultCPUAllocator: not enough memory", _HOST,
         "host RAM exhausted (DefaultCPUAllocator could not allocate)", "PyTorch CPU allocator (Windows)"),
    _sig("DataLoader worker (pid N) is killed by signal: Killed.", _HOST,
         "host RAM exhausted (a DataLoader worker was SIGKILLed)", "torch.utils.data",
         r"DataLoader worker \(pid(?:\(s\))? [\d, ]+\) is killed by signal: Killed"),
    _sig("Detected N oom-kill event(s)", _HOST,
         "host RAM exhausted (Slurm saw an oom-kill event)", "slurmstepd", r"Detected \d+ oom[-_]kill event"),
    # Python's own MemoryError (and numpy's _ArrayMemoryError), only as an exception line.
    _sig("MemoryError", _HOST, "host RAM exhausted (MemoryError)", "Python",
         r"^(?:[A-Za-z_]\w*\.)*_?(?:Array)?MemoryError(?::|$)"),
    # The card itself failed (the kernel logs an Xid): the job would have run anywhere else.
    # Only errors that a program cannot cause: not illegal memory accesses or launch
    # failures, which are usually the job's own bug.
    _sig("uncorrectable ECC error encountered", _GPU, "the GPU hit an uncorrectable ECC error",
         "CUDA runtime (cudaErrorECCUncorrectable)"),
    _sig("uncorrectable NVLink error detected during the execution", _GPU,
         "the GPU hit an uncorrectable NVLink error", "CUDA runtime (cudaErrorNvlinkUncorrectable)"),
    _sig("CUDA error: unknown error", _GPU, "the GPU failed (CUDA error: unknown error)",
         "CUDA runtime (cudaErrorUnknown), as a card that fell off the bus gives it"),
    _sig("no CUDA-capable device is detected", _GPU, "the GPU given to the job is gone",
         "CUDA runtime (cudaErrorNoDevice): the card gpusched gave by UUID is not there"),
    _sig("GPU is lost", _GPU, "the GPU is lost (the driver says: reboot to recover it)", "NVML / nvidia-smi"),
    # A night's checkpoints fill the disk: the save fails, and the job would run on after some room is made.
    _sig("No space left on device", _DISK, "the disk filled up (No space left on device)",
         "the kernel (ENOSPC), in Python's OSError and safetensors' IoError"),
    _sig("Disk quota exceeded", _DISK, "the disk quota is used up (Disk quota exceeded)",
         "the kernel (EDQUOT)"),
    _sig("PytorchStreamWriter failed writing file", _DISK,
         "a checkpoint could not be written (torch.save: file write failed; the disk is likely full)",
         "torch.save's zip writer, which does not pass on the kernel's ENOSPC"),
)
# fmt: on

#: Messages that look like GPU OOM but are not one.
LOOK_ALIKES: tuple[LookAlike, ...] = (
    LookAlike(
        text="Tried to allocate more than 1EB memory",
        why="raised as an OutOfMemoryError, but it is a bug (a negative or absurd size): "
        "a smaller tier would not help",
        pattern=_literal("Tried to allocate more than 1EB memory"),
    ),
    LookAlike(
        text="memory allocation failed with OOM",
        why="the caching allocator's warning before it frees its cache and retries; the "
        "allocation then succeeded (`... while trying to allocate N bytes (free: F, total: T)`)",
        pattern=_literal("memory allocation failed with OOM"),
    ),
)
_EXA_BUG = LOOK_ALIKES[0]


# --------------------------------------------------------------------------- classify


def classify(
    exit: ExitRecord | None, log_tail: str, *, cancel_requested: bool, stopped_for: str | None = None
) -> Classification:
    """What happened to one attempt. Never raises, whatever the text or numbers.

    Precedence, first match wins:

    1. ``cancel_requested`` -> ``CANCELLED`` (whatever the exit);
    2. ``stopped_for`` (gpusched stopped it at a suite limit; the text says which) ->
       ``TIMEOUT`` with that reason, unless it exited 0 before the signal took (``OK``);
    3. no exit record -> ``LOST``;
    4. exit code 0 -> ``OK`` (the log is not read);
    5. the trainer reported OOM (``oom_reported`` or exit code ``OOM_EXIT_CODE``) -> ``OOM``,
       unless the only OOM-looking line in the log is the "more than 1EB" bug (-> ``ERROR``);
    6. the last line of ``log_tail`` that matches a :data:`SIGNATURES` entry -> ``OOM``,
       ``HOST_OOM`` or ``GPU_FAULT`` (lines matching :data:`LOOK_ALIKES`, source lines of a traceback and
       signatures quoted as data, e.g. in a printed config, do not count);
    7. SIGKILL (exit code 137, -9 or signal 9) -> ``HOST_OOM``: gpusched's own kills are
       cancels, so this is most likely the kernel OOM killer (the scheduler says otherwise,
       :data:`SIGKILL_NOT_KERNEL`, where the kernel's count shows it killed nothing);
    8. otherwise ``ERROR``, the reason being the last exception line, else the last
       non-empty line, else the exit code or signal (at most ~200 characters); ``NETWORK``
       when that line is a connection that failed in passing (:data:`_NETWORK`).

    ``line`` is the log line that decided (stripped, at most 300 characters), or ``None``.
    ``contention`` is true only for ``OOM`` whose message shows that processes other than
    this one held at least :data:`CONTENTION_SHARE` of the card; the reason then says how much.
    """
    if cancel_requested:
        return Classification(outcome=Outcome.CANCELLED, reason="cancelled on request")
    if stopped_for is not None:
        if exit is not None and exit.exit_code == 0 and not exit.oom_reported:
            return Classification(outcome=Outcome.OK, reason="exited 0")
        return Classification(outcome=Outcome.TIMEOUT, reason=stopped_for)
    if exit is None:
        return Classification(outcome=Outcome.LOST, reason="no exit record: the attempt vanished")
    if exit.exit_code == 0:
        return Classification(outcome=Outcome.OK, reason="exited 0")
    lines = _lines(log_tail)
    if exit.oom_reported or exit.exit_code == OOM_EXIT_CODE:
        return _reported_oom(lines)
    hit = _last_hit(lines)
    if hit is not None:
        return _from_hit(lines, *hit)
    if _signal_of(exit) == _signal.SIGKILL:
        return Classification(outcome=Outcome.HOST_OOM, reason=SIGKILL_REASON)
    return _error(lines, exit)


class _Line(Struct, frozen=True):
    raw: str  # as logged, stripped (ANSI colours removed)
    text: str  # without a launcher's "[rank0]: " prefix, stripped: what is matched
    indented: bool  # began with white space (after that prefix): a traceback's source line does


_RANK_PREFIX = re.compile(r"^\[[A-Za-z]*\d+\]: ?")  # torchrun's "[rank0]: ", "[default0]:"
_TRACEBACK_FILE = re.compile(r'^File ".*", line \d+')


def _lines(log_tail: str) -> list[_Line]:
    out = []
    for piece in plain(log_tail).splitlines():
        raw = piece.strip()
        if raw.startswith("[gpusched]"):  # the wrapper's own notes
            continue
        body = _RANK_PREFIX.sub("", piece, count=1)
        out.append(_Line(raw=raw, text=body.strip(), indented=body[:1] in (" ", "\t")))
    return out


def _reported_oom(lines: list[_Line]) -> Classification:
    hit = _last_hit(lines, only=Outcome.OOM)
    if hit is not None:
        return _from_hit(lines, *hit)
    for line in reversed(lines):
        if _EXA_BUG.pattern.search(line.text):
            # torch raises this as an OutOfMemoryError, so the in-job helper reports OOM;
            # it is a bug, and a more conservative tier would die the same way.
            return Classification(
                outcome=Outcome.ERROR, reason=_clip(line.text, _REASON_MAX), line=_clip(line.raw, _LINE_MAX)
            )
    return Classification(outcome=Outcome.OOM, reason="out of GPU memory (reported by the trainer)")


def _last_hit(lines: list[_Line], only: Outcome | None = None) -> tuple[int, Signature] | None:
    """Index and signature of the last line that proves an OOM (of kind ``only``, if given)."""
    for i in range(len(lines) - 1, -1, -1):
        text = lines[i].text
        if not text or any(la.pattern.search(text) for la in LOOK_ALIKES):
            continue
        if lines[i].indented and i > 0 and _TRACEBACK_FILE.match(lines[i - 1].text):
            continue  # a source line shown in a traceback (`except torch.OutOfMemoryError:`)
        for sig in SIGNATURES:
            if only is not None and sig.outcome is not only:
                continue
            if any(not _quoted_as_data(text, m.start(), m.end()) for m in sig.pattern.finditer(text)):
                return i, sig
    return None


# A string literal opens at a quote that does not follow a word character (so "it's" is prose).
_STRING_LITERAL = re.compile(r"""(?<![\w\\])(['"])(.*?)(?<!\\)\1""")
_EXCEPTION_REPR = re.compile(r"(?:Error|Exception)\(\s*$")


def _quoted_as_data(text: str, start: int, end: int) -> bool:
    """True when the match lies inside a quoted string that is data, e.g. a printed config
    (``{'retry_on': ['CUDA out of memory.']}``), rather than an exception's repr
    (``OutOfMemoryError('CUDA out of memory. ...')``) or an exception line logged as a
    string (``{"msg": "RuntimeError: CUDA out of memory. ..."}``), or a message quoted in the
    line of an exception (safetensors' ``SafetensorError: ... IoError(Os { code: 28, ...,
    message: "No space left on device" })``)."""
    if _EXCEPTION_LINE.match(text):
        return False
    for lit in _STRING_LITERAL.finditer(text):
        if lit.start(2) <= start and end <= lit.end(2):
            is_error = _EXCEPTION_REPR.search(text[: lit.start()]) or _EXCEPTION_LINE.match(lit.group(2))
            return not is_error
        if lit.start() > start:
            break
    return False


def _from_hit(lines: list[_Line], index: int, sig: Signature) -> Classification:
    line = _clip(lines[index].raw, _LINE_MAX)
    if sig.outcome is not Outcome.OOM:  # host OOM, GPU fault: the label says it all
        return Classification(outcome=sig.outcome, reason=sig.label, line=line)
    message = _message_block(lines, index)
    memory = _card_memory(message)
    if memory is not None:
        others, total = memory
        if total > 0 and others >= CONTENTION_SHARE * total:
            reason = f"OOM: other processes hold {others:.1f} of {_gib(total)} GiB on the card"
            return Classification(outcome=Outcome.OOM, reason=reason, line=line, contention=True)
    asked = _TRIED.search(message)
    reason = f"{sig.label} (tried to allocate {asked.group(1)})" if asked else sig.label
    return Classification(outcome=Outcome.OOM, reason=reason, line=line)


def _message_block(lines: list[_Line], index: int, max_lines: int = 8) -> str:
    """The OOM line and the lines that continue its message (torch's message is one line,
    but cudaMallocAsync's spans several and people re-wrap it), joined by spaces."""
    parts = [lines[index].text]
    for line in lines[index + 1 : index + max_lines]:
        if not line.text or line.text.startswith(("Traceback", "File ")):
            break
        if any(sig.pattern.search(line.text) for sig in SIGNATURES):
            break  # the next message (another rank's OOM)
        parts.append(line.text)
    return " ".join(parts)


# --------------------------------------------------------------------------- card memory

_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)"
_TO_GIB = {"bytes": 1 / 1024**3, "KiB": 1 / 1024**2, "MiB": 1 / 1024, "GiB": 1.0, "TiB": 1024.0}
_TRIED = re.compile(r"Tried to allocate (\d+(?:\.\d+)? [KMGT]?i?B)")
_CAPACITY = re.compile(rf"total capacity of {_SIZE} of which {_SIZE} is free")
_PROCESS = re.compile(rf"Process (\d+) has {_SIZE} memory in use")  # pid, then its size
_CUDA_OOM = "CUDA out of memory"
_THIS_PROCESS = re.compile(rf"this process has {_SIZE} memory in use")
_RESERVED = re.compile(
    rf"Of the allocated memory {_SIZE} is allocated by PyTorch,.*? and {_SIZE} is reserved by PyTorch"
)
_OLD_FORMAT = re.compile(  # PyTorch < 2.1: "(GPU 0; 23.65 GiB total capacity; ...)"
    rf"{_SIZE} total capacity; {_SIZE} already allocated; {_SIZE} free; "
    rf"(?:\d+(?:\.\d+)? \w+ allowed; )?{_SIZE} reserved in total"
)
_ASYNC_FORMAT = re.compile(  # cudaMallocAsync: one "Name : size" per line
    rf"Currently allocated\s*: {_SIZE}.*?Device limit\s*: {_SIZE}\s*Free \(according to CUDA\)\s*: {_SIZE}"
)


def _gib_of(groups: Sequence[str | None]) -> list[float]:
    """GiB values of consecutive (number, unit) regex groups."""
    return [float(groups[i] or 0) * _TO_GIB[groups[i + 1] or "GiB"] for i in range(0, len(groups), 2)]


def _card_memory(message: str) -> tuple[float, float] | None:
    """(GiB held by other processes, total GiB) as far as the OOM message tells, or None.

    Torch lists NVML's processes on the card as "Process N has X memory in use" and its own
    as "this process has X", but where its pid is not NVML's (a container) its own entry is
    in the list. The card's capacity tells the cases apart: when the list plus this process
    would overflow the card, the list entry closest to this process's size is dropped. With
    no size for this process (neither that sentence nor PyTorch's reserved figure), the
    largest entry is taken to be its own, so "others" is a lower bound."""
    cap = _CAPACITY.search(message)
    if cap is None:
        return _card_memory_other_formats(message)
    total, free = _gib_of(cap.groups())
    procs = [_gib_of(m.groups()[1:])[0] for m in _PROCESS.finditer(message)]
    this = _THIS_PROCESS.search(message)
    reserved = _RESERVED.search(message)
    own = _gib_of(this.groups())[0] if this else (sum(_gib_of(reserved.groups())) if reserved else None)
    if not procs:
        return (max(0.0, total - free - own), total) if own is not None else None
    if own is None:
        return sum(procs) - max(procs), total
    if this is None or sum(procs) + own > total * 1.02:
        procs.remove(min(procs, key=lambda size: abs(size - own)))
    return sum(procs), total


def oom_processes(log_tail: str) -> dict[int, int]:
    """pid -> MiB of the processes that the last CUDA OOM message in ``log_tail`` lists as on
    the card when it ran out ("Process N has X GiB memory in use", PyTorch 2.x); {} when it
    lists none. The pids are the driver's, as NVML gives them."""
    at = log_tail.rfind(_CUDA_OOM)
    if at < 0:
        return {}
    return {int(m.group(1)): int(_gib_of(m.groups()[1:])[0] * 1024) for m in _PROCESS.finditer(log_tail, at)}


def _card_memory_other_formats(message: str) -> tuple[float, float] | None:
    old = _OLD_FORMAT.search(message)
    if old is not None:  # memory neither free nor PyTorch's: others (and our CUDA context)
        total, _allocated, free, reserved = _gib_of(old.groups())
        return max(0.0, total - free - reserved), total
    asy = _ASYNC_FORMAT.search(message)
    if asy is not None:
        allocated, limit, free = _gib_of(asy.groups())
        return max(0.0, limit - free - allocated), limit
    return None


def _gib(value: float) -> str:
    return f"{round(value, 2):g}"


# --------------------------------------------------------------------------- errors

# Exception lines as Python prints them: "ValueError: ...", "torch.distributed.DistBackendError: ...".
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception|Interrupt|Exit)(?::\s|:?$)")
# Launchers' exceptions that only say "the child failed": the child's own line is more useful.
_WRAPPER_EXCEPTIONS = ("ChildFailedError", "CalledProcessError")


def _error(lines: list[_Line], exit: ExitRecord) -> Classification:
    line = _summary_line(lines)
    if line is not None:
        passing = _NETWORK.search(line.text) and not _DISTRIBUTED.search(line.text)
        kind = Outcome.NETWORK if passing else Outcome.ERROR
        reason, shown = _clip(line.text, _REASON_MAX), _clip(line.raw, _LINE_MAX)
        return Classification(outcome=kind, reason=reason, line=shown)
    return Classification(outcome=Outcome.ERROR, reason=_exit_words(exit))


#: A job's *last* exception that says a connection failed in passing: a model hub's 5xx or
#: 429, a name that did not resolve, a reset, a timeout, transformers' "We couldn't connect".
#: Only the summary line (the exception the job died of) is read, never a warning above it,
#: and not what stays wrong on a retry: 401/404, a connection refused (a local service not
#: started), a broken pipe (a reader that went away).
_NETWORK = re.compile(
    r"^(?:[\w.]+\.)?(?:ConnectionError|ConnectionResetError|ConnectionAbortedError|ReadTimeout"
    r"|ConnectTimeout|ReadTimeoutError|ConnectTimeoutError|MaxRetryError|ClientConnectorError"
    r"|ServerDisconnectedError|RemoteDisconnected|IncompleteRead|ChunkedEncodingError)\b"
    r"|Temporary failure in name resolution|Connection reset by peer|Network is unreachable"
    r"|Connection (?:broken|aborted)"
    r"|Max retries exceeded with url|(?:Read|Connect(?:ion)?) timed out"
    r"|We couldn't connect to '|\b(?:50[234]|429) (?:Server|Client) Error"
)
#: ... unless it is between the job's own processes: a rank's "Connection reset by peer" when
#: another rank died (of its own error, which a retry would meet again).
_DISTRIBUTED = re.compile(r"NCCL|Gloo|c10d|ProcessGroup|TCPStore|Dist(?:Backend|Network|Store)Error")


def _summary_line(lines: list[_Line]) -> _Line | None:
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line.text)]
    direct = [line for line in exceptions if not line.text.split(":", 1)[0].endswith(_WRAPPER_EXCEPTIONS)]
    if direct or exceptions:
        return (direct or exceptions)[-1]
    return next((line for line in reversed(lines) if line.text), None)


def _signal_of(exit: ExitRecord) -> int | None:
    """The signal that ended the job: recorded, or implied by a shell (128+N) or Python (-N) code."""
    if exit.signal is not None:
        return exit.signal
    code = exit.exit_code
    if code is not None and code < 0:
        return -code
    if code is not None and 128 < code < 160:
        return code - 128
    return None


def _exit_words(exit: ExitRecord) -> str:
    sig = _signal_of(exit)
    if sig is not None:
        try:
            return f"killed by signal {_signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    if exit.exit_code is None:
        return "no exit code recorded"
    return f"exit code {exit.exit_code}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------- limits


def past_limit(
    limits: Limits,
    *,
    started_at: float,
    output_at: float | None,
    now: float,
    away_since: Callable[[float], float] = lambda _t: 0.0,
    output_bytes: int = 0,
) -> str | None:
    """Why an attempt started at ``started_at`` (its wrapper's start), whose log last grew at
    ``output_at`` (None: never) and holds ``output_bytes``, is past its suite's ``limits`` at
    ``now``; None while it is not. ``away_since(t)``: the seconds since ``t`` that the machine
    slept (none of them count). The time limit is checked first, the log's size last."""
    if limits.time_s is not None and now - started_at - away_since(started_at) >= limits.time_s:
        return f"ran past its time limit of {duration_text(limits.time_s)} (limits.time)"
    if limits.silence_s is not None:
        quiet_from = max(started_at, output_at or started_at)
        quiet_s = now - quiet_from - away_since(quiet_from)
        if quiet_s >= limits.silence_s:
            return f"printed nothing for {duration_text(limits.silence_s)}, taken as hung (limits.silence)"
    if limits.output_mib is not None and output_bytes > limits.output_mib << 20:
        wrote, most = size_text(output_bytes / (1 << 20)), size_text(limits.output_mib)
        return f"wrote {wrote} to its output.log, more than its limit of {most} (limits.output)"
    return None


def size_text(mib: float) -> str:
    """``1.25`` -> ``1.2 MiB``, ``2048`` -> ``2.0 GiB``, ``3 << 20`` -> ``3.0 TiB``."""
    shift, unit = next(((s, u) for s, u in ((20, "TiB"), (10, "GiB")) if mib >= 1 << s), (0, "MiB"))
    return f"{mib / (1 << shift):.1f} {unit}"


def duration_text(seconds: float) -> str:
    """``45s``, ``30m``, ``1h30m``, ``2d3h``: the largest two units, rounded down."""
    s = int(seconds)
    units = ((86400, 3600, "d", "h"), (3600, 60, "h", "m"), (60, 1, "m", "s"))
    for big, small, unit_big, unit_small in units:
        if s >= big:
            rest = (s % big) // small
            return f"{s // big}{unit_big}" + (f"{rest}{unit_small}" if rest else "")
    return f"{s}s"


# --------------------------------------------------------------------------- next step


def next_step(
    c: Classification,
    *,
    tier: int,
    tiers: Sequence[Tier],
    gpu: int | None,
    errors_so_far: int,
    lost_so_far: int,
    retry: RetryPolicy,
    now: float,
    max_lost: int = 3,
    faults_so_far: int = 0,
    arrival: str | None = None,
) -> Step:
    """What to do with the job whose attempt at ``tiers[tier]`` (on ``gpu``) ended as ``c``.

    ``errors_so_far`` and ``lost_so_far`` count the job's *earlier* attempts that ended
    ``ERROR`` / ``LOST``, not this one. Callers may rely on:

    * a ``REQUEUE`` step's tier indexes ``tiers``; it is ``tier + 1`` or later for ``OOM``
      (``tier`` itself after an ``arrival``) and ``HOST_OOM``, ``tier`` itself for ``ERROR``
      and ``LOST``; every other step keeps ``tier``; OOM never moves a job to a less
      conservative tier;
    * ``OK`` -> ``DONE``; ``CANCELLED`` -> ``CANCEL``;
    * ``OOM`` -> the next tier, or ``FAIL`` at the last; with ``contention``, ``avoid_gpu=gpu``;
      with ``arrival`` (someone else's processes came onto the card while it ran and took
      more than placement's headroom: what they were, for the reason), ``tier`` itself with
      ``avoid_gpu=gpu``, even at the last tier: the job did not outgrow its tier, the card
      was taken from under it (the caller passes it once per tier, so a job that also
      outgrows its tier still steps down);
    * ``HOST_OOM`` -> the first later tier that lowers ``num_data_workers`` (a tier without
      the key keeps the value before it; when no tier up to this one sets it, the first later
      tier that does counts as lowering it), else the next tier, or ``FAIL`` at the last;
    * ``ERROR`` and ``TIMEOUT`` -> while ``errors_so_far < retry.errors``, the same tier with
      ``not_before = now + retry.backoff_s * 2**errors_so_far``; then ``FAIL`` with ``c.reason``;
    * ``LOST`` -> the same tier, until ``lost_so_far >= max_lost``: then ``FAIL``;
    * ``GPU_FAULT`` -> the same tier with ``avoid_gpu=gpu``, until ``faults_so_far >= max_lost``
      (earlier attempts that ended ``GPU_FAULT``): then ``FAIL``, since a job that breaks
      every card it is given is more likely the cause than the cards.
    * ``DISK_FULL`` and ``NETWORK`` -> the same tier (resuming where the suite says how) with
      ``not_before = now + MACHINE_WAIT_S * 2**faults_so_far``, not counted against the job's
      errors, until ``faults_so_far >= max_lost`` (earlier attempts that ended the same way):
      then ``FAIL``. The wait gives the cause time to pass: whoever frees the disk (a cleanup
      job, a person woken by the suite's ``notify:``), the hub back up; and the launch-time
      disk check holds the job while the disk of its logs or working directory is still low.

    Never raises. When ``tier`` does not index ``tiers`` (the suite is gone, or its plan
    lost tiers), an outcome that would requeue gives ``FAIL`` with a reason that says so.
    """
    match c.outcome:
        case Outcome.OK:
            return Step(kind=StepKind.DONE, tier=tier, reason="succeeded")
        case Outcome.CANCELLED:
            return Step(kind=StepKind.CANCEL, tier=tier, reason=c.reason)
    if not 0 <= tier < len(tiers):
        reason = f"{c.reason}; cannot requeue: tier {tier} is not one of the suite's {len(tiers)} tiers"
        return Step(kind=StepKind.FAIL, tier=tier, reason=_clip(reason, _REASON_MAX))
    match c.outcome:
        case Outcome.OOM if arrival is not None and gpu is not None:
            here = tiers[tier].name
            reason = f"OOM at tier {here} after {arrival} came onto GPU {gpu} → requeued at {here} elsewhere"
            return Step(kind=StepKind.REQUEUE, tier=tier, reason=_clip(reason, _REASON_MAX), avoid_gpu=gpu)
        case Outcome.OOM:
            return _after_oom(c, tier, tiers, gpu)
        case Outcome.HOST_OOM:
            return _after_host_oom(tier, tiers)
        case Outcome.LOST:
            return _after_lost(tier, tiers, lost_so_far, max_lost)
        case Outcome.GPU_FAULT:
            return _after_gpu_fault(c, tier, tiers, gpu, faults_so_far, max_lost)
        case Outcome.DISK_FULL | Outcome.NETWORK:
            return _after_machine(c, tier, tiers, faults_so_far, max_lost, now)
        case _:
            return _after_error(c, tier, errors_so_far, retry, now)


def _after_oom(c: Classification, tier: int, tiers: Sequence[Tier], gpu: int | None) -> Step:
    here = tiers[tier].name
    if tier + 1 >= len(tiers):
        return Step(kind=StepKind.FAIL, tier=tier, reason=f"OOM at the last tier {here}")
    reason = f"OOM at tier {here} → requeued at tier {tiers[tier + 1].name}"
    avoid = gpu if c.contention else None
    if avoid is not None:
        reason += f", away from GPU {avoid} ({c.reason})"
    return Step(kind=StepKind.REQUEUE, tier=tier + 1, reason=reason, avoid_gpu=avoid)


def _workers(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return None


def _after_host_oom(tier: int, tiers: Sequence[Tier]) -> Step:
    here = tiers[tier].name
    if tier + 1 >= len(tiers):
        return Step(kind=StepKind.FAIL, tier=tier, reason=f"host out of memory at the last tier {here}")
    current = None
    for t in tiers[: tier + 1]:  # tiers are cumulative, but a tier may leave the key out
        current = _workers(t.config.get("num_data_workers")) if "num_data_workers" in t.config else current
    target, note = tier + 1, ""
    for j in range(tier + 1, len(tiers)):
        workers = _workers(tiers[j].config.get("num_data_workers"))
        if workers is not None and (current is None or workers < current):
            before = "?" if current is None else str(current)
            target, note = j, f" (num_data_workers {before} → {workers})"
            break
    reason = f"host out of memory at tier {here} → requeued at tier {tiers[target].name}{note}"
    return Step(kind=StepKind.REQUEUE, tier=target, reason=reason)


def _after_error(c: Classification, tier: int, errors_so_far: int, retry: RetryPolicy, now: float) -> Step:
    if errors_so_far >= retry.errors:
        return Step(kind=StepKind.FAIL, tier=tier, reason=c.reason)
    delay_s = retry.backoff_s * 2 ** min(max(errors_so_far, 0), _MAX_BACKOFF_DOUBLINGS)
    reason = f"{c.outcome.value}, retry {errors_so_far + 1} of {retry.errors} in {delay_s:.0f} s: {c.reason}"
    return Step(kind=StepKind.REQUEUE, tier=tier, reason=reason, not_before=now + delay_s)


def _after_lost(tier: int, tiers: Sequence[Tier], lost_so_far: int, max_lost: int) -> Step:
    if lost_so_far >= max_lost:
        return Step(
            kind=StepKind.FAIL,
            tier=tier,
            reason=f"lost {lost_so_far + 1} times (no exit record); gave up after {max_lost} requeues",
        )
    reason = f"lost (no exit record) → requeued at tier {tiers[tier].name} ({lost_so_far + 1} of {max_lost})"
    return Step(kind=StepKind.REQUEUE, tier=tier, reason=reason)


def _after_machine(
    c: Classification, tier: int, tiers: Sequence[Tier], so_far: int, most: int, now: float
) -> Step:
    """A disk full, a network that failed: the same tier after a wait, ``most`` times."""
    said = c.line or c.reason  # the line itself: the path that filled up, the host that failed
    if so_far >= most:
        what = "the disk was full" if c.outcome is Outcome.DISK_FULL else "the network failed"
        reason = f"{what} under {so_far + 1} of its attempts, gave up: {said}"
        return Step(kind=StepKind.FAIL, tier=tier, reason=_clip(reason, _REASON_MAX))
    delay_s = MACHINE_WAIT_S * 2 ** min(max(so_far, 0), _MAX_BACKOFF_DOUBLINGS)
    why = "the disk filled up" if c.outcome is Outcome.DISK_FULL else "the network failed"
    reason = (
        f"{why}, requeued at tier {tiers[tier].name} in {delay_s:.0f} s"
        f" ({so_far + 1} of {most}; not counted against the job): {said}"
    )
    return Step(kind=StepKind.REQUEUE, tier=tier, reason=_clip(reason, _REASON_MAX), not_before=now + delay_s)


def _after_gpu_fault(
    c: Classification, tier: int, tiers: Sequence[Tier], gpu: int | None, faults_so_far: int, max_lost: int
) -> Step:
    if faults_so_far >= max_lost:
        return Step(
            kind=StepKind.FAIL,
            tier=tier,
            reason=f"{c.reason}; the GPU failed under {faults_so_far + 1} of its attempts, gave up",
        )
    where = f", away from GPU {gpu}" if gpu is not None else ""
    reason = f"{c.reason} → requeued at tier {tiers[tier].name}{where} (not counted against the job)"
    return Step(kind=StepKind.REQUEUE, tier=tier, reason=_clip(reason, _REASON_MAX), avoid_gpu=gpu)
