"""Which samples each rank trains in each step of a training-library job
(hpcorch/integrations/layout.py): the stated exactness bound, checked over many shapes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcorch.integrations.layout import StepSpan, count_steps, spans, split
from hpcorch.planner import BatchPlan
from hpcorch.runtime.sampler import ElasticSampler


def all_ranks(
    order: ElasticSampler, start: tuple[int, int], plan: BatchPlan, **kw: Any
) -> list[tuple[StepSpan, ...]]:
    """Every rank's steps side by side: [(span of rank 0, ..., span of rank W-1), ...]."""
    per_rank = [list(spans(order, start, plan, r, first_index=0, **kw)) for r in range(plan.gpus)]
    assert len({len(s) for s in per_rank}) == 1
    return list(zip(*per_rank, strict=True))


def test_a_full_step_gives_each_rank_its_contiguous_block() -> None:
    plan = BatchPlan(2, 3, 2)  # 12 = 3 x 2 x 2
    chunk = np.arange(100, 112)
    micro, own, repeats = split(chunk, plan, 1)
    assert micro == ((106, 107, 108), (109, 110, 111)) and own == 6 and repeats == 0


def test_a_short_step_gives_every_rank_the_same_number_of_micro_batches() -> None:
    plan = BatchPlan(4, 4, 2)  # 32 = 4 x 2 x 4
    chunk = np.arange(10)  # c = ceil(10 / 16) = 1; shares 3, 3, 2, 2
    got = [split(chunk, plan, r) for r in range(4)]
    assert [m for m, _, _ in got] == [((0, 1, 2),), ((3, 4, 5),), ((6, 7),), ((8, 9),)]
    assert {r for _, _, r in got} == {0}


def test_fewer_samples_than_ranks_repeat_at_most_w_minus_1() -> None:
    plan = BatchPlan(4, 8, 1)
    chunk = np.array([7, 9])
    got = [split(chunk, plan, r) for r in range(4)]
    assert [m for m, _, _ in got] == [((7,),), ((9,),), ((7,),), ((9,),)]
    assert got[0][2] == 2 and [own for _, own, _ in got] == [1, 1, 0, 0]


@settings(max_examples=300, deadline=None)
@given(
    n_data=st.integers(1, 60),
    world=st.integers(1, 5),
    micro=st.integers(1, 6),
    accum=st.integers(1, 3),
    epochs=st.integers(1, 3),
    start=st.integers(0, 10**6),
    shuffle=st.booleans(),
)
def test_the_stream_trains_each_sample_once_per_epoch(
    n_data: int, world: int, micro: int, accum: int, epochs: int, start: int, shuffle: bool
) -> None:
    """From any position: the rest of every epoch once, each step full but the job's last,
    which repeats at most W - 1 samples; every rank the same micro-batches per step."""
    order = ElasticSampler(n_data, 3, shuffle)
    plan = BatchPlan(world, micro, accum)
    total = epochs * n_data
    begin = start % (total + 1)
    pos = divmod(begin, n_data)
    steps = all_ranks(order, pos, plan, total=total)
    assert len(steps) == count_steps(n_data, pos, plan.global_batch, total)
    seen: Counter[int] = Counter()
    for i, step in enumerate(steps):
        assert len({len(s.micro) for s in step}) == 1  # the library counts micro-batches
        assert all(0 < len(mb) <= micro for s in step for mb in s.micro)
        last = i == len(steps) - 1
        if not last:
            assert step[0].size == plan.global_batch and len(step[0].micro) == accum
        assert step[0].repeats <= world - 1
        trained = [x for s in step for mb in s.micro for x in mb]
        assert len(trained) == step[0].size + step[0].repeats
        seen.update(trained)
    expected: Counter[int] = Counter()
    e, o = pos
    for epoch in range(e, epochs):
        expected.update(order.permutation(epoch)[o if epoch == e else 0 :].tolist())
    extra = seen - expected
    assert not expected - seen  # nothing skipped
    assert sum(extra.values()) == (steps[-1][0].repeats if steps else 0)
    assert sum(extra.values()) <= world - 1


@settings(max_examples=200, deadline=None)
@given(
    n_data=st.integers(1, 60),
    world=st.integers(1, 5),
    micro=st.integers(1, 6),
    accum=st.integers(1, 3),
    offset=st.integers(0, 59),
)
def test_an_epoch_from_its_offset_to_its_end(
    n_data: int, world: int, micro: int, accum: int, offset: int
) -> None:
    """A library that counts epochs itself: the steps of one epoch from where it stands,
    the last short, at most W - 1 samples repeated, the position after it the next epoch."""
    order = ElasticSampler(n_data, 5)
    plan = BatchPlan(world, micro, accum)
    offset %= n_data
    steps = all_ranks(order, (2, offset), plan, epoch_end=True)
    trained = Counter(x for step in steps for s in step for mb in s.micro for x in mb)
    want = Counter(order.permutation(2)[offset:].tolist())
    assert not want - trained
    assert sum((trained - want).values()) <= world - 1
    assert steps[-1][0].end == (3, 0)
    assert all(step[0].size == plan.global_batch for step in steps[:-1])


def test_steps_are_numbered_and_positioned() -> None:
    order = ElasticSampler(10, 0)
    got = list(spans(order, (0, 4), BatchPlan(1, 4, 1), 0, first_index=7, total=20))
    assert [(s.index, s.start, s.end, s.size) for s in got] == [
        (7, (0, 4), (0, 8), 4),
        (8, (0, 8), (1, 2), 4),  # the end of epoch 0 and the start of epoch 1
        (9, (1, 2), (1, 6), 4),
        (10, (1, 6), (2, 0), 4),
    ]


def test_a_step_larger_than_its_batch_is_refused() -> None:
    with pytest.raises(ValueError):
        split(np.arange(9), BatchPlan(1, 4, 2), 0)
