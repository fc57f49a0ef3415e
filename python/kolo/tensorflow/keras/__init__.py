"""kolo.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` for
``tf.keras``, whichever flavour it is: Keras 3, or tf_keras 2.x when
``TF_USE_LEGACY_KERAS=1`` (what Horovod's TF2 Keras examples need). The
collectives are kolo.tensorflow's; see docs/keras.md.
"""

import sys as _sys

import tensorflow as _tf

from kolo import MembershipError as HorovodInternalError  # noqa: F401
from kolo import Error, MismatchError, ShutdownError  # noqa: F401
from kolo._keras import allgather, allreduce, broadcast, reducescatter  # noqa: F401
from kolo._keras import broadcast_model as _broadcast_model
from kolo._keras import api as _api
from kolo.common import elastic as _common_elastic
from kolo.common.objects import allgather_object, broadcast_object  # noqa: F401
from kolo.tensorflow.compression import Compression  # noqa: F401

globals().update(_api.TOPOLOGY)

_keras = _tf.keras
_bound = _api.bind(_keras, Compression)
DistributedOptimizer = _bound["DistributedOptimizer"]
load_model = _bound["load_model"]
callbacks = _api.namespace("kolo.tensorflow.keras.callbacks", _bound["callbacks"],
                           "Horovod's Keras callbacks for tf.keras.")
elastic = _api.namespace("kolo.tensorflow.keras.elastic",
                         {**_bound["elastic"], "run": _common_elastic.run},
                         "Elastic tf.keras training.")
_sys.modules["kolo.tensorflow.keras.callbacks"] = callbacks
_sys.modules["kolo.tensorflow.keras.elastic"] = elastic


def broadcast_global_variables(root_rank: int, model=None) -> None:
    """Assigns rank ``root_rank``'s variables of ``model`` (and of its
    optimizer) on every rank; TF 2 has no global variable collection, so the
    model is needed (or use BroadcastGlobalVariablesCallback)."""
    if model is None:
        raise TypeError("kolo: broadcast_global_variables(root_rank, model): TensorFlow 2 "
                        "has no global variables; pass the model (or use "
                        "callbacks.BroadcastGlobalVariablesCallback)")
    _broadcast_model(model, root_rank)
