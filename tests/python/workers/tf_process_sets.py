"""kolo.tensorflow with process sets and Adasum, eager and inside
tf.function: every collective on the set of the even ranks, checked against
float64 references of the members' inputs; DistributedGradientTape on that
set against single-process training on the members' concatenated batches;
an outsider's op raises; Adasum against the float64 tree. Usage:
tf_process_sets.py SEED."""

import os
import sys
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

import kolo.tensorflow as hvd  # noqa: E402
from _common import Cases, adasum_ref, report  # noqa: E402

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
hvd.init()
R, N = hvd.rank(), hvd.size()
CASES = Cases(pass_case=True)
EVEN = list(range(0, N, 2))
PS = hvd.add_process_set(EVEN)


def make(case, rank, shape):
    return np.random.default_rng([SEED, zlib.crc32(case.encode()), rank]).uniform(-1, 1, shape)


def close(got, want, what, tol=1e-12):
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, np.float64)
    if got.shape != np.shape(want):
        return f"{what}: shape {got.shape}, expected {np.shape(want)}"
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    return None if err <= tol else f"{what}: error {err:.3g}"


def modes(fn):
    """Runs fn eagerly and inside a tf.function; the first failure."""
    def case(name):
        for mode in ("eager", "graph"):
            d = fn(name + "/" + mode, (lambda f: f) if mode == "eager" else tf.function)
            if d:
                return f"{mode}: {d}"
        return None
    return case


def members(case, shape, rows=None):
    return [make(case, r, (rows(r),) + shape if rows else shape) for r in EVEN]


def case_collectives(case, wrap):
    if R not in EVEN:
        return None
    x = make(case, R, (4, 3))
    d = close(wrap(lambda: hvd.allreduce(x, op=hvd.Sum, process_set=PS))(),
              sum(members(case, (4, 3))), "allreduce")
    g = make(case + "g", R, (R + 1, 2))
    d = d or close(wrap(lambda: hvd.allgather(g, process_set=PS))(),
                   np.concatenate(members(case + "g", (2,), lambda r: r + 1)), "allgather")
    root = EVEN[-1]
    d = d or close(wrap(lambda: hvd.broadcast(x, root, process_set=PS))(),
                   make(case, root, (4, 3)), "broadcast")
    n, me = len(EVEN), EVEN.index(R)
    a = make(case + "a", R, (2 * n, 2))
    d = d or close(wrap(lambda: hvd.alltoall(a, process_set=PS))(),
                   np.concatenate([make(case + "a", r, (2 * n, 2))[2 * me:2 * me + 2]
                                   for r in EVEN]), "alltoall")
    rs = make(case + "r", R, (n, 2))
    d = d or close(wrap(lambda: hvd.reducescatter(rs, op=hvd.Sum, process_set=PS))(),
                   sum(make(case + "r", r, (n, 2)) for r in EVEN)[me:me + 1], "reducescatter")
    return d


def case_tape(case, wrap):
    """One DistributedGradientTape step on the even ranks' set."""
    if R not in EVEN:
        return None
    w0 = make("w", 0, (3, 1))
    w = tf.Variable(w0)

    def step(x, y):
        with tf.GradientTape() as t:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        tape = hvd.DistributedGradientTape(t, process_set=PS)
        return tape.gradient(loss, [w])[0]

    xs = {r: make(case + "x", r, (5, 3)) for r in EVEN}
    ys = {r: make(case + "y", r, (5, 1)) for r in EVEN}
    got = wrap(step)(tf.constant(xs[R]), tf.constant(ys[R]))
    xa, ya = np.concatenate([xs[r] for r in EVEN]), np.concatenate([ys[r] for r in EVEN])
    want = 2 * xa.T @ (xa @ w0 - ya) / len(xa)
    return close(got, want, "tape gradient")


def case_adasum(case, wrap):
    x = make(case, R, (64,))
    got = wrap(lambda: hvd.allreduce(x, op=hvd.Adasum))()
    return close(got, adasum_ref([make(case, r, (64,)) for r in range(N)]), "adasum", 1e-12)


def case_outsider(case):
    if R in EVEN:
        return None if hvd.process_set_included_op(PS.process_set_id).numpy() == 1 else \
            "process_set_included_op is not 1 on a member"
    try:
        hvd.allreduce(np.ones(2), process_set=PS)
    except ValueError as e:
        return None if "not in" in str(e) else str(e)
    return "an outsider's op did not raise"


CASES.run("collectives", modes(case_collectives))
CASES.run("tape", modes(case_tape))
CASES.run("adasum", modes(case_adasum))
CASES.run("outsider", case_outsider)
report({"cases": CASES.count})
hvd.shutdown()
