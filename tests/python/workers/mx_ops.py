"""kolo.mxnet on N ranks (run under an MXNet 1.9 interpreter): every op
against a float64 numpy reference built from every rank's input (each rank
can make any rank's input from its seed), the engine ordering an output's
next MXNet operation without a wait, a name/shape mismatch raising on every
rank with the ranks named, and DistributedTrainer / DistributedOptimizer /
broadcast_parameters against single-process training on the concatenated
batch; pushed operations finishing before the comm goes at exit.
Usage: mx_ops.py ops|train|kill|exit|exit_shutdown"""

import os
import signal
import sys
import time

import numpy as np
import mxnet as mx

import kolo
import kolo.mxnet as hvd
from kolo.mxnet import sharded
from _common import Cases, report

hvd.init()
R, N = hvd.rank(), hvd.size()
MODE = sys.argv[1] if len(sys.argv) > 1 else "ops"
cases = Cases(pass_case=True)


def data(rank, shape, dtype, salt=0):
    g = np.random.default_rng(1000 * salt + rank)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return g.integers(-20, 20, size=shape).astype(dtype)
    return g.normal(size=shape).astype(dtype)


def close(got, want, dtype, what):
    got = np.asarray(got, np.float64)
    tol = 0 if np.issubdtype(np.dtype(dtype), np.integer) else \
        (1e-5 if np.dtype(dtype) == np.float32 else 1e-12) * max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) if got.size else 0.0
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, want {want.shape}"
    return None if err <= tol else f"{what}: off by {err:.3g} (tolerance {tol:.3g})"


REDUCE = {hvd.Sum: lambda xs: np.sum(xs, 0), hvd.Average: lambda xs: np.mean(xs, 0),
          hvd.Min: lambda xs: np.min(xs, 0), hvd.Max: lambda xs: np.max(xs, 0),
          hvd.Product: lambda xs: np.prod(xs, 0)}


def case_allreduce(case):
    for dtype in ("float32", "float64", "int32"):
        for op, ref in REDUCE.items():
            if dtype == "int32" and op == hvd.Average:
                continue
            xs = [data(r, (4, 3), dtype, op).astype(np.float64) for r in range(N)]
            if op == hvd.Product:
                xs = [np.sign(x) * (1 + np.abs(x) % 2) for x in xs]
            x = mx.nd.array(xs[R], dtype=dtype)
            y = hvd.allreduce(x, op=op, name=f"ar.{dtype}.{op}")
            bad = close(y.asnumpy(), ref(np.stack(xs)), dtype, f"{dtype} op {op}")
            if bad:
                return bad
            if not np.array_equal(x.asnumpy(), xs[R].astype(dtype)):
                return "allreduce changed its input"
    x = mx.nd.array(data(R, (5,), "float32", 9))
    hvd.allreduce_(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name="scaled")
    want = 1.5 * np.sum([data(r, (5,), "float32", 9) for r in range(N)], 0, dtype=np.float64)
    return close(x.asnumpy(), want, "float32", "allreduce_ scaled")


def case_grouped(case):
    shapes = [((3,), "float32"), ((2, 2), "float64"), ((4,), "float32")]
    xs = [mx.nd.array(data(R, s, d, i), dtype=d) for i, (s, d) in enumerate(shapes)]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grp")
    for i, ((s, d), y) in enumerate(zip(shapes, ys)):
        want = np.sum([data(r, s, d, i).astype(np.float64) for r in range(N)], 0)
        bad = close(y.asnumpy(), want, d, f"grouped {i}")
        if bad:
            return bad
    hvd.grouped_allreduce_(xs, name="grp_")  # average, in place
    for i, ((s, d), x) in enumerate(zip(shapes, xs)):
        want = np.mean([data(r, s, d, i).astype(np.float64) for r in range(N)], 0)
        bad = close(x.asnumpy(), want, d, f"grouped_ {i}")
        if bad:
            return bad
    return None


def case_broadcast(case):
    for root in range(N):
        x = mx.nd.array(data(R, (3, 2), "float32", root))
        y = hvd.broadcast(x, root_rank=root, name=f"bc.{root}")
        bad = close(y.asnumpy(), data(root, (3, 2), "float32", root).astype(np.float64),
                    "float32", f"broadcast from {root}")
        if bad:
            return bad
        hvd.broadcast_(x, root_rank=root, name=f"bc_.{root}")
        bad = close(x.asnumpy(), data(root, (3, 2), "float32", root).astype(np.float64),
                    "float32", f"broadcast_ from {root}")
        if bad:
            return bad
    return None


def case_allgather(case):
    x = mx.nd.array(data(R, (R + 1, 2), "float64"), dtype="float64")
    want = np.concatenate([data(r, (r + 1, 2), "float64") for r in range(N)])
    bad = close(hvd.allgather(x, name="ag").asnumpy(), want, "float64", "allgather")
    if bad:
        return bad
    ys = hvd.grouped_allgather([x, x * 2], name="gag")
    return close(ys[1].asnumpy(), 2 * want, "float64", "grouped_allgather")


def case_alltoall(case):
    splits = [(R + j) % 2 + 1 for j in range(N)]
    rows = sum(splits)
    x = mx.nd.array(np.full((rows, 2), R, np.float32) + np.arange(rows)[:, None])
    y = hvd.alltoall(x, splits=mx.nd.array(splits, dtype="int32"), name="a2a").asnumpy()
    want = []
    for r in range(N):
        sp = [(r + j) % 2 + 1 for j in range(N)]
        start = sum(sp[:R])
        want.append(np.full((sp[R], 2), r, np.float64) + np.arange(start, start + sp[R])[:, None])
    return close(y, np.concatenate(want), "float32", "alltoall")


def case_reducescatter(case):
    xs = [data(r, (2 * N, 3), "float32") for r in range(N)]
    y = hvd.reducescatter(mx.nd.array(xs[R]), op=hvd.Sum, name="rs").asnumpy()
    full = np.sum(np.stack(xs).astype(np.float64), 0)
    bad = close(y, full[2 * R:2 * R + 2], "float32", "reducescatter")
    if bad:
        return bad
    ys = hvd.grouped_reducescatter([mx.nd.array(xs[R])], name="grs")
    return close(ys[0].asnumpy(), full[2 * R:2 * R + 2] / N, "float32", "grouped_reducescatter")


def case_shards(case):
    """shard_reducescatter_ leaves the sum in this rank's share and the rest
    as it was; shard_allgather_ puts every rank's share in place. 7 x 5
    elements: shares of 35 // N or one more; the next MXNet op reads the
    result without a wait."""
    xs = [data(r, (7, 5), "float32", salt=3) for r in range(N)]
    full = np.sum(np.stack(xs).astype(np.float64), 0).reshape(-1)
    lo, hi = hvd.shard_range(35)
    sizes = hvd.allgather_object(hi - lo)
    if sum(sizes) != 35 or max(sizes) - min(sizes) > 1:
        return f"shares of 35 elements: {sizes}"
    x = mx.nd.array(xs[R])
    hvd.shard_reducescatter_(x, name="shard.rs", op=hvd.Sum)
    got = (x * 1).asnumpy().reshape(-1)
    mine = xs[R].astype(np.float64).reshape(-1)
    bad = close(got[lo:hi], full[lo:hi], "float32", "shard_reducescatter_ share") or \
        close(np.delete(got, range(lo, hi)), np.delete(mine, range(lo, hi)), "float32",
              "shard_reducescatter_ outside the share")
    if bad:
        return bad
    w = mx.nd.array(np.full((7, 5), -1.0, np.float32))
    w.reshape(-1)[lo:hi] = mx.nd.array(np.arange(lo, hi, dtype=np.float32) + 100 * R)
    hvd.shard_allgather_(w, name="shard.ag")
    want = np.concatenate([np.arange(a, a + n) + 100 * r for r, (a, n) in
                           enumerate(zip(np.cumsum([0] + sizes[:-1]), sizes))])
    return close((w + 0).asnumpy().reshape(-1), want.astype(np.float64), "float32",
                 "shard_allgather_")


def case_objects(case):
    got = hvd.broadcast_object({"from": R, "list": list(range(R))}, root_rank=N - 1)
    if got != {"from": N - 1, "list": list(range(N - 1))}:
        return f"broadcast_object gave {got}"
    got = hvd.allgather_object(("r", R))
    return None if got == [("r", r) for r in range(N)] else f"allgather_object gave {got}"


def case_engine_order(case):
    """The next MXNet operations read the allreduce's output without any wait."""
    x = mx.nd.array(data(R, (1000,), "float32", 5))
    y = hvd.allreduce(x, op=hvd.Sum, name="order")
    z = (y * 2 + 1).sum()             # queued behind the allreduce by the engine
    hvd.allreduce_(x, op=hvd.Sum, name="order_1")
    x *= 3                             # waits for the in-place allreduce
    hvd.allreduce_(x, op=hvd.Sum, name="order_2")
    s = np.sum([data(r, (1000,), "float32", 5).astype(np.float64) for r in range(N)], 0)
    bad = close(z.asnumpy(), np.array([np.sum(2 * s + 1)]), "float32", "y*2+1")
    return bad or close(x.asnumpy(), N * 3 * s, "float32", "x after two in-place allreduces")


def case_mismatch(case):
    x = mx.nd.ones((R + 2,))
    hvd.allreduce_(x, name="mismatch")
    try:
        hvd.synchronize()
    except kolo.MismatchError as e:
        msg = str(e)
        if "rank" not in msg or "mismatch" not in msg:
            return f"the error does not name the ranks and the op: {msg}"
        # the comm still works
        y = hvd.allreduce(mx.nd.ones((2,)), op=hvd.Sum, name="after")
        return close(y.asnumpy(), np.full(2, N, np.float64), "float32", "after a mismatch")
    return "no MismatchError"


def case_process_set(case):
    """An allreduce and a broadcast over the even ranks only (roots are job
    ranks, as in Horovod); the odd ranks take no part."""
    members = list(range(0, N, 2))
    ps = hvd.add_process_set(members)
    try:
        if R not in members:
            return None
        x = mx.nd.array(data(R, (6,), "float32", 7))
        y = hvd.allreduce(x, op=hvd.Sum, name="ps.sum", process_set=ps)
        want = np.sum([data(r, (6,), "float32", 7).astype(np.float64) for r in members], 0)
        bad = close(y.asnumpy(), want, "float32", "allreduce over the even ranks")
        if bad:
            return bad
        root = members[-1]
        hvd.broadcast_(x, root_rank=root, name="ps.bc", process_set=ps)
        return close(x.asnumpy(), data(root, (6,), "float32", 7).astype(np.float64), "float32",
                     f"broadcast from rank {root} over the even ranks")
    finally:
        hvd.synchronize()
        hvd.remove_process_set(ps)


def run_ops():
    for name, fn in [("allreduce", case_allreduce), ("grouped", case_grouped),
                     ("broadcast", case_broadcast), ("allgather", case_allgather),
                     ("alltoall", case_alltoall), ("reducescatter", case_reducescatter),
                     ("shards", case_shards),
                     ("objects", case_objects), ("engine_order", case_engine_order),
                     ("mismatch", case_mismatch), ("process_set", case_process_set)]:
        cases.run(name, fn)


# ---- training against single-process training on the concatenated batch -------

B, STEPS = 4, 5


def batches():
    g = np.random.default_rng(42)
    X = g.normal(size=(STEPS, N, B, 6)).astype(np.float32)
    Y = g.normal(size=(STEPS, N, B, 2)).astype(np.float32)
    return X, Y


def net_from(seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, activation="tanh"), mx.gluon.nn.Dense(2))
    net.initialize(mx.init.Normal(0.5))
    net(mx.nd.zeros((1, 6)))  # deferred shapes resolved
    return net


def gluon_train(net, trainer, xs, ys, split=False):
    loss_fn = mx.gluon.loss.L2Loss()
    for x, y in zip(xs, ys):
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        if split:  # as for gradient clipping: whole gradients, then the update
            trainer.allreduce_grads()
            trainer.update(x.shape[0])
        else:
            trainer.step(x.shape[0])
    return [p.data().asnumpy() for _, p in sorted(net.collect_params().items())]


# case: (optimizer, its parameters, DistributedTrainer's arguments, step split)
TRAINERS = {
    "trainer": ("sgd", {"learning_rate": 0.1, "momentum": 0.9}, {}, False),
    "trainer_groups": ("sgd", {"learning_rate": 0.1, "momentum": 0.9}, {"num_groups": 2}, False),
    "trainer_sharded": ("sgd", {"learning_rate": 0.1, "momentum": 0.9},
                        {"sharded_update": True}, False),
    "trainer_sharded_adam": ("adam", {"learning_rate": 0.01}, {"sharded_update": True}, True),
}


def case_trainer(case):
    X, Y = batches()
    name, opt, kw, split = TRAINERS[case]
    net = net_from(R)  # every rank different: broadcast_parameters makes them rank 0's
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    if kw.get("sharded_update"):
        try:
            hvd.DistributedTrainer(net.collect_params(), "lamb", {}, sharded_update=True)
            return "sharded_update took LAMB, whose update reads whole parameters"
        except ValueError as e:
            if "element-wise optimizer" not in str(e):
                return f"LAMB refused with {e}"
    # trainer_sharded: weights (48, 16 elements) and the first bias (8) in
    # shares, the last bias (2) allreduced whole; trainer_sharded_adam: all in
    # shares, the last bias's empty on rank 2 of 3
    sharded.SHARD_MIN_ELEMENTS = 8 if case == "trainer_sharded" else 2
    trainer = hvd.DistributedTrainer(net.collect_params(), name, opt, **kw)
    got = gluon_train(net, trainer, X[:, R], Y[:, R], split)
    ref = net_from(0)
    want = gluon_train(ref, mx.gluon.Trainer(ref.collect_params(), name, opt, kvstore=None),
                       X.reshape(STEPS, N * B, 6), Y.reshape(STEPS, N * B, 2))
    if kw.get("sharded_update"):
        try:
            trainer.save_states("/nonexistent/states")
            return "save_states of a sharded update went through"
        except ValueError as e:
            if "share" not in str(e):
                return f"save_states refused with {e}"
    err = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
    sums = hvd.allgather_object(float(sum(np.sum(a, dtype=np.float64) for a in got)))
    if len(set(sums)) != 1:
        return f"ranks hold other weights: {sums}"
    report({"trainer": case, "err": err})
    return None if err <= 1e-5 else f"weights off single-process training by {err:.3g}"


def case_optimizer(case):
    X, _ = batches()
    lr = 0.05
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=lr, momentum=0.9))
    upd = mx.optimizer.get_updater(opt)
    ref = mx.optimizer.get_updater(mx.optimizer.SGD(learning_rate=lr, momentum=0.9))
    w, w_ref = mx.nd.ones((B, 6)), mx.nd.ones((B, 6))
    for s in range(STEPS):
        upd(0, mx.nd.array(X[s, R]), w)
        ref(0, mx.nd.array(X[s].astype(np.float64).mean(0).astype(np.float32)), w_ref)
    err = float(np.abs(w.asnumpy() - w_ref.asnumpy()).max())
    return None if err <= 1e-5 else f"DistributedOptimizer off the reference by {err:.3g}"


def case_deferred(case):
    net = mx.gluon.nn.Dense(3)  # in_units unknown: initialisation deferred
    mx.random.seed(100 + R)
    net.initialize(mx.init.Normal(1.0))
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix="deferred.")
    net(mx.nd.ones((2, 5)))    # initialised here, then broadcast
    w = net.weight.data().asnumpy()
    ws = hvd.allgather_object(w.tolist())
    if any(x != ws[0] for x in ws):
        return "deferred parameters differ between ranks after broadcast_parameters"
    d = {"a": mx.nd.array(data(R, (3,), "float32")), "b": mx.nd.array(data(R, (2,), "float32"))}
    hvd.broadcast_parameters(d, root_rank=N - 1)
    return close(d["b"].asnumpy(), data(N - 1, (2,), "float32").astype(np.float64), "float32",
                 "broadcast_parameters of a dict")


def run_train():
    for name, fn in [("trainer", case_trainer), ("trainer_groups", case_trainer),
                     ("trainer_sharded", case_trainer), ("trainer_sharded_adam", case_trainer),
                     ("optimizer", case_optimizer), ("deferred", case_deferred)]:
        cases.run(name, fn)


def run_kill():
    """Rank N-1 is killed in its 4th step; the others must raise. kolorun's
    SIGTERM to the others (it stops a job whose worker died) is ignored, so
    that what is measured is kolo's own failure path."""
    signal.signal(signal.SIGTERM, lambda *_: None)
    x = mx.nd.ones((1 << 16,))
    for step in range(1000):
        if R == N - 1 and step == 3:
            report({"killed_at": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            hvd.allreduce_(x, name="loop")
            hvd.synchronize()
        except kolo.Error as e:
            report({"raised_at": time.time(), "step": step, "error": type(e).__name__,
                    "msg": str(e)[:300]})
            os._exit(3)
    report({"never_raised": True})


def run_exit():
    """Operations still in MXNet's queue when the program ends: kolo.mxnet
    waits for them before the comm goes, at hvd.shutdown() and at exit
    (without it, one run in three crashed in the engine). An atexit handler
    registered before kolo's runs after them and checks every result."""
    import atexit
    xs = [mx.nd.ones((1 << 15,)) * (R + 1) for _ in range(50)]
    want = N * (N + 1) / 2

    def check():
        bad = [i for i, x in enumerate(xs) if not np.all(x.asnumpy() == want)]
        report({"exit_checked": len(xs), "bad": bad})
        sys.stdout.flush()
    atexit.register(check)  # before the first push: it runs after kolo's hooks
    for i, x in enumerate(xs):
        hvd.allreduce_(x, name=f"exit.{i}", op=hvd.Sum)
    report({"pushed": len(xs)})
    if MODE == "exit_shutdown":
        hvd.shutdown()
    sys.exit(0)


MODES = {"ops": run_ops, "train": run_train, "kill": run_kill, "exit": run_exit,
         "exit_shutdown": run_exit}
MODES[MODE]()
report({"cases": cases.count})
hvd.shutdown()
