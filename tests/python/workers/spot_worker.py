"""An elastic worker for test_spot.py: a small regression over numpy with
kolo.common.elastic (ObjectState), whose data depend only on the step, the
rank and the size, so that two runs with the same membership history end
with bitwise-equal parameters.

    spot_worker.py --steps N [--step-ms MS] [--provider aws|gce|azure|k8s
                   --emulator URL] [--leave-rank R --leave-step L]
                   [--stall-on-notice [--await-notice RANK:STEP]]

--provider: before kolo.init(), this worker asks the emulator
(tests/spot/metadata_emulator.py) for a machine of its own and points the
provider's endpoint at it (its standard override where the provider has one)
with KOLO_PREEMPTION=provider: every worker watches its own machine, and
the test raises a notice on one of them.
--leave-rank/--leave-step: the worker of that rank calls kolo.elastic_leave()
before the commit of that step (the same membership history without a
notice).
--stall-on-notice: a worker whose notice has a deadline stalls in its next
step (before its allreduce) for longer than the machine has: a step too long
for the notice, so that the deadline, not a commit point, ends it.
--await-notice RANK:STEP: the process that committed STEP as that rank waits,
in the step after STEP, for its notice (up to 60 s) before that check, so that
no commit point can come between the notice and the stall (the test raises
the notice once it sees step STEP). Survivors and spares, which redo that step
after the leave, did not commit STEP as RANK and do not wait.

Reports (conftest's KOLO-RESULT lines):
  {"ev": "start", "pid", "rank", "size", "instance"}     after init
  {"ev": "step", "pid", "rank", "size", "step", "t0", "t1"}  every step S
      (1-based, committed), t0/t1: time.monotonic() at its start and commit
  {"ev": "restore", "pid"} / {"ev": "reset", "pid", "rank", "size", "step"}
  {"ev": "stall", "pid", "step", "deadline_ms"}  --stall-on-notice, then
      the stall
  {"ev": "left", "pid", "step", "code", "preemption": [kind, text]}
  {"ev": "done", "pid", "rank", "size", "step", "params", "applied"}
"applied": every step whose update is in the parameters, in order, counted
into the committed state: each exactly once when nothing was lost or
applied twice.
"""

import argparse
import atexit
import json
import os
import shutil
import tempfile
import time
import urllib.request

import numpy as np

from _common import report

DIM, PER_RANK, LR = 8, 4, 0.05


def configure(provider, emulator):
    """A machine of the emulator for this worker; its endpoints in the
    environment (read by kolo.init())."""
    req = urllib.request.Request(emulator + "/_emulator/instances", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        inst = json.loads(r.read())
    url = f"http://127.0.0.1:{inst['port']}"
    env = {"KOLO_PREEMPTION": provider}
    if provider == "aws":
        env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = url
    elif provider == "gce":
        env["GCE_METADATA_HOST"] = f"127.0.0.1:{inst['port']}"
    elif provider == "azure":
        env["KOLO_AZURE_METADATA_ENDPOINT"] = url
    elif provider == "k8s":
        d = tempfile.mkdtemp(prefix="kolo-spot-sa-")
        atexit.register(shutil.rmtree, d, True)
        with open(os.path.join(d, "token"), "w") as f:
            f.write(inst["token"] + "\n")
        with open(os.path.join(d, "namespace"), "w") as f:
            f.write(inst["namespace"])
        env.update(KOLO_K8S_API=url, KOLO_K8S_TOKEN_FILE=os.path.join(d, "token"),
                   KOLO_K8S_POD_NAME=inst["pod"])
    os.environ.update(env)
    return inst["port"]


def batch(step, rank, size):
    """This rank's examples of this step: a function of (step, rank, size)
    only. The global batch of a step is the same whatever the size."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((PER_RANK * 3, DIM))
    w = np.arange(1.0, DIM + 1.0) / DIM
    y = x @ w + 0.5
    return x[rank::size], y[rank::size]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--provider", default="")
    ap.add_argument("--emulator", default="")
    ap.add_argument("--leave-rank", type=int, default=-1)
    ap.add_argument("--leave-step", type=int, default=-1)
    ap.add_argument("--stall-on-notice", action="store_true")
    ap.add_argument("--await-notice", default="", help="RANK:STEP")
    args = ap.parse_args()

    instance = configure(args.provider, args.emulator) if args.provider else None

    import kolo
    from kolo.common import elastic

    kolo.init()
    report({"ev": "start", "pid": os.getpid(), "rank": kolo.rank(), "size": kolo.size(),
            "instance": instance})

    class State(elastic.ObjectState):
        def restore(self):
            report({"ev": "restore", "pid": os.getpid()})
            super().restore()

    state = State(params=[0.0] * (DIM + 1), step=0, applied=[])
    state.register_reset_callbacks([lambda: report({"ev": "reset", "pid": os.getpid(),
                                                    "rank": kolo.rank(), "size": kolo.size(),
                                                    "step": state.step})])

    committed_as = {}  # step -> this process's rank when it committed it

    @elastic.run
    def train(state):
        while state.step < args.steps:
            t0 = time.monotonic()
            s = state.step + 1
            p = np.array(state.params)
            x, y = batch(s, kolo.rank(), kolo.size())
            err = x @ p[:DIM] + p[DIM] - y
            g = np.zeros(DIM + 1)
            g[:DIM] = x.T @ err
            g[DIM] = err.sum()
            if args.step_ms:
                time.sleep(args.step_ms / 1000)  # the step's compute
            if args.await_notice and args.await_notice == f"{committed_as.get(s - 1)}:{s - 1}":
                until = time.monotonic() + 60
                while kolo.elastic_preemption_deadline_ms() < 0 and time.monotonic() < until:
                    time.sleep(0.005)  # the watcher's thread sets it; nothing to wait on
            left = kolo.elastic_preemption_deadline_ms()
            if args.stall_on_notice and left >= 0:
                report({"ev": "stall", "pid": os.getpid(), "step": s, "deadline_ms": left})
                time.sleep(120)  # a step that outlasts the machine
            kolo.allreduce_async(g, name="spot.grad", op="sum").wait()
            state.params = list(p - LR * g / (PER_RANK * 3))
            state.applied = state.applied + [s]
            state.step = s
            if kolo.rank() == args.leave_rank and s == args.leave_step:
                kolo.elastic_leave()
            state.commit()
            committed_as[s] = kolo.rank()
            report({"ev": "step", "pid": os.getpid(), "rank": kolo.rank(),
                    "size": kolo.size(), "step": s, "t0": t0, "t1": time.monotonic()})

    try:
        train(state)
    except SystemExit as e:
        report({"ev": "left", "pid": os.getpid(), "step": state.step, "code": e.code,
                "preemption": list(kolo.elastic_preemption())})
        raise
    report({"ev": "done", "pid": os.getpid(), "rank": kolo.rank(), "size": kolo.size(),
            "step": state.step, "params": [float(v).hex() for v in state.params],
            "applied": state.applied, "preemption": list(kolo.elastic_preemption())})
    kolo.finalize()


if __name__ == "__main__":
    main()
