"""What a DDP script ported to the session most often keeps fails with an error that names the
fix (``unicron.train.porting``), not with torch's: ``dist.init_process_group(...)`` left in the
script ("trying to initialize the default process group twice" under torchrun, a missing
``MASTER_ADDR`` under an agent) and a model wrapped in DDP before the session formed its group
("Default process group has not been initialized"). One process, gloo, a world of one, CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo  # before any group, as the session does (docs/pytorch-notes.md)
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import unicron.train as ut
from unicron.core.classify import classify_exception
from unicron.core.taxonomy import ErrorKind
from unicron.core.workerenv import KEYS
from unicron.train import porting
from unicron.train.porting import PortingError

FIX_INIT = r"remove dist\.init_process_group\(\.\.\.\).*docs/training-library\.md, 'Porting a DDP script'"
FIX_DDP = (
    r"remove the DistributedDataParallel wrapper and pass the model itself to "
    r"session\.steps\(model, optimizer\).*docs/training-library\.md, 'Porting a DDP script'"
)
# torchrun's variables for rank 0 of 2: the session would form the group over env://.
TORCHRUN = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}


@pytest.fixture
def no_group() -> Iterator[None]:
    """No default group before the test, none left after it."""
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def own_group() -> None:
    """What the script's leftover line does where it succeeds (under torchrun)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]


def script(session: ut.Session, model: torch.nn.Module) -> None:
    """A port's loop, as docs/training-library.md shows it."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = session.loader(torch.zeros(8, 2), 4, batch_size=2)
    for _ in session.steps(model, optimizer):
        for batch in loader:
            model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    session.close()


@pytest.mark.usefixtures("no_group")
def test_a_group_formed_by_the_script_is_refused_when_the_session_starts() -> None:
    own_group()
    # Under torchrun the session's own init_process_group would fail with torch's "trying to
    # initialize the default process group twice".
    session = ut.Session(TORCHRUN, iterations=1)
    with pytest.raises(PortingError, match=FIX_INIT) as refused:
        script(session, torch.nn.Linear(2, 1))
    assert isinstance(refused.value, ValueError)  # the type torch raised
    # In a world of one too, and with ``with ut.init() as session`` (which starts the session).
    with pytest.raises(PortingError, match=FIX_INIT), ut.Session({}, iterations=1):
        pass


@pytest.mark.usefixtures("no_group")
def test_init_process_group_in_a_worker_of_an_agent_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEYS["task"], "lm")  # the agent's contract: this worker is a task's
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    # Without the guard: "environment variable MASTER_ADDR expected, but not set".
    with pytest.raises(PortingError, match=FIX_INIT):
        dist.init_process_group("gloo")
    with pytest.raises(PortingError, match=FIX_INIT):
        dist.init_process_group(backend="gloo", init_method="env://", rank=0, world_size=1)
    assert not dist.is_initialized()
    # The session's own way (the task's store) is let through.
    own_group()
    assert dist.is_initialized()


@pytest.mark.usefixtures("no_group")
def test_a_model_wrapped_in_ddp_before_the_session_formed_its_group_is_refused_with_the_fix() -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(PortingError, match=FIX_DDP) as refused:
        DistributedDataParallel(model)
    assert "Default process group has not been initialized" in str(refused.value.__cause__)
    # Where the script's DDP line follows ut.init(...): the session forms its group only when
    # its steps begin (and never in a world of one), so the same line fails the same way.
    session = ut.init(iterations=1)
    with pytest.raises(PortingError, match=FIX_DDP):
        script(session, DistributedDataParallel(model))
    session.close()


@pytest.mark.usefixtures("no_group")
def test_ddp_on_a_group_still_works_and_the_wrapped_model_is_refused_by_the_session(tmp_path: Path) -> None:
    """The guard rewords only torch's error: DDP over an existing group is built as before, and
    the session then refuses the wrapper, naming the same fix."""
    own_group()
    wrapped = DistributedDataParallel(torch.nn.Linear(2, 1))
    dist.destroy_process_group()
    session = ut.init(iterations=1, checkpoint_dir=tmp_path)
    refusal = r"pass the model itself \(DDP\(model\)\.module\).*Porting a DDP script"
    with pytest.raises(TypeError, match=refusal):
        script(session, wrapped)
    session.close()
    del wrapped


def test_each_refusal_is_the_programs_own_error() -> None:
    """Forwarded to the coordinator, each is the program's fault (its worker is not retried in
    place, and its node not blamed): no word of them may read as a network or device error."""
    for message in (porting.GROUP_BEFORE_SESSION, porting.INIT_UNDER_AGENT, porting.DDP_WITHOUT_GROUP):
        assert classify_exception(PortingError(message)) == ErrorKind.USER_ERROR, message
