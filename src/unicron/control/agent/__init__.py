"""The node agent: worker processes, stack dumps, peer probes, the node's address."""
