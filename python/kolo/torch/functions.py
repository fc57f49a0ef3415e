"""Horovod's broadcast and gather helpers (``horovod.torch.functions``).

Every rank calls each of them, in the same order: they are collectives.
Objects travel pickled (kolo.common.objects: with cloudpickle when it is
installed, as Horovod does; plain pickle otherwise).
"""

from __future__ import annotations

import collections
import collections.abc
from typing import Any, Iterable, List, Optional, Tuple, Union

import torch

from kolo.common import objects as _objects

from . import mpi_ops
from .mpi_ops import ProcessSet, global_process_set

def broadcast_parameters(params: Union[dict, Iterable], root_rank: int) -> None:
    """Copies rank ``root_rank``'s tensors into the same tensors on every
    other rank, in place. Every rank calls it with the same names in the
    same order.

    ``params`` is a ``state_dict()`` (broadcast in sorted key order, named
    by key), ``named_parameters()`` (a list or generator of (name, tensor)),
    or a list of tensors (unnamed: issued in order). Non-contiguous tensors
    travel through a contiguous copy. Returns once every copy is done."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, collections.abc.Iterable) and \
            not isinstance(params, (str, bytes, torch.Tensor)):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    for name, p in items:
        if not torch.is_tensor(p):
            raise TypeError(f"kolo: broadcast_parameters: {name or 'an entry'} is a "
                            f"{type(p).__name__}, not a tensor")
    handles: List[Tuple[int, torch.Tensor, Optional[torch.Tensor]]] = []
    for name, p in items:
        if p.is_contiguous():
            handles.append((mpi_ops.broadcast_async_(p, root_rank, name), p, None))
        else:
            tmp = p.detach().contiguous()
            handles.append((mpi_ops.broadcast_async_(tmp, root_rank, name), p, tmp))
    for handle, p, tmp in handles:
        mpi_ops.synchronize(handle)
        if tmp is not None:
            with torch.no_grad():
                p.copy_(tmp)


def _sparse_param_ids(model: Optional[torch.nn.Module]) -> set:
    ids = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                ids.update(id(p) for p in m.parameters())
    return ids


def _create_state(optimizer: torch.optim.Optimizer, sparse: set) -> None:
    """Makes the optimizer create its lazily built state (Adam's moments,
    SGD's momentum buffers) by stepping once on zero gradients. The
    parameters are put back as they were, so the step changes nothing but
    the state (weight decay would otherwise move them on these ranks)."""
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p not in optimizer.state:
                saved.append((p, p.detach().clone()))
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or \
                        (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    # A DistributedOptimizer's step() would allreduce the gradients, a
    # collective that not every rank may be making: step the wrapped class.
    if type(optimizer).__module__ == __package__ + ".optimizer":
        super(type(optimizer), optimizer).step()
    else:
        optimizer.step()
    with torch.no_grad():
        for p, value in saved:
            p.copy_(value)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Optional[torch.nn.Module] = None) -> None:
    """Copies rank ``root_rank``'s optimizer state (state tensors such as
    Adam's moments and SGD's momentum buffers, scalar state, and every
    param_group option: lr, momentum, betas, ...) to every other rank, in
    place. Every rank calls it, with optimizers over the same parameters.

    An optimizer whose state is empty (a fresh one) first steps once on zero
    gradients so that its lazily created state exists; its parameters are
    left unchanged by that step. ``model`` identifies sparse embeddings.
    ``torch.optim.LBFGS`` is refused (ValueError), as in Horovod."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _create_state(optimizer, _sparse_param_ids(model))
        state_dict = optimizer.state_dict()
    # A stateless optimizer (plain SGD, whose momentum buffer torch 2.x
    # keeps only when momentum is set) still has its options to copy.
    tensors: List[Tuple[str, torch.Tensor]] = []
    scalars: dict = {}
    assign: dict = {}
    seen: collections.Counter = collections.Counter()

    def set_option(index: int, key: str):
        def f(v):
            optimizer.param_groups[index][key] = v
        return f

    def set_state(pid: Any, key: str):
        def f(v):
            state_dict["state"][pid][key] = v
        return f

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key == "params":
                continue
            k = f"{key}.{index}"
            scalars[k] = value
            assign[k] = set_option(index, key)
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue  # no gradient, no state (requires_grad=False)
            for key, value in state_dict["state"][pid].items():
                seen[key] += 1
                k = f"{key}.{seen[key]}"
                if torch.is_tensor(value):
                    # state_dict() holds the optimizer's own tensors: the
                    # in-place broadcast updates the optimizer.
                    tensors.append((f"optimizer_state.{k}", value))
                else:
                    scalars[k] = value
                    assign[k] = set_state(pid, key)

    broadcast_parameters(tensors, root_rank)
    scalars = broadcast_object(scalars, root_rank, name="optimizer_state.scalars")
    for k, v in scalars.items():
        assign[k](v)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns rank ``root_rank``'s ``obj`` on every rank (the others' ``obj``
    is ignored, and may be None). Every rank calls it, with the same
    ``name`` or all without one (unnamed calls are numbered in call order).
    The root pickles the object; its size, then its bytes travel
    (kolo.common.objects)."""
    comm = mpi_ops._ps(process_set, "broadcast_object")
    return _objects.broadcast_object(obj, root_rank, name, comm)


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Returns the list of every rank's ``obj``, in rank order. Every rank
    calls it, with the same ``name`` or all without one (unnamed calls are
    numbered in call order)."""
    return _objects.allgather_object(obj, name)


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]
