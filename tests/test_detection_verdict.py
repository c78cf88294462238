"""The detection page's sentence on the hang over long iterations is written from the measured
figures (bench/detection_bench.py: ``long_verdict``), not typed: within the target, over it by
at most a coordinator tick, or missed by more."""

from __future__ import annotations

from bench.detection_bench import long_verdict
from unicron.control.service.service import TICK_S


def measured(median_s: float, max_s: float) -> dict[str, float]:
    return {"median_s": median_s, "max_s": max_s}


def test_the_sentence_follows_the_figures() -> None:
    target = 2.08
    assert long_verdict(measured(1.9, 2.0), target).startswith("detection is within the target")
    within_a_tick = long_verdict(measured(2.14, target + TICK_S * 0.9), target)
    assert "misses the target by at most one tick" in within_a_tick and "+0.06 s" in within_a_tick
    assert "more than a tick" in long_verdict(measured(2.3, 2.5), target)
    assert "not measured" in long_verdict(None, target)
