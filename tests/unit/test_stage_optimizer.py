"""The stages' optimizer (runtime/optim.py) steps as torch's own classes do, bit for bit, keeps
torch's state-dict layout both ways, and imports no ``torch._dynamo``."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.optim import OptimizerSettings, StageOptimizer
from runtime.reference import TrainConfig, make_optimizer

REPO = Path(__file__).resolve().parents[2]


def _params(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(6, 5), (5,), (3, 2, 4), (7,)]
    return [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]


def _grads(params, step: int, *, skip: int | None = None) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        p.grad = None if i == skip else torch.randn(p.shape, generator=generator)


CONFIGS = [
    TrainConfig(steps=1, global_batch_size=2, microbatch_size=1, learning_rate=3e-3, **extra)
    for extra in (
        {"optimizer": "adamw", "weight_decay": 0.01},
        {"optimizer": "adam", "weight_decay": 0.1},
        {"optimizer": "adam"},
        {"optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.01},
        {"optimizer": "sgd"},
    )
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.optimizer}-m{c.momentum}")
def test_steps_match_torchs_optimizer_bit_for_bit(config):
    ours, theirs = _params(1), _params(1)
    mine = StageOptimizer(ours, config.optimizer_settings())
    torchs = make_optimizer(theirs, config)
    for step in range(6):
        # a parameter without a gradient is left alone (and gets no state), as torch does
        skip = 2 if step < 3 else None
        _grads(ours, step, skip=skip)
        _grads(theirs, step, skip=skip)
        mine.step()
        torchs.step()
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
    assert all(torch.equal(x, y) for x, y in _state_tensors(mine, torchs))


def _state_tensors(mine: StageOptimizer, torchs):
    for i, (key, value) in enumerate(torchs.state_dict()["state"].items()):
        ours = mine.state_dict()["state"][key]
        assert set(ours) == set(value), i
        yield from ((ours[k], value[k]) for k in value)


@pytest.mark.parametrize("config", CONFIGS[:1] + CONFIGS[3:4], ids=["adamw", "sgd"])
def test_a_state_dict_loads_into_torchs_optimizer_and_back(config):
    start = _params(2)
    mine = StageOptimizer(start, config.optimizer_settings())
    for step in range(3):
        _grads(start, step)
        mine.step()
    # ours -> torch's: torch's class continues as ours does. Copies, as a checkpoint gives: both
    # classes hand out their live tensors and load without copying where nothing changes
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in start]
    torchs = make_optimizer(theirs, config)
    torchs.load_state_dict(copy.deepcopy(mine.state_dict()))
    # torch's -> a fresh one of ours
    again = [torch.nn.Parameter(p.detach().clone()) for p in start]
    resumed = StageOptimizer(again, config.optimizer_settings())
    resumed.load_state_dict(copy.deepcopy(torchs.state_dict()))
    for step in range(3, 6):
        for params, optimizer in ((start, mine), (theirs, torchs), (again, resumed)):
            _grads(params, step)
            optimizer.step()
    for a, b, c in zip(start, theirs, again, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_loading_moves_moments_to_the_parameters_dtype_and_keeps_steps_on_the_cpu():
    params = [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    optimizer = StageOptimizer(params, OptimizerSettings(kind="adam", lr=1e-3, weight_decay=0.0))
    document = {
        "state": {
            0: {"step": torch.tensor(4.0), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
        },
        "param_groups": [{"params": [0]}],
    }
    optimizer.load_state_dict(document)
    state = optimizer.state[params[0]]
    assert state["exp_avg"].dtype == torch.float64 and state["step"].dtype == torch.float32
    assert optimizer.state_dict()["state"][0]["step"].item() == 4.0


def test_a_state_for_another_parameter_count_is_refused():
    optimizer = StageOptimizer(_params(3), OptimizerSettings(kind="sgd", lr=1e-3, weight_decay=0.0))
    with pytest.raises(ValueError, match="3 parameters, this stage 4"):
        optimizer.load_state_dict({"state": {}, "param_groups": [{"params": [0, 1, 2]}]})


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("lr", float("nan"), "Invalid learning rate: nan"),
        ("weight_decay", -0.1, "Invalid weight_decay value: -0.1"),
        ("momentum", -1.0, "Invalid momentum value: -1.0"),
        ("betas", (0.9, 1.0), "Invalid beta parameter at index 1: 1.0"),
    ],
)
def test_a_bad_value_is_refused_in_torchs_words(field, value, says):
    settings = {"kind": "adamw", "lr": 1e-3, "weight_decay": 0.0, field: value}
    with pytest.raises(ValueError, match=re.escape(says)):
        OptimizerSettings(**settings)


def test_building_stepping_and_saving_import_no_dynamo():
    # the point of the class: a worker process does not pay torch._dynamo's import (~1 s of CPU)
    program = (
        "import sys, torch\n"
        "from runtime.optim import OptimizerSettings, StageOptimizer\n"
        "p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4)\n"
        "for kind in ('adamw', 'sgd'):\n"
        "    o = StageOptimizer([p], OptimizerSettings(kind=kind, lr=0.1, weight_decay=0.0, momentum=0.5))\n"
        "    o.step(); o.load_state_dict(o.state_dict()); o.step()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
