"""The elastic variant of examples/keras/train_digits.py: Keras 3 ``fit``
inside ``hvd.elastic.run``, with KerasState and the commit callbacks, so the
job keeps training when workers die, leave or join.

    build/bin/kolorun -np 4 --min-np 2 --max-np 4 -- \\
        .venv/bin/python examples/keras/train_digits_elastic.py

A worker added later by ``kolorun -np 1`` with the same rendezvous flags
joins at the next commit (docs/elastic.md). Each epoch is one ``fit`` over
this rank's shard for the current size; the state (weights, optimizer,
epoch) is committed after every batch, restored after a failure and
broadcast from rank 0 after every re-form. ``--hold-for-size K`` makes the
job wait at a commit point while it has fewer than K workers (at most
``--hold-s`` seconds), so that a test's join cannot come too late.
Every final rank prints a hash of its weights; rank 0 checks they agree and
that the test accuracy reaches --target.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
_here = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_here.parent))
if (_here.parent.parent / "python" / "kolo" / "__init__.py").exists():
    sys.path.insert(0, str(_here.parent.parent / "python"))

import numpy as np  # noqa: E402
import keras  # noqa: E402

import digits_data  # noqa: E402
import kolo.keras as hvd  # noqa: E402

NAME = "keras_digits_elastic"
POLL_S = 0.02


def say(msg: str) -> None:
    print(f"{NAME}: {msg}", flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--hold-for-size", type=int, default=0)
    p.add_argument("--hold-s", type=float, default=60.0)
    p.add_argument("--slow-ms", type=float, default=0.0,
                   help="sleep after each batch (to leave time for a kill in a test)")
    p.add_argument("--data", choices=["auto", "digits", "synthetic"], default="auto")
    return p.parse_args()


def weights_hash(model) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(np.asarray(w)).tobytes())
    return h.hexdigest()[:16]


def main() -> int:
    a = parse_args()
    hvd.init()
    xtr, ytr, xte, yte, what = digits_data.load(a.data)
    say(f"rank {hvd.rank()} of {hvd.size()}: pid {os.getpid()}")
    keras.utils.set_random_seed(100 + hvd.rank())
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(a.lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # The optimizer's variables come at its first step; the state builds them
    # when it is made, so that a worker that joins later syncs the same list.
    state = hvd.elastic.KerasState(model, epoch=0, step=0)

    def on_reset():
        opt.learning_rate.assign(a.lr * hvd.size())
        say(f"re-formed: size {hvd.size()}, rank {hvd.rank()}, step {state.step}")

    state.register_reset_callbacks([on_reset])

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            state.step += 1
            if a.slow_ms:
                time.sleep(a.slow_ms / 1000)
            state.commit()
            say(f"step {state.step} committed")
            if a.hold_for_size and hvd.size() < a.hold_for_size:
                say(f"size {hvd.size()} < {a.hold_for_size}: holding for a join")
                for _ in range(max(1, int(a.hold_s / POLL_S))):
                    state.check_host_updates()
                    time.sleep(POLL_S)

    @hvd.elastic.run
    def train(state):
        say(f"rank {hvd.rank()} of {hvd.size()}: training from step {state.step}")
        while state.epoch < a.epochs:
            r, n = hvd.rank(), hvd.size()
            xs, ys = xtr[r::n], ytr[r::n]
            k = len(xtr) // n // a.batch_size * a.batch_size  # equal steps on every rank
            model.fit(xs[:k], ys[:k], batch_size=a.batch_size, epochs=1, verbose=0,
                      callbacks=[Steps()])
            state.epoch += 1
            state.commit()

    train(state)
    acc = float(np.mean(np.argmax(model.predict(xte, verbose=0), axis=1) == yte))
    digest = weights_hash(model)
    say(f"rank {hvd.rank()}: {what}: test accuracy {acc:.4f} size {hvd.size()}, weights "
        f"sha256 {digest}")
    digests = hvd.allgather_object(digest)
    ok = acc >= a.target and len(set(digests)) == 1
    if hvd.rank() == 0:
        say(f"{'PASS' if ok else 'FAIL'}: accuracy {acc:.4f} (target {a.target}), "
            f"{len(set(digests))} distinct weight hashes on {hvd.size()} ranks")
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
