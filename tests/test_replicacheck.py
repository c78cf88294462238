"""Replicas hold the same state (``train/replicacheck.py``): what the check sees, and what follows a
mismatch, as values; the incident a mended replica is, through the coordinator stepped by hand.
End to end (a flipped bit mended in place, two replicas that differ relaunched from their
checkpoint, both ending exact) it runs in ``test_numerics.py``'s live test, on that cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from unicron.core.livespecs import FaultSpec, RunSpec
from unicron.core.protocol import NumericalReport
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.core.tiers import Tier
from unicron.train.faults import FaultInjector
from unicron.train.fingerprint import ReplicasDiverged, fingerprint, state_tensors, verdict
from unicron.train.membership import newest_state, unlike
from unicron.train.replicacheck import OFFERED, StateUnlike, alike, offer
from unicron.train.replicastep import ReplicaStep
from unicron.train.steploop import StepLoop
from unicron.train.sumtest import SumTest

SAME_WIDTH = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def flipped(tensor: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    out = tensor.clone()
    width = 8 * out.element_size()
    out.view(SAME_WIDTH[out.element_size()])[index] ^= (1 << bit) - ((1 << width) if bit == width - 1 else 0)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size", [1, 3, 8, 1001])
def test_any_flipped_bit_changes_the_fingerprint(dtype: torch.dtype, size: int) -> None:
    """The sums are of whole 64-bit words where the bytes allow, else of the values' own width
    (an odd count of 32-bit values, half precision): one flipped bit shows either way."""
    tensor = torch.randn(size, dtype=torch.float64, generator=torch.Generator().manual_seed(size)).to(dtype)
    base = fingerprint([tensor])
    for bit in range(8 * tensor.element_size()):
        assert not torch.equal(fingerprint([flipped(tensor, size // 2, bit)]), base), bit
    assert torch.equal(fingerprint([tensor.clone()]), base)


def test_the_state_checked_is_the_parameters_and_the_optimizers_tensors() -> None:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    tensors = state_tensors(model, optimizer)
    # weight, bias; then per parameter its step, exp_avg, exp_avg_sq (by key)
    assert len(tensors) == 2 + 2 * 3
    before = fingerprint(tensors)
    moments = optimizer.state[model.bias]
    moments["exp_avg"] = flipped(moments["exp_avg"], 0, 0)  # (a change no norm would see)
    assert not torch.equal(fingerprint(state_tensors(model, optimizer)), before)


def test_the_parameters_are_compared_in_the_sum_itself_any_difference_seen() -> None:
    """Each rank adds pieces of its fingerprint and their squares to the step's summed buffer:
    all alike only where every rank offered the same, whichever tensor or bit differs."""
    rng = torch.Generator().manual_seed(0)
    base = torch.randint(-(2**62), 2**62, (5,), generator=rng)
    same = [offer(base) for _ in range(3)]
    assert alike(torch.stack(same).sum(0).tolist())
    for index in range(5):
        for bit in (0, 15, 16, 31, 47, 63):
            other = base.clone()
            other[index] ^= (1 << bit) - ((1 << 64) if bit == 63 else 0)
            summed = torch.stack([*same[:2], offer(other)]).sum(0)
            assert not alike(summed.tolist()), (index, bit)
    assert len(same[0]) == OFFERED


def test_an_odd_replica_takes_the_majoritys_state_only_where_nothing_of_it_spread() -> None:
    same, odd = [1, 2, 3], [1, 2, 4]
    found = verdict([same, same, odd, same], fresh=True)
    assert (found.odd, found.source) == (frozenset({2}), 0) and "rank 2" in found.why
    assert verdict([odd, same, same], fresh=True).source == 1  # the majority's lowest rank
    # Steps since they were last alike: the odd replica's gradients are in every sum since.
    late = verdict([same, same, odd], fresh=False)
    assert (late.odd, late.source) == (frozenset({2}), None) and "last alike" in late.why
    # Two replicas, or no majority: nothing tells which is right.
    assert verdict([same, odd], fresh=True).source is None
    assert verdict([same, same, odd, odd], fresh=True).odd == frozenset(range(4))


def test_a_regrouped_task_copies_no_state_that_its_replicas_disagree_on() -> None:
    """``membership.agree`` after a recovery: members at the newest step whose parameters or
    optimizer state differ are named (none is copied: the task goes back to its checkpoint);
    where only buffers or registered objects differ, the state most members hold is taken."""
    assert unlike([0, 1, 2, 3], [7, 5, 5, 5]) == frozenset({0})  # (the lowest rank's flipped)
    assert unlike([0, 2], [7, 5, 7]) == frozenset()  # (rank 1 is behind: not compared)
    assert unlike([0, 1], [7, 5]) == frozenset({0, 1})  # no majority
    assert newest_state([7, 5, 5, 5], [0, 1, 2, 3]) == 5
    assert newest_state([7, 5, 9], [0, 2]) == 7  # among equals, the lowest rank's


def test_the_flip_fault_flips_one_bit_of_the_first_parameter_after_the_update() -> None:
    fault = FaultSpec.model_validate({"action": "flip_param", "rank": 0, "step": 4, "bit": 31})
    sent: list[Any] = []
    injector = FaultInjector([fault], 0, 1, sent.append, "lm")
    param = torch.nn.Parameter(torch.tensor([1.5, 2.0]))
    injector.step_started(4)
    assert not sent  # (not at the step's start: after its update)
    injector.updated(4, [param])
    assert param.tolist() == [-1.5, 2.0] and len(sent) == 1  # the sign bit
    injector.updated(4, [param])  # once
    assert param.tolist() == [-1.5, 2.0]


def test_the_check_interval_is_bounded_and_a_flip_is_refused_where_no_check_covers_it() -> None:
    assert RunSpec.model_validate({"program": ["x"], "iterations": 9}).digest_every == 1
    with pytest.raises(ValidationError, match="digest_every"):
        RunSpec.model_validate({"program": ["x"], "iterations": 9, "digest_every": -1})
    flip = [{"action": "flip_param", "rank": 0, "step": 3}]
    with pytest.raises(ValidationError, match=r"flip_param.*run\.replica_size 1"):
        RunSpec.model_validate({"program": ["x"], "iterations": 9, "replica_size": 2, "faults": flip})


def test_the_kinds_mend_in_place_or_go_back_to_the_checkpoint() -> None:
    assert TAXONOMY[ErrorKind.REPLICA_REPAIRED].tier is Tier.REATTEMPT
    assert TAXONOMY[ErrorKind.REPLICAS_DIVERGED].tier is Tier.FROM_CHECKPOINT


def test_a_mended_replica_is_an_incident_naming_it_closed_at_once(make: Any) -> None:
    """The coordinator stepped by hand (``tests/fakecluster.py``): nothing is ordered."""
    cluster = make()
    generation, since = cluster.c.store.get_task("lm").generation, len(cluster.orders)
    node, _ = cluster.running[("lm", generation, 1)]
    report = NumericalReport(
        task="lm", generation=generation, rank=1, step=3, verdict="odd_replica", outcome="repaired",
        ranks=[1], why="rank 1 holds a state unlike the 3 others'", time=cluster.clock.now, spent_s=0.01,
    )  # fmt: skip
    cluster.beat(node, report)
    (incident,) = cluster.events("incident")
    assert (incident["kind"], incident["culprit"], incident["step"]) == ("replica_repaired", 1, 2)
    assert incident["action"] == "reattempt in place" and "digests" in incident["ladder"]
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered" and outcome["resumed_step"] == 3
    assert cluster.orders[since:] == []


def one_loops_check(world: int = 3, every: int = 1, agreed: int = 0) -> tuple[ReplicaStep, list[Any]]:
    """A loop's check over a hand-built session (no group: any collective would fail)."""
    traced: list[Any] = []
    session = SimpleNamespace(
        step=4, agreed_step=agreed, world_size=world, extras={}, groups=SimpleNamespace(peers=None),
        trace=lambda what, **fields: traced.append((what, fields)),
    )  # fmt: skip
    model = torch.nn.Linear(2, 1)
    return ReplicaStep(session, model, torch.optim.SGD(model.parameters(), lr=0.1), every), traced  # type: ignore[arg-type]


def test_a_loop_compares_in_the_sums_it_is_due_in_and_judges_them() -> None:
    check, _ = one_loops_check(every=2)
    assert [check.compared(s) for s in (5, 6)] == [False, True]
    assert not one_loops_check(world=1)[0].compared(6)  # (alone: nothing to compare with)
    check.take(5)
    assert check.offered == 0 and check.offer(torch.device("cpu")) == []
    check.take(6)
    (mine,) = check.offer(torch.device("cpu"))
    assert check.offered == OFFERED == len(mine)
    check.judge((mine * 3).tolist(), 6)  # three ranks offered the same
    assert check.alike_step == 6
    other = offer(check.summed + 1)  # type: ignore[operator]
    with pytest.raises(StateUnlike):
        check.judge((mine * 2 + other).tolist(), 7)
    assert check.alike_step == 6


def test_replicas_unlike_again_in_a_step_are_not_mended_twice_and_one_regrouped_is_not_checked() -> None:
    check, traced = one_loops_check()
    with pytest.raises(ReplicasDiverged, match="again in step 9"):
        check.mend(9, last=False, again=True)  # (before any collective: every rank knows)
    assert traced[0][0] == "replicas_diverged" and traced[0][1]["step"] == 9
    # A group re-formed at this boundary agreed on one state: no collective is issued.
    regrouped, _ = one_loops_check(agreed=9)
    regrouped.check_at_end(9, due=True, abandoned=None)


def test_the_sums_norm_is_taken_only_where_it_is_tested() -> None:
    """With the gradient test off and the replicas' check on, no norm is read (``_check_sum``)."""
    check, _ = one_loops_check()
    check.take(1)
    (mine,) = check.offer(torch.device("cpu"))
    loop = SimpleNamespace(
        _offers_limit=lambda: False, replicas=check, it=SimpleNamespace(step=1), checking=False,
        tests=SumTest(10, 10.0, [], {}),
    )  # fmt: skip

    def unread() -> float:
        raise AssertionError("the norm was read")

    StepLoop._check_sum(loop, mine * 2, unread)  # type: ignore[arg-type]
    assert check.alike_step == 1
