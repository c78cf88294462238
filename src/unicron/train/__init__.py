"""The library inside a worker: wrap an ordinary PyTorch data-parallel loop with a Session.

Imports torch; the planner and the command line never import this package.
"""

from unicron.train import porting
from unicron.train.metric import Metric
from unicron.train.porting import PortingError
from unicron.train.session import Session, init
from unicron.train.steploop import Loader

# A script's leftover dist.init_process_group(...) or DistributedDataParallel(...) fails with an
# error that names the fix, not torch's (``porting.py``).
porting.install()

__all__ = ["Loader", "Metric", "PortingError", "Session", "init"]
