"""The chaos soak (``python -m bench.chaos``): every fault at once, for long, with nothing lost.

``schedule.py`` plans it from a seed, ``inject.py`` strikes the cluster, ``soak.py`` runs it,
``check.py`` checks exactness, the ledger and leaks, ``report.py`` writes docs/bench/chaos.json
and docs/reliability.md (``make soak``). A short version, every kind of fault at least once, runs in
``make test`` (tests/test_chaos.py).
"""
