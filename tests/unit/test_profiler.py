"""The profiler: measured per-layer figures of gpt-tiny, the profile file it writes, and its use by
``simulate``; user errors of ``profile`` exit 2 with a "To fix:" line and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from orchestrator.cli import main
from orchestrator.profiles.profile import load_profile_json
from runtime.models.specs import model_spec
from runtime.profiler import ProfilerConfig, profile_gpt

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "recipes" / "quickstart.yaml"
QUICKSTART_PLAN = REPO / "recipes" / "plans" / "quickstart.yaml"
FAST = ("--repeats", "2", "--warmup", "1")
SPEC = model_spec("gpt-tiny")


@pytest.fixture(scope="module")
def measurement():
    return profile_gpt(SPEC, ProfilerConfig(microbatch_sizes=(2, 1), repeats=2, warmup=1))


def _recipe(tmp_path: Path, *, profile: str = "auto", **replace: str) -> Path:
    text = QUICKSTART.read_text(encoding="utf-8").replace("profile: auto", f"profile: {profile}")
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_layer_has_positive_times_at_each_size(measurement):
    assert sorted(measurement.layers) == [1, 2]
    for layers in measurement.layers.values():
        assert len(layers) == SPEC.num_layers
        for layer in layers:
            assert layer.forward_s > 0 and layer.backward_s > 0 and layer.update_s > 0
    assert measurement.device_name == "cpu" and measurement.threads == 1


def test_parameters_match_the_spec(measurement):
    # the head's weight is the embedding's (tied): counted once, in the embedding, as the spec does
    assert measurement.params == SPEC.layer_parameters()


def test_activation_memory_grows_with_the_microbatch(measurement):
    one, two = measurement.layers[1], measurement.layers[2]
    for small, large in zip(one, two, strict=True):
        assert large.kept_bytes > small.kept_bytes > 0
    # blocks keep only per-sample tensors, so twice the samples keep exactly twice the bytes
    for index in range(1, SPEC.num_layers - 1):
        assert two[index].kept_bytes == 2 * one[index].kept_bytes
        # at least the inputs of its two norms: the block's input and the residual after attention
        assert one[index].kept_bytes >= 2 * SPEC.seq_len * SPEC.hidden_size * 4
    hidden = SPEC.seq_len * SPEC.hidden_size
    assert [t.out_elements for t in two] == [2 * hidden] * (SPEC.num_layers - 1) + [0]
    # the head keeps the loss's log-probabilities: one float per token and vocabulary entry
    assert one[-1].kept_bytes >= SPEC.seq_len * SPEC.vocab_size * 4


def test_profiling_leaves_torch_threads_as_they_were():
    before = torch.get_num_threads()
    profile_gpt(SPEC, ProfilerConfig(microbatch_sizes=(1,), repeats=1, warmup=0, threads=1))
    assert torch.get_num_threads() == before


def test_profile_file_loads_and_simulate_uses_it(tmp_path, capsys):
    output = tmp_path / "gpt-tiny-t4.json"
    recipe = _recipe(tmp_path)
    code = main(["profile", str(recipe), "-o", str(output), "--microbatch-sizes", "1,2", *FAST])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "block 3" in printed and "fwd_ms" in printed

    profile = load_profile_json(output)
    t4 = profile.gpu("T4")  # the local market's only GPU: the CPU slot stands in for it
    assert t4.source == "measured" and "standing in for T4" in t4.origin
    assert profile.layer_table(1).params == SPEC.layer_parameters()
    assert profile.precision == "fp32" and profile.optimizer == "adamw"
    for mbs in (1, 2):
        table = profile.time_table("T4", mbs, 1)
        assert table.scaled_from_mbs is None
        assert all(t > 0 for t in table.forward_s + table.backward_s + table.update_s)
    assert json.loads(output.read_text())["measurement"]["device"] == "cpu"

    measured = _recipe(tmp_path, profile=output.name)
    code = main(["simulate", str(measured), "--plan", str(QUICKSTART_PLAN), "--json"])
    estimate = json.loads(capsys.readouterr().out)
    assert code == 0
    assert estimate["profile_source"] == "measured"
    assert estimate["profile_sources"] == {"T4": "measured"}
    assert estimate["iteration_time_s"] > 0


def test_json_output_lists_every_layer_at_every_size(tmp_path, capsys):
    output = tmp_path / "p.json"
    argv = ["profile", str(_recipe(tmp_path)), "-o", str(output), "--gpu", "a100", "--json"]
    assert main([*argv, "--microbatch-sizes", "3", *FAST]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["gpu"] == "A100" and document["source"] == "measured"
    assert [(r["microbatch_size"], r["layer"]) for r in document["layers"]] == [
        (3, i) for i in range(SPEC.num_layers)
    ]
    assert load_profile_json(output).gpu("A100").microbatch_sizes(1) == (3,)


@pytest.mark.parametrize(
    ("extra", "replace", "message"),
    [
        (("--microbatch-sizes", "1,x"), {}, "--microbatch-sizes '1,x'"),
        (("--microbatch-sizes", "0"), {}, "--microbatch-sizes '0'"),
        (("--repeats", "0"), {}, "--repeats 0 is below 1"),
        (("--gpu", "Z9000"), {}, "unknown GPU 'Z9000'"),
        ((), {"precision: fp32": "precision: fp16-mixed"}, "the profiler measures fp32 only"),
        (
            (),
            {
                "gpu_types: [T4]": "gpu_types: [T4, A100]",
                "provider: local": "provider: gcp",
                "locations:\n    - local/sim-us/sim-us-a\n    - local/sim-us/sim-us-b\n"
                "    - local/sim-eu/sim-eu-a": "locations: []",
                "preempt_at_steps: [60]": "preempt_at_steps: []",  # the local cloud's only
            },
            "several GPU types",
        ),
    ],
)
def test_user_errors_exit_2_with_a_fix(tmp_path, capsys, extra, replace, message):
    recipe = _recipe(tmp_path, **replace)
    output = tmp_path / "never.json"
    assert main(["profile", str(recipe), "-o", str(output), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "To fix:" in err
    assert not output.exists()


def test_a_cnn_is_refused_without_traceback():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "profile",
            "recipes/erben-convnext-large-t4-4continents.yaml",
            "-o",
            "never.json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "measures language models" in result.stderr and "To fix:" in result.stderr
    assert not (REPO / "never.json").exists()


def test_layers_timed_in_one_graph_add_up_to_a_whole_pass() -> None:
    """The in-place stamps split one pass: each layer gets a positive share (no hook missed) and
    their sum fits inside the pass (none counted twice). No ratio of wall-clock times is asserted:
    on a loaded machine any share of the pass may go to another process."""
    from runtime.models.gpt import build_layers, next_token_loss
    from runtime.profiler import _chained_pass, _Clock

    torch.manual_seed(0)
    layers = build_layers(SPEC, seed=0)
    ids = torch.randint(0, SPEC.vocab_size, (2, SPEC.seq_len + 1))
    clock = _Clock(torch.device("cpu"))
    started = time.perf_counter()
    times = _chained_pass(layers, ids[:, :-1], ids[:, 1:], next_token_loss, clock)
    elapsed = time.perf_counter() - started
    assert len(times) == len(layers)
    assert all(f > 0 and b > 0 for f, b in times)
    total = sum(f + b for f, b in times)
    assert total <= elapsed


def test_profile_measures_the_model_split_too_when_asked(tmp_path, capsys):
    """``--tp 2``: the model split over two processes (gloo here), as a TP-2 stage's workers hold
    it: a worker's blocks hold half the split weights; the split sizes sit under TP 2."""
    output = tmp_path / "split.json"
    recipe = _recipe(tmp_path)
    code = main(
        ["profile", str(recipe), "-o", str(output), "--microbatch-sizes", "1", "--tp", "2", *FAST]
    )
    assert code == 0, capsys.readouterr().out
    profile = load_profile_json(output)
    whole, split = profile.layer_table(1).params, profile.layer_table(2).params
    assert split[0] == whole[0] and split[-1] == whole[-1]  # embedding and head stay whole
    assert all(whole[i] / 2 < split[i] < whole[i] for i in range(1, SPEC.num_layers - 1))
    assert profile.time_table("T4", 1, 2).scaled_from_mbs is None
    assert main(["profile", str(recipe), "-o", str(output), "--tp", "3"]) == 2  # 4 heads
    assert "does not split 3 ways" in capsys.readouterr().err
