"""Network faults between test hosts, for the tests and the benchmarks: a partition between two
groups of hosts, random packet loss, a stalled link, delay, and TCP that gives up sooner.

The hosts themselves (network namespaces on one bridge, a link cut and healed) are the package's
(``unicron.control.launch.testhosts``: ``unicron demo --hosts`` runs on them); what is here only
the tests and benchmarks use. Safety is the hosts': every fault is set inside the harness's own
namespaces, on the links between them.

- A partition pins, on each side, the other side's addresses to a hardware address no host has:
  their frames are lost on the bridge, silently, while every other pair still talks.
- Loss and stalls are nftables rules in the host's namespace: real loss, which TCP answers with
  retransmissions.
- Delay is added by a process in the host (``netdelay.py``) that holds each of its packets for a
  while: this kernel has no ``netem``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from unicron.control.launch.testhosts import INTERFACE, Host, HostsUnavailable, TestHosts, ip

STALL_BYTES = 120  # larger than any packet without data (IP 20 + TCP 20 + options 40 bytes)
NOWHERE = "02:00:00:00:00:01"  # a hardware address no host has: frames sent to it are lost
DELAY_QUEUE = 7  # the netfilter queue a delayed host's packets wait in (numbered per namespace)
DELAYER = Path(__file__).with_name("netdelay.py")


def delay_unavailable() -> str | None:
    """Why ``FaultyHosts.delay`` cannot work here (None: it can)."""
    if shutil.which("iptables") is None:
        return "`iptables` is not installed: make test installs it as root"
    if importlib.util.find_spec("netfilterqueue") is None:
        return "NetfilterQueue is missing: make test installs it (pip install 'unicron[netfaults]')"
    return None


class FaultyHosts(TestHosts):
    """Test hosts whose links can also be partitioned, made lossy, stalled or slow."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self._severed: set[tuple[Host, Host]] = set()
        self._delayers: dict[str, subprocess.Popen[str]] = {}

    def close(self) -> None:
        with self._lock:
            for delayer in self._delayers.values():
                delayer.kill()
                delayer.wait()
            self._delayers.clear()
        super().close()

    def partition(self, side: list[Host], other: list[Host]) -> None:
        """Lose every packet between a host of ``side`` and one of ``other`` (both ways); the
        hosts of each side still reach each other and any host in neither."""
        for a in side:
            for b in other:
                for here, there in ((a, b), (b, a)):
                    ip(
                        "-n", here.namespace, "neigh", "replace", there.address,
                        "lladdr", NOWHERE, "dev", here.interface, "nud", "permanent",
                    )  # fmt: skip
                    self._severed.add((here, there))

    def mend(self) -> None:
        """End every partition: addresses are resolved afresh."""
        for here, there in sorted(self._severed, key=lambda pair: (pair[0].name, pair[1].name)):
            ip("-n", here.namespace, "neigh", "del", there.address, "dev", here.interface, check=False)
        self._severed.clear()

    def lose(self, host: Host, percent: int) -> None:
        """Drop ``percent`` % of the packets ``host`` sends or receives on its link, at random
        (real loss, which TCP answers with retransmissions, timeouts backing off from 200 ms).
        ``percent=0`` ends it."""
        if not 0 <= percent <= 100:
            raise ValueError(f"percent={percent}: between 0 and 100")
        drop = "drop" if percent == 100 else f"numgen random mod 100 < {percent} drop"
        rules = [
            f"chain {hook} {{ type filter hook {hook} priority 0; {way} {INTERFACE} {drop}; }}"
            for hook, way in (("input", "iifname"), ("output", "oifname"))
        ]
        self._nft(host, "unicron_loss", rules if percent else [])

    def stall(self, host: Host, sparing: Host | None) -> None:
        """Drop every packet of over ``STALL_BYTES`` that ``host`` exchanges with any host but
        ``sparing`` (its coordinator's); ``sparing=None`` ends it. Bulk data (a collective's
        segments) stops and TCP retransmits it, backing off, while connections still open (a
        handshake's packets are small) and ``sparing`` is heard: a link that is slow, not cut."""
        rules = [] if sparing is None else [
            f"chain {hook} {{ type filter hook {hook} priority 0; {way} {INTERFACE}"
            f" ip {peer} != {sparing.address} ip length > {STALL_BYTES} drop; }}"
            for hook, way, peer in (("input", "iifname", "saddr"), ("output", "oifname", "daddr"))
        ]  # fmt: skip
        self._nft(host, "unicron_stall", rules)

    def _nft(self, host: Host, table: str, chains: list[str]) -> None:
        """Replace nftables' ``table`` in ``host``'s namespace by one of ``chains`` (none: remove it)."""
        if shutil.which("nft") is None:
            raise HostsUnavailable("`nft` (nftables) is not installed: make test installs it as root")
        inside = self.command(host, ["nft"])
        subprocess.run([*inside, "delete", "table", "inet", table], capture_output=True, timeout=30)
        if not chains:
            return
        script = f"table inet {table} {{\n" + "\n".join(chains) + "\n}\n"
        done = subprocess.run([*inside, "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise HostsUnavailable(f"nft refused the {table} rules: {done.stderr.strip()}")

    def tcp_retries(self, host: Host, retries: int) -> None:
        """How often ``host``'s TCP sends unanswered data again before the connection fails
        (``net.ipv4.tcp_retries2`` of its namespace). Linux's 15 take about 15 minutes, 3 about
        3 s: to the host's connections a partition of a minute then lasts as long as one of
        hours does with the default (calls into it fail, rather than wait)."""
        if not 1 <= retries <= 15:
            raise ValueError(f"retries={retries}: between 1 and 15")
        ip("netns", "exec", host.namespace, "sysctl", "-q", "-w", f"net.ipv4.tcp_retries2={retries}")

    def delay(self, host: Host, ms: float) -> None:
        """Hold every packet ``host`` sends or receives on its link for ``ms`` before it goes on
        (so a round trip between it and another host takes ``2 * ms`` more); ``ms=0`` ends it.
        Real delay for every connection, gloo's included: the packets wait in a netfilter queue
        that a process inside the host (``netdelay.py``) releases, in order."""
        if ms < 0:
            raise ValueError(f"ms={ms}: a delay cannot be negative")
        for rule in _delay_rules(host, "-D"):
            subprocess.run(self.command(host, rule), capture_output=True, timeout=30)
        if (delayer := self._delayers.pop(host.name, None)) is not None:
            delayer.kill()
            delayer.wait()
        if ms == 0:
            return
        if (reason := delay_unavailable()) is not None:
            raise HostsUnavailable(reason)
        argv = [sys.executable, str(DELAYER), "--queue", str(DELAY_QUEUE), "--delay-ms", str(ms)]
        delayer = subprocess.Popen(self.command(host, argv), stdout=subprocess.PIPE, text=True)
        assert delayer.stdout is not None
        if delayer.stdout.readline().strip() != "ready":  # bound before any packet is queued to it
            delayer.kill()
            raise HostsUnavailable(f"the delay process on {host.name} did not start (exit {delayer.wait()})")
        self._delayers[host.name] = delayer
        for rule in _delay_rules(host, "-A"):
            done = subprocess.run(self.command(host, rule), capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise HostsUnavailable(f"iptables refused the delay rule: {done.stderr.strip()}")


def _delay_rules(host: Host, action: str) -> list[list[str]]:
    """The iptables commands that add (``-A``) or delete (``-D``) the rules queueing every
    packet on ``host``'s link, in and out, to its delay process."""
    queue = ["-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE)]
    return [
        ["iptables", action, "INPUT", "-i", host.interface, *queue],
        ["iptables", action, "OUTPUT", "-o", host.interface, *queue],
    ]
