"""kolo.torch.elastic: Horovod's ``horovod.torch.elastic`` on kolo.

A training function decorated with :func:`run` keeps going when workers
die, hang, leave or join: it gets a state (:class:`TorchState` with the
model, the optimizer, an :class:`ElasticSampler` and plain values), commits
it at points of its choosing, and is re-entered with the last commit after a
failure, or with the current state after a join or leave announced at a
commit, on a comm re-formed in place (no process restarts)::

    import kolo.torch as hvd

    hvd.init()
    model = ...
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for batch, (x, y) in enumerate(loader):   # this epoch's remaining samples
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                sampler.record_batch(batch, 32)
                state.commit()
            state.epoch += 1                          # epoch and sampler move together,
            sampler.set_epoch(state.epoch)            # then one commit
            state.commit()

    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    train(state)

Run it with ``kolorun -np 4 --min-np 2 --max-np 4 -- python train.py``
(docs/elastic.md). See :func:`run` for the loop's exact rules.
"""

from .loop import reset_limit, run
from .sampler import ElasticSampler
from .state import (HostsUpdatedInterrupt, ModelStateHandler, ObjectState,
                    OptimizerStateHandler, SamplerStateHandler, State, StateHandler, TorchState,
                    get_handler_registry, set_handler_registry)
from kolo import MembershipError as HorovodInternalError

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt", "HorovodInternalError", "StateHandler",
           "ModelStateHandler", "OptimizerStateHandler", "SamplerStateHandler",
           "get_handler_registry", "set_handler_registry", "reset_limit"]
