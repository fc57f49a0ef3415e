"""Models and data shared by the DistributedOptimizer workers
(opt_train.py) and the single-process references in test_optimizer.py.

Rank r's batch of step s (pass m) depends only on (s, m, r): the reference
concatenates the ranks' batches in rank order."""

import torch

IN, HID, OUT = 5, 6, 3
B = 3          # samples per rank and backward pass
STEPS = 4      # optimizer steps per case
VOCAB, EMB = 10, 4
CLIP = 0.1     # max_norm of the clipping case


def batch(step, rank, micro=0):
    """(x, y) of rank ``rank`` at ``step``, backward pass ``micro``."""
    g = torch.Generator().manual_seed(100003 * step + 1009 * micro + rank + 1)
    return torch.randn(B, IN, generator=g), torch.randn(B, OUT, generator=g)


def emb_batch(step, rank):
    g = torch.Generator().manual_seed(7 * step + 1000 * rank + 5)
    return torch.randint(0, VOCAB, (B,), generator=g), torch.randn(B, OUT, generator=g)


def mlp():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(),
                               torch.nn.Linear(HID, OUT))


class TwoHead(torch.nn.Module):
    """Head ``b`` takes part only when ``use_b``: ranks that skip it have
    no gradient for its parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.trunk = torch.nn.Linear(IN, HID)
        self.a = torch.nn.Linear(HID, OUT)
        self.b = torch.nn.Linear(HID, OUT)

    def forward(self, x, use_b):
        h = torch.tanh(self.trunk(x))
        out = self.a(h)
        return out + self.b(h) if use_b else out


class EmbNet(torch.nn.Module):
    def __init__(self, sparse):
        super().__init__()
        torch.manual_seed(3)
        self.emb = torch.nn.Embedding(VOCAB, EMB, sparse=sparse)
        self.out = torch.nn.Linear(EMB, OUT)

    def forward(self, idx):
        return self.out(self.emb(idx))


def uses_b(rank):
    return rank % 2 == 0


def join_batches(rank):
    """How many batches rank ``rank`` has in the join case (uneven)."""
    return STEPS - rank


def loss_fn(out, y):
    return torch.nn.functional.mse_loss(out, y)


def flat(model):
    """{name: list of floats} of a model's state."""
    return {k: v.detach().double().flatten().tolist() for k, v in model.state_dict().items()}
