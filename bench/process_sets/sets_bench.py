#!/usr/bin/env python3
"""Process sets and Adasum at 64 MiB, side by side, rounds interleaved.

  alone    one 2-rank job alone: kolo-bench allreduce (the ceiling of a set)
  pair     two 2-rank jobs started together (two separate kolorun): what two
           independent jobs get from the same machine at once
  sets     one 4-rank job split into 2 process sets of 2 (kolo-bench --sets 2),
           both sets running at once
  sum      4-rank allreduce, op sum
  adasum   4-rank allreduce, op adasum

Prints each round's busbw (GB/s, the slower rank's time) and the medians, and
the ratios: sets/alone, sets/pair (1.0: the sets slow each other no more than
two independent jobs do) and adasum/sum.

  bench/process_sets/sets_bench.py [--rounds 5] [--bytes 64M]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "build" / "bin"


def bench(n: int, extra: list[str], size: str) -> list[subprocess.Popen]:
    cmd = [str(BIN / "kolorun"), "-np", str(n), "--", str(BIN / "kolo-bench"), "allreduce",
           "-b", size, "-e", size, "--json", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def busbw(procs: list[subprocess.Popen]) -> list[float]:
    """The busbw of each job (or set) reported, lowest first."""
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=600)
        if p.returncode:
            raise SystemExit(f"kolo-bench exited {p.returncode}")
        for line in text.splitlines():
            if "{" in line:
                out.append(json.loads(line[line.index("{"):])["busbw_gbps"])
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bytes", default="64M")
    a = ap.parse_args()
    res: dict[str, list[float]] = {k: [] for k in ("alone", "pair", "sets", "sum", "adasum")}
    for i in range(a.rounds):
        res["alone"].append(busbw([bench(2, [], a.bytes)])[0])
        res["pair"].append(statistics.mean(busbw([bench(2, [], a.bytes),
                                                  bench(2, [], a.bytes)])))
        res["sets"].append(statistics.mean(busbw([bench(4, ["--sets", "2"], a.bytes)])))
        res["sum"].append(busbw([bench(4, ["-o", "sum"], a.bytes)])[0])
        res["adasum"].append(busbw([bench(4, ["-o", "adasum"], a.bytes)])[0])
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in res.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("medians (busbw GB/s): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    print(f"sets/alone {med['sets'] / med['alone']:.2f}, sets/pair {med['sets'] / med['pair']:.2f}"
          f", adasum/sum {med['adasum'] / med['sum']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
