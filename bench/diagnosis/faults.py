"""Fault-injection trials of the hang diagnosis (docs/diagnosis.md).

Each trial runs a job of --np ranks under kolorun against one
kolo-rendezvous (tests/python/diag_jobs.py) and injects one fault at a
random step into a random rank:
  stop     SIGSTOP of the rank                      -> unresponsive
  skip     it skips one allreduce                   -> not_submitted
  hang     it blocks outside kolo before an op      -> not_submitted
  control  no fault; a diagnosis every 200 ms for --control-seconds
For a fault it polls GET /v1/jobs/{job}/diagnosis until somebody is named and
records whether exactly the right rank and kind were named first, and the
time from the fault to the answer. It prints one line per trial and the
precision and time-to-name percentiles per kind; control runs count every
answer that blamed anybody.

  .venv/bin/python bench/diagnosis/faults.py --trials 40 --threshold-ms 1000
"""

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

from diag_jobs import Job, Server, control_run, diagnose_until  # noqa: E402

EXPECT = {"stop": "unresponsive", "skip": "not_submitted", "hang": "not_submitted"}


def fault_trial(server, i, mode, np_, threshold_ms, rng):
    victim, at = rng.randrange(np_), rng.randrange(5, 60)
    name = f"faults-{i}-{mode}"
    job = Job(server, name, ["--mode", mode, "--victim", victim, "--at", at, "--seconds", 600],
              np_, threshold_ms)
    try:
        fault = job.wait_event("fault")
        try:
            elapsed, d, exact = diagnose_until(server, name, {(victim, EXPECT[mode])},
                                               fault["_at"], threshold_ms / 1000 + 30)
        except AssertionError as e:
            return False, None, str(e)[:200]
        return exact, elapsed, d["summary"]
    finally:
        job.kill()


def control_trial(server, i, np_, threshold_ms, seconds):
    name = f"faults-{i}-control"
    job = Job(server, name, ["--mode", "control", "--seconds", seconds], np_, threshold_ms)
    try:
        for _ in range(np_):
            job.wait_event("ready")
        answers, blamed = control_run(server, name, job)
        return answers, blamed
    finally:
        job.kill()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--threshold-ms", type=int, default=1000)
    ap.add_argument("--control-seconds", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    kinds = ["stop", "skip", "hang", "control"]
    res = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(tmp)
        try:
            for i in range(a.trials):
                mode = kinds[i % len(kinds)]
                if mode == "control":
                    answers, blamed = control_trial(server, i, a.np, a.threshold_ms,
                                                    a.control_seconds)
                    res[mode].append((not blamed, answers))
                    print(f"trial {i:3d} control: {answers} diagnoses, "
                          f"{len(blamed)} blamed somebody", flush=True)
                else:
                    ok, t, summary = fault_trial(server, i, mode, a.np, a.threshold_ms, rng)
                    res[mode].append((ok, t))
                    ts = f"{t:.2f} s" if t is not None else "never"
                    print(f"trial {i:3d} {mode:7s}: {'right' if ok else 'WRONG'} after {ts}: "
                          f"{summary}", flush=True)
        finally:
            server.close()
    print(f"\n{a.trials} trials, {a.np} ranks, threshold {a.threshold_ms} ms")
    print(f"{'kind':8s} {'trials':>6s} {'right':>6s} {'p50 s':>7s} {'p90 s':>7s} {'max s':>7s}")
    for k in kinds[:3]:
        times = [t for ok, t in res[k] if ok]
        right = sum(ok for ok, _ in res[k])
        print(f"{k:8s} {len(res[k]):6d} {right:6d} {pct(times, 0.5):7.2f} {pct(times, 0.9):7.2f} "
              f"{max(times) if times else float('nan'):7.2f}")
    clean = sum(ok for ok, _ in res["control"])
    answers = sum(n for _, n in res["control"])
    print(f"control  {len(res['control']):6d} {clean:6d}  ({answers} diagnoses, "
          f"{len(res['control']) - clean} runs blamed somebody)")
    faults = [x for k in kinds[:3] for x in res[k]]
    right = sum(ok for ok, _ in faults)
    within = sum(1 for ok, t in faults if ok and t <= a.threshold_ms / 1000 + 2)
    print(f"precision {right}/{len(faults)} = {100 * right / max(len(faults), 1):.1f} %; "
          f"named within threshold + 2 s: {within}/{len(faults)}; median "
          f"{statistics.median([t for ok, t in faults if ok] or [float('nan')]):.2f} s")


if __name__ == "__main__":
    main()
