"""The library inside a worker: wrap an ordinary PyTorch data-parallel loop with a Session.

Imports torch; the planner and the command line never import this package.
"""

import torch

from unicron.train import supported

supported.check(torch.__version__)  # before anything that relies on how this torch behaves

from unicron.train import porting  # noqa: E402
from unicron.train.metric import Metric  # noqa: E402
from unicron.train.porting import PortingError  # noqa: E402
from unicron.train.session import Session, init  # noqa: E402
from unicron.train.steploop import Loader  # noqa: E402

# A script's leftover dist.init_process_group(...) or DistributedDataParallel(...) fails with an
# error that names the fix, not torch's (``porting.py``).
porting.install()

__all__ = ["Loader", "Metric", "PortingError", "Session", "init"]
