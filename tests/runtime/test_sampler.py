"""The elastic data order: exact resume at any world size, correct gradient weights."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from hpcorch.planner import plan_batch
from hpcorch.runtime.sampler import ElasticSampler


def consumed(
    sampler: ElasticSampler,
    epoch: int,
    offset: int,
    global_batch: int,
    world: int,
    max_micro: int,
    steps: int | None = None,
) -> tuple[list[int], int]:
    """Samples all ranks process from ``offset`` (for ``steps`` steps), and the new offset."""
    plan = plan_batch(global_batch, world, max_micro)
    per_rank = [list(sampler.steps(epoch, offset, plan, r)) for r in range(world)]
    n = len(per_rank[0]) if steps is None else steps
    seen = [
        i
        for r in range(world)
        for lay in per_rank[r][:n]
        for mb in lay.micro
        if mb.real
        for i in mb.indices
    ]
    end = per_rank[0][n - 1].offset + per_rank[0][n - 1].size if n else offset
    return seen, end


@pytest.mark.parametrize(
    "schedule",
    [
        [(64, 2, 16, 5), (64, 4, 16, None)],  # resize 2 -> 4, same global batch
        [(48, 3, 8, 3), (100, 1, 30, 2), (20, 4, 5, None)],  # three sizes and batches
        [(7, 2, 4, 4), (9, 3, 2, None)],  # uneven splits and short last steps
    ],
)
def test_every_sample_exactly_once_across_resizes(schedule: list[tuple]) -> None:
    sampler = ElasticSampler(1000, seed=3)
    offset, seen = 0, Counter[int]()
    for global_batch, world, micro, steps in schedule:
        got, offset = consumed(sampler, 0, offset, global_batch, world, micro, steps)
        seen.update(got)
    assert offset == 1000
    assert seen == Counter(range(1000))


def test_order_does_not_depend_on_world_size() -> None:
    s = ElasticSampler(257, seed=1)

    def step_sets(world: int, micro: int) -> list[set[int]]:
        plan = plan_batch(32, world, micro)
        per_rank = [list(s.steps(2, 0, plan, r)) for r in range(world)]
        return [
            {i for r in range(world) for mb in per_rank[r][k].micro if mb.real for i in mb.indices}
            for k in range(len(per_rank[0]))
        ]

    assert step_sets(1, 32) == step_sets(4, 8) == step_sets(2, 4)
    assert s.permutation(2).tolist() != s.permutation(3).tolist()


@pytest.mark.parametrize(
    ("n", "g", "world", "micro"), [(100, 32, 4, 4), (10, 8, 4, 1), (5, 8, 4, 8)]
)
def test_weights_make_ddp_average_the_mean_over_the_step(
    n: int, g: int, world: int, micro: int
) -> None:
    """DDP averages over ranks; loss means over a micro-batch: each sample must weigh 1/size."""
    plan = plan_batch(g, world, micro)
    layouts = [list(ElasticSampler(n, 0).steps(0, 0, plan, r)) for r in range(world)]
    for step in range(len(layouts[0])):
        size = layouts[0][step].size
        total = Fraction(0)
        synced = set()
        for r in range(world):
            lay = layouts[r][step]
            synced.add(len(lay.micro) > 0)
            for mb in lay.micro:
                if mb.real:
                    per_sample = Fraction(mb.weight).limit_denominator(10**6) / (
                        len(mb.indices) * world
                    )
                    assert per_sample == Fraction(1, size)
                    total += per_sample * len(mb.indices)
                else:
                    assert mb.weight == 0.0  # placeholder: takes part in the all-reduce only
        assert total == 1
        assert synced == {True}  # every rank has at least one pass, so DDP stays in step


def test_full_steps_weight_is_one_over_accumulation() -> None:
    plan = plan_batch(64, 2, 8)  # 8 x 4 x 2
    lay = next(ElasticSampler(640, 0).steps(0, 0, plan, 1))
    assert lay.full and [mb.weight for mb in lay.micro] == [0.25] * 4


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        ElasticSampler(0)
    with pytest.raises(ValueError, match="offset"):
        next(ElasticSampler(10).steps(0, 11, plan_batch(4, 1, 4), 0))
