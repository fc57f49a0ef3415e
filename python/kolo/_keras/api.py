"""The public Keras API for one Keras module: ``kolo.keras`` binds Keras 3,
``kolo.tensorflow.keras`` binds ``tf.keras``. Each binding module calls
:func:`bind` and takes the names it returns."""

from __future__ import annotations

from typing import Any, Optional

from kolo.common import basics
from kolo.common.basics import Average, ProcessSet, global_process_set

from . import callbacks as _callbacks
from . import create_distributed_optimizer
from . import elastic as _elastic


def bind(keras: Any, compression: Any) -> dict:
    """DistributedOptimizer, load_model and the callbacks/elastic namespaces
    for ``keras``, with ``compression`` as the default Compression."""

    def DistributedOptimizer(optimizer: Any, name: Optional[str] = None,
                             device_dense: str = "", device_sparse: str = "",
                             compression: Any = compression.none,
                             sparse_as_dense: bool = False,
                             gradient_predivide_factor: float = 1.0, op: int = Average,
                             backward_passes_per_step: int = 1,
                             average_aggregated_gradients: bool = False, num_groups: int = 0,
                             groups: Any = None, process_set: ProcessSet = global_process_set,
                             scale_local_gradients: bool = True) -> Any:
        """A new optimizer, of a subclass of ``optimizer``'s class with its
        config, whose gradients are averaged over every rank (``op``) in
        ``apply`` before loss-scale checks, clipping and weight decay. Wrap a
        LossScaleOptimizer as ``DistributedOptimizer(LossScaleOptimizer(opt))``.
        ``backward_passes_per_step`` > 1 maps onto Keras 3's
        ``gradient_accumulation_steps``: passes add up locally and are
        reduced once per update step (summed unless
        ``average_aggregated_gradients``). ``groups``/``num_groups`` are
        accepted; kolo fuses by size."""
        return create_distributed_optimizer(keras, optimizer, name, compression,
                                            sparse_as_dense, gradient_predivide_factor, op,
                                            backward_passes_per_step,
                                            average_aggregated_gradients, process_set)

    def load_model(filepath: str, custom_optimizers: Any = None, custom_objects: Any = None,
                   compression: Any = compression.none) -> Any:
        """``keras.models.load_model``, its optimizer wrapped in a
        DistributedOptimizer (its state kept)."""
        from . import load_model as _load
        return _load(keras, lambda opt: DistributedOptimizer(opt, compression=compression),
                     filepath, custom_optimizers, custom_objects)

    cbs = _callbacks.make(keras)
    el = _elastic.make(keras)
    return {"DistributedOptimizer": DistributedOptimizer, "load_model": load_model,
            "callbacks": cbs, "elastic": el}


def namespace(name: str, items: dict, doc: str) -> Any:
    import types
    mod = types.ModuleType(name, doc)
    mod.__dict__.update(items)
    mod.__all__ = sorted(items)
    return mod


TOPOLOGY = {n: getattr(basics, n) for n in (
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank",
    "local_rank", "cross_rank", "is_homogeneous", "start_timeline", "stop_timeline",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "ProcessSet",
    "global_process_set", "add_process_set", "remove_process_set", "Average", "Sum",
    "Adasum", "Min", "Max", "Product")}
