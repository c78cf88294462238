"""A real Slurm cluster on test hosts: slurmctld on one host, one slurmd per node host.

Debian's ``slurm-wlm`` (22.05) and ``munge``, as ``make test`` installs them. Every daemon runs
in a test host's network namespace (``nsenter --net``: unlike ``ip netns exec`` it keeps the
machine's /sys, where slurmd looks for cgroups), each slurmd under its own node name (``-N``) and
address (``NodeAddr``), with ``gpus`` stand-in GPUs when asked (:func:`gres_conf`). munged runs
with a key and socket of the harness's own; slurm.conf is found through ``SLURM_CONF``, so
nothing of the machine's own Slurm or munge set-up is used. The Slurm commands (sbatch,
scontrol) run on the controller's host, never from the machine's own namespace.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path
from types import TracebackType

from unicron.control.launch.testhosts import Host, TestHosts

DAEMONS = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "munged", "nsenter")


def unavailable() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (make test installs slurm-wlm and munge as root)"
    return None


def slurm_conf(root: Path, controller: Host, nodes: dict[str, Host], cpus: int, gpus: int = 0) -> str:
    """``gpus``: each node's GPUs, a ``gpu`` GRES (stand-ins: see :func:`gres_conf`)."""
    names = ",".join(nodes)
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    lines = [
        "ClusterName=unicrontest",
        f"SlurmctldHost={socket.gethostname()}({controller.address})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge.socket'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "MailProg=/bin/true",
        "KillWait=10",
        "MinJobAge=600",
        *(["GresTypes=gpu"] if gpus else []),
        *(
            f"NodeName={name} NodeAddr={h.address} CPUs={cpus}{gres} State=UNKNOWN"
            for name, h in nodes.items()
        ),
        f"PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(root: Path, gpus: int) -> str:
    """Every node's ``gpus`` GPUs as stand-in devices (Slurm keeps no GPU without a device file;
    these are what /dev/null is): a job's GPU request is granted as on a GPU cluster, with
    ``SLURM_GPUS_ON_NODE`` and ``CUDA_VISIBLE_DEVICES`` set, and the workers train on the CPU."""
    for i in range(gpus):
        device = root / f"gpu{i}"
        if not device.exists():
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return f"Name=gpu File={root}/gpu[0-{gpus - 1}]\n" if gpus else ""


class SlurmCluster:
    """``with SlurmCluster(hosts, root, controller=hosts.hosts[0], nodes={...}) as slurm:``;
    ``gpus``: each node's (stand-in) GPUs."""

    def __init__(
        self, hosts: TestHosts, root: Path, controller: Host, nodes: dict[str, Host], gpus: int = 0
    ) -> None:
        self.hosts, self.root, self.controller, self.nodes, self.gpus = hosts, root, controller, nodes, gpus
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}

    def on(self, host: Host, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/var/run/netns/{host.namespace}", *argv]

    def _daemon(self, argv: list[str], log: str) -> None:
        with open(self.root / "log" / log, "wb") as out:
            self.daemons.append(subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT))

    def start(self) -> SlurmCluster:
        for folder in ("state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        conf = slurm_conf(self.root, self.controller, self.nodes, os.cpu_count() or 2, self.gpus)
        (self.root / "slurm.conf").write_text(conf)
        (self.root / "gres.conf").write_text(gres_conf(self.root, self.gpus))  # beside slurm.conf
        self._daemon(
            ["munged", "-F", "-f", f"--key-file={key}", f"--socket={self.root / 'munge.socket'}",
             f"--pid-file={self.root / 'munged.pid'}", f"--seed-file={self.root / 'munged.seed'}",
             f"--log-file={self.root / 'log' / 'munged.log'}"],
            "munged.out",
        )  # fmt: skip
        self._wait(lambda: (self.root / "munge.socket").exists(), 20, "munged")
        self._daemon(self.on(self.controller, ["slurmctld", "-D", "-i"]), "slurmctld.out")
        for name, host in self.nodes.items():
            self._daemon(self.on(host, ["slurmd", "-D", "-N", name]), f"slurmd-{name}.out")
        self._wait(self._all_idle, 60, "every slurmd to be idle")
        return self

    def _all_idle(self) -> bool:
        shown = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in shown.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in self.nodes)

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.3)
        raise TimeoutError(f"timed out waiting for {what}: see {self.root / 'log'}")

    def run(self, argv: list[str], check: bool = True) -> str:
        """A Slurm command, run on the controller's host."""
        argv = self.on(self.controller, argv)
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv}: {done.stderr}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, NodeList, ...)."""
        shown = self.run(["scontrol", "show", "job", "-o", job_id])
        return dict(word.split("=", 1) for word in shown.split() if "=" in word)

    def close(self) -> None:
        for process in reversed(self.daemons):
            process.terminate()
        for process in reversed(self.daemons):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.daemons.clear()

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
