"""The order a run reads a sharded set in: every epoch its own, each sample once per epoch.

Sample ``k`` of the run is in epoch ``k // N`` (``N`` samples in the set). Each epoch visits the
shards in an order of its own and each shard's samples in an order of its own (WebDataset's
shard shuffle and in-shard shuffle, made by keyed permutations instead of a buffer), so
consecutive samples of the run come from one shard: one fetch serves a microbatch, and
data-parallel replicas, which read contiguous shares of each step's batch, fetch different
shards. The order depends on the seed and ``k`` only: a resumed or re-planned run reads on from
the same sample, with no sample seen twice or skipped in an epoch.
"""

from __future__ import annotations

import bisect
import itertools

from runtime.data.shards import ShardIndex
from runtime.data.tokens import Permutation


class ShardEpochs:
    """Sample ``k`` of a run -> the set's sample number (``ShardIndex`` order)."""

    def __init__(self, index: ShardIndex, *, seed: int) -> None:
        self.index, self.seed = index, seed
        self._epochs: dict[int, tuple[Permutation, tuple[int, ...]]] = {}
        self._inside: dict[tuple[int, int], Permutation] = {}

    def __call__(self, k: int) -> int:
        epoch, position = divmod(k, self.index.num_samples)
        order, starts = self._epoch(epoch)
        slot = bisect.bisect_right(starts, position) - 1
        shard = order(slot)
        inside = self._inside.get((epoch, shard))
        if inside is None:
            key = f"shards/{self.seed}/{epoch}/{shard}".encode()
            inside = self._inside.setdefault(
                (epoch, shard), Permutation(self.index.counts[shard], key)
            )
        return self.index.starts[shard] + inside(position - starts[slot])

    def _epoch(self, epoch: int) -> tuple[Permutation, tuple[int, ...]]:
        """The epoch's shard order and where each of its shards starts in the epoch."""
        known = self._epochs.get(epoch)
        if known is None:
            order = Permutation(len(self.index.counts), f"shards/{self.seed}/{epoch}".encode())
            counts = [self.index.counts[order(i)] for i in range(len(self.index.counts))]
            starts = tuple(itertools.accumulate(counts, initial=0))[:-1]
            known = self._epochs[epoch] = (order, starts)
            if len(self._epochs) > 2:  # a run reads on: older epochs are not asked for again
                del self._epochs[min(self._epochs)]
                self._inside = {k: v for k, v in self._inside.items() if k[0] >= epoch - 1}
        return known
