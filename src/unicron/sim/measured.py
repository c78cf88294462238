"""torchft's costs as this repository's benchmarks measured them with torchft itself: the
detection of a crash and of a hang and the crashed group's heal (docs/bench/recovery.json,
bench/torchft_recovery.py) and its failure-free efficiency (docs/bench/overhead.json, gpt-10m at
its most workers). Written by bench/simulation_docs.py from those files (`make bench`); not
edited by hand: tests/test_sim_measured.py checks it against them."""

TORCHFT: dict[str, float] = {
    "crash_detection_s": 5.016,
    "efficiency": 0.9355,
    "hang_detection_s": 5.0,
    "heal_s": 5.071,
}
