"""A rank whose group failed to form forms the next one with its peers (``peers.form_default_group``).

Torch names the default group, and prefixes its keys in the store, by a counter that only the
default group's destruction resets. A formation that failed left it advanced with nothing to
destroy: the rank's next group was named one ahead of its peers', and every member waited for
the others' addresses until the group's timeout.
"""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta

import torch
import torch.distributed as dist

from unicron.train.peers import form_default_group

from .spawned import run_ranks


def _member(rank: int, port: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    base = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    failed = False
    if rank == 0:  # a member it waited for never came: its group does not form
        try:
            form_default_group("gloo", dist.PrefixStore("g1", base), 0, 2, timedelta(seconds=1))  # type: ignore[attr-defined]
        except Exception:
            failed = True
    else:  # its peer formed a group and left it (destroyed: torch's counter is reset)
        form_default_group("gloo", dist.PrefixStore("g0", base), 0, 1, timedelta(seconds=5))  # type: ignore[attr-defined]
        dist.destroy_process_group()
    base.set(f"ready{rank}", "1")
    base.wait(["ready0", "ready1"])
    try:
        form_default_group("gloo", dist.PrefixStore("g2", base), rank, 2, timedelta(seconds=10))  # type: ignore[attr-defined]
        summed = torch.ones(1)
        dist.all_reduce(summed)
        out.put((rank, (failed, float(summed.item()))))
    except Exception as exc:
        out.put((rank, repr(exc)[:200]))


def test_a_rank_whose_group_failed_to_form_forms_the_next_with_its_peers() -> None:
    assert run_ranks(_member, 2) == {0: (True, 2.0), 1: (False, 2.0)}
