#!/usr/bin/env python3
"""Step-time overhead of durable commits (docs/durable.md), side by side in
one run: examples/torch/train_digits_elastic.py (a commit after every
step) under kolorun -np 2, with durable commits off, every commit
(KOLO_DURABLE_EVERY=1), every 10 and at the default (20), alternating, REPS times
each. Prints one line per run, ms per step (the example's training time
over its steps), then per setting the ratio of its median to off's and the
median of its ratios to off in the same repetition.

    bench/durable/overhead.py [--reps 3] [--epochs 20] [--build build]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINED = re.compile(r"trained \d+ epochs \((\d+) steps\) in ([\d.]+) s")


def one(build, epochs, every):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_NUM_THREADS="1",
               KOLO_LIBRARY=os.path.join(build, "lib", "libkolo.so"), KOLO_LOG_LEVEL="warn")
    with tempfile.TemporaryDirectory() as tmp:  # each run its own: no resume
        if every:
            env.update(KOLO_DURABLE_DIR=tmp, KOLO_DURABLE_EVERY=str(every))
        return run(build, epochs, env)


def run(build, epochs, env):
    cmd = [os.path.join(build, "bin", "kolorun"), "-np", "2", "--min-np", "2", "--max-np", "2",
           "--", sys.executable, os.path.join(REPO, "examples/torch/train_digits_elastic.py"),
           "--epochs", str(epochs)]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600, check=True).stdout
    steps, secs = TRAINED.search(out).groups()
    return 1000 * float(secs) / int(steps), int(steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    a = ap.parse_args()
    configs = [("off", 0), ("every=1", 1), ("every=10", 10), ("every=20 (default)", 20)]
    got = {name: [] for name, _ in configs}
    for rep in range(1, a.reps + 1):
        for name, every in configs:
            ms, steps = one(a.build, a.epochs, every)
            got[name].append(ms)
            print(f"rep{rep} {name:20s} {ms:.3f} ms/step ({steps} steps)", flush=True)
    base = statistics.median(got["off"])
    for name, _ in configs:
        med = statistics.median(got[name])
        paired = statistics.median(x / y for x, y in zip(got[name], got["off"]))
        print(f"median {name:20s} {med:.3f} ms/step  ratio of medians {med / base:.3f}  "
              f"median of the repetitions' ratios {paired:.3f}")


if __name__ == "__main__":
    main()
