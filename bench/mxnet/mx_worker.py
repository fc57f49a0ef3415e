"""One worker of bench/mxnet/mx_bench.py (MXNet 1.9, .venv-mxnet).

    mx_worker.py kolo|kolo-shard|ps MODEL STEPS   -> one "MXBENCH {json}" line (rank 0)
    mx_worker.py perop N               -> per-op costs (kolo ranks)

kolo: gluon with kolo.mxnet's DistributedTrainer under kolorun (kolo-shard:
with sharded_update=True). ps: gluon
with MXNet's own parameter server (kvstore dist_sync; the DMLC_* variables
come from the bench). Same model, local batch and optimizer; a step is timed
to the end of MXNet's work (waitall), the median over STEPS after 3 warm-up
steps."""

import json
import os
import statistics
import sys
import time

import numpy as np
import mxnet as mx

MODELS = {  # name: (layer widths, local batch)
    "comm": ([1024, 2048, 2048, 1024], 8),      # 8.4 M parameters: the reduction dominates
    "compute": ([256, 256], 256),               # 0.3 M parameters, a larger batch
}


def model(name):
    widths, batch = MODELS[name]
    net = mx.gluon.nn.HybridSequential()
    for w in widths[1:]:
        net.add(mx.gluon.nn.Dense(w, activation="relu"))
    net.add(mx.gluon.nn.Dense(10))
    mx.random.seed(1)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, widths[0])))
    net.hybridize()
    return net, widths[0], batch


def train(side, name, steps):
    net, d_in, batch = model(name)
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    if side.startswith("kolo"):
        import kolo.mxnet as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", opt,
                                         sharded_update=side == "kolo-shard")
    else:
        kv = mx.kv.create("dist_sync")
        rank, size = kv.rank, kv.num_workers
        trainer = mx.gluon.Trainer(net.collect_params(), "sgd", opt, kvstore=kv)
    g = np.random.default_rng(rank)
    x = mx.nd.array(g.normal(size=(batch, d_in)).astype(np.float32))
    y = mx.nd.array(g.integers(0, 10, size=batch).astype(np.float32))
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    times = []
    for s in range(steps + 3):
        t0 = time.perf_counter()
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)
        mx.nd.waitall()
        if s >= 3:
            times.append(time.perf_counter() - t0)
    params = sum(p.data().size for p in net.collect_params().values())
    if rank == 0:
        print("MXBENCH " + json.dumps({"side": side, "model": name, "size": size,
                                        "params": params, "batch": batch,
                                        "step_ms": 1000 * statistics.median(times)}), flush=True)
    if side.startswith("kolo"):
        hvd.shutdown()


def perop(n):
    """Per-op cost of 8-byte allreduces: through MXNet's engine (pushed, then
    one waitall), through kolo.common.arrays (numpy, enqueue all then wait),
    and one MXNet element-wise op, for scale."""
    import kolo.mxnet as hvd
    from kolo.common import arrays
    hvd.init()
    xs = [mx.nd.ones((2,)) for _ in range(n)]
    res = {}
    for rnd in range(2):
        mx.nd.waitall()
        t0 = time.perf_counter()
        for i, x in enumerate(xs):
            hvd.allreduce_(x, name=f"e{i}")
        hvd.synchronize()
        res["engine_us"] = 1e6 * (time.perf_counter() - t0) / n
        a = [np.ones(2, np.float32) for _ in range(n)]
        t0 = time.perf_counter()
        ops = [arrays.allreduce(v, f"n{i}", "average") for i, v in enumerate(a)]
        for op in ops:
            op.wait()
        res["numpy_us"] = 1e6 * (time.perf_counter() - t0) / n
        mx.nd.waitall()
        t0 = time.perf_counter()
        for x in xs:
            x += 1
        mx.nd.waitall()
        res["mxnet_op_us"] = 1e6 * (time.perf_counter() - t0) / n
    if hvd.rank() == 0:
        print("MXBENCH " + json.dumps(dict(res, side="perop", n=n, size=hvd.size())), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    if sys.argv[1] == "perop":
        perop(int(sys.argv[2]))
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        train(sys.argv[1], sys.argv[2], int(sys.argv[3]))
