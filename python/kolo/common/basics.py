"""Init and topology, process sets, the reduction ops, the timeline and the
build flags: Horovod's ``horovod.common.basics`` for every kolo binding.

Process sets are Horovod's: :func:`add_process_set` (or ``init(process_sets=
[...])``) makes one on every rank, in the same order everywhere; each is a kolo
process set (:func:`kolo.process_set_create`) with its own rings, fusion and
names, and every collective takes it as ``process_set=``. Sets are always
dynamic (no ``HOROVOD_DYNAMIC_PROCESS_SETS`` needed). After an elastic re-form
the sets are gone: :func:`reset_process_sets` (the elastic loop calls it)
drops them, and the reset callbacks add them again.
"""

from __future__ import annotations

import collections.abc
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import kolo

from . import handles

# ---- lifecycle -------------------------------------------------------------


class ProcessSet:
    """Horovod's process set: a subset of the ranks that runs collectives
    together. Built from a list of ranks; usable once added
    (:func:`add_process_set`, or ``init(process_sets=...)``)."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm: Any = None
    comm: Optional[kolo.Comm] = None  # this rank's kolo comm of the set; None outside it

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
        if self.process_set_id is None or self.ranks is None:
            return None
        return len(self.ranks)

    def rank(self) -> Optional[int]:
        """This process's rank in the set (-1 outside it); None if it is not
        initialized."""
        if self.process_set_id == 0:
            return kolo.rank()
        if self.process_set_id is None:
            return None
        return self.comm.rank() if self.comm is not None else -1

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


_sets: Dict[int, ProcessSet] = {}  # the added sets by id
_next_id = 1


def process_set_comm(process_set: Any, what: str) -> Optional[kolo.Comm]:
    """The kolo comm that an op given ``process_set`` runs on: None for the
    global set, the set's comm for an added set this rank is in. Raises
    ValueError for a set that was not added (or was removed, or did not
    survive a re-form) and for one this rank is not in."""
    if process_set is global_process_set or (
            isinstance(process_set, ProcessSet) and process_set.process_set_id == 0):
        return None
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"kolo: {what}: process_set must be a ProcessSet, not "
                        f"{type(process_set).__name__}")
    if _sets.get(process_set.process_set_id) is not process_set:
        raise ValueError(f"kolo: {what}: {process_set} has not been added (hvd.add_process_set), "
                         f"or was removed, or was dropped by an elastic re-form")
    if process_set.comm is None:
        raise ValueError(f"kolo: {what}: this rank ({kolo.rank()}) is not in {process_set}")
    return process_set.comm


def check_process_set(process_set: Any, what: str) -> None:
    """For a binding whose ops do not take sets yet (kolo.tensorflow, kolo.keras):
    the global set passes, any other raises NotImplementedError."""
    if process_set_comm(process_set, what) is not None:
        raise NotImplementedError(f"kolo: {what}: this binding runs on the global process set "
                                  f"only; kolo.torch takes process_set={process_set}")


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Adds a process set: every rank calls it with the same ranks, in the
    same order as its other add/remove calls and collectives. Returns the
    set, with its id. Ranks that disagree raise kolo.MismatchError on every
    rank, an invalid list ValueError on every rank (the checks are made
    together, so no rank is left waiting)."""
    global _next_id
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"kolo: {ps} has been added already")
    try:
        ps.comm = kolo.process_set_create(ps.ranks)
    except kolo.Error as e:
        if isinstance(e, kolo.MismatchError) or e.name != "KOLO_EINVAL":
            raise
        raise ValueError(str(e)) from None
    ps.process_set_id = _next_id
    _next_id += 1
    _sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes an added set (every rank calls it); False for the global set
    and for sets that were never added, as Horovod does."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a ProcessSet, not "
                        f"{type(process_set).__name__}")
    if process_set.process_set_id in (None, 0) or \
            _sets.get(process_set.process_set_id) is not process_set:
        return False
    del _sets[process_set.process_set_id]
    comm, process_set.comm = process_set.comm, None
    process_set.process_set_id = None
    kolo.process_set_free(comm)
    return True


def reset_process_sets() -> None:
    """Drops every added set without talking to the other ranks (after a
    re-form their members are gone); the elastic loop calls it, and the
    reset callbacks add the sets again."""
    for ps in list(_sets.values()):
        comm, ps.comm, ps.process_set_id = ps.comm, None, None
        if comm is not None:
            try:
                kolo.process_set_free(comm)
            except kolo.Error:
                pass
    _sets.clear()


def init(comm: Optional[Sequence[int]] = None, process_sets: Any = None) -> None:
    """Joins the job; every worker calls it once, before any collective.

    ``comm`` may be None or a list of every rank (Horovod's sub-communicator
    lists and MPI communicators raise NotImplementedError); ``process_sets``
    may be None or a list holding only :data:`global_process_set`. Blocks
    until every worker has joined (``KOLO_INIT_TIMEOUT_MS``). Calling it
    again while initialized does nothing."""
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError(f"kolo: init(process_sets={process_sets!r}): give a list of "
                         f"ProcessSets or \"dynamic\"")
    if comm is not None and not (isinstance(comm, collections.abc.Iterable)
                                 and not isinstance(comm, (str, bytes))):
        raise NotImplementedError("kolo does not use MPI: init(comm=<MPI communicator>) is not "
                                  "supported; kolorun or the rendezvous forms the job")
    ranks = None if comm is None else sorted(int(r) for r in comm)
    kolo.init()
    n = kolo.size()
    if ranks and ranks != list(range(n)):
        raise NotImplementedError(
            f"kolo: init(comm={ranks}) asks for a subset of the {n} ranks as the global set; "
            f"init() every rank and use hvd.add_process_set({ranks}) for the subset")
    global_process_set.ranks = list(range(n))
    handles.clear()
    if process_sets is not None and not isinstance(process_sets, str):
        for ps in process_sets:
            if ps is not global_process_set and ps.process_set_id is None:
                add_process_set(ps)


def shutdown() -> None:
    """Leaves the job (every rank calls it at the end; it also runs at
    exit). Operations still in flight fail with kolo.ShutdownError."""
    handles.clear()
    reset_process_sets()
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

KOLO_OP = {Average: "average", Sum: "sum", Adasum: "adasum", Min: "min", Max: "max",
           Product: "product"}


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
