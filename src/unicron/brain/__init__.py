"""The brain: the cluster's state as typed rows and the decisions on it, pure.

What the coordinator (``control``) and the simulator (``sim``) both run: the records and the
snapshot a decision reads, what one failure decides and the tier that applies with its effects,
the membership arithmetic. Nothing here does I/O; the coordinator's applier carries the effects
out, the simulator models them.
"""
