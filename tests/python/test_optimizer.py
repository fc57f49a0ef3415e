"""kolo.torch.DistributedOptimizer against single-process references.

One run of workers/opt_train.py per world size (2 and 4 ranks) trains every
case; each test below recomputes its case in this process without kolo
(single-process training on the ranks' concatenated batches, or the
equivalent loss where the ranks' graphs differ) and compares the final
parameters of every rank with it."""

import sys

import pytest

from conftest import REPO, WORKERS, requires_torch, results, run_worker

pytestmark = requires_torch

for _p in (str(REPO / "python"), str(WORKERS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

WORLDS = (2, 4)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda n: f"np{n}")
def run(request):
    n = request.param
    proc = run_worker(n, "opt_train.py", timeout=300)
    res = results(proc)
    assert sorted(res) == list(range(n)), proc.stdout[-3000:]
    cases = {}
    for rank, outs in res.items():
        for out in outs:
            assert out["size"] == n and out["rank"] == rank
            cases.setdefault(out["case"], {})[rank] = out
    return n, cases


# ---- single-process references ----------------------------------------------


def _concat(n, step, micro=0):
    import torch
    from opt_common import batch
    xs, ys = zip(*[batch(step, r, micro) for r in range(n)])
    return torch.cat(xs), torch.cat(ys)


def reference(case, n):
    """Final {name: [floats]} of ``case`` trained in one process as if on
    the n ranks' batches together; plus what the case needs to check."""
    import torch
    import opt_common as oc

    info = {}
    if case in ("fp16", "bf16"):
        m = oc.mlp()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
    elif case == "adam":
        m = oc.mlp()
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
    elif case == "sum":
        m = oc.mlp()
        opt = torch.optim.SGD(m.parameters(), lr=0.02)
    elif case in ("missing", "missing_groups"):
        m = oc.TwoHead()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    elif case in ("sparse_dense", "sparse"):
        m = oc.EmbNet(sparse=False)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
    else:
        m = oc.mlp()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    steps = 2 if case == "zero_grad_pending" else oc.STEPS
    norms = []
    for s in range(steps):
        opt.zero_grad()
        if case == "bpps2":
            # Horovod sums the passes' gradients (no division).
            for micro in range(2):
                x, y = _concat(n, s, micro)
                oc.loss_fn(m(x), y).backward()
        elif case in ("missing", "missing_groups"):
            loss = sum(oc.loss_fn(m(*[oc.batch(s, r)[0], oc.uses_b(r)]), oc.batch(s, r)[1])
                       for r in range(n)) / n
            loss.backward()
        elif case == "sum":
            sum(oc.loss_fn(m(oc.batch(s, r)[0]), oc.batch(s, r)[1]) for r in range(n)).backward()
        elif case == "join":
            # Joined ranks contribute zeros and the average divides by the
            # job's size: the step's gradient is (sum over the ranks that
            # still have data of their gradients) / n.
            active = [r for r in range(n) if s < oc.join_batches(r)]
            loss = sum(oc.loss_fn(m(oc.batch(s, r)[0]), oc.batch(s, r)[1])
                       for r in active) / n
            loss.backward()
        elif case in ("sparse_dense", "sparse"):
            idx, y = zip(*[oc.emb_batch(s, r) for r in range(n)])
            oc.loss_fn(m(torch.cat(idx)), torch.cat(y)).backward()
        else:
            x, y = _concat(n, s)
            oc.loss_fn(m(x), y).backward()
        if case == "clip":
            norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), oc.CLIP)))
        opt.step()
    info["norms"] = norms
    return oc.flat(m), info


def assert_params(cases, case, n, rtol=1e-5, atol=1e-6, identical=True):
    import numpy as np
    want, info = reference(case, n)
    got = cases[case]
    assert sorted(got) == list(range(n))
    for rank in range(n):
        params = got[rank]["params"]
        assert sorted(params) == sorted(want)
        for k in want:
            np.testing.assert_allclose(params[k], want[k], rtol=rtol, atol=atol,
                                       err_msg=f"case {case}, rank {rank}, {k}")
            if identical:
                assert params[k] == got[0]["params"][k], f"{case}: rank {rank} differs from 0"
    return info


# ---- equivalence with single-process training ---------------------------------


@pytest.mark.parametrize("case", ["sgd", "adam", "noname", "groups_int", "groups_list",
                                  "predivide"])
def test_equals_single_process(run, case):
    """SGD with momentum and Adam on N ranks equal one process on the
    concatenated batch; so do the unnamed, grouped and pre-divided forms."""
    n, cases = run
    assert_params(cases, case, n)


def test_names_pair_parameters(run):
    """Odd ranks hold the parameters in reverse order: the allreduces are
    matched by the names from named_parameters, not by position."""
    n, cases = run
    assert_params(cases, "reversed", n)


def test_backward_passes_per_step_sums(run):
    n, cases = run
    assert_params(cases, "bpps2", n)


def test_clip_recipe(run):
    """synchronize(); clip_grad_norm_; with skip_synchronize(): step()
    equals clipping the averaged gradient in one process (and clipping
    did happen)."""
    n, cases = run
    info = assert_params(cases, "clip", n)
    from opt_common import CLIP
    assert any(x > 1.5 * CLIP for x in info["norms"]), info


def test_step_after_synchronize_warns(run):
    n, cases = run
    assert_params(cases, "double_sync", n)
    for rank, out in cases["double_sync"].items():
        assert len(out["warnings"]) == 4, out["warnings"]
        assert all("skip_synchronize" in w for w in out["warnings"])


@pytest.mark.parametrize("case,atol", [("fp16", 3e-3), ("bf16", 2.5e-2)])
def test_compression(run, case, atol):
    """Gradients sent in half precision: within its rounding of the float32
    reference (kolo sums in float32)."""
    n, cases = run
    assert_params(cases, case, n, rtol=0, atol=atol)


@pytest.mark.parametrize("case", ["missing", "missing_groups"])
def test_missing_gradient_does_not_stall(run, case):
    """Head b gets no gradient on odd ranks: they submit zeros, the average
    is (sum of the even ranks' gradients) / n, and nobody waits forever
    (with groups too: an incomplete group is reduced as a group)."""
    n, cases = run
    assert_params(cases, case, n)


def test_sum_op(run):
    n, cases = run
    assert_params(cases, "sum", n)


def test_sparse_as_dense(run):
    n, cases = run
    assert_params(cases, "sparse_dense", n)
    assert all(out["sparse_grad"] for out in cases["sparse_dense"].values())


def test_join_uneven_batches(run):
    """Rank r has STEPS - r batches, then calls join(); the last to join
    (rank 0) broadcasts its parameters. Joined ranks count as zeros in the
    average, which still divides by the job's size (Horovod's rule)."""
    n, cases = run
    assert_params(cases, "join", n)
    assert {out["last"] for out in cases["join"].values()} == {0}


def test_zero_grad_with_pending_allreduces_raises(run):
    n, cases = run
    for out in cases["zero_grad_pending"].values():
        assert out["raised"] == "AssertionError", out
        assert "zero_grad" in out["msg"]
    # The job went on: the pending allreduces completed in step().
    assert_params(cases, "zero_grad_pending", n)


def test_too_many_backward_passes_raises(run):
    n, cases = run
    for out in cases["bpps_exceeded"].values():
        assert out["raised"] == "AssertionError", out
        assert "backward_passes_per_step" in out["msg"]


def test_sparse_gradients_travel_as_indices_and_values(run):
    n, cases = run
    assert_params(cases, "sparse", n)
    assert all(out["sparse_grad"] for out in cases["sparse"].values())


# ---- argument checks (one process, before anything is enqueued) ---------------


def _model_and_opt():
    import torch
    m = torch.nn.Linear(3, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def test_duplicate_names_raise():
    import kolo.torch as hvd
    m, opt = _model_and_opt()
    named = [("w", m.weight), ("w", m.bias)]
    with pytest.raises(ValueError, match="unique.*w"):
        hvd.DistributedOptimizer(opt, named_parameters=named)


def test_incomplete_names_raise():
    import kolo.torch as hvd
    m, opt = _model_and_opt()
    with pytest.raises(ValueError, match="does not name every parameter"):
        hvd.DistributedOptimizer(opt, named_parameters=[("w", m.weight)])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(opt, named_parameters=[m.weight, m.bias])


def test_unsupported_features_raise():
    import kolo.torch as hvd
    m, opt = _model_and_opt()
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(opt, op=hvd.Adasum, groups=2)
    with pytest.raises(TypeError, match="ProcessSet"):
        hvd.DistributedOptimizer(opt, process_set=object())
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(opt, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(opt, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(opt, groups=[[m.weight, m.weight]])
    with pytest.raises(TypeError):
        hvd.DistributedOptimizer(object())


def test_split_list_matches_horovod():
    """Groups of an integer ``groups`` are Horovod's split_list chunks."""
    from kolo.torch.optimizer import _split_list
    for n in range(0, 12):
        for k in range(1, 6):
            d, r = divmod(n, k)
            want = [list(range(n))[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]
                    for i in range(k)]
            assert _split_list(list(range(n)), k) == want
