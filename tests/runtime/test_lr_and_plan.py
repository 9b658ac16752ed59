"""Pure parts shared with the controller: LR scaling rules, warm-up, bounds, plan files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcorch.planner import (
    LaunchPlan,
    PlanFileError,
    adascale_gain,
    clamp_global_batch,
    lr_scale,
    read_plan,
    warmup_factor,
    write_plan,
)


def test_linear_and_sqrt_rules() -> None:
    assert lr_scale("linear", 1024, 256) == 4.0
    assert lr_scale("sqrt", 1024, 256) == 2.0
    assert lr_scale("none", 1024, 256) == 1.0
    assert lr_scale("linear", 128, 256) == 0.5


def test_adascale_gain_between_one_and_linear() -> None:
    # no noise: a bigger batch gives nothing; pure noise: the linear rule
    assert adascale_gain(1024, 256, 0.0) == pytest.approx(1.0)
    assert adascale_gain(1024, 256, 1e12) == pytest.approx(4.0, rel=1e-6)
    for noise in (10.0, 256.0, 5000.0):
        g = adascale_gain(1024, 256, noise)
        assert 1.0 < g < 4.0
    # noise scale equal to the base batch: (B + b0) s / (B + b) = 512 * 4 / 1280
    assert adascale_gain(1024, 256, 256.0) == pytest.approx(1.6)


def test_adascale_falls_back_to_sqrt_without_estimate() -> None:
    assert lr_scale("adascale", 1024, 256, None) == 2.0
    assert lr_scale("adascale", 1024, 256, 256.0) == pytest.approx(1.6)


def test_unknown_rule_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: none, linear, sqrt, adascale"):
        lr_scale("cubic", 2, 1)


def test_warmup_ramps_linearly_then_holds() -> None:
    assert warmup_factor(1.0, 3.0, 0, 10) == 1.0
    assert warmup_factor(1.0, 3.0, 5, 10) == 2.0
    assert warmup_factor(1.0, 3.0, 10, 10) == 3.0
    assert warmup_factor(1.0, 3.0, 99, 0) == 3.0


def test_global_batch_bounds() -> None:
    assert clamp_global_batch(4096, 64, 1024) == 1024
    assert clamp_global_batch(16, 64, None) == 64
    assert clamp_global_batch(100, None, None) == 100
    with pytest.raises(ValueError, match="inverted"):
        clamp_global_batch(100, 200, 100)


def test_plan_round_trip(tmp_path: Path) -> None:
    plan = LaunchPlan(global_batch=512, gpus=4, max_micro_batch=64, job="j1", launch=3)
    write_plan(tmp_path / "plan.json", plan)
    assert read_plan(tmp_path / "plan.json") == plan
    assert plan.batch_plan().describe() == "512 = 64 x 2 x 4"
    assert not (tmp_path / "plan.json.tmp").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"global_batch": 5', "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"version": 9, "global_batch": 8, "gpus": 1, "max_micro_batch": 8}', "version 9"),
        ('{"version": 1, "gpus": 1, "max_micro_batch": 8}', "lacks the field 'global_batch'"),
        ('{"version": 1, "global_batch": "8", "gpus": 1, "max_micro_batch": 8}', "integer"),
        ('{"version": 1, "global_batch": 8, "gpus": 1, "max_micro_batch": 8, "x": 1}', "unknown"),
        ('{"version": 1, "global_batch": 2, "gpus": 4, "max_micro_batch": 8}', "smaller than"),
        (
            '{"version": 1, "global_batch": 8, "gpus": 1, "max_micro_batch": 8, '
            '"lr_scaling": "cubic"}',
            "valid: none, linear",
        ),
    ],
)
def test_bad_plan_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanFileError, match=message) as err:
        read_plan(path)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_plan_json_is_plain() -> None:
    raw = json.loads(LaunchPlan(global_batch=8, gpus=1, max_micro_batch=8).to_json())
    assert raw["version"] == 1 and math.isclose(raw["global_batch"], 8)
