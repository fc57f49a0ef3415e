"""kolo.tensorflow: Horovod's ``horovod.tensorflow`` API on TensorFlow 2
(2.21 and the releases around it), never compiled against it.

A Horovod TensorFlow script runs with one changed line::

    import kolo.tensorflow as hvd      # was: import horovod.tensorflow as hvd

Topology, process sets, ops and elastic state are kolo.common's; tensors
reach kolo through DLPack and zero-copy views in eager mode and through one
``tf.numpy_function`` per call inside ``tf.function`` (see
docs/tensorflow.md). ``kolo.tensorflow.keras`` is :mod:`kolo.keras`.
"""

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo import Error, MismatchError, ShutdownError  # noqa: F401

from .compression import Compression  # noqa: F401
from .mpi_ops import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, Sum, XlaError, add_process_set,
    allgather, allreduce, alltoall, barrier, broadcast, broadcast_, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set,
    grouped_allgather, grouped_allreduce, grouped_reducescatter, init, is_homogeneous,
    is_initialized, join, local_rank, local_rank_op, local_size, local_size_op, mpi_built,
    mpi_enabled, mpi_threads_supported, nccl_built, process_set_included_op, rank, rank_op,
    reducescatter, remove_process_set, rocm_built, shutdown, size, size_op, start_timeline,
    stop_timeline)
from .functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape  # noqa: F401
from . import elastic  # noqa: F401,E402


def __getattr__(name):
    # Lazy: SyncBatchNormalization needs Keras, which TF loads late.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module 'kolo.tensorflow' has no attribute {name!r}")
