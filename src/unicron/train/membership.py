"""Rebuilding a task's process group inside the surviving processes.

The recipe (docs/pytorch-notes.md): torch._dynamo is imported before the first process
group is made (else destroy_process_group leaves sockets open); no DDP wrapper holds the group
(the library reduces gradients itself); on a collective error the group is let go after a
garbage collection, its connections cut and its end left to a thread of its own
(``Peers.leave``); the new membership comes from the coordinator through the task's store,
which outlives every worker; the new group uses a fresh key prefix per generation; and the
members check agreement with one small collective of (completed step, state digest, state
fingerprint), taking model and optimizer state from the nearest live replica when they are
behind (live replicas at the same step whose parameters differ take nothing from each other:
``replicacheck.py``).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from unicron.train import checkpoint, connections
from unicron.train.connections import Opened
from unicron.train.data import unclaimed_share
from unicron.train.fingerprint import ReplicasDiverged, as_number, fingerprint, state_tensors, verdict
from unicron.train.peers import Peers, form_default_group
from unicron.train.state import TrainState, digest_parts


def join(
    base: Any, task: str, generation: int, rank: int, world_size: int, timeout: timedelta, backend: str
) -> Opened:
    """Form the generation's default group; the connections it opened."""
    store = dist.PrefixStore(f"{task}/g{generation}", base)  # type: ignore[attr-defined]

    def form() -> None:
        form_default_group(backend, store, rank, world_size, timeout)

    return connections.opened_by(form)[1]


def settle(peers: Peers, ids: list[int], held: list[int]) -> tuple[list[int], list[int]]:
    """Right after a group (re)formed: peers tell each other which of the step's samples
    ``ids`` they already hold (``held``: accumulated in gradients, not yet reduced) and share
    out the rest. Returns this peer's share and how many samples each peer held."""
    holdings = peers.gather_lists(held)
    return unclaimed_share(ids, holdings, peers.rank, len(holdings)), [len(p) for p in holdings]


def digest_number(digest: str) -> int:
    """A state's digest as a number that fits a collective's int64."""
    return int(digest[:15], 16)


@dataclass(frozen=True)
class Agreement:
    step: int  # completed step every member now holds
    copied: bool  # whether state had to be sent
    source: int | None = None  # the rank it came from
    received: bool = False  # whether this member received it (it was behind)
    same_node: bool = False  # whether the source is on this member's node
    rejected: tuple[int, ...] = ()  # sources whose transfer failed its digest check


def _node_number(node: str) -> int:
    return int(hashlib.sha256(node.encode()).hexdigest()[:15], 16)


def agree(
    peers: Peers,
    train: TrainState,
    completed: int,
    node: str = "",
    damage: Callable[[], bool] = lambda: False,
    sending: Callable[[], None] = lambda: None,
    live: bool = False,
) -> Agreement:
    """Make every member hold the same state. Members exchange (completed step, digest of the whole
    state: parameters, optimizer and registered objects; node); those behind take the state that
    most members at the newest step hold (``newest_state``), from the nearest of them: on the same
    node as the first member behind if there is one, else the lowest rank. What arrives is checked
    against the sender's digest before it is loaded; when any receiver rejects it, every member
    moves on to the next source. A member lost meanwhile makes a collective here fail on the others:
    nothing has been loaded then (state is loaded only once every receiver accepted it), so the
    members can agree again in the group that follows. ``damage`` and ``sending``: fault injection,
    True to damage what this member receives; called as the first transfer begins. ``live``: the
    members are live replicas re-formed after a recovery, not a launch: those at the newest step
    whose parameters or optimizer state differ raise ``ReplicasDiverged`` (``unlike``)."""
    world = peers.size
    bits = as_number(fingerprint(state_tensors(train.model, train.optimizer)))
    digest = digest_number(train.digest())
    mine = torch.tensor([completed, digest, _node_number(node), bits], dtype=torch.int64)
    gathered = peers.all_gather(mine)
    steps = [int(g[0]) for g in gathered]
    digests = [int(g[1]) for g in gathered]
    nodes = [int(g[2]) for g in gathered]
    top = max(steps)
    if all(s == top for s in steps) and len(set(digests)) == 1:
        return Agreement(top, False)
    newest = [r for r in range(world) if steps[r] == top]
    # Live replicas trained in lockstep: a difference among them is a fault. At a launch, each
    # rank's own initialization may differ (DDP broadcasts rank 0's): the state is shared out.
    odd = unlike(newest, [int(g[3]) for g in gathered]) if live else frozenset()
    if odd:
        named = ", ".join(str(r) for r in sorted(odd))
        raise ReplicasDiverged(f"rank {named} holds a state unlike its peers' at step {top}", odd)
    held = newest_state(digests, newest)
    current = [r for r in newest if digests[r] == held]
    behind = [r for r in range(world) if r not in current]
    nearest = next((r for r in current if nodes[r] == nodes[behind[0]]), current[0])
    me, rejected = peers.rank, list[int]()
    sending()
    for source in [nearest, *(r for r in current if r != nearest)]:
        if send_state(peers, train, source, digests[source], me in behind, damage):
            return Agreement(top, True, source, me in behind, nodes[source] == nodes[me], tuple(rejected))
        rejected.append(source)
    raise RuntimeError(f"the state from every live replica ({current}) failed its digest check")


def unlike(newest: list[int], bits: list[int]) -> frozenset[int]:
    """The members at the newest step (``newest``, rank order) whose parameters or optimizer
    state differ from the others' (``bits``: each member's fingerprint, as a number): those not
    holding the one most of them hold, every one of them where none is held by more. None is
    trusted to be right, and nothing is copied: copying one would spread a flipped bit, and the
    odd one's gradients may be in the sums since (``replicacheck.py``)."""
    held = [[bits[r]] for r in newest]
    if all(row == held[0] for row in held):
        return frozenset()
    return frozenset(newest[i] for i in verdict(held, fresh=True).odd)  # (the replicas' own rule)


def newest_state(digests: list[int], newest: list[int]) -> int:
    """The digest of the state the members at the newest step (``newest``, in rank order) agree
    on, their parameters and optimizer state alike (``unlike``; registered objects or buffers may
    differ): the one most of them hold; among equals, the lowest rank's."""
    held = [digests[r] for r in newest]
    return max(held, key=held.count)


def send_state(
    peers: Peers,
    train: TrainState,
    source: int,
    digest: int,
    receiving: bool,
    damage: Callable[[], bool] = lambda: False,
) -> bool:
    """Broadcast ``source``'s state; receivers keep it only if it matches ``digest``. Returns
    whether every receiver accepted it (agreed by all members, so that all try the next source
    together); only then do the receivers load it, so a failure on the way loads nothing."""
    if peers.rank == source:
        buffer = io.BytesIO()
        torch.save(train.state_dict(), buffer)
        payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    peers.broadcast(size, source)
    if peers.rank != source:
        payload = torch.empty(int(size[0]), dtype=torch.uint8)
    peers.broadcast(payload, source)
    state = _checked(payload, digest, damage) if receiving else None
    if peers.max(int(receiving and state is None)):
        return False
    if state is not None:
        train.load_state_dict(state)
    return True


def _checked(payload: torch.Tensor, digest: int, damage: Callable[[], bool]) -> dict[str, Any] | None:
    """The state in ``payload`` if it matches ``digest``, else None (torn or damaged)."""
    try:
        state = checkpoint.read(io.BytesIO(payload.numpy().tobytes()))
        if damage():
            first = next(t for t in state["model"].values() if t.is_floating_point())
            first.view(-1)[0] += 1.0
        return state if digest_number(digest_parts(state)) == digest else None
    except Exception:  # torn on the way: as good as a digest mismatch
        return None
