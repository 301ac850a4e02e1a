"""Built-in CNN layers and synthetic images: shapes match specs.py, a split anywhere computes the same
function, the same seed gives the same weights, sample k depends on the seed and k only, and the
tiny CNN learns the synthetic images in a few steps on one CPU thread."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from runtime.data.images import SyntheticImages  # noqa: E402
from runtime.models.cnn import build_layers, classification_loss  # noqa: E402
from runtime.models.specs import CnnSpec, model_spec  # noqa: E402

TINY = model_spec("cnn-tiny")
# a second shape, cheap to build: two stages, a narrower MLP, 16x16 images, more classes
SMALL = CnnSpec(
    name="cnn-small-test",
    description="",
    depths=(2, 1),
    widths=(8, 12),
    image_size=16,
    num_classes=7,
    mlp_ratio=2,
)


def _images(count: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", [TINY, SMALL], ids=lambda spec: spec.name)
def test_parameter_counts_match_the_spec(spec):
    layers = build_layers(spec, seed=0)
    assert len(layers) == spec.num_layers
    assert [sum(p.numel() for p in layer.parameters()) for layer in layers] == list(
        spec.layer_parameters()
    )
    logits = nn.Sequential(*layers)(_images(2, spec.image_size))
    assert logits.shape == (2, spec.num_classes)


@pytest.mark.parametrize("cut", range(1, TINY.num_layers))
def test_any_split_computes_the_same_function(cut):
    layers = build_layers(TINY, seed=3)
    images = _images(2, TINY.image_size)
    whole = nn.Sequential(*layers)(images)
    first, second = nn.Sequential(*layers[:cut]), nn.Sequential(*layers[cut:])
    between = first(images)
    assert between.dim() == 4 and between.shape[0] == 2  # feature maps cross the cut
    assert torch.equal(second(between), whole)


def test_same_seed_same_weights_other_seed_other_weights_global_generator_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = (build_layers(TINY, seed=s) for s in (7, 7, 8))
    assert torch.rand(1).item() == before.item()
    pairs = zip(nn.Sequential(*a).parameters(), nn.Sequential(*b).parameters(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)
    stem_a, stem_c = a[0].conv.weight, c[0].conv.weight
    assert not torch.equal(stem_a, stem_c)


def test_image_sizes_the_stages_cannot_divide_are_refused():
    odd = CnnSpec(
        name="odd", description="", depths=(1, 1), widths=(4, 8), image_size=20, num_classes=3
    )
    with pytest.raises(ValueError, match="image_size 20 must be a multiple of 8"):
        build_layers(odd, seed=0)


def test_classification_loss_is_mean_cross_entropy():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]])
    expected = (math.log(4) + (math.log(math.exp(10) + 3) - 10)) / 2
    assert classification_loss(logits, torch.tensor([2, 0])).item() == pytest.approx(expected)


def test_synthetic_samples_depend_on_seed_and_index_only():
    data = SyntheticImages(10, 32, 5)
    images, labels = data.samples(10, 4)
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (4,) and labels.dtype == torch.int64
    assert 0 <= labels.min() and labels.max() < 10
    again, again_labels = SyntheticImages(10, 32, 5).samples(12, 1)  # a fresh object, one sample
    assert torch.equal(images[2], again[0]) and labels[2] == again_labels[0]
    assert not torch.equal(SyntheticImages(10, 32, 6).samples(10, 4)[0], images)
    assert not torch.equal(data.samples(11, 4)[0][:1], images[:1])


def test_synthetic_labels_cover_the_classes():
    labels = SyntheticImages(4, 8, 0).samples(0, 200)[1]
    assert set(labels.tolist()) == {0, 1, 2, 3}


def test_the_tiny_cnn_learns_synthetic_images_in_a_few_steps():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = _train(TINY, steps=12, batch=16)
    finally:
        torch.set_num_threads(threads)
    assert abs(losses[0] - math.log(TINY.num_classes)) < 0.3  # near a uniform guess at first
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0]


def _train(spec: CnnSpec, *, steps: int, batch: int) -> list[float]:
    model = nn.Sequential(*build_layers(spec, seed=0))
    data = SyntheticImages(spec.num_classes, spec.image_size, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        images, labels = data.samples(step * batch, batch)
        loss = classification_loss(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
