"""A step with no update to make (``train/noupdate.py``): the user's code after the micro-batch
loop runs as usual (a GradScaler's unscale_/step/update, clipping, optimizer.step) and changes
nothing, and the optimizer steps again afterwards."""

from __future__ import annotations

import copy

import torch

from unicron.train.noupdate import NoUpdate


def user_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    """What a mixed-precision loop does once its micro-batches are done."""
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def test_the_code_after_the_micro_batches_changes_nothing_and_the_optimizer_steps_again() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)  # wraps step
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    data = torch.ones(2, 4)

    def backward() -> None:
        with torch.autocast("cpu", torch.float16):
            loss = model(data).pow(2).mean()
        scaler.scale(loss).backward()

    backward()
    user_step(model, optimizer, scaler)  # one real step: the optimizer has state, the scale grew
    scheduler.step()
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict(), scaler.state_dict()))

    backward()  # the step's own gradients, then it turns out to have no update to make
    held = NoUpdate(model, optimizer, {"scaler": scaler, "scheduler": scheduler})
    user_step(model, optimizer, scaler)  # without the zeros, scaler.step asserts
    held.release()
    after = (model.state_dict(), optimizer.state_dict(), scaler.state_dict())
    torch.testing.assert_close(after, before, rtol=0, atol=0)

    backward()
    user_step(model, optimizer, scaler)  # the optimizer steps again, through the scheduler's wrapper
    assert int(optimizer.state[model.weight]["step"]) == 2
    assert getattr(optimizer.step, "_wrapped_by_lr_sched", False)
    assert scaler.get_scale() == 16.0


def test_what_the_loop_changes_by_hand_after_its_step_is_put_back() -> None:
    """A loop that decays its parameters or sets its learning rate by hand after
    optimizer.step() would apply that a second time to state a replica had already carried
    through the step (or save it with a step never completed): parameters, buffers and the
    optimizer's hyper-parameters are put back too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))

    held = NoUpdate(model, optimizer, {})
    optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)  # a decay by hand
        model[0].weight.data.clamp_(-0.1, 0.1)  # through .data, which no version counter sees
    model(torch.randn(8, 4))  # the running statistics move
    for group in optimizer.param_groups:
        group["lr"] *= 0.5  # a schedule by hand
    held.release()
    torch.testing.assert_close((model.state_dict(), optimizer.state_dict()), before, rtol=0, atol=0)
