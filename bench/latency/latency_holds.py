#!/usr/bin/env python3
"""Small-message allreduce latency, run after run: kolo against Open MPI.

Each case (ranks, transport, neighbour) runs RUNS times; each run is one job of
kolo-bench and then one job of Open MPI's mpi_bench (bench/peers), interleaved, with
the same sizes, iteration counts, statistic (the median per size, maximum over the
ranks) and the same start (a one-element allreduce before the timed loop). A
neighbour starts beside each job, as data loaders and logging do in training:

  none    nothing
  python  a Python interpreter that starts and exits (python3 -c pass)
  busy    a busy loop for 100 ms from the start of the job's sweep

For each case and size it prints the RUNS medians of both sides and the worst
ratio, max over runs of kolo/mpi: <= 1.0 means kolo was at or below Open MPI in
every run. Each neighbour starts when its job says that every rank is up
(--ready-fifo of both benchmarks), so that it meets the same part of both
sides' sweeps whichever launcher is faster. --guard runs only the 2-rank
8-byte shared-memory case without Open MPI and prints the spread between its
fastest and slowest median.

  bench/latency/latency_holds.py [--runs 10] [--ranks 2,4] [--load N] [--guard]
                                  [--stat median|mean]
"""
from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZES = [8, 512, 4096, 16384, 65536]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
MPI_TCP = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]


def neighbour(kind: str) -> subprocess.Popen | None:
    if kind == "python":
        return subprocess.Popen([sys.executable, "-c", "pass"])
    if kind == "busy":
        code = "import time\nt=time.monotonic()\nwhile time.monotonic()-t<0.1: pass"
        return subprocess.Popen([sys.executable, "-S", "-c", code])
    return None


JOB_TIMEOUT_S = 300
STAT_KEY = "median_us"  # --stat mean: "time_us", the mean iteration


def wait_ready(fd: int, p: subprocess.Popen, deadline: float) -> bool:
    """Waits until the job writes its byte to the FIFO (every rank is up and
    the sweep is about to start); False if it exits or times out first."""
    while time.monotonic() < deadline and p.poll() is None:
        if select.select([fd], [], [], 0.05)[0]:
            try:
                if os.read(fd, 1):
                    return True
            except BlockingIOError:
                pass
    return False


def job(cmd: list[str], env: dict[str, str], kind: str) -> dict[int, float]:
    """Runs one job; returns the statistic (median, or mean) in us per size (inf for every size of a job
    that ran past JOB_TIMEOUT_S, which is killed). The neighbour starts when
    the job says, through --ready-fifo, that every rank is up: kolorun starts a
    job faster than mpirun does, and a neighbour started with the launcher
    would overlap more of the faster one's sweep."""
    with tempfile.TemporaryDirectory(prefix="kolo-lat-") as tmp:
        fifo = os.path.join(tmp, "ready")
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            p = subprocess.Popen([*cmd, "--ready-fifo", fifo], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
            deadline = time.monotonic() + JOB_TIMEOUT_S
            nb = neighbour(kind) if wait_ready(fd, p, deadline) else None
        finally:
            os.close(fd)
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.communicate()
            print(f"# timed out after {JOB_TIMEOUT_S} s: {' '.join(cmd[:8])} ...", flush=True)
            return {s: float("inf") for s in SIZES}
        finally:
            if nb:
                nb.wait()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}:\n{err[-2000:]}")
    rows = {}
    for line in out.splitlines():
        line = line[line.find("{"):] if "{" in line else ""
        if line:  # kolorun prefixes a rank's lines with "[rank] "
            r = json.loads(line)
            rows[int(r["bytes"])] = float(r[STAT_KEY])
    return rows


def commands(args: argparse.Namespace, n: int, tcp: bool, sizes: list[int]):
    b = ["-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "2", "--iters",
         str(args.iters), "--warmup", str(args.warmup), "--inplace", "--json"]
    env = dict(os.environ, KOLO_LOG_LEVEL="warn")
    if tcp:
        env["KOLO_SHM"] = "0"
    kolo = [str(args.bin / "kolorun"), "-np", str(n), "--", str(args.bin / "kolo-bench"),
            "allreduce", *b]
    mpi = [*MPIRUN, "-np", str(n), *(MPI_TCP if tcp else []), str(args.peers / "mpi_bench"),
           *b]
    return kolo, mpi, env


def start_load(n: int) -> list[subprocess.Popen]:
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-S", "-c", code]) for _ in range(n)]


def guard(args: argparse.Namespace) -> int:
    kolo, _, env = commands(args, 2, False, [8])
    meds = []
    for kind in ("none", "python", "busy"):
        for _ in range(args.runs):
            meds.append(job(kolo, env, kind)[8])
    fast, slow = min(meds), max(meds)
    print(f"guard: 2 ranks, 8 B, shared memory, {STAT_KEY[:-3]}s (us):",
          " ".join(f"{m:.2f}" for m in meds))
    print(f"guard: fastest {fast:.2f} us, slowest {slow:.2f} us, spread {slow / fast:.2f}x")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--neighbours", default="none,python,busy")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--load", type=int, default=0, help="busy loops beside the whole run")
    ap.add_argument("--bin", type=Path, default=ROOT / "build" / "bin")
    ap.add_argument("--peers", type=Path, default=ROOT / "build" / "peers")
    ap.add_argument("--guard", action="store_true")
    ap.add_argument("--no-tcp", action="store_true", help="skip the TCP case")
    ap.add_argument("--job-timeout", type=int, default=300, help="seconds per job")
    ap.add_argument("--stat", choices=["median", "mean"], default="median",
                    help="per run and size: the median iteration (default) or the mean; "
                         "each the slowest rank's")
    args = ap.parse_args()
    global JOB_TIMEOUT_S, STAT_KEY
    JOB_TIMEOUT_S = args.job_timeout
    STAT_KEY = "median_us" if args.stat == "median" else "time_us"
    load = start_load(args.load)
    try:
        if args.guard:
            return guard(args)
        return compare(args)
    finally:
        for p in load:
            p.kill()
            p.wait()


def compare(args: argparse.Namespace) -> int:
    cases = [(int(n), False, SIZES) for n in args.ranks.split(",")]
    if not args.no_tcp:
        cases.append((2, True, [8]))
    worst_all = 0.0
    print(f"# {args.runs} runs per case, load {os.getloadavg()[0]:.2f} at start,"
          f" {args.load} busy loops beside; {args.stat}s in us")
    for n, tcp, sizes in cases:
        kolo, mpi, env = commands(args, n, tcp, sizes)
        for kind in args.neighbours.split(","):
            res = {s: ([], []) for s in sizes}
            for _ in range(args.runs):
                k, m = job(kolo, env, kind), job(mpi, env, kind)
                for s in sizes:
                    res[s][0].append(k[s])
                    res[s][1].append(m[s])
            for s in sizes:
                ks, ms = res[s]
                worst = max(a / b for a, b in zip(ks, ms))
                worst_all = max(worst_all, worst)
                tr = "tcp" if tcp else "shm"
                print(f"{n} ranks {tr} {kind:6s} {s:6d} B  kolo "
                      + " ".join(f"{v:.2f}" for v in ks)
                      + f" | mpi " + " ".join(f"{v:.2f}" for v in ms)
                      + f" | median {statistics.median(ks):.2f} vs {statistics.median(ms):.2f}"
                      + f" worst ratio {worst:.2f}", flush=True)
    print(f"worst ratio over every case and run: {worst_all:.2f}")
    return 0 if worst_all <= 1.0 else 1


if __name__ == "__main__":
    t0 = time.monotonic()
    rc = main()
    print(f"# {time.monotonic() - t0:.0f} s", file=sys.stderr)
    sys.exit(rc)
