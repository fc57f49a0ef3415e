"""DistributedOptimizer on what torch 2.x added (run by test_torch2.py).

    torch2_train.py [CASE ...]     (default: every case)

Each case trains a fresh model for a few steps on this rank's batches
(opt_common) and reports {"case", "params", ...}; the test compares with
single-process references computed without kolo."""

import sys

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import kolo.torch as hvd
from _common import report
from opt_common import STEPS, batch, flat, loss_fn, mlp

torch.set_num_threads(1)

SCALE = 2.0 ** 10  # GradScaler's initial scale: a power of two, so scaling is exact


def case_step_hooks(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters())
    counts = {"pre": 0, "post": 0, "global_pre": 0}

    def count(key):
        def hook(*_):
            counts[key] += 1
        return hook

    opt.register_step_pre_hook(count("pre"))
    opt.register_step_post_hook(count("post"))
    g = register_optimizer_step_pre_hook(
        lambda o, *_: counts.__setitem__("global_pre", counts["global_pre"] + (o is opt)))
    try:
        for s in range(STEPS):
            x, y = batch(s, rank)
            opt.zero_grad()
            loss_fn(m(x), y).backward()
            opt.step()
    finally:
        g.remove()
    return {"params": flat(m), "counts": counts}


def _scaler_train(m, opt, rank, unscale):
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        scaler.scale(loss_fn(m(x), y)).backward()
        opt.synchronize()
        if unscale:
            scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
    return scaler.get_scale()


def case_scaler_sgd(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters())
    scale = _scaler_train(m, opt, rank, unscale=True)
    return {"params": flat(m), "scale": scale}


def case_fused_adam(rank):
    m = mlp()
    base = torch.optim.Adam(m.parameters(), lr=0.01, fused=True)
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters())
    scale = _scaler_train(m, opt, rank, unscale=False)
    return {"params": flat(m), "scale": scale,
            "amp_scaling": bool(getattr(opt, "_step_supports_amp_scaling", False)),
            "defaults_lr": opt.defaults["lr"]}


def case_autocast_bf16(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters())
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        loss_fn(out.float(), y).backward()
        opt.step()
    return {"params": flat(m)}


def case_compile(rank):
    m = mlp()
    cm = torch.compile(m)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(cm.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=cm.named_parameters())
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        loss_fn(cm(x), y).backward()
        opt.step()
    return {"params": flat(m)}


def case_compiled_allreduce(rank):
    # A kolo call inside a compiled function: dynamo breaks the graph there
    # and runs the call eagerly.
    import torch._dynamo

    def f(x):
        return hvd.allreduce(x * 2.0, op=hvd.Sum, name="compiled") + 1.0

    x = torch.arange(4, dtype=torch.float32) + rank
    out = torch.compile(f)(x)
    torch._dynamo.reset()
    explain = torch._dynamo.explain(f)(x)
    reasons = sorted({str(getattr(b, "reason", b)).splitlines()[0][:120]
                      for b in explain.break_reasons})
    return {"out": out.tolist(), "graph_breaks": explain.graph_break_count,
            "reasons": reasons}


def case_new_dtypes(rank):
    names = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"]
    errors = {}
    for n in names:
        dt = getattr(torch, n, None)
        if dt is None:
            continue
        for what, fn in (("allreduce", lambda t: hvd.allreduce(t)),
                         ("broadcast", lambda t: hvd.broadcast(t, 0)),
                         ("allgather", lambda t: hvd.allgather(t))):
            try:
                fn(torch.zeros(4, dtype=dt))
                errors[f"{n}.{what}"] = "no error"
            except TypeError as e:
                errors[f"{n}.{what}"] = str(e)
    return {"errors": errors}


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}


def main():
    hvd.init()
    names = sys.argv[1:] or list(CASES)
    for name in names:
        out = CASES[name](hvd.rank())
        out.update({"case": name, "rank": hvd.rank(), "size": hvd.size()})
        report(out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
