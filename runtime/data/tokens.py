"""Pre-tokenized token files as a training source: flat ``uint16``/``uint32`` arrays (nanoGPT's
``train.bin`` and many pipelines write them) in a folder or under an ``s3://`` prefix.

Every ``*.bin`` object under the prefix, in name order, is cut into windows of ``seq_len + 1``
tokens that follow each other (window ``w`` of a file starts at token ``w * seq_len``; inputs are
its first ``seq_len`` tokens, targets its last ``seq_len``); a window never crosses two files. The
windows of all files, numbered in order, are the set's samples ``0 .. N-1``.

Sample ``k`` of the run (the runtime's global sample counter: step x global batch + the
sample's place in the step) reads window ``order(epoch)[k mod N]`` of epoch ``k div N``, where
``order(e)`` is a permutation of ``0 .. N-1`` keyed by the seed and ``e`` (a small Feistel
network walked in cycles: no table of N entries is held). So every epoch sees each window exactly
once; replicas and stages read disjoint parts of each step's counter range; and a resumed or
re-planned job, whose position is its step, goes on with the very next window, whatever its new
layout. Each read is one ranged GET of ``(seq_len + 1)`` tokens (an object store that has no
ranged read is fetched whole once and kept).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from runtime.storage import ObjectStore

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
SUFFIX = ".bin"
FEISTEL_ROUNDS = 4


class TokenDataError(ValueError):
    """A token set that cannot be read as asked: names the set and what to do."""


@dataclass(frozen=True)
class _File:
    key: str
    tokens: int
    first_window: int  # the set's number of this file's window 0
    windows: int


class Permutation:
    """A keyed permutation of ``0 .. size-1``: a balanced Feistel network on the smallest
    power of four covering ``size``, applied again until the value falls inside (cycle
    walking)."""

    def __init__(self, size: int, key: bytes) -> None:
        assert size >= 1
        self.size = size
        bits = max(2, (size - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        self.keys = [
            int.from_bytes(hashlib.blake2b(key + bytes([r]), digest_size=8).digest(), "little")
            for r in range(FEISTEL_ROUNDS)
        ]

    def _round(self, value: int, key: int) -> int:
        mixed = hashlib.blake2b(
            value.to_bytes(8, "little") + key.to_bytes(8, "little"), digest_size=8
        ).digest()
        return int.from_bytes(mixed, "little") & self.mask

    def _network(self, value: int) -> int:
        left, right = value >> self.half, value & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self.half) | right

    def __call__(self, index: int) -> int:
        assert 0 <= index < self.size
        value = self._network(index)
        while value >= self.size:  # a bijection on the power of four: the walk comes back in
            value = self._network(value)
        return value


class TokenFiles:
    """The windows of a token set, read by the run's global sample counter."""

    def __init__(self, store: ObjectStore, *, dtype: str, seq_len: int, seed: int) -> None:
        if dtype not in DTYPES:
            raise TokenDataError(f"token dtype {dtype!r}: write uint16 or uint32")
        self.store, self.seq_len, self.seed = store, seq_len, seed
        self.dtype = np.dtype(DTYPES[dtype])
        self.files = self._index()
        self.num_samples = sum(f.windows for f in self.files)
        if self.num_samples == 0:
            raise TokenDataError(
                f"{store.url}: no *.bin file holds {seq_len + 1} tokens (one sample); write the "
                "token files there, or shorten the model's sequence"
            )
        self._orders: dict[int, Permutation] = {}
        self._whole: dict[str, bytes] = {}

    def _index(self) -> tuple[_File, ...]:
        files, first = [], 0
        for key in sorted(k for k in self.store.keys("") if k.endswith(SUFFIX)):
            size = self.store.size(key) or 0
            if size % self.dtype.itemsize:
                raise TokenDataError(
                    f"{self.store.url}/{key}: {size} bytes is no whole number of "
                    f"{self.dtype.name} tokens; check data.dtype"
                )
            tokens = size // self.dtype.itemsize
            windows = max(0, (tokens - 1) // self.seq_len)
            files.append(_File(key, tokens, first, windows))
            first += windows
        return tuple(files)

    def window(self, k: int) -> int:
        """The window sample ``k`` of the run reads."""
        epoch, position = divmod(k, self.num_samples)
        order = self._orders.get(epoch)
        if order is None:
            key = f"tokens/{self.seed}/{epoch}".encode()
            order = self._orders.setdefault(epoch, Permutation(self.num_samples, key))
        return order(position)

    def samples(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``first .. first + count - 1`` of the run: (inputs, targets), each
        ``(count, seq_len)`` int64 token ids."""
        rows = [self._read(self.window(k)) for k in range(first, first + count)]
        window = torch.from_numpy(np.stack(rows).astype(np.int64))
        return window[:, :-1], window[:, 1:]

    def _read(self, window: int) -> np.ndarray:
        file = self._file_of(window)
        start = (window - file.first_window) * self.seq_len * self.dtype.itemsize
        length = (self.seq_len + 1) * self.dtype.itemsize
        data = self._range(file.key, start, length)
        return np.frombuffer(data, dtype=self.dtype)

    def _file_of(self, window: int) -> _File:
        low, high = 0, len(self.files) - 1
        while low < high:  # the last file whose first window is at or before ``window``
            middle = (low + high + 1) // 2
            if self.files[middle].first_window <= window:
                low = middle
            else:
                high = middle - 1
        return self.files[low]

    def _range(self, key: str, start: int, length: int) -> bytes:
        ranged = getattr(self.store, "get_range", None)
        if ranged is not None:
            return ranged(key, start, length)
        if key not in self._whole:
            self._whole[key] = self.store.get(key)
        return self._whole[key][start : start + length]
