"""Token files (runtime/data/tokens.py): windows that follow each other within a file and never
cross two, every window once per epoch in an order keyed by the seed and the epoch, the same
sample for the same counter whoever reads it, and errors that name the set."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from runtime.data.tokens import Permutation, TokenDataError, TokenFiles  # noqa: E402
from runtime.storage import LocalStore  # noqa: E402


def _set(folder, sizes, dtype=np.uint16):
    start = 0
    for i, size in enumerate(sizes):
        np.arange(start, start + size, dtype=dtype).tofile(folder / f"part-{i}.bin")
        start += size
    return LocalStore(folder)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1000, 4097])
def test_the_permutation_is_one(size):
    order = Permutation(size, b"key")
    assert sorted(order(i) for i in range(size)) == list(range(size))


def test_windows_follow_each_other_in_a_file_and_never_cross_two(tmp_path):
    files = TokenFiles(_set(tmp_path, [100, 50]), dtype="uint16", seq_len=16, seed=0)
    assert files.num_samples == 99 // 16 + 49 // 16  # 6 + 3
    rows = {}
    for k in range(files.num_samples):
        x, y = files.samples(k, 1)
        rows[files.window(k)] = (x[0], y[0])
    x, y = rows[6]  # the second file's first window starts at its own first token
    assert x[0].item() == 100 and torch.equal(y, x + 1)
    x, _ = rows[5]  # the first file's last whole window ends inside it
    assert x[0].item() == 80 and x[-1].item() == 95


def test_each_epoch_reads_every_window_once_in_an_order_of_its_own(tmp_path):
    files = TokenFiles(_set(tmp_path, [1000]), dtype="uint16", seq_len=10, seed=3)
    n = files.num_samples
    epochs = [[files.window(k) for k in range(e * n, (e + 1) * n)] for e in range(3)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    again = TokenFiles(_set(tmp_path, [1000]), dtype="uint16", seq_len=10, seed=3)
    assert [again.window(k) for k in range(n)] == epochs[0]  # a restart reads what it would have
    other = TokenFiles(_set(tmp_path, [1000]), dtype="uint16", seq_len=10, seed=4)
    assert [other.window(k) for k in range(n)] != epochs[0]


def test_uint32_tokens_and_a_store_without_ranged_reads(tmp_path):
    class WholeObjects:  # a store with get only: fetched once, then sliced
        def __init__(self, inner):
            self.inner, self.url, self.gets = inner, inner.url, 0

        def keys(self, prefix=""):
            return self.inner.keys(prefix)

        def size(self, key):
            return self.inner.size(key)

        def get(self, key):
            self.gets += 1
            return self.inner.get(key)

    store = WholeObjects(_set(tmp_path, [70_000], dtype=np.uint32))
    files = TokenFiles(store, dtype="uint32", seq_len=8, seed=0)
    x, _ = files.samples(0, 4)
    assert x.max().item() < 70_000 and store.gets == 1


def test_a_set_that_cannot_be_read_says_why(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(TokenDataError, match="no whole number of uint16"):
        TokenFiles(LocalStore(tmp_path), dtype="uint16", seq_len=4, seed=0)
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 8)
    with pytest.raises(TokenDataError, match="no \\*.bin file holds 5 tokens"):
        TokenFiles(LocalStore(tmp_path), dtype="uint16", seq_len=4, seed=0)


def test_a_model_reads_the_shards_the_recipe_names(tmp_path):
    """data.source shards: the workers' samples are the set's, every sample once an epoch, each
    epoch in a shard order and in-shard order of its own, from the seed."""
    from runtime.data.shards import write_shards
    from runtime.workload import DataSource, build_workload

    images = torch.randn(10, 3, 32, 32)
    labels = torch.arange(10) % 10
    write_shards(zip(images, labels, strict=True), LocalStore(tmp_path), "", samples_per_shard=4)
    data = DataSource(kind="shards", url=str(tmp_path), log_samples=True)
    workload = build_workload("cnn-tiny", seed=0, data=data)
    ids = workload.sample_ids(0, 30)  # three epochs of the 10 samples
    epochs = [ids[e * 10 : (e + 1) * 10] for e in range(3)]
    assert all(sorted(epoch) == list(range(10)) for epoch in epochs)  # each sample once an epoch
    assert len({tuple(epoch) for epoch in epochs}) == 3  # each epoch in an order of its own
    # a shard's samples follow each other (one fetch): 3 shards, so 2 changes of shard an epoch
    assert all(sum(a // 4 != b // 4 for a, b in zip(e, e[1:], strict=False)) == 2 for e in epochs)
    x, y = workload.samples(8, 4)  # what the ids say, read from the shards
    assert torch.equal(x, images[ids[8:12]]) and torch.equal(y, labels[ids[8:12]])
    assert build_workload("cnn-tiny", seed=0, data=data).sample_ids(0, 30) == ids  # seed decides
