"""Trials of the straggler eviction policy (docs/diagnosis.md, "Evicting a
straggler").

Each trial is an elastic job of --np workers and one spare under kolorun
(tests/python/workers/straggler_worker.py) with KOLO_STRAGGLER_EVICT_PCT and
_STEPS set:
  hog      a random rank shares its CPU with a busy process from the start
  control  no straggler
A hog trial is right when exactly the hog was evicted (exit status 90) and
the job finished at its size; it records the steps and seconds from the
first step to the eviction. A control trial is right when nobody was
evicted. Prints one line per trial and a table.

  .venv/bin/python bench/diagnosis/evict.py --trials 20
"""

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(ROOT, "tests", "python", "workers", "straggler_worker.py")
RESULT = re.compile(r"^\[(?:\d+|w\d+)\] KOLO-RESULT (.*)$")


def trial(a, mode, victim):
    env = dict(os.environ, KOLO_STRAGGLER_EVICT_PCT=str(a.pct),
               KOLO_STRAGGLER_EVICT_STEPS=str(a.window), KOLO_IFACE="127.0.0.1",
               OMP_NUM_THREADS="1", KOLO_LOG_LEVEL="warn",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                           os.path.dirname(WORKER)]))
    cmd = [a.kolorun, "-np", str(a.np), "--spares", "1", "--", sys.executable, WORKER, "--mode",
           "none" if mode == "control" else mode, "--victim", str(victim), "--steps", str(a.steps), "--work", str(a.work),
           "--hogs", str(a.hogs)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    ev, start = [], None
    for line in p.stdout:  # stamped as they come
        m = RESULT.match(line.strip())
        if m:
            e = dict(json.loads(m.group(1)), _t=time.monotonic())
            ev.append(e)
            if e["ev"] == "ready" and start is None:
                start = e["_t"]
    err = p.stderr.read()
    rc = p.wait(timeout=300)
    exits = [e for e in ev if e["ev"] == "exit"]
    done = [e for e in ev if e["ev"] == "done"]
    hogs = [e["pid"] for e in ev if e["ev"] == "ready" and e["victim"]]
    full = len(done) == a.np and all(d["step"] == a.steps and d["size"] == a.np for d in done)
    if mode == "control":
        return rc == 0 and not exits and full, None, None, \
            f"{len(exits)} evicted; exit status {rc}; {len(done)} finished" + \
            ("" if rc == 0 else ": " + err[-300:])
    ok = rc == 0 and full and [(e["pid"], e["code"]) for e in exits] == [(hogs[0], 90)]
    if not exits:
        return False, None, None, "nobody evicted: " + err[-300:]
    return ok, exits[0]["step"], exits[0]["_t"] - (start or t0), \
        f"rank {victim} hog; evicted pid {exits[0]['pid']} (hog {hogs})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--pct", type=float, default=40)
    ap.add_argument("--window", type=int, default=40)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--work", type=int, default=400)
    ap.add_argument("--hogs", type=int, default=1, help="busy processes beside the victim")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kolorun", default=os.path.join(ROOT, "build", "bin", "kolorun"))
    a = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("evict.py: a CPU hog beside one rank needs two CPUs")
    rng = random.Random(a.seed)
    res = {"hog": [], "control": []}
    for i in range(a.trials):
        mode = "hog" if i % 2 == 0 else "control"
        victim = rng.randrange(a.np)
        ok, steps, secs, what = trial(a, mode, victim)
        res[mode].append((ok, steps, secs))
        tail = f" at step {steps}, {secs:.2f} s" if steps is not None else ""
        print(f"trial {i:3d} {mode:7s}: {'right' if ok else 'WRONG'}{tail}: {what}", flush=True)
    print(f"\n{a.trials} trials, {a.np} workers + 1 spare, KOLO_STRAGGLER_EVICT_PCT={a.pct:g} "
          f"KOLO_STRAGGLER_EVICT_STEPS={a.window}")
    hog = res["hog"]
    right = [r for r in hog if r[0]]
    print(f"hog      {len(hog):3d} trials, {len(right)} right (the hog alone evicted, the job "
          f"at its size)")
    if right:
        st = [r[1] for r in right]
        sec = [r[2] for r in right]
        print(f"         steps to eviction: median {statistics.median(st):.0f}, max {max(st)}; "
              f"seconds: median {statistics.median(sec):.2f}, max {max(sec):.2f}")
    ctl = res["control"]
    print(f"control  {len(ctl):3d} trials, {sum(r[0] for r in ctl)} evicted nobody")


if __name__ == "__main__":
    main()
