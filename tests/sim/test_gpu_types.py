"""GPU types for a heterogeneous simulation: the bundled speed table and an application's
step time on another type (its compute faster or slower, its all-reduce as measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcorch.sim.gputypes import REFERENCE_TYPE, apps_on, load_speeds
from hpcorch.sim.traces import AppTrace, TraceError


def test_the_bundled_table_covers_every_application_on_every_type(
    apps: dict[str, AppTrace],
) -> None:
    speeds = load_speeds()
    assert set(speeds) == {"t4", "rtx2080ti", "v100", "a100"}
    for table in speeds.values():
        assert set(table) == set(apps)
    assert set(speeds[REFERENCE_TYPE].values()) == {1.0}
    # as derived in docs/research/gpu-speed-factors.md (relative to the T4)
    assert speeds["a100"]["cifar10"] == 6.30 and speeds["v100"]["imagenet"] == 2.50
    assert speeds["rtx2080ti"]["yolov3"] < 1  # host-bound there: slower than the T4 trace


def test_a_faster_gpu_shortens_compute_not_the_all_reduce(apps: dict[str, AppTrace]) -> None:
    speeds = load_speeds()
    base = apps["cifar10"]
    a100 = apps_on(apps, "a100", speeds)["cifar10"]
    t4 = apps_on(apps, "t4", speeds)["cifar10"]
    for placement, micro in (((1,), 128), ((2, 2), 256), ((4, 4, 4), 64)):
        st, sy = base.step_time(placement, micro)
        fast_st, fast_sy = a100.step_time(placement, micro)
        assert fast_sy == pytest.approx(sy)
        assert fast_st == pytest.approx(sy + (st - sy) / 6.30)
        assert t4.step_time(placement, micro) == pytest.approx((st, sy))
    assert base.speed == 1.0 and a100.speed == 6.30  # the original is left as it was


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("type,app,speed,basis\nt4,x,1,reference\na100,x,0,measured\n", "a speed in [0.01, 100]"),
        ("type,app,speed,basis\nt4,x,1,reference\na100,x,2,guess\n", "basis 'guess' (valid:"),
        ("type,app,speed,basis\nt4,x,1,reference\nt4,x,1,reference\n", "t4/x given twice"),
        ("type,app,speed,basis\nt4,x,1,reference\na100,y,2,measured\n", "the same applications"),
        ("type,app,speed,basis\nt4,x,2,reference\n", "must have factor 1"),
    ],
)
def test_a_bad_table_is_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "speed.csv"
    path.write_text(text)
    with pytest.raises(TraceError, match=None) as err:
        load_speeds(path)
    assert needle in str(err.value)


def test_an_unknown_type_names_the_valid_ones(apps: dict[str, AppTrace]) -> None:
    with pytest.raises(TraceError, match=r"unknown GPU type 'h100' \(valid: a100, rtx2080ti"):
        apps_on(apps, "h100", load_speeds())
    with pytest.raises(TraceError, match=r"in \[0.01, 100\]"):
        apps["bert"].on_gpu(0.0)
