"""The Python API without Slurm (LocalExecutor), map_array and as_completed (issue 25:
what submitit users reach for)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcorch import api


def square(x: int) -> int:
    return x * x


def fail() -> None:
    raise ValueError("no good")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    return tmp_path


def test_a_local_function_job_runs_as_under_slurm(home: Path) -> None:
    ex = api.LocalExecutor(min_gpus=1)
    job = ex.submit(square, 7)
    assert job.result(timeout=60) == 49 and job.state == "COMPLETED"
    assert job.job_dir.parent == home / "jobs"
    bad = ex.submit(fail)
    with pytest.raises(api.JobError, match="ValueError: no good"):
        bad.result(timeout=60)
    assert bad.state == "FAILED"


def test_a_local_script_gets_a_tasks_environment(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import os\nprint(os.environ['RANK'], os.environ['WORLD_SIZE'], "
        "os.environ['HPCORCH_JOB_DIR'])\n"
    )
    job = api.LocalExecutor(min_gpus=1).submit_script(script)
    assert job.wait(60) == "COMPLETED"
    assert job.logs().split() == ["0", "1", str(job.job_dir)]
    with pytest.raises(api.RequestError, match="out of range"):
        api.LocalExecutor(min_gpus=0)


def test_map_array_and_as_completed_locally() -> None:
    jobs = api.LocalExecutor(min_gpus=1).map_array(square, [1, 2, 3])
    done = list(api.as_completed(jobs, poll=0.1))
    assert sorted(j.result() for j in done) == [1, 4, 9]


def test_map_array_submits_one_named_elastic_job_per_item(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On Slurm: one job per item (NAME_0, NAME_1, ...), each the controller's to schedule."""
    names: list[str] = []

    def fake_submit(req: object, backend: object, files: object = None) -> object:
        names.append(req.name)  # type: ignore[attr-defined]

        class Result:
            slurm_id, job_dir = len(names), tmp_path

        return Result()

    monkeypatch.setattr(api, "_submit", fake_submit)
    ex = api.Executor(backend=object(), min_gpus=1, pool="p")  # type: ignore[arg-type]
    jobs = ex.map_array(square, [1, 2, 3])
    assert names == ["square_0", "square_1", "square_2"]
    assert [j.job_id for j in jobs] == [1, 2, 3]
