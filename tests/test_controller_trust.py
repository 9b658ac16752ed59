"""One bad job never stops the controller: hostile tags and metrics, exceptions from one
job's handling, failed starts (back-off, GPUs released, bounded tries), lost jobs that
reappear. Against the scripted fake cluster of test_controller_logic."""

from __future__ import annotations

import errno
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpcorch.controller.reports import digest
from hpcorch.controller.store import JobRecord
from hpcorch.controller.validate import TagError, parse_tags, pin_of
from hpcorch.planner import LaunchPlan
from tests.test_controller_logic import FakeCluster, controller

HUGE = "99999999999999999999999"


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("batch", HUGE, "outside 1..2147483647"),
        ("min", "٣", "not a number of ASCII digits"),
        ("max", "²", "not a number of ASCII digits"),
        ("min", "-1", "not a number of ASCII digits"),
        ("micro", "0", "outside 1..2147483647"),
        ("grace", "1e9", "not a number of ASCII digits"),
        ("dir", "relative/x", "not an absolute path"),
        ("dir", "/home/u/../../root", "not a plain path"),
        ("dir", "/home/u/x\n", "not an absolute path"),
        ("dir", "/" + "a" * 2000, "at most 1024 characters"),
        ("id", "x;rm -rf /", "not 1-128 letters"),
        ("app", "", "not 1-128 letters"),
        ("mode", "root", "not one of managed, sidecar"),
        ("epochs", "0", "outside 1..1000000"),
        ("epochs", "10000001", "outside 1..1000000"),
        ("dataset", HUGE, "outside 1..1000000000000"),
    ],
)
def test_bad_tags_are_refused_with_a_reason(key: str, value: str, needle: str) -> None:
    tags = {"id": "j-1", "min": "1", "max": "2", "batch": "64", key: value}
    with pytest.raises(TagError, match=needle):
        parse_tags(tags)


def test_good_tags_parse() -> None:
    t = parse_tags({"id": "a-20260101-000000-ab12", "min": "2", "max": "8", "batch": "64"})
    assert (t.min_gpus, t.max_gpus, t.batch, t.job_dir, t.sidecar) == (2, 8, 64, "", False)
    assert (t.epochs, t.dataset) == (None, None)
    t = parse_tags({"min": "1", "epochs": "90", "dataset": "1281167"})
    assert (t.epochs, t.dataset) == (90, 1281167)
    with pytest.raises(TagError, match="below min"):
        parse_tags({"min": "4", "max": "2"})
    assert pin_of({"pin": "4"}) == 4
    with pytest.raises(TagError):
        pin_of({"pin": HUGE})


def test_a_job_with_bad_tags_is_refused_once_and_the_others_run(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 4)
    c.add(2, 1, 4)
    c.set(2, tags={**c.jobs[2].job.tags, "batch": HUGE})
    logged: list[str] = []
    ctl = controller(tmp_path, c)
    ctl.log = ctl.warn = logged.append
    for _ in range(3):
        ctl.cycle()
    bad = ctl.store.job(2)
    assert bad is not None and bad.phase == "refused"
    assert bad.reason == f"refused: batch={HUGE} is outside 1..2147483647"
    assert c.state(2) == "PENDING" and ("start", 2) not in c.log
    assert c.state(1) == "RUNNING"
    assert sum("job 2" in m for m in logged) == 1  # said once, not every cycle


def test_hostile_metrics_are_dropped_not_fatal(tmp_path: Path) -> None:
    rec = JobRecord(1, "k", "n", "u", "/d", "a", 1, 4, 64, 64, 64, 0.0, "running", 0.0, gpus=2)
    logged: list[str] = []
    bad: list[dict[str, Any]] = [
        {"event": "steps", "step_time": math.nan},
        {"event": "steps", "step_time": 1.0, "gpus": 10**30, "global_batch": True},
        {"event": "steps", "step_time": "fast"},
        {"event": "steps", "step_time": 1e300, "step": 10**40},
        {"event": "start", "epochs": 10**40, "dataset_size": -5},
        {"event": "resumed", "lost_steps": 2**70},
        {"event": "stop", "graceful": False, "waited_s": "\x1b[2J"},
        {"event": ["steps"]},
    ]
    samples = [digest(rec, line, logged.append) for line in bad]
    assert [i for i, s in enumerate(samples) if s is not None] == [1]
    ok = samples[1]
    assert ok is not None and ok.gpus == 2 and ok.global_batch == 64  # bad values ignored
    assert rec.epochs == 0 and rec.lost_steps == 0
    assert all("\x1b" not in m for m in logged)


class Flaky(FakeCluster):
    """The fake cluster whose plans cannot be written for some jobs, and whose metrics
    raise for others."""

    full: set[int]
    broken_metrics: set[str]

    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        if slurm_id in self.full:
            raise OSError(errno.ENOSPC, "cannot write the plan to /spool: No space left on device")
        super().write_plan(slurm_id, plan, uid)

    def read_metrics(
        self, job_dir: str, offset: int, uid: int
    ) -> tuple[Sequence[dict[str, Any]], int]:
        if job_dir in self.broken_metrics:
            raise ZeroDivisionError("a bug in reading one job's metrics")
        return [], offset


def flaky() -> Flaky:
    c = Flaky(nodes=1)
    c.full, c.broken_metrics = set(), set()
    return c


def test_an_exception_from_one_job_is_recorded_against_it(tmp_path: Path) -> None:
    c = flaky()
    c.add(1, 1, 2)
    c.add(2, 1, 2)
    c.broken_metrics.add("/jobs/1")
    logged: list[str] = []
    ctl = controller(tmp_path, c)
    ctl.log = ctl.warn = logged.append
    for _ in range(4):
        ctl.cycle()
    one, two = ctl.store.job(1), ctl.store.job(2)
    assert one is not None and two is not None
    assert one.reason.startswith("controller error reading its metrics: ZeroDivisionError")
    assert one.phase == "running" and two.phase == "running"
    assert sum("ZeroDivisionError" in m for m in logged) == 1


def test_a_policy_that_raises_keeps_every_allocation(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 4)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.policy = replace(ctl.policy)
    ctl.policy.schedule = lambda snap: 1 / 0  # type: ignore[method-assign,assignment,misc]
    c.add(2, 1, 4)
    ctl.cycle()
    assert c.state(1) == "RUNNING" and c.state(2) == "PENDING"


def test_a_start_that_cannot_write_its_plan_backs_off_and_gives_up(tmp_path: Path) -> None:
    c = flaky()
    c.add(1, 4, 4)
    c.full.add(1)
    logged: list[str] = []
    ctl = controller(tmp_path, c)
    ctl.log = ctl.warn = logged.append
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "queued" and rec.start_failures == 1
    assert "No space left on device" in rec.reason and "retry 1/4 in 2 s" in rec.reason
    # a second job gets the GPUs the first one cannot use
    c.add(2, 4, 4)
    ctl.cycle()
    assert c.state(2) == "RUNNING"
    c.set(2, state="COMPLETED", exit_code=0)
    attempts = [int(c.t)]
    for _ in range(600):  # ten minutes of one-second cycles
        c.t += 1
        before = len(ctl.store.decisions(1))
        ctl.cycle()
        if len(ctl.store.decisions(1)) > before:
            attempts.append(int(c.t))
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "failed"
    assert rec.reason.startswith("start failed 5 times, gave up: cannot write the plan")
    assert len(attempts) == 5  # 5 decision rows in ten minutes, not one a second
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps == [2, 4, 8, 16]  # exponential
    assert sum("job 1" in m for m in logged) <= 1 + 2 * 5  # joined; per try: start, failed
    assert ("start", 1) not in c.log


def test_a_start_that_fails_once_then_works(tmp_path: Path) -> None:
    c = flaky()
    c.add(1, 2, 2)
    c.full.add(1)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    c.full.clear()
    c.t += 3
    ctl.cycle()
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "running" and rec.start_failures == 1
    digest(rec, {"event": "start"}, lambda m: None)  # a start alone keeps nothing: the
    assert rec.start_failures == 1  # count stays (a launch that only starts loops for ever)
    digest(rec, {"event": "checkpoint"}, lambda m: None)  # it kept something
    assert rec.start_failures == 0


def test_a_lost_job_that_reappears_is_readopted(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    hidden = c.jobs.pop(1)
    ctl.cycle()
    assert ctl.store.job(1).phase == "lost"  # type: ignore[union-attr]
    c.jobs[1] = hidden
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "running" and rec.gpus == 2
    assert rec.reason == "reappeared in Slurm (running): re-adopted" and rec.launches == 1
    # its GPUs count as used: a new job does not get them
    c.add(2, 8, 8)
    ctl.cycle()
    assert c.state(2) == "PENDING"


def test_state_kept_for_another_reservation_needs_adopt(tmp_path: Path) -> None:
    from hpcorch.cli.controller import _check_reservation
    from hpcorch.controller.store import Store
    from hpcorch.errors import HpcorchError

    store = Store(tmp_path / "state.db")
    _check_reservation(store, tmp_path, "pool", adopt=False)  # fresh state: any
    store.set_meta("reservation", "pool")
    _check_reservation(store, tmp_path, "pool", adopt=False)
    with pytest.raises(HpcorchError, match="belongs to reservation 'pool', not 'wrong'"):
        _check_reservation(store, tmp_path, "wrong", adopt=False)
    _check_reservation(store, tmp_path, "wrong", adopt=True)


def test_state_another_user_cannot_read_is_one_clear_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    from hpcorch.controller.store import Store

    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    Store(tmp_path / "ctl" / "state.db").close()
    (tmp_path / "ctl").chmod(0o700)
    for p in (tmp_path, *tmp_path.parents):
        p.chmod(p.stat().st_mode | 0o001)
    code = (
        "from pathlib import Path\n"
        "from hpcorch.controller.store import Store, StateError\n"
        "try:\n"
        f"    Store(Path({str(tmp_path / 'ctl' / 'state.db')!r}), readonly=True)\n"
        "except StateError as e:\n"
        "    print(e)\n"
    )
    nobody = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    probe = subprocess.run([*nobody, sys.executable, "-c", "import hpcorch"], env=env)
    if probe.returncode != 0:
        pytest.skip("the checkout is not readable by other users here")
    out = subprocess.run(
        [*nobody, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("cannot read the controller's state"), out.stdout
    assert "Permission denied" in out.stdout


def test_names_and_reports_cannot_forge_or_flood_the_log(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 4)
    c.set(1, name="x\nhpcorch-controller: job 2 done: training finished\x1b[2J")
    resumed = [{"event": "resumed", "lost_steps": 1, "step": i} for i in range(10_000)]
    c.read_metrics = lambda d, o, u: (resumed, o + 1)  # type: ignore[method-assign]
    logged: list[str] = []
    ctl = controller(tmp_path, c)
    ctl.log = ctl.warn = logged.append
    ctl.cycle()
    ctl.cycle()
    assert all("\n" not in m and "\x1b" not in m for m in logged)
    assert sum("resumed at step" in m for m in logged) <= 5  # a cycle's reports: 5 lines
    rec = ctl.store.job(1)
    assert rec is not None and rec.lost_steps == 10_000  # counted, not logged


def test_a_bad_pin_is_ignored_with_a_reason(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 1, 4)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    c.set(1, tags={**c.jobs[1].job.tags, "pin": "٢"})
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "running"
    assert rec.reason == "pin or request ignored: pin=? is not a number of ASCII digits"


@pytest.mark.parametrize("pin", ["3", "50"])
def test_a_pin_outside_the_job_s_bounds_is_ignored_with_a_reason(tmp_path: Path, pin: str) -> None:
    """A pin written into the comment past `hpcorch resize` (scontrol update Comment=...)
    below the job's min or above its max moves nothing."""
    c = FakeCluster()
    c.add(1, 4, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    before = ctl.store.job(1)
    assert before is not None and before.target_gpus >= 4
    c.set(1, tags={**c.jobs[1].job.tags, "pin": pin})
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.target_gpus == before.target_gpus
    assert rec.reason == f"pin or request ignored: pin={pin} is outside 4..8"


def test_an_exception_placing_one_start_holds_only_that_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcorch.controller import reconcile

    real = reconcile.start_wait

    def start_wait(rec: JobRecord, *args: Any) -> str:
        if rec.slurm_id == 1:
            raise KeyError("n9")
        return real(rec, *args)

    monkeypatch.setattr(reconcile, "start_wait", start_wait)
    c = FakeCluster()
    c.add(1, 1, 4)
    c.add(2, 1, 4)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    one = ctl.store.job(1)
    assert one is not None and one.reason.startswith("controller error placing its start")
    assert c.state(1) == "PENDING" and c.state(2) == "RUNNING"


def test_a_start_report_from_the_future_cannot_make_a_job_unstoppable() -> None:
    """The start report's time is the job's to write: claiming to start training in the
    future must not keep the launch from being resized or preempted for good."""
    from hpcorch.controller.reconcile import Settings, can_stop

    s = Settings()
    rec = JobRecord(1, "k", "n", "u", "/d", "a", 1, 4, 64, 64, 64, 0.0, "running", 1000.0, gpus=2)
    digest(rec, {"event": "start", "time": 9e10}, lambda m: None)
    assert rec.ready == 1
    late = 1000.0 + s.startup_s + max(s.min_run_s, 30.0)
    assert not can_stop(rec, 1000.0 + s.min_run_s, s, 30.0)
    assert can_stop(rec, late, s, 30.0)
    honest = JobRecord(2, "k", "n", "u", "/d", "a", 1, 4, 64, 64, 64, 0.0, "running", 1000.0)
    digest(honest, {"event": "start", "time": 1010.0}, lambda m: None)
    assert not can_stop(honest, 1010.0 + s.min_run_s - 1, s)
    assert can_stop(honest, 1010.0 + s.min_run_s, s)


def test_a_declared_length_reaches_the_record_until_the_job_reports_its_own() -> None:
    """epochs= and dataset= in the comment: the policy knows a queued job's length."""
    from hpcorch.cluster import ObservedJob
    from hpcorch.controller.adopt import new_record

    tags = {"id": "j-1", "min": "1", "max": "4", "batch": "64", "epochs": "10", "dataset": "6400"}
    j = ObservedJob(5, "j", "u", "PENDING", True, "", (), 0, 0, 0, 0.0, 0.0, tags)
    rec = new_record(j, 1.0)
    assert (rec.phase, rec.epochs, rec.steps_per_epoch) == ("queued", 10, 100.0)
    digest(rec, {"event": "start", "epochs": 12, "dataset_size": 12800}, lambda m: None)
    assert (rec.epochs, rec.steps_per_epoch) == (12, 200.0)
