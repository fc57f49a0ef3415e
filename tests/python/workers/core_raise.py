"""Rank 1 raises an uncaught exception while the others wait in an
allreduce it will never join. kolo's excepthook aborts rank 1's comm, so its
peers' allreduce fails at once (they report how and when, then fail too) and
kolorun exits non-zero within seconds."""

from __future__ import annotations

import time

import numpy as np

import kolo
from _common import report


def main() -> None:
    kolo.init()
    rank = kolo.rank()
    kolo.barrier()
    if rank == 1:
        report({"section": "raising", "t": time.time()})
        raise RuntimeError("core_raise: rank 1 fails on purpose")
    t0 = time.time()
    try:
        kolo.allreduce_async(np.ones(4, np.float32), name="never").wait()
    except kolo.Error as e:
        report({"section": "failed", "rank": rank, "type": type(e).__name__, "name": e.name,
                "t0": t0, "t": time.time(), "message": str(e)})
        raise
    report({"section": "survived", "rank": rank})


if __name__ == "__main__":
    main()
