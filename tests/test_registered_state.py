"""The user's loop under the session (world of one, no agent): objects registered with the session
(an LR scheduler here) are stepped once per optimizer step by the session and saved and restored
with the model; the loader weights each micro-batch so that the gradients after it are the
global batch's mean, which the user's clipping sees; bad use of the loop is refused with the fix
named. The transfer to newcomers is in test_nearest_state, the live runs in every test through
examples/tinygpt (which registers its scheduler and clips)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import unicron.train as ut
from unicron.train import checkpoint


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def train(directory: Path, iterations: int, own_step: bool = False) -> tuple[str, int, float]:
    """Train a linear model for ``iterations`` (resuming from ``directory``); the parameters'
    digest, the scheduler's step and the learning rate at the end."""
    data = torch.linspace(-1, 1, 64 * 4, dtype=torch.float64).reshape(64, 4)
    session = ut.init(iterations=iterations, checkpoint_dir=directory, checkpoint_every=3)
    with session:
        model, optimizer, scheduler = build()
        session.register("scheduler", scheduler)
        loader = session.loader(data, 8, batch_size=4)
        for _ in session.steps(model, optimizer):
            for batch in loader:
                model(batch).pow(2).mean().backward()
            optimizer.step()
            if own_step:
                scheduler.step()  # wrong: the session steps it
            optimizer.zero_grad()
    assert session.digest == checkpoint.digest(model)
    return checkpoint.digest(model), scheduler.last_epoch, optimizer.param_groups[0]["lr"]


def test_the_scheduler_steps_once_per_step_and_resumes_where_it_was(tmp_path: Path) -> None:
    straight = train(tmp_path / "straight", 7)
    assert straight[1:] == (7, 0.1 * 0.5**3)
    train(tmp_path / "resumed", 4)  # saved at step 4 (finish), resumed there
    assert train(tmp_path / "resumed", 7) == straight


def train_scaled(directory: Path, iterations: int) -> tuple[str, float, int]:
    """fp16 autocast with a registered GradScaler whose first scale overflows, so that some
    steps are skipped (inf gradients) and the scale moves both ways; the state's digest, the
    scale and the number of optimizer updates at the end."""
    data = torch.linspace(-1, 1, 64 * 4).reshape(64, 4)
    session = ut.init(iterations=iterations, checkpoint_dir=directory, checkpoint_every=3)
    with session:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**18, growth_interval=2)
        session.register("scaler", scaler)
        loader = session.loader(data, 8, batch_size=4)
        for _ in session.steps(model, optimizer):
            for batch in loader:
                with torch.autocast("cpu", torch.float16):
                    loss = model(batch).pow(2).mean()
                scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    updates = int(optimizer.state[model.weight]["step"])
    return session.digest, scaler.get_scale(), updates


def test_a_registered_grad_scaler_resumes_with_its_scale_and_skipped_steps(tmp_path: Path) -> None:
    straight = train_scaled(tmp_path / "straight", 9)
    assert 0 < straight[2] < 9  # some steps overflowed and were skipped, the others updated
    train_scaled(tmp_path / "resumed", 4)  # saved at step 4 with its scale, resumed there
    assert train_scaled(tmp_path / "resumed", 9) == straight


def test_stepping_a_registered_scheduler_yourself_is_refused(tmp_path: Path) -> None:
    # Refused at the call (train/loopguard.py; an unregistered one too: tests/test_loop_misuse.py).
    with pytest.raises(ut.PortingError, match=r"remove your own scheduler\.step"):
        train(tmp_path, 3, own_step=True)


def test_what_cannot_be_registered_is_refused_with_the_fix() -> None:
    model, optimizer, scheduler = build()
    session = ut.init(iterations=1)
    with pytest.raises(TypeError, match=r"pass them to session\.steps"):
        session.register("model", model)
    with pytest.raises(TypeError, match="has no state_dict"):
        session.register("count", 3)  # type: ignore[arg-type]
    session.register("scheduler", scheduler)
    with pytest.raises(ValueError, match="must be a new identifier"):
        session.register("scheduler", scheduler)
    session.loader(torch.zeros(8, 4, dtype=torch.float64), 4, batch_size=2)
    for _ in session.steps(model, optimizer):
        with pytest.raises(RuntimeError, match="register before"):
            session.register("later", torch.optim.lr_scheduler.StepLR(optimizer, 1))
        break


def test_gradients_are_clipped_to_their_global_norm_before_the_update() -> None:
    torch.manual_seed(0)
    data = torch.randn(8, 4, dtype=torch.float64)
    model = torch.nn.Linear(4, 1).double()
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    session = ut.init(iterations=1)
    with session:
        loader = session.loader(data, 8, batch_size=2, shuffle=False)
        for _ in session.steps(model, optimizer):
            for batch in loader:  # four micro-batches of two, each its mean loss
                (model(batch).pow(2).mean() + 3.0).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            optimizer.step()
    # By hand: the full batch's gradient, scaled to norm 0.01, one SGD step of lr 1.
    twin = torch.nn.Linear(4, 1).double()
    with torch.no_grad():
        for p, value in zip(twin.parameters(), start, strict=True):
            p.copy_(value)
    twin(data).pow(2).mean().backward()
    grads = [p.grad for p in twin.parameters() if p.grad is not None]
    norm = torch.stack([(g * g).sum() for g in grads]).sum().sqrt()
    assert norm > 0.01  # so clipping had work to do
    scale = 0.01 / (norm + 1e-6)  # clip_grad_norm_'s coefficient
    for p, value, g in zip(model.parameters(), start, grads, strict=True):
        torch.testing.assert_close(p.detach(), value - g * scale, rtol=1e-12, atol=1e-14)


def test_short_micro_batches_and_a_short_last_step_still_give_the_step_mean() -> None:
    # 10 samples, 4 per step in micro-batches of 3: each step is a micro-batch of 3 and one of 1
    # (weighted for its size by a hook), and the epoch's last step (drop_last=False) has 2.
    data = torch.linspace(-1, 1, 10 * 4, dtype=torch.float64).reshape(10, 4)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    twin = torch.nn.Linear(4, 1).double()
    twin.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the parameters stay where they are
    seen: list[list[torch.Tensor]] = []
    session = ut.init(iterations=3)
    with session:
        loader = session.loader(data, 4, batch_size=3, shuffle=False, drop_last=False)
        for _ in session.steps(model, optimizer):
            for batch in loader:
                model(batch).pow(2).mean().backward()
            seen.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
            optimizer.step()
            optimizer.zero_grad()
    for step, samples in enumerate((data[0:4], data[4:8], data[8:10])):
        twin.zero_grad()
        twin(samples).pow(2).mean().backward()  # the step's mean loss, by hand
        expected = [p.grad for p in twin.parameters() if p.grad is not None]
        torch.testing.assert_close(seen[step], expected, rtol=1e-12, atol=1e-14)


def test_a_model_wrapped_in_ddp_is_refused_with_the_fix() -> None:
    model, optimizer, _ = build()
    wrapped = torch.nn.parallel.DistributedDataParallel.__new__(torch.nn.parallel.DistributedDataParallel)
    wrapped.__dict__.update(module=model)  # a DDP object without a process group (type is what counts)
    session = ut.init(iterations=1)
    session.loader(torch.zeros(8, 4, dtype=torch.float64), 4, batch_size=2)
    with pytest.raises(TypeError, match=r"pass the model itself \(DDP\(model\)\.module\)"):
        next(session.steps(wrapped, optimizer))


def test_an_optimizer_of_another_model_is_refused_with_the_fix() -> None:
    model, _, _ = build()
    _, optimizer, _ = build()  # made for a second copy of the model: its gradients never reduced
    session = ut.init(iterations=1)
    session.loader(torch.zeros(8, 4, dtype=torch.float64), 4, batch_size=2)
    with pytest.raises(ValueError, match=r"updates 2 tensor\(s\) that are not parameters of the model"):
        next(session.steps(model, optimizer))


def step_in_the_micro_batch_loop(
    loader: ut.Loader, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> None:
    for batch in loader:
        model(batch).sum().backward()
        opt.step()  # DDP's habit without accumulation: before the gradients are reduced


def break_out_of_the_loader(loader: ut.Loader, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for batch in loader:
        model(batch).sum().backward()
        break  # the rest of the step's micro-batches never computed


def iterate_the_loader_twice(loader: ut.Loader, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for _ in range(2):
        for batch in loader:
            model(batch).sum().backward()


@pytest.mark.parametrize(
    ("body", "fix"),
    [
        (step_in_the_micro_batch_loop, "before the loader ran out: call it after"),
        (break_out_of_the_loader, "ended before its micro-batches did"),
        (iterate_the_loader_twice, "iterated twice in one step: iterate it once per step"),
    ],
)
def test_a_loop_that_misuses_the_loader_is_refused_with_the_fix(
    body: Callable[[ut.Loader, torch.nn.Module, torch.optim.Optimizer], None], fix: str
) -> None:
    model, optimizer, _ = build()
    session = ut.init(iterations=2)
    loader = session.loader(torch.ones(8, 4, dtype=torch.float64), 4, batch_size=2)
    with pytest.raises(RuntimeError, match=fix):
        for _ in session.steps(model, optimizer):
            body(loader, model, optimizer)


def test_the_loader_outside_the_steps_or_twice_is_refused_with_the_fix() -> None:
    session = ut.init(iterations=1)
    loader = session.loader(torch.ones(8, 4), 4, batch_size=2)
    with pytest.raises(RuntimeError, match=r"inside `for step in session\.steps"):
        iter(loader)
    with pytest.raises(RuntimeError, match="one loader per session"):
        session.loader(torch.ones(8, 4), 4, batch_size=2)
    with pytest.raises(RuntimeError, match=r"create the loader \(session\.loader"):
        next(ut.init(iterations=1).steps(*build()[:2]))


class Counter:
    """A user's own counter whose state is an object of its own class."""

    def __init__(self) -> None:
        self.seen = Counter.Box()

    class Box:
        pass

    def state_dict(self) -> dict[str, object]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, object]) -> None:
        pass


def test_state_that_a_checkpoint_could_not_load_without_running_code_is_refused() -> None:
    session = ut.init(iterations=1)
    with pytest.raises(TypeError, match=r"return plain values from state_dict\(\) \(.*Unsupported global"):
        session.register("counter", Counter())
