"""The analytic profile estimate: per-GPU efficiencies, backward factor, the optimizer step, and how
configs/simulator.yaml's analytic section is read."""

from __future__ import annotations

import re
import shutil

import pytest

from orchestrator.catalog import Catalog, default_catalog
from orchestrator.catalog.catalog import PACKAGED_CONFIGS_DIR
from orchestrator.errors import CatalogError, UserError
from orchestrator.profiles import analytic_settings
from orchestrator.profiles.analytic import (
    UPDATE_BYTES_PER_PARAM,
    AnalyticSettings,
    PerGpu,
    analytic_profile,
    update_seconds,
)
from runtime.models.specs import model_spec

GPUS = default_catalog().gpus


def make(
    ce=0.5, me=0.5, *, overhead=0.0, elementwise=10.0, backward=2.0, update=None
) -> AnalyticSettings:
    return AnalyticSettings(
        compute_efficiency=ce,
        memory_efficiency=me,
        layer_overhead_s=overhead,
        elementwise_bytes_per_token_hidden=elementwise,
        backward_factor=backward,
        update_memory_efficiency=update,
        source="test",
    )


def profile(
    settings, *, gpus=("A100",), model="opt-350m", precision="fp16-mixed", mbs=(1, 2, 4), tps=(1,)
):
    return analytic_profile(
        model_spec(model),
        [GPUS.get(g) for g in gpus],
        precision=precision,
        optimizer="adam",
        microbatch_sizes=mbs,
        tp_degrees=tps,
        settings=settings,
    )


def times(prof, gpu="A100", mbs=1, tp=1):
    return prof.time_table(gpu, mbs, tp)


# ---------------------------------------------------------------------------------------------
# Per-GPU efficiencies


def test_per_gpu_efficiency_applies_to_its_gpu_and_default_to_the_others():
    per_gpu = make(ce={"default": 0.2, "A100": 0.8}, me={"default": 0.3, "V100": 0.6})
    assert per_gpu.compute_for("A100") == 0.8 and per_gpu.compute_for("V100") == 0.2
    assert per_gpu.memory_for("V100") == 0.6 and per_gpu.memory_for("A100") == 0.3
    assert per_gpu.compute_for(GPUS.get("A100")) == 0.8  # a GpuSpec works too

    mixed = profile(per_gpu, gpus=("A100", "V100", "H100"))
    for gpu, ce, me in (("A100", 0.8, 0.3), ("V100", 0.2, 0.6), ("H100", 0.2, 0.3)):
        alone = profile(make(ce=ce, me=me), gpus=(gpu,))
        assert times(mixed, gpu) == times(alone, gpu), gpu


def test_a_higher_compute_efficiency_on_one_gpu_makes_only_that_gpu_faster():
    base = profile(make(ce=0.3), gpus=("A100", "V100"))
    faster = profile(make(ce={"default": 0.3, "A100": 0.6}), gpus=("A100", "V100"))
    assert sum(times(faster, "A100").forward_s) < sum(times(base, "A100").forward_s)
    assert times(faster, "V100") == times(base, "V100")


def test_a_plain_number_means_every_gpu():
    settings = make(ce=0.4, me=0.2)
    assert settings.compute_efficiency == PerGpu(0.4)
    assert {settings.compute_for(g) for g in ("A100", "V100", "L4")} == {0.4}
    assert settings.compute_efficiency.as_plain() == 0.4
    assert make(ce={"default": 0.4, "A100": 0.5}).compute_efficiency.as_plain() == {
        "default": 0.4,
        "A100": 0.5,
    }


def test_a_mapping_without_default_is_refused():
    with pytest.raises(ValueError, match="default"):
        make(ce={"A100": 0.5})


# ---------------------------------------------------------------------------------------------
# Shape of the estimate


def test_times_grow_with_the_microbatch_size():
    prof = profile(make(overhead=1e-4), mbs=(1, 2, 4, 8))
    for pass_ in ("forward_s", "backward_s"):
        totals = [sum(getattr(times(prof, mbs=m), pass_)) for m in (1, 2, 4, 8)]
        assert totals == sorted(totals) and len(set(totals)) == 4


def test_fp32_is_slower_than_fp16_mixed_on_a100():
    fp16 = profile(make(), precision="fp16-mixed")
    fp32 = profile(make(), precision="fp32")
    assert sum(times(fp32).forward_s) > 3 * sum(times(fp16).forward_s)
    assert sum(times(fp32).backward_s) > 3 * sum(times(fp16).backward_s)


def test_backward_over_forward_is_the_backward_factor_without_overhead_or_tp():
    for factor in (2.0, 2.6):
        prof = profile(make(overhead=0.0, backward=factor))
        table = times(prof)
        for f, b in zip(table.forward_s, table.backward_s, strict=True):
            assert b == pytest.approx(factor * f, rel=1e-12)


def test_overhead_is_added_once_per_layer_and_pass():
    without = times(profile(make(overhead=0.0)))
    with_ = times(profile(make(overhead=1e-3)))
    for a, b in zip(
        without.forward_s + without.backward_s, with_.forward_s + with_.backward_s, strict=True
    ):
        assert b - a == pytest.approx(1e-3)


def test_tensor_parallelism_adds_all_reduce_time():
    prof = profile(make(), tps=(1, 2))
    one, two = times(prof, tp=1), times(prof, tp=2)
    block = 1
    # Half the work per GPU, plus the all-reduces: more than half the TP=1 time.
    assert one.forward_s[block] / 2 < two.forward_s[block] < one.forward_s[block]


def test_analytic_profiles_are_marked_estimated():
    prof = profile(make(), gpus=("A100", "V100"))
    assert {g.source for g in prof.gpus.values()} == {"estimated"}
    assert all("analytic estimate (test)" in g.origin for g in prof.gpus.values())


def test_a_cnn_profile_offers_only_tp_1():
    prof = profile(make(), model="cnn-tiny", tps=(1, 2, 4))
    assert set(prof.layers) == {1}
    assert prof.gpu("A100").tp_degrees() == (1,)
    with pytest.raises(UserError):
        prof.time_table("A100", 1, 2)


def test_a_precision_the_gpu_lacks_is_a_user_error():
    with pytest.raises(UserError, match="bf16"):
        profile(make(), gpus=("V100",), precision="bf16-mixed")


# ---------------------------------------------------------------------------------------------
# The optimizer step


def test_update_seconds_uses_update_memory_efficiency_not_memory_efficiency():
    a100 = GPUS.get("A100")
    params = 1e8
    touched = UPDATE_BYTES_PER_PARAM[("adam", "mixed")] * params

    def step(settings):
        return update_seconds(
            a100, params, optimizer="adam", precision="fp16-mixed", settings=settings
        )

    assert step(make(me=0.1, update=0.5)) == pytest.approx(
        touched / (a100.memory_bandwidth_gb_per_s * 1e9 * 0.5)
    )
    assert step(make(me=0.1, update=0.5)) == step(make(me=0.9, update=0.5))
    assert step(make(update={"default": 0.25, "A100": 0.5})) == step(make(update=0.5))
    # Settings written before the split: the step falls back to the GPU's memory_efficiency.
    assert step(make(me={"default": 0.1, "A100": 0.5})) == step(make(update=0.5))


def test_profile_update_times_follow_parameters_and_update_efficiency():
    slow, fast = profile(make(update=0.25)), profile(make(update=0.5))
    assert times(slow).update_s == pytest.approx([2 * u for u in times(fast).update_s])
    params = slow.layer_table(1).params
    u = times(fast).update_s
    assert u[1] / u[0] == pytest.approx(params[1] / params[0])


# ---------------------------------------------------------------------------------------------
# configs/simulator.yaml


@pytest.fixture
def configs(tmp_path):
    folder = tmp_path / "configs"
    shutil.copytree(PACKAGED_CONFIGS_DIR, folder)
    return folder


def with_analytic(configs, body: str) -> Catalog:
    """Replace the analytic section of the copy's simulator.yaml by ``body`` (indented lines)."""
    path = configs / "simulator.yaml"
    text = path.read_text(encoding="utf-8")
    text, n = re.subn(r"\nanalytic:\n(?:[ #].*\n|\n(?=  ))*", "\nanalytic:\n" + body, text)
    assert n == 1
    path.write_text(text, encoding="utf-8")
    return Catalog(configs)


def line_of(configs, needle: str) -> int:
    lines = (configs / "simulator.yaml").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, start=1) if needle in line)


VALID = """\
  compute_efficiency:
    default: 0.4
    A100: 0.8
    V100: 0.12
  memory_efficiency: 0.3
  update_memory_efficiency: {default: 0.5, GH200: 0.6}
  backward_factor: 2.5
  layer_overhead_s: 0.0002
  elementwise_bytes_per_token_hidden: 10
  source: calibration
"""


def test_per_gpu_values_are_read_from_the_config(configs):
    settings = analytic_settings(with_analytic(configs, VALID))
    assert settings.compute_for("A100") == 0.8
    assert settings.compute_for("V100") == 0.12
    assert settings.compute_for("H100") == 0.4
    assert settings.memory_for("A100") == 0.3
    assert settings.update_memory_for("GH200") == 0.6
    assert settings.update_memory_for("A100") == 0.5
    assert settings.backward_factor == 2.5
    assert settings.layer_overhead_s == 0.0002


def test_an_alias_key_is_refused_with_file_and_line(configs):
    catalog = with_analytic(configs, VALID.replace("    V100: 0.12", "    A100-40: 0.12"))
    with pytest.raises(CatalogError) as caught:
        analytic_settings(catalog)
    error = caught.value
    assert error.file == "configs/simulator.yaml"
    assert error.line == line_of(configs, "A100-40: 0.12")
    assert "A100-40" in error.message and "alias of A100" in error.message
    assert "'A100'" in error.fix
    assert "configs/simulator.yaml:" in error.render()


def test_an_unknown_gpu_key_is_refused(configs):
    catalog = with_analytic(configs, VALID.replace("    V100: 0.12", "    V1000: 0.12"))
    with pytest.raises(CatalogError) as caught:
        analytic_settings(catalog)
    assert caught.value.line == line_of(configs, "V1000: 0.12")
    assert "not a GPU" in caught.value.message


def test_a_mapping_without_default_is_refused_in_the_config(configs):
    catalog = with_analytic(configs, VALID.replace("    default: 0.4\n", ""))
    with pytest.raises(CatalogError, match="default"):
        analytic_settings(catalog)


def test_an_efficiency_above_one_is_refused(configs):
    catalog = with_analytic(configs, VALID.replace("    A100: 0.8", "    A100: 1.8"))
    with pytest.raises(CatalogError, match="<= 1") as caught:
        analytic_settings(catalog)
    assert caught.value.line == line_of(configs, "A100: 1.8")


def test_a_misspelt_key_is_refused(configs):
    catalog = with_analytic(configs, VALID.replace("backward_factor", "backwards_factor"))
    with pytest.raises(CatalogError, match="backward_factor"):
        analytic_settings(catalog)


def test_an_old_style_section_still_loads(configs):
    old = """\
  compute_efficiency: 0.174
  memory_efficiency: 0.107
  layer_overhead_s: 0.0
  elementwise_bytes_per_token_hidden: 0.0
  source: calibration
"""
    settings = analytic_settings(with_analytic(configs, old))
    assert settings.compute_for("A100") == 0.174
    assert settings.backward_factor == 2.0
    assert settings.update_memory_for("A100") == 0.107


def test_the_packaged_config_keys_per_gpu_values_by_catalog_names():
    catalog = default_catalog()
    settings = analytic_settings(catalog)
    names = set(catalog.gpus.names())
    for factor in (
        settings.compute_efficiency,
        settings.memory_efficiency,
        settings.update_memory_efficiency,
    ):
        assert factor is not None
        assert {gpu for gpu, _ in factor.by_gpu} <= names
        assert all(0 < v <= 1 for _, v in factor.by_gpu) and 0 < factor.default <= 1
    assert settings.backward_factor > 0
