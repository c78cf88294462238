"""When the coordinator's garbage collector runs (control/store/gcpolicy.py): the decision by hand,
and one step for real."""

from __future__ import annotations

import gc

from unicron.control.store.gcpolicy import GcPolicy, GcStep, resident_memory


def test_a_full_collection_first_then_freezes_and_a_full_one_each_period() -> None:
    policy = GcPolicy(freeze_every_s=5.0, full_every_s=3600.0)
    assert policy.due(100.0) is GcStep.FULL  # start-up: collect what it made, then freeze
    policy.frozen_at = policy.full_at = 100.0
    assert policy.due(104.9) is GcStep.NOTHING
    assert policy.due(105.0) is GcStep.FREEZE
    policy.frozen_at = 3695.0
    assert policy.due(3699.9) is GcStep.NOTHING
    assert policy.due(3700.0) is GcStep.FULL  # an hour since the last full collection


def test_a_full_collection_comes_sooner_once_the_resident_memory_has_doubled() -> None:
    """Cycles frozen with what is alive wait for a full collection: once the process's resident
    memory is twice what it was after the last one, it is due (whatever the time), so such
    garbage cannot pile up for an hour."""
    policy = GcPolicy(freeze_every_s=0.1, full_every_s=3600.0, full_growth=2.0)
    policy.frozen_at = policy.full_at = 100.0
    policy.memory_after_full = 50_000
    assert policy.due(100.2, memory=100_000) is GcStep.FREEZE
    assert policy.due(100.2, memory=100_001) is GcStep.FULL


def test_a_step_freezes_what_is_alive_and_a_full_one_unfreezes_first() -> None:
    policy = GcPolicy(freeze_every_s=5.0, full_every_s=3600.0)
    try:
        assert policy.step(0.0) is GcStep.FULL and gc.get_freeze_count() > 0
        assert policy.memory_after_full > 0  # what the next full collection is due by
        kept = [[i] for i in range(1000)]  # made after the freeze
        frozen = gc.get_freeze_count()
        assert policy.step(1.0) is GcStep.NOTHING and gc.get_freeze_count() == frozen
        assert policy.step(5.0) is GcStep.FREEZE and gc.get_freeze_count() >= frozen + len(kept)
        assert policy.step(3600.0) is GcStep.FULL and (policy.full_at, policy.frozen_at) == (3600.0, 3600.0)
    finally:
        gc.unfreeze()


def test_the_resident_memory_is_the_processs_now_not_its_peak() -> None:
    """What the rule reads follows the memory both ways (the peak, ``ru_maxrss``, never falls:
    after each full collection the next would have waited for twice the garbage's peak)."""
    before = resident_memory()
    held = bytearray(64 * 1024 * 1024)  # (written: resident)
    grown = resident_memory()
    del held
    assert grown - before >= 48 * 1024 * 1024 and resident_memory() < grown - 48 * 1024 * 1024
