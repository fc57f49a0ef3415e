"""monitored_barrier and init_process_group(device_id=...) on backend kolo
(workers/c10d_monitored.py, 3 ranks under kolorun).

monitored_barrier runs on a kolo group and on a gloo group of the same
ranks: both pass when every rank calls it; when the last rank does not,
rank 0 of both names it, and kolo's other ranks name it too (gloo's point to
rank 0's log); with wait_all_ranks every absent rank is named, as gloo
names them; a rank that calls it late learns that its barrier failed, and
the next barrier passes. device_id: torch is shown an accelerator, kolo's
group is bound to the device and serves it, and the collectives, a barrier
and a subgroup work."""

import re

import pytest

from conftest import requires_torch, results, run_worker

pytestmark = requires_torch
ENV = {"GLOO_SOCKET_IFNAME": "lo", "KOLO_LOG_LEVEL": "warn"}
SIZE, SHORT_S = 3, 1.5


@pytest.fixture(scope="module")
def monitored():
    proc = run_worker(SIZE, "c10d_monitored.py", env=ENV, timeout=180)
    res = results(proc)
    assert sorted(res) == list(range(SIZE)), proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {}
    for rank, items in res.items():
        for o in items:
            if "backend" in o:
                out.setdefault((o["case"], o["backend"]), {}).setdefault(rank, []).append(o)
    return out


def named(error):
    """The rank numbers an error names after 'rank(s)'."""
    m = re.search(r"[Rr]anks? ((?:\d+(?:, )?)+)", error.split("]", 1)[-1])
    return sorted(int(x) for x in m.group(1).split(", ")) if m else []


@pytest.mark.parametrize("backend", ["kolo", "gloo"])
def test_passes_when_every_rank_calls_it(monitored, backend):
    got = monitored[("pass", backend)]
    assert sorted(got) == list(range(SIZE))
    assert all(o[0]["error"] is None for o in got.values()), got


def test_absent_rank_named_by_rank_0_as_gloo_names_it(monitored):
    last = SIZE - 1
    for backend in ("kolo", "gloo"):
        got = monitored[("skip", backend)]
        assert sorted(got) == list(range(last)), got  # the last rank did not call it
        err0 = got[0][0]["error"]
        assert err0 and named(err0) == [last], (backend, err0)
        assert SHORT_S - 0.05 <= got[0][0]["elapsed"] < SHORT_S + 2.0, got[0]
        for r in range(1, last):
            assert got[r][0]["error"], (backend, r, got[r])
    for r in range(1, last):  # kolo's other ranks name the culprit too
        o = monitored[("skip", "kolo")][r][0]
        assert "as rank 0 found" in o["error"] and named(o["error"]) == [last], o
        assert o["elapsed"] < SHORT_S + 2.0, o


def test_late_rank_learns_its_barrier_failed_and_the_next_passes(monitored):
    got = monitored[("late", "kolo")]
    late = got[SIZE - 1]
    assert [o["step"] for o in late] == [0, 1]
    assert "this rank did not reach barrier 1" in late[0]["error"], late
    assert all(got[r][-1]["step"] == 1 and got[r][-1]["error"] is None for r in got), got


def test_wait_all_ranks_names_every_absent_rank(monitored):
    for backend in ("kolo", "gloo"):
        got = monitored[("wait_all", backend)]
        assert sorted(got) == [0]
        assert named(got[0][0]["error"]) == list(range(1, SIZE)), (backend, got)


def test_device_id_binds_the_group_and_its_collectives_work():
    proc = run_worker(SIZE, "c10d_monitored.py", "--device-id", env=ENV, timeout=120)
    res = results(proc)
    assert sorted(res) == list(range(SIZE)), proc.stdout[-3000:] + proc.stderr[-3000:]
    want = [float(sum(range(1, SIZE + 1)))] * 4
    for rank, (o,) in res.items():
        assert o["bound"] == "cuda:0" and o["backend_of_cuda"] == "ProcessGroupKolo", o
        assert o["sum"] == want and o["sub_sum"] == [float(sum(range(SIZE)))] * 2, o
