"""Detection: silent nodes, hangs and stragglers, late exits, vanished workers, failing storage."""
