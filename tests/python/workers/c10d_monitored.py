"""Worker of test_c10d_monitored.py (run by kolorun): monitored_barrier on
kolo and on gloo groups of the same ranks; with --device-id,
init_process_group's device_id.

With --device-id torch is made to see an accelerator (torch.accelerator
reports "cuda" with 8 devices) so that init_process_group("kolo",
device_id=cuda:0) passes torch's checks on a CPU-only machine; the
collectives use CPU tensors, on kolo only (a gloo group would inherit the
bound device and allocate on it).

Cases, each on a fresh group (gloo's state after a failed monitored_barrier
is its own), every rank reporting {"case", "backend", "step", "error",
"elapsed"}:
  pass      every rank calls it;
  skip      the last rank does not call it (timeout SHORT);
  late      (kolo) after skip, the last rank calls it late, then again with
            every other rank: the late call fails naming this rank, the next
            passes;
  wait_all  only rank 0 calls it, with wait_all_ranks=True."""

import datetime
import sys
import time

import torch

if "--device-id" in sys.argv:
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cuda")
    torch.accelerator.device_count = lambda: 8

import torch.distributed as dist  # noqa: E402

import kolo.torch.distributed  # noqa: E402,F401 - registers backend "kolo"
from _common import report  # noqa: E402

SHORT = datetime.timedelta(seconds=1.5)
LONG = datetime.timedelta(seconds=20)


def attempt(case, backend, step, fn):
    t0 = time.monotonic()
    try:
        fn()
        error = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        error = f"{type(e).__name__}: {e}"
    report({"case": case, "backend": backend, "step": step, "error": error,
            "elapsed": time.monotonic() - t0, "rank": dist.get_rank()})


def cases(backend, rank, size, sync):
    def group():
        return dist.new_group(backend=backend)

    g = group()
    attempt("pass", backend, 0, lambda: dist.monitored_barrier(g, timeout=LONG))
    sync()
    g = group()
    if rank != size - 1:
        attempt("skip", backend, 0, lambda: dist.monitored_barrier(g, timeout=SHORT))
    sync()
    if backend == "kolo":
        if rank == size - 1:
            attempt("late", backend, 0, lambda: dist.monitored_barrier(g, timeout=LONG))
        attempt("late", backend, 1, lambda: dist.monitored_barrier(g, timeout=LONG))
        sync()
    g = group()
    if rank == 0:
        attempt("wait_all", backend, 0,
                lambda: dist.monitored_barrier(g, timeout=SHORT, wait_all_ranks=True))
    sync()


def device_id():
    dist.init_process_group("kolo", init_method="kolo://", device_id=torch.device("cuda", 0))
    rank, world = dist.get_rank(), dist.group.WORLD
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    dist.barrier()  # torch passes the bound device to the barrier
    sub = dist.new_group()
    y = torch.full((2,), float(rank))
    dist.all_reduce(y, group=sub)
    report({"case": "device_id", "rank": rank, "bound": str(world.bound_device_id),
            "sub_bound": str(sub.bound_device_id), "sum": x.tolist(), "sub_sum": y.tolist(),
            "backend_of_cuda": type(world._get_backend(torch.device("cuda", 0))).__name__})
    dist.destroy_process_group()
    return 0


def main():
    if "--device-id" in sys.argv:
        return device_id()
    dist.init_process_group("kolo", init_method="kolo://")
    rank, size = dist.get_rank(), dist.get_world_size()
    sync_group = dist.new_group(backend="gloo")

    def sync():
        dist.barrier(group=sync_group)

    for backend in ("kolo", "gloo"):
        cases(backend, rank, size, sync)
    dist.destroy_process_group()
    report({"case": "done", "rank": rank, "size": size})
    return 0


if __name__ == "__main__":
    sys.exit(main())
