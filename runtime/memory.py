"""Peak bytes of a worker's tensors: what the simulator's memory model predicts, measured.

On a GPU the caching allocator keeps the figure (``torch.cuda.max_memory_allocated``). On CPU torch
keeps no allocator statistics, but its tensors come from glibc's ``malloc``, whose ``mallinfo2``
reports the bytes handed out and not yet freed (arena chunks + mmapped chunks, all arenas). The
runner samples it at the step's turning points (after each forward and backward, after the gradient
sync and the optimizer step); the peak less what was in use besides the stage's tensors when the
stage was built is the tensor peak. A process-wide resident set would not do: it holds the Python
interpreter, torch's code and freed pages that were never returned, none of which a GPU profile's
memory describes.
"""

from __future__ import annotations

import ctypes
import functools


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        )
    ]


@functools.cache
def _mallinfo2():
    """glibc's ``mallinfo2`` (2.33+), or None where there is none (musl, macOS)."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


def malloc_in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not had back, or None where glibc's figure is missing."""
    mallinfo = _mallinfo2()
    if mallinfo is None:
        return None
    info = mallinfo()
    return int(info.uordblks + info.hblkhd)


class TensorMemory:
    """The peak of one worker's tensor bytes since ``start`` (None where it cannot be measured)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._baseline: int | None = None
        self._peak = 0

    def start(self, owned_bytes: int) -> None:
        """Begin measuring, ``owned_bytes`` of tensors (weights, gradient buffer) already held."""
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
            return
        in_use = malloc_in_use_bytes()
        if in_use is not None:
            self._baseline = in_use - owned_bytes
            self._peak = in_use

    def sample(self) -> None:
        if self._baseline is not None:
            in_use = malloc_in_use_bytes()
            self._peak = in_use if in_use > self._peak else self._peak

    @property
    def peak_bytes(self) -> int | None:
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated())
        return None if self._baseline is None else self._peak - self._baseline
