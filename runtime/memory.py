"""Peak bytes of a worker's tensors: what the simulator's memory model predicts, measured.

On a GPU the caching allocator keeps the figure (``torch.cuda.max_memory_allocated``). On CPU torch
keeps no allocator statistics, but its tensors come from glibc's ``malloc``, whose ``mallinfo2``
reports the bytes handed out and not yet freed (arena chunks + mmapped chunks, all arenas). The
runner samples it at the step's turning points (after each forward and backward, after the gradient
sync and the optimizer step); the peak less what was in use besides the stage's tensors is the
tensor peak. "Besides" is taken twice: when the stage is built, and again at the end of its first
step (``rebase``), less the tensors the runner knows it holds then (weights, gradients, optimizer
state, sends in flight): the first step also allocates what is not tensors and stays (gloo's
buffers, autograd's and DTensor's caches: 8 MiB for a gpt-mini worker, 12-15 MiB more with
tensor parallelism), which no GPU profile's memory holds and a GPU allocator would not count. Only the first ``SAMPLED_STEPS`` steps are sampled: a layout
allocates the same tensors every step once the optimizer's state exists (step 0 makes it), and in a
Ray worker one ``mallinfo2`` walks every free chunk of every arena (~0.2 ms after a backward, about
1% of a gpt-mini pipeline step over 17 samples, paid on the critical path). A process-wide resident set would not do: it holds the Python
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


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_KEEP_BYTES = 2**30


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for the next allocation instead of giving it back to the kernel.

    By default a freed block of more than ~128 KiB is unmapped (or the heap's top trimmed) and the
    next step maps it afresh, one page fault per 4 KiB page on first touch: a gpt-mini stage took
    ~5,000 faults per step, ~1-4% of its compute on this VM, and the count varies from step to
    step. A training process allocates the same tensors every step, so it keeps them (what
    ``jemalloc``/``tcmalloc`` settings do for CPU training). Applied by each CPU worker and by the
    profiler, so profiles are measured as the runtime trains. Blocks over 1 GiB are still mapped.
    False where glibc's ``mallopt`` is missing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) and mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


def malloc_in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not had back, or None where glibc's figure is missing."""
    mallinfo = _mallinfo2()
    if mallinfo is None:
        return None
    info = mallinfo()
    return int(info.uordblks + info.hblkhd)


SAMPLED_STEPS = 3  # step 0 creates the optimizer's state; steps 1 and 2 run with all of it


class TensorMemory:
    """The peak of one worker's tensor bytes since ``start`` (None where it cannot be measured),
    sampled over the first ``steps`` steps (``step_done`` counts them)."""

    def __init__(self, device: str, *, steps: int = SAMPLED_STEPS) -> None:
        self.device = device
        self.steps = steps
        self._baseline: int | None = None
        self._peak = 0
        self._steps_left = steps

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
        if self._baseline is not None and self._steps_left > 0:
            in_use = malloc_in_use_bytes()
            self._peak = in_use if in_use > self._peak else self._peak

    @property
    def rebases(self) -> bool:
        """Whether the step now ending is the first (``rebase`` wants the tensors held)."""
        return self._baseline is not None and self._steps_left == self.steps and self.steps > 1

    def rebase(self, held_bytes: int) -> None:
        """At the end of the first step: what is in use besides the ``held_bytes`` of tensors
        the runner holds now is not tensors; the peak is measured afresh from here."""
        in_use = malloc_in_use_bytes()
        self._baseline = in_use - held_bytes
        self._peak = in_use

    def step_done(self) -> None:
        """One more step measured (the sampled steps' peak is the layout's)."""
        self._steps_left = max(0, self._steps_left - 1)

    @property
    def peak_bytes(self) -> int | None:
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated())
        return None if self._baseline is None else self._peak - self._baseline
