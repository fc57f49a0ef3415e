"""Inputs of the core-op workers, a pure function of (name, rank): the
workers feed them to kolo and the tests regenerate them to compute their
own float64 references.

Values are chosen so that the references are exact where the dtype allows:
small integers (sums and products that neither wrap nor lose bits), and
float16 values on a grid of 1/4 whose sums stay exact; float32/float64 sums
of normal draws are compared within the dtype's round-off."""

from __future__ import annotations

import zlib

import numpy as np

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "float32", "float64"]
OPS = ["sum", "average", "min", "max", "product"]
SCALES = [(1.0, 1.0), (0.5, 3.0)]  # (prescale, postscale)
COUNTS = [1, 7, 33]


def rng(name: str, rank: int) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(name.encode()), rank])


def values(name: str, rank: int, dtype: str, count: int, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input of ``count`` elements for operation ``name``."""
    g = rng(name, rank)
    if dtype == "bool":
        return g.integers(0, 2, count).astype(bool)
    if op == "product":
        if dtype == "uint8":
            return g.integers(0, 4, count).astype(dtype)
        if dtype.startswith("int"):
            return g.integers(-2, 3, count).astype(dtype)
        return g.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0], count).astype(dtype)
    if dtype == "int8":
        return g.integers(-30, 31, count).astype(dtype)
    if dtype == "uint8":
        return g.integers(0, 61, count).astype(dtype)
    if dtype == "int32":
        return g.integers(-10**6, 10**6, count).astype(dtype)
    if dtype == "int64":
        return g.integers(-10**12, 10**12, count).astype(dtype)
    if dtype == "float16":
        return (g.integers(-256, 257, count) / 4).astype(dtype)
    return g.standard_normal(count).astype(dtype)


def allreduce_cases(size: int) -> list[dict]:
    """Every allreduce the ops worker runs: name, dtype, op, scales, count,
    and whether it is in place."""
    cases = []
    i = 0
    for dt in DTYPES:
        for op in OPS:
            for pre, post in SCALES:
                cases.append(dict(name=f"ar.{dt}.{op}.{pre}.{post}", dtype=dt, op=op, pre=pre,
                                  post=post, count=COUNTS[i % len(COUNTS)],
                                  inplace=i % 2 == 0))
                i += 1
    for op in ("min", "max"):
        cases.append(dict(name=f"ar.bool.{op}", dtype="bool", op=op, pre=1.0, post=1.0,
                          count=9, inplace=op == "min"))
    # Larger than one pipeline segment and not a multiple of the rank count.
    cases.append(dict(name="ar.big.float32.sum", dtype="float32", op="sum", pre=1.0, post=1.0,
                      count=40_003, inplace=True))
    cases.append(dict(name="ar.big.int32.average", dtype="int32", op="average", pre=1.0,
                      post=1.0, count=30_001, inplace=False))
    return cases


def alltoall_splits(rank: int, size: int) -> list[int]:
    """How many elements rank ``rank`` sends to each rank (some zero)."""
    return [(rank + j) % 3 for j in range(size)]


def allgather_count(rank: int, kind: str) -> int:
    return rank + 1 if kind == "float64" else (rank % 2) * 3
