"""What sharing a card costs, from what the queue measured: the figures ``gpusched
simulate`` needs to answer "two jobs a card, or one?" with more than memory.

A run that had its card to itself tells how much of the card's time its task keeps busy:
the mean of the daemon's utilisation samples while it ran (:func:`alone_utils`, per task
and tier, the median of such runs). The simulator's model (:class:`sim.TierProfile`'s
``util``): a card whose jobs want more than all of its time runs each of them slower by
their total. The same model, run backwards, gives how long a measured run would have taken
alone (:func:`slowdowns`): its run time divided by the time-weighted sharing it saw. A task
with no run alone, or none sampled (fake GPUs report 0 %, and samples are kept 7 days), is
taken as sharing for free, as the simulator did before it knew.

Pure: the caller reads the attempts and the samples (``Store.attempt_spans``,
``Store.gpu_utils``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from msgspec import Struct

from gpusched import predict


class Span(Struct, frozen=True):
    """An attempt's time on its card: ``end`` None while it runs."""

    attempt_id: int
    task: str
    tier: int
    gpu: int
    start: float
    end: float | None
    ok: bool


Kind = tuple[str, int]  # (task, tier)


def alone_utils(
    spans: Sequence[Span], utils_in: Callable[[int, float, float], list[int]]
) -> dict[Kind, float]:
    """Per (task, tier): the median share of its card's time (0-1) that its successful runs
    kept busy when nothing else of ours ran on the card: the mean of ``utils_in(gpu, start,
    end)`` (the utilisation samples taken there then, in %); kinds with no such run left out."""
    seen: dict[Kind, list[float]] = defaultdict(list)
    for a in _alone(spans):
        if a.ok and a.end is not None and (taken := utils_in(a.gpu, a.start, a.end)):
            seen[(a.task, a.tier)].append(sum(taken) / len(taken) / 100)
    return {kind: predict.median(us) for kind, us in seen.items()}


def _alone(spans: Sequence[Span]) -> list[Span]:
    """The spans that no other span on their card overlaps."""
    out = []
    for ordered in _by_gpu(spans).values():
        ends = [s.end if s.end is not None else float("inf") for s in ordered]
        before = float("-inf")  # the latest end of the spans that started earlier
        for i, s in enumerate(ordered):
            after = ordered[i + 1].start if i + 1 < len(ordered) else float("inf")
            if before <= s.start and after >= ends[i]:
                out.append(s)
            before = max(before, ends[i])
    return out


def _by_gpu(spans: Sequence[Span]) -> dict[int, list[Span]]:
    """Each card's spans, in start order."""
    out: dict[int, list[Span]] = defaultdict(list)
    for s in sorted(spans, key=lambda s: s.start):
        out[s.gpu].append(s)
    return out


def slowdowns(spans: Sequence[Span], utils: Mapping[Kind, float]) -> dict[int, float]:
    """Per successful attempt id: how many times longer than alone it ran, by the model and
    the ``utils`` of what shared its card (1.0 where nothing wanted more than the card). One
    sweep a card in start order, keeping the spans that have not ended yet."""
    out: dict[int, float] = {}
    for ordered in _by_gpu(spans).values():
        starts = [s.start for s in ordered]
        earlier: list[Span] = []  # started before the one at hand, maybe still running
        for i, a in enumerate(ordered):
            earlier = [b for b in earlier if b.end is None or b.end > a.start]
            if a.ok and a.end is not None and a.end > a.start:
                later = ordered[i + 1 : bisect_left(starts, a.end)]
                others = [
                    (
                        max(b.start, a.start),
                        a.end if b.end is None else min(b.end, a.end),
                        utils.get((b.task, b.tier), 0.0),
                    )
                    for b in (*earlier, *later)
                ]
                out[a.attempt_id] = _stretch(a.start, a.end, utils.get((a.task, a.tier), 0.0), others)
            earlier.append(a)
    return out


def _stretch(start: float, end: float, mine: float, others: list[tuple[float, float, float]]) -> float:
    """The time-weighted mean over [start, end] of max(1, what the card's jobs wanted): ``mine``
    throughout, and each of ``others`` (``(from, to, util)``, within it) while it ran."""
    moves = sorted([(s, u) for s, _, u in others] + [(e, -u) for _, e, u in others])
    total, at, wanted = 0.0, start, mine
    for t, change in moves:
        total += (t - at) * max(1.0, wanted)
        at, wanted = t, wanted + change
    total += (end - at) * max(1.0, wanted)
    return total / (end - start)
