"""Backend "kolo" under what torch 2.x builds on a process group: group
names, DeviceMesh, functional collectives (DTensor's path), FSDP2
(fully_shard), ZeroRedundancyOptimizer and destroy_process_group(group).

One run of workers/ddp_torch2.py per world size computes everything on kolo
and on gloo in the same processes; each test compares the two, and with a
reference computed here: float64 for the collectives, single-process
training on the ranks' concatenated batches for FSDP2 and ZeRO."""

import sys

import pytest

from conftest import WORKERS, requires_torch, results, run_worker

pytestmark = requires_torch
ENV = {"GLOO_SOCKET_IFNAME": "lo", "KOLO_LOG_LEVEL": "warn"}
if str(WORKERS) not in sys.path:
    sys.path.insert(0, str(WORKERS))

SIZES = [2, 4]


@pytest.fixture(scope="module", params=SIZES)
def run(request):
    size = request.param
    proc = run_worker(size, "ddp_torch2.py", env=ENV, timeout=300)
    res = results(proc)
    assert sorted(res) == list(range(size)), proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for rank, items in res.items():
        for item in items:
            key = (item["case"], item.get("backend"))
            out.setdefault(key, {})[rank] = item
    return size, out


def test_groups_have_names_and_descriptions(run):
    size, out = run
    names = out[("names", None)]
    first = names[0]
    assert all(n == {**first} for n in names.values()), names  # the same on every rank
    assert first["world"] and first["sub"] and first["gloo"]
    assert len({first["world"], first["sub"], first["gloo"]}) == 3
    assert first["desc"] == "default_pg"
    assert first["sub_backend"] == "kolo"
    mesh = out[("mesh", None)]
    for m in mesh.values():
        assert m["mesh_backend"] == "kolo" and m["group_name"] == m["world"] == first["world"]


def _functional_reference(size, rank):
    import torch
    import ddp_torch2 as W
    xs = [W.fc_input(q) for q in range(size)]
    chunk = W.N // size
    return {
        "all_reduce": torch.stack(xs).sum(0).tolist(),
        "all_reduce_max": torch.stack(xs).max(0).values.tolist(),
        "broadcast": xs[size - 1].tolist(),
        "all_to_all_single": torch.cat([x[rank * chunk:(rank + 1) * chunk] for x in xs]).tolist(),
        "all_reduce_coalesced": torch.cat([torch.stack(xs).sum(0),
                                           torch.stack([W.fc_input(q, 1) for q in range(size)])
                                           .sum(0)]).tolist(),
    }


def test_functional_collectives_match_gloo_and_float64(run):
    size, out = run
    for rank in range(size):
        ref = _functional_reference(size, rank)
        for backend in ("kolo", "gloo"):
            got = out[("functional", backend)][rank]
            for k, v in ref.items():
                assert got[k] == pytest.approx(v, abs=1e-12), (backend, rank, k)


def _train_reference(kind, size):
    """Parameters after each step of single-process training on the ranks'
    concatenated batches (the mean loss over all of them)."""
    import torch
    import ddp_torch2 as W
    m = W.model()
    if kind == "fsdp2":
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
    params = []
    for s in range(W.STEPS):
        xs, ys = zip(*[W.batch(s, r) for r in range(size)])
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
        params.append(W.full_params(m))
    return params


def p2p_value(src, dst, k=0):
    """What workers/ddp_torch2.py's p2p() sends from src to dst."""
    return [float(i + 100 * src + 10 * dst + k) for i in range(5)]


def test_point_to_point_matches_gloo_and_the_values_sent(run):
    size, out = run
    kolo, gloo = out[("p2p", "kolo")], out[("p2p", "gloo")]
    for rank in range(size):
        k, g = ({x: v for x, v in d[rank].items() if x != "backend"} for d in (kolo, gloo))
        assert k == g, (rank, k, g)
        prv = (rank - 1) % size
        assert kolo[rank]["ring"] == p2p_value(prv, rank)
        assert kolo[rank]["dtypes"] == [[i * (prv + 1) for i in range(7)], [prv + 0.5] * 3]
    assert kolo[1]["tags"] == [p2p_value(0, 1, 5), p2p_value(0, 1, 6)]
    assert kolo[0]["any"] == [[r, p2p_value(r, 0)] for r in range(1, size)]


@pytest.mark.parametrize("kind", ["fsdp2", "zero"])
def test_training_matches_gloo_and_single_process(run, kind):
    size, out = run
    ref = _train_reference(kind, size)
    for rank in range(size):
        k = out[(kind, "kolo")][rank]["params"]
        g = out[(kind, "gloo")][rank]["params"]
        assert len(k) == len(g) == len(ref)
        for step, (kp, gp, rp) in enumerate(zip(k, g, ref)):
            assert kp == pytest.approx(gp, abs=1e-6), (kind, rank, step, "kolo vs gloo")
            assert kp == pytest.approx(rp, abs=1e-5), (kind, rank, step, "kolo vs reference")


def test_destroying_a_group_stops_it_and_leaves_the_world(run):
    size, out = run
    for rank, d in out[("destroy_group", None)].items():
        assert d["sum"] == [float(sum(range(1, size + 1)))] * 3
        assert d["after"] != "no error" and "not initialized" in d["after"], d["after"]
        assert d["world_sum"] == [float(sum(range(size)))] * 2
        assert d["thread_alive"] is False
    assert sorted(out[("done", None)]) == list(range(size))
