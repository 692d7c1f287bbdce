"""outcome.classify / outcome.next_step: real-looking log tails in, decisions out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.model import (
    OOM_EXIT_CODE,
    Classification,
    ExitRecord,
    Outcome,
    RetryPolicy,
    Step,
    StepKind,
    Tier,
)
from gpusched.outcome import (
    LOOK_ALIKES,
    MACHINE_WAIT_S,
    SIGNATURES,
    LookAlike,
    Signature,
    classify,
    next_step,
    oom_processes,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


def exited(code: int | None = 1, **kw: object) -> ExitRecord:
    return ExitRecord(exit_code=code, **kw)  # type: ignore[arg-type]


def run(text: str, code: int | None = 1, **kw: object) -> Classification:
    return classify(exited(code, **kw), text, cancel_requested=False)


# --------------------------------------------------------------------------- real log tails

# fixture, exit code, outcome, contention, the start of the expected line (None: no line)
LOG_TABLE = [
    ("torch_oom_contention.txt", 1, Outcome.OOM, True, "torch.OutOfMemoryError: CUDA out of memory."),
    ("torchrun_oom.txt", 1, Outcome.OOM, False, "[rank1]: torch.OutOfMemoryError: CUDA out of memory."),
    ("nccl_oom.txt", 1, Outcome.OOM, False, "[rank1]: Failed to CUDA calloc 6291456 bytes"),
    (
        "cublas_alloc_failed.txt",
        1,
        Outcome.OOM,
        False,
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED",
    ),
    ("torch1_oom_contention.txt", 1, Outcome.OOM, True, "RuntimeError: CUDA out of memory. Tried"),
    ("malloc_async_oom.txt", 1, Outcome.OOM, True, "torch.OutOfMemoryError: Allocation on device 0"),
    ("exabyte_bug.txt", 1, Outcome.ERROR, False, "torch.OutOfMemoryError: CUDA out of memory. Tried to "),
    ("allocator_retry_then_valueerror.txt", 1, Outcome.ERROR, False, "ValueError: Expected input batch"),
    ("host_oom_cpu_allocator.txt", 1, Outcome.HOST_OOM, False, "RuntimeError: [enforce fail at alloc_cpu"),
    ("dataloader_killed.txt", 1, Outcome.HOST_OOM, False, "RuntimeError: DataLoader worker (pid 48213) is"),
    ("printed_config_then_keyerror.txt", 1, Outcome.ERROR, False, "KeyError: 'glue-tvt_qnli2'"),
    ("torchrun_valueerror.txt", 1, Outcome.ERROR, False, "[rank0]: ValueError: unknown task"),
    ("plain_valueerror.txt", 1, Outcome.ERROR, False, "ValueError: could not convert string"),
    ("plain_valueerror.txt", 137, Outcome.HOST_OOM, False, None),
]


@pytest.mark.parametrize(("name", "code", "outcome", "contention", "line"), LOG_TABLE)
def test_real_log_tails(name: str, code: int, outcome: Outcome, contention: bool, line: str | None) -> None:
    c = run(log(name), code)
    assert (c.outcome, c.contention) == (outcome, contention)
    if line is None:
        assert c.line is None
    else:
        assert c.line is not None and c.line.startswith(line)
        assert len(c.line) <= 300 and c.line == c.line.strip()


def test_contention_reason_names_the_numbers() -> None:
    c = run(log("torch_oom_contention.txt"))
    # 12.00 + 11.50 + 11.40 overflows the 23.65 GiB card: the 11.50 entry is this process.
    assert c.reason == "OOM: other processes hold 12.0 of 23.65 GiB on the card"


def test_contention_from_other_formats() -> None:
    assert run(log("torch1_oom_contention.txt")).reason == (
        "OOM: other processes hold 12.5 of 23.65 GiB on the card"  # 23.65 - 1.02 free - 10.10 reserved
    )
    assert run(log("malloc_async_oom.txt")).reason == (
        "OOM: other processes hold 14.2 of 23.65 GiB on the card"  # limit - free - allocated
    )


def test_oom_reasons_without_contention() -> None:
    assert run(log("torchrun_oom.txt")).reason == "CUDA out of memory (tried to allocate 1.95 GiB)"
    assert run(log("nccl_oom.txt")).reason == "NCCL could not allocate GPU memory"
    assert run(log("cublas_alloc_failed.txt")).reason == "cuBLAS could not allocate GPU memory"


def test_error_reasons_are_the_last_exception_line() -> None:
    assert run(log("plain_valueerror.txt")).reason == "ValueError: could not convert string to float: '3e-5x'"
    assert run(log("printed_config_then_keyerror.txt")).reason == "KeyError: 'glue-tvt_qnli2'"
    assert run(log("exabyte_bug.txt")).reason == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory."
    )
    # the launcher's ChildFailedError says less than the child's own exception; [rank0]: is dropped
    assert run(log("torchrun_valueerror.txt")).reason == "ValueError: unknown task 'glue-tvt_qnli2'"


# The real torch shape: the list names the *other* processes, "this process" is separate.
ONE_LINE_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
    "of 23.65 GiB of which 6.50 MiB is free. {procs}Of the allocated memory {alloc} is allocated by "
    "PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


@pytest.mark.parametrize(
    ("procs", "alloc", "contention"),
    [
        # a sibling job of the same size: it is another process, not this one
        (
            "Process 4242 has 11.50 GiB memory in use. Including non-PyTorch memory, this process has "
            "11.40 GiB memory in use. ",
            "10.90 GiB",
            True,
        ),
        (
            "Process 4242 has 1.20 GiB memory in use. Including non-PyTorch memory, this process has "
            "22.30 GiB memory in use. ",
            "21.80 GiB",
            False,
        ),
        ("Including non-PyTorch memory, this process has 23.40 GiB memory in use. ", "22.90 GiB", False),
        # in a container torch cannot recognize its own pid: the list holds it, sized ~ reserved
        (
            "Process 3674110 has 12.00 GiB memory in use. Process 3808634 has 11.30 GiB memory in use. ",
            "10.60 GiB",
            True,
        ),
        (
            "Process 3674110 has 3.80 GiB memory in use. Process 3808634 has 19.40 GiB memory in use. ",
            "18.80 GiB",
            False,
        ),
        # no process list (NVML unavailable): total - free - this process
        ("", "10.60 GiB", True),
    ],
)
def test_contention_variants(procs: str, alloc: str, contention: bool) -> None:
    c = run(ONE_LINE_OOM.format(procs=procs, alloc=alloc))
    assert c.outcome is Outcome.OOM
    assert c.contention is contention
    assert c.reason.startswith("OOM: other processes hold") is contention


def test_message_rewrapped_over_lines_still_parses() -> None:
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB.\n"
        "GPU 0 has a total capacity of 23.52 GiB of which 28.25 MiB is free.\n"
        "Process 3674110 has 12.80 GiB memory in use. Including non-PyTorch memory, "
        "this process has 10.60 GiB memory in use.\n"
    )
    c = run(text)
    assert c.contention and c.reason == "OOM: other processes hold 12.8 of 23.52 GiB on the card"
    assert c.line == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB."


# --------------------------------------------------------------------------- every signature

# One line as its source prints it, for every entry of the table.
SIGNATURE_LINES: dict[str, str] = {
    "would exceed allowed memory. (out of memory)": (
        "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)"
    ),
    "CUDA out of memory.": (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 1.02 GiB is free."
    ),
    "HIP out of memory.": (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
        "capacity of 63.98 GiB of which 100.00 MiB is free."
    ),
    "XPU out of memory.": "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1024.00 MiB.",
    "MPS backend out of memory": (
        "RuntimeError: MPS backend out of memory (MPS allocated: 18.05 GB, other allocations: 2.23 MB, "
        "max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool."
    ),
    "CUDA error: out of memory": "RuntimeError: CUDA error: out of memory",
    "HIP error: out of memory": "RuntimeError: HIP error: out of memory",
    "hipErrorOutOfMemory": ":0:rocdevice.cpp:2692: 1021 us: hipErrorOutOfMemory: out of memory",
    "CUDA driver error: out of memory": "RuntimeError: CUDA driver error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED": (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
    "CUSOLVER_STATUS_ALLOC_FAILED": (
        "RuntimeError: cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`"
    ),
    "CUSPARSE_STATUS_ALLOC_FAILED": (
        "RuntimeError: CUDA error: CUSPARSE_STATUS_ALLOC_FAILED when calling `cusparseCreate(handle)`"
    ),
    "CUDNN_STATUS_ALLOC_FAILED": "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "Cuda failure 'out of memory'": (
        "node07:2211:2290 [1] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'"
    ),
    "Failed to CUDA calloc": (
        "node07:2211:2290 [1] include/alloc.h:132 NCCL WARN Failed to CUDA calloc 10485760 bytes"
    ),
    "cuda runtime error (2) : out of memory": (
        "RuntimeError: cuda runtime error (2) : out of memory at "
        "/pytorch/aten/src/THC/generic/THCStorage.cu:58"
    ),
    "torch.OutOfMemoryError": "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError": (
        "torch.cuda.OutOfMemoryError: (raised by the trainer's own retry helper)"
    ),
    "DefaultCPUAllocator: can't allocate memory": (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't "
        "allocate memory: you tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"
    ),
    "DefaultCPUAllocator: not enough memory": (
        "RuntimeError: [enforce fail at ..\\c10\\core\\impl\\alloc_cpu.cpp:72] data. "
        "DefaultCPUAllocator: not enough memory: you tried to allocate 1073741824 bytes."
    ),
    "DataLoader worker (pid N) is killed by signal: Killed.": (
        "RuntimeError: DataLoader worker (pid 48213) is killed by signal: Killed."
    ),
    "Detected N oom-kill event(s)": (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4211.batch. Some of the step tasks "
        "have been OOM Killed."
    ),
    "MemoryError": (
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array with "
        "shape (1000000000,) and data type float64"
    ),
    "uncorrectable ECC error encountered": "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "uncorrectable NVLink error detected during the execution": (
        "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution"
    ),
    "CUDA error: unknown error": "RuntimeError: CUDA error: unknown error",
    "no CUDA-capable device is detected": "RuntimeError: CUDA error: no CUDA-capable device is detected",
    "GPU is lost": (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system "
        "to recover this GPU"
    ),
    "No space left on device": (
        "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: "
        'StorageFull, message: "No space left on device" })'
    ),
    "Disk quota exceeded": "OSError: [Errno 122] Disk quota exceeded: 'outputs/E1/qnli/seed87/optimizer.pt'",
    "PytorchStreamWriter failed writing file": (
        "RuntimeError: [enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
        "data/12: file write failed"
    ),
}


def test_every_signature_has_an_example() -> None:
    assert sorted(SIGNATURE_LINES) == sorted(s.text for s in SIGNATURES)
    assert len({s.text for s in SIGNATURES}) == len(SIGNATURES)


@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: s.text)
def test_each_signature(sig: Signature) -> None:
    line = SIGNATURE_LINES[sig.text]
    text = f"step 812/3274 loss=0.412\n{line}\n\n"
    c = run(text)
    assert c.outcome is sig.outcome
    assert c.line == (line if len(line) <= 300 else line[:299] + "…")
    assert c.reason.startswith(sig.label)


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: HIP out of memory",  # as seed 003 quotes it
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB.",
        "\x1b[31mtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB.\x1b[0m",
        "node1:77:99 [0] include/alloc.h:103 NCCL WARN Cuda failure 2 'out of memory'",
        "node1:77:99 [0] NCCL WARN HIP failure 'out of memory' at rccl/src/include/alloc.h:62",
        "RuntimeError: DataLoader worker (pid(s) 48213, 48214) is killed by signal: Killed.",
        "MemoryError",
        "OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 MiB')",
        '{"level": "error", "msg": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB"}',
    ],
)
def test_signature_variants_still_match(line: str) -> None:
    assert run(line).outcome in (Outcome.OOM, Outcome.HOST_OOM)


@pytest.mark.parametrize(
    "line",
    [
        "cuda out of memory. Tried to allocate 2 MiB",  # case-sensitive, as torch prints it
        "print: we may run out of memory on the 7B config",
        "if you hit CUDA out of memory errors, lower the micro-batch",
        "config: {'retry_on': ['CUDA out of memory.', 'CUBLAS_STATUS_ALLOC_FAILED']}",
        "Namespace(oom_message='CUDA out of memory.', num_data_workers=8)",
        "MyCUBLAS_STATUS_ALLOC_FAILED_COUNT=0",
        "torch.OutOfMemoryErrors are caught by the retry helper",
        "RuntimeError: Out of memory while tokenizing",
        "scheduler: raise MemoryError",
    ],
)
def test_look_alikes_are_errors(line: str) -> None:
    c = run(f"{line}\nValueError: real cause")
    assert c.outcome is Outcome.ERROR
    assert c.reason == "ValueError: real cause"


@pytest.mark.parametrize("look_alike", LOOK_ALIKES, ids=lambda la: la.text)
def test_each_look_alike_is_not_oom(look_alike: LookAlike) -> None:
    text = f"[W1102 10:20:01] something: {look_alike.text} (free: 1, total: 2)\n"
    assert run(text).outcome is Outcome.ERROR


def test_traceback_source_lines_are_not_messages() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/home/lab/gla/train.py", line 77, in step\n'
        "    except torch.OutOfMemoryError:  # CUDA out of memory. Tried to allocate\n"
        "ZeroDivisionError: division by zero\n"
    )
    assert run(text).reason == "ZeroDivisionError: division by zero"
    torchrun = "".join(f"[rank0]: {line}\n" for line in text.splitlines())
    assert run(torchrun).outcome is Outcome.ERROR


def test_traceback_without_source_lines() -> None:
    # Python shows no source line when it cannot read the file (python -c, .pyc only, <string>)
    text = (
        "Traceback (most recent call last):\n"
        '  File "<string>", line 3, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    assert run(text).outcome is Outcome.OOM


def test_last_matching_line_wins() -> None:
    gpu = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB."
    host = "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes."
    assert run(f"{gpu}\n{host}\n").outcome is Outcome.HOST_OOM
    assert run(f"{host}\n{gpu}\n").outcome is Outcome.OOM
    two = (
        "[rank0]: RuntimeError: CUDA error: out of memory\n[rank1]: RuntimeError: CUDA error: out of memory\n"
    )
    assert run(two).line == "[rank1]: RuntimeError: CUDA error: out of memory"


# --------------------------------------------------------------------------- precedence


@pytest.mark.parametrize(
    "exit",
    [None, exited(0), exited(1), exited(OOM_EXIT_CODE), exited(137), exited(None, signal=15)],
)
def test_cancel_wins_whatever_the_exit(exit: ExitRecord | None) -> None:
    c = classify(exit, log("torch_oom_contention.txt"), cancel_requested=True)
    assert c.outcome is Outcome.CANCELLED


def test_no_exit_record_is_lost() -> None:
    assert classify(None, log("torch_oom_contention.txt"), cancel_requested=False).outcome is Outcome.LOST


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.txt")))
def test_exit_zero_is_ok_whatever_the_log(name: str) -> None:
    assert run(log(name), 0) == Classification(outcome=Outcome.OK, reason="exited 0")
    assert run(log(name), 0, oom_reported=True).outcome is Outcome.OK


def test_reported_oom() -> None:
    bare = run("", OOM_EXIT_CODE)
    assert (bare.outcome, bare.line) == (Outcome.OOM, None)
    assert run("epoch 3\nsaving\n", 1, oom_reported=True).outcome is Outcome.OOM
    found = run(log("torch_oom_contention.txt"), OOM_EXIT_CODE)
    assert found.outcome is Outcome.OOM and found.contention
    assert found.line is not None and found.line.startswith("torch.OutOfMemoryError")
    # the in-job helper reports any torch.OutOfMemoryError, but the 1EB one is a bug
    assert run(log("exabyte_bug.txt"), OOM_EXIT_CODE).outcome is Outcome.ERROR


@pytest.mark.parametrize(
    "exit", [exited(137), exited(None, signal=9), exited(-9), exited(137, signal=9)], ids=str
)
def test_sigkill_without_text_is_host_oom(exit: ExitRecord) -> None:
    c = classify(exit, "epoch 2 step 100 loss 0.41\n", cancel_requested=False)
    assert c == Classification(
        outcome=Outcome.HOST_OOM, reason="killed by SIGKILL (likely the kernel OOM killer)", line=None
    )


def test_gpu_oom_text_beats_the_sigkill_guess() -> None:
    assert run(log("torchrun_oom.txt"), 137).outcome is Outcome.OOM


@pytest.mark.parametrize(
    ("exit", "reason"),
    [
        (exited(3), "exit code 3"),
        (exited(143), "killed by signal SIGTERM"),
        (exited(None, signal=15), "killed by signal SIGTERM"),
        (exited(None, signal=77), "killed by signal 77"),
        (exited(None), "no exit code recorded"),
    ],
)
def test_error_reason_without_log(exit: ExitRecord, reason: str) -> None:
    c = classify(exit, "\n  \n[gpusched] E1/job exited: code=3 signal=null\n", cancel_requested=False)
    assert (c.outcome, c.reason, c.line) == (Outcome.ERROR, reason, None)


def test_error_reason_falls_back_to_last_line_and_is_short() -> None:
    c = run("loading data\nfatal: tokenizer files missing in /data/tok\n\n")
    assert c.reason == "fatal: tokenizer files missing in /data/tok"
    long = run("ValueError: " + "x" * 1000)
    assert long.outcome is Outcome.ERROR
    assert len(long.reason) <= 200 and long.reason.startswith("ValueError: xxx")
    assert long.line is not None and len(long.line) <= 300


def test_a_coloured_traceback_gives_its_reason_as_text() -> None:
    """A coloured traceback (colours, `tput sgr0`'s reset, a hyperlink to the file) is read as
    the text it shows."""
    c = run(
        "\x1b[31mTraceback\x1b[0m (most recent call last):\n"
        '  File "\x1b]8;;file:///t.py\x1b\\t.py\x1b]8;;\x1b\\", line 3, in <module>\n'
        "\x1b[1;35mKeyError\x1b(B\x1b[m: \x1b[32m'label'\x1b[0m\x1b[K\n"  # tput sgr0 is ESC ( B ESC [ m
    )
    assert (c.outcome, c.reason) == (Outcome.ERROR, "KeyError: 'label'")


# --------------------------------------------------------------------------- next_step

LADDER = (
    Tier(name="A", config={"num_data_workers": 8}),
    Tier(name="B", config={"gradient_checkpointing": True}),  # workers unchanged (8)
    Tier(name="C", config={"num_data_workers": 8, "batch_size": 4}),
    Tier(name="D", config={"num_data_workers": 2}),
    Tier(name="E", config={"num_data_workers": 0}),
)


def c_of(outcome: Outcome, reason: str = "why", contention: bool = False) -> Classification:
    return Classification(outcome=outcome, reason=reason, contention=contention)


def step(
    c: Classification,
    *,
    tier: int = 0,
    tiers: Sequence[Tier] = LADDER,
    gpu: int | None = 3,
    errors_so_far: int = 0,
    lost_so_far: int = 0,
    retry: RetryPolicy = RetryPolicy(),  # noqa: B008 (frozen, so sharing it is safe)
    max_lost: int = 3,
    arrival: str | None = None,
) -> Step:
    return next_step(
        c,
        tier=tier,
        tiers=tiers,
        gpu=gpu,
        errors_so_far=errors_so_far,
        lost_so_far=lost_so_far,
        retry=retry,
        now=1000.0,
        max_lost=max_lost,
        arrival=arrival,
    )


def test_a_full_disk_waits_and_runs_again_at_its_tier_three_times_then_fails() -> None:
    """The machine's fault, not the job's: not a retry the suite spends, the same tier (its
    checkpoint resumed), after a wait that doubles, so that whoever frees the disk has time."""
    c = run(
        "step 900\nOSError: [Errno 28] No space left on device: 'outputs/E1/qnli/seed87/checkpoint-900'\n"
    )
    assert (c.outcome, c.reason) == (Outcome.DISK_FULL, "the disk filled up (No space left on device)")
    waits = []
    for fulls in range(3):
        s = next_step(c, tier=1, tiers=LADDER, gpu=3, errors_so_far=0, lost_so_far=0,
                      retry=RetryPolicy(), now=1000.0, faults_so_far=fulls)  # fmt: skip
        assert (s.kind, s.tier, s.avoid_gpu) == (StepKind.REQUEUE, 1, None)
        assert f"({fulls + 1} of 3; not counted against the job)" in s.reason
        waits.append((s.not_before or 0) - 1000.0)
    assert waits == [MACHINE_WAIT_S, 2 * MACHINE_WAIT_S, 4 * MACHINE_WAIT_S]
    s = next_step(c, tier=1, tiers=LADDER, gpu=3, errors_so_far=0, lost_so_far=0,
                  retry=RetryPolicy(), now=1000.0, faults_so_far=3)  # fmt: skip
    assert s.kind is StepKind.FAIL and s.reason.startswith(
        "the disk was full under 4 of its attempts, gave up: OSError"
    )


NETWORK_LAST_LINES = [
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries"
    " exceeded with url: /api/models/fla-hub/gla-1.3B (Caused by NewConnectionError('<urllib3.connection."
    "HTTPSConnection object>: Failed to establish a new connection: [Errno 101] Network is unreachable'))",
    "OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the"
    " cached files and it looks like fla-hub/gla-1.3B is not the path to a directory containing a file named"
    " config.json.",
    "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url: https://hf.co/x",
    "huggingface_hub.errors.HfHubHTTPError: 429 Client Error: Too Many Requests for url: https://hf.co/x",
    "requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='cdn-lfs.hf.co', port=443): Read timed out.",
    "socket.gaierror: [Errno -3] Temporary failure in name resolution",
    "ConnectionResetError: [Errno 104] Connection reset by peer",
    "urllib3.exceptions.ProtocolError: ('Connection broken: IncompleteRead(0 bytes read)', IncompleteRead)",
]
NOT_NETWORK_LAST_LINES = [
    "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: x) Repository Not Found",
    "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: https://huggingface.co/x/resolve/main/y",
    "ConnectionRefusedError: [Errno 111] Connection refused",  # a local service not started: it stays so
    "BrokenPipeError: [Errno 32] Broken pipe",  # a reader that went away, not a network
    # another rank of the job died: its own error, met again on a retry
    "torch.distributed.DistNetworkError: Connection reset by peer",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, Connection reset by peer",
    "KeyError: 'label'",
]


@pytest.mark.parametrize("last", NETWORK_LAST_LINES)
def test_a_job_that_died_of_a_failed_connection_runs_again_after_a_wait(last: str) -> None:
    """A model hub's 503 at 2 a.m. failed the jobs that started then, for good. A connection that
    failed is the network's, and passes: the same tier after five minutes, not charged."""
    c = run(f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{last}\n')
    assert (c.outcome, c.line) == (Outcome.NETWORK, last[:299] + "…" if len(last) > 300 else last)
    s = step(c, tier=2)
    assert (s.kind, s.tier, s.not_before) == (StepKind.REQUEUE, 2, 1000.0 + MACHINE_WAIT_S)
    assert s.reason.startswith("the network failed, requeued at tier C in 300 s (1 of 3; not counted against")


@pytest.mark.parametrize("last", NOT_NETWORK_LAST_LINES)
def test_what_a_retry_would_not_mend_is_an_error(last: str) -> None:
    assert run(f"Traceback (most recent call last):\n{last}\n").outcome is Outcome.ERROR


def test_only_the_exception_the_job_died_of_counts_not_a_network_warning_above_it() -> None:
    log = (
        "Couldn't reach https://huggingface.co: ConnectionError: Max retries exceeded; using the cache\n"
        "step 10\nTraceback (most recent call last):\nKeyError: 'label'\n"
    )
    assert (run(log).outcome, run(log).reason) == (Outcome.ERROR, "KeyError: 'label'")


def test_ok_is_done() -> None:
    s = step(c_of(Outcome.OK), tier=2)
    assert (s.kind, s.tier, s.avoid_gpu, s.not_before) == (StepKind.DONE, 2, None, None)


def test_oom_goes_one_tier_down_the_ladder() -> None:
    s = step(c_of(Outcome.OOM), tier=1)
    assert (s.kind, s.tier, s.avoid_gpu) == (StepKind.REQUEUE, 2, None)
    assert s.reason == "OOM at tier B → requeued at tier C"


def test_oom_with_contention_avoids_the_gpu() -> None:
    s = step(c_of(Outcome.OOM, "OOM: other processes hold 12.0 of 23.65 GiB on the card", True), gpu=5)
    assert (s.kind, s.tier, s.avoid_gpu) == (StepKind.REQUEUE, 1, 5)
    assert s.reason.startswith("OOM at tier A → requeued at tier B") and "GPU 5" in s.reason


@pytest.mark.parametrize("tier", [0, 4])
def test_an_oom_after_someone_elses_process_came_onto_the_card_keeps_the_tier_elsewhere(tier: int) -> None:
    came = "someone else's process (pid 4242, 18.0 GiB)"
    s = step(c_of(Outcome.OOM, contention=True), tier=tier, gpu=3, arrival=came)
    name = LADDER[tier].name
    assert (s.kind, s.tier, s.avoid_gpu) == (StepKind.REQUEUE, tier, 3)  # even at the last tier
    assert s.reason == f"OOM at tier {name} after {came} came onto GPU 3 → requeued at {name} elsewhere"


def test_the_processes_an_oom_message_lists_on_the_card() -> None:
    tail = (
        "Process 77 has 1.00 GiB memory in use.\n"  # an older message's: not this OOM's
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
        " capacity of 24.00 GiB of which 20.00 MiB is free. Process 4242 has 18.00 GiB memory in use."
        " Process 9 has 300.00 MiB memory in use. Including non-PyTorch memory, this process has 5.50 GiB"
        " memory in use.\n"
    )
    assert oom_processes(tail) == {4242: 18 * 1024, 9: 300}
    assert oom_processes("RuntimeError: boom\n") == {}


def test_oom_at_the_last_tier_fails() -> None:
    s = step(c_of(Outcome.OOM, contention=True), tier=4)
    assert (s.kind, s.tier, s.reason) == (StepKind.FAIL, 4, "OOM at the last tier E")


@pytest.mark.parametrize(("tier", "target"), [(0, 3), (1, 3), (2, 3), (3, 4)])
def test_host_oom_jumps_to_fewer_data_workers(tier: int, target: int) -> None:
    s = step(c_of(Outcome.HOST_OOM), tier=tier)
    assert (s.kind, s.tier) == (StepKind.REQUEUE, target)
    assert "num_data_workers" in s.reason


def test_host_oom_without_fewer_workers_takes_the_next_tier() -> None:
    tiers = (Tier(name="A"), Tier(name="B", config={"batch_size": 4}), Tier(name="C"))
    assert step(c_of(Outcome.HOST_OOM), tiers=tiers).tier == 1
    unknown_then_set = (Tier(name="A"), Tier(name="B"), Tier(name="C", config={"num_data_workers": 2}))
    assert step(c_of(Outcome.HOST_OOM), tiers=unknown_then_set).tier == 2


def test_host_oom_at_the_last_tier_fails() -> None:
    assert step(c_of(Outcome.HOST_OOM), tier=4).kind is StepKind.FAIL


def test_error_retries_with_backoff_then_fails() -> None:
    retry = RetryPolicy(errors=2, backoff_s=30.0)
    first = step(c_of(Outcome.ERROR, "ValueError: x"), tier=1, retry=retry, errors_so_far=0)
    assert (first.kind, first.tier, first.not_before) == (StepKind.REQUEUE, 1, 1030.0)
    second = step(c_of(Outcome.ERROR, "ValueError: x"), tier=1, retry=retry, errors_so_far=1)
    assert second.not_before == 1060.0
    last = step(c_of(Outcome.ERROR, "ValueError: x"), tier=1, retry=retry, errors_so_far=2)
    assert (last.kind, last.tier, last.reason, last.not_before) == (StepKind.FAIL, 1, "ValueError: x", None)


def test_error_without_retries_fails_at_once() -> None:
    assert step(c_of(Outcome.ERROR, "boom")).kind is StepKind.FAIL


def test_cancelled_is_cancel() -> None:
    assert (step(c_of(Outcome.CANCELLED), tier=2).kind, step(c_of(Outcome.CANCELLED), tier=2).tier) == (
        StepKind.CANCEL,
        2,
    )


def test_lost_is_requeued_until_max_lost() -> None:
    again = step(c_of(Outcome.LOST), tier=2, lost_so_far=2)
    assert (again.kind, again.tier) == (StepKind.REQUEUE, 2)
    gone = step(c_of(Outcome.LOST), tier=2, lost_so_far=3)
    assert (gone.kind, gone.tier) == (StepKind.FAIL, 2)
    assert gone.reason.startswith("lost 4 times")
    assert step(c_of(Outcome.LOST), lost_so_far=1, max_lost=1).kind is StepKind.FAIL


@pytest.mark.parametrize(("tier", "tiers"), [(-1, LADDER), (5, LADDER), (0, ())])
def test_tier_outside_the_ladder_fails_instead_of_raising(tier: int, tiers: Sequence[Tier]) -> None:
    for outcome in (Outcome.OOM, Outcome.HOST_OOM, Outcome.ERROR, Outcome.LOST):
        s = step(c_of(outcome, "why"), tier=tier, tiers=tiers, retry=RetryPolicy(errors=3))
        assert (s.kind, s.tier) == (StepKind.FAIL, tier)
        assert s.reason.startswith("why; cannot requeue: tier")
    assert step(c_of(Outcome.OK), tier=tier, tiers=tiers).kind is StepKind.DONE
    assert step(c_of(Outcome.CANCELLED), tier=tier, tiers=tiers).kind is StepKind.CANCEL


# --------------------------------------------------------------------------- properties

EXAMPLE_LINES = [*SIGNATURE_LINES.values(), *(la.text for la in LOOK_ALIKES), ONE_LINE_OOM]
log_texts = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(EXAMPLE_LINES), st.text(max_size=80)), max_size=12).map("\n".join),
)
exits = st.one_of(
    st.none(),
    st.builds(
        ExitRecord,
        exit_code=st.one_of(st.none(), st.integers(), st.sampled_from([0, 1, 86, 137, 143, -9])),
        signal=st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**40)),
        oom_reported=st.booleans(),
    ),
)


@settings(max_examples=300)
@given(exit=exits, text=log_texts, cancel=st.booleans())
def test_classify_never_raises(exit: ExitRecord | None, text: str, cancel: bool) -> None:
    c = classify(exit, text, cancel_requested=cancel)
    assert isinstance(c.outcome, Outcome) and c.reason
    assert len(c.reason) <= 200
    assert c.line is None or (len(c.line) <= 300 and c.line == c.line.strip())
    assert not c.contention or c.outcome is Outcome.OOM
    if cancel:
        assert c.outcome is Outcome.CANCELLED
    elif exit is not None and exit.exit_code == 0:
        assert c.outcome is Outcome.OK


workers = st.one_of(st.none(), st.integers(min_value=0, max_value=16), st.just("4"), st.just("many"))
tier_lists = st.lists(
    st.builds(
        lambda name, w: Tier(name=name, config={} if w is None else {"num_data_workers": w}),
        st.text(min_size=1, max_size=3),
        workers,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300)
@given(
    tiers=st.one_of(st.just([]), tier_lists),
    data=st.data(),
    outcome=st.sampled_from(Outcome),
    contention=st.booleans(),
    gpu=st.one_of(st.none(), st.integers(min_value=0, max_value=7)),
    errors_so_far=st.integers(min_value=0, max_value=100),
    lost_so_far=st.integers(min_value=0, max_value=10),
    retry=st.builds(RetryPolicy, errors=st.integers(0, 100), backoff_s=st.floats(0, 1e6)),
)
def test_next_step_stays_on_the_ladder(
    tiers: list[Tier],
    data: st.DataObject,
    outcome: Outcome,
    contention: bool,
    gpu: int | None,
    errors_so_far: int,
    lost_so_far: int,
    retry: RetryPolicy,
) -> None:
    tier = data.draw(st.integers(min_value=-1, max_value=len(tiers)))  # one past each end, too
    c = c_of(outcome, "r", contention and outcome is Outcome.OOM)
    s = next_step(
        c,
        tier=tier,
        tiers=tiers,
        gpu=gpu,
        errors_so_far=errors_so_far,
        lost_so_far=lost_so_far,
        retry=retry,
        now=0.0,
    )
    assert s.reason
    if s.kind is StepKind.REQUEUE:
        assert 0 <= s.tier < len(tiers)
        if outcome in (Outcome.OOM, Outcome.HOST_OOM):
            assert s.tier > tier
        else:
            assert s.tier == tier
        assert s.not_before is None or s.not_before >= 0.0
    else:
        assert s.tier == tier
    assert s.avoid_gpu is None or (outcome in (Outcome.OOM, Outcome.GPU_FAULT) and s.avoid_gpu == gpu)


@given(tiers=tier_lists, contention=st.booleans())
def test_repeated_oom_walks_the_whole_ladder_then_fails(tiers: list[Tier], contention: bool) -> None:
    tier, seen = 0, [0]
    for _ in range(len(tiers) + 1):
        s = next_step(
            c_of(Outcome.OOM, contention=contention),
            tier=tier,
            tiers=tiers,
            gpu=0,
            errors_so_far=0,
            lost_so_far=0,
            retry=RetryPolicy(),
            now=0.0,
        )
        if s.kind is StepKind.FAIL:
            break
        assert s.kind is StepKind.REQUEUE and s.tier == tier + 1
        tier = s.tier
        seen.append(tier)
    assert s.kind is StepKind.FAIL
    assert seen == list(range(len(tiers)))
