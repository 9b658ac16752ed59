"""Slurm's limits are the plan's constraints, on the accounting pool (slurmdbd,
``AccountingStorageEnforce=associations,limits,qos``), with jobs of real second users that
have associations of their own (tests/integration/limits_util.py): with each limit kind
set in turn, every job completes and no launch stays pending for a limit reason for more
than one controller cycle after Slurm first says so; the users' jobs outside the pool
count against their limits."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import FAST, ControllerProc, wait_for
from tests.integration.limits_util import (
    LimitSite,
    PendingWatch,
    drop_limit_site,
    make_limit_site,
    sacctmgr,
)
from tests.integration.users import ALICE, can_run

pytestmark = [pytest.mark.slurm, pytest.mark.releases]

CYCLE_S = 1.0
"""The controllers' cycle here (FAST: --interval 1)."""
ONE_CYCLE_S = CYCLE_S + 4.0
"""The longest a launch may be seen pending for a limit: one cycle, and the time the
controller's hold and squeue's answer take on a loaded 2-core machine."""


@pytest.fixture(scope="module")
def lsite(accounting_pool: Pool) -> Iterator[LimitSite]:
    why = can_run()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    s = make_limit_site(accounting_pool, f"t-limits-{os.getpid()}", "gpu-a[001-002]")
    try:
        yield s
    finally:
        clear_limits(accounting_pool)
        drop_limit_site(s)


TRES_OFF = "gres/gpu=-1,cpu=-1,node=-1,mem=-1"
"""A TRES limit unset (sacctmgr takes -1 per TRES, not for the list)."""


def clear_limits(pool: Pool) -> None:
    """Every limit the cases set, unset."""
    for qos in ("normal", "high"):
        sacctmgr(
            pool, "modify", "qos", qos, "set", f"MaxTRESPerUser={TRES_OFF}",
            f"MaxTRESPerJob={TRES_OFF}", f"MaxTRESPerAccount={TRES_OFF}",
            f"GrpTRES={TRES_OFF}", "MaxJobsPerUser=-1", "GrpJobs=-1", "MaxWall=-1",
            "MaxSubmitJobsPerUser=-1",
        )  # fmt: skip


@pytest.fixture
def ctl(lsite: LimitSite, tmp_path: Path) -> Iterator[ControllerProc]:
    pool = lsite.pool
    c = ControllerProc(
        pool, tmp_path / "ctl", lsite.reservation, "--spool", str(lsite.spool),
        "--policy", "share", *FAST,
    )  # fmt: skip
    try:
        yield c
    finally:
        c.stop()
        clear_limits(pool)


def test_qos_max_gpus_per_user_plans_within_it(lsite: LimitSite, ctl: ControllerProc) -> None:
    """The issue's case: QOS normal MaxTRESPerUser=gres/gpu=2 and an elastic 1-8 GPU job
    on 8 GPUs. Before, it was planned at 8, pending QOSMaxGRESPerUser, held after 90 s and
    planned at 8 again, for ever."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxTRESPerUser=gres/gpu=2")
    with PendingWatch(pool) as watch:
        ctl.start()
        job = lsite.submit_id(ALICE, 1, 8, work=6)
        try:
            wait_for("the job done", lambda: ctl.phase(job) == "done", 150, ctl.log)
        finally:
            waits = watch.limit_waits({job})
            print("pending for a limit:", waits)
    rec = ctl.record(job)
    assert rec is not None and rec.gpus <= 2, rec
    assert all(w <= ONE_CYCLE_S for w in waits.values()), waits
