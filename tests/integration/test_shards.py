"""runtime.data.shards: WebDataset-style tar shards round trip from a local folder and from S3 (moto's
server on 127.0.0.1), stream in order one shard at a time, resume at sample k, and name the shard
that is corrupt or incomplete."""

from __future__ import annotations

import io
import json
import tarfile
import uuid

import pytest

torch = pytest.importorskip("torch")

from runtime.data.images import SyntheticImages  # noqa: E402
from runtime.data.shards import (  # noqa: E402
    INDEX_NAME,
    ShardError,
    ShardReader,
    encode_shard,
    write_shards,
)
from runtime.storage import open_store  # noqa: E402

COUNT, PER_SHARD = 10, 4  # three shards: 4, 4 and 2 samples


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "data"))
    request.getfixturevalue("s3_env")
    endpoint = request.getfixturevalue("s3_endpoint")
    import boto3

    bucket = f"shards-{uuid.uuid4().hex[:12]}"  # one bucket per test: the server is shared
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return open_store(f"s3://{bucket}/datasets", endpoint_url=endpoint)


class CountingStore:
    """Wraps a store and records every key fetched, to show what a reader downloads."""

    def __init__(self, inner) -> None:
        self.inner, self.url, self.fetched = inner, inner.url, []

    def get(self, key: str) -> bytes:
        self.fetched.append(key)
        return self.inner.get(key)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _synthetic() -> tuple[torch.Tensor, torch.Tensor]:
    return SyntheticImages(5, 8, 3).samples(0, COUNT)


def _write(store, prefix: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = _synthetic()
    write_shards(zip(images, labels, strict=True), store, prefix, PER_SHARD)
    return images, labels


def _assert_stream_equals(stream, images, labels, first: int = 0) -> None:
    got = list(stream)
    assert len(got) == len(images) - first
    for offset, (image, label) in enumerate(got):
        assert torch.equal(image, images[first + offset]) and torch.equal(
            label, labels[first + offset]
        )


def test_round_trip_in_order_with_wds_member_names(store):
    images, labels = _write(store)
    assert sorted(store.keys("train/")) == [
        "train/index.json",
        "train/shard-000000.tar",
        "train/shard-000001.tar",
        "train/shard-000002.tar",
    ]
    with tarfile.open(fileobj=io.BytesIO(store.get("train/shard-000001.tar"))) as tar:
        assert tar.getnames()[:3] == [
            "000000004.input.npy",
            "000000004.target.npy",
            "000000005.input.npy",
        ]
    reader = ShardReader(store, "train")
    assert reader.num_samples == COUNT
    _assert_stream_equals(reader, images, labels)
    assert reader.samples(0, 1)[0].dtype == torch.float32 and labels.dtype == torch.int64


def test_streaming_fetches_one_shard_at_a_time(store):
    _write(store)
    counting = CountingStore(store)
    stream = iter(ShardReader(counting, "train"))
    for _ in range(PER_SHARD):
        next(stream)
    assert counting.fetched == ["train/index.json", "train/shard-000000.tar"]
    next(stream)
    assert counting.fetched[-1] == "train/shard-000001.tar" and len(counting.fetched) == 3


@pytest.mark.parametrize("start", [0, 3, 4, 9, 10, 25])
def test_resume_at_sample_k_skips_earlier_shards(store, start):
    images, labels = _write(store)
    counting = CountingStore(store)
    _assert_stream_equals(
        ShardReader(counting, "train").iter_from(start), images, labels, min(start, COUNT)
    )
    shards = [key for key in counting.fetched if key.endswith(".tar")]
    needed = range(start // PER_SHARD, 3) if start < COUNT else []  # past the end: fetch nothing
    assert shards == [f"train/shard-{n:06d}.tar" for n in needed]


def test_random_access_batches_match_and_wrap_into_the_next_epoch(store):
    images, labels = _write(store)
    reader = ShardReader(store, "train")
    batch_images, batch_labels = reader.samples(3, 4)  # crosses the first shard boundary
    assert torch.equal(batch_images, images[3:7]) and torch.equal(batch_labels, labels[3:7])
    wrapped_images, _ = reader.samples(COUNT - 1, 3)  # samples 9, 0, 1
    assert torch.equal(wrapped_images, torch.stack([images[9], images[0], images[1]]))


def test_shards_without_an_index_still_stream_in_name_order(store):
    images, labels = _write(store)
    store.delete(f"train/{INDEX_NAME}")
    reader = ShardReader(store, "train")
    _assert_stream_equals(reader.iter_from(5), images, labels, 5)
    with pytest.raises(ShardError, match="random access needs .*index.json"):
        reader.samples(0, 1)
    with pytest.raises(ShardError, match="counting samples needs .*index.json"):
        _ = reader.num_samples


def test_a_garbage_shard_is_named(store):
    _write(store)
    store.put("train/shard-000001.tar", b"this is not a tar archive" * 40)
    stream = ShardReader(store, "train").iter_from(0)
    got = [next(stream) for _ in range(PER_SHARD)]  # the first shard is fine
    assert len(got) == PER_SHARD
    with pytest.raises(ShardError, match=r"shard-000001\.tar is corrupt"):
        next(stream)


@pytest.mark.parametrize("with_index", [True, False], ids=["index", "no-index"])
@pytest.mark.parametrize("keep_fraction", [0.05, 0.3, 0.6, 0.9, 0.99])
def test_a_truncated_shard_is_named(store, keep_fraction, with_index):
    _write(store)
    if not with_index:  # the archive alone must give the cut away, not the sample count
        store.delete(f"train/{INDEX_NAME}")
    whole = store.get("train/shard-000000.tar")
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        last = tar.getmembers()[-1]
    content_bytes = last.offset_data + last.size  # tar pads the end with zeros; cut before that
    store.put("train/shard-000000.tar", whole[: int(content_bytes * keep_fraction)])
    with pytest.raises(ShardError, match=r"shard-000000\.tar"):
        list(ShardReader(store, "train"))


def test_a_shard_cut_between_samples_disagrees_with_the_index(store):
    images, labels = _synthetic()
    write_shards(zip(images, labels, strict=True), store, "train", PER_SHARD)
    short = encode_shard([(k, (images[k], labels[k])) for k in range(PER_SHARD - 1)])
    store.put("train/shard-000000.tar", short)
    with pytest.raises(
        ShardError, match=r"shard-000000\.tar holds 3 samples but index.json says 4"
    ):
        ShardReader(store, "train").samples(0, 1)


def test_a_sample_missing_its_target_is_named(store):
    _write(store)
    buffer = io.BytesIO()
    whole = store.get("train/shard-000002.tar")
    with (
        tarfile.open(fileobj=io.BytesIO(whole)) as source,
        tarfile.open(fileobj=buffer, mode="w") as target,
    ):
        for member in source.getmembers():
            if member.name != "000000009.target.npy":
                target.addfile(member, source.extractfile(member))
    store.put("train/shard-000002.tar", buffer.getvalue())
    with pytest.raises(ShardError, match=r"shard-000002\.tar: sample '000000009' has no target"):
        list(ShardReader(store, "train").iter_from(8))


def test_a_bad_index_and_an_empty_prefix_say_what_to_do(store):
    _write(store)
    store.put(f"train/{INDEX_NAME}", json.dumps({"format": "other"}).encode())
    with pytest.raises(ShardError, match="index.json is not a shard index.*delete index.json"):
        ShardReader(store, "train")
    with pytest.raises(ShardError, match="no shards under .*nothing-here"):
        ShardReader(store, "nothing-here")
