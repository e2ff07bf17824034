"""Two ways timed in turn, in blocks: plain, way, way, plain per round, the way's ratio to plain
taken per round.

A job whose step time follows the host's speed (FSDP2 with two ranks sharing a GPU: on an H100
at 8d31cd5, plain FSDP2 alone drifted from 113.8 to 93.6 ms per step over one run, docs/ddp.md)
cannot be measured by ways timed one after the other: each is timed at the host speed of its
turn. Blocks in turn see the same drift on both sides of each round, and a ratio per round
cancels it; the order plain, way, way, plain cancels a linear drift within the round too.
``bench torch --in-turn N`` and ``scripts/own_model.py --alternate N`` time so.
"""

from __future__ import annotations

import statistics
from typing import Callable, Sequence

from .. import choose, validate

__all__ = ["ORDER", "run_rounds", "reading", "blocks_reading"]

#: One round's blocks, in order.
ORDER = ("plain", "way", "way", "plain")


def run_rounds(block: Callable[[str], float], rounds: int) -> list[tuple[str, float]]:
    """``rounds`` rounds of :data:`ORDER`: ``block(which)`` runs one block of ``which`` ("plain"
    or "way") and returns its ms per step. The blocks, ``(which, ms)``, in the order they ran."""
    rounds = validate.integer(rounds, "rounds", least=1, most=10000)
    return [(which, block(which)) for _ in range(rounds) for which in ORDER]


def reading(plain_ms: list[float], way_ms: list[float]) -> dict:
    """Blocks timed in turn (ms per step of each block, each way's in the order it ran them, two
    of each per round): each way's mean and the standard error over its blocks, and the way's
    ratio to plain taken per round (its two blocks' mean over plain's two), their mean and
    standard error; and each way's blocks as they came (a level that both ways left at once is
    the process's, not the way's)."""
    if len(plain_ms) != len(way_ms) or not plain_ms or len(plain_ms) % 2:
        raise ValueError(f"two blocks of each way per round, not {len(plain_ms)} and {len(way_ms)}")

    spread = choose.standard_error  # each way's blocks, and the rounds' ratios
    ratios = [(way_ms[i] + way_ms[i + 1]) / (plain_ms[i] + plain_ms[i + 1]) for i in range(0, len(plain_ms), 2)]
    return {"plain_ms": statistics.fmean(plain_ms), "plain_standard_error_ms": spread(plain_ms),
            "way_ms": statistics.fmean(way_ms), "way_standard_error_ms": spread(way_ms),
            "ratios": ratios, "ratio": statistics.fmean(ratios), "ratio_standard_error": spread(ratios),
            "plain_blocks_ms": list(plain_ms), "way_blocks_ms": list(way_ms)}


def blocks_reading(blocks: list[tuple[str, float]],
                   agree: Callable[[list[float]], Sequence[float]] | None = None) -> dict:
    """:func:`reading` of the blocks :func:`run_rounds` returned, each block's ms first made the
    ranks' common one by ``agree`` (e.g. the slowest rank's; None: this process's as they are)."""
    ms = [t for _, t in blocks]
    ms = list(agree(ms)) if agree is not None else ms
    plain, way = ([t for (w, _), t in zip(blocks, ms, strict=True) if w == which] for which in ("plain", "way"))
    return reading(plain, way)
