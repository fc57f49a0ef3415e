"""Every collective of kolo.torch on every dtype, checked on each rank
against a float64 numpy reference.

Usage: ops_collectives.py SEED. Each case's input on rank i comes from a
generator seeded with (SEED, case name, i), so every rank regenerates every
rank's input and computes the expected result without kolo. Each case
reports {"case", "ok", "detail"}; the last report is {"cases": n}.
"""

import sys
import zlib

import numpy as np
import torch

torch.set_num_threads(1)

import kolo.torch as hvd  # noqa: E402
from _common import Cases, report  # noqa: E402
from _common import reduce_ref as _reduce_ref  # noqa: E402

SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1

hvd.init()
R, N = hvd.rank(), hvd.size()

FLOATS = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
INTS = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64}
DTYPES = {**FLOATS, **INTS}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
       "float64": 2.0 ** -52}
OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}



def rng(case, rank):
    return np.random.default_rng([SEED, zlib.crc32(case.encode()), rank])


def make(case, rank, shape, dtype, kind="any"):
    """Rank ``rank``'s input of ``case``: floats in [-1, 1] ([0.5, 1.5] for
    products), small integers that cannot overflow any op on 4 ranks."""
    g = rng(case, rank)
    if dtype == "bool":
        return torch.from_numpy(g.integers(0, 2, size=shape).astype(bool))
    if dtype in FLOATS:
        a = g.uniform(0.5, 1.5, size=shape) if kind == "product" else \
            g.uniform(-1, 1, size=shape)
        return torch.from_numpy(a).to(FLOATS[dtype])
    lo, hi = (-2, 3) if kind == "product" else (-5, 6)
    if dtype == "uint8":
        lo, hi = 0, hi
    return torch.from_numpy(g.integers(lo, hi, size=shape)).to(INTS[dtype])


def f64(t):
    return t.detach().to(torch.float64).numpy() if t.dtype != torch.bool else \
        t.numpy().astype(np.float64)


def reduce_ref(xs, op, dtype, pre=1.0, post=1.0):
    """(expected, error bound) of op over the float64 inputs ``xs``."""
    return _reduce_ref(xs, op, dtype, N, pre, post)


def check(case, got, expected, bound=None, dtype=None, shape=None):
    if dtype is not None and got.dtype != dtype:
        return f"dtype {got.dtype}, expected {dtype}"
    if shape is not None and tuple(got.shape) != tuple(shape):
        return f"shape {tuple(got.shape)}, expected {tuple(shape)}"
    g = f64(got)
    e = np.asarray(expected, dtype=np.float64).reshape(g.shape)
    b = np.zeros_like(e) if bound is None else np.asarray(bound).reshape(g.shape)
    bad = ~(np.abs(g - e) <= b)
    if bad.any():
        i = np.flatnonzero(bad)[0]
        return (f"{bad.sum()} of {bad.size} elements wrong; first at flat index {i}: got "
                f"{g.flat[i]!r}, expected {e.flat[i]!r} (bound {b.flat[i]:.3g})")
    return None


CASES = Cases(pass_case=True, limit=4)
run = CASES.run


def first(*details):
    return next((d for d in details if d), None)


# ---- allreduce: every dtype x op, the four call forms in turn -------------------

FORMS = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_"]


def allreduce_form(form, x, **kw):
    """Runs one of the four forms; returns (result, input unchanged?/same object?)."""
    before = x.clone()
    if form == "allreduce":
        out = hvd.allreduce(x, **kw)
        return out, torch.equal(x, before) and out is not x
    if form == "allreduce_":
        out = hvd.allreduce_(x, **kw)
        return out, out is x
    if form == "allreduce_async":
        out = hvd.synchronize(hvd.allreduce_async(x, **kw))
        return out, torch.equal(x, before) and out is not x
    h = hvd.allreduce_async_(x, **kw)
    out = hvd.synchronize(h)
    return out, out is x


def case_allreduce(dtype, op, form, shape=(3, 5)):
    def fn(case):
        kind = "product" if op == "product" else "any"
        xs = [make(case, i, shape, dtype, kind) for i in range(N)]
        e, b = reduce_ref([f64(x) for x in xs], op, dtype)
        out, form_ok = allreduce_form(form, xs[R], op=OPS[op])
        want = torch.bool if dtype == "bool" else DTYPES[dtype]
        return first(None if form_ok else f"{form}: wrong aliasing or input modified",
                     check(case, out, e, b, want, shape))
    return fn


i = 0
for dt in DTYPES:
    for op in OPS:
        run(f"allreduce/{dt}/{op}", case_allreduce(dt, op, FORMS[i % 4]))
        i += 1
for op in ("min", "max"):
    run(f"allreduce/bool/{op}", case_allreduce("bool", op, FORMS[i % 4]))
    i += 1


def case_scaled(dtype, op, form):
    def fn(case):
        xs = [make(case, i, (17,), dtype) for i in range(N)]
        e, b = reduce_ref([f64(x) for x in xs], op, dtype, pre=0.5, post=3.0)
        out, _ = allreduce_form(form, xs[R], op=OPS[op], prescale_factor=0.5,
                                postscale_factor=3.0)
        return check(case, out, e, b, FLOATS[dtype])
    return fn


for dt in FLOATS:
    for op in ("sum", "average"):
        run(f"allreduce_scaled/{dt}/{op}", case_scaled(dt, op, FORMS[i % 4]))
        i += 1


def case_average_arg(average):
    def fn(case):
        import warnings

        xs = [make(case, i, (6,), "float32") for i in range(N)]
        e, b = reduce_ref([f64(x) for x in xs], "average" if average else "sum", "float32")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = hvd.allreduce(xs[R], average=average)
        warned = any(issubclass(x.category, DeprecationWarning) for x in w)
        return first(None if warned else "no DeprecationWarning for average=",
                     check(case, out, e, b, torch.float32))
    return fn


run("allreduce_average_arg/true", case_average_arg(True))
run("allreduce_average_arg/false", case_average_arg(False))


def case_default_op(case):
    xs = [make(case, i, (5,), "float64") for i in range(N)]
    e, b = reduce_ref([f64(x) for x in xs], "average", "float64")
    return check(case, hvd.allreduce(xs[R]), e, b, torch.float64)


run("allreduce_default_is_average", case_default_op)


def case_fused(case):
    """Many async allreduces in flight at once (fused by the engine),
    synchronized in reverse order, polled first."""
    specs = [(dt, (k * 7 + 1,)) for k, dt in enumerate(list(DTYPES) * 2)]
    xs = {k: [make(f"{case}/{k}", i, shape, dt) for i in range(N)]
          for k, (dt, shape) in enumerate(specs)}
    handles = [hvd.allreduce_async(xs[k][R], name=f"{case}.{k}", op=hvd.Sum)
               for k in range(len(specs))]
    # Spin on poll: it must become true once every rank has enqueued.
    import time

    deadline = time.monotonic() + 60
    while not all(hvd.poll(h) for h in handles):
        if time.monotonic() > deadline:
            return "poll() never became true"
        time.sleep(0.001)
    for k in reversed(range(len(specs))):
        dt, shape = specs[k]
        e, b = reduce_ref([f64(x) for x in xs[k]], "sum", dt)
        d = check(case, hvd.synchronize(handles[k]), e, b, DTYPES[dt], shape)
        if d:
            return f"tensor {k} ({dt}): {d}"
    return None


run("allreduce_fused_poll", case_fused)


def case_sync_unknown(case):
    return None if hvd.synchronize(10 ** 9) is None else "synchronize(unknown) is not None"


run("synchronize_unknown_handle", case_sync_unknown)


def case_empty(case):
    out = hvd.allreduce(torch.empty(0, 3), op=hvd.Sum)
    return None if tuple(out.shape) == (0, 3) else f"shape {tuple(out.shape)}"


run("allreduce_empty", case_empty)


# ---- grouped allreduce ------------------------------------------------------

GFORMS = ["grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
          "grouped_allreduce_async_"]


def case_grouped(form, dtype, op):
    def fn(case):
        shapes = [(3,), (2, 4), (1,), (5, 1)]
        xs = [[make(f"{case}/{k}", i, s, dtype) for k, s in enumerate(shapes)]
              for i in range(N)]
        mine = xs[R]
        refs = [reduce_ref([f64(xs[i][k]) for i in range(N)], op, dtype)
                for k in range(len(shapes))]
        if form == "grouped_allreduce":
            outs = hvd.grouped_allreduce(mine, op=OPS[op])
        elif form == "grouped_allreduce_":
            outs = hvd.grouped_allreduce_(mine, op=OPS[op])
        elif form == "grouped_allreduce_async":
            outs = hvd.synchronize(hvd.grouped_allreduce_async(mine, op=OPS[op]))
        else:
            outs = hvd.synchronize(hvd.grouped_allreduce_async_(mine, op=OPS[op]))
        outs = list(outs)
        if len(outs) != len(shapes):
            return f"{len(outs)} outputs for {len(shapes)} inputs"
        if form.endswith("_") and any(o is not m for o, m in zip(outs, mine)):
            return "in-place form did not return its inputs"
        for k, s in enumerate(shapes):
            e, b = refs[k]
            d = check(case, outs[k], e, b, DTYPES[dtype], s)
            if d:
                return f"tensor {k}: {d}"
        return None
    return fn


for k, form in enumerate(GFORMS):
    dt, op = [("float32", "sum"), ("float64", "average"), ("bfloat16", "max"),
              ("int32", "sum")][k]
    run(f"{form}/{dt}/{op}", case_grouped(form, dt, op))


# ---- allgather --------------------------------------------------------------

def rows_of(i):
    return (i * 2 + 1) % 3  # 1, 0, 2, 1: rank 1 sends no rows


def case_allgather(dtype, form, trailing=(3,)):
    def fn(case):
        xs = [make(case, i, (rows_of(i),) + trailing, dtype) for i in range(N)]
        e = np.concatenate([f64(x) for x in xs])
        if form == "allgather":
            out = hvd.allgather(xs[R])
        else:
            out = hvd.synchronize(hvd.allgather_async(xs[R]))
        want = torch.bool if dtype == "bool" else DTYPES[dtype]
        return check(case, out, e, None, want, e.shape)
    return fn


for k, dt in enumerate(list(DTYPES) + ["bool"]):
    run(f"allgather/{dt}", case_allgather(dt, ["allgather", "allgather_async"][k % 2]))
run("allgather/float32/1d", case_allgather("float32", "allgather", trailing=()))
run("allgather/int64/3d", case_allgather("int64", "allgather_async", trailing=(2, 2)))


def case_grouped_allgather(form):
    def fn(case):
        specs = [("float32", (2,)), ("int8", ()), ("bool", (1, 3))]
        xs = [[make(f"{case}/{k}", i, (rows_of(i) + k,) + s, dt)
               for k, (dt, s) in enumerate(specs)] for i in range(N)]
        if form == "grouped_allgather":
            outs = hvd.grouped_allgather(xs[R])
        else:
            outs = hvd.synchronize(hvd.grouped_allgather_async(xs[R]))
        for k in range(len(specs)):
            e = np.concatenate([f64(xs[i][k]) for i in range(N)])
            d = check(case, outs[k], e, None, xs[R][k].dtype, e.shape)
            if d:
                return f"tensor {k}: {d}"
        return None
    return fn


run("grouped_allgather", case_grouped_allgather("grouped_allgather"))
run("grouped_allgather_async", case_grouped_allgather("grouped_allgather_async"))


# ---- broadcast --------------------------------------------------------------

BFORMS = ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"]


def case_broadcast(dtype, form, root):
    def fn(case):
        xs = [make(case, i, (4, 3), dtype) for i in range(N)]
        x, before = xs[R], xs[R].clone()
        if form == "broadcast":
            out = hvd.broadcast(x, root)
        elif form == "broadcast_":
            out = hvd.broadcast_(x, root_rank=root)
        elif form == "broadcast_async":
            out = hvd.synchronize(hvd.broadcast_async(x, root))
        else:
            out = hvd.synchronize(hvd.broadcast_async_(x, root))
        if form.endswith("_") and out is not x:
            return "in-place form did not return its input"
        if not form.endswith("_") and (out is x or not torch.equal(x, before)):
            return "out-of-place form modified its input"
        return check(case, out, f64(xs[root]), None, x.dtype, x.shape)
    return fn


for k, dt in enumerate(list(DTYPES) + ["bool"]):
    run(f"broadcast/{dt}", case_broadcast(dt, BFORMS[k % 4], k % N))


# ---- alltoall ---------------------------------------------------------------

def splits_of(i):
    return [(i + 2 * j) % 3 for j in range(N)]  # rows rank i sends to rank j


def alltoall_ref(xs, splits):
    """(rows rank R receives, received splits)."""
    parts, recv = [], []
    for i in range(N):
        s = splits[i]
        at = sum(s[:R])
        parts.append(xs[i][at:at + s[R]])
        recv.append(s[R])
    return np.concatenate(parts), recv


def case_alltoall(dtype, how, extra_rows=0):
    def fn(case):
        splits = [splits_of(i) for i in range(N)]
        xs = [make(case, i, (sum(splits[i]) + extra_rows, 2), dtype) for i in range(N)]
        e, recv = alltoall_ref([f64(x) for x in xs], splits)
        if how == "list":
            out, got = hvd.alltoall(xs[R], splits=splits[R])
            sdt = torch.int32
        elif how == "tensor":
            out, got = hvd.alltoall(xs[R], torch.tensor(splits[R], dtype=torch.int64))
            sdt = torch.int64
        else:
            out, got = hvd.synchronize(hvd.alltoall_async(xs[R], splits[R]))
            sdt = torch.int32
        if got.dtype != sdt or got.tolist() != recv:
            return f"received splits {got.tolist()} ({got.dtype}), expected {recv} ({sdt})"
        return check(case, out, e, None, xs[R].dtype, e.shape)
    return fn


for k, dt in enumerate(["float32", "int64", "bfloat16", "bool", "float64", "uint8"]):
    run(f"alltoall/{dt}", case_alltoall(dt, ["list", "tensor", "async"][k % 3]))
run("alltoall/float32/unsent_rows", case_alltoall("float32", "list", extra_rows=2))


def case_alltoall_equal(case):
    xs = [make(case, i, (2 * N, 3), "int32") for i in range(N)]
    e = np.concatenate([f64(xs[i])[2 * R:2 * R + 2] for i in range(N)])
    out = hvd.alltoall(xs[R])
    if isinstance(out, tuple):
        return "alltoall without splits returned a tuple"
    out2, recv = hvd.synchronize(hvd.alltoall_async(xs[R]))
    return first(check(case, out, e, None, torch.int32, e.shape),
                 check(case, out2, e, None, torch.int32, e.shape),
                 None if recv.tolist() == [2] * N else f"received splits {recv.tolist()}")


run("alltoall/int32/equal_split", case_alltoall_equal)


# ---- reducescatter ----------------------------------------------------------

def scatter_rows(d0):
    q, extra = divmod(d0, N)
    rows = [q + (1 if j < extra else 0) for j in range(N)]
    return sum(rows[:R]), rows[R]


def case_reducescatter(dtype, op, d0, form, pre=1.0, post=1.0):
    def fn(case):
        kind = "product" if op == "product" else "any"
        xs = [make(case, i, (d0, 3), dtype, kind) for i in range(N)]
        e, b = reduce_ref([f64(x) for x in xs], op, dtype, pre, post)
        at, n = scatter_rows(d0)
        kw = dict(op=OPS[op], prescale_factor=pre, postscale_factor=post)
        if form == "reducescatter":
            out = hvd.reducescatter(xs[R], **kw)
        else:
            out = hvd.synchronize(hvd.reducescatter_async(xs[R], **kw))
        return check(case, out, e[at:at + n], b[at:at + n], DTYPES[dtype], (n, 3))
    return fn


k = 0
for op in ("sum", "average", "min", "max"):
    for d0 in (2 * N, 2 * N + 1):
        run(f"reducescatter/float32/{op}/rows{d0 - 2 * N:+d}",
            case_reducescatter("float32", op, d0, ["reducescatter", "reducescatter_async"][k % 2]))
        k += 1
for dt in ("float16", "bfloat16", "float64", "int32", "int8"):
    run(f"reducescatter/{dt}/sum/rows+1", case_reducescatter(dt, "sum", 2 * N + 1,
                                                             "reducescatter"))
run("reducescatter/float64/product/rows+2",
    case_reducescatter("float64", "product", 2 * N + 2 if N > 2 else 5, "reducescatter_async"))
run("reducescatter/float32/average/scaled",
    case_reducescatter("float32", "average", 3 * N - 1, "reducescatter", pre=0.5, post=3.0))
run("reducescatter/float32/sum/fewer_rows_than_ranks",
    case_reducescatter("float32", "sum", N - 1, "reducescatter"))


def case_reducescatter_default_average(case):
    xs = [make(case, i, (2 * N,), "float64") for i in range(N)]
    e, b = reduce_ref([f64(x) for x in xs], "average", "float64")
    at, n = scatter_rows(2 * N)
    return check(case, hvd.reducescatter(xs[R]), e[at:at + n], b[at:at + n], torch.float64)


run("reducescatter/default_is_average", case_reducescatter_default_average)


def case_grouped_reducescatter(form):
    def fn(case):
        specs = [("float32", (2 * N + 1, 2)), ("float64", (N,)), ("float32", (1,))]
        xs = [[make(f"{case}/{k}", i, s, dt) for k, (dt, s) in enumerate(specs)]
              for i in range(N)]
        if form == "grouped_reducescatter":
            outs = hvd.grouped_reducescatter(xs[R], op=hvd.Sum)
        else:
            outs = hvd.synchronize(hvd.grouped_reducescatter_async(xs[R], op=hvd.Sum))
        for k, (dt, s) in enumerate(specs):
            e, b = reduce_ref([f64(xs[i][k]) for i in range(N)], "sum", dt)
            at, n = scatter_rows(s[0])
            d = check(case, outs[k], e[at:at + n], b[at:at + n], DTYPES[dt], (n,) + s[1:])
            if d:
                return f"tensor {k}: {d}"
        return None
    return fn


run("grouped_reducescatter", case_grouped_reducescatter("grouped_reducescatter"))
run("grouped_reducescatter_async", case_grouped_reducescatter("grouped_reducescatter_async"))


# ---- autograd: Horovod's backward rules --------------------------------------

def leaf(case, i, shape):
    return make(case, i, shape, "float64").requires_grad_(True)


def weights(case, i, shape):
    return f64(make(case + "/w", i, shape, "float64"))


def case_grad_allreduce(op, pre, post):
    def fn(case):
        x = leaf(case, R, (4,))
        y = hvd.allreduce(x, op=OPS[op], prescale_factor=pre, postscale_factor=post)
        ws = [weights(case, i, (4,)) for i in range(N)]
        (y * torch.from_numpy(ws[R])).sum().backward()
        # d/dx of every rank's loss: the allreduce (same op, factors) of the weights.
        e, b = reduce_ref(ws, op, "float64", pre, post)
        return check(case, x.grad, e, b)
    return fn


run("grad/allreduce/sum/scaled", case_grad_allreduce("sum", 0.5, 3.0))
run("grad/allreduce/average", case_grad_allreduce("average", 1.0, 1.0))


def case_grad_allgather(case):
    x = leaf(case, R, (R + 1, 2))
    y = hvd.allgather(x)
    total = sum(i + 1 for i in range(N))
    ws = [weights(case, i, (total, 2)) for i in range(N)]
    (y * torch.from_numpy(ws[R])).sum().backward()
    at = sum(i + 1 for i in range(R))
    e = np.mean(ws, axis=0)[at:at + R + 1]  # averaged over ranks, this rank's rows
    return check(case, x.grad, e, 4 * N * EPS["float64"] * (1 + np.abs(e)))


run("grad/allgather", case_grad_allgather)


def case_grad_grouped_allgather(case):
    xs = [leaf(f"{case}/{k}", R, (R + 1 + k, 2)) for k in range(2)]
    ys = hvd.grouped_allgather(xs)
    loss, grads = 0, []
    for k in range(2):
        total = sum(i + 1 + k for i in range(N))
        ws = [weights(f"{case}/{k}", i, (total, 2)) for i in range(N)]
        loss = loss + (ys[k] * torch.from_numpy(ws[R])).sum()
        at = sum(i + 1 + k for i in range(R))
        grads.append(np.mean(ws, axis=0)[at:at + R + 1 + k])
    loss.backward()
    return first(*[check(case, xs[k].grad, grads[k],
                         4 * N * EPS["float64"] * (1 + np.abs(grads[k]))) for k in range(2)])


run("grad/grouped_allgather", case_grad_grouped_allgather)


def case_grad_broadcast(case):
    root = N - 1
    x = leaf(case, R, (3,))
    y = hvd.broadcast(x, root)
    ws = [weights(case, i, (3,)) for i in range(N)]
    (y * torch.from_numpy(ws[R])).sum().backward()
    e = np.mean(ws, axis=0) if R == root else np.zeros(3)
    return first(check(case, y, f64(make(case, root, (3,), "float64"))),
                 check(case, x.grad, e, 4 * N * EPS["float64"] * (1 + np.abs(e))))


run("grad/broadcast", case_grad_broadcast)


def case_grad_alltoall(case):
    splits = [splits_of(i) for i in range(N)]
    x = leaf(case, R, (sum(splits[R]) + 1, 2))  # the last row is not sent
    y, recv = hvd.alltoall(x, splits=splits[R])
    ws = [weights(case, i, (sum(s[i] for s in splits), 2)) for i in range(N)]
    (y * torch.from_numpy(ws[R])).sum().backward()
    # Row block R->j of x lands in rank j's output after the blocks of ranks < R.
    e = np.zeros((sum(splits[R]) + 1, 2))
    at = 0
    for j in range(N):
        off = sum(splits[i][j] for i in range(R))
        e[at:at + splits[R][j]] = ws[j][off:off + splits[R][j]]
        at += splits[R][j]
    return check(case, x.grad, e)


run("grad/alltoall", case_grad_alltoall)


def case_grad_reducescatter(op):
    def fn(case):
        d0 = 2 * N + 1
        x = leaf(case, R, (d0, 2))
        y = hvd.reducescatter(x, op=OPS[op])
        blocks = [divmod(d0, N)[0] + (1 if j < d0 % N else 0) for j in range(N)]
        ws = [weights(case, i, (blocks[i], 2)) for i in range(N)]
        (y * torch.from_numpy(ws[R])).sum().backward()
        # Horovod: allgather of the gradients, times size() for Sum.
        e = np.concatenate(ws) * (N if op == "sum" else 1)
        return check(case, x.grad, e, 4 * N * EPS["float64"] * (1 + np.abs(e)))
    return fn


run("grad/reducescatter/sum", case_grad_reducescatter("sum"))
run("grad/reducescatter/average", case_grad_reducescatter("average"))


def case_grad_grouped_allreduce(case):
    xs = [leaf(f"{case}/{k}", R, (k + 2,)) for k in range(2)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum)
    ws = [[weights(f"{case}/{k}", i, (k + 2,)) for i in range(N)] for k in range(2)]
    sum((ys[k] * torch.from_numpy(ws[k][R])).sum() for k in range(2)).backward()
    out = []
    for k in range(2):
        e, b = reduce_ref(ws[k], "sum", "float64")
        out.append(check(case, xs[k].grad, e, b))
    return first(*out)


run("grad/grouped_allreduce", case_grad_grouped_allreduce)


# ---- compression ------------------------------------------------------------

def case_compression(comp, wire, dtype):
    def fn(case):
        c = getattr(hvd.Compression, comp)
        xs = [make(case, i, (64,), dtype) for i in range(N)]
        # The reference reduces the values as they travel (cast to the wire dtype).
        sent = [f64(x.to(FLOATS[wire])) for x in xs]
        e, b = reduce_ref(sent, "sum", wire)
        b = b + np.abs(e) * EPS[wire]  # the result is rounded to the wire dtype once more
        out = hvd.allreduce(xs[R], op=hvd.Sum, compression=c)
        t, ctx = c.compress(xs[R])
        return first(check(case, out, e, b, FLOATS[dtype], (64,)),
                     None if t.dtype == FLOATS[wire] else f"compress gave {t.dtype}",
                     None if c.decompress(t, ctx).dtype == FLOATS[dtype] else "decompress dtype")
    return fn


run("compression/fp16/float32", case_compression("fp16", "float16", "float32"))
run("compression/fp16/float64", case_compression("fp16", "float16", "float64"))
run("compression/bf16/float32", case_compression("bf16", "bfloat16", "float32"))


def case_compression_ints(case):
    xs = [make(case, i, (9,), "int32") for i in range(N)]
    e, _ = reduce_ref([f64(x) for x in xs], "sum", "int32")
    outs = [hvd.allreduce(xs[R], op=hvd.Sum, compression=c)
            for c in (hvd.Compression.fp16, hvd.Compression.bf16, hvd.Compression.none)]
    return first(*[check(case, o, e, None, torch.int32) for o in outs])


run("compression/integers_unchanged", case_compression_ints)


def case_compression_reducescatter(case):
    xs = [make(case, i, (2 * N, 2), "float32") for i in range(N)]
    sent = [f64(x.to(torch.bfloat16)) for x in xs]
    e, b = reduce_ref(sent, "average", "bfloat16")
    b = b + np.abs(e) * EPS["bfloat16"]
    at, n = scatter_rows(2 * N)
    out = hvd.reducescatter(xs[R], compression=hvd.Compression.bf16)
    return check(case, out, e[at:at + n], b[at:at + n], torch.float32, (n, 2))


run("compression/bf16/reducescatter", case_compression_reducescatter)


# ---- sparse, join, barrier ---------------------------------------------------

def case_sparse(case):
    g = [rng(case, i) for i in range(N)]
    dense = [torch.from_numpy(np.where(gi.uniform(size=(6, 3)) < 0.3,
                                       gi.uniform(-1, 1, size=(6, 3)), 0.0)) for gi in g]
    handle = hvd.sparse_allreduce_async(dense[R].to_sparse(), name=case, op=hvd.Average)
    out = hvd.synchronize(handle)
    if not out.is_sparse:
        return "result is not sparse"
    e = np.mean([d.numpy() for d in dense], axis=0)
    return check(case, out.to_dense(), e, 4 * N * EPS["float64"] * (1 + np.abs(e)))


run("sparse_allreduce_async", case_sparse)


def case_join(case):
    # Every rank but the last joins at once; the last one still reduces:
    # the joined ranks take part with zeros.
    if R == N - 1:
        x = make(case, R, (5,), "float32")
        out = hvd.allreduce(x, name=case, op=hvd.Sum)
        d = check(case, out, f64(x), None, torch.float32)
        if d:
            return d
    last = hvd.join()
    return None if last == N - 1 else f"join() returned {last}, expected {N - 1}"


run("join", case_join)


def case_barrier(case):
    hvd.barrier()
    return None


run("barrier", case_barrier)

report({"cases": CASES.count})
hvd.shutdown()
