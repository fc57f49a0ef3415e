#!/usr/bin/env python3
"""Soak test of elastic PyTorch training with Horovod's API: the elastic
example (examples/torch/train_digits_elastic.py) as an elastic job of up to
4 workers against an external kolo-rendezvous, while random events hit it
at random moments, one at a time, for --seconds:

  kill        SIGKILL of a worker (while at least 3 are live)
  term        SIGTERM: the worker leaves at its next commit point, exits 0
  stop_short  SIGSTOP for 50 ms .. 1.2 s, then SIGCONT: nothing re-forms
  stop_long   SIGSTOP for KOLO_TIMEOUT_MS + 2..5 s (while at least 3 are
              live): the others re-form without it; after SIGCONT it finds
              itself evicted and joins again
  join        one more worker, by a second `kolorun -np 1` (while fewer
              than 4 are live), at random after the events that lose one

Then the training runs to its end, undisturbed (40 epochs outlast 40 s of
events), and the run
is checked, not on the program's word alone:

- every kolorun ended within --finish-s; a kolorun ends 0 unless one of its
  workers was SIGKILLed (then 0 or 137);
- the workers of the last round printed one parameter hash each, all the
  same, and the program's own allgather found them bitwise identical on
  that many ranks; it reached its target accuracy;
- no worker printed a traceback or "REPLICAS DIFFER";
- rank 0 committed a step at least every --hang-s seconds while events ran
  (a stop_long of rank 0 included: the others re-form within the timeout).

A worker waiting as a spare when the training ends exits 0 (the job is
finished, docs/elastic.md "The end of the job"). One summary line
("soak_torch: SUMMARY ...") is printed; the exit status is 0 only when
every check held. Standard library only; the example needs torch (exit 77,
a skip, without it)."""

import argparse
import ctypes
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "torch", "train_digits_elastic.py")
NAME = "train_digits_elastic"
TIMEOUT_MS = 5000  # KOLO_TIMEOUT_MS of the workers
MAX_NP = 4

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: no orphan on a ctest timeout


class Run:
    """One kolorun of the example; its stdout lines go to a shared queue."""

    def __init__(self, soak, n):
        self.idx = len(soak.runs)
        self.out_path = os.path.join(soak.tmp, f"run{self.idx}.out")
        self.err_path = os.path.join(soak.tmp, f"run{self.idx}.err")
        cmd = [soak.kolorun, "-np", str(n), *soak.launcher, "--", soak.python, EXAMPLE,
               *soak.program_args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(self.err_path, "w"),
                                     text=True, env=soak.env, cwd=REPO,
                                     preexec_fn=_die_with_parent)
        self.killed = False  # one of its workers got SIGKILL
        out = open(self.out_path, "w")

        def read():
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                soak.lines.put((self, line))
            out.close()
        threading.Thread(target=read, daemon=True).start()


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.python = a.python
        self.kolorun = os.path.join(a.bin, "kolorun")
        self.tmp = tempfile.mkdtemp(prefix="kolo-soak-torch.")
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as f:
            f.write("soak-torch-" + os.urandom(12).hex() + "\n")
        self.env = dict(os.environ)
        lib = os.path.join(a.bin, "..", "lib", "libkolo.so")
        self.env.update({
            "PYTHONPATH": os.path.join(REPO, "python"), "KOLO_LIBRARY": lib,
            "OMP_NUM_THREADS": "1", "KOLO_HEARTBEAT_MS": "300",
            "KOLO_ELASTIC_LEAVE_GRACE_MS": "20000", "KOLO_IFACE": "127.0.0.1",
            "KOLO_LOG_LEVEL": "info", "KOLO_TIMEOUT_MS": str(TIMEOUT_MS),
            "PYTHONFAULTHANDLER": "1"})
        self.server = subprocess.Popen(
            [os.path.join(a.bin, "kolo-rendezvous"), "--listen", "127.0.0.1:0", "--token-file",
             token, "--min-np", "2", "--max-np", str(MAX_NP), "--settle-ms", "300"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.tmp, "rendezvous.err"), "w"),
            text=True, preexec_fn=_die_with_parent)
        m = re.match(r"listening on (\S+):(\d+)", self.server.stdout.readline())
        if not m:
            raise SystemExit("soak_torch: kolo-rendezvous did not start")
        self.launcher = ["--rendezvous", f"http://127.0.0.1:{m.group(2)}", "--token-file", token,
                         "--job", "soak-torch", "--min-np", "2", "--max-np", str(MAX_NP)]
        self.program_args = ["--epochs", str(a.epochs), "--slow-ms", str(a.slow_ms),
                             "--step-report"]
        self.runs = []
        self.lines = queue.Queue()
        self.pids = {}  # worker pid -> its Run
        self.gone = set()  # pids signalled to end (kill, term)
        self.step = 0
        self.step_at = time.monotonic()
        self.events = []
        self.failures = []

    def drain(self):
        while True:
            try:
                run, line = self.lines.get_nowait()
            except queue.Empty:
                return
            m = re.search(rf"{NAME}: rank \d+ of \d+: pid (\d+)", line)
            if m:
                self.pids[int(m.group(1))] = run
            m = re.search(rf"{NAME}: step (\d+) committed", line)
            if m:
                self.step, self.step_at = int(m.group(1)), time.monotonic()

    def live(self):
        out = []
        for pid in self.pids:
            if pid in self.gone:
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        out.append(pid)
            except OSError:
                pass
        return sorted(out)

    def note(self, what):
        self.events.append(f"{time.monotonic() - self.t0:6.1f}s step {self.step:4d}: {what}")
        print(f"soak_torch: {self.events[-1]}", flush=True)

    def pause(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(0.05, max(end - time.monotonic(), 0)))
            self.drain()

    def event(self):
        live = self.live()
        kind = self.rng.choice(["kill", "kill", "term", "stop_short", "stop_long", "join"])
        if kind in ("kill", "term") and len(live) >= 3:
            pid = self.rng.choice(live)
            self.gone.add(pid)
            if kind == "kill":
                self.pids[pid].killed = True
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            self.note(f"{kind} {pid}")
        elif kind == "stop_short" and live:
            pid, d = self.rng.choice(live), self.rng.uniform(0.05, 1.2)
            self.stop(pid, d, kind)
        elif kind == "stop_long" and len(live) >= 3:
            pid, d = self.rng.choice(live), TIMEOUT_MS / 1000 + self.rng.uniform(2, 5)
            self.stop(pid, d, kind)
        if len(self.live()) < MAX_NP and len(self.runs) < self.a.max_runs and \
                self.rng.random() < 0.7:
            self.runs.append(Run(self, 1))
            self.note("join")

    def stop(self, pid, seconds, kind):
        os.kill(pid, signal.SIGSTOP)
        self.note(f"{kind} {pid} for {seconds:.2f} s")
        try:
            self.pause(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def run(self):
        self.runs.append(Run(self, MAX_NP))
        start = time.monotonic()
        while len(self.pids) < MAX_NP:
            if time.monotonic() - start > 120:
                self.failures.append("the first 4 workers did not start within 120 s")
                return
            self.pause(0.1)
        self.t0 = time.monotonic()
        while time.monotonic() - self.t0 < self.a.seconds:
            self.pause(self.rng.uniform(0.5, 4.0))
            if all(r.proc.poll() is not None for r in self.runs):
                break
            if time.monotonic() - self.step_at > self.a.hang_s:
                self.failures.append(f"no step committed for {self.a.hang_s} s "
                                     f"(last: step {self.step})")
                return
            self.event()
        end = time.monotonic() + self.a.finish_s
        while time.monotonic() < end and any(r.proc.poll() is None for r in self.runs):
            self.pause(0.2)
        self.drain()

    def check(self):
        for r in self.runs:
            rc = r.proc.poll()
            if rc is None:
                self.failures.append(f"kolorun {r.idx} did not end within {self.a.finish_s} s")
            elif rc != 0 and not (r.killed and rc == 128 + signal.SIGKILL):
                self.failures.append(f"kolorun {r.idx} exited {rc}")
        out = "".join(open(r.out_path).read() for r in self.runs)
        err = "".join(open(r.err_path).read() for r in self.runs)
        hashes = re.findall(rf"{NAME}: rank (\d+): parameters sha256 ([0-9a-f]{{16}})", out)
        ranks = sorted(int(r) for r, _ in hashes)
        if len(hashes) < 2 or ranks != list(range(len(hashes))):
            self.failures.append(f"final ranks {ranks}: not one hash per rank of the last round")
        if len({h for _, h in hashes}) != 1:
            self.failures.append(f"the last round's ranks hold different parameters: {hashes}")
        if f"parameters bitwise identical on all {len(hashes)} ranks" not in out:
            self.failures.append("the program did not find its replicas identical")
        if "reached test accuracy" not in out:
            self.failures.append("the target accuracy was not reached")
        for bad in ("Traceback", "REPLICAS DIFFER"):
            if bad in out or bad in err:
                self.failures.append(f"a worker printed {bad!r}")
        spares = err.count("ended before this worker got a rank")
        return len(hashes), spares

    def forensics(self):
        """Where a kolorun did not end: SIGABRT to its live workers (with
        PYTHONFAULTHANDLER set, each prints every thread's Python stack),
        then the tail of every log, so that a failure in CI shows its cause."""
        stuck = [pid for pid in self.live() if self.pids[pid].proc.poll() is None]
        for pid in stuck:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGABRT)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and set(stuck) & set(self.live()):
            time.sleep(0.1)
        names = [f"run{r.idx}.err" for r in self.runs] + ["rendezvous.err"]
        for name in names:
            lines = open(os.path.join(self.tmp, name), errors="replace").read().splitlines()
            print(f"soak_torch: ---- the last {min(len(lines), 40)} lines of {name}", flush=True)
            for line in lines[-40:]:
                print(f"soak_torch: | {line}", flush=True)

    def close(self):
        for r in self.runs:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        self.server.kill()
        self.server.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40, help="how long events run (default 40)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the time)")
    p.add_argument("--bin", default=os.environ.get("KOLO_BIN", os.path.join(REPO, "build", "bin")),
                   help="folder with kolorun and kolo-rendezvous (default $KOLO_BIN or build/bin)")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter with torch (default: this one)")
    p.add_argument("--epochs", type=int, default=40, help="the example's epochs (default 40)")
    p.add_argument("--slow-ms", type=float, default=60,
                   help="the example's delay per step, so that it outlasts the events (default 60)")
    p.add_argument("--hang-s", type=float, default=40,
                   help="longest time without a committed step while events run (default 40)")
    p.add_argument("--finish-s", type=float, default=240,
                   help="time for every kolorun to end after the events (default 240)")
    p.add_argument("--max-runs", type=int, default=16, help="most kolorun started (default 16)")
    a = p.parse_args()
    if a.seed is None:
        a.seed = int(time.time())
    if subprocess.run([a.python, "-c", "import torch"], capture_output=True).returncode != 0:
        print(f"soak_torch: {a.python} has no torch: skipped")
        return 77
    s = Soak(a)
    print(f"soak_torch: seed {a.seed}, {a.seconds:g} s of events; logs in {s.tmp}", flush=True)
    try:
        s.run()
        final, spares = s.check()
        if s.failures:
            s.forensics()
    finally:
        s.close()
    kinds = {k: sum(f": {k}" in e for e in s.events)
             for k in ("kill", "term", "stop_short", "stop_long", "join")}
    verdict = "FAIL" if s.failures else "OK"
    print(f"soak_torch: SUMMARY {verdict}: seed {a.seed}; events "
          + ", ".join(f"{k} {n}" for k, n in kinds.items())
          + f"; {len(s.runs)} kolorun; last step committed {s.step}; last round {final} ranks, "
          f"identical; {spares} spares told the job finished", flush=True)
    for f in s.failures:
        print(f"soak_torch: FAILED: {f}", flush=True)
    return 1 if s.failures else 0


if __name__ == "__main__":
    sys.exit(main())
