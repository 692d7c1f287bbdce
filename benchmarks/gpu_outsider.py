"""Real-GPU check of placement beside someone else's process: a process started by hand,
outside gpusched, holds memory on GPU 0; a suite whose jobs each hold ``--job-gib`` is then
submitted with more slots on that card than fit beside it. gpusched must see the outsider
(``status`` names its PID and memory), never run more jobs at once than fit in what it left
(under the 10 % headroom), and finish every job without an OOM.

    python benchmarks/gpu_outsider.py [--jobs 6] [--job-gib 8] [--job-s 20] [--slots 4]
                                      [--hold-gib G] [--fit 2] [--backend subprocess|tmux]

Memory is held through the CUDA driver (``libcuda.so.1`` via ctypes; no torch), the outsider
with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that its device 0 is NVML's GPU 0. Without
``--hold-gib`` the outsider takes what leaves room for ``--fit`` jobs. Prints ``gpusched
gpus`` (the NVML probe), the GPU as ``status`` shows it while the outsider holds, the most
jobs that ran at once against how many fit, the wait reasons seen, each job's attempts, and
PASS or FAIL. Needs a machine with an NVIDIA GPU and this project installed; uses a private
GPUSCHED_HOME, never your queue. On a machine without a GPU: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

#: Holds ``GIB`` GiB on CUDA device 0 for ``SECONDS``, allocated in 256 MiB steps over about
#: a second (a job warming up); a failed allocation prints PyTorch's OOM line and exits 1. Run
#: as a job, it writes its pid into the attempt directory (``hold.pid``).
HOLD = """\
import ctypes, os, sys, time
if "GPUSCHED_ATTEMPT_DIR" in os.environ:
    with open(os.path.join(os.environ["GPUSCHED_ATTEMPT_DIR"], "hold.pid"), "w") as f:
        f.write(str(os.getpid()))
mib, seconds = int(float(sys.argv[1]) * 1024), float(sys.argv[2])
cuda = ctypes.CDLL("libcuda.so.1")
def ok(r):
    if r:
        sys.exit(f"CUDA driver error {r}")
ctx, dev = ctypes.c_void_p(), ctypes.c_int()
ok(cuda.cuInit(0)); ok(cuda.cuDeviceGet(ctypes.byref(dev), 0))
ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
held, step = [], 256
for _ in range(0, mib, step):
    p = ctypes.c_uint64()
    r = cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(step << 20))
    if r == 2:  # CUDA_ERROR_OUT_OF_MEMORY
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB.", file=sys.stderr)
        sys.exit(1)
    ok(r)
    held.append(p)
    time.sleep(1.0 / max(1, mib // step))
print(f"holding {mib} MiB", flush=True)
time.sleep(seconds)
"""

PLAN = """\
command: {python} {work}/hold.py {job_gib} {job_s} {{config}}
workdir: {work}
matrix:
  seed: {seeds}
job:
  name: "hold-{{seed}}"
  task: hold
  config: {{seed: "{{seed}}"}}
"""


def gpusched(*args: str, env: dict[str, str], cwd: Path, check: bool = True) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "gpusched", *args], env=env, cwd=cwd, text=True, capture_output=True
    )
    if check and r.returncode:
        raise SystemExit(f"gpusched {' '.join(args)} -> {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--job-gib", type=float, default=8.0)
    ap.add_argument("--job-s", type=float, default=20.0, help="how long each job holds its memory")
    ap.add_argument("--slots", type=int, default=4, help="the gpu-plan's slots on GPU 0")
    ap.add_argument("--hold-gib", type=float, help="what the outsider holds (default: room for --fit jobs)")
    ap.add_argument("--fit", type=int, default=2, help="jobs that should fit beside the outsider")
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--backend", choices=("subprocess", "tmux"), default="subprocess")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpusched-outsider-"))
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSCHED_FAKE_GPUS", "CUDA_VISIBLE_DEVICES")}
    env["GPUSCHED_HOME"] = str(work / "home")

    probe = json.loads(gpusched("gpus", "--json", env=env, cwd=work))
    print("$ gpusched gpus\n" + gpusched("gpus", env=env, cwd=work))
    if not probe["gpus"]:
        print(f"gpu_outsider: no GPU to test on ({probe['notice']})")
        shutil.rmtree(work)
        return 2
    gpu0 = probe["gpus"][0]
    usable_gib = (gpu0["free_mib"] - 0.1 * gpu0["total_mib"]) / 1024  # under the default 10 % headroom
    # a job's CUDA context costs ~0.5 GiB beyond what it allocates: room for --fit jobs and half of one more
    hold_gib = args.hold_gib
    if hold_gib is None:
        hold_gib = usable_gib - (args.fit + 0.5) * (args.job_gib + 0.5)
    if hold_gib <= 0:
        print(
            f"gpu_outsider: GPU 0 has {usable_gib:.1f} GiB to use: too little for {args.fit} jobs"
            f" of {args.job_gib} GiB"
        )
        return 2

    (work / "hold.py").write_text(HOLD)
    (work / "plans").mkdir()
    seeds = list(range(1, args.jobs + 1))
    plan = PLAN.format(python=sys.executable, work=work, job_gib=args.job_gib, job_s=args.job_s, seeds=seeds)
    (work / "plans" / "outsider.yaml").write_text(textwrap.dedent(plan))

    outsider = subprocess.Popen(
        [sys.executable, str(work / "hold.py"), str(hold_gib), "3600"],
        env={**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        stdout=subprocess.PIPE,
        text=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` too leaves nothing behind
    try:
        assert outsider.stdout is not None
        line = outsider.stdout.readline().strip()  # "holding N MiB" once it holds all of it
        if not line.startswith("holding"):
            print(
                f"gpu_outsider: the outside process could not hold {hold_gib:.1f} GiB"
                f" (exit {outsider.wait()})"
            )
            return 1
        print(f"outside process: pid {outsider.pid}, {line}, started by hand (not by gpusched)")
        after = json.loads(gpusched("gpus", "--json", env=env, cwd=work))["gpus"][0]
        room_gib = (after["free_mib"] - 0.1 * after["total_mib"]) / 1024  # under the 10 % headroom
        return run_suite(args, work, env, outsider.pid, fit=math.floor(room_gib / args.job_gib))
    finally:
        gpusched("cancel", "--suite", "outsider", env=env, cwd=work, check=False)
        gpusched("daemon", "stop", env=env, cwd=work, check=False)
        if (sock := work / "home" / "tmux.sock").exists():  # the private tmux server (--backend tmux)
            subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True)
        outsider.kill()
        outsider.wait()


def run_suite(args: argparse.Namespace, work: Path, env: dict[str, str], outsider_pid: int, fit: int) -> int:
    """Submit the suite beside the outsider, watch ``status --json`` until every job ended,
    and check what placement did. ``fit``: the most jobs of ``--job-gib`` that the card's
    free memory (under headroom) could take, CUDA contexts not counted: no correct placement
    runs more at once."""
    t0 = time.time()
    submit = ("submit", "--suite", "outsider", "--gpu-plan", str(args.slots), "--backend", args.backend)
    print(gpusched(*submit, env=env, cwd=work))
    most, reasons, outside_mib, seen_pids = 0, set(), 0, set()
    doc: dict[str, Any] = {}
    while time.time() - t0 < args.timeout:
        doc = json.loads(gpusched("status", "--json", env=env, cwd=work))
        states = [j["state"] for j in doc["jobs"]]
        most = max(most, states.count("running"))
        reasons |= {j["reason"] for j in doc["jobs"] if j["state"] == "queued" and j["reason"]}
        g = doc["gpus"][0]
        outside_mib = max(outside_mib, g["outside_mib"] or 0)
        seen_pids |= {p["pid"] for p in g["processes"] if not p["ours"]}
        if all(s in ("succeeded", "failed", "cancelled") for s in states):
            break
        time.sleep(0.5)
    print(f"$ gpusched status (at the end)\n{gpusched('status', env={**env, 'COLUMNS': '160'}, cwd=work)}")
    print(
        f"not-ours pids status listed on GPU 0: {sorted(seen_pids)};"
        f" most outside memory shown: {outside_mib} MiB"
    )
    print("wait reasons seen:" + "".join(f"\n  {r}" for r in sorted(reasons)))
    ooms, job_pids = [], set()
    print(f"\n{'job':24} {'state':10} attempts:exit code, predicted and peak MiB")
    for j in doc["jobs"]:
        attempts = []
        job_dir = work / "logs" / "outsider" / j["name"]
        for a in sorted(job_dir.iterdir()) if job_dir.is_dir() else ():  # never started: no attempts
            ex = json.loads((a / "exit.json").read_text()) if (a / "exit.json").exists() else {}
            attempts.append(f"{a.name}:{ex.get('exit_code')}")
            if (a / "hold.pid").exists():
                job_pids.add(int((a / "hold.pid").read_text()))
            if "out of memory" in (a / "output.log").read_text(errors="replace"):
                ooms.append(f"{j['id']} {a.name}")
        print(f"{j['id']:24} {j['state']:10} {' '.join(attempts)} {j['predicted_mib']} {j['peak_mib']}")
    misnamed = seen_pids & job_pids
    if outsider_pid in seen_pids:
        named = "ok  "
    elif not seen_pids:  # NVML listed no process we could see: a container's PID namespace
        named = "n/a "
    else:
        named = "FAIL"
    checks = {
        f"every job succeeded ({len(doc['jobs'])})": all(j["state"] == "succeeded" for j in doc["jobs"]),
        f"no OOM ({', '.join(ooms) or 'none'})": not ooms,
        f"at most {fit} ran at once beside the outsider (most: {most}, slots: {args.slots})": most <= fit,
        # a job's process is still listed while the driver releases its memory after it exits
        f"status never showed a job's own process as not ours ({sorted(misnamed) or 'none'})": not misnamed,
    }
    print()
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print(f"{named} status named the outsider (pid {outsider_pid}) as not ours")
    passed = all(checks.values()) and named != "FAIL"
    print(f"\nwall {time.time() - t0:.0f} s; {'PASS' if passed else 'FAIL'}; logs in {work}/logs")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
