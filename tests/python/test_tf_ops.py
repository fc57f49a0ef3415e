"""kolo.tensorflow's collectives (Horovod's horovod.tensorflow API), eager
and inside tf.function, on 2 and 4 ranks.

tests/python/workers/tf_ops.py regenerates every rank's input from a seed,
computes each expected result in float64 numpy and reports a pass/fail line
per case; here every case must have run on every rank and passed. The API
test checks Horovod 0.28's names without starting a job.
"""

import importlib.util
import sys

import pytest

from conftest import REPO, check_cases, results, run_worker

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason=f"{sys.executable} has no tensorflow "
                                "(scripts/setup.sh installs tensorflow-cpu into .venv)")

if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

MUST = ["allreduce/bfloat16/product/graph", "allreduce/int8/average/eager",
        "allreduce/bool/max/graph", "allreduce_scaled/float64/graph", "allreduce/variable",
        "grouped_allreduce/graph", "allreduce/indexed_slices/graph", "compression/fp16",
        "compression/bf16", "allgather/bool/graph", "allgather/float16/eager",
        "grouped_allgather/graph", "broadcast/int64/graph", "broadcast_variables/graph",
        "alltoall/splits/graph", "alltoall/equal/eager", "reducescatter/sum/rows+1/graph",
        "reducescatter/average/rows+0/eager", "grouped_reducescatter",
        "grad/allreduce_sum/graph", "grad/allgather/eager", "grad/broadcast/graph",
        "grad/reducescatter/graph", "grad/alltoall/eager", "tape/eager", "tape/graph",
        "tape/predivide/graph", "tape/local_source", "graph/retrace",
        "errors/allgather_shape_mismatch", "errors/dtype", "errors/xla", "objects",
        "graph/topology_ops", "barrier_join", "sync_batch_norm/eager",
        "sync_batch_norm/graph"]


@pytest.mark.parametrize("np_", [2, 4])
def test_collectives(np_):
    """Every collective, dtype and mode against float64 references, the
    gradients, the tape against the concatenated batch, names, errors."""
    p = run_worker(np_, "tf_ops.py", "20261206", timeout=400,
                   env={"KOLO_STALL_SHUTDOWN_SECONDS": "30", "TF_CPP_MIN_LOG_LEVEL": "3"})
    names, _ = check_cases(p, np_, minimum=160)
    missing = [m for m in MUST if m not in names]
    assert not missing, f"cases not run: {missing}"


HOROVOD_TF = ["init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank",
              "local_rank", "cross_rank", "is_homogeneous", "rank_op", "local_rank_op",
              "size_op", "local_size_op", "process_set_included_op", "start_timeline",
              "stop_timeline", "mpi_threads_supported", "mpi_enabled", "mpi_built",
              "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
              "cuda_built", "rocm_built", "ProcessSet", "global_process_set",
              "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Min", "Max",
              "Product", "allreduce", "grouped_allreduce", "allgather", "grouped_allgather",
              "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter",
              "join", "barrier", "broadcast_variables", "broadcast_object",
              "broadcast_object_fn", "allgather_object", "DistributedGradientTape",
              "PartialDistributedGradientTape", "Compression", "SyncBatchNormalization",
              "elastic"]


def test_horovod_names():
    import kolo.tensorflow as hvd

    missing = [n for n in HOROVOD_TF if not hasattr(hvd, n)]
    assert not missing, f"kolo.tensorflow lacks Horovod's {missing}"


def test_worker_exception_ends_the_job_promptly():
    """A rank that raises while the others wait for it in an allreduce inside
    tf.function: the others fail at once and kolorun exits non-zero within
    seconds."""
    import time

    p = run_worker(3, "tf_raise.py", timeout=120, check=False,
                   env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    end = time.time()
    assert p.returncode != 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = results(p)
    assert "fails on purpose" in p.stdout + p.stderr
    raising = [x["raising"] for x in res.get(1, []) if "raising" in x]
    assert raising, f"rank 1 never got to raise:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert end - raising[0] < 20, f"kolorun took {end - raising[0]:.1f} s after rank 1 raised"
    for rank in (0, 2):
        assert not any("completed" in x for x in res.get(rank, [])), \
            f"rank {rank}'s allreduce completed without rank 1"
