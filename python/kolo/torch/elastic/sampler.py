"""ElasticSampler: a DistributedSampler whose partition follows the job's
membership and remembers what this epoch has processed."""

from __future__ import annotations

import math
import random
from typing import Any, Dict, Iterable, Iterator, List, Tuple

import torch.utils.data

from .. import mpi_ops

__all__ = ["ElasticSampler"]


def _world() -> Tuple[int, int]:
    """(size, rank) of the job now; the sampler re-reads it at every reset."""
    return mpi_ops.size(), mpi_ops.rank()


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions ``dataset`` over the ranks, and again over the new ranks
    after a re-form, leaving out the samples this epoch already processed.

    Like ``DistributedSampler``: the epoch's order is a shuffle seeded with
    ``seed + epoch`` (the same on every rank), padded by repeating its first
    indices to a multiple of the world size, and rank r takes every
    size-th index starting at r, so all ranks have ``len(sampler)`` indices.

    Use it as Horovod's: put it in the ``TorchState`` (which saves it at
    each commit, restores it after a failure and syncs it from rank 0 after
    a re-form, when it re-partitions), call ``record_batch(batch_idx,
    batch_size)`` after each batch (or ``record_indices``), and
    ``set_epoch(epoch + 1)`` at the end of each epoch, not at its start, so
    that a reset mid-epoch does not process samples twice.

    Args:
        dataset: a dataset of constant length.
        shuffle: shuffle each epoch's order (default True).
        seed: the shuffle's seed, the same on every rank (default 0).
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: List[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: List[int] = []
        self.reset()

    @property
    def processed_num(self) -> int:
        """How many distinct samples this epoch has processed."""
        return len(self.processed_indices)

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` (its own shuffle) with nothing processed.
        Call it at the end of an epoch, on every rank."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records that batch ``batch_idx`` (counted from 0 since this
        iteration of the sampler began) of ``batch_size`` samples per rank
        was processed by every rank: the samples of that batch on all ranks
        are marked processed, so it is enough that rank 0's record reaches
        the commit."""
        if batch_idx < 0 or batch_size <= 0:
            raise ValueError(f"kolo: record_batch({batch_idx}, {batch_size}): a batch index "
                             f">= 0 and a positive batch size are needed")
        start = batch_idx * batch_size
        end = min(start + batch_size, self.num_samples)
        if start >= end:
            return
        padded = self._padded()
        self.processed_indices.update(padded[start * self.num_replicas:end * self.num_replicas])

    def record_indices(self, indices: Iterable[int]) -> None:
        """Marks the dataset indices ``indices`` processed in this epoch."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> List[int]:
        """This rank's indices of batch ``batch_idx`` of the current
        iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads a ``state_dict()`` (or Horovod 0.28's ``{"epoch",
        "processed_num"}``, read as that many samples from the start of the
        epoch's order) and re-partitions for the current membership."""
        self.epoch = int(state_dict["epoch"])
        if "processed_indices" in state_dict:
            self.processed_indices = set(int(i) for i in state_dict["processed_indices"])
        else:
            n = int(state_dict.get("processed_num", 0))
            self.processed_indices = set(self._order()[:n])
        self.reset()

    def _order(self) -> List[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def reset(self) -> None:
        """Re-reads the job's size and rank and re-partitions the samples
        this epoch has not processed. Called after every re-form (through
        the state's sync) and by ``set_epoch``/``load_state_dict``."""
        self.num_replicas, self.rank = _world()
        done = self.processed_indices
        self.remaining_indices = [i for i in self._order() if i not in done]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._padded()[self.rank:self.total_size:self.num_replicas]

    def _padded(self) -> List[int]:
        """The remaining indices padded to total_size by repeating the first
        ones (all ranks then have num_samples)."""
        rem = self.remaining_indices
        pad = self.total_size - len(rem)
        if pad <= 0:
            return list(rem)
        reps = (rem * (pad // len(rem) + 1))[:pad] if rem else []
        return rem + reps

    def __iter__(self) -> Iterator[int]:
        self.indices = self._padded()[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
