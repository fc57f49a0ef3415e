"""broadcast_parameters, broadcast_optimizer_state, broadcast_object and
allgather_object, checked against references each rank computes alone
(models and optimizers rebuilt from seeds, the root's training replayed
locally without kolo). Each case reports {"case", "ok", "detail"}; the last
report is {"cases": n}."""


import torch
from torch import nn

torch.set_num_threads(1)

import kolo.torch as hvd  # noqa: E402
from _common import Cases, report  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
CASES = Cases(limit=5)
run = CASES.run


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def same_tensors(a, b, what):
    """None when two dicts of tensors (or values) are equal, key by key."""
    if sorted(a) != sorted(b):
        return f"{what}: keys {sorted(a)} != {sorted(b)}"
    for k in a:
        x, y = a[k], b[k]
        if torch.is_tensor(x) or torch.is_tensor(y):
            if not (torch.is_tensor(x) and torch.is_tensor(y)) or x.shape != y.shape or \
                    x.dtype != y.dtype or not torch.equal(x, y):
                return f"{what}[{k}]: {x!r} != {y!r}"
        elif x != y:
            return f"{what}[{k}]: {x!r} != {y!r}"
    return None


def train(m, opt, seed, steps):
    """Local steps on seeded data (no kolo)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        y = torch.randn(16, 3, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()


# ---- broadcast_parameters ---------------------------------------------------

def params_state_dict():
    root = N - 1
    m = model(100 + R)
    hvd.broadcast_parameters(m.state_dict(), root_rank=root)
    return same_tensors(m.state_dict(), model(100 + root).state_dict(), "state_dict")


def params_named():
    m = model(200 + R)
    hvd.broadcast_parameters(m.named_parameters(), root_rank=0)  # a generator
    d = same_tensors(m.state_dict(), model(200).state_dict(), "named_parameters()")
    if d:
        return d
    m = model(300 + R)
    hvd.broadcast_parameters(list(m.named_parameters()), 0)
    d = same_tensors(m.state_dict(), model(300).state_dict(), "list(named_parameters())")
    if d:
        return d
    m = model(400 + R)
    hvd.broadcast_parameters(list(m.parameters()), 0)  # unnamed, in order
    return same_tensors(m.state_dict(), model(400).state_dict(), "list(parameters())")


def params_non_contiguous():
    torch.manual_seed(500 + R)
    p = {"w": torch.randn(3, 4).t(), "b": torch.randn(5)}
    torch.manual_seed(500)
    want = {"w": torch.randn(3, 4).t(), "b": torch.randn(5)}
    hvd.broadcast_parameters(p, 0)
    return same_tensors(p, want, "non-contiguous")


run("broadcast_parameters/state_dict", params_state_dict)
run("broadcast_parameters/named_and_lists", params_named)
run("broadcast_parameters/non_contiguous", params_non_contiguous)


# ---- broadcast_optimizer_state ------------------------------------------------

def optimizer_case(make_opt, root_kw, other_kw, seed):
    """The root trains 3 steps; the others hold a fresh optimizer with other
    options. After broadcast_parameters + broadcast_optimizer_state every
    rank must hold the root's state and options, and one more step on
    identical data must give the root's parameters (replayed locally)."""
    def fn():
        root = N - 1
        m = model(seed)
        opt = make_opt(m.parameters(), **(root_kw if R == root else other_kw))
        if R == root:
            train(m, opt, seed + 1, 3)
        # The reference: the root's run, replayed here without kolo.
        ref_m = model(seed)
        ref_opt = make_opt(ref_m.parameters(), **root_kw)
        train(ref_m, ref_opt, seed + 1, 3)
        before = {k: v.clone() for k, v in m.state_dict().items()}
        hvd.broadcast_optimizer_state(opt, root_rank=root)
        d = same_tensors(m.state_dict(), before, "parameters moved by broadcast_optimizer_state")
        if d:
            return d
        hvd.broadcast_parameters(m.state_dict(), root_rank=root)
        got, want = opt.state_dict(), ref_opt.state_dict()
        for (ga, gs), (wa, ws) in zip(sorted(got["state"].items()), sorted(want["state"].items())):
            d = same_tensors(gs, ws, f"state[{ga}]")
            if d:
                return d
        if len(got["state"]) != len(want["state"]):
            return f"{len(got['state'])} param states, expected {len(want['state'])}"
        for g, w in zip(got["param_groups"], want["param_groups"]):
            d = same_tensors(g, w, "param_groups")
            if d:
                return d
        train(m, opt, seed + 2, 1)
        train(ref_m, ref_opt, seed + 2, 1)
        return same_tensors(m.state_dict(), ref_m.state_dict(), "parameters after one more step")
    return fn


run("broadcast_optimizer_state/adam",
    optimizer_case(torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.01),
                   dict(lr=0.1), 600))
run("broadcast_optimizer_state/sgd_momentum",
    optimizer_case(torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.001),
                   dict(lr=0.5, momentum=0.5), 700))


def optimizer_all_fresh():
    # Every rank fresh: the state is created by a zero-gradient step that must
    # not move the parameters (weight decay would, were they not restored).
    m = model(800)
    opt = torch.optim.Adam(m.parameters(), lr=0.1, weight_decay=0.5)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    hvd.broadcast_optimizer_state(opt, 0)
    if len(opt.state_dict()["state"]) != len(list(m.parameters())):
        return f"state for {len(opt.state_dict()['state'])} parameters after the call"
    return same_tensors(m.state_dict(), before, "parameters")


run("broadcast_optimizer_state/all_fresh", optimizer_all_fresh)


def optimizer_plain_sgd():
    # torch 1.13's SGD keeps momentum_buffer=None per parameter after a step:
    # that (non-tensor) state and the options (lr) come from the root.
    m = model(900)
    opt = torch.optim.SGD(m.parameters(), lr=0.1 if R == 0 else 0.7)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    hvd.broadcast_optimizer_state(opt, 0)
    if opt.param_groups[0]["lr"] != 0.1:
        return f"lr {opt.param_groups[0]['lr']}, the root's is 0.1"
    return same_tensors(m.state_dict(), before, "parameters")


run("broadcast_optimizer_state/plain_sgd", optimizer_plain_sgd)


def optimizer_distributed():
    # A DistributedOptimizer, fresh on every rank but the root: the
    # zero-gradient step that creates the state must not allreduce (the root
    # makes no such step), so this would hang if it did.
    root = 0
    m = model(950)
    ref_m = model(950)
    ref_opt = torch.optim.Adam(ref_m.parameters(), lr=0.02)
    train(ref_m, ref_opt, 951, 2)
    inner = torch.optim.Adam(m.parameters(), lr=0.02 if R == root else 0.3)
    dopt = hvd.DistributedOptimizer(inner, named_parameters=m.named_parameters())
    if R == root:
        dopt.load_state_dict(ref_opt.state_dict())
    hvd.broadcast_optimizer_state(dopt, root_rank=root)
    got, want = dopt.state_dict(), ref_opt.state_dict()
    if len(got["state"]) != len(want["state"]):
        return f"{len(got['state'])} param states, expected {len(want['state'])}"
    for (ga, gs), (wa, ws) in zip(sorted(got["state"].items()), sorted(want["state"].items())):
        d = same_tensors(gs, ws, f"state[{ga}]")
        if d:
            return d
    return None if dopt.param_groups[0]["lr"] == 0.02 else "lr not broadcast"


run("broadcast_optimizer_state/distributed_optimizer", optimizer_distributed)


def optimizer_lbfgs():
    m = model(1000)
    try:
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(m.parameters()), 0)
    except ValueError as e:
        return None if "LBFGS" in str(e) else f"message {e}"
    return "LBFGS was not refused"


run("broadcast_optimizer_state/lbfgs_refused", optimizer_lbfgs)


# ---- objects ------------------------------------------------------------------

def expected_object(r):
    return {"rank": r, "nested": [1, (2.5, "x" * r), {"k": None}], "t": torch.arange(r + 2)}


def objects_broadcast():
    for root in range(N):
        obj = expected_object(root) if R == root else None
        got = hvd.broadcast_object(obj, root_rank=root)
        want = expected_object(root)
        if got["nested"] != want["nested"] or got["rank"] != root or \
                not torch.equal(got["t"], want["t"]):
            return f"root {root}: got {got!r}"
    big = bytes(range(256)) * 4000 if R == 0 else b""
    got = hvd.broadcast_object(big, 0, name="big")
    return None if got == bytes(range(256)) * 4000 else f"1 MB object: {len(got)} bytes"


def objects_allgather():
    got = hvd.allgather_object(expected_object(R))
    if len(got) != N:
        return f"{len(got)} objects"
    for r, o in enumerate(got):
        w = expected_object(r)
        if o["rank"] != r or o["nested"] != w["nested"] or not torch.equal(o["t"], w["t"]):
            return f"object {r}: {o!r}"
    got = hvd.allgather_object("s" * (R * 1000), name="strings")
    return None if got == ["s" * (r * 1000) for r in range(N)] else "strings differ"


run("broadcast_object", objects_broadcast)
run("allgather_object", objects_allgather)

report({"cases": CASES.count})
