"""An elastic job with one straggler, for the straggler eviction policy
(tests/python/test_straggler.py, bench/diagnosis/faults.py).

Every step each rank computes (fixed CPU work: --work matrix products),
allreduces "grad" (checked against the sum every rank contributes), adds
the result to the committed state and commits. The victim is the rank
--victim of the first round (a spare that joins later never is):
  hog   it shares one CPU with --hogs busy processes (2: it gets a third of
        the CPU), while the other ranks share the remaining CPUs: a noisy
        neighbour;
  slow  it sleeps --delay-ms more per step;
  none  no straggler (the control run); every rank on a CPU of its own.
With --victim -1 the victim is the worker whose environment has
STRAGGLER_VICTIM=1 (for jobs of several launchers).
Each worker reports {"ev": "ready"}, then {"ev": "done"} with its final
step, total and size, or {"ev": "exit", "code"} when the elastic loop ends
the process (an eviction exits with kolo.EXIT_EVICTED)."""

import argparse
import ctypes
import os
import subprocess
import sys
import time

import numpy as np

import kolo
from _common import report
from kolo.common import arrays, elastic

N = 256
HOG = ("import ctypes, time\n"
       "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when the worker goes\n"
       "end = time.monotonic() + 120\n"
       "while time.monotonic() < end:\n"
       "    pass\n")


def start_hogs(cpu, n):
    """n busy processes pinned to cpu, gone with this process."""
    procs = []
    for _ in range(n):
        p = subprocess.Popen([sys.executable, "-c", HOG])
        os.sched_setaffinity(p.pid, {cpu})
        procs.append(p)
    return procs


def pin(is_victim, mode, rank, hogs):
    """hog: the victim (and its hog) on the last CPU, the others on the rest.
    Otherwise each rank on a CPU of its own (rank modulo the CPUs), as a job
    gets its cores: ranks that float share cores unevenly, and a rank that
    keeps losing that race is a straggler indeed."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return []
    if mode != "hog":
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        return []
    last = cpus[-1]
    if is_victim:
        os.sched_setaffinity(0, {last})
        return start_hogs(last, hogs)
    os.sched_setaffinity(0, set(cpus[:-1]))
    return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["none", "hog", "slow"], required=True)
    ap.add_argument("--victim", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--work", type=int, default=40)
    ap.add_argument("--delay-ms", type=float, default=15.0)
    ap.add_argument("--hogs", type=int, default=2, help="busy processes beside the victim")
    a = ap.parse_args()
    kolo.init()
    first = kolo.round()
    # Round 1 is the job's first: a spare gets its rank in a later one.
    is_victim = a.mode != "none" and first == 1 and (
        kolo.rank() == a.victim if a.victim >= 0 else os.environ.get("STRAGGLER_VICTIM") == "1")
    hogs = pin(is_victim, a.mode, kolo.rank(), a.hogs)
    report({"ev": "ready", "rank": kolo.rank(), "round": first, "pid": os.getpid(),
            "victim": is_victim})
    m = np.random.default_rng(0).standard_normal((96, 96)) / 96

    state = elastic.ObjectState(step=0, total=0.0)

    @elastic.run
    def train(state):
        while state.step < a.steps:
            x = m
            for _ in range(a.work):
                x = x @ m
            if is_victim and a.mode == "slow":
                time.sleep(a.delay_ms / 1000)
            size = kolo.size()
            g = np.full(N, float(kolo.rank() + 1), dtype=np.float32)
            out = arrays.allreduce(g, name="grad", op="sum").wait()
            want = size * (size + 1) / 2
            if not np.allclose(out.astype(np.float64), want):
                report({"ev": "wrong", "step": state.step, "got": float(out[0]), "want": want})
                raise SystemExit(1)
            state.total += want
            state.step += 1
            state.commit()

    try:
        train(state)
    except SystemExit as e:
        report({"ev": "exit", "pid": os.getpid(), "code": e.code, "step": state.step,
                "victim": is_victim})
        raise
    finally:
        for p in hogs:
            p.kill()
    report({"ev": "done", "pid": os.getpid(), "rank": kolo.rank(), "size": kolo.size(),
            "step": state.step, "total": state.total, "victim": is_victim})
    kolo.finalize()


if __name__ == "__main__":
    main()
