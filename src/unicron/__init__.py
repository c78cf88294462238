"""Unicron: a self-healing workload manager for LLM training on shared GPU clusters.

Importing the package is cheap on purpose: nothing here imports torch, so the planner and the
command line start fast. Worker-side code lives in ``unicron.train`` and is imported explicitly.
"""

__version__ = "0.1.0"
