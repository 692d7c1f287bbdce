"""Placement policies on one E1-like night, in the simulator (``gpusched.sim``), same trace,
same run:

    python benchmarks/placement.py [--seed 4] [--json] [--trace-out trace.json]
    python benchmarks/placement.py --seeds 4,7,11,1,2,3,5,6 --policy gpusched
    python benchmarks/placement.py --seeds 4,7,11,1,2,3,5,6 --policy gpusched --second-night
    python benchmarks/placement.py --seeds 4,7,11,1,2,3,5,6 --policy gpusched --from-history
    python benchmarks/placement.py --seeds 4,7,11,1,2,3,5,6 --policy gpusched --gpu-plan 2,2,2,2,1,1,1

``--seeds`` runs several traces and prints one line per seed and policy, with makespan / lower
bound to three places, and each policy's mean over the seeds (how docs/placement-rounds.md
compares rules); ``--policy`` (repeatable) runs only the policies named.

``--second-night`` measures the night a researcher sees after the first one: the same 120 jobs
run once before it, to completion, as a suite of their own in the same store (other noise, the
outsiders again on that night's clock), so every peak and run time the night needs is known
from history when it is submitted (``sim.Simulation.prior_nights``). Every column is of the
second night alone. Against the first night it tells what learning costs from what the
placement rules cost. The baselines learn nothing (they place without learned peaks or run
times), so their second nights measure no learning and differ from their first for other
reasons: static deals by the store's submission number, which the second suite continues, so
each job lands one card further on (120 mod 7) and other jobs meet the notebook and the
colleague's job; slot-only orders equal jobs by predicted peak, all known on a second night
(largest first); ts runs as on a first night. On a second night every task counts as learned,
so every co-located OOM counts as one "after learning".

``--from-history`` measures the night ``gpusched simulate`` replays after a real night: the
first night runs alone in a store of its own, its runs are read back from that store as the
command reads a queue (``memwatch.records``: peaks, OOMs, run times by task) and written into
the measured night's store before it starts (``sim.Simulation.history``). Same noise seed for
both nights; the history is that first night's, not another one's.

The machine is seed 004's: 7 x 24 GiB cards, 2 jobs per card (``--gpu-plan 2,2,2,2,2,2,2``, the
default; another plan gives the cards other caps).
The suite is 120 GLA-1.3B LoRA fine-tunes (8 GLUE-like tasks x 15 seeds) with the spread of
peaks the seeds report (tier A: 6-15 GiB; one long-passage task, 26 GiB, fits a card only
from tier B on), durations of 15-90 min, and three outside processes (an X server, a
colleague's notebook, a colleague's 18 GiB job for 90 min).

Policies, all through the real ``Scheduler`` and store, differing only in placement:

1. static round-robin over the plan (seed 004's tmux launcher: job k is bound to a slot),
2. ts-style (task-spooler's GPU mode): a card is free when >= 90 % of its memory is free,
3. slot-only least-loaded (gpusched v1),
4. gpusched memory-aware (measured free memory, learned peaks and run times, ramp-up
   reservations, start safer, longest predicted run first, pack down, holds).

Every policy gets gpusched's OOM ladder (an OOM requeues the job one tier down): for 1 and
2 that stands for the researcher relaunching it by hand, at no cost in waiting. The
baselines run jobs in submit order at the tier given (``sim.plain``).

Columns: makespan; makespan / lower bound (the largest of total GPU work / slots at each
job's fastest fitting tier, total memory-time / total memory and the longest job, see
``sim.lower_bound_s``);
OOM crashes (all, and co-location OOMs "after learning": of a job whose task had already
finished at that tier, so its peak was known, other than those an outsider's arrival caused;
and those: the card had room for the job without the outside processes that arrived after it
started);
GPU-hours lost to crashed attempts; mean memory utilisation over the makespan.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpusched import sim
from gpusched.model import MIB_PER_GIB, GpuPlan

#: task -> (tier-A peak GiB, tier-A duration min): GLA-1.3B LoRA, bf16, seed 004's figures
TASKS = {
    "cola": (6.0, 20),
    "sst2": (7.0, 40),
    "mrpc": (8.5, 15),
    "rte": (11.5, 15),
    "qqp": (11.0, 75),
    "mnli": (13.0, 90),
    "qnli": (14.5, 60),
    "boolq": (26.0, 45),
}
SEEDS = 15
GPUS = 7
CARD_MIB = 24 * MIB_PER_GIB


def e1_trace(
    seed: int = 4, seeds: int = SEEDS, tasks: dict[str, tuple[float, int]] | None = None
) -> sim.Trace:
    """The E1-like suite: every task x ``seeds`` seeds, each job a little off its task's
    figures (sequence lengths differ by seed), plus three outside processes."""
    rng = random.Random(seed)
    jobs = []
    for s in range(seeds):
        for task, (peak_gib, minutes) in (tasks or TASKS).items():
            peak = int(peak_gib * MIB_PER_GIB * rng.uniform(0.95, 1.05))
            dur = minutes * 60 * rng.uniform(0.9, 1.1)
            jobs.append(
                sim.TraceJob(
                    name=f"{80 + s}-{task}",
                    task=task,
                    tiers=sim.ladder_profiles(peak, dur, rng.uniform(60, 240)),
                )
            )
    outsiders = (
        sim.Outsider(gpu=0, mib=300),  # an X server, for good
        sim.Outsider(gpu=6, mib=6 * MIB_PER_GIB, start_s=0, end_s=4 * 3600),  # a notebook
        sim.Outsider(gpu=3, mib=18 * MIB_PER_GIB, start_s=2 * 3600, end_s=3.5 * 3600),  # someone's job
    )
    return sim.Trace(jobs=tuple(jobs), outsiders=outsiders, noise=0.03)


def hours(s: float) -> str:
    return f"{s / 3600:.2f} h"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trace-out", help="also write the trace (JSON, `gpusched simulate --trace` reads it)")
    ap.add_argument("--seeds", help="several trace seeds, comma separated: one line each and the mean")
    ap.add_argument(
        "--gpu-plan",
        default=",".join(["2"] * GPUS),
        help=f"slots per card on the {GPUS} cards (default: 2 each), e.g. 2,2,2,2,1,1,1",
    )
    ap.add_argument("--policy", action="append", choices=sim.POLICIES, help="only this policy (repeatable)")
    ap.add_argument(
        "--second-night",
        action="store_true",
        help="measure a second night: the same jobs ran once before, in the same store",
    )
    ap.add_argument(
        "--pairs",
        action="store_true",
        help="also the card-hours of each kind of pair that ran together on a card (compare with"
        " `pairing_bound.py --pairs`)",
    )
    ap.add_argument(
        "--from-history",
        action="store_true",
        help="measure a night that starts from a first night's runs, as `gpusched simulate` replays one",
    )
    args = ap.parse_args(argv)
    policies = args.policy or list(sim.POLICIES)
    prior = 1 if args.second_night else 0
    try:
        slots = tuple(int(n) for n in args.gpu_plan.split(","))
        if len(slots) != GPUS or min(slots) < 0:
            raise ValueError
    except ValueError:
        ap.error(f"--gpu-plan {args.gpu_plan!r}: give {GPUS} slot counts, one per card, e.g. 2,2,2,2,1,1,1")
    plan = GpuPlan(gpus=tuple(range(GPUS)), slots=slots)
    if args.seeds:
        return _seeds([int(s) for s in args.seeds.split(",")], policies, plan, prior, args.from_history)
    trace = e1_trace(args.seed)
    if args.trace_out:
        Path(args.trace_out).write_text(sim.trace_to_json(trace))
    results, took = [], {}
    for name in policies:
        t0 = time.monotonic()
        results.append(night(trace, plan, name, args.seed, prior, args.from_history))
        took[name] = time.monotonic() - t0
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
        return 0
    r0 = results[0]
    print(
        f"{r0.jobs} jobs, {r0.gpus} x 24 GiB, plan {args.gpu_plan}; lower bound {hours(r0.lower_bound_s)};"
        f" seed {args.seed}"
        + ("; the second night (one before it in the store)" if prior else "")
        + ("; from the first night's history" if args.from_history else "")
    )
    print(sim.format_table(results))
    print("simulated in " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
    if args.pairs:
        for r in results:
            pairs, alone, idle = pair_mix(r)
            together = f"card-hours by what ran together (idle {idle:.2f}; alone {sum(alone.values()):.2f})"
            print(f"\n{r.label}: {together}")
            print(format_mix(pairs))
            print("  alone: " + ", ".join(f"{kind} {h:.2f}" for kind, h in alone.most_common(6)))
    return 0


def format_mix(mix: Counter[str], top: int = 20) -> str:
    """Card-hours per kind of pair, most first (``top`` of them), one a line."""
    lines = [f"  {hours:6.2f} card-h  {kind}" for kind, hours in mix.most_common(top)]
    rest = sum(mix.values()) - sum(h for _, h in mix.most_common(top))
    return "\n".join(lines + ([f"  {rest:6.2f} card-h  (the other kinds)"] if rest > 0.005 else []))


def pair_mix(result: sim.SimResult) -> tuple[Counter[str], Counter[str], float]:
    """From a night's report: card-hours per kind of pair that ran on one card together
    ("mnli-A + qqp-B": tasks at tiers; "!" marks an attempt that ran out of memory), per
    kind of job that ran alone, and the card-hours nothing of ours ran."""
    pairs: Counter[str] = Counter()
    alone: Counter[str] = Counter()
    idle = 0.0
    zero = result.report.start or 0.0  # the night's submit (after its prior nights, if any)
    runs = [
        (
            a.gpu,
            a.start - zero,
            a.end - zero,
            f"{a.job.rpartition('-')[2]}-{a.tier}" + ("!" if a.outcome == "oom" else ""),
        )
        for a in result.report.attempts
    ]
    for gpu in range(result.gpus):
        on_card = [(start, end, kind) for g, start, end, kind in runs if g == gpu]
        times = sorted({0.0, result.makespan_s, *(t for start, end, _ in on_card for t in (start, end))})
        for t0, t1 in itertools.pairwise(times):
            kinds = sorted(kind for start, end, kind in on_card if start <= t0 and end >= t1)
            h = (t1 - t0) / 3600
            if len(kinds) >= 2:
                pairs[" + ".join(kinds[:2])] += h
            elif kinds:
                alone[kinds[0]] += h
            else:
                idle += h
    return pairs, alone, idle


def night(
    trace: sim.Trace, plan: GpuPlan, policy: str, seed: int, prior: int = 0, from_history: bool = False
) -> sim.SimResult:
    """One policy's night: a first night, or after ``prior`` nights in its store, or (with
    ``from_history``) with a first night's runs written into its store first."""
    history = None
    if from_history:
        from gpusched import memwatch
        from gpusched.store import Store

        with tempfile.TemporaryDirectory(prefix="gpusched-sim-") as tmp:
            first = sim.Simulation(
                trace=trace,
                plan=plan,
                totals_mib=[CARD_MIB] * GPUS,
                policy=sim.policies(plan)[policy],
                seed=seed,
            )
            first.run(Path(tmp))
            store = Store(Path(tmp) / "sim.db")
            try:
                history = memwatch.records(store, sorted({j.task for j in trace.jobs}))
            finally:
                store.close()
    return sim.simulate(
        trace, plan, [CARD_MIB] * GPUS, policy=policy, seed=seed, prior_nights=prior, history=history
    )


def _seeds(
    seeds: list[int], policies: list[str], plan: GpuPlan, prior: int = 0, from_history: bool = False
) -> int:
    """One line per seed and policy, then each policy's mean makespan / lower bound (of the
    second night with ``prior`` 1, of the night from the first one's history with
    ``from_history``)."""
    ratios: dict[str, list[float]] = {name: [] for name in policies}
    which = " (second night)" if prior else " (from history)" if from_history else ""
    for seed in seeds:
        trace = e1_trace(seed)
        for name in policies:
            r = night(trace, plan, name, seed, prior, from_history)
            ratios[name].append(r.makespan_s / r.lower_bound_s)
            print(
                f"seed {seed} {name}{which}: {hours(r.makespan_s)}, {ratios[name][-1]:.3f} x the lower bound,"
                f" {r.oom_count} OOMs, {r.learned_colocated_ooms} co-located after learning,"
                f" {r.arrival_ooms} from an outsider's arrival",
                flush=True,
            )
    for name, rs in ratios.items():
        print(f"mean over {len(rs)} seeds, {name}{which}: {sum(rs) / len(rs):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
