"""DistributedOptimizer cases on every rank (run by test_optimizer.py).

    opt_train.py [CASE ...]     (default: every case)

Each case trains a fresh model for a few steps on this rank's batches
(opt_common) and reports {"case", "params"} (final state) or, for the error
cases, {"case", "raised", "msg"}; the test compares with single-process
references."""

import sys
import warnings

import torch

import kolo.torch as hvd
from _common import report
from opt_common import (CLIP, STEPS, EmbNet, TwoHead, batch, emb_batch, flat, join_batches,
                        loss_fn, mlp, uses_b)

torch.set_num_threads(1)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def train(model, opt, rank, steps=STEPS):
    for s in range(steps):
        x, y = batch(s, rank)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def case_sgd(rank):
    m = mlp()
    train(m, hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters()),
          rank)
    return {"params": flat(m)}


def case_adam(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=0.01),
                                   named_parameters=m.named_parameters())
    train(m, opt, rank)
    return {"params": flat(m)}


def case_noname(rank):
    m = mlp()
    train(m, hvd.DistributedOptimizer(sgd(m.parameters())), rank)
    return {"params": flat(m)}


def case_reversed(rank):
    # Odd ranks hold the parameters in the opposite order: only the names
    # pair each gradient with the same gradient on the other ranks.
    m = mlp()
    params = list(m.parameters())
    if rank % 2:
        params = params[::-1]
    train(m, hvd.DistributedOptimizer(sgd(params), named_parameters=m.named_parameters()),
          rank)
    return {"params": flat(m)}


def case_bpps2(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters(),
                                   backward_passes_per_step=2)
    for s in range(STEPS):
        opt.zero_grad()
        for micro in range(2):
            x, y = batch(s, rank, micro)
            loss_fn(m(x), y).backward()
        opt.step()
    return {"params": flat(m)}


def case_clip(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no double-synchronize warning
            with opt.skip_synchronize():
                opt.step()
    return {"params": flat(m)}


def case_double_sync(rank):
    # synchronize() then step() outside skip_synchronize(): Horovod's
    # warning, and the gradients are averaged again (already equal).
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    warned = []
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            opt.step()
        warned += [str(x.message) for x in w]
    return {"params": flat(m), "warnings": warned}


def _compressed(rank, compression):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(),
                                   compression=compression)
    train(m, opt, rank)
    return {"params": flat(m)}


def case_fp16(rank):
    return _compressed(rank, hvd.Compression.fp16)


def case_bf16(rank):
    return _compressed(rank, hvd.Compression.bf16)


def case_missing(rank, **kw):
    m = TwoHead()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters(),
                                   **kw)
    for s in range(STEPS):
        x, y = batch(s, rank)
        opt.zero_grad()
        loss_fn(m(x, uses_b(rank)), y).backward()
        opt.step()
    return {"params": flat(m)}


def case_missing_groups(rank):
    # Head b's group (with the trunk's bias) is incomplete on odd ranks:
    # it is still reduced as a group, under the same names.
    return case_missing(rank, groups=2)


def case_groups_int(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters(),
                                   groups=2)
    train(m, opt, rank)
    return {"params": flat(m)}


def case_groups_list(rank):
    m = mlp()
    groups = [[m[0].weight, m[2].weight]]  # the biases go alone
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters(),
                                   groups=groups)
    train(m, opt, rank)
    return {"params": flat(m)}


def case_predivide(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters(),
                                   gradient_predivide_factor=2.0)
    train(m, opt, rank)
    return {"params": flat(m)}


def case_sum(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.02),
                                   named_parameters=m.named_parameters(), op=hvd.Sum)
    train(m, opt, rank)
    return {"params": flat(m)}


def case_sparse_dense(rank, sparse_as_dense=True):
    m = EmbNet(sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    for s in range(STEPS):
        idx, y = emb_batch(s, rank)
        opt.zero_grad()
        loss_fn(m(idx), y).backward()
        opt.step()
    return {"params": flat(m), "sparse_grad": bool(m.emb.weight.grad.is_sparse)}


def case_join(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    train(m, opt, rank, steps=join_batches(rank))
    last = hvd.join()
    hvd.broadcast_parameters(m.state_dict(), root_rank=last)
    return {"params": flat(m), "last": last}


def _raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"raised": type(e).__name__, "msg": str(e)}
    return {"raised": None, "msg": ""}


def case_zero_grad_pending(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    x, y = batch(0, rank)
    loss_fn(m(x), y).backward()
    out = _raised(opt.zero_grad)
    opt.step()          # the pending allreduces complete; training goes on
    opt.zero_grad()
    x, y = batch(1, rank)
    loss_fn(m(x), y).backward()
    opt.step()
    out["params"] = flat(m)
    return out


def case_bpps_exceeded(rank):
    m = mlp()
    opt = hvd.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    x, y = batch(0, rank)
    loss_fn(m(x), y).backward()

    def again():
        loss_fn(m(x), y).backward()
    out = _raised(again)
    opt.synchronize()   # the first pass's allreduces
    return out


def case_sparse(rank):
    """Sparse gradients without sparse_as_dense: allgathered indices and
    values, as in Horovod."""
    return case_sparse_dense(rank, sparse_as_dense=False)


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}


def main():
    hvd.init()
    rank = hvd.rank()
    names = sys.argv[1:] or list(CASES)
    for name in names:
        out = CASES[name](rank)
        out.update(case=name, rank=rank, size=hvd.size())
        report(out)
    hvd.shutdown()


if __name__ == "__main__":
    main()
