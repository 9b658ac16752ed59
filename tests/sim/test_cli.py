"""``hpcorch simulate`` end to end with click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.sim.traces import BUNDLED_DATA, default_data_dir


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["simulate", *args])
    return res.exit_code, res.stdout, res.stderr


def test_json_shape(data_dir: Path, small_workload: Path, tmp_path: Path) -> None:
    png = tmp_path / "out.png"
    per_job = tmp_path / "jobs.csv"
    code, out, err = _run(
        str(small_workload), "--policy", "fifo,ones", "--nodes", "2", "--json",
        "--plot", str(png), "--per-job", str(per_job),
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert [r["policy"] for r in doc["results"]] == ["fifo", "ones"]
    keys = {
        "workload", "policy", "regime", "avg_jct", "p50_jct", "p99_jct", "makespan", "lower_bound",
        "utilization", "restarts_per_job", "decision_ms_mean", "decision_ms_max",
    }  # fmt: skip
    for r in doc["results"]:
        assert set(r) == keys
        assert r["workload"] == "small"
        assert r["regime"] == "known"
        assert 0 < r["utilization"] <= 1
        assert r["avg_jct"] >= r["lower_bound"]
    assert png.stat().st_size > 1000
    rows = per_job.read_text().splitlines()
    assert rows[0].startswith("workload,policy,job") and len(rows) == 1 + 2 * 5


def test_table_output(data_dir: Path, small_workload: Path) -> None:
    code, out, _ = _run(str(small_workload), "--policy", "tiresias", "--nodes", "2")
    assert code == 0
    assert "avg/bound" in out and "tiresias" in out


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("name,time,application,num_replicas\nj,0,ncf,1\n", "missing column(s) batch_size"),
        ("name,time,application,num_replicas,batch_size\nj,0,resnet,1,8\n", "unknown application"),
        ("name,time,application,num_replicas,batch_size\nj,-5,ncf,1,256\n", "must not be negative"),
        ("name,time,application,num_replicas,batch_size\nj,soon,ncf,1,256\n", "not a number"),
    ],
)
def test_bad_workload_one_line_error(
    data_dir: Path, tmp_path: Path, content: str, needle: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    code, _, err = _run(str(path), "--policy", "fifo")
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_unknown_policy_lists_valid(data_dir: Path, small_workload: Path) -> None:
    code, _, err = _run(str(small_workload), "--policy", "slurm")
    assert code == 2
    assert "unknown policy 'slurm'" in err and "tiresias" in err


def test_missing_file(data_dir: Path) -> None:
    code, _, err = _run("/nonexistent/w.csv")
    assert code != 0 and "Traceback" not in err


def test_bundled_workload_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCORCH_POLLUX_DATA", raising=False)
    assert (BUNDLED_DATA / "LICENSE").is_file() and default_data_dir() == BUNDLED_DATA
    code, out, err = _run("load-0.5/workload-5", "--policy", "fifo", "--json")
    assert code == 0, err
    assert json.loads(out)["results"][0]["workload"] == "workload-5"
    code, _, err = _run("load-0.5/workload-99", "--policy", "fifo")
    assert code == 2 and "load-0.5/workload-1" in err and "Traceback" not in err


def test_data_dir_from_env(
    small_workload: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCORCH_POLLUX_DATA", str(tmp_path / "nowhere"))
    code, _, err = _run(str(small_workload), "--policy", "fifo")
    assert code == 1
    assert "no traces directory" in err and "HPCORCH_POLLUX_DATA" in err


def test_cpu_options(data_dir: Path, small_workload: Path) -> None:
    base = [str(small_workload), "--policy", "fifo", "--nodes", "2", "--json"]
    code, out, err = _run(*base, "--cpu-demand", "cifar10=0.02", "--cpus-per-gpu", "1")
    assert code == 0, err
    starved = json.loads(out)["results"][0]["avg_jct"]
    code, out, err = _run(*base, "--cpu-demand", "cifar10=0.02")
    assert code == 0, err
    assert json.loads(out)["results"][0]["avg_jct"] < starved
    for bad, msg in [
        (["--cpu-demand", "mnist=1"], "unknown application 'mnist'"),
        (["--cpu-demand", "cifar10"], "is not APP=SECONDS"),
        (["--cpus-per-gpu", "13"], "cannot give every one of 4 GPUs 13 CPUs"),
    ]:
        code, _, err = _run(*base, *bad)
        assert code == 2 and msg in err, err


def test_progress_lines_where_stderr_is_no_terminal(small_workload: Path) -> None:
    """A batch job's log gets lines (each run's start, at most one every 30 s, the end),
    not a bar that a file shows only at the end."""
    code, _out, err = _run(str(small_workload), "--policy", "fifo,ones", "--nodes", "2")
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("simulating small fifo: 0/")
    assert any(line.startswith("simulating small ones: ") for line in lines)
    assert lines[-1] == "simulated: 10/10 jobs done"  # 5 jobs, 2 policies
