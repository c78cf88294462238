"""How often a job is interrupted as a function of its size, from published figures.

A constant failure rate per node makes a job's interruptions linear in its node count; what
large clusters report is not: Meta's research clusters (Kokolis et al., "Revisiting Reliability
in Large-Scale Machine Learning Research Clusters", HPCA 2025, arXiv 2410.21680) give a mean time
between job interruptions of about 47.7 days at 8 GPUs and 7.9 h at 1,024, and project 1.8 h at
16,384 (their fitted failure model). Those three figures are as they were quoted to us, not
checked here against the paper itself. Their per-GPU rates differ by a factor of 3.6: the best
single per-GPU rate is within 1.91x of each (only just), and misses the trend, that a job ten
times larger is interrupted fewer than ten times as often.

:func:`job_mtbi_hours` fits a power law, ``mtbi = a x gpus^-b``, to the three by least squares
of the logarithms (within 1.76x of each; docs/simulation.md shows the three). A scenario whose
trace says ``rate: published`` fails each node at the rate that gives its whole cluster the
fitted job interruption rate (:func:`node_mtbf_hours`): one task on every GPU is interrupted as
often as the published figures say a job that large is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (GPUs in the job, mean hours between its interruptions): arXiv 2410.21680, as quoted above.
PUBLISHED: tuple[tuple[int, float], ...] = ((8, 47.7 * 24), (1024, 7.9), (16384, 1.8))


@dataclass(frozen=True)
class PowerLaw:
    """``mtbi(gpus) = scale x gpus^-exponent`` hours."""

    scale: float
    exponent: float

    def __call__(self, gpus: int) -> float:
        return self.scale * math.pow(gpus, -self.exponent)


def fit(points: tuple[tuple[int, float], ...] = PUBLISHED) -> PowerLaw:
    """The least-squares line through ``(log gpus, log hours)``."""
    xs = [math.log(g) for g, _ in points]
    ys = [math.log(h) for _, h in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return PowerLaw(math.exp(my - slope * mx), -slope)


FIT = fit()


def job_mtbi_hours(gpus: int) -> float:
    """Mean hours between interruptions of a job on ``gpus`` GPUs, by the fitted power law."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: a job has at least one GPU")
    return FIT(gpus)


def node_mtbf_hours(nodes: int, gpus_per_node: int) -> float:
    """The per-node mean time between failures that interrupts a job spanning the whole cluster
    (``nodes`` x ``gpus_per_node`` GPUs) at the fitted rate: each of the nodes fails independently,
    so the cluster fails ``nodes`` times as often as one node."""
    return job_mtbi_hours(nodes * gpus_per_node) * nodes
