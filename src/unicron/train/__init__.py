"""The library inside a worker: wrap an ordinary PyTorch data-parallel loop with a Session.

Imports torch; the planner and the command line never import this package.
"""

from unicron.train.data import MicroBatch
from unicron.train.session import Iteration, Session, init

__all__ = ["Iteration", "MicroBatch", "Session", "init"]
