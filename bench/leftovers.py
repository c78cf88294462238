"""Nothing outlives its run: the check at the end of `make test` and `make bench`.

A run marks its environment (``UNICRON_RUN_MARK``) as it begins, so every process it starts
carries the mark, and so do theirs: coordinators, agents, workers, torchrun and torchft
processes, etcd, Slurm steps (sbatch exports the environment), processes in test hosts'
network namespaces. When it ends, a process still carrying the mark outlived it (orphans
reparented to init included, and stopped ones: a SIGSTOPped torchft worker stays stopped
forever). So does a file it added to /dev/shm, or a port its own process still listens on.
What is left is reported with its command line, then ended (SIGCONT, then SIGKILL; a file
removed), so that one leak does not spread to the next run; the run fails.

The shared-memory part compares /dev/shm with how the run found it: on a machine where another
run writes there at the same time it would report that run's files too (CI runs alone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

MARK_VARIABLE = "UNICRON_RUN_MARK"
SHM = Path("/dev/shm")
# Helpers started for the run's own process, which end with it: multiprocessing's (the fork server
# its local clusters and spawned ranks fork from, the resource tracker) and the template its local
# clusters fork their agents' servers from (``localcluster.TEMPLATES``): not left behind by a test.
OWN_HELPERS = (
    b"from multiprocessing.forkserver import",
    b"from multiprocessing.resource_tracker import",
    b"-m\0unicron.control.agent.template\0",
)


def processes_marked(mark: str, exclude: Collection[int] = ()) -> list[int]:
    """Processes whose command line or initial environment holds ``mark``."""
    needle = mark.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in text:
            found.append(int(entry.name))
    return found


def listening_ports(pids: Collection[int] | None = None) -> set[int]:
    """The TCP ports listened on (``pids``: only those of sockets these processes hold)."""
    held = None if pids is None else sockets_of(pids)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and (held is None or int(fields[9]) in held):  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def sockets_of(pids: Collection[int]) -> set[int]:
    """The inodes of the sockets ``pids`` hold open."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # the process ended
        for fd in fds:
            # Each on its own: a descriptor closed meanwhile (the listing's own, when ``pid`` is
            # this process) must not hide the others (it did: no port of this process was seen).
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    return inodes


def shared_memory_files() -> set[str]:
    return {str(p) for p in SHM.rglob("*") if p.is_file()} if SHM.is_dir() else set()


def described(pid: int) -> str:
    """``pid``, its state (``T``: stopped) and its command line, for the report."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} [{state}] {argv.strip()[:300]}"


@dataclass(frozen=True)
class Leftovers:
    processes: list[str]
    listening_ports: list[int]
    shared_memory: list[str]

    def __bool__(self) -> bool:
        return bool(self.processes or self.listening_ports or self.shared_memory)

    def lines(self) -> list[str]:
        return [
            *(f"left running: {p}" for p in self.processes),
            *(f"left listening: port {port}" for port in self.listening_ports),
            *(f"left in shared memory: {f}" for f in self.shared_memory),
        ]


class RunGuard:
    """Marks the run's environment as it is made; :meth:`finish` says what outlived the run."""

    def __init__(self) -> None:
        self.mark = f"{os.getpid()}-{uuid.uuid4().hex}"
        os.environ[MARK_VARIABLE] = self.mark
        self.shared_memory = shared_memory_files()
        self.ports = listening_ports([os.getpid()])

    def outliving(self) -> list[int]:
        """The marked processes but this one and its own multiprocessing helpers."""
        me = os.getpid()
        left = []
        for pid in processes_marked(self.mark, exclude={me}):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # ended, not yet reaped: holds nothing
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == me and any(helper in argv for helper in OWN_HELPERS):
                    continue
                left.append(pid)
        return left

    def finish(self, grace_s: float = 10.0) -> Leftovers:
        """What outlived the run, once ``grace_s`` has passed for processes still ending (a
        stopped cluster's processes are reaped asynchronously); each is then ended."""
        deadline = time.monotonic() + grace_s
        while (left := self.outliving()) and time.monotonic() < deadline:
            time.sleep(0.2)
        found = Leftovers(
            processes=[described(pid) for pid in left],
            listening_ports=sorted(listening_ports([*left, os.getpid()]) - self.ports),
            shared_memory=sorted(shared_memory_files() - self.shared_memory),
        )
        for pid in left:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        for name in found.shared_memory:
            with contextlib.suppress(OSError):
                os.unlink(name)
        return found
