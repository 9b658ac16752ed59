"""hpcorch resize: a pin is checked against the job's bounds and the pool's GPUs before
Slurm's comment is touched, and describe shows it."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from hpcorch.cli import pin as pin_cli
from hpcorch.errors import HpcorchError
from hpcorch.slurm.parse import SlurmJob, SlurmNode


def job(comment: str, reservation: str = "pool") -> SlurmJob:
    return SlurmJob(
        job_id=7, name="t", user="alice", state="RUNNING", reason="", partition="gpu",
        nodes="n1", node_count=1, gpus_per_node=8, comment=comment, submit_time=0,
        start_time=0, end_time=0, time_limit_min=0, restarts=0, exit_code=0, work_dir="/",
        reservation=reservation, held=False,
    )  # fmt: skip


class Backend:
    def __init__(self, comment: str) -> None:
        self.job = job(comment)
        self.comments: list[str] = []

    def jobs(self) -> list[SlurmJob]:
        return [self.job]

    def reservation_nodes(self, name: str) -> list[str]:
        return ["n1", "n2"]

    def nodes(self) -> list[SlurmNode]:
        return [
            SlurmNode(name=n, address="", states=("IDLE",), partitions=("gpu",), cpus=32, gpus=8,
                      gpus_used=0, reason="", cpus_used=0)
            for n in ("n1", "n2", "n3")
        ]  # fmt: skip

    def set_comment(self, job_id: int, comment: str) -> None:
        self.comments.append(comment)


@pytest.mark.parametrize(
    ("gpus", "error"),
    [
        (3, "Error: job 7 takes 8-12 GPUs: cannot pin it to 3 (use --gpus 8..12)"),
        (13, "Error: job 7 takes 8-12 GPUs: cannot pin it to 13 (use --gpus 8..12)"),
    ],
)
def test_a_pin_outside_the_job_s_bounds_is_refused_and_nothing_changes(
    monkeypatch: pytest.MonkeyPatch, gpus: int, error: str
) -> None:
    backend = Backend("hpcorch:id=t,min=8,max=12")
    monkeypatch.setattr(pin_cli, "make_backend", lambda: backend)
    res = CliRunner().invoke(pin_cli.resize, ["7", "--gpus", str(gpus)])
    assert res.exit_code == 1 and res.output.strip().splitlines()[-1] == error
    assert backend.comments == []


def test_a_pin_above_the_pool_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = Backend("hpcorch:id=t,min=1,max=64")
    monkeypatch.setattr(pin_cli, "make_backend", lambda: backend)
    res = CliRunner().invoke(pin_cli.resize, ["7", "--gpus", "50"])
    assert res.output.strip().splitlines()[-1] == (
        "Error: job 7's pool has 16 GPUs: cannot pin it to 50"
    )  # the reservation's two nodes, not the partition's three
    assert backend.comments == []


def test_a_pin_within_bounds_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = Backend("hpcorch:id=t,min=8,max=12,pin=9")
    monkeypatch.setattr(pin_cli, "make_backend", lambda: backend)
    res = CliRunner().invoke(pin_cli.resize, ["7", "--gpus", "10"])
    assert res.exit_code == 0, res.output
    assert backend.comments == ["hpcorch:id=t,min=8,max=12,pin=10"]


def test_a_malformed_bound_is_one_line() -> None:
    with pytest.raises(HpcorchError, match="malformed comment"):
        pin_cli.check_pin(7, 2, {"min": "x"}, 16)


def test_describe_shows_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcorch.cli import describe as describe_cli

    backend: Any = Backend("hpcorch:id=t,min=8,max=12,pin=10")
    monkeypatch.setattr(describe_cli, "make_backend", lambda: backend)
    assert "pinned to 10 GPUs (hpcorch resize)" in describe_cli.slurm_view(7)
