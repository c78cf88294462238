"""What the loop under ``session.steps`` must not do because its result would depend on the
number of workers or on a failure is refused with a ``PortingError`` naming the fix
(``train/loopguard.py``), and the loss a loop prints is the step's, the same at any world size
(``session.metric``, ``train/metric.py``).

Each misuse was first run without the guard at one worker and at two (gloo, float64, the
variants of ``loop`` below): ``zero_grad`` inside ``for batch in loader:`` trained on the last
micro-batch of each step at one worker and exactly at two (one micro-batch each); a second
backward per micro-batch was kept at one worker and lost at two; gradients never cleared,
clipped inside the loop, parameters changed inside it and a scheduler stepped inside it all gave
different parameters at one worker and at two; a scheduler stepped by hand once per step was
equal at both but never saved; the last micro-batch's loss differed with the world size. Each
test below keeps the misuse, now refused (``test_misuse_is_refused_at_one_worker_and_at_two``
at both world sizes), and the right way beside it, which trains."""

from __future__ import annotations

import copy
import io
import math
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import unicron.train as ut
from unicron.core.classify import classify_exception
from unicron.core.taxonomy import ErrorKind
from unicron.train import loopguard, metric
from unicron.train.loopguard import LoopGuard
from unicron.train.porting import PortingError

from .spawned import run_ranks

DATA = torch.linspace(-1, 1, 32 * 3, dtype=torch.float64).reshape(32, 3)
GLOBAL_BATCH, MICRO_BATCH = 4, 2  # two micro-batches at one worker, one each at two


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


def loss_of(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).pow(2).mean()


def loop(variant: str, iterations: int = 3) -> dict[str, Any]:
    """A port's loop (docs/training-library.md) with one misuse, or none (``right``); the final
    parameters, the loss the loop computed last in each step and the steps' mean loss."""
    model, optimizer = build()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    last: list[float] = []
    means: list[float] = []
    with ut.init(iterations=iterations) as session:
        losses = session.metric("loss")
        loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH, shuffle=False)
        for _ in session.steps(model, optimizer):
            for batch in loader:
                if variant == "zero_grad_in_loop":
                    optimizer.zero_grad()  # DDP's habit, before each backward
                loss = loss_of(model, batch)
                if variant == "backward_twice":
                    (loss / 2).backward(retain_graph=True)
                    (loss / 2).backward()
                else:
                    loss.backward()
                losses.add(loss)
                if variant == "clip_in_loop":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                if variant == "scheduler_in_loop":
                    scheduler.step()
                if variant == "parameters_in_loop":
                    with torch.no_grad():
                        model[0].weight.mul_(0.99)
            last.append(loss.item())  # one worker's last micro-batch: not the step's loss
            means.append(losses.value)
            optimizer.step()
            if variant == "scheduler_by_hand":
                scheduler.step()
            if variant != "no_zero_grad":
                optimizer.zero_grad()
    params = [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]
    return {"params": params, "last": last, "means": means}


MISUSES = {
    "zero_grad_in_loop": r"optimizer\.zero_grad\(\) inside `for batch in loader:`.*after optimizer\.step\(\)",
    "no_zero_grad": r"begin with gradients left in \.grad.*Call optimizer\.zero_grad\(\) once per step",
    "clip_in_loop": r"gradients changed between backward passes.*Clip, unscale or change gradients after",
    "backward_twice": r"a second backward for one micro-batch.*Call backward once per micro-batch",
    "scheduler_in_loop": r"stepped by hand, not registered.*session\.register\('scheduler', scheduler\)",
    "scheduler_by_hand": r"stepped by hand, not registered.*remove your own scheduler\.step\(\) call",
    "parameters_in_loop": r"parameters changed inside `for batch in loader:`.*after optimizer\.step\(\)",
}


def outcome(variant: str) -> dict[str, Any]:
    """``loop(variant)``, or the refusal's message."""
    try:
        return loop(variant)
    except PortingError as exc:
        return {"refused": str(exc)}


def _rank(rank: int, port: int, out: Any, ports: list[int], variants: list[str]) -> None:
    """A rank of two under torchrun's variables (the session forms the gloo group over them)."""
    os.environ.update(TORCHELASTIC_RUN_ID="misuse", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    results = {}
    for variant, own in zip(variants, ports, strict=True):
        os.environ["MASTER_PORT"] = str(own)  # a fresh rendezvous per session
        results[variant] = outcome(variant)
    out.put((rank, results))


@pytest.mark.timeout(180)
def test_misuse_is_refused_at_one_worker_and_at_two() -> None:
    """Refused at both world sizes, so no world size trains it silently; the right loop trains
    the same at both (up to float64 rounding), and its mean loss agrees between the two where
    the last micro-batch's loss, printed as if it were the step's, does not."""
    from unicron.control.launch.localcluster import free_port

    variants = ["right", *MISUSES]
    alone = {variant: outcome(variant) for variant in variants}
    pair = run_ranks(_rank, 2, [free_port() for _ in variants], variants)
    for variant, fix in MISUSES.items():
        for results in (alone, pair[0], pair[1]):
            assert re.search(fix, results[variant].get("refused", "")), (variant, results[variant])
    one, two = alone["right"], pair[0]["right"]
    for key in ("params", "means"):  # the same state and mean loss on both ranks
        assert pair[1]["right"][key] == two[key]
    for a, b in zip(one["params"], two["params"], strict=True):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
    assert one["means"] == pytest.approx(two["means"], rel=1e-12)
    # What printing loss.item() shows: another number at each world size, and on each rank.
    assert one["last"] != pytest.approx(two["last"], rel=1e-6)
    assert two["last"] != pytest.approx(pair[1]["right"]["last"], rel=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda model, optimizer: optimizer.zero_grad(),
        lambda model, optimizer: optimizer.zero_grad(set_to_none=False),
        lambda model, optimizer: model.zero_grad(),
    ],
    ids=["optimizer", "optimizer-in-place", "model"],
)
def test_zero_grad_inside_the_loop_is_refused_where_it_is_called(
    call: Callable[[torch.nn.Module, torch.optim.Optimizer], None],
) -> None:
    """Even where it would do no harm (one micro-batch per step here): it would at another world
    size, so it is refused at every one."""
    model, optimizer = build()
    session = ut.init(iterations=2)
    loader = session.loader(DATA, GLOBAL_BATCH, batch_size=GLOBAL_BATCH)
    with pytest.raises(PortingError, match=r"zero_grad\(\) inside `for batch in loader:`"):
        for _ in session.steps(model, optimizer):
            for batch in loader:
                loss_of(model, batch).backward()
                call(model, optimizer)
    session.close()
    # Once the loop has ended, the optimizer and the model are as they were.
    assert "zero_grad" not in optimizer.__dict__ and "zero_grad" not in model.__dict__
    model(DATA).sum().backward()
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_a_copy_of_the_model_made_inside_the_loop_is_its_own() -> None:
    """An EMA model deep-copied (or a model pickled) while the loop runs carries its class's
    plain zero_grad, bound to the copy: it clears the copy's gradients, not the model's."""
    model, optimizer = build()
    with ut.init(iterations=1) as session:
        loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH)
        for _ in session.steps(model, optimizer):
            for batch in loader:
                loss_of(model, batch).backward()
                twin = copy.deepcopy(model)
                twin.zero_grad()  # the copy's, inside the loop: not refused
                assert all(p.grad is None for p in twin.parameters())
                assert all(p.grad is not None for p in model.parameters())
                buffer = io.BytesIO()
                torch.save(model, buffer)
                buffer.seek(0)
                read = torch.load(buffer, weights_only=False)
                read.zero_grad()
                assert all(p.grad is not None for p in model.parameters())
            optimizer.step()
            optimizer.zero_grad()


def train(
    body: Callable[[ut.Loader, torch.nn.Module, torch.optim.Optimizer], None], steps: int = 3
) -> list[float]:
    """Run ``body`` once per step (it iterates the loader); the final parameters."""
    model, optimizer = build()
    with ut.init(iterations=steps) as session:
        loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH, shuffle=False)
        for _ in session.steps(model, optimizer):
            body(loader, model, optimizer)
    return [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]


def right(loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for batch in loader:
        loss_of(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_where_gradients_may_be_cleared() -> None:
    """Before the micro-batches, after the step, or by hand (set to None, or zeros in place)."""

    def at_the_top(loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()
        for batch in loader:
            loss_of(model, batch).backward()
        optimizer.step()

    def to_none_by_hand(loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for batch in loader:
            loss_of(model, batch).backward()
        optimizer.step()
        for p in model.parameters():
            p.grad = None

    def zeros_by_hand(loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for batch in loader:
            loss_of(model, batch).backward()
        optimizer.step()
        for p in model.parameters():
            assert p.grad is not None
            p.grad.zero_()

    expected = train(right)
    for body in (at_the_top, to_none_by_hand, zeros_by_hand):
        assert train(body) == expected, body.__name__


def test_the_leftover_check_scans_only_where_no_zero_grad_was_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check costs nothing per step in a loop that calls zero_grad: the gradients are looked
    at only at its first step (nothing called yet); a loop that clears them by hand pays a scan."""
    scans: list[int] = []
    original = LoopGuard._cleared

    def counted(self: LoopGuard) -> bool:
        scans.append(1)
        return original(self)

    monkeypatch.setattr(LoopGuard, "_cleared", counted)
    train(right, steps=5)
    assert len(scans) == 1


def test_gradients_left_from_a_backward_before_the_steps_are_refused() -> None:
    model, optimizer = build()
    loss_of(model, DATA).backward()  # a check of the script's own, before training
    session = ut.init(iterations=1)
    loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH)
    with pytest.raises(PortingError, match=r"begin with gradients left in \.grad"):
        for _ in session.steps(model, optimizer):
            right(loader, model, optimizer)
    session.close()


def scale_before_backward(
    loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    for batch in loader:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(0.5)  # a decay of the accumulated gradients, by hand
        loss_of(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad()


def clear_by_hand_in_the_loop(
    loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    for batch in loader:
        for p in model.parameters():
            p.grad = None
        loss_of(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad()


def backward_before_the_loader(
    loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    loss_of(model, DATA[:2]).backward()  # a loss of the script's own data
    right(loader, model, optimizer)


def backward_after_the_loader(
    loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    for batch in loader:
        loss_of(model, batch).backward()
    (0.1 * model[0].weight.pow(2).sum()).backward()  # a penalty added after the reduction
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize(
    ("body", "fix"),
    [
        (scale_before_backward, r"gradients changed between backward passes"),
        (clear_by_hand_in_the_loop, r"gradients changed between backward passes"),
        (backward_before_the_loader, r"a backward inside session\.steps\(\.\.\.\) but outside `for batch in"),
        (backward_after_the_loader, r"a backward inside session\.steps\(\.\.\.\) but outside `for batch in"),
    ],
)
def test_gradients_made_or_changed_outside_the_micro_batches_are_refused(
    body: Callable[[ut.Loader, torch.nn.Module, torch.optim.Optimizer], None], fix: str
) -> None:
    with pytest.raises(PortingError, match=fix):
        train(body)


def test_parameters_updated_outside_the_sessions_optimizer_are_refused() -> None:
    def own_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model, _ = build()
        head = list(model[2].parameters())
        rest = [p for p in model.parameters() if all(p is not h for h in head)]
        return model, torch.optim.SGD(rest, lr=0.5)  # the head is left to something else

    model, optimizer = own_optimizer()
    other = torch.optim.SGD(model[2].parameters(), lr=0.5)
    with ut.init(iterations=2) as session:
        loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH)
        with pytest.raises(PortingError, match=r"2 parameter\(s\) of the model that the optimizer"):
            for _ in session.steps(model, optimizer):
                for batch in loader:
                    loss_of(model, batch).backward()
                optimizer.step()
                other.step()
                optimizer.zero_grad()
                other.zero_grad()
    # Parameters outside the optimizer that nothing changes (or frozen ones) are fine.
    for frozen in (False, True):
        model, optimizer = own_optimizer()
        model[2].requires_grad_(not frozen)
        with ut.init(iterations=2) as session:
            loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH)
            for _ in session.steps(model, optimizer):
                right(loader, model, optimizer)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_what_autograd_itself_does_is_followed_not_refused() -> None:
    """A backward with create_graph=True (a gradient penalty) replaces .grad instead of adding
    in place, and checkpointed activations run a backward of their own: both train as without."""
    from torch.utils.checkpoint import checkpoint

    def penalty(loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        for batch in loader:
            loss = loss_of(model, batch)
            (grad,) = torch.autograd.grad(loss, model[0].weight, create_graph=True)
            (loss + 0.01 * grad.pow(2).sum()).backward(create_graph=True)
        optimizer.step()
        optimizer.zero_grad()

    def checkpointed(reentrant: bool) -> Callable[[ut.Loader, torch.nn.Module, torch.optim.Optimizer], None]:
        def body(loader: ut.Loader, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
            for batch in loader:
                hidden = checkpoint(model[:2], batch.requires_grad_(), use_reentrant=reentrant)
                model[2](hidden).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

        return body

    train(penalty)
    expected = train(right)
    for reentrant in (False, True):
        assert train(checkpointed(reentrant)) == pytest.approx(expected, rel=1e-12)


def test_schedulers_are_stepped_by_the_session_and_refused_by_hand() -> None:
    """A registered SequentialLR (whose parts are not registered) is stepped by the session; a
    registered ReduceLROnPlateau is stepped by the loop after its micro-batches, with the step's
    mean loss; a scheduler of another optimizer is none of the session's business."""

    def run(step_by_hand: str) -> float:
        model, optimizer = build()
        warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=2)
        decay = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
        sequence = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, decay], milestones=[2])
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.1)
        another = torch.optim.SGD([torch.zeros(1, requires_grad=True)])
        elsewhere = torch.optim.lr_scheduler.StepLR(another, 1)
        with ut.init(iterations=4) as session:
            session.register("sequence", sequence)
            session.register("plateau", plateau)
            losses = session.metric("loss")
            loader = session.loader(DATA, GLOBAL_BATCH, batch_size=MICRO_BATCH)
            for _ in session.steps(model, optimizer):
                for batch in loader:
                    loss = loss_of(model, batch)
                    loss.backward()
                    losses.add(loss)
                    if step_by_hand == "plateau-in-loop":
                        plateau.step(loss.item())
                optimizer.step()
                optimizer.zero_grad()
                plateau.step(losses.value)
                another.step()
                elsewhere.step()
                if step_by_hand == "sequence":
                    sequence.step()
        assert sequence.last_epoch == 4
        return float(optimizer.param_groups[0]["lr"])

    assert run("") > 0
    with pytest.raises(PortingError, match=r"the scheduler registered as 'sequence' stepped by hand"):
        run("sequence")
    with pytest.raises(PortingError, match=r"ReduceLROnPlateau registered as 'plateau' stepped inside"):
        run("plateau-in-loop")


def test_the_steps_mean_loss_counts_each_sample_once_and_is_refused_where_it_cannot_be_known() -> None:
    """Micro-batches of 2, 2 and 1 (a step of 5): each counts by its samples, as the gradients."""
    model, optimizer = build()
    with ut.init(iterations=2) as session:
        losses = session.metric("loss")
        assert math.isnan(losses.value)  # no step yet
        loader = session.loader(DATA, 5, batch_size=2, shuffle=False)
        with pytest.raises(PortingError, match=r"loss\.add\(\.\.\.\) outside `for batch in loader:`"):
            losses.add(1.0)
        for step in session.steps(model, optimizer):
            expected = loss_of(model, DATA[(step - 1) * 5 : step * 5]).item()  # the step's samples
            for batch in loader:
                loss = loss_of(model, batch)
                loss.backward()
                losses.add(loss)
                if step == 2:
                    with pytest.raises(PortingError, match=r"loss\.add\(\.\.\.\) twice for one micro-batch"):
                        losses.add(loss)
                    with pytest.raises(PortingError, match=r"loss\.value read inside"):
                        _ = losses.value
            assert losses.value == pytest.approx(expected, rel=1e-12)
            optimizer.step()
            optimizer.zero_grad()
        with pytest.raises(RuntimeError, match="declare it before"):
            session.metric("late")


def test_each_refusal_is_the_programs_own_error() -> None:
    """Forwarded to the coordinator, each is the program's fault: not retried, its node not blamed."""
    messages = [
        value.format(call="optimizer.zero_grad()", count=1, name="x")
        for name, value in vars(loopguard).items()
        if name.isupper() and isinstance(value, str)
    ]
    messages += [m.format(name="loss") for m in (metric.ADD_OUTSIDE, metric.ADD_TWICE, metric.READ_EARLY)]
    assert len(messages) >= 10
    for message in messages:
        assert classify_exception(PortingError(message)) == ErrorKind.USER_ERROR, message
