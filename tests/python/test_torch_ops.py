"""kolo.torch's collectives (Horovod's horovod.torch API).

Multi-rank tests run workers under kolorun (tests/python/workers/ops_*.py):
each rank regenerates every rank's input from a seed, computes the expected
result in float64 numpy and reports one pass/fail line per case; the tests
here check that every case ran on every rank and passed. The API tests check
Horovod 0.28's names and argument lists without starting a job.
"""

import inspect
import sys
import time

import pytest

from conftest import REPO, check_cases, requires_torch, results, run_worker

pytestmark = requires_torch

# The in-process API tests import kolo from this checkout (without a job).
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "average", "min", "max", "product"]


def expected_cases():
    """Case names ops_collectives.py must report (a subset of what it runs)."""
    names = [f"allreduce/{d}/{o}" for d in DTYPES for o in OPS]
    names += ["allreduce/bool/min", "allreduce/bool/max"]
    names += [f"allreduce_scaled/{d}/{o}" for d in DTYPES[:4] for o in ("sum", "average")]
    names += [f"allgather/{d}" for d in DTYPES + ["bool"]]
    names += [f"broadcast/{d}" for d in DTYPES + ["bool"]]
    names += ["allreduce_fused_poll", "grouped_allgather", "grouped_allgather_async",
              "alltoall/float32/unsent_rows", "alltoall/int32/equal_split",
              "reducescatter/float32/sum/rows+1", "reducescatter/float32/average/rows+0",
              "reducescatter/float32/min/rows+1", "reducescatter/float32/average/scaled",
              "grouped_reducescatter", "grouped_reducescatter_async",
              "grad/allreduce/sum/scaled", "grad/allreduce/average", "grad/allgather",
              "grad/grouped_allgather", "grad/broadcast", "grad/alltoall",
              "grad/reducescatter/sum", "grad/reducescatter/average", "grad/grouped_allreduce",
              "compression/fp16/float32", "compression/bf16/float32",
              "compression/integers_unchanged", "sparse_allreduce_async", "join", "barrier"]
    names += [f"{f}/{d}/{o}" for f, d, o in [
        ("grouped_allreduce", "float32", "sum"), ("grouped_allreduce_", "float64", "average"),
        ("grouped_allreduce_async", "bfloat16", "max"),
        ("grouped_allreduce_async_", "int32", "sum")]]
    names += [f"alltoall/{d}" for d in ("float32", "int64", "bfloat16", "bool", "float64")]
    return names


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_collectives(np_):
    """Every collective, form and dtype; prescale/postscale; grouped ops;
    Horovod's backward rules; fp16/bf16 compression; sparse; join."""
    # A stall (ranks disagreeing on what to run) fails in 30 s, not at the timeout.
    p = run_worker(np_, "ops_collectives.py", "20240611", timeout=300,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30"})
    names, _ = check_cases(p, np_, minimum=120)
    missing = sorted(set(expected_cases()) - set(names))
    assert not missing, f"cases not run: {missing}"


@pytest.mark.parametrize("np_", [2, 3])
def test_refusals_and_mismatches(np_):
    """Mismatched shapes, dtypes, ops, roots and names fail on every rank
    with an error naming the ranks, without a hang; bad arguments are
    refused before anything is enqueued; the job goes on after each."""
    t0 = time.monotonic()
    p = run_worker(np_, "ops_errors.py", timeout=240,
                   env={"KOLO_STALL_CHECK_SECONDS": "2"})
    took = time.monotonic() - t0
    names, res = check_cases(p, np_, minimum=14)
    for rank, items in res.items():
        assert items[-1]["final"] is None, f"rank {rank}: {items[-1]['final']}"
    for want in ("mismatch/allreduce_shape", "mismatch/allgather_trailing_dims",
                 "mismatch/name", "refused/not_contiguous", "refused/not_contiguous_on_one_rank",
                 "refused/types", "refused/arguments"):
        assert want in names
    assert took < 120, f"the mismatch cases took {took:.1f} s"


def test_worker_exception_ends_the_job_promptly():
    """A rank that raises while the others wait for it in a collective: the
    others fail at once (no hang) and kolorun exits non-zero within
    seconds."""
    p = run_worker(3, "ops_raise.py", timeout=120, check=False)
    end = time.time()
    assert p.returncode != 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = results(p)
    assert "fails on purpose" in p.stdout + p.stderr
    raising = [x["raising"] for x in res.get(1, []) if "raising" in x]
    assert raising, f"rank 1 never got to raise:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    latency = end - raising[0]
    assert latency < 20, f"kolorun took {latency:.1f} s to end after rank 1 raised"
    for rank in (0, 2):
        assert not any("completed" in x for x in res.get(rank, [])), \
            f"rank {rank}'s allreduce completed without rank 1"


# ---- the API, without a job ---------------------------------------------------

# horovod/torch/__init__.py (0.28) exports these.
HOROVOD_NAMES = """
allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_ broadcast_async_
alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized
start_timeline stop_timeline size local_size cross_size rank local_rank cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built
ccl_built cuda_built rocm_built ProcessSet global_process_set add_process_set
remove_process_set Average Sum Adasum Min Max Product HorovodInternalError Compression
allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters
SyncBatchNorm DistributedOptimizer elastic
""".split()

PS = "process_set"
SIGNATURES = {
    "allreduce": ["tensor", "average", "name", "compression", "op", "prescale_factor",
                  "postscale_factor", PS],
    "allreduce_async": ["tensor", "average", "name", "op", "prescale_factor",
                        "postscale_factor", PS],
    "allreduce_": ["tensor", "average", "name", "op", "prescale_factor", "postscale_factor", PS],
    "allreduce_async_": ["tensor", "average", "name", "op", "prescale_factor",
                         "postscale_factor", PS],
    "grouped_allreduce": ["tensors", "average", "name", "compression", "op", "prescale_factor",
                          "postscale_factor", PS],
    "grouped_allreduce_async": ["tensors", "average", "name", "op", "prescale_factor",
                                "postscale_factor", PS],
    "grouped_allreduce_": ["tensors", "average", "name", "op", "prescale_factor",
                           "postscale_factor", PS],
    "grouped_allreduce_async_": ["tensors", "average", "name", "op", "prescale_factor",
                                 "postscale_factor", PS],
    "sparse_allreduce_async": ["tensor", "name", "op", PS],
    "allgather": ["tensor", "name", PS],
    "allgather_async": ["tensor", "name", PS],
    "grouped_allgather": ["tensors", "name", PS],
    "grouped_allgather_async": ["tensors", "name", PS],
    "broadcast": ["tensor", "root_rank", "name", PS],
    "broadcast_": ["tensor", "root_rank", "name", PS],
    "broadcast_async": ["tensor", "root_rank", "name", PS],
    "broadcast_async_": ["tensor", "root_rank", "name", PS],
    "alltoall": ["tensor", "splits", "name", PS],
    "alltoall_async": ["tensor", "splits", "name", PS],
    "reducescatter": ["tensor", "name", "compression", "op", PS, "prescale_factor",
                      "postscale_factor"],
    "reducescatter_async": ["tensor", "name", "op", PS, "prescale_factor", "postscale_factor"],
    "grouped_reducescatter": ["tensors", "name", "compression", "op", PS, "prescale_factor",
                              "postscale_factor"],
    "grouped_reducescatter_async": ["tensors", "name", "op", PS, "prescale_factor",
                                    "postscale_factor"],
    "join": ["device"],
    "barrier": [PS],
    "poll": ["handle"],
    "synchronize": ["handle"],
    "init": ["comm", "process_sets"],
    "start_timeline": ["file_path", "mark_cycles"],
    "broadcast_parameters": ["params", "root_rank"],
    "broadcast_optimizer_state": ["optimizer", "root_rank", "model"],
    "broadcast_object": ["obj", "root_rank", "name", PS],
    "allgather_object": ["obj", "name"],
}


def test_horovod_names_and_signatures():
    import kolo.torch as hvd

    missing = [n for n in HOROVOD_NAMES if not hasattr(hvd, n)]
    assert not missing, f"kolo.torch lacks Horovod's {missing}"
    for fn, params in SIGNATURES.items():
        got = list(inspect.signature(getattr(hvd, fn)).parameters)
        assert got == params, f"{fn}{tuple(got)}; Horovod's is {fn}{tuple(params)}"
    defaults = inspect.signature(hvd.reducescatter).parameters
    assert defaults["op"].default == hvd.Average
    assert inspect.signature(hvd.allreduce).parameters["op"].default is None
    assert inspect.signature(hvd.join).parameters["device"].default == -1
    assert [hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product] == list(range(6))


def test_compression_interface():
    import torch

    from kolo.torch import Compression

    x = torch.tensor([-3.0, -2.5, -1.25, 0.0, 0.375, 1.5, 3.0], dtype=torch.float64)
    third = torch.tensor([1 / 3], dtype=torch.float64)
    for c, wire, ulp in ((Compression.fp16, torch.float16, 2 ** -11),
                         (Compression.bf16, torch.bfloat16, 2 ** -8)):
        t, ctx = c.compress(x)
        assert t.dtype == wire and x.dtype == torch.float64  # the input is untouched
        back = c.decompress(t, ctx)
        assert back.dtype == torch.float64 and torch.equal(back, x)  # representable: exact
        err = (c.decompress(*c.compress(third)) - third).abs().item()
        assert 0 < err <= ulp * (1 / 3) * 2  # rounded to the wire dtype, once
        i = torch.arange(5, dtype=torch.int32)
        ti, ctxi = c.compress(i)
        assert ti is i and c.decompress(ti, ctxi) is ti
    t, ctx = Compression.none.compress(x)
    assert t is x and Compression.none.decompress(t, ctx) is x
