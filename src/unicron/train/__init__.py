"""The library inside a worker: wrap an ordinary PyTorch data-parallel loop with a Session.

Imports torch; the planner and the command line never import this package.
"""

from unicron.train.iteration import Iteration
from unicron.train.session import Session, init

__all__ = ["Iteration", "Session", "init"]
