"""kolo's Adasum (op="adasum") on numpy arrays, checked on each rank against
a float64 numpy implementation of the same tree (_common.adasum_ref) over
every rank's input. Usage: core_adasum.py SEED. Reports each case, then
{"cases": n}."""

import sys
import zlib

import numpy as np

import kolo
from _common import Cases, adasum_ref, report

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
kolo.init()
R, N = kolo.rank(), kolo.size()
CASES = Cases(pass_case=True)


def data(case, rank, n):
    """A direction every rank shares plus a rank's own part: dot products
    far from 0, coefficients far from 1."""
    g = np.random.default_rng([SEED, zlib.crc32(case.encode()), rank])
    common = np.random.default_rng([SEED, zlib.crc32(case.encode())]).normal(size=n)
    return common + 0.7 * g.normal(size=n)


def check(case, got, want, tol):
    err = float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))
    return None if err <= tol else f"relative error {err:.3g} > {tol}"


def case_float64(case):
    x = data(case, R, 4099)
    out = kolo.allreduce_async(x, np.empty_like(x), op="adasum").wait()
    return check(case, out, adasum_ref([data(case, r, 4099) for r in range(N)]), 1e-13)


def case_float32_scaled(case):
    x = data(case, R, 1000).astype(np.float32)
    out = kolo.allreduce_async(x, op="adasum", prescale=0.5, postscale=3.0).wait()
    want = 3.0 * adasum_ref([0.5 * data(case, r, 1000).astype(np.float32) for r in range(N)])
    return check(case, out, want, 1e-5)


def case_in_flight(case):
    """Three tensors in flight at once, never fused: each its own Adasum."""
    xs = [data(f"{case}/{i}", R, 300 + i) for i in range(3)]
    hs = [kolo.allreduce_async(x, name=f"{case}.{i}", op="adasum") for i, x in enumerate(xs)]
    for i, h in enumerate(hs):
        d = check(case, h.wait(), adasum_ref([data(f"{case}/{i}", r, 300 + i)
                                             for r in range(N)]), 1e-13)
        if d:
            return f"tensor {i}: {d}"
    return None


def case_grouped(case):
    xs = [data(f"{case}/{i}", R, 50 * (i + 1)) for i in range(2)]
    kolo.grouped_allreduce_async(xs, name=case, op="adasum").wait()
    for i, x in enumerate(xs):
        d = check(case, x, adasum_ref([data(f"{case}/{i}", r, 50 * (i + 1))
                                       for r in range(N)]), 1e-13)
        if d:
            return f"member {i}: {d}"
    return None


def case_identical_and_zero(case):
    """Equal vectors come back unchanged (each coefficient 1/2 in a pair);
    a rank's zero vector leaves its partner's as it is."""
    x = np.arange(8.0)
    out = kolo.allreduce_async(x.copy(), op="adasum").wait()
    if not np.allclose(out, x, rtol=1e-14, atol=0):
        return f"identical inputs gave {out}"
    z = np.zeros(8) if R % 2 else np.arange(8.0) + R
    out = kolo.allreduce_async(z, op="adasum").wait()
    want = adasum_ref([np.zeros(8) if r % 2 else np.arange(8.0) + r for r in range(N)])
    return check(case, out, want, 1e-14)


def case_integers_refused(case):
    try:
        kolo.allreduce_async(np.ones(4, dtype=np.int32), op="adasum")
    except TypeError as e:
        return None if "floating-point" in str(e) else str(e)
    return "an int32 Adasum did not raise"


for name, fn in [("float64", case_float64), ("float32_scaled", case_float32_scaled),
                 ("in_flight", case_in_flight), ("grouped", case_grouped),
                 ("identical_and_zero", case_identical_and_zero),
                 ("integers_refused", case_integers_refused)]:
    CASES.run(name, fn)
report({"cases": CASES.count})
kolo.finalize()
