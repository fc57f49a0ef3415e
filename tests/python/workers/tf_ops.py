"""Every collective of kolo.tensorflow on every dtype, eager and inside
tf.function, checked on each rank against a float64 numpy reference.

Usage: tf_ops.py SEED. Each case's input on rank i comes from a generator
seeded with (SEED, case name, i), so every rank regenerates every rank's
input and computes the expected result without kolo. Each case reports
{"case", "ok", "detail"}; the last report is {"cases": n}.
"""

import os
import sys
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

import kolo  # noqa: E402
import kolo.tensorflow as hvd  # noqa: E402
from _common import Cases, report  # noqa: E402
from _common import reduce_ref as _reduce_ref  # noqa: E402

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
hvd.init()
R, N = hvd.rank(), hvd.size()

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}
MODES = ["eager", "graph"]


def np_dtype(d):
    return ml_dtypes.bfloat16 if d == "bfloat16" else np.dtype(d)


def make(case, rank, shape, dtype, kind="any"):
    g = np.random.default_rng([SEED, zlib.crc32(case.encode()), rank])
    if dtype == "bool":
        return g.integers(0, 2, size=shape).astype(bool)
    if dtype in FLOATS:
        a = g.uniform(0.5, 1.5, size=shape) if kind == "product" else g.uniform(-1, 1, shape)
        return a.astype(np_dtype(dtype))
    lo, hi = (-2, 3) if kind == "product" else (-5, 6)
    return g.integers(0 if dtype == "uint8" else lo, hi, size=shape).astype(dtype)


def f64(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x).astype(np.float64)


def reduce_ref(xs, op, dtype, pre=1.0, post=1.0):
    """(expected, error bound) of op over the float64 inputs ``xs``."""
    return _reduce_ref(xs, op, dtype, N, pre, post)


def check(got, expected, bound=0.0, dtype=None, shape=None):
    if dtype is not None and got.dtype.name != dtype:
        return f"dtype {got.dtype.name}, expected {dtype}"
    if shape is not None and tuple(got.shape) != tuple(shape):
        return f"shape {tuple(got.shape)}, expected {tuple(shape)}"
    g = f64(got)
    e = np.broadcast_to(np.asarray(expected, np.float64), g.shape)
    b = np.broadcast_to(np.asarray(bound, np.float64), g.shape)
    bad = ~(np.abs(g - e) <= b)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        return (f"{bad.sum()} of {bad.size} wrong; first at {i}: got {g.flat[i]!r}, "
                f"expected {e.flat[i]!r} (bound {b.flat[i]:.3g})")
    return None


def first(*details):
    return next((d for d in details if d), None)


def in_mode(mode, fn, *args):
    """fn(*args) eagerly, or inside a fresh tf.function."""
    if mode == "eager":
        return fn(*args)
    return tf.function(fn)(*args)


CASES = Cases(pass_case=True, limit=6)
run = CASES.run

# ---- allreduce -----------------------------------------------------------------


def case_allreduce(dtype, op, mode, pre=1.0, post=1.0):
    def fn(case):
        kind = "product" if op == "product" else "any"
        xs = [make(case, i, (3, 5), dtype, kind) for i in range(N)]
        e, b = reduce_ref([x.astype(np.float64) for x in xs], op, dtype, pre, post)
        out = in_mode(mode, lambda x: hvd.allreduce(x, op=OPS[op], prescale_factor=pre,
                                                    postscale_factor=post),
                      tf.constant(xs[R]))
        return check(out, e, b, dtype, (3, 5))
    return fn


for mode in MODES:
    for d in FLOATS + INTS:
        for o in OPS:
            run(f"allreduce/{d}/{o}/{mode}", case_allreduce(d, o, mode))
    for o in ("min", "max"):
        run(f"allreduce/bool/{o}/{mode}", case_allreduce("bool", o, mode))
    for d in ("float32", "float64"):
        run(f"allreduce_scaled/{d}/{mode}", case_allreduce(d, "sum", mode, 0.5, 3.0))


def case_allreduce_variable(case):
    xs = [make(case, i, (4,), "float32") for i in range(N)]
    v = tf.Variable(xs[R])
    e, b = reduce_ref([x.astype(np.float64) for x in xs], "average", "float32")
    return check(hvd.allreduce(v), e, b, "float32")


run("allreduce/variable", case_allreduce_variable)


def case_grouped(mode):
    def fn(case):
        dts = ["float32", "float64", "int32", "float32"]
        xs = [[make(f"{case}{j}", i, (j + 1, 2), d) for i in range(N)]
              for j, d in enumerate(dts)]
        outs = in_mode(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum),
                       *[tf.constant(x[R]) for x in xs])
        return first(*[check(o, *reduce_ref([a.astype(np.float64) for a in x], "sum", d), d)
                       for o, x, d in zip(outs, xs, dts)])
    return fn


for mode in MODES:
    run(f"grouped_allreduce/{mode}", case_grouped(mode))


def case_sparse(mode):
    def fn(case):
        vals = [make(case, i, (i + 1, 3), "float32") for i in range(N)]
        idx = [np.arange(i + 1, dtype=np.int64) * 2 for i in range(N)]

        def f(v, ix):
            s = hvd.allreduce(tf.IndexedSlices(v, ix, dense_shape=[2 * N + 2, 3]))
            return tf.convert_to_tensor(s)

        dense = in_mode(mode, f, tf.constant(vals[R]), tf.constant(idx[R]))
        want = np.zeros((2 * N + 2, 3))
        for v, ix in zip(vals, idx):
            np.add.at(want, ix, v.astype(np.float64) / N)
        return check(dense, want, 1e-6)
    return fn


for mode in MODES:
    run(f"allreduce/indexed_slices/{mode}", case_sparse(mode))


def case_compression(comp, wire):
    def fn(case):
        xs = [make(case, i, (6,), "float32") for i in range(N)]
        out = hvd.allreduce(tf.constant(xs[R]), op=hvd.Sum, compression=comp)
        sent = [x.astype(np_dtype(wire)).astype(np.float64) for x in xs]
        e, b = reduce_ref(sent, "sum", wire)
        return check(out, e, b + np.abs(e) * EPS[wire], "float32")
    return fn


run("compression/fp16", case_compression(hvd.Compression.fp16, "float16"))
run("compression/bf16", case_compression(hvd.Compression.bf16, "bfloat16"))

# ---- allgather, broadcast, alltoall, reducescatter -------------------------------


def case_allgather(dtype, mode):
    def fn(case):
        xs = [make(case, i, (i + 1, 2, 3), dtype) for i in range(N)]
        out = in_mode(mode, hvd.allgather, tf.constant(xs[R]))
        return check(out, np.concatenate(xs).astype(np.float64), 0, dtype,
                     (sum(range(1, N + 1)), 2, 3))
    return fn


for mode in MODES:
    for d in FLOATS + INTS + ["bool"]:
        run(f"allgather/{d}/{mode}", case_allgather(d, mode))


def case_grouped_allgather(mode):
    def fn(case):
        a = [make(case + "a", i, (i + 1,), "float32") for i in range(N)]
        b = [make(case + "b", i, (2, 2), "int64") for i in range(N)]
        oa, ob = in_mode(mode, lambda x, y: hvd.grouped_allgather([x, y]),
                         tf.constant(a[R]), tf.constant(b[R]))
        return first(check(oa, np.concatenate(a), 0, "float32"),
                     check(ob, np.concatenate(b), 0, "int64"))
    return fn


for mode in MODES:
    run(f"grouped_allgather/{mode}", case_grouped_allgather(mode))


def case_broadcast(dtype, mode):
    def fn(case):
        root = N - 1
        xs = [make(case, i, (2, 3), dtype) for i in range(N)]
        out = in_mode(mode, lambda x: hvd.broadcast(x, root), tf.constant(xs[R]))
        return check(out, xs[root].astype(np.float64), 0, dtype, (2, 3))
    return fn


for mode in MODES:
    for d in FLOATS + INTS + ["bool"]:
        run(f"broadcast/{d}/{mode}", case_broadcast(d, mode))


def case_broadcast_vars(mode):
    def fn(case):
        a = [make(case + "a", i, (3,), "float32") for i in range(N)]
        b = [make(case + "b", i, (2, 2), "int32") for i in range(N)]
        va, vb = tf.Variable(a[R]), tf.Variable(b[R])
        if mode == "eager":
            hvd.broadcast_variables([va, vb], root_rank=1 % N)
        else:
            tf.function(lambda: hvd.broadcast_([va, vb], 1 % N))()
        return first(check(va, a[1 % N], 0), check(vb, b[1 % N], 0))
    return fn


for mode in MODES:
    run(f"broadcast_variables/{mode}", case_broadcast_vars(mode))


def case_alltoall(mode, equal):
    def fn(case):
        # rank i sends (i + j) % 3 rows to rank j (equal: 2 rows to each)
        splits = [[2 if equal else (i + j) % 3 for j in range(N)] for i in range(N)]
        xs = [make(case, i, (sum(splits[i]) + (0 if equal else 1), 2), "float32")
              for i in range(N)]
        if equal:
            out = in_mode(mode, hvd.alltoall, tf.constant(xs[R]))
            recv = None
        else:
            out, recv = in_mode(mode, lambda x, s: hvd.alltoall(x, splits=s),
                                tf.constant(xs[R]), tf.constant(splits[R], tf.int32))
        want = []
        for i in range(N):
            at = sum(splits[i][:R])
            want.append(xs[i][at:at + splits[i][R]])
        want = np.concatenate(want)
        return first(check(out, want, 0, "float32", want.shape),
                     None if recv is None else check(recv, [splits[i][R] for i in range(N)]))
    return fn


for mode in MODES:
    run(f"alltoall/splits/{mode}", case_alltoall(mode, False))
    run(f"alltoall/equal/{mode}", case_alltoall(mode, True))


def case_reducescatter(op, extra, mode):
    def fn(case):
        rows = 2 * N + extra
        xs = [make(case, i, (rows, 3), "float32") for i in range(N)]
        e, b = reduce_ref([x.astype(np.float64) for x in xs], op, "float32")
        q, r = divmod(rows, N)
        start = R * q + min(R, r)
        mine = q + (1 if R < r else 0)
        out = in_mode(mode, lambda x: hvd.reducescatter(x, op=OPS[op]), tf.constant(xs[R]))
        return check(out, e[start:start + mine], b[start:start + mine], "float32", (mine, 3))
    return fn


for mode in MODES:
    run(f"reducescatter/sum/rows+1/{mode}", case_reducescatter("sum", 1, mode))
    run(f"reducescatter/average/rows+0/{mode}", case_reducescatter("average", 0, mode))


def case_grouped_reducescatter(case):
    xs = [make(case, i, (N, 2), "float64") for i in range(N)]
    ys = [make(case + "y", i, (2 * N,), "float32") for i in range(N)]
    ox, oy = hvd.grouped_reducescatter([tf.constant(xs[R]), tf.constant(ys[R])], op=hvd.Sum)
    ex, bx = reduce_ref(xs, "sum", "float64")
    ey, by = reduce_ref([y.astype(np.float64) for y in ys], "sum", "float32")
    return first(check(ox, ex[R:R + 1], bx[R:R + 1]), check(oy, ey[2 * R:2 * R + 2],
                                                               by[2 * R:2 * R + 2]))


run("grouped_reducescatter", case_grouped_reducescatter)

# ---- gradients (Horovod's rules) ---------------------------------------------------


def grad_of(mode, f, x):
    def g(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = f(v)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, v)
    return in_mode(mode, g, x)


def case_grad(kind, mode):
    def fn(case):
        xs = [make(case, i, (N, 2), "float64") for i in range(N)]
        x = tf.constant(xs[R])
        if kind == "allreduce_sum":
            # d/dx_R sum((sum_i x_i)^2) through Horovod's rule: allreduce_sum(2 y)
            s = np.sum(xs, axis=0)
            got = grad_of(mode, lambda v: hvd.allreduce(v, op=hvd.Sum), x)
            return check(got, N * 2 * s, 1e-9)
        if kind == "allgather":
            got = grad_of(mode, hvd.allgather, x)
            full = np.concatenate(xs)
            return check(got, 2 * full[R * N:(R + 1) * N], 1e-9)
        if kind == "broadcast":
            got = grad_of(mode, lambda v: hvd.broadcast(v, 0), x)
            return check(got, 2 * xs[0] if R == 0 else 0 * xs[0], 1e-9)
        if kind == "reducescatter":
            got = grad_of(mode, lambda v: hvd.reducescatter(v, op=hvd.Sum), x)
            s = np.sum(xs, axis=0)  # rank j holds row j of the sum; dL/dy_j = 2 s_j
            return check(got, N * 2 * s, 1e-9)
        if kind == "alltoall":
            got = grad_of(mode, hvd.alltoall, x)
            # rank R sends row j to rank j, which gets it back as its row R
            return check(got, 2 * xs[R], 1e-9)
    return fn


for mode in MODES:
    for k in ("allreduce_sum", "allgather", "broadcast", "reducescatter", "alltoall"):
        run(f"grad/{k}/{mode}", case_grad(k, mode))

# ---- the tape against single-process training on the concatenated batch ----------


def case_tape(mode, predivide):
    def fn(case):
        w0 = make(case + "w", 0, (3, 2), "float64")
        xs = [make(case, i, (4, 3), "float64") for i in range(N)]
        ys = [make(case + "y", i, (4, 2), "float64") for i in range(N)]
        w = tf.Variable(w0, name="w")
        b = tf.Variable(np.zeros(2), name="b")

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((x @ w + b - y) ** 2)
            tape = hvd.DistributedGradientTape(tape, gradient_predivide_factor=predivide)
            return tape.gradient(loss, [w, b])

        gw, gb = in_mode(mode, step, tf.constant(xs[R]), tf.constant(ys[R]))
        X, Y = np.concatenate(xs), np.concatenate(ys)
        r = X @ w0 - Y
        return first(check(gw, 2 * X.T @ r / r.size, 1e-12),
                     check(gb, 2 * r.sum(0) / r.size, 1e-12))
    return fn


for mode in MODES:
    run(f"tape/{mode}", case_tape(mode, 1.0))
run("tape/predivide/graph", case_tape("graph", 2.0))


def case_tape_local(case):
    w, loc = tf.Variable([[1.0], [2.0]]), tf.Variable([float(R + 1)])
    x = tf.constant([[1.0, float(R)]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(x @ w * loc)
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(loc)
    gw, gl = tape.gradient(loss, [w, loc])
    ew = np.mean([[[1.0 * (i + 1)], [float(i) * (i + 1)]] for i in range(N)], axis=0)
    return first(check(gw, ew, 1e-6), check(gl, [(1.0 + 2.0 * R) / N], 1e-6))


run("tape/local_source", case_tape_local)

# ---- names, retracing, errors, XLA --------------------------------------------------


def case_retrace(case):
    f = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum))
    outs = [f(tf.ones([k], tf.float32) * (R + 1)) for k in (2, 3, 2)]
    want = N * (N + 1) / 2
    return first(*[check(o, want) for o in outs],
                 None if f.experimental_get_tracing_count() == 2 else
                 f"{f.experimental_get_tracing_count()} traces")


run("graph/retrace", case_retrace)


def case_mismatch(case):
    x = tf.zeros([1, 2 if R == 0 else 3])
    try:
        hvd.allgather(x, name="mismatch")
    except kolo.MismatchError as e:
        msg = str(e)
        want = "rank 0: [1, 2]" if N == 2 else "rank 0: [1, 2]; ranks 1"
        return None if want in msg else f"message does not name the ranks: {msg}"
    return "no MismatchError"


run("errors/allgather_shape_mismatch", case_mismatch)


def case_bad_dtype(case):
    try:
        hvd.allreduce(tf.constant([1 + 2j]))
    except TypeError as e:
        return None if "complex128" in str(e) else f"message: {e}"
    return "no TypeError"


run("errors/dtype", case_bad_dtype)


def case_xla(case):
    f = tf.function(lambda x: hvd.allreduce(x), jit_compile=True)
    try:
        f(tf.ones([2]))
    except hvd.XlaError as e:
        return None if "jit_compile" in str(e) else f"message: {e}"
    return "no XlaError"


run("errors/xla", case_xla)

# ---- objects, topology ops, join, barrier ------------------------------------------


def case_objects(case):
    o = hvd.broadcast_object({"from": R, "list": [R] * 3}, root_rank=N - 1)
    g = hvd.allgather_object(("r", R))
    fn_result = hvd.broadcast_object_fn(root_rank=0)(lambda: f"only {R}")()
    return first(None if o == {"from": N - 1, "list": [N - 1] * 3} else f"broadcast {o}",
                 None if g == [("r", i) for i in range(N)] else f"allgather {g}",
                 None if fn_result == "only 0" else f"broadcast_object_fn {fn_result}")


run("objects", case_objects)


def case_topology_ops(case):
    s, r = tf.function(lambda: (hvd.size_op(), hvd.rank_op()))()
    return first(check(s, N), check(r, R),
                 None if hvd.is_homogeneous() else "not homogeneous on one host")


run("graph/topology_ops", case_topology_ops)


def case_barrier_join(case):
    hvd.barrier()
    tf.function(lambda: hvd.barrier())()
    last = hvd.join()
    return None if 0 <= int(last) < N else f"join returned {last}"


run("barrier_join", case_barrier_join)



def case_sync_bn(mode):
    def fn(case):
        xs = [make(case, i, (i + 2, 4), "float32") for i in range(N)]
        layer = hvd.SyncBatchNormalization()
        y = in_mode(mode, lambda x: layer(x, training=True), tf.constant(xs[R]))
        X = np.concatenate(xs).astype(np.float64)
        want = (xs[R] - X.mean(0)) / np.sqrt(X.var(0) + layer.epsilon)
        return check(y, want, 1e-4)
    return fn


for mode in MODES:
    run(f"sync_batch_norm/{mode}", case_sync_bn(mode))

report({"cases": CASES.count})
hvd.shutdown()
