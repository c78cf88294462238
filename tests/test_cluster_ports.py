"""The local cluster's coordinator port: one picked free but taken by another process before the
coordinator bound it is replaced, before any agent is told the address (a test that lost this
race failed waiting 60 s for a coordinator that had exited at once)."""

from __future__ import annotations

import socket
from pathlib import Path

from unicron.control.launch.localcluster import LocalCluster


def test_a_coordinator_port_taken_before_it_was_bound_is_replaced(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cluster = LocalCluster(tmp_path / "cluster", nodes=1)
        cluster.ports[0] = taken  # as if another process took the port picked for it
        cluster._urls()
        try:
            cluster.start()
            assert cluster.port != taken and cluster.url == f"http://127.0.0.1:{cluster.port}"
            assert [n["name"] for n in cluster.get("/v1/nodes")] == ["node-0"]  # agents got the new one
            log = (tmp_path / "cluster" / "logs" / "coordinator.log").read_text()
            assert "address already in use" in log  # the first try did meet the taken port
        finally:
            cluster.close()
