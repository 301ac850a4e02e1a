"""A byte-level text corpus that needs no download: the source of Python's standard library.

Every machine that runs us has it, it is plain text, and its licence (PSF) allows it. The corpus is
the sorted ``*.py`` files under the stdlib folder, concatenated up to ``max_bytes``; a file named
explicitly may be used instead. Batches are windows of ``seq_len + 1`` bytes (inputs and next-byte
targets) at positions drawn from a seeded generator: sample ``k`` of the run is a function of the
seed and ``k`` alone, so a replica asks for its share of step ``s`` without reading the others', and
a resumed run continues where it stopped (its position is the sample counter).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

DEFAULT_MAX_BYTES = 8 * 2**20


class ByteCorpus:
    def __init__(self, data: bytes, *, source: str) -> None:
        assert len(data) > 1, "a corpus needs at least two bytes"
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.source = source

    @classmethod
    def stdlib(cls, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ByteCorpus:
        root = Path(sysconfig.get_paths()["stdlib"])
        chunks, size = [], 0
        for path in sorted(root.glob("*.py")):
            chunks.append(path.read_bytes())
            size += len(chunks[-1])
            if size >= max_bytes:
                break
        return cls(b"\n".join(chunks)[:max_bytes], source=f"Python stdlib sources in {root}")

    @classmethod
    def from_file(cls, path: Path) -> ByteCorpus:
        return cls(path.read_bytes(), source=str(path))

    def __len__(self) -> int:
        return len(self.data)

    def samples(
        self, first: int, count: int, *, seq_len: int, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``first .. first + count - 1`` of the run: (inputs, targets), each
        ``(count, seq_len)`` int64 byte values."""
        assert len(self.data) > seq_len + 1, "corpus shorter than one sample"
        starts = torch.stack([self._start(k, seq_len, seed) for k in range(first, first + count)])
        offsets = starts[:, None] + torch.arange(seq_len + 1)
        window = self.data[offsets].long()
        return window[:, :-1], window[:, 1:]

    def _start(self, k: int, seq_len: int, seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + k)
        return torch.randint(0, len(self.data) - seq_len - 1, (), generator=generator)
