"""The shared batch planner."""

from __future__ import annotations

import itertools

import pytest

from hpcorch.planner import BatchPlanError, plan_batch


@pytest.mark.parametrize(
    ("batch", "gpus", "max_micro", "expected"),
    [(64, 2, 64, (32, 1)), (64, 4, 8, (8, 2)), (256, 4, 32, (32, 2)), (100, 3, 16, (11, 3))],
)
def test_known_splits(batch: int, gpus: int, max_micro: int, expected: tuple[int, int]) -> None:
    plan = plan_batch(batch, gpus, max_micro)
    assert (plan.micro_batch, plan.accum_steps) == expected


def test_bounds_hold_everywhere() -> None:
    for batch, gpus, max_micro in itertools.product(range(1, 300, 7), range(1, 17), (1, 4, 32)):
        if batch < gpus:
            with pytest.raises(BatchPlanError):
                plan_batch(batch, gpus, max_micro)
            continue
        plan = plan_batch(batch, gpus, max_micro)
        assert 1 <= plan.micro_batch <= max_micro
        assert plan.global_batch <= batch
        # the fewest accumulation steps that respect the memory bound, for the samples kept
        fewest = -(-(batch // gpus) // max_micro)
        assert plan.accum_steps == -(-(plan.micro_batch * plan.accum_steps) // max_micro)
        assert plan.accum_steps <= fewest
        if batch % (gpus * fewest) == 0:
            assert plan.global_batch == batch
        # planning the effective batch again gives the same split: what a policy plans is
        # what the runtime runs
        assert plan_batch(plan.global_batch, gpus, max_micro) == plan


def test_same_inputs_same_plan() -> None:
    assert plan_batch(512, 8, 48) == plan_batch(512, 8, 48)
    assert plan_batch(512, 8, 48).describe() == "512 = 32 x 2 x 8"


@pytest.mark.parametrize(("args"), [(8, 0, 4), (8, 2, 0), (1, 2, 4)])
def test_invalid(args: tuple[int, int, int]) -> None:
    with pytest.raises(BatchPlanError):
        plan_batch(*args)
