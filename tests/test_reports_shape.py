"""What a job reports never outranks Slurm: a steps line is stored at the shape Slurm
shows the running launch (its GPUs and nodes), and a line that names another shape is
dropped, said once per launch. Pure parts, then the controller against the fake cluster."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.controller.loop import Controller
from hpcorch.controller.reports import digest
from hpcorch.controller.store import JobRecord, Store
from hpcorch.policy.share import SharePolicy
from tests.test_controller_logic import CFG, FakeCluster

_ids = itertools.count(7_000_000)


def running(gpus: int, nodes: int, restarts: int = 0) -> JobRecord:
    """A running job as Slurm shows it (a fresh id: the once-per-launch log is per job)."""
    return JobRecord(
        next(_ids), "k", "n", "u", "/d", "", 1, 8, 64, 512, 64, 0.0, "running", 0.0,
        gpus=gpus, nodes=nodes, node_list=",".join(f"n{i + 1}" for i in range(nodes)),
        slurm_restarts=restarts, launches=restarts + 1,
    )  # fmt: skip


def steps(**kw: Any) -> dict[str, Any]:
    return {"event": "steps", "time": 1000.0, "step": 10, "step_time": 0.5,
            "per_gpu_batch": 32, "global_batch": 64, "samples_per_s": 128.0, **kw}  # fmt: skip


def test_a_line_is_stored_at_the_shape_slurm_shows() -> None:
    rec = running(gpus=2, nodes=1)
    logged: list[str] = []
    said = digest(rec, steps(gpus=2), logged.append)
    unsaid = digest(rec, steps(), logged.append)  # a line that names no shape: Slurm's
    for s in (said, unsaid):
        assert s is not None and (s.gpus, s.nodes) == (2, 1)
    assert logged == []
    two_nodes = running(gpus=4, nodes=2)
    s = digest(two_nodes, steps(gpus=4), logged.append)
    assert s is not None and (s.gpus, s.nodes) == (4, 2)


def test_a_line_claiming_another_shape_is_dropped_and_said_once() -> None:
    rec = running(gpus=1, nodes=1)
    digest(rec, steps(gpus=1, global_batch=64, per_gpu_batch=64), lambda m: None)
    before = (rec.global_batch, rec.micro_batch, rec.samples_per_s, rec.progress)
    logged: list[str] = []
    forged = [
        steps(gpus=g, step=100 + i, step_time=0.001, samples_per_s=1e9, global_batch=4096,
              per_gpu_batch=512)
        for i, g in enumerate(itertools.islice(itertools.cycle(range(2, 9)), 349))
    ]  # fmt: skip
    got = [digest(rec, line, logged.append) for line in forged]
    assert got == [None] * 349
    # the record is as the honest line left it: nothing of a forged line was taken
    assert (rec.global_batch, rec.micro_batch, rec.samples_per_s, rec.progress) == before
    assert logged == [
        f"job {rec.slurm_id} reported steps on 2 GPUs; Slurm runs launch 1 on 1 GPU(s), "
        "1 node(s): lines of another shape are dropped"
    ]
    # the next launch says it again (once)
    rec.launches += 1
    digest(rec, steps(gpus=8), logged.append)
    digest(rec, steps(gpus=8), logged.append)
    assert len(logged) == 2


def test_no_sample_before_slurm_shows_where_the_job_runs() -> None:
    rec = running(gpus=0, nodes=0)
    assert digest(rec, steps(gpus=4), lambda m: None) is None
    assert digest(rec, steps(), lambda m: None) is None


def test_a_late_line_of_an_earlier_launch_is_dropped_quietly() -> None:
    """A job resized from 4 to 2 GPUs (Slurm's restart count 1 -> 2): the old launch's
    last lines, read once the new one runs, are not stored at the new shape."""
    rec = running(gpus=2, nodes=1, restarts=2)
    logged: list[str] = []
    assert digest(rec, steps(gpus=4, launch=1), logged.append) is None
    assert digest(rec, steps(gpus=2, launch=1), logged.append) is None  # same count, old run
    s = digest(rec, steps(gpus=2, launch=2), logged.append)
    assert s is not None and s.gpus == 2
    assert logged == []  # an honest resize is not a forgery
    for bad in (-1, "2", 2.0, True, 10**40):  # a launch that is no count: shape check only
        assert digest(rec, steps(gpus=2, launch=bad), logged.append) is not None


@dataclass
class Reporting(FakeCluster):
    """Jobs write metrics lines; the test appends to them between cycles."""

    lines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def read_metrics(
        self, job_dir: str, offset: int, uid: int = -1
    ) -> tuple[Sequence[dict[str, Any]], int]:
        got = self.lines.get(job_dir, [])
        return got[offset:], len(got)


def test_three_colluding_jobs_store_nothing_at_a_shape_slurm_did_not_give(
    tmp_path: Path,
) -> None:
    """Three jobs of one user on 1 GPU each write 349 steps lines claiming 2-8 GPUs (and
    absurd throughput) beside their honest ones; another user's job reports honestly."""
    c = Reporting(nodes=2)
    for sid, user in ((1, "mallory"), (2, "mallory"), (3, "mallory"), (4, "bob")):
        c.add(sid, 1, 1)
        c.set(sid, user=user)
    logged: list[str] = []
    ctl = Controller(c, Store(tmp_path / "s.db"), SharePolicy(), CFG, log=logged.append)
    ctl.cycle()
    ctl.cycle()
    assert all(c.jobs[s].job.gpus == 1 for s in (1, 2, 3, 4))
    claims = itertools.cycle(range(2, 9))
    forged = 0
    for t in range(120):
        for sid in (1, 2, 3):
            if forged < 349:
                c.lines.setdefault(f"/jobs/{sid}", []).append(
                    steps(gpus=next(claims), step=t, step_time=0.001, samples_per_s=1e9)
                )
                forged += 1
            if t % 10 == 0:  # and now and then an honest line, which is stored
                c.lines[f"/jobs/{sid}"].append(steps(gpus=1, step=t))
        c.lines.setdefault("/jobs/4", []).append(steps(gpus=1, step=t))
        if t % 30 == 29:
            ctl.cycle()
            c.t += 1
    ctl.cycle()
    stored = {sid: ctl.store.samples(sid) for sid in (1, 2, 3, 4)}
    assert {(s.gpus, s.nodes) for ss in stored.values() for s in ss} == {(1, 1)}
    assert [len(stored[sid]) for sid in (1, 2, 3, 4)] == [12, 12, 12, 120]
    assert all(s.samples_per_s == 128.0 for ss in stored.values() for s in ss)
    shape_lines = [m for m in logged if "lines of another shape are dropped" in m]
    assert len(shape_lines) == 3  # one per job, not one per line
