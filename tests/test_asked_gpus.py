"""The GPUs a user asks for (``hpcorch submit --gpus``): checked against the bounds,
written into the comment as ``req``, read back by the controller as a request; straight to
Slurm the job runs on them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main
from hpcorch.controller.validate import request_of
from hpcorch.request import RequestError, build_request
from hpcorch.slurm.script import JobSpec, parse_comment
from hpcorch.submit import PoolShape, build_spec

SCRIPT = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")
SHAPE = PoolShape(partition="gpu", nodes=2, gpus_per_node=4, cpus_per_node=32)


def _spec(pool: str | None, **kw: object) -> JobSpec:
    req = build_request(SCRIPT, min_gpus=1, max_gpus=8, pool=pool, **kw)  # type: ignore[arg-type]
    return build_spec(req, SHAPE, "train-1", Path("/jobs/train-1"))


@pytest.mark.parametrize("pool", ["hpcorch", None])
def test_what_submit_writes_the_controller_reads_as_a_request(pool: str | None) -> None:
    fields = parse_comment(_spec(pool, gpus=6).comment())
    assert fields is not None and fields["req"] == "6"
    assert request_of(fields) == (6, 0)
    unsaid = parse_comment(_spec(pool).comment())
    assert unsaid is not None and "req" not in unsaid and request_of(unsaid) is None


def test_straight_to_slurm_the_job_runs_on_the_gpus_asked_for_in_a_pool_on_its_minimum() -> None:
    assert _spec(None, gpus=8).gpus == 8
    assert _spec(None).gpus == 1
    assert _spec("hpcorch", gpus=8).gpus == 1  # held: the controller sizes each launch


@pytest.mark.parametrize("gpus", [0, 9, -1])
def test_gpus_outside_the_bounds_are_refused(gpus: int) -> None:
    with pytest.raises(RequestError, match="--gpus"):
        build_request(SCRIPT, min_gpus=1, max_gpus=8, gpus=gpus)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--min-gpus", "2", "--max-gpus", "4", "--gpus", "8"], "--gpus 8 is outside"),
        (["--min-gpus", "2", "--gpus", "1"], "--gpus 1 is outside --min-gpus 2 .. --max-gpus 2"),
        (["--min-gpus", "2", "--gpus", "two"], "--gpus"),
        (["--min-gpus", "2", "--gpus", "0"], "--gpus"),
    ],
)
def test_the_cli_says_what_is_wrong_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm: nothing may be reached
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(main, ["submit", *args, SCRIPT])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in result.stderr
    assert needle in lines[-1]
    assert not (tmp_path / "home").exists()
