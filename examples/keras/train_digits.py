"""A Keras 3 ``fit`` program on kolo.keras: a small network trained
data-parallel on the handwritten digits, on any Keras backend.

    KERAS_BACKEND=jax build/bin/kolorun -np 4 -- .venv/bin/python examples/keras/train_digits.py

(tensorflow, torch or jax). Each rank fits on its shard of the training
set; kolo.keras.DistributedOptimizer averages the gradients in the
optimizer's apply, BroadcastGlobalVariablesCallback starts every rank from
rank 0's weights, MetricAverageCallback averages the epoch metrics, and
LearningRateWarmupCallback ramps the rate to lr * size. At the end every
rank evaluates the whole test set, prints its accuracy and a hash of its
weights, and the run fails (exit 1) unless the accuracy reaches --target and
every rank holds the same weights. Data: examples/digits_data.py.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
_here = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_here.parent))
if (_here.parent.parent / "python" / "kolo" / "__init__.py").exists():
    sys.path.insert(0, str(_here.parent.parent / "python"))

import numpy as np  # noqa: E402
import keras  # noqa: E402

import digits_data  # noqa: E402
import kolo.keras as hvd  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.02, help="rate of one rank; lr * size is used")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--data", choices=["auto", "digits", "synthetic"], default="auto")
    return p.parse_args()


def main() -> int:
    a = parse_args()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    xtr, ytr, xte, yte, what = digits_data.load(a.data)
    xs, ys = xtr[r::n], ytr[r::n]  # this rank's shard
    keras.utils.set_random_seed(100 + r)  # different starts: the broadcast must align them
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(a.lr * n, momentum=0.9))
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps = len(xtr) // n // a.batch_size  # equal steps on every rank
    model.fit(xs[:steps * a.batch_size], ys[:steps * a.batch_size], batch_size=a.batch_size,
              epochs=a.epochs, shuffle=True, verbose=2 if r == 0 else 0, callbacks=[
                  hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                  hvd.callbacks.MetricAverageCallback(),
                  hvd.callbacks.LearningRateWarmupCallback(a.lr * n, warmup_epochs=2,
                                                           steps_per_epoch=steps)])
    acc = float(np.mean(np.argmax(model.predict(xte, verbose=0), axis=1) == yte))
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(np.asarray(w)).tobytes())
    digest = h.hexdigest()[:16]
    print(f"train_digits: rank {r}: backend {keras.backend.backend()}, {what}, test accuracy "
          f"{acc:.4f}, weights sha256 {digest}", flush=True)
    digests = hvd.allgather_object(digest)
    ok = acc >= a.target and len(set(digests)) == 1
    if r == 0:
        print(f"train_digits: {'PASS' if ok else 'FAIL'}: accuracy {acc:.4f} (target "
              f"{a.target}), {len(set(digests))} distinct weight hashes on {n} ranks",
              flush=True)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
