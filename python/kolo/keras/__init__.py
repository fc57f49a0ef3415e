"""kolo.keras: Horovod's Keras API (``horovod.keras``) on Keras 3, on the
tensorflow, torch and jax backends (``KERAS_BACKEND``), never compiled
against any of them.

    import kolo.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

Gradients are averaged in the optimizer's ``apply``; each backend's go to
kolo as one submission per step (kolo._keras.reduce). See docs/keras.md.
"""

import sys as _sys

import keras as _keras

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo import Error, MismatchError, ShutdownError  # noqa: F401
from kolo._keras import allgather, allreduce, broadcast, reducescatter  # noqa: F401
from kolo._keras import broadcast_model as _broadcast_model
from kolo._keras import api as _api
from kolo._keras.compression import Compression  # noqa: F401
from kolo.common import elastic as _common_elastic
from kolo.common.objects import allgather_object, broadcast_object  # noqa: F401

globals().update(_api.TOPOLOGY)

_bound = _api.bind(_keras, Compression)
DistributedOptimizer = _bound["DistributedOptimizer"]
load_model = _bound["load_model"]
callbacks = _api.namespace("kolo.keras.callbacks", _bound["callbacks"],
                           "Horovod's Keras callbacks for Keras 3.")
elastic = _api.namespace("kolo.keras.elastic", {**_bound["elastic"],
                                                "run": _common_elastic.run},
                         "Elastic Keras training (Keras 3).")
_sys.modules["kolo.keras.callbacks"] = callbacks
_sys.modules["kolo.keras.elastic"] = elastic


def broadcast_global_variables(root_rank: int, model=None) -> None:
    """Assigns rank ``root_rank``'s variables of ``model`` (and of its
    optimizer) on every rank. Keras 3 has no global variable collection:
    pass the model, or use BroadcastGlobalVariablesCallback."""
    if model is None:
        raise TypeError("kolo: broadcast_global_variables(root_rank, model): Keras 3 has no "
                        "global variables; pass the model (or use "
                        "callbacks.BroadcastGlobalVariablesCallback)")
    _broadcast_model(model, root_rank)
