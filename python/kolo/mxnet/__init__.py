"""kolo.mxnet: Horovod's ``horovod.mxnet`` API on MXNet 1.9, never compiled
against it.

A Horovod MXNet script runs with one changed line::

    import kolo.mxnet as hvd           # was: import horovod.mxnet as hvd

Topology, process sets and object collectives are kolo.common's. allreduce
and broadcast are pushed onto MXNet's dependency engine by libkolo
(include/kolo/mxnet.h; docs/mxnet.md), so MXNet orders them with the other
operations on their arrays.
"""

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo import Error, MismatchError, ShutdownError  # noqa: F401
from kolo.common.basics import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ProcessSet, Sum, add_process_set, ccl_built,
    cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, global_process_set,
    init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, remove_process_set, rocm_built, size,
    start_timeline, stop_timeline)
from kolo.common import basics as _basics
from kolo.common.objects import allgather_object, broadcast_object  # noqa: F401

from .compression import Compression  # noqa: F401
from .ops import drain as _drain
from .ops import (  # noqa: F401
    allgather, allreduce, allreduce_, alltoall, broadcast, broadcast_, grouped_allgather,
    grouped_allreduce, grouped_allreduce_, grouped_reducescatter, reducescatter,
    shard_allgather_, shard_range, shard_reducescatter_, synchronize)
from .training import (  # noqa: F401
    DistributedOptimizer, DistributedTrainer, broadcast_parameters)


def shutdown() -> None:
    """Waits for the operations still in MXNet's queue, then leaves the job
    (kolo.common's shutdown): the comm must outlive every pushed operation."""
    _drain()
    _basics.shutdown()
