"""The per-tensor cost of kolo's framework layers, one process per rank
(run under kolorun -np 2): the median time of a 1-element float32 allreduce
through kolo.torch, kolo.tensorflow eagerly, kolo.tensorflow inside
tf.function, and per tensor of a 50-tensor step submitted as one call
(kolo.tensorflow.gradients, what DistributedGradientTape and the Keras
optimizer do). Rank 0 prints one line per path.

    build/bin/kolorun -np 2 -- .venv/bin/python bench/tensorflow/per_tensor_cost.py
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
import torch  # noqa: E402

import kolo.tensorflow as htf  # noqa: E402
import kolo.torch as hth  # noqa: E402
from kolo.tensorflow import mpi_ops  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
torch.set_num_threads(1)
htf.init()
ITERS, ROUNDS = 300, 5


def per_call(fn, per=1):
    out = []
    for _ in range(ROUNDS):
        htf.barrier()
        t = time.perf_counter()
        for _ in range(ITERS):
            fn()
        out.append((time.perf_counter() - t) / ITERS / per * 1e6)
    return statistics.median(out)


xt = torch.ones(1)
xf = tf.ones([1])
graph_one = tf.function(lambda x: htf.allreduce(x, name="one"))
many = [tf.ones([1]) for _ in range(50)]
names = [f"g{i}" for i in range(50)]
graph_many = tf.function(lambda *xs: mpi_ops.allreduce_list(list(xs), names, htf.Average))
graph_one(xf)
graph_many(*many)
rows = [("kolo.torch allreduce", per_call(lambda: hth.allreduce(xt, name="t"))),
        ("kolo.tensorflow eager allreduce", per_call(lambda: htf.allreduce(xf, name="e"))),
        ("kolo.tensorflow tf.function allreduce", per_call(lambda: graph_one(xf))),
        ("kolo.tensorflow tf.function, 50 tensors in one call, per tensor",
         per_call(lambda: graph_many(*many), per=50))]
if htf.rank() == 0:
    for what, us in rows:
        print(f"{what:66s} {us:8.1f} us", flush=True)
htf.shutdown()
