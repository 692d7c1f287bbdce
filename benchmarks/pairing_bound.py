"""A tighter lower bound for the placement benchmark's night, given the headroom: how long the
night must take when jobs may share a card only if their peaks fit it together.

    python benchmarks/pairing_bound.py [--seed 4 ...] [--headroom 0.10]

``sim.lower_bound_s`` counts every job at its fastest fitting tier with any other; this
linear program also respects that a card holds at most two jobs (the plan) whose peaks add up
to at most the card less its headroom. Variables: card-hours spent running each pair of (job,
tier) that fits (or one job alone); each job must be done once (fractionally: a job may be
split across tiers and cards); makespan >= card-hours / cards. It knows every peak from the
start and ignores outside processes, ramp-ups and the order in time, so it is still a lower
bound, not a schedule. Needs scipy (not a dependency of gpusched).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement import CARD_MIB, GPUS, e1_trace, format_mix

from gpusched import sim

#: The ladder's tier names, by index, for the pairs' labels.
TIER_NAMES = "ABCD"


def pairing_bound_s(trace: sim.Trace, cards: int, usable_mib: int, tiers: int = 3) -> float:
    """The LP bound in seconds for ``cards`` cards of ``usable_mib`` each, two jobs per card,
    each job at one of its first ``tiers`` tiers (the default ladder's D runs alone, slower)."""
    return pairing_lp(trace, cards, usable_mib, tiers)[0]


def pairing_lp(trace: sim.Trace, cards: int, usable_mib: int, tiers: int = 3) -> tuple[float, Counter[str]]:
    """The LP bound in seconds, and the card-hours its solution spends on each kind of pair
    ("mnli-A + qqp-B": tasks at tiers; one job alone is a kind of its own)."""
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import lil_matrix

    items = sorted(
        (p.peak_mib, j, p.duration_s, t)
        for j, job in enumerate(trace.jobs)
        for t, p in enumerate(job.tiers[:tiers])
        if p.peak_mib <= usable_mib
    )
    pairs: list[tuple[int, ...]] = [(a,) for a in range(len(items))]
    for a in range(len(items)):
        for b in range(a + 1, len(items)):
            if items[a][0] + items[b][0] > usable_mib:
                break  # sorted by peak: no later b fits either
            if items[a][1] != items[b][1]:
                pairs.append((a, b))
    done = lil_matrix((len(trace.jobs), len(pairs)))
    for c, pair in enumerate(pairs):
        for i in pair:
            done[items[i][1], c] -= 1 / items[i][2]
    res = linprog(
        np.full(len(pairs), 1 / cards),
        A_ub=done.tocsr(),
        b_ub=-np.ones(len(trace.jobs)),
        bounds=(0, None),
        method="highs",
    )
    mix: Counter[str] = Counter()
    for c, seconds in enumerate(res.x):
        if seconds > 1e-6:
            kinds = sorted(f"{trace.jobs[items[i][1]].task}-{TIER_NAMES[items[i][3]]}" for i in pairs[c])
            mix[" + ".join(kinds)] += seconds / 3600
    return float(res.fun), mix


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, nargs="+", default=[4])
    ap.add_argument("--headroom", type=float, default=0.10)
    ap.add_argument(
        "--pairs", action="store_true", help="also the card-hours of each kind of pair in the LP's solution"
    )
    args = ap.parse_args()
    from gpusched.model import GpuPlan

    plan = GpuPlan(gpus=tuple(range(GPUS)), slots=(2,) * GPUS)
    for seed in args.seed:
        trace = e1_trace(seed)
        plain = sim.lower_bound_s(trace, plan, [CARD_MIB] * GPUS)
        lp, mix = pairing_lp(trace, GPUS, int(CARD_MIB * (1 - args.headroom)))
        pairing = f"with pairing under {args.headroom:.0%} headroom {lp / 3600:.2f} h"
        print(f"seed {seed}: lower bound {plain / 3600:.2f} h; {pairing}")
        if args.pairs:
            print(format_mix(mix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
