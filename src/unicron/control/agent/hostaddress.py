"""The address a node is reached at, and the network interface that holds it.

On a cluster each node has its own address; workers must bind and advertise that one. Gloo picks
its interface from ``GLOO_SOCKET_IFNAME``, and without it from the host name, which on most
machines (and in every test host) resolves to a loopback address: peers on other machines
would then be told to connect to 127.0.0.1. The agent is given its address (``--address``) and
tells its workers which interface holds it.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from dataclasses import dataclass

SIOCGIFADDR = 0x8915  # the IPv4 address of an interface (netdevice(7))


def ipv4_of(interface: str) -> str | None:
    """The IPv4 address of ``interface`` (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def addresses() -> dict[str, str]:
    """Every interface of this host (its network namespace) with an IPv4 address: name -> address."""
    found = {}
    for _, name in socket.if_nameindex():
        address = ipv4_of(name)
        if address is not None:
            found[name] = address
    return found


@dataclass(frozen=True)
class NodeAddress:
    """Where a node's workers are reached (registered with the coordinator) and the interface
    that holds that address (None: a single machine on loopback; gloo chooses)."""

    address: str = "127.0.0.1"
    interface: str | None = None

    def worker_env(self) -> dict[str, str]:
        """What workers need to bind their collectives to this node's address."""
        return {} if self.interface is None else {"GLOO_SOCKET_IFNAME": self.interface}


class AddressError(ValueError):
    """An address that is not this host's, said with the ones it has."""


def interface_of(address: str) -> str:
    """The interface that holds ``address`` on this host; refused, naming the host's addresses,
    when none does (a typo, or the address of another machine)."""
    held = addresses()
    for name, mine in held.items():
        if mine == address:
            return name
    listed = ", ".join(f"{a} ({n})" for n, a in sorted(held.items())) or "none"
    raise AddressError(f"--address {address} is not an address of this host; give one of its own: {listed}")
