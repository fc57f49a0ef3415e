"""torch's functional collectives (``torch.ops._c10d_functional``) on kolo groups.

DTensor, DeviceMesh users and ``torch.distributed._functional_collectives``
reach a process group through these operators, whose C++ kernels call the
group's C++ methods. A Python group such as kolo's is reached there only for
the methods torch's trampoline forwards to Python, and on torch 2.13 not for
``all_gather_single``/``reduce_scatter_single`` ("No backend type associated
with device type cpu"); and the work it gets back only wraps a future, whose
``wait()`` does not raise when the collective failed.

So kolo registers a kernel of its own for each operator, for CPU and CUDA
tensors: on a kolo group it runs the collective through the public
``torch.distributed`` call (kolo's work, which raises ``MembershipError``
where the collective failed) and returns the finished result, which
``wait_tensor`` then passes through; on any other group it hands the call on
to torch's own kernel, unchanged. The results are those of torch's kernels;
the difference is that kolo's complete before they are returned (the
functional API promises no more than that a result is ready after
``wait_tensor``)."""

from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

_OPS = torch.ops._c10d_functional
_TORCH_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_REDUCE = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}
_lib = None
# torch 2.13 renamed the flat-tensor collectives (the old names warn)
_gather_flat = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_scatter_flat = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _op(reduce_op: str) -> Any:
    try:
        return _REDUCE[reduce_op.lower()]
    except KeyError:
        raise ValueError(f"kolo: functional collective with reduce_op {reduce_op!r}; kolo "
                         f"has {sorted(_REDUCE)}") from None


def _kolo_group(group_name: Any) -> Any:
    """The kolo group named ``group_name`` (a name or a group), else None."""
    from ._group import ProcessGroupKolo
    pg = group_name
    if isinstance(group_name, str):
        try:
            pg = _c10d._resolve_process_group(group_name)
        except Exception:  # noqa: BLE001 - torch's kernel reports an unknown name
            return None
    return pg if isinstance(pg, ProcessGroupKolo) else None


def _gathered(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.new_empty((t.shape[0] * n, *t.shape[1:]))


def _scattered(t: torch.Tensor, n: int) -> torch.Tensor:
    if t.dim() == 0 or t.shape[0] % n:
        raise ValueError(f"kolo: reduce_scatter_tensor of shape {tuple(t.shape)} over {n} "
                         f"ranks: dimension 0 must divide by {n}")
    return t.new_empty((t.shape[0] // n, *t.shape[1:]))


def _all_reduce(pg: Any, x: torch.Tensor, reduce_op: str, group_name: Any) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=_op(reduce_op), group=pg)
    return out


def _all_reduce_(pg: Any, x: torch.Tensor, reduce_op: str, group_name: Any) -> torch.Tensor:
    dist.all_reduce(x, op=_op(reduce_op), group=pg)
    return x


def _all_reduce_coalesced(pg: Any, xs: List[torch.Tensor], reduce_op: str,
                          group_name: Any) -> List[torch.Tensor]:
    return [_all_reduce(pg, x, reduce_op, group_name) for x in xs]


def _all_reduce_coalesced_(pg: Any, xs: List[torch.Tensor], reduce_op: str,
                           group_name: Any) -> List[torch.Tensor]:
    return [_all_reduce_(pg, x, reduce_op, group_name) for x in xs]


def _all_gather(pg: Any, x: torch.Tensor, group_size: int, group_name: Any) -> torch.Tensor:
    out = _gathered(x, group_size)
    _gather_flat(out, x.contiguous(), group=pg)
    return out


def _all_gather_out(pg: Any, x: torch.Tensor, group_size: int, group_name: Any, *,
                    out: torch.Tensor) -> torch.Tensor:
    _gather_flat(out, x.contiguous(), group=pg)
    return out


def _all_gather_coalesced(pg: Any, xs: List[torch.Tensor], group_size: int,
                          group_name: Any) -> List[torch.Tensor]:
    return [_all_gather(pg, x, group_size, group_name) for x in xs]


def _reduce_scatter(pg: Any, x: torch.Tensor, reduce_op: str, group_size: int,
                    group_name: Any) -> torch.Tensor:
    out = _scattered(x, group_size)
    _scatter_flat(out, x.contiguous(), op=_op(reduce_op), group=pg)
    return out


def _reduce_scatter_out(pg: Any, x: torch.Tensor, reduce_op: str, group_size: int,
                        group_name: Any, *, out: torch.Tensor) -> torch.Tensor:
    _scatter_flat(out, x.contiguous(), op=_op(reduce_op), group=pg)
    return out


def _reduce_scatter_coalesced(pg: Any, xs: List[torch.Tensor], reduce_op: str,
                              group_size: int, group_name: Any) -> List[torch.Tensor]:
    return [_reduce_scatter(pg, x, reduce_op, group_size, group_name) for x in xs]


def _all_to_all_single(pg: Any, x: torch.Tensor, output_split_sizes: List[int],
                       input_split_sizes: List[int], group_name: Any) -> torch.Tensor:
    outs = [int(s) for s in output_split_sizes]
    rows = sum(outs) if outs else x.shape[0]
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), outs or None,
                           [int(s) for s in input_split_sizes] or None, group=pg)
    return out


def _broadcast(pg: Any, x: torch.Tensor, src: int, group_name: Any) -> torch.Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    dist.broadcast(out, _c10d.get_global_rank(pg, src), group=pg)
    return out


def _broadcast_(pg: Any, x: torch.Tensor, src: int, group_name: Any) -> torch.Tensor:
    dist.broadcast(x, _c10d.get_global_rank(pg, src), group=pg)
    return x


# operator name -> kolo's implementation (group_name is every operator's last
# positional argument)
_KERNELS: Dict[str, Callable[..., Any]] = {
    "all_reduce": _all_reduce,
    "all_reduce_": _all_reduce_,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "all_reduce_coalesced_": _all_reduce_coalesced_,
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_out": _all_gather_out,
    "all_gather_into_tensor_coalesced": _all_gather_coalesced,
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_out": _reduce_scatter_out,
    "reduce_scatter_tensor_coalesced": _reduce_scatter_coalesced,
    "all_to_all_single": _all_to_all_single,
    "broadcast": _broadcast,
    "broadcast_": _broadcast_,
}


def _kernel(name: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    torch_op = getattr(_OPS, name).default

    def kernel(*args: Any, **kwargs: Any) -> Any:
        group_name = kwargs.get("group_name", args[-1] if args else None)
        pg = _kolo_group(group_name)
        if pg is None:
            return torch_op.redispatch(_TORCH_KERNEL, *args, **kwargs)
        return impl(pg, *args, **kwargs)

    kernel.__name__ = f"kolo_{name}"
    return kernel


def register() -> None:
    """Registers kolo's kernels once per process (a no-op where torch has no
    functional collectives)."""
    global _lib
    if _lib is not None or not hasattr(torch.ops, "_c10d_functional"):
        return
    lib = torch.library.Library("_c10d_functional", "IMPL")
    for name, impl in _KERNELS.items():
        if not hasattr(_OPS, name):
            continue
        for key in ("CPU", "CUDA"):
            lib.impl(name, _kernel(name, impl), key)
    _lib = lib
