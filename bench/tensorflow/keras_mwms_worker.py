"""One worker of keras_mwms_bench.py: tf.keras (tf_keras) ``fit`` of one
model for a number of steps, data-parallel with kolo.tensorflow.keras
(``--mode kolo``, under kolorun) or with
``tf.distribute.MultiWorkerMirroredStrategy`` (``--mode mwms``, TF_CONFIG
set by the driver). Rank 0 prints one JSON line: the median step time."""

import argparse
import json
import os
import statistics
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)


def build(model: str):
    if model == "comm":  # ~10.5 M parameters, little compute per sample
        layers = [keras.Input((1024,)), keras.layers.Dense(2048, activation="relu"),
                  keras.layers.Dense(2048, activation="relu"),
                  keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(10)]
    else:  # ~60 k parameters, convolutions on 32x32 images
        layers = [keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                  keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
                  keras.layers.Conv2D(64, 3, activation="relu"),
                  keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


class StepTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.t = []

    def on_train_batch_end(self, batch, logs=None):
        self.t.append(time.perf_counter())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["kolo", "mwms"], required=True)
    p.add_argument("--model", choices=["comm", "compute"], required=True)
    p.add_argument("--local-batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    shape = (1024,) if a.model == "comm" else (32, 32, 3)
    if a.mode == "kolo":
        import kolo.tensorflow.keras as hvd
        hvd.init()
        rank, n = hvd.rank(), hvd.size()
        model = build(a.model)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        batch, cbs = a.local_batch, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        n = strategy.num_replicas_in_sync
        with strategy.scope():
            model = build(a.model)
            model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        batch, cbs = a.local_batch * n, []  # MWMS takes the global batch
    g = np.random.default_rng(rank)
    rows = batch * (a.steps + a.warmup)
    x = g.normal(size=(rows,) + shape).astype("float32")
    y = g.integers(0, 10, rows)
    st = StepTimes()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=cbs + [st])
    d = [b - a_ for a_, b in zip(st.t, st.t[1:])][a.warmup:]
    if rank == 0:
        print("BENCH " + json.dumps({"mode": a.mode, "model": a.model, "ranks": n,
                                     "global_batch": a.local_batch * n,
                                     "median_ms": 1e3 * statistics.median(d),
                                     "steps": len(d)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
