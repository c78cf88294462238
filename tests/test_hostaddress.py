"""A node's address and the interface its workers bind their collectives to (``--address``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from unicron.control.agent.hostaddress import AddressError, NodeAddress, addresses, interface_of


def test_the_interface_holding_an_address_is_found_and_given_to_workers() -> None:
    assert addresses()["lo"] == "127.0.0.1"
    assert interface_of("127.0.0.1") == "lo"
    assert NodeAddress("127.0.0.1", "lo").worker_env() == {"GLOO_SOCKET_IFNAME": "lo"}
    assert NodeAddress().worker_env() == {}  # one machine: gloo chooses


def test_an_address_of_another_machine_is_refused_naming_this_hosts_own() -> None:
    with pytest.raises(
        AddressError, match=r"192\.0\.2\.77 is not an address of this host.*127\.0\.0\.1 \(lo\)"
    ):
        interface_of("192.0.2.77")  # documentation range: looked up here, never contacted


def refused(*args: str) -> str:
    """The CLI's complaint about ``args``: exit 2, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "unicron.cli.main", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_the_agent_refuses_a_foreign_address_with_the_fix_and_no_traceback() -> None:
    said = refused("agent", "--node", "n0", "--address", "192.0.2.77")
    assert "--address 192.0.2.77 is not an address of this host" in said


def test_the_demo_refuses_a_host_count_it_cannot_run_with_the_fix() -> None:
    assert "--hosts 1: the demo runs on 2 to 16 test hosts" in refused("demo", "--hosts", "1")
