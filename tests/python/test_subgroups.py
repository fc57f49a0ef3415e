"""Subgroups on backend "kolo": new_group with disjoint and overlapping
ranks, new_subgroups, and FSDP2 hybrid sharding on a 2 x 2 DeviceMesh
(workers/ddp_subgroups.py, 4 ranks). Each computation runs on kolo and on
gloo subgroups of the same ranks; the test compares them with each other,
with values computed here, and HSDP with single-process training on the
ranks' concatenated batches."""

import sys

import pytest

from conftest import WORKERS, requires_torch, results, run_worker
from test_ddp_torch2 import _train_reference

pytestmark = requires_torch
ENV = {"GLOO_SOCKET_IFNAME": "lo", "KOLO_LOG_LEVEL": "warn"}
if str(WORKERS) not in sys.path:
    sys.path.insert(0, str(WORKERS))
SIZE = 4


@pytest.fixture(scope="module")
def out():
    proc = run_worker(SIZE, "ddp_subgroups.py", env=ENV, timeout=300)
    res = results(proc)
    assert sorted(res) == list(range(SIZE)), proc.stdout[-3000:] + proc.stderr[-3000:]
    got = {}
    for rank, items in res.items():
        for item in items:
            got.setdefault((item["case"], item.get("backend")), {})[rank] = item
    assert len(got[("done", None)]) == SIZE
    return got


def test_new_group_and_new_subgroups_match_gloo_and_the_values(out):
    for rank in range(SIZE):
        k, g = out[("groups", "kolo")][rank], out[("groups", "gloo")][rank]
        assert {x: v for x, v in k.items() if x != "backend"} == \
            {x: v for x, v in g.items() if x != "backend"}, (rank, k, g)
        members = [r for r in range(SIZE) if r % 2 == rank % 2]
        assert k["parity"] == [i * sum(r + 1 for r in members) for i in range(5)]
        assert k["first3"] == ([float(SIZE - 1)] * 3 if rank < SIZE - 1 else [rank + 1.0] * 3)
        pair = [(rank // 2) * 2, (rank // 2) * 2 + 1]
        assert k["bcast"] == [10.0 * pair[1]] * 2
        assert k["gather"] == [float(r) for r in pair]


def test_hsdp_on_a_2x2_mesh_matches_gloo_and_single_process(out):
    ref = _train_reference("fsdp2", SIZE)
    for rank in range(SIZE):
        k, g = out[("hsdp", "kolo")][rank], out[("hsdp", "gloo")][rank]
        assert k["backends"] == ["kolo", "kolo"] and g["backends"] == ["gloo", "gloo"]
        assert len(k["params"]) == len(g["params"]) == len(ref)
        for step, (kp, gp, rp) in enumerate(zip(k["params"], g["params"], ref)):
            assert kp == pytest.approx(gp, abs=1e-6), (rank, step, "kolo vs gloo")
            assert kp == pytest.approx(rp, abs=1e-5), (rank, step, "kolo vs reference")
        assert k["losses"] == pytest.approx(g["losses"], abs=1e-6)
