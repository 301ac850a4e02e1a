"""runtime/memory.py: the tensor peak is sampled over a runner's first steps only, and a CPU worker
keeps freed memory for its next step instead of faulting it in again."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest
import torch

from runtime.memory import TensorMemory, malloc_in_use_bytes

pytestmark = pytest.mark.skipif(malloc_in_use_bytes() is None, reason="needs glibc's mallinfo2")


_MALLOC_NOISE_BYTES = 256 * 2**10  # other objects of the test process freed or made meanwhile


def test_peak_counts_tensors_held_during_the_sampled_steps():
    gc.collect()  # garbage of earlier tests freed between start and sample would lower the figure
    memory = TensorMemory("cpu", steps=2)
    memory.start(0)
    held = torch.ones(16 * 2**20, dtype=torch.uint8)  # 16 MiB
    memory.sample()
    memory.step_done()
    assert abs(memory.peak_bytes - held.numel()) < _MALLOC_NOISE_BYTES
    del held


def test_steps_after_the_sampled_ones_are_not_sampled():
    memory = TensorMemory("cpu", steps=1)
    memory.start(0)
    memory.sample()
    before = memory.peak_bytes
    memory.step_done()
    held = torch.ones(16 * 2**20, dtype=torch.uint8)
    memory.sample()  # past the sampled steps: a no-op
    assert memory.peak_bytes == before
    del held


_ALLOCATE = textwrap.dedent(
    """
    import sys
    import torch
    from runtime.memory import _mallinfo2, keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    x = torch.ones(16 * 2**20 // 4)  # a 16 MiB activation
    mapped, heap = _mallinfo2()().hblkhd, _mallinfo2()().arena
    del x
    print(mapped, heap, _mallinfo2()().arena)
    """
)


def _allocate(mode: str) -> tuple[int, int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _ALLOCATE, mode], capture_output=True, text=True, check=True
    )
    mapped, heap, heap_after_free = map(int, done.stdout.split())
    return mapped, heap, heap_after_free


def test_by_default_a_large_tensor_is_mapped_and_unmapped_each_time():
    mapped, _, _ = _allocate("default")
    assert mapped >= 16 * 2**20  # its pages are faulted in afresh at every step


def test_a_worker_that_keeps_freed_memory_allocates_from_the_heap_and_keeps_it():
    mapped, heap, heap_after_free = _allocate("keep")
    assert mapped < 16 * 2**20  # from the heap, not a fresh mapping
    assert heap >= 16 * 2**20
    assert heap_after_free == heap  # freed, but kept for the next step's tensors


def test_a_rebase_leaves_out_what_the_first_step_allocated_besides_tensors():
    """At the end of the first step, what is in use besides the tensors held then (a cache, a
    communication buffer) stays out of the tensor figure."""
    gc.collect()
    memory = TensorMemory("cpu", steps=3)
    memory.start(0)
    state = torch.ones(4 * 2**20, dtype=torch.uint8)  # the first step's optimizer state: held
    cache = bytearray(8 * 2**20)  # not a tensor, kept from the first step on
    assert memory.rebases
    memory.rebase(state.numel())
    memory.step_done()
    assert not memory.rebases
    activations = torch.ones(2 * 2**20, dtype=torch.uint8)
    memory.sample()
    memory.step_done()
    expected = state.numel() + activations.numel()
    assert abs(memory.peak_bytes - expected) < _MALLOC_NOISE_BYTES
    del cache, activations, state
