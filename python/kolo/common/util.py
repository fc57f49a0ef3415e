"""Operation names, argument checks and mismatch errors shared by the
bindings.

Operations are matched across ranks by name. An unnamed operation is named
``"<kind>.noname.<n>"`` from a per-kind counter (kolo's ``op_name``), so
unnamed operations must be issued in the same order on every rank.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional

import kolo
from kolo import _lib


def label(kind: str, name: Optional[str], index: Optional[int] = None) -> str:
    """How an error message names a tensor: ``allreduce tensor 2 'w'``."""
    s = f"{kind} tensor" if index is None else f"{kind} tensor {index}"
    return f"{s} {name!r}" if name else s


def op_name(kind: str, name: Optional[str], comm: Optional[kolo.Comm] = None) -> str:
    """The operation's name (call it after every check has passed: an
    unnamed op takes the next number of its kind, counted per comm)."""
    return kolo.op_name(kind, name or None, comm).decode()


def set_root(root_rank: Any, comm: Any, what: str) -> int:
    """A root given as a rank of the job (Horovod's convention, with process
    sets too) as a rank of ``comm`` (a process set's kolo.Comm; None: the
    job's)."""
    r = root(root_rank)
    if comm is None:
        return r
    if r not in comm.ranks:
        raise ValueError(f"kolo: {what}: root_rank {r} is not in the process set {comm.ranks}")
    return comm.ranks.index(r)


def root(root_rank: Any) -> int:
    """``root_rank`` checked: an int that is a rank of this job."""
    try:
        r = operator.index(root_rank)
    except TypeError:
        raise TypeError(f"kolo: root_rank must be an int, not {type(root_rank).__name__}") \
            from None
    n = kolo.size()
    if not 0 <= r < n:
        raise ValueError(f"kolo: root_rank {r} is not a rank of this job (size {n})")
    return r


def mismatch(what: str, shapes: List[tuple], note: str) -> kolo.MismatchError:
    """A MismatchError that lists each rank's shape, ranks with equal shapes
    together."""
    st = _lib.STATUS["EMISMATCH"]
    groups: dict = {}
    for r, s in enumerate(shapes):
        groups.setdefault(s, []).append(r)
    per_rank = "; ".join(
        f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {list(s)}"
        for s, rs in groups.items())
    return kolo.MismatchError(st, kolo.status_name(st),
                              f"{what}: mismatched shapes: {per_rank} ({note})")


def split_rows(splits: Any, n: int, rows: int, what: str) -> List[int]:
    """alltoall's rows to each rank: ``splits`` None (``rows`` split equally;
    they must divide) or ``n`` non-negative ints (a list, or anything with
    ``tolist()``) adding up to at most ``rows``."""
    if splits is None:
        if rows % n:
            raise ValueError(f"kolo: {what} has {rows} rows, which do not split equally over "
                             f"{n} ranks; pass splits")
        return [rows // n] * n
    if hasattr(splits, "tolist"):
        splits = splits.tolist()
    try:
        out = [operator.index(x) for x in splits]
    except TypeError:
        raise TypeError(f"kolo: alltoall splits must be integers, not {splits!r}") from None
    if len(out) != n or any(x < 0 for x in out):
        raise ValueError(f"kolo: alltoall splits {out} must hold {n} non-negative row counts "
                         f"(one per rank)")
    if sum(out) > rows:
        raise ValueError(f"kolo: alltoall splits {out} add up to {sum(out)} rows; the tensor "
                         f"has {rows}")
    return out


def gathered_shapes(flat: Any, counts: List[int]) -> List[tuple]:
    """Each rank's shape from an allgather of ``[ndim, *shape]`` records
    (``counts`` elements each)."""
    shapes, at = [], 0
    for c in counts:
        shapes.append(tuple(int(x) for x in flat[at + 1:at + c]))
        at += c
    return shapes


def alltoall_meta(meta_in: Any, counts: List[int]) -> tuple:
    """(rows received from each rank, each rank's trailing shape) from the
    alltoall of ``[rows, ndim - 1, *trailing]`` records."""
    recv, shapes, at = [], [], 0
    for c in counts:
        part = [int(x) for x in meta_in[at:at + c]]
        recv.append(part[0])
        shapes.append(tuple(part[2:]))
        at += c
    return recv, shapes


def predivide_scales(op: int, predivide: float, postscale: float, size: int) -> tuple:
    """(op, prescale, postscale) of a gradient reduction: Horovod's
    ``gradient_predivide_factor`` splits Average into a scale before the sum
    and one after it; ``postscale`` multiplies the result."""
    from .basics import Average, Sum
    if predivide != 1.0:
        if op != Average:
            raise ValueError("kolo: gradient_predivide_factor is only supported with "
                             "op=Average")
        return Sum, 1.0 / predivide, postscale * predivide / size
    return op, 1.0, postscale
