"""A real etcd on loopback for the tests that need one (the store's etcd backend, leader election)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.etcdlocal import EtcdCluster, etcd_binary


def running_etcd(root: Path, size: int = 1) -> Iterator[EtcdCluster]:
    """A real etcd of ``size`` members on loopback for a fixture to yield (skipped where etcd is
    not installed), closed after."""
    if etcd_binary() is None:
        pytest.skip("etcd is not installed (make test installs etcd-server)")
    cluster = EtcdCluster(root, size=size).start()
    try:
        yield cluster
    finally:
        cluster.close()
