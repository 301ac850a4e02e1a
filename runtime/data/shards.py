"""Training samples in WebDataset-style tar shards, in a local folder or on S3 (runtime/storage.py).

Layout under ``prefix`` in an object store::

    <prefix>/shard-000000.tar      samples 0 .. n-1
    <prefix>/shard-000001.tar      samples n .. 2n-1
    ...
    <prefix>/index.json            {"format": ..., "shards": [{"key": "shard-000000.tar", "samples": n}, ...]}

Each shard is a plain (uncompressed) tar whose members come in groups, one group per sample, in
sample order, as WebDataset lays them out: ``<key>.input.npy`` then ``<key>.target.npy``, where
``<key>`` is the sample's index in the whole set written with nine digits (``000000123``) and each
file is one array in NumPy's ``.npy`` format (read back with ``allow_pickle=False``: a shard from
elsewhere cannot run code). Member times are zero, so the same samples give the same bytes.

``write_shards`` writes the index last, so a reader that finds it finds every shard complete. The
reader streams one shard object at a time (the whole object is fetched, then read from memory) and
checks it: a shard that does not parse, holds an incomplete group, or holds a different number of
samples than the index says raises ``ShardError`` naming the shard. Shards written by other tools
(no ``index.json``) can be streamed too, in the order of their names; without the index a shard cut
off exactly between two samples cannot be told from a short one.
"""

from __future__ import annotations

import bisect
import io
import itertools
import json
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from runtime.storage import ObjectStore

FORMAT = "geo-orchestrator/shards-v1"
INDEX_NAME = "index.json"
INPUT_EXT, TARGET_EXT = "input.npy", "target.npy"
KEY_DIGITS = 9
_SHARD_NAME = re.compile(r"shard-\d{6,}\.tar")

Sample = tuple[torch.Tensor, torch.Tensor]


class ShardError(ValueError):
    """A shard is corrupt, incomplete or disagrees with the index: names it and what to do."""


@dataclass(frozen=True)
class ShardIndex:
    """Which shards hold the set, in order, and how many samples each holds."""

    shards: tuple[str, ...]  # names relative to the prefix
    counts: tuple[int, ...]

    @property
    def num_samples(self) -> int:
        return sum(self.counts)

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """Index of the first sample of each shard."""
        return tuple(itertools.accumulate(self.counts, initial=0))[:-1]

    def locate(self, k: int) -> tuple[int, int]:
        """(shard number, position inside it) of sample ``k``."""
        if not 0 <= k < self.num_samples:
            raise IndexError(f"sample {k} is outside the set of {self.num_samples} samples")
        number = bisect.bisect_right(self.starts, k) - 1
        return number, k - self.starts[number]

    def to_json(self) -> bytes:
        shards = [{"key": s, "samples": c} for s, c in zip(self.shards, self.counts, strict=True)]
        return json.dumps({"format": FORMAT, "shards": shards}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ShardIndex:
        try:
            document = json.loads(data)
            if document.get("format") != FORMAT:
                raise ValueError(f"format {document.get('format')!r}, expected {FORMAT!r}")
            entries = document["shards"]
            return cls(tuple(e["key"] for e in entries), tuple(int(e["samples"]) for e in entries))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ShardError(
                f"{where} is not a shard index ({error}); rewrite the set with write_shards, "
                f"or delete {INDEX_NAME} to stream the shards without it"
            ) from None


def _join(prefix: str, name: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/{name}" if prefix else name


def shard_name(number: int) -> str:
    return f"shard-{number:06d}.tar"


def write_shards(
    samples: Iterable[Sample], store: ObjectStore, prefix: str, samples_per_shard: int
) -> ShardIndex:
    """Write ``(input, target)`` pairs as shards of ``samples_per_shard`` under ``prefix``, then
    the index; holds one shard in memory at a time. Returns the index written."""
    if samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be at least 1, got {samples_per_shard}")
    names: list[str] = []
    counts: list[int] = []
    pending: list[tuple[int, Sample]] = []

    def flush() -> None:
        names.append(shard_name(len(names)))
        counts.append(len(pending))
        store.put(_join(prefix, names[-1]), encode_shard(pending))
        pending.clear()

    for k, sample in enumerate(samples):
        pending.append((k, sample))
        if len(pending) == samples_per_shard:
            flush()
    if pending:
        flush()
    if not names:
        raise ValueError(f"no samples to write under {prefix!r}: the iterable was empty")
    index = ShardIndex(tuple(names), tuple(counts))
    store.put(_join(prefix, INDEX_NAME), index.to_json())  # last: it vouches for the shards
    return index


def encode_shard(samples: Iterable[tuple[int, Sample]]) -> bytes:
    """One shard's bytes: for each ``(global index, (input, target))`` its two ``.npy`` members."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for k, (inputs, target) in samples:
            for ext, tensor in ((INPUT_EXT, inputs), (TARGET_EXT, target)):
                _add_member(tar, f"{k:0{KEY_DIGITS}d}.{ext}", _npy_bytes(tensor))
    return buffer.getvalue()


def _npy_bytes(tensor: torch.Tensor) -> bytes:
    out = io.BytesIO()
    np.save(out, tensor.detach().cpu().numpy(), allow_pickle=False)
    return out.getvalue()


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def decode_shard(data: bytes, where: str) -> list[Sample]:
    """The samples of one shard's bytes, in order; ``ShardError`` naming ``where`` if it is
    corrupt or holds an incomplete sample."""
    try:
        groups = _member_groups(data)
        return [_sample_from(key, files) for key, files in groups]
    except ShardError as error:
        raise ShardError(f"{where}: {error}; {_REWRITE}") from None
    except (tarfile.TarError, EOFError, ValueError, OSError) as error:
        raise ShardError(f"{where} is corrupt ({error}); {_REWRITE}") from None


_REWRITE = "rewrite it (write_shards), or copy it again from the source if the copy was cut short"


def _member_groups(data: bytes) -> list[tuple[str, dict[str, bytes]]]:
    """Consecutive members that share a key (the name up to its first dot), as WebDataset groups."""
    groups: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.rpartition("/")[2].partition(".")
            if not groups or groups[-1][0] != key:
                if any(key == seen for seen, _ in groups):
                    raise ShardError(f"the members of sample {key!r} are not together")
                groups.append((key, {}))
            handle = tar.extractfile(member)
            assert handle is not None, "a regular member always has a file object"
            groups[-1][1][ext] = handle.read()
        # tarfile stops quietly at a header cut short; only zero padding may follow the last member
        if data[tar.offset :].strip(b"\0"):
            raise ShardError(
                f"the archive is cut off {tar.offset} bytes in, inside a member header"
            )
    return groups


def _sample_from(key: str, files: dict[str, bytes]) -> Sample:
    missing = [ext for ext in (INPUT_EXT, TARGET_EXT) if ext not in files]
    if missing:
        raise ShardError(f"sample {key!r} has no {' or '.join(missing)} member")
    return _tensor(files[INPUT_EXT]), _tensor(files[TARGET_EXT])


def _tensor(npy: bytes) -> torch.Tensor:
    # np.load over bytes gives a read-only view; torch wants memory it may own
    return torch.from_numpy(np.load(io.BytesIO(npy), allow_pickle=False).copy())


class ShardReader:
    """Streams the samples under ``prefix`` shard by shard; one shard in memory at a time."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix.strip("/")
        self.index = self._read_index()
        self.shards = self.index.shards if self.index else self._list_shards()
        if not self.shards:
            raise ShardError(
                f"no shards under {self._where('')}: write them with write_shards, or check the "
                "store URL and prefix"
            )
        self._cached: tuple[int, list[Sample]] | None = None

    def _where(self, name: str) -> str:
        return f"{self.store.url.rstrip('/')}/{_join(self.prefix, name)}"

    def _read_index(self) -> ShardIndex | None:
        key = _join(self.prefix, INDEX_NAME)
        if not self.store.exists(key):
            return None
        return ShardIndex.from_json(self.store.get(key), self._where(INDEX_NAME))

    def _list_shards(self) -> tuple[str, ...]:
        cut = len(self.prefix) + 1 if self.prefix else 0
        names = (key[cut:] for key in self.store.keys(_join(self.prefix, "shard-")))
        return tuple(sorted(name for name in names if _SHARD_NAME.fullmatch(name)))

    @property
    def num_samples(self) -> int:
        # not __len__: list(reader) asks len() for a size hint, and shards without an index
        # must still stream
        return self.require_index("counting samples").num_samples

    def __iter__(self) -> Iterator[Sample]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[Sample]:
        """Samples ``start, start + 1, ...`` to the end of the set, in order (a resumed run passes
        its sample counter). With the index, shards before ``start`` are not fetched."""
        if start < 0:
            raise ValueError(f"start must be at least 0, got {start}")
        return self._stream(start)

    def _stream(self, start: int) -> Iterator[Sample]:
        first_shard, skip = 0, start
        if self.index is not None:
            if start >= self.index.num_samples:
                return
            first_shard, skip = self.index.locate(start)
        for number in range(first_shard, len(self.shards)):
            samples = self._shard(number)
            yield from samples[skip:]
            skip = max(0, skip - len(samples))

    def samples_at(self, numbers: Iterable[int]) -> Sample:
        """The set's samples ``numbers`` (any order) stacked, ``(inputs, targets)``."""
        picked = [self._sample_at(k) for k in numbers]
        inputs, targets = zip(*picked, strict=True)
        return torch.stack(inputs), torch.stack(targets)

    def samples(self, first: int, count: int) -> Sample:
        """Samples ``first .. first + count - 1`` stacked, ``(inputs, targets)``: the same call as
        the synthetic data sets. Past the end the set repeats (sample ``k`` is ``k mod len``, one
        epoch after another); fetches only the shards it needs and keeps the last one."""
        size = self.require_index("random access").num_samples
        return self.samples_at(k % size for k in range(first, first + count))

    def _sample_at(self, k: int) -> Sample:
        number, position = self.require_index("random access").locate(k)
        if self._cached is None or self._cached[0] != number:
            self._cached = (number, self._shard(number))
        return self._cached[1][position]

    def require_index(self, what: str) -> ShardIndex:
        if self.index is None:
            raise ShardError(
                f"{what} needs {self._where(INDEX_NAME)}, which is missing: write the set with "
                "write_shards, or stream it in order with iter_from"
            )
        return self.index

    def _shard(self, number: int) -> list[Sample]:
        name = self.shards[number]
        where = self._where(name)
        samples = decode_shard(self.store.get(_join(self.prefix, name)), where)
        if self.index is not None and len(samples) != self.index.counts[number]:
            raise ShardError(
                f"{where} holds {len(samples)} samples but {INDEX_NAME} says "
                f"{self.index.counts[number]}: it is incomplete; {_REWRITE}"
            )
        return samples
