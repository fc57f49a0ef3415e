"""Exits with operations in flight: every rank enqueues allreduces and
returns from main (or calls sys.exit(0), argv[1] == "sys.exit") without
waiting for them; some handles are dropped at once, some are still held,
and each rank also has an operation that no other rank ever submits (still
pending at exit). Interpreter
exit (atexit: kolo.finalize) must neither crash nor hang."""

from __future__ import annotations

import sys
import time

import numpy as np

import kolo
from _common import report


def main(mode: str) -> None:
    kolo.init()
    rank = kolo.rank()
    kolo.barrier()
    held = []
    for k in range(16):
        a = np.full(50_000, rank + 1, np.float32)
        h = kolo.allreduce_async(a, name=f"inflight.{k}")
        if k % 2:
            held.append(h)  # held, never waited
        # else dropped at once: kolo keeps its buffer referenced until it is done
    # An operation no other rank submits: still pending at exit.
    held.append(kolo.allreduce_async(np.ones(3, np.float32), name=f"only.rank{rank}"))
    # Every rank has enqueued everything before any rank exits (a rank that
    # finalizes shuts the job's engines down: later enqueues would fail).
    kolo.barrier()
    pending = sum(not h.poll() for h in held)
    # Large operations that are running when the interpreter exits, their
    # handles dropped at once. A rank that finalizes first shuts the job's
    # engines down, so a late enqueue may fail with ShutdownError instead.
    late = "enqueued"
    try:
        for k in range(6):
            kolo.allreduce_async(np.full(1 << 20, rank + 1, np.float32), name=f"late.{k}")
    except kolo.ShutdownError:
        late = "shut down"
    report({"section": "exiting", "rank": rank, "mode": mode, "t": time.time(),
            "pending": pending, "late": late})
    if mode == "sys.exit":
        sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "return")
