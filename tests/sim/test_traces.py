"""The trace-driven job models: exact at measured points, monotone where physics says."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import pytest

from hpcorch.sim.traces import AppTrace, normalize_placement

APPS = ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]


@pytest.mark.parametrize("name", APPS)
def test_step_time_exact_at_measured_placements(
    apps: dict[str, AppTrace], data_dir: Path, name: str
) -> None:
    app = apps[name]
    with (data_dir / "traces" / name / "placements.csv").open() as f:
        rows = list(csv.DictReader(f))[::7]
    for r in rows:
        placement = tuple(int(c) for c in r["placement"])
        st, sy = app.step_time(placement, int(r["local_bsz"]))
        assert st == pytest.approx(float(r["step_time"]), rel=1e-9)
        assert sy == pytest.approx(float(r["sync_time"]), rel=1e-9)


@pytest.mark.parametrize("name", ["cifar10", "imagenet"])
def test_step_time_exact_at_scalability_points(
    apps: dict[str, AppTrace], data_dir: Path, name: str
) -> None:
    app = apps[name]
    with (data_dir / "traces" / name / "scalability.csv").open() as f:
        rows = list(csv.DictReader(f))[::5]
    for r in rows:
        nodes, replicas = int(r["num_nodes"]), int(r["num_replicas"])
        # A placement with that many nodes and replicas that is not in placements.csv.
        base, extra = divmod(replicas, nodes)
        placement = tuple(base + (1 if i < extra else 0) for i in range(nodes))
        st, _ = app.step_time(placement, int(r["local_bsz"]))
        assert st == pytest.approx(float(r["step_time"]), rel=1e-6)


def test_placement_read_up_to_rotation(apps: dict[str, AppTrace]) -> None:
    app = apps["cifar10"]
    assert normalize_placement((3, 1)) == (1, 3)
    assert app.step_time((3, 1), 64) == app.step_time((1, 3), 64)
    assert app.step_time((0, 1, 0, 3), 64) == app.step_time((1, 3), 64)


# yolov3's single-GPU measurements are themselves not monotone (6 samples: 0.45 s, 8: 0.33 s).
@pytest.mark.parametrize("name", [a for a in APPS if a != "yolov3"])
def test_single_gpu_step_time_grows_with_batch(apps: dict[str, AppTrace], name: str) -> None:
    app = apps[name]
    sizes = np.linspace(app.min_micro, app.max_micro, 12).astype(int)
    times = [app.step_time((1,), int(b))[0] for b in sizes]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(times))


@pytest.mark.parametrize("name", APPS)
def test_gain_grows_with_batch_and_is_one_at_initial_batch(
    apps: dict[str, AppTrace], name: str
) -> None:
    app = apps[name]
    for epoch in (0, app.epochs // 2, app.epochs - 1):
        assert app.gain(app.init_batch, epoch) == pytest.approx(1.0)
        batches = np.geomspace(app.init_batch, app.max_batch, 9)
        g = [app.gain(b, epoch) for b in batches]
        assert all(x > 0 for x in g)


def test_accumulation_adds_compute_only(apps: dict[str, AppTrace]) -> None:
    app = apps["yolov3"]
    st, sy = app.step_time((4,), 8)
    assert app.iteration_time((4,), 8, 3) == pytest.approx(st + 2 * (st - sy))


def test_epoch_ends_are_increasing_and_end_at_last_epoch(apps: dict[str, AppTrace]) -> None:
    for app in apps.values():
        assert len(app.epoch_end) == app.epochs + 1
        assert np.all(np.diff(app.epoch_end) > 0)
    assert apps["bert"].epochs == 2 and apps["cifar10"].epochs == 100
    assert apps["yolov3"].max_micro == 8
