"""Init and topology, process sets, the reduction ops, the timeline and the
build flags: Horovod's ``horovod.common.basics`` for every kolo binding.

kolo has one communicator per process: :data:`global_process_set` is the
only process set that collectives take; others can be built (scripts build
them before init) and are refused with ``NotImplementedError`` when used.
"""

from __future__ import annotations

import collections.abc
import os
import warnings
from typing import Any, List, Optional, Sequence, Union

import kolo

from . import handles

# ---- lifecycle -------------------------------------------------------------


class ProcessSet:
    """Horovod's process set: a subset of the ranks that runs collectives
    together. kolo has one communicator per process, so only
    :data:`global_process_set` can be used; building other sets is allowed
    (scripts build them before init), using them raises
    ``NotImplementedError``."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]):
        if isinstance(ranks_or_comm, collections.abc.Iterable) and \
                not isinstance(ranks_or_comm, (str, bytes)):
            ranks = sorted(ranks_or_comm)
            if any(not isinstance(r, int) for r in ranks):
                raise ValueError("ProcessSet should be initialized with a list of process ranks")
            self.ranks = ranks
        else:
            raise NotImplementedError(
                "kolo does not use MPI: a ProcessSet cannot be built from an MPI communicator")

    def size(self) -> Optional[int]:
        """The number of ranks in the set; None if it is not initialized."""
        if self.process_set_id == 0:
            return kolo.size()
        return None

    def rank(self) -> Optional[int]:
        """This process's rank in the set; None if it is not initialized."""
        if self.process_set_id == 0:
            return kolo.rank()
        return None

    def included(self) -> Optional[bool]:
        """Whether this process is in the set; None if the set has no ranks
        yet."""
        if self.process_set_id == 0:
            return True
        if self.ranks is None:
            return None
        return kolo.rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def process_sets_refused(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"kolo does not implement process sets ({what}): every collective runs on the global "
        f"process set, hvd.global_process_set")


def check_process_set(process_set: Any, what: str) -> None:
    if process_set is global_process_set or (
            isinstance(process_set, ProcessSet) and process_set.process_set_id == 0):
        return
    raise process_sets_refused(f"{what} was given {process_set}")


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Horovod adds a dynamic process set; kolo raises NotImplementedError."""
    raise process_sets_refused(f"add_process_set({process_set})")


def remove_process_set(process_set: ProcessSet) -> bool:
    """Returns False for the global set and for sets that were never added
    (as Horovod does); kolo has no others."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a ProcessSet, not "
                        f"{type(process_set).__name__}")
    return False


def init(comm: Optional[Sequence[int]] = None, process_sets: Any = None) -> None:
    """Joins the job; every worker calls it once, before any collective.

    ``comm`` may be None or a list of every rank (Horovod's sub-communicator
    lists and MPI communicators raise NotImplementedError); ``process_sets``
    may be None or a list holding only :data:`global_process_set`. Blocks
    until every worker has joined (``KOLO_INIT_TIMEOUT_MS``). Calling it
    again while initialized does nothing."""
    if process_sets is not None:
        if isinstance(process_sets, str):
            raise process_sets_refused(f"init(process_sets={process_sets!r})")
        if any(ps is not global_process_set for ps in process_sets):
            raise process_sets_refused(f"init(process_sets={list(process_sets)})")
    if comm is not None and not (isinstance(comm, collections.abc.Iterable)
                                 and not isinstance(comm, (str, bytes))):
        raise NotImplementedError("kolo does not use MPI: init(comm=<MPI communicator>) is not "
                                  "supported; kolorun or the rendezvous forms the job")
    ranks = None if comm is None else sorted(int(r) for r in comm)
    kolo.init()
    n = kolo.size()
    if ranks and ranks != list(range(n)):
        raise process_sets_refused(f"init(comm={ranks}) asks for a subset of the {n} ranks")
    global_process_set.ranks = list(range(n))
    handles.clear()


def shutdown() -> None:
    """Leaves the job (every rank calls it at the end; it also runs at
    exit). Operations still in flight fail with kolo.ShutdownError."""
    handles.clear()
    kolo.shutdown()


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return kolo.is_initialized()


def size() -> int:
    """The number of ranks; ValueError before :func:`init`."""
    return kolo.size()


def local_size() -> int:
    """The number of ranks on this host."""
    return kolo.local_size()


def cross_size() -> int:
    """The number of hosts that have a rank with this process's local rank."""
    return kolo.cross_size()


def rank() -> int:
    """This process's rank, 0 .. size() - 1."""
    return kolo.rank()


def local_rank() -> int:
    """This process's index among the ranks of its host."""
    return kolo.local_rank()


def cross_rank() -> int:
    """The index of this host among the hosts that have this local rank."""
    return kolo.cross_rank()


def is_homogeneous() -> bool:
    """Whether every host holds the same number of ranks."""
    return kolo.is_homogeneous()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing the Chrome-trace timeline to ``file_path`` (any rank
    may call it). Engine cycles are marked when ``KOLO_TIMELINE_MARK_CYCLES``
    is set; ``mark_cycles=True`` without it only warns."""
    if mark_cycles and not env_true("KOLO_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES"):
        warnings.warn("kolo: start_timeline(mark_cycles=True): cycle marks are configured at "
                      "init with KOLO_TIMELINE_MARK_CYCLES=1; not marking them", stacklevel=2)
    kolo.timeline_start(file_path)


def stop_timeline() -> None:
    """Stops writing the timeline and closes the file."""
    kolo.timeline_stop()


def env_true(*names: str) -> bool:
    return any(os.environ.get(n, "").lower() in ("1", "true", "yes", "on") for n in names)


# Build flags: kolo has none of Horovod's backends; each answer is False.
def mpi_threads_supported() -> bool:
    """False: kolo does not use MPI."""
    return False


def mpi_enabled() -> bool:
    """False: kolo does not use MPI."""
    return False


def mpi_built() -> bool:
    """False: kolo does not use MPI."""
    return False


def gloo_enabled() -> bool:
    """False: kolo's own transports replace Gloo."""
    return False


def gloo_built() -> bool:
    """False: kolo's own transports replace Gloo."""
    return False


def nccl_built() -> bool:
    """False (Horovod returns NCCL's version, 0 without it): kolo's Python
    layer is not built against NCCL; CUDA buffers go through libkolo
    (:func:`cuda_built`), which may use NCCL inside a host itself."""
    return False


def ddl_built() -> bool:
    """False."""
    return False


def ccl_built() -> bool:
    """False."""
    return False


def cuda_built() -> bool:
    """Whether kolo takes CUDA buffers: the loaded libkolo has the CUDA data
    path (:func:`kolo.cuda_supported`). Without a GPU such a library still
    refuses them when an operation is issued."""
    return kolo.cuda_supported()


def rocm_built() -> bool:
    """False."""
    return False


# ---- reduction ops ---------------------------------------------------------

# Horovod's values (horovod/common/wire/message.fbs).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

KOLO_OP = {Average: "average", Sum: "sum", Min: "min", Max: "max", Product: "product"}


def op_from(op: Any, average: Optional[bool]) -> int:
    """Horovod's rule for the deprecated ``average=`` argument."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


def kolo_op(op: Any) -> str:
    if isinstance(op, int) and not isinstance(op, bool) and op == Adasum:
        raise NotImplementedError(
            "kolo does not implement Adasum (op=Adasum); use op=Average or op=Sum")
    try:
        return KOLO_OP[op]
    except (KeyError, TypeError):
        raise ValueError(f"kolo: unknown reduction op {op!r}; use Average, Sum, Min, Max or "
                         f"Product") from None


__all__ = [
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank",
    "local_rank", "cross_rank", "is_homogeneous", "start_timeline", "stop_timeline",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
]
