"""Keras 3 ``fit`` with kolo.keras's DistributedOptimizer on N ranks against
single-process training on the concatenated batch, on the backend that
KERAS_BACKEND names.

Usage: keras_fit.py CASE[,CASE...], each one of plain, clipnorm, lossscale,
bpps2, processset, run one after another in the same processes (one report
per case). processset: the optimizer averages over the process set of the
even ranks only, and the reference trains on their batches alone; the odd
ranks train with a plain optimizer beside (they take part in the callbacks'
job-wide collectives) and report nothing to compare.
Every rank starts from different weights (BroadcastGlobalVariablesCallback
must make them rank 0's), trains 2 epochs of 3 steps on its shard, and
trains a reference model in the same process, from rank 0's weights, on the
global batches (each the concatenation of every rank's local batch). Reports
the largest weight difference to the reference, the per-rank epoch losses
(averaged by MetricAverageCallback) and a checksum of the weights.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    # tf.keras is tf_keras 2.x: kolo.tensorflow.keras, Horovod's TF2 Keras flavour
    import tensorflow as tf  # noqa: E402
    keras = tf.keras
    import kolo.tensorflow.keras as hvd  # noqa: E402
    BACKEND = "tf_keras"
else:
    import keras  # noqa: E402
    import kolo.keras as hvd  # noqa: E402
    BACKEND = keras.backend.backend()
import kolo  # noqa: E402
from _common import report  # noqa: E402

# Counts the optimizer's reductions as they reach kolo (every backend's path
# submits through kolo._enqueue), to check what backward_passes_per_step saves
SENT = [0]
_enqueue = kolo._enqueue


def _counting_enqueue(fn, what, *args, **kwargs):
    if what.startswith("allreduce DistributedOptimizer"):
        SENT[0] += 1
    return _enqueue(fn, what, *args, **kwargs)


kolo._enqueue = _counting_enqueue

CASES = (sys.argv[1] if len(sys.argv) > 1 else "plain").split(",")
hvd.init()
R, N = hvd.rank(), hvd.size()
B, STEPS, EPOCHS = 4, 3, 2
if BACKEND == "torch":
    import torch
    torch.set_num_threads(1)


def model_from(seed_offset):
    keras.utils.set_random_seed(1234 + seed_offset)
    m = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(3)])
    m.build((None, 5))
    return m


def optimizer(case):
    kw = {"learning_rate": 0.1}
    if case == "clipnorm":
        kw["clipnorm"] = 0.05
    opt = keras.optimizers.SGD(momentum=0.9, **kw)
    if case == "lossscale":
        lso = keras.optimizers.LossScaleOptimizer if hasattr(keras.optimizers,
                                                             "LossScaleOptimizer") else \
            keras.mixed_precision.LossScaleOptimizer
        opt = lso(opt, initial_scale=2.0 ** 10)
    return opt


def run_case(case):
    keras.backend.clear_session()
    g = np.random.default_rng(7)
    X = g.normal(size=(N, EPOCHS, STEPS, B, 5)).astype("float32")   # [rank, epoch, step, row]
    Y = g.normal(size=(N, EPOCHS, STEPS, B, 3)).astype("float32")

    # distributed
    model = model_from(R)  # different weights on every rank
    bpps = 2 if case == "bpps2" else 1
    members = list(range(0, N, 2)) if case == "processset" else list(range(N))
    if case == "processset":
        ps = hvd.add_process_set(members)
        opt = hvd.DistributedOptimizer(optimizer(case), process_set=ps) if R in members else \
            optimizer(case)
    else:
        opt = hvd.DistributedOptimizer(optimizer(case), backward_passes_per_step=bpps,
                                       average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse",
                  run_eagerly=os.environ.get("KOLO_KERAS_EAGER") == "1")
    losses = []
    SENT[0] = 0
    cbs = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
           hvd.callbacks.MetricAverageCallback()]
    for e in range(EPOCHS):
        h = model.fit(X[R, e].reshape(-1, 5), Y[R, e].reshape(-1, 3), batch_size=B, epochs=1,
                      shuffle=False, verbose=0, callbacks=cbs)
        losses.append(float(h.history["loss"][-1]))
    sent = SENT[0]

    # reference: one process, rank 0's initial weights, the global batches
    ref = model_from(0)
    ref_opt = optimizer(case)
    if bpps > 1:
        ref_opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9,
                                       gradient_accumulation_steps=bpps)
    ref.compile(optimizer=ref_opt, loss="mse")
    for e in range(EPOCHS):
        xs = np.concatenate([X[members, e, s].reshape(-1, 5) for s in range(STEPS)])
        ys = np.concatenate([Y[members, e, s].reshape(-1, 3) for s in range(STEPS)])
        ref.fit(xs, ys, batch_size=B * len(members), epochs=1, shuffle=False, verbose=0)

    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(model.get_weights(), ref.get_weights()))
    scale = max(float(np.max(np.abs(np.asarray(b)))) for b in ref.get_weights())
    report({"backend": BACKEND, "case": case, "diff": diff, "scale": scale,
            "member": R in members, "reductions": sent,
            "losses": losses, "checksum": float(sum(np.sum(np.asarray(w, np.float64))
                                                    for w in model.get_weights()))})
    if case == "processset":
        hvd.remove_process_set(ps)


def run_unbuilt():
    """A Sequential without an input shape has no weights before its first
    step: BroadcastGlobalVariablesCallback then broadcasts after that step
    (as Horovod does), and every rank ends with the same weights."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(99 + R)
    model = keras.Sequential([keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    g = np.random.default_rng(R)
    model.fit(g.normal(size=(8, 3)).astype("float32"), g.normal(size=(8, 2)).astype("float32"),
              batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    report({"backend": BACKEND, "case": "unbuilt", "diff": 0.0, "scale": 1.0, "member": True,
            "reductions": 0, "losses": [],
            "checksum": float(sum(np.sum(np.asarray(w, np.float64))
                                  for w in model.get_weights()))})


for c in CASES:
    run_unbuilt() if c == "unbuilt" else run_case(c)
hvd.shutdown()
