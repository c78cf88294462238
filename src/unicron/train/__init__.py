"""The library inside a worker: wrap an ordinary PyTorch data-parallel loop with a Session.

Imports torch; the planner and the command line never import this package.
"""

from unicron.train.session import Session, init
from unicron.train.steploop import Loader

__all__ = ["Loader", "Session", "init"]
