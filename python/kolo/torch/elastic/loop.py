"""The elastic loop, ``hvd.elastic.run``: kolo.common.elastic's, with the
torch DistributedOptimizer's re-form hook registered (every
DistributedOptimizer forgets its pending allreduces after a re-form)."""

from __future__ import annotations

from kolo.common import elastic as _elastic
from kolo.common.elastic import reset_limit, run

from .. import optimizer as _optimizer

__all__ = ["run", "reset_limit"]

_elastic.register_reform_hook(_optimizer._reset_after_reform)
