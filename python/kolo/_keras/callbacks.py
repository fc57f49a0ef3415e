"""Horovod's Keras callbacks, built for the Keras module a binding uses
(``make(keras)``): Keras 3's or tf_keras's ``Callback`` as the base."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

import kolo
from kolo.common import arrays, util
from kolo.common import variables as V
from kolo.common.handles import wait_all


def _set_lr(optimizer: Any, value: float) -> None:
    lr = getattr(optimizer, "learning_rate", None)
    if hasattr(lr, "assign"):
        lr.assign(value)
    else:
        optimizer.learning_rate = value


def _get_lr(optimizer: Any) -> float:
    return float(np.asarray(V.value(optimizer.learning_rate)))


def make(keras: Any) -> dict:
    """The callback classes on ``keras.callbacks.Callback``."""
    Callback = keras.callbacks.Callback

    class BroadcastGlobalVariablesCallback(Callback):
        """Rank ``root_rank``'s model and optimizer variables on every rank:
        at the start of training, and once more after the first batch for
        optimizers that create their variables on first use (tf_keras); a
        model built only by its first step is broadcast after that step
        alone, as Horovod does for every model."""

        def __init__(self, root_rank: int, device: str = ""):
            super().__init__()
            self.root_rank = root_rank
            self._done_opt = False

        def _opt_vars(self):
            return V.optimizer_variables(getattr(self.model, "optimizer", None), shared=True)

        def on_train_begin(self, logs=None):
            if not getattr(self.model, "built", True):
                # No weights before the first step (a Sequential without an
                # input shape): they go after it, where Horovod broadcasts
                return
            opt_vars = self._opt_vars()
            V.broadcast(list(self.model.variables) + opt_vars, util.root(self.root_rank),
                        "BroadcastGlobalVariablesCallback.begin")
            self._done_opt = bool(opt_vars)

        def on_train_batch_end(self, batch, logs=None):
            if self._done_opt:
                return
            self._done_opt = True
            V.broadcast(list(self.model.variables) + self._opt_vars(),
                        util.root(self.root_rank), "BroadcastGlobalVariablesCallback.batch")

    class MetricAverageCallback(Callback):
        """At each epoch's end, every metric in ``logs`` (sorted by name) is
        replaced by its average over the ranks, in one submission."""

        def __init__(self, device: str = ""):
            super().__init__()

        def on_epoch_end(self, epoch, logs=None):
            if not logs:
                return
            keys = sorted(k for k, v in logs.items() if np.ndim(np.asarray(V.value(v))) == 0)
            vals = [np.array([float(np.asarray(V.value(logs[k])))], np.float64) for k in keys]
            out = wait_all([arrays.allreduce(v, f"MetricAverageCallback.{k}", "average")
                            for k, v in zip(keys, vals)])
            for k, o in zip(keys, out):
                logs[k] = float(o[0])

    class LearningRateScheduleCallback(Callback):
        """Sets the rate to ``initial_lr * multiplier(epoch)`` (or times a
        constant ``multiplier``) from ``start_epoch`` to ``end_epoch``;
        ``staircase=False`` moves it every batch (fractional epochs).
        ``momentum_correction`` scales momentum by new/old rate for the
        batch in which the rate changes, as Horovod does."""

        def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0,
                     end_epoch: Optional[int] = None, staircase: bool = True,
                     momentum_correction: bool = True, steps_per_epoch: Optional[int] = None):
            super().__init__()
            self.initial_lr = initial_lr
            self.start_epoch = start_epoch
            self.end_epoch = end_epoch
            self.staircase = staircase
            self.momentum_correction = momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.current_epoch = None
            self._restore_momentum = None
            self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

        def _steps(self) -> Optional[int]:
            return self.steps_per_epoch or (self.params or {}).get("steps")

        def _adjust(self, epoch: float) -> None:
            opt = self.model.optimizer
            old = _get_lr(opt)
            new = self.initial_lr * self.multiplier(epoch)
            _set_lr(opt, new)
            m = getattr(opt, "momentum", None)
            if self.momentum_correction and m is not None and old > 0 and \
                    not callable(m) and new != old:
                self._restore_momentum = m
                opt.momentum = float(m) * new / old

        def _in_range(self, epoch: int) -> bool:
            return epoch >= self.start_epoch and (self.end_epoch is None or
                                                  epoch < self.end_epoch)

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.current_epoch is None or not self._in_range(self.current_epoch):
                return
            if self.staircase:
                if batch == 0:
                    self._adjust(self.current_epoch)
                return
            steps = self._steps()
            if not steps:
                raise ValueError("kolo: LearningRateScheduleCallback(staircase=False) needs "
                                 "steps_per_epoch")
            self._adjust(self.current_epoch + float(batch) / steps)

        def on_train_batch_end(self, batch, logs=None):
            if self._restore_momentum is not None:
                self.model.optimizer.momentum = self._restore_momentum
                self._restore_momentum = None

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Ramps the rate from ``initial_lr / size`` to ``initial_lr`` over
        ``warmup_epochs`` (per batch), Goyal et al.'s warmup, as Horovod
        does."""

        def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                     momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                     verbose: int = 0):
            def multiplier(epoch):
                epoch += 1.0 / self._steps() if self._steps() else 0.0
                n = kolo.size()
                return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                             staircase=False, momentum_correction=momentum_correction,
                             steps_per_epoch=steps_per_epoch)
            self.verbose = verbose
            self.warmup_epochs = warmup_epochs

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.warmup_epochs - 1 and self.verbose > 0 and kolo.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{_get_lr(self.model.optimizer):g}.")

    class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
        """``ModelCheckpoint(save_best_only=True)`` written by rank 0 only."""

        def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                     save_freq: Any = "epoch", filepath: Optional[str] = None):
            super().__init__(filepath=filepath or "best_model.keras", monitor=monitor,
                             verbose=verbose, save_best_only=True, mode=mode,
                             save_freq=save_freq)

        def _save_model(self, *args, **kwargs):
            if kolo.rank() == 0:
                return super()._save_model(*args, **kwargs)
            return None

    return {c.__name__: c for c in (BroadcastGlobalVariablesCallback, MetricAverageCallback,
                                    LearningRateScheduleCallback, LearningRateWarmupCallback,
                                    BestModelCheckpoint)}
