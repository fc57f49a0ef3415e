"""A job of named allreduces with one injected fault, for the hang
diagnosis tests (tests/python/test_diagnosis.py).

Every rank reports {"ev": "ready", "rank", "pid"} and then allreduces
"step.<i>" (checked against the float64 sum of every rank's input) until
rank 0 says stop (element 0 of the reduced vector). The victim injects its
fault at step --at and reports {"ev": "fault"} first:
  stop  SIGSTOP of its own process: it holds everyone, answers nothing;
  skip  it never submits step.<at> and submits step.<at+1> instead;
  hang  it blocks before step.<at> (a data loader that never returns);
  slow  a straggler: it computes --delay-ms longer than the others before
        every step, from the start, and the job runs for --seconds.
control injects nothing and runs for --seconds.
--elements sets the float32 elements per allreduce (a fault injected from
outside, on network-namespace hosts, then hits a transfer in flight), and
--progress reports {"ev": "step", "step"} after each step. A failed allreduce
reports {"ev": "failed", "step", "error"} before the worker exits."""

import argparse
import os
import signal
import threading
import time

import numpy as np

import kolo
from _common import report
from kolo.common import arrays

N = 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["control", "stop", "skip", "hang", "slow"], required=True)
    ap.add_argument("--victim", type=int, default=2)
    ap.add_argument("--at", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--elements", type=int, default=N)
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args()
    kolo.init()
    rank, size = kolo.rank(), kolo.size()
    report({"ev": "ready", "rank": rank, "pid": os.getpid()})
    start = time.monotonic()
    step = 0
    while True:
        if a.mode == "slow" and rank == a.victim:
            time.sleep(a.delay_ms / 1000)  # the straggler's longer compute
        fault = a.mode not in ("control", "slow") and rank == a.victim and step == a.at
        if fault:
            report({"ev": "fault", "rank": rank, "mode": a.mode, "step": step})
            if a.mode == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif a.mode == "hang":
                threading.Event().wait(600)
            else:
                step += 1
        x = np.full(a.elements, float(rank + 1) * (step + 1), dtype=np.float32)
        x[0] = 1.0 if rank == 0 and time.monotonic() - start > a.seconds else 0.0
        try:
            out = arrays.allreduce(x, name=f"step.{step}", op="sum").wait()
        except Exception as e:
            report({"ev": "failed", "step": step, "error": str(e)})
            raise
        want = np.float64(size * (size + 1) / 2) * (step + 1)
        if not np.allclose(out[1:].astype(np.float64), want, rtol=1e-6):
            report({"ev": "wrong", "step": step, "got": float(out[1]), "want": float(want)})
            raise SystemExit(1)
        if a.progress:
            report({"ev": "step", "step": step})
        step += 1
        if out[0] >= 1.0:
            break
    report({"ev": "done", "rank": rank, "steps": step})
    kolo.finalize()


if __name__ == "__main__":
    main()
