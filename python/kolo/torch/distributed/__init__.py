"""kolo.torch.distributed: kolo as a ``torch.distributed`` backend.

Importing this module registers the c10d backend ``"kolo"`` and the
rendezvous scheme ``kolo://``; an unchanged DistributedDataParallel script
then runs on kolo with one changed word::

    import kolo.torch.distributed  # noqa: F401  (registers the backend)
    dist.init_process_group("kolo")                         # under torchrun (env://)
    dist.init_process_group("kolo", init_method="kolo://")  # under kolorun
    model = torch.nn.parallel.DistributedDataParallel(model)

Two ways in:

* ``kolo://`` (under ``kolorun``, or with ``KOLO_RENDEZVOUS`` set): the
  process joins kolo's rendezvous (:func:`kolo.init`); rank and size are
  kolo's. The store torch insists on is a :class:`KoloStore`, whose ``add``
  is a kolo allreduce (enough for torch's store-based barrier) and whose
  ``set``/``get`` go to the rendezvous server's KV store. Elastic jobs
  (``kolorun --min-np/--max-np``) re-form in place: see :func:`elastic_run`.
* ``env://`` or an explicit ``store=`` (torchrun, a PyTorchJob): kolo's data
  plane is bootstrapped through the c10d store torch already built
  (:func:`kolo.bootstrap_connect`), with a random job id and token that rank
  0 shares through the store. The comm is finalized after a barrier through
  the same store when the default group is destroyed or the interpreter
  exits (after :func:`kolo.abort` instead when an operation failed).

The process group is a Python subclass of ``torch.distributed.ProcessGroup``.
Every operation is issued to kolo's fusion engine under the name
``c10d.<group>.<sequence>.<kind>`` (c10d requires the same order on every
rank, so the sequence number names an operation consistently) and completed
by one thread per group that waits on kolo's handles in issue order and
completes a torch future. Tensors must be dense, contiguous CPU or CUDA
tensors of a dtype kolo knows (:func:`kolo.buffer` checks; complex tensors
travel as their real view); CUDA tensors need a libkolo with the device data
path (:func:`kolo.cuda_supported`), and then DDP with ``device_ids`` runs on
kolo as it does on nccl: kolo orders its work after torch's current stream
at the call, and the futures of operations on CUDA tensors are CUDA-aware
(``torch.futures.Future(devices=...)``), so DDP's reducer may chain them.
Reductions: SUM, AVG, MIN, MAX, PRODUCT (BAND, BOR, BXOR and PREMUL_SUM
raise ValueError).

Supported from Python (``dist.*``): all_reduce, all_reduce_coalesced,
broadcast, all_gather, all_gather_into_tensor / _all_gather_base,
all_gather_coalesced, reduce_scatter, reduce_scatter_tensor /
_reduce_scatter_base, all_to_all, all_to_all_single, reduce, gather, scatter,
barrier, and what builds on them (all_gather_object, broadcast_object_list,
gather_object, scatter_object_list, ZeroRedundancyOptimizer, DDP and its
join()). Groups have names and descriptions, so DeviceMesh, DTensor, FSDP2
and torch's functional collectives work on them (the functional operators
through kolo's own kernels: _functional.py). Point-to-point (send, recv from
a rank or any source, isend, irecv, batch_isend_irecv) runs on kolo's p2p
endpoint, and torch.distributed.pipelining on it; monitored_barrier on p2p
too (_monitored.py). Subgroups (``new_group(ranks)``, ``new_subgroups``, the
dimensions of a DeviceMesh, so HSDP) are kolo comms of their members alone,
connected through the group's store, each with its own rings and fusion.

Error reporting: ``dist.*`` calls get a work object whose ``wait()`` raises
kolo's own exception (:class:`kolo.MembershipError` when a peer failed, ...).
C++ callers (DDP's reducer) get a work wrapping a future that fails with a
RuntimeError carrying kolo's message. After a membership or shutdown
failure a group refuses new operations with the same error class.

Three torch functions are wrapped (only when this module is imported, and only
changing what they do for kolo groups): ``destroy_process_group`` also stops
the kolo groups' completion threads, closes subgroups' comms and finalizes a
bootstrapped comm; ``init_process_group`` binds a kolo
default group to its ``device_id``; ``monitored_barrier`` runs kolo's own on
a kolo group, where torch's allows gloo only.

The modules: _common (reductions, tensor checks, timeouts), _work (works and
futures), _group (ProcessGroupKolo), _store (KoloStore), _init (kolo:// and
env://, the backend's creator, registration), _functional (the functional
collectives' kernels), _monitored (monitored_barrier), _elastic (ElasticState, elastic_run), _state (what
they share).
"""

from ._common import BACKEND, SCHEME
from ._elastic import ElasticState, elastic_run
from ._group import ProcessGroupKolo
from ._init import destroy_process_group, init
from ._store import KoloStore

__all__ = ["BACKEND", "SCHEME", "KoloStore", "ProcessGroupKolo", "ElasticState", "elastic_run",
           "init", "destroy_process_group", "new_group"]
