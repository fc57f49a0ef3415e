"""kolo.torch: Horovod's ``horovod.torch`` API on kolo.

A Horovod training script runs with one changed line::

    import kolo.torch as hvd      # was: import horovod.torch as hvd

Same names, arguments and semantics: ``init``, ``rank``/``size``, the
collectives (named, asynchronous, fused by kolo's engine), the broadcast
helpers, ``DistributedOptimizer``, process sets, ``Adasum`` and
``hvd.elastic``. What kolo lacks is refused loudly. See docs/python.md.
"""

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo import MismatchError, ShutdownError, Error  # noqa: F401

from .compression import Compression  # noqa: F401
from .mpi_ops import *  # noqa: F401,F403
from .mpi_ops import __all__ as _ops_all
from .functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401
from . import elastic  # noqa: F401,E402

__all__ = list(_ops_all) + [
    "HorovodInternalError", "MismatchError", "ShutdownError", "Error", "Compression",
    "allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "DistributedOptimizer", "SyncBatchNorm", "elastic",
]
