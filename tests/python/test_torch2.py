"""DistributedOptimizer on what torch 2.x added: step hooks, GradScaler and
fused optimizers, CPU bfloat16 autocast, torch.compile, the new dtypes.

One run of workers/torch2_train.py on 2 ranks trains every case; each test
recomputes its case in this process without kolo (single-process training
on the ranks' concatenated batches) and compares every rank's final
parameters with it."""

import sys

import pytest

from conftest import REPO, WORKERS, requires_torch, results, run_worker

pytestmark = requires_torch

for _p in (str(REPO / "python"), str(WORKERS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

N = 2


@pytest.fixture(scope="module")
def cases():
    proc = run_worker(N, "torch2_train.py", timeout=400)
    res = results(proc)
    assert sorted(res) == list(range(N)), proc.stdout[-3000:]
    out = {}
    for rank, items in res.items():
        for item in items:
            assert item["size"] == N and item["rank"] == rank
            out.setdefault(item["case"], {})[rank] = item
    return out


def _concat(step):
    import torch
    from opt_common import batch
    xs, ys = zip(*[batch(step, r) for r in range(N)])
    return torch.cat(xs), torch.cat(ys)


def _reference(case):
    """{name: [floats]} of ``case`` trained in one process on the ranks'
    concatenated batches."""
    import torch
    import opt_common as oc

    m = oc.mlp()
    if case == "fused_adam":
        opt = torch.optim.Adam(m.parameters(), lr=0.01, fused=True)
    else:
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    scaler = None
    if case in ("scaler_sgd", "fused_adam"):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for s in range(oc.STEPS):
        x, y = _concat(s)
        opt.zero_grad()
        if case == "autocast_bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(x)
            oc.loss_fn(out.float(), y).backward()
            opt.step()
        elif scaler is not None:
            scaler.scale(oc.loss_fn(m(x), y)).backward()
            if case == "scaler_sgd":
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        else:
            oc.loss_fn(m(x), y).backward()
            opt.step()
    return oc.flat(m), (scaler.get_scale() if scaler else None)


def _close(got, want, tol, what):
    for k, ref in want.items():
        diff = max(abs(a - b) for a, b in zip(got[k], ref))
        assert diff <= tol, f"{what}: {k} differs from the reference by {diff:.3g} (> {tol})"


def _replicas(case_out):
    first = case_out[0]["params"]
    for rank, item in case_out.items():
        assert item["params"] == first, f"rank {rank}'s parameters differ from rank 0's"


@pytest.mark.parametrize("case", ["step_hooks", "scaler_sgd", "fused_adam", "compile"])
def test_matches_single_process(cases, case):
    want, scale = _reference(case)
    _replicas(cases[case])
    for rank, item in cases[case].items():
        _close(item["params"], want, 2e-6, f"{case} rank {rank}")
        if scale is not None:
            assert item["scale"] == scale, f"{case}: GradScaler's scale {item['scale']} != {scale}"


def test_step_hooks_run_once_per_step(cases):
    import opt_common as oc
    for rank, item in cases["step_hooks"].items():
        assert item["counts"] == {"pre": oc.STEPS, "post": oc.STEPS, "global_pre": oc.STEPS}, \
            f"rank {rank}: step hooks ran {item['counts']} times in {oc.STEPS} steps"


def test_fused_optimizer_keeps_amp_scaling_and_defaults(cases):
    for rank, item in cases["fused_adam"].items():
        assert item["amp_scaling"] is True, f"rank {rank}: _step_supports_amp_scaling lost"
        assert item["defaults_lr"] == 0.01, f"rank {rank}: defaults lost: lr {item['defaults_lr']}"


def test_autocast_bf16(cases):
    # bfloat16 keeps 8 bits of mantissa: the ranks' half-batches round
    # differently from the whole batch, so the tolerance is bfloat16's.
    want, _ = _reference("autocast_bf16")
    _replicas(cases["autocast_bf16"])
    for rank, item in cases["autocast_bf16"].items():
        _close(item["params"], want, 2e-2, f"autocast_bf16 rank {rank}")


def test_compiled_function_calling_kolo(cases):
    import torch
    xs = [torch.arange(4, dtype=torch.float64) + r for r in range(N)]
    want = (sum(x * 2.0 for x in xs) + 1.0).tolist()
    for rank, item in cases["compiled_allreduce"].items():
        assert item["out"] == want, f"rank {rank}: {item['out']} != {want}"
        # Dynamo cannot trace a ctypes call: it breaks the graph there.
        assert item["graph_breaks"] >= 1, item


def test_new_dtypes_get_a_clear_error(cases):
    import torch
    names = [n for n in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
             if hasattr(torch, n)]
    for rank, item in cases["new_dtypes"].items():
        errs = item["errors"]
        assert sorted(errs) == sorted(f"{n}.{w}" for n in names
                                      for w in ("allreduce", "broadcast", "allgather"))
        for key, msg in errs.items():
            n = key.split(".")[0]
            assert f"torch.{n}" in msg and "does not support" in msg, f"rank {rank}: {key}: {msg}"
