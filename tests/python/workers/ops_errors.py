"""kolo.torch's refusals and mismatch errors, and that the job goes on
after each of them.

Run with a short KOLO_STALL_CHECK_SECONDS (the name-mismatch case is
detected by the stall inspector after that long). Each case reports {"case", "ok", "detail"}; the last report is
{"cases": n, "final": ...}.
"""

import re
import time

import numpy as np
import torch

torch.set_num_threads(1)

import kolo  # noqa: E402
import kolo.torch as hvd  # noqa: E402
from _common import Cases, report  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
CASES = Cases(limit=4)
run = CASES.run


def expect(exc, fn, *needles, every_rank=False):
    """None when fn() raises exc with every needle in its message (and, with
    every_rank, naming every rank: "rank 0: ...; ranks 1,2: ...")."""
    try:
        fn()
    except exc as e:
        msg = str(e)
        missing = [s for s in needles if s not in msg]
        if missing:
            return f"message {msg!r} lacks {missing}"
        named = {int(r) for m in re.findall(r"ranks? ([\d,]+)", msg) for r in m.split(",") if r}
        if every_rank and named != set(range(N)):
            return f"message {msg!r} names ranks {sorted(named)}, not all {N}"
        return None
    except Exception as e:
        return f"raised {type(e).__name__}: {e}, expected {exc.__name__}"
    return f"did not raise {exc.__name__}"


def sum_check(name=None):
    """An allreduce every rank makes: the job still works and, for unnamed
    ops, the ranks' name counters still agree."""
    x = torch.full((4,), float(R + 1))
    out = hvd.allreduce(x, name=name, op=hvd.Sum)
    want = N * (N + 1) / 2
    return None if torch.all(out == want) else f"follow-up allreduce gave {out.tolist()}"


def mismatch(fn, *needles):
    """fn() must raise kolo.MismatchError naming every rank; then the job
    goes on."""
    t0 = time.monotonic()
    d = expect(kolo.MismatchError, fn, *needles, every_rank=True)
    took = time.monotonic() - t0
    if d is None and took > 30:
        d = f"took {took:.1f} s"
    return d or sum_check()


# ---- mismatches between ranks: an error on every rank, naming the ranks -----

run("mismatch/allreduce_shape",
    lambda: mismatch(lambda: hvd.allreduce(torch.ones(3 + R), name="mm.shape")))
run("mismatch/allreduce_dtype",
    lambda: mismatch(lambda: hvd.allreduce(
        torch.ones(3, dtype=torch.float32 if R == 0 else torch.float64), name="mm.dtype")))
run("mismatch/allreduce_op",
    lambda: mismatch(lambda: hvd.allreduce(torch.ones(3), name="mm.op",
                                           op=hvd.Sum if R == 0 else hvd.Max)))
run("mismatch/broadcast_root",
    lambda: mismatch(lambda: hvd.broadcast(torch.ones(3), R, name="mm.root")))
run("mismatch/allgather_trailing_dims",
    lambda: mismatch(lambda: hvd.allgather(torch.ones(2, 3 + R), name="mm.gather"),
                     "first dimension"))
run("mismatch/alltoall_trailing_dims",
    lambda: mismatch(lambda: hvd.alltoall(torch.ones(N, 1 + R), name="mm.a2a"),
                     "first dimension"))
run("mismatch/reducescatter_shape",
    lambda: mismatch(lambda: hvd.reducescatter(torch.ones(N + R, 2), name="mm.rs")))


def name_mismatch():
    # Each rank waits for a name the others never submit: nobody can
    # progress, so the stall inspector fails it on every rank with a
    # MismatchError naming the ranks (KOLO_STALL_SHUTDOWN_SECONDS is unset).
    t0 = time.monotonic()
    d = expect(kolo.MismatchError, lambda: hvd.allreduce(torch.ones(2), name=f"mm.name.{R}"),
               "disagree about operation names", every_rank=True)
    took = time.monotonic() - t0
    if d is None and took > 60:
        d = f"took {took:.1f} s"
    return d or sum_check("after-stall")


run("mismatch/name", name_mismatch)


# ---- refused before anything is enqueued ----------------------------------------

def not_contiguous():
    x = torch.ones(3, 4).t()
    d = expect(ValueError, lambda: hvd.allreduce(x, name="weight.T"), "weight.T",
               "not contiguous")
    if d:
        return d
    for what, fn in [
        ("allreduce unnamed", lambda: hvd.allreduce(x)),
        ("allreduce_async_", lambda: hvd.allreduce_async_(x)),
        ("grouped_allreduce", lambda: hvd.grouped_allreduce([torch.ones(2), x])),
        ("allgather", lambda: hvd.allgather(x)),
        ("grouped_allgather", lambda: hvd.grouped_allgather([torch.ones(2), x])),
        ("broadcast_", lambda: hvd.broadcast_(x, 0)),
        ("alltoall", lambda: hvd.alltoall(torch.ones(N, 2, 3).transpose(1, 2))),
        ("reducescatter", lambda: hvd.reducescatter(torch.ones(3, N).t())),
        ("grouped_reducescatter", lambda: hvd.grouped_reducescatter([x])),
    ]:
        d = expect(ValueError, fn, "not contiguous")
        if d:
            return f"{what}: {d}"
    # Nothing was enqueued or named: unnamed ops still match across ranks.
    return sum_check()


run("refused/not_contiguous", not_contiguous)


def not_contiguous_one_rank():
    # Only rank 0 makes the mistake; its counter of unnamed broadcasts must
    # not move, or the next unnamed broadcast would never match.
    if R == 0:
        d = expect(ValueError, lambda: hvd.broadcast(torch.ones(2, 3).t(), 0), "not contiguous")
        if d:
            return d
    x = torch.full((3,), float(R))
    out = hvd.broadcast(x, N - 1)
    return None if torch.all(out == N - 1) else f"unnamed broadcast gave {out.tolist()}"


run("refused/not_contiguous_on_one_rank", not_contiguous_one_rank)


def bad_types():
    for what, fn, needle in [
        ("int16", lambda: hvd.allreduce(torch.ones(3, dtype=torch.int16)), "int16"),
        ("complex64", lambda: hvd.allgather(torch.ones(3, dtype=torch.complex64)), "complex"),
        ("meta device", lambda: hvd.broadcast(torch.empty(3, device="meta"), 0), "CPU"),
        ("sparse", lambda: hvd.allreduce(torch.eye(3).to_sparse()), "dense"),
        ("bool sum", lambda: hvd.allreduce(torch.ones(3, dtype=torch.bool), op=hvd.Sum),
         "bool"),
        ("numpy", lambda: hvd.allreduce(np.ones(3)), "torch.Tensor"),
    ]:
        d = expect(TypeError, fn, needle)
        if d:
            return f"{what}: {d}"
    return sum_check()


run("refused/types", bad_types)


def bad_arguments():
    for what, fn, exc, needle in [
        ("Adasum of integers",
         lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum), TypeError,
         "adasum"),
        ("Adasum reducescatter", lambda: hvd.reducescatter(torch.ones(4, 2), op=hvd.Adasum),
         ValueError, "Adasum"),
        ("op and average", lambda: hvd.allreduce(torch.ones(3), average=True, op=hvd.Sum),
         ValueError, "supersedes"),
        ("unknown op", lambda: hvd.allreduce(torch.ones(3), op=17), ValueError, "op"),
        ("scalar allgather", lambda: hvd.allgather(torch.tensor(1.0)), ValueError, "0-d"),
        ("splits length", lambda: hvd.alltoall(torch.ones(4, 2), splits=[4] + [0] * N),
         ValueError, "splits"),
        ("splits sum", lambda: hvd.alltoall(torch.ones(4, 2), splits=[5] + [0] * (N - 1)),
         ValueError, "splits"),
        ("unequal rows", lambda: hvd.alltoall(torch.ones(N + 1, 2)), ValueError, "splits"),
        ("root out of range", lambda: hvd.broadcast(torch.ones(3), N), ValueError, "root"),
        ("infinite prescale",
         lambda: hvd.allreduce(torch.ones(3), prescale_factor=float("inf")), ValueError,
         "finite"),
        ("empty group", lambda: hvd.grouped_allreduce([]), ValueError, "empty"),
        ("process set not added",
         lambda: hvd.allreduce(torch.ones(3), process_set=hvd.ProcessSet([0])), ValueError,
         "has not been added"),
        ("process set barrier", lambda: hvd.barrier(hvd.ProcessSet([0])), ValueError,
         "has not been added"),
        ("process set type", lambda: hvd.allreduce(torch.ones(3), process_set=[0]), TypeError,
         "ProcessSet"),
        ("init process_sets", lambda: hvd.init(process_sets="static"), ValueError,
         "process_sets"),
        ("poll unknown", lambda: hvd.poll(10 ** 9), ValueError, "handle"),
    ]:
        d = expect(exc, fn, needle)
        if d:
            return f"{what}: {d}"
    return sum_check()


run("refused/arguments", bad_arguments)


def answers():
    flags = [hvd.mpi_built(), hvd.mpi_enabled(), hvd.gloo_built(), hvd.gloo_enabled(),
             hvd.nccl_built(), hvd.ddl_built(), hvd.ccl_built(), hvd.rocm_built(),
             hvd.mpi_threads_supported()]
    if any(flags):
        return f"build flags {flags}"
    # True exactly when the libkolo has the CUDA data path (kolo_cuda_set_stream).
    if hvd.cuda_built() is not kolo.cuda_supported() or kolo.cuda_supported() != hasattr(
            kolo._lib.library(), "kolo_cuda_set_stream"):
        return f"cuda_built {hvd.cuda_built()}, cuda_supported {kolo.cuda_supported()}"
    if (hvd.rank(), hvd.size()) != (kolo.rank(), kolo.size()) or not hvd.is_initialized():
        return "rank/size/is_initialized disagree with kolo"
    if hvd.local_size() * hvd.cross_size() != N or not 0 <= hvd.local_rank() < N:
        return f"local {hvd.local_rank()}/{hvd.local_size()} cross {hvd.cross_size()}"
    ps = hvd.global_process_set
    if ps.size() != N or ps.rank() != R or not ps.included() or ps.ranks != list(range(N)):
        return f"global_process_set: {ps}, size {ps.size()}, rank {ps.rank()}"
    if hvd.remove_process_set(ps) is not False:
        return "remove_process_set(global) is not False"
    if [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product] != list(range(6)):
        return "op values differ from Horovod's"
    hvd.init()  # again: nothing happens
    hvd.init(comm=list(range(N)), process_sets=[hvd.global_process_set])
    return sum_check()


run("answers", answers)


def timeline():
    import os
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), f"timeline.{R}.json")
    hvd.start_timeline(path)
    d = sum_check("timeline-op")
    hvd.stop_timeline()
    if d:
        return d
    # Rank 0 writes the timeline (as Horovod's); the others accept the calls.
    if R == 0 and (not os.path.exists(path) or os.path.getsize(path) == 0):
        return f"no timeline at {path}"
    return None


run("timeline", timeline)

report({"cases": CASES.count, "final": sum_check("final")})
hvd.shutdown()
if hvd.is_initialized():
    raise SystemExit("still initialized after shutdown()")
