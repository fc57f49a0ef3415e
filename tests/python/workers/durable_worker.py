"""An elastic job with durable commits, for test_elastic_durable.py.

    durable_worker.py --state object|torch|keras --steps S [--hold-at H]

Every step allreduces a value that depends on the step and the rank, folds
it into the state and commits. object: an ObjectState of a float64 that
depends on every step's order; torch: a TorchState of a linear model and
its SGD-with-momentum optimizer (DistributedOptimizer), fed data made from
the step's number; keras: the same on Keras 3 with the tensorflow backend
(kolo.tensorflow.keras: a KerasState of a Dense model and its
DistributedOptimizer, one train_on_batch a step). --hold-at H: after the
commit of step H every worker whose training started at step 0 reports
{"ev": "held"} and blocks until it is killed (a replacement that resumed
past 0 goes on).
Reports {"ev": "ready", "pid"}, {"ev": "start", "step"} each time the
training function starts (after the sync), and {"ev": "done", "step",
"result"} with the final state, exactly (hex of its bytes)."""

import argparse
import os
import threading

import numpy as np

import kolo
from _common import report
from kolo.common import arrays, elastic


def object_job(a):
    state = elastic.ObjectState(step=0, total=0.0)

    def step(state):
        g = np.full(4, (kolo.rank() + 1) * (state.step + 1) / 7.0, dtype=np.float64)
        out = arrays.allreduce(g, name="g", op="sum").wait()
        state.total = state.total * 0.75 + float(out[0])

    return state, step, lambda: np.float64(state.total).tobytes().hex()


def torch_job(a):
    import torch

    import kolo.torch as hvd

    torch.set_num_threads(1)
    # Rank 0's weights (the same in every job) win at the first sync.
    torch.manual_seed(1 if kolo.rank() == 0 else 1000 + os.getpid())
    model = torch.nn.Linear(5, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)

    def step(state):
        g = torch.Generator().manual_seed(state.step * 100 + kolo.rank())
        x = torch.randn(8, 5, generator=g)
        y = x.sum(dim=1, keepdim=True).repeat(1, 2)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    def result():
        return "".join(v.numpy().tobytes().hex() for v in model.state_dict().values())

    return state, step, result


def keras_job(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import kolo.tensorflow.keras as hvd

    keras = tf.keras
    # Rank 0's weights (the same in every job) win at the first sync.
    keras.utils.set_random_seed(1 if kolo.rank() == 0 else 1000 + os.getpid())
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.05, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    # Not built here, as in Horovod's examples: the state builds the optimizer,
    # so that the momenta exist for a resume to load.
    state = hvd.elastic.KerasState(model, opt, step=0)

    def step(state):
        g = np.random.default_rng(state.step * 100 + kolo.rank())
        x = g.standard_normal((8, 5)).astype(np.float32)
        y = np.repeat(x.sum(axis=1, keepdims=True), 2, axis=1)
        model.train_on_batch(x, y)

    def result():
        # the weights, the momenta and the optimizer's step count
        return "".join(np.asarray(v.numpy()).tobytes().hex()
                       for v in list(model.variables) + list(opt.variables))

    return state, step, result


JOBS = {"object": object_job, "torch": torch_job, "keras": keras_job}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", choices=sorted(JOBS), required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hold-at", type=int, default=-1)
    a = ap.parse_args()
    kolo.init()
    report({"ev": "ready", "pid": os.getpid(), "rank": kolo.rank()})
    state, step, result = JOBS[a.state](a)

    first_start = []

    @elastic.run
    def train(state):
        report({"ev": "start", "pid": os.getpid(), "rank": kolo.rank(), "step": state.step})
        first_start.append(state.step)
        while state.step < a.steps:
            step(state)
            state.step += 1
            state.commit()
            if state.step == a.hold_at and first_start[0] == 0:
                report({"ev": "held", "pid": os.getpid(), "step": state.step})
                threading.Event().wait()  # until the test kills every worker

    train(state)
    report({"ev": "done", "pid": os.getpid(), "rank": kolo.rank(), "step": state.step,
            "result": result()})
    kolo.finalize()


if __name__ == "__main__":
    main()
