"""Elastic Keras: ``KerasState`` and the commit callbacks, for the Keras
module a binding uses (``make(keras)``); the loop is kolo.common.elastic's
``run``."""

from __future__ import annotations

from typing import Any

from kolo.common.elastic import ModelState as _State


def make(keras: Any) -> dict:
    Callback = keras.callbacks.Callback

    class KerasState(_State):
        """``KerasState(model, optimizer=None, backend=None, **kwargs)``: the
        model's and optimizer's variables and plain values (``epoch``,
        ``batch``)."""

    class CommitStateCallback(Callback):
        """Commits the state every ``batches_per_commit`` batches and at
        each epoch's end."""

        def __init__(self, state: Any, batches_per_commit: int = 1):
            super().__init__()
            self.state = state
            self.batches_per_commit = batches_per_commit
            self._left = batches_per_commit

        def on_train_batch_end(self, batch, logs=None):
            self._left -= 1
            if self._left <= 0:
                self.state.commit()
                self._left = self.batches_per_commit

        def on_epoch_end(self, epoch, logs=None):
            self.state.commit()
            self._left = self.batches_per_commit

    class UpdateBatchStateCallback(Callback):
        """Keeps ``state.batch`` at the batches done in this epoch."""

        def __init__(self, state: Any):
            super().__init__()
            self.state = state

        def on_train_batch_end(self, batch, logs=None):
            self.state.batch = batch + 1

        def on_epoch_end(self, epoch, logs=None):
            self.state.batch = 0

    class UpdateEpochStateCallback(Callback):
        """Keeps ``state.epoch`` at the epochs done."""

        def __init__(self, state: Any):
            super().__init__()
            self.state = state

        def on_epoch_end(self, epoch, logs=None):
            self.state.epoch = epoch + 1

    return {c.__name__: c for c in (KerasState, CommitStateCallback, UpdateBatchStateCallback,
                                    UpdateEpochStateCallback)}
