"""The cost model: WAF and the plan score.

- WAF: F_t(x) = weight_t * A_t(x) for a usable x at or above the task's minimum, else 0.
- Plan score: sum_t F_t(x'_t) * D_run - sum_{t changed or hit} F_t(x_t) * D_trans(t, x_t -> x'_t).
- D_run: expected time until the next failure. Failures arrive at rate nodes / node MTBF, so the
  plan's expected run time shrinks as the cluster grows.
"""

from __future__ import annotations

import numpy as np

from unicron.planning.throughput import FloatArray

HOUR = 3600.0


def run_duration_s(nodes: int, node_mtbf_hours: float) -> float:
    """Expected seconds until the next node failure among ``nodes`` independent nodes."""
    return node_mtbf_hours * HOUR / max(nodes, 1)


def waf(weight: float, rate: FloatArray) -> FloatArray:
    """Weighted achieved FLOP/s; rate is already 0 at unusable counts."""
    return np.asarray(weight * rate, dtype=np.float64)


def option_score(
    waf_after: FloatArray,
    waf_before: float,
    run_s: float,
    transition_s: FloatArray,
    changed: np.ndarray,
) -> FloatArray:
    """One task's contribution to the plan score for each candidate count."""
    return np.asarray(waf_after * run_s - np.where(changed, waf_before * transition_s, 0.0), dtype=np.float64)
