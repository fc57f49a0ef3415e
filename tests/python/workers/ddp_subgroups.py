"""Subgroups on backend "kolo" (run by test_subgroups.py on 4 ranks):
new_group with disjoint and overlapping rank lists, new_subgroups, and FSDP2
hybrid sharding (HSDP) on a 2 x 2 DeviceMesh (replicate x shard).

Everything runs twice in the same processes: on kolo subgroups and on gloo
subgroups of the same ranks (backend="gloo", backend_override). The test
compares the two with each other and with single-process training."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import kolo.torch.distributed  # noqa: F401 - registers backend "kolo"
from _common import report
from ddp_torch2 import fsdp2

torch.set_num_threads(1)


def groups(backend, rank, size):
    """all_reduce on [0, 2] and [1, 3] at once (disjoint), on [0, 1, 2]
    (overlapping, rank 3 outside) and on new_subgroups' group of 2."""
    even = dist.new_group([r for r in range(size) if r % 2 == 0], backend=backend)
    odd = dist.new_group([r for r in range(size) if r % 2], backend=backend)
    first3 = dist.new_group(list(range(size - 1)), backend=backend)
    mine, _ = dist.new_subgroups(group_size=2, backend=backend)
    out = {}
    x = torch.arange(5, dtype=torch.float64) * (rank + 1)
    w = dist.all_reduce(x, group=even if rank % 2 == 0 else odd, async_op=True)
    y = torch.full((3,), float(rank + 1), dtype=torch.float64)
    if rank < size - 1:
        dist.all_reduce(y, op=dist.ReduceOp.MAX, group=first3)
    w.wait()
    z = torch.full((2,), float(10 * rank), dtype=torch.float64)
    dist.broadcast(z, src=(rank // 2) * 2 + 1, group=mine)  # a global rank, as torch takes it
    g = [torch.zeros(1, dtype=torch.float64) for _ in range(2)]
    dist.all_gather(g, torch.full((1,), float(rank), dtype=torch.float64), group=mine)
    out.update(parity=x.tolist(), first3=y.tolist(), bcast=z.tolist(),
               gather=[t.item() for t in g])
    for pg in (even, odd, first3, mine):
        if pg != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(pg)
    return out


def hsdp(backend, rank):
    """ddp_torch2's FSDP2 training on a 2 x 2 mesh: fully_shard on a 2-D mesh
    is hybrid sharding (replicate over dimension 0, shard over 1)."""
    over = None if backend == "kolo" else {0: "gloo", 1: "gloo"}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"),
                            backend_override=over)
    return {**fsdp2(mesh, rank),
            "backends": [dist.get_backend(mesh.get_group(d)) for d in ("replicate", "shard")]}


def main():
    dist.init_process_group("kolo", init_method="kolo://")
    rank, size = dist.get_rank(), dist.get_world_size()
    for backend in ("kolo", "gloo"):
        report({"case": "groups", "backend": backend, "rank": rank,
                **groups(backend, rank, size)})
    for backend in ("kolo", "gloo"):
        report({"case": "hsdp", "backend": backend, "rank": rank, **hsdp(backend, rank)})
    dist.destroy_process_group()
    report({"case": "done", "rank": rank})
    return 0


if __name__ == "__main__":
    sys.exit(main())
