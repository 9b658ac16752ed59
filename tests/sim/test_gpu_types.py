"""GPU types for a heterogeneous simulation: the bundled speed table and an application's
step time on another type (its compute faster or slower, its all-reduce as measured)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.cluster import Shape
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.gputypes import REFERENCE_TYPE, TypedPool, apps_on, load_speeds
from hpcorch.sim.slurm_side import SimSlurm, SimSlurmError
from hpcorch.sim.traces import AppTrace, TraceError
from hpcorch.sim.workload import WorkloadJob


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


def test_a_typed_pool_shows_types_and_runs_a_job_at_its_slowest_nodes_speed(
    apps: dict[str, AppTrace],
) -> None:
    jobs = [WorkloadJob(f"cifar10-{i}", 0.0, "cifar10", 1, 128) for i in range(3)]
    kinds = ("a100", "t4")
    side = SimSlurm(jobs, apps, (4, 4), ResizeCost(), typed=TypedPool(kinds, apps))
    side.advance(1)
    obs = side.observe()
    assert [n.gpu_type for n in obs.nodes] == ["a100", "t4"]
    a, b, c = (j.slurm_id for j in obs.jobs)
    with pytest.raises(SimSlurmError, match="gres gpu:a100"):
        side.start(a, Shape(1, 1, ("sim001",), gpu_type="a100"))
    side.start(a, Shape(1, 2, gpu_type="t4"))  # Slurm picks a node of the type
    side.start(b, Shape(1, 2, ("sim000",), gpu_type="a100"))
    side.start(c, Shape(2, 1, ("sim000", "sim001")))  # a launch across both types
    side.advance(1)
    speed = {j.slurm_id: j.model.app.speed for j in side.jobs}
    nodes = {j.slurm_id: j.node_names for j in side.observe().jobs}
    assert nodes[a] == ("sim001",) and speed[a] == 1.0
    assert speed[b] == load_speeds()["a100"]["cifar10"]
    assert speed[c] == 1.0  # every rank waits for the T4's


def test_simulate_takes_a_pool_of_gpu_types(small_workload: Path) -> None:
    def run(*args: str) -> tuple[int, str, str]:
        res = CliRunner().invoke(main, ["simulate", str(small_workload), "--nodes", "2", *args])
        return res.exit_code, res.stdout, res.stderr

    code, out, err = run("--gpu-types", "a100:1,t4:1", "--policy", "ones,gavel", "--json")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["policy"] for r in rows] == ["ones", "gavel"]
    code, plain, err = run("--gpu-types", "t4:2", "--policy", "ones", "--json")
    faster = json.loads(plain)["results"][0]["avg_jct"]
    assert code == 0 and rows[0]["avg_jct"] < faster  # half its GPUs are A100s
    for bad, needle in (
        ("a100:1", "1 nodes given, --nodes is 2"),
        ("h100:2", "no speed factors for h100 (valid: a100, rtx2080ti, t4, v100)"),
        ("a100", "'a100' is not TYPE:NODES"),
        ("a100:1,a100:1", "GPU type a100 is given twice"),
    ):
        code, _, err = run("--gpu-types", bad)
        assert code == 2 and needle in err and "Traceback" not in err, err
    code, _, err = run("--gpu-types", "a100:2", "--engine", "direct")
    assert code == 2 and "--gpu-types needs --engine controller" in err
