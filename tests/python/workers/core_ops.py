"""Every core collective of the kolo module, on any number of ranks (also a
single process without kolorun), reported for test_core.py to check against
references it computes from core_data's inputs.

Sections, in order (every rank runs all of them): allreduce of every dtype
and op with and without scaling, in place and not, enqueued all at once;
unnamed allreduces; grouped allreduce; allgather with counts differing by
rank; broadcast from every root; alltoall with and without splits;
reducescatter; barrier; join with uneven work; mismatches (size > 1); bad
arguments on rank 0 only, followed by an unnamed allreduce of every rank
that must not stall (a bad call that enqueued something, or used up a name,
would make rank 0's next unnamed name differ)."""

from __future__ import annotations

import base64
import time

import numpy as np

import kolo
from _common import report
from core_data import (allgather_count, allreduce_cases, alltoall_splits, values)


def report_array(section: str, key: str, a, **extra) -> None:
    """Reports array ``a`` bit for bit, in parts that fit in one line each
    (test_core.arrays() puts them together again)."""
    raw = np.ascontiguousarray(a).tobytes()
    chunk = 1536
    parts = max(1, -(-len(raw) // chunk))
    for i in range(parts):
        report({"section": section, "key": key, "dtype": str(np.asarray(a).dtype),
                "part": i, "parts": parts,
                "b64": base64.b64encode(raw[i * chunk:(i + 1) * chunk]).decode(), **extra})


def expect_error(label: str, fn) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is reported
        report({"section": "error", "label": label, "type": type(e).__name__,
                "kolo": isinstance(e, kolo.Error), "name": getattr(e, "name", None),
                "status": getattr(e, "status", None), "message": str(e)})
    else:
        report({"section": "error", "label": label, "type": None})


def main() -> None:
    kolo.init()
    rank, size = kolo.rank(), kolo.size()
    report({"section": "init", "rank": rank, "size": size, "local_rank": kolo.local_rank(),
            "local_size": kolo.local_size(), "round": kolo.round(),
            "library": kolo.library_path()})

    # -- allreduce: every case in flight at once, then waited.
    pending = []
    for c in allreduce_cases(size):
        send = values(c["name"], rank, c["dtype"], c["count"], c["op"])
        recv = None if c["inplace"] else np.full_like(send, 0)
        h = kolo.allreduce_async(send, recv, name=c["name"], op=c["op"], prescale=c["pre"],
                                 postscale=c["post"])
        pending.append((c, send, recv, h))
    for c, send, recv, h in pending:
        res = h.wait()
        assert res is (send if c["inplace"] else recv)
        assert h.wait() is res and h.poll()  # waiting again gives the same result
        report_array("allreduce", c["name"], res)

    # -- unnamed allreduces (named "allreduce.noname.<n>" in issue order).
    for k in range(3):
        a = values(f"noname.{k}", rank, "float64", 5)
        kolo.allreduce_async(a, op="sum").wait()
        report_array("noname", f"noname.{k}", a)

    # -- grouped allreduce.
    for gname, dt, op, pre, post in (("grp.f32", "float32", "average", 1.0, 1.0),
                                     ("grp.i32", "int32", "sum", 0.5, 3.0)):
        ins = [values(f"{gname}.{i}", rank, dt, n) for i, n in enumerate((5, 17, 1))]
        outs = [np.zeros_like(a) for a in ins] if dt == "int32" else None
        res = kolo.grouped_allreduce_async(ins, outs, name=gname, op=op, prescale=pre,
                                           postscale=post).wait()
        for i, a in enumerate(res):
            report_array("grouped", f"{gname}.{i}", a)

    # -- allgather, counts differing by rank (rank 0 sends nothing in one).
    for kind in ("float64", "int8"):
        send = values(f"ag.{kind}", rank, kind, allgather_count(rank, kind))
        res, counts = kolo.allgather_async(send, lambda n, k=kind: np.empty(n, k),
                                           name=f"ag.{kind}").wait()
        report_array("allgather", f"ag.{kind}", res, counts=counts)

    # -- broadcast from every root; the others start from garbage.
    for root in range(size):
        for dt in ("int64", "bool"):
            name = f"bc.{dt}.{root}"
            buf = values(name, root, dt, 9) if rank == root else np.zeros(9, dt)
            if rank != root and dt == "int64":
                buf[:] = -1
            res = kolo.broadcast_async(buf, root, name=name).wait()
            assert res is buf
            report_array("broadcast", name, buf)

    # -- alltoall, equal parts and explicit splits.
    send = values("a2a.equal", rank, "float32", 3 * size)
    res, counts = kolo.alltoall_async(send, lambda n: np.empty(n, np.float32),
                                      name="a2a.equal").wait()
    report_array("alltoall", "a2a.equal", res, counts=counts)
    splits = alltoall_splits(rank, size)
    send = values("a2a.splits", rank, "int32", sum(splits))
    res, counts = kolo.alltoall_async(send, lambda n: np.empty(n, np.int32), splits=splits,
                                      name="a2a.splits").wait()
    report_array("alltoall", "a2a.splits", res, counts=counts)

    # -- reducescatter of a count that does not divide by the size.
    for name, dt, op, pre, post in (("rs.f64.sum", "float64", "sum", 1.0, 1.0),
                                    ("rs.i32.avg", "int32", "average", 1.0, 1.0),
                                    ("rs.f32.scaled", "float32", "sum", 0.5, 3.0)):
        send = values(name, rank, dt, 10)
        recv = np.zeros(kolo.reducescatter_count(10, size, rank), dt)
        res = kolo.reducescatter_async(send, recv, name=name, op=op, prescale=pre,
                                       postscale=post).wait()
        assert res is recv
        report_array("reducescatter", name, recv)

    # -- barrier: nobody leaves before everybody has arrived (the ranks
    # arrive 0.1 s apart).
    time.sleep(0.1 * rank)
    arrived = time.time()
    kolo.barrier()
    report({"section": "barrier", "arrived": arrived, "left": time.time()})

    # -- join: rank r has r + 1 allreduces; ranks that ran out contribute zeros.
    for k in range(rank + 1):
        for op in ("sum", "average"):
            a = values(f"join.{k}.{op}", rank, "int32", 5)
            kolo.allreduce_async(a, name=f"join.{k}.{op}", op=op).wait()
            report_array("join", f"join.{k}.{op}", a)
    last = kolo.join()
    report({"section": "joined", "last": last})

    # -- mismatches fail on every rank, and the job goes on.
    if size > 1:
        expect_error("mismatch.count", lambda: kolo.allreduce_async(
            np.ones(5 if rank == 0 else 6, np.float32), name="mm.count").wait())
        expect_error("mismatch.dtype", lambda: kolo.allreduce_async(
            np.ones(4, np.float32 if rank == 0 else np.float64), name="mm.dtype").wait())
        expect_error("mismatch.root", lambda: kolo.broadcast_async(
            np.ones(4, np.int32), 0 if rank == 0 else 1, name="mm.root").wait())
        a = values("after.mismatch", rank, "float64", 3)
        kolo.allreduce_async(a, name="after.mismatch").wait()
        report_array("after", "after.mismatch", a)

    # -- bad arguments, on rank 0 only and unnamed: each must raise before
    # anything is enqueued (and before a name is used up).
    if rank == 0:
        ro = np.zeros(4, np.float32)
        ro.setflags(write=False)
        f4 = np.zeros(8, np.float32)
        bad = {
            "non-contiguous": lambda: kolo.allreduce_async(np.zeros(10, np.float32)[::2]),
            "non-contiguous-2d": lambda: kolo.allreduce_async(np.zeros((4, 4)).T),
            "int16": lambda: kolo.allreduce_async(np.zeros(4, np.int16)),
            "big-endian": lambda: kolo.allreduce_async(np.zeros(4, ">f4")),
            "list": lambda: kolo.allreduce_async([1.0, 2.0]),
            "read-only": lambda: kolo.allreduce_async(ro),
            "bool-sum": lambda: kolo.allreduce_async(np.zeros(4, bool), op="sum"),
            "unknown-op": lambda: kolo.allreduce_async(f4, op="median"),
            "recv-size": lambda: kolo.allreduce_async(f4, np.zeros(7, np.float32)),
            "recv-dtype": lambda: kolo.allreduce_async(f4, np.zeros(8, np.float64)),
            "nan-prescale": lambda: kolo.allreduce_async(f4, prescale=float("nan")),
            "inf-postscale": lambda: kolo.allreduce_async(f4, postscale=float("inf")),
            "grouped-nan": lambda: kolo.grouped_allreduce_async([f4], postscale=float("nan")),
            "grouped-dtypes": lambda: kolo.grouped_allreduce_async(
                [f4, np.zeros(2, np.float64)]),
            "grouped-empty": lambda: kolo.grouped_allreduce_async([]),
            "root-too-big": lambda: kolo.broadcast_async(f4, size),
            "root-negative": lambda: kolo.broadcast_async(f4, -1),
            "root-float": lambda: kolo.broadcast_async(f4, 0.0),
            "splits-length": lambda: kolo.alltoall_async(
                f4, lambda n: np.empty(n, np.float32), splits=[8] + [0] * size),
            "splits-negative": lambda: kolo.alltoall_async(
                f4, lambda n: np.empty(n, np.float32), splits=[-1, 9] + [0] * (size - 2)
                if size > 1 else [-1]),
            "splits-sum": lambda: kolo.alltoall_async(
                f4, lambda n: np.empty(n, np.float32), splits=[1] * size),
            "rs-recv-count": lambda: kolo.reducescatter_async(
                f4, np.zeros(kolo.reducescatter_count(8, size, rank) + 1, np.float32)),
            "rs-nan": lambda: kolo.reducescatter_async(
                f4, np.zeros(kolo.reducescatter_count(8, size, rank), np.float32),
                prescale=float("nan")),
            "empty-name": lambda: kolo.allreduce_async(f4, name=""),
        }
        if size > 1:
            bad["alltoall-indivisible"] = lambda: kolo.alltoall_async(
                np.zeros(size + 1, np.float32), lambda n: np.empty(n, np.float32))
        for label, fn in bad.items():
            expect_error(label, fn)

    # Every rank: the next unnamed allreduce, with a deadline instead of a hang.
    a = values("after.bad", rank, "float64", 4)
    h = kolo.allreduce_async(a, op="sum")
    deadline = time.monotonic() + 20
    while not h.poll():
        if time.monotonic() > deadline:
            report({"section": "stalled", "name": "after.bad"})
            kolo.abort()
            raise SystemExit(3)
        time.sleep(0.005)
    h.wait()
    report_array("after", "after.bad", a)

    kolo.barrier()
    report({"section": "done"})
    kolo.finalize()
    kolo.finalize()  # twice is fine
    assert not kolo.is_initialized()


if __name__ == "__main__":
    main()
