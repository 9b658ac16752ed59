"""``hpcorch report`` on a recorded controller store (a run of slurm/demo) and on a
simulation's kept store: the data against a golden file, the picture, bad input.

Regenerate the golden file after a deliberate change of the report's data:
    hpcorch report tests/data/demo-state.db --json > tests/data/demo-report.json
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.report import from_store

DATA = Path(__file__).resolve().parent / "data"
STORE = DATA / "demo-state.db"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["report", *args])
    return res.exit_code, res.stdout, res.stderr


def without_source(doc: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in doc.items() if k not in ("source", "picture")}


def test_recorded_store_matches_golden_json() -> None:
    code, out, err = run(str(STORE), "--json")
    assert code == 0, err
    golden = json.loads((DATA / "demo-report.json").read_text())
    assert without_source(json.loads(out)) == without_source(golden)


def test_recorded_store_shows_the_policy_acting() -> None:
    """The recorded demo: A grew and shrank and changed its global batch; every job ended."""
    rep = from_store(STORE)
    a = next(j for j in rep.jobs if j.name == "A")
    kinds = {m.kind for m in a.marks}
    assert {"grow", "shrink", "batch"} <= kinds
    assert len(set(a.batches)) >= 2
    assert len({s.gpus for s in a.segments}) >= 2
    assert all(j.phase == "done" and j.jct_s and j.jct_s > 0 for j in rep.jobs)
    assert {j.mode for j in rep.jobs} == {"managed", "sidecar"}
    # the pool never holds more GPUs than it has
    assert max(g for _, g in rep.utilisation) <= rep.total_gpus
    assert 0 < rep.mean_utilisation() <= 1


def test_table_and_picture(tmp_path: Path) -> None:
    png = tmp_path / "r.png"
    code, out, err = run(str(STORE), "--out", str(png))
    assert code == 0, err
    assert out.splitlines()[0].split()[:3] == ["JOBID", "NAME", "MODE"]
    assert f"picture: {png}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # bars, marks, labels: not an empty canvas


def test_simulation_store(tmp_path: Path) -> None:
    """A simulation through the production controller keeps its store; report reads it
    in simulated seconds."""
    csv = tmp_path / "w.csv"
    csv.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "ncf-0,0,ncf,1,256\ncifar10-1,30,cifar10,2,256\n"
    )
    keep = tmp_path / "keep"
    res = CliRunner().invoke(
        main,
        ["simulate", str(csv), "--policy", "share", "--nodes", "1", "--engine", "controller",
         "--keep-state", str(keep)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    code, out, err = run(str(keep / "w-share.db"), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [j["name"] for j in doc["jobs"]] == ["ncf-0", "cifar10-1"]
    assert doc["total_gpus"] == 4
    for j in doc["jobs"]:
        assert j["jct_s"] > 0 and j["segments"]
        # simulated seconds: the segments lie within the run, decisions included
        assert all(0 <= s["start"] <= s["end"] <= doc["end"] for s in j["segments"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["/no/such/dir"], "no controller state at /no/such/dir"),
        (["/no/such/state.db"], "no controller state at /no/such/state.db"),
        ([str(DATA / "demo-report.json")], "not a readable controller state"),
        (["--pool-gpus", "0", str(STORE)], "--pool-gpus"),
    ],
)
def test_bad_input_one_line(args: list[str], needle: str) -> None:
    code, _, err = run(*args)
    assert code != 0
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert needle in lines[-1]


def test_unwritable_picture(tmp_path: Path) -> None:
    code, _, err = run(str(STORE), "--out", str(tmp_path / "no" / "dir" / "r.png"))
    assert code == 1 and "Traceback" not in err
    assert "cannot write" in err.splitlines()[-1]


def test_without_matplotlib_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png = tmp_path / "r.png"
    code, _, err = run(str(STORE), "--out", str(png))
    assert code == 1 and "Traceback" not in err and not png.exists()
    assert "pip install 'hpcorch[plot]'" in err.splitlines()[-1]
    code, out, _ = run(str(STORE), "--json")  # the data needs no matplotlib
    assert code == 0 and json.loads(out)["jobs"]


def test_a_job_slurm_never_ran_is_no_training_bar_and_the_pool_is_the_denominator() -> None:
    """A job released but left PENDING its whole life (never seen running, no step
    reported) holds no GPUs in the report; utilisation is over the pool's GPUs as the
    controller stored them, not the most ever in use."""
    from hpcorch.report import build

    jobs = [
        {"slurm_id": 1, "name": "ran", "phase": "done", "submit_time": 0.0, "finished_at": 100.0,
         "started_at": 10.0, "launches": 1, "gpu_seconds": 360.0, "resizes": 0,
         "phase_since": 100.0},
        {"slurm_id": 2, "name": "never", "phase": "cancelled", "submit_time": 0.0,
         "finished_at": 0.0, "started_at": 0.0, "launches": 0, "gpu_seconds": 0.0,
         "resizes": 0, "phase_since": 100.0},
    ]  # fmt: skip
    decisions = [
        {"slurm_id": i, "action": "start", "status": "done", "time": 5.0, "done_at": 5.0,
         "from_gpus": 0, "to_gpus": 4, "detail": ""}
        for i in (1, 2)
    ]  # fmt: skip
    pool = json.dumps([{"name": f"n{i}", "gpus": 4, "usable": True} for i in range(1, 5)])
    rep = build(jobs, decisions, [], {"pool": pool}, "test")
    ran, never = rep.jobs
    assert ran.segments and not never.segments and never.starting
    assert rep.total_gpus == 16
    assert max(g for _, g in rep.utilisation) == 4
    assert rep.mean_utilisation() == pytest.approx(4 * 90 / (16 * 100))


def test_a_maintenance_window_is_in_the_report_and_its_picture(tmp_path: Path) -> None:
    """Issue 33: `hpcorch report` shows a window another reservation took pool nodes for
    (the controller keeps every window it saw in its store's meta ``windows``)."""
    from hpcorch.cli.report import plot
    from hpcorch.report import build

    jobs = [
        {"slurm_id": 1, "name": "ran", "phase": "done", "submit_time": 1000.0,
         "finished_at": 1400.0, "started_at": 1010.0, "launches": 2, "gpu_seconds": 2000.0,
         "resizes": 1, "phase_since": 1400.0},
    ]  # fmt: skip
    windows = [{"name": "maint", "nodes": ["n2"], "start": 1200.0, "end": 1300.0,
                "maintenance": True}]  # fmt: skip
    pool = json.dumps([{"name": f"n{i}", "gpus": 4, "usable": True} for i in (1, 2)])
    rep = build(jobs, [], [], {"pool": pool, "windows": json.dumps(windows)}, "test")
    (w,) = rep.windows
    assert (w.name, w.nodes, w.start, w.end, w.maintenance) == ("maint", ["n2"], 200, 300, True)
    again = type(rep).from_json(json.loads(json.dumps(rep.to_json())))
    assert again.windows == rep.windows
    png = tmp_path / "w.png"
    plot(rep, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["0.0", "r", "r.jpeg2", "r.PNG.txt"])
def test_a_picture_name_matplotlib_cannot_write_is_one_line(tmp_path: Path, name: str) -> None:
    """Found by the CLI fuzz test: ``--out=0.0`` was an internal error (matplotlib picks
    the format by the name's suffix)."""
    code, _, err = run(str(STORE), "--out", str(tmp_path / name))
    assert code == 2 and "Traceback" not in err and "internal error" not in err
    assert ".png, .svg or .pdf" in err.splitlines()[-1]
    assert not (tmp_path / name).exists()
