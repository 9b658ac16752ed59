"""Slurm's limits are the plan's constraints, on the accounting pool (slurmdbd,
``AccountingStorageEnforce=associations,limits,qos``), with jobs of real second users that
have associations of their own (tests/integration/limits_util.py): with each limit kind
set in turn, every job completes and no launch stays pending for a limit reason for more
than one controller cycle after Slurm first says so; the users' jobs outside the pool
count against their limits."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcorch.slurm.parse import SlurmJob
from tests.conftest import Pool
from tests.integration.controller_util import FAST, ControllerProc, wait_for
from tests.integration.limits_util import (
    LimitSite,
    PendingWatch,
    drop_limit_site,
    make_limit_site,
    sacctmgr,
)
from tests.integration.users import ALICE, BOB, can_run

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
        try:
            clear_limits(accounting_pool)
        finally:
            drop_limit_site(s)


TRES_OFF = "gres/gpu=-1,cpu=-1,node=-1,mem=-1"
"""A TRES limit unset (sacctmgr takes -1 per TRES, not for the list)."""
OFF = (
    f"MaxTRES={TRES_OFF}", f"GrpTRES={TRES_OFF}", "MaxJobs=-1", "GrpJobs=-1",
    "MaxSubmitJobs=-1", "MaxWall=-1",
)  # fmt: skip


def clear_limits(pool: Pool) -> None:
    """Every limit the cases set, unset."""
    for qos in ("normal", "high"):
        sacctmgr(
            pool, "modify", "qos", qos, "set", f"MaxTRESPerUser={TRES_OFF}",
            f"MaxTRESPerJob={TRES_OFF}", f"MaxTRESPerAccount={TRES_OFF}",
            f"GrpTRES={TRES_OFF}", "MaxJobsPerUser=-1", "GrpJobs=-1", "MaxWall=-1",
            "MaxSubmitJobsPerUser=-1",
        )  # fmt: skip
    for account in ("ml", "physics"):
        sacctmgr(pool, "modify", "account", account, "set", *OFF)
    pool.run(
        "scontrol", "update", "PartitionName=gpu", "MaxNodes=UNLIMITED", "MaxTime=UNLIMITED",
        "MaxCPUsPerNode=UNLIMITED",
    )  # fmt: skip


@pytest.fixture
def ctl(
    lsite: LimitSite, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[ControllerProc]:
    """The controller on the pool, with the ``share`` policy unless a test asks for another
    (``@pytest.mark.parametrize("ctl", [...], indirect=True)``)."""
    pool = lsite.pool
    policy = getattr(request, "param", "share")
    c = ControllerProc(
        pool, tmp_path / "ctl", lsite.reservation, "--spool", str(lsite.spool),
        "--policy", policy, *FAST,
    )  # fmt: skip
    try:
        yield c
    finally:
        c.stop()
        for user in (ALICE, BOB):
            subprocess.run(["scancel", "-u", user], env=pool.env, capture_output=True)
        clear_limits(pool)


def finish(ctl: ControllerProc, watch: PendingWatch, jobs: set[int], timeout: float = 240) -> None:
    """Every job of ``jobs`` done, none pending for a limit longer than a cycle."""
    try:
        wait_for(
            f"jobs {sorted(jobs)} done", lambda: all(ctl.phase(j) == "done" for j in jobs),
            timeout, ctl.log,
        )  # fmt: skip
    finally:
        waits = watch.limit_waits(jobs)
        print("pending for a limit (s):", waits)
    assert all(w <= ONE_CYCLE_S for w in waits.values()), waits


def by_user(j: SlurmJob) -> str:
    return j.user


def test_qos_max_gpus_per_user_plans_within_it(lsite: LimitSite, ctl: ControllerProc) -> None:
    """The issue's case: QOS normal MaxTRESPerUser=gres/gpu=2 and an elastic 1-8 GPU job
    on 8 GPUs. Before, it was planned at 8, pending QOSMaxGRESPerUser, held after 90 s and
    planned at 8 again, for ever. Then her job outside the pool holds 1 of her 2 GPUs: her
    next pool job gets the other."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxTRESPerUser=gres/gpu=2")
    with PendingWatch(pool) as watch:
        ctl.start()
        job = lsite.submit_id(ALICE, 1, 8, work=6)
        finish(ctl, watch, {job})
        out = lsite.outside(ALICE, 1)
        second = lsite.submit_id(ALICE, 1, 8, work=6)
        finish(ctl, watch, {second})
        pool.run("scancel", str(out))
    assert watch.peak({job}) == {None: (2, 1)}
    assert watch.peak({second}) == {None: (1, 1)}  # her outside job holds the other


def test_per_job_limits(lsite: LimitSite, ctl: ControllerProc) -> None:
    """QOS normal MaxTRESPerJob=gres/gpu=3, bob's association in physics MaxTRES=gres/gpu=2
    and the partition's MaxNodes=1: alice's 1-8 job runs on at most 3 GPUs, bob's on 2,
    each on one node."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxTRESPerJob=gres/gpu=3")
    sacctmgr(pool, "modify", "user", BOB, "where", "account=physics", "set", "MaxTRES=gres/gpu=2")
    pool.run("scontrol", "update", "PartitionName=gpu", "MaxNodes=1")
    with PendingWatch(pool) as watch:
        ctl.start()
        a = lsite.submit_id(ALICE, 1, 8, work=6)
        b = lsite.submit_id(BOB, 1, 8, "--account", "physics", work=6)
        finish(ctl, watch, {a, b})
    assert watch.peak({a}) == {None: (3, 1)} and watch.peak({b}) == {None: (2, 1)}
    assert all(j.node_count == 1 for poll in watch.running for j in poll if j.job_id in (a, b))


def test_group_gpu_limits_count_jobs_outside_the_pool(
    lsite: LimitSite, ctl: ControllerProc
) -> None:
    """Account ml GrpTRES=gres/gpu=4 while bob's job in ml outside the pool holds 1: alice's
    and bob's pool jobs in ml hold at most 3 together; QOS high MaxTRESPerAccount=gres/gpu=2:
    bob's job in physics under QOS high at most 2."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "account", "ml", "set", "GrpTRES=gres/gpu=4")
    sacctmgr(pool, "modify", "qos", "high", "set", "MaxTRESPerAccount=gres/gpu=2")
    out = lsite.outside(BOB, 1, "--account", "ml")
    with PendingWatch(pool) as watch:
        ctl.start()
        a = lsite.submit_id(ALICE, 1, 8, work=6)
        b = lsite.submit_id(BOB, 1, 8, "--account", "ml", work=6)
        c = lsite.submit_id(BOB, 1, 8, "--account", "physics", "--qos", "high", work=6)
        finish(ctl, watch, {a, b, c})
    pool.run("scancel", str(out))
    assert watch.peak({a, b})[None][0] == 3
    assert watch.peak({c})[None][0] == 2


def test_running_job_counts(lsite: LimitSite, ctl: ControllerProc) -> None:
    """QOS normal MaxJobsPerUser=1 (alice's two jobs) and bob's association in physics
    MaxJobs=1 (his two jobs under QOS high): one at a time each, all complete."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxJobsPerUser=1")
    sacctmgr(pool, "modify", "user", BOB, "where", "account=physics", "set", "MaxJobs=1")
    with PendingWatch(pool) as watch:
        ctl.start()
        alice = {lsite.submit_id(ALICE, 1, 2, work=4) for _ in range(2)}
        bob = {lsite.submit_id(BOB, 1, 2, "--account", "physics", "--qos", "high", work=4)
               for _ in range(2)}  # fmt: skip
        finish(ctl, watch, alice | bob)
    assert watch.peak(alice)[None][1] == 1 and watch.peak(bob)[None][1] == 1


def test_qos_group_limits(lsite: LimitSite, ctl: ControllerProc) -> None:
    """QOS normal GrpTRES=gres/gpu=4 and GrpJobs=2: three elastic jobs of two users hold at
    most 4 GPUs and run at most 2 at once."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "GrpTRES=gres/gpu=4", "GrpJobs=2")
    with PendingWatch(pool) as watch:
        ctl.start()
        jobs = {lsite.submit_id(ALICE, 1, 8, work=4) for _ in range(2)}
        jobs.add(lsite.submit_id(BOB, 1, 8, "--account", "ml", work=4))
        finish(ctl, watch, jobs)
    gpus, count = watch.peak(jobs)[None]
    assert gpus <= 4 and count <= 2, (gpus, count)


def test_time_limits(lsite: LimitSite, ctl: ControllerProc) -> None:
    """QOS normal MaxWall=00:05:00 and the partition's MaxTime=00:08:00: a job submitted
    with --time 20 runs its launches with a time limit of 5 minutes under QOS normal, 8
    under QOS high."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxWall=00:05:00")
    pool.run("scontrol", "update", "PartitionName=gpu", "MaxTime=00:08:00")
    with PendingWatch(pool) as watch:
        ctl.start()
        a = lsite.submit_id(ALICE, 1, 4, "--time", "20", work=4)
        b = lsite.submit_id(BOB, 1, 4, "--account", "physics", "--qos", "high", "--time", "20",
                            work=4)  # fmt: skip
        finish(ctl, watch, {a, b})
    limits = {j.job_id: j.time_limit_min for poll in watch.running for j in poll}
    assert (limits[a], limits[b]) == (5, 8), limits


def test_submit_refuses_what_no_limit_allows_and_status_says_why(
    lsite: LimitSite, ctl: ControllerProc
) -> None:
    """QOS normal MaxTRESPerJob=gres/gpu=2: alice's --min-gpus 4 is refused by hpcorch submit
    with one line naming the limit; the same job sent with sbatch is shown in status with
    the limit as its reason, never as waiting for GPUs. QOS normal MaxSubmitJobsPerUser=1
    while she has a job: refused, naming the limit."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxTRESPerJob=gres/gpu=2")
    ctl.start()
    bad = lsite.submit(ALICE, 4, 8, check=False)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode != 0 and bad.stdout == "", bad
    assert len(lines) == 1 and "MaxTRESPerJob" in lines[0] and "--min-gpus 4" in lines[0], lines
    assert "Traceback" not in bad.stderr
    out = lsite.as_user(
        ALICE, "sbatch", "--parsable", "--hold", f"--reservation={lsite.reservation}",
        "--gres=gpu:4", "--output=/dev/null", "--comment=hpcorch:id=big,min=4,max=8,batch=64",
        "--wrap", "sleep 600",
    )  # fmt: skip
    big = int(out.stdout.strip().split(";")[0])

    def reason() -> str:
        rec = ctl.record(big)
        return rec.reason if rec else ""

    wait_for("its reason to name the limit", lambda: "limits" in reason(), 60, ctl.log)
    doc = json.loads(pool.hpcorch("status", "--json", "--state-dir", str(ctl.state)).stdout)
    row = next(r for r in doc["jobs"] if r["job_id"] == big)
    assert row["reason"].startswith("can never run within the limits"), row
    assert "MaxTRESPerJob" in row["reason"], row
    text = pool.hpcorch("status", "--state-dir", str(ctl.state)).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith(str(big)))
    assert "waiting for GPUs" not in line, line
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxSubmitJobsPerUser=1")
    again = lsite.submit(ALICE, 1, 2, check=False)
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1, again
    assert "MaxSubmitJobs" in again.stderr, again.stderr


def test_a_limit_it_does_not_read_is_learned_from_the_refused_launch(
    lsite: LimitSite, ctl: ControllerProc
) -> None:
    """QOS normal GrpTRESRunMins=gres/gpu=30, which the controller does not plan: an
    elastic 1-8 GPU job with --time 10 is refused at 8 GPUs (80 GPU-minutes) and at 4
    (QOSGrpGRESRunMinutes), each launch held within the cycle that sees it, and runs at 2;
    the cap it learned is in the store and outlives a controller restart."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "GrpTRESRunMins=gres/gpu=30")
    try:
        with PendingWatch(pool) as watch:
            ctl.start()
            job = lsite.submit_id(ALICE, 1, 8, "--time", "10", work=12)
            wait_for("the job running", lambda: ctl.phase(job) == "running", 120, ctl.log)
            learned = ctl_meta(ctl, "learned_limits")
            assert [c["reason"] for c in learned] == ["QOSGrpGRESRunMinutes"], learned
            assert ctl.stop() == 0
            ctl.start()  # a new controller on the same state keeps what was learned
            assert ctl_meta(ctl, "learned_limits") == learned
            finish(ctl, watch, {job})
        refused = ctl.log.read_text().count("Slurm refused a launch (QOSGrpGRESRunMinutes)")
        assert refused == 2, ctl.log.read_text()[-3000:]  # at 8 GPUs, then at 4
        assert watch.peak({job}) == {None: (2, 1)}
    finally:
        sacctmgr(pool, "modify", "qos", "normal", "set", f"GrpTRESRunMins={TRES_OFF}")


def ctl_meta(ctl: ControllerProc, key: str) -> Any:
    store = ctl.store()
    try:
        return json.loads(store.get_meta(key) or "[]")
    finally:
        store.close()


def test_a_drained_node_is_given_back_under_a_limit(lsite: LimitSite, ctl: ControllerProc) -> None:
    """Issue 33, drains on the accounting pool: alice's elastic job, within her QOS limit
    of 8 GPUs, runs on both pool nodes; an admin drains one: she leaves it at her next
    checkpoint, the node is DRAINED within 60 s, and her job completes on the other."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxTRESPerUser=gres/gpu=8")
    node = "gpu-a002"
    try:
        with PendingWatch(pool) as watch:
            ctl.start()
            job = lsite.submit_id(ALICE, 1, 8, work=40)

            def nodes() -> str:
                j = pool.squeue().get(job)
                return j.nodes if j is not None and j.state == "RUNNING" else ""

            wait_for("her job on both nodes", lambda: nodes() == "gpu-a[001-002]", 120, ctl.log)
            wait_for("it trains", lambda: ctl.training(job), 60, ctl.log)
            pool.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=repair")
            wait_for(f"{node} drained", lambda: drained(pool, node), 60, ctl.log)
            finish(ctl, watch, {job})
        rec = ctl.record(job)
        assert rec is not None and rec.moved.startswith(f"moved off {node}"), rec
    finally:
        pool.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


@pytest.mark.parametrize("ctl", ["ones"], indirect=True)
def test_ones_plans_within_a_qos_limit_and_gives_a_drained_node_back(
    lsite: LimitSite, ctl: ControllerProc
) -> None:
    """ONES, the default policy, as the two tests above run the ``share`` one: alice's two
    elastic 1-8 GPU jobs under QOS normal MaxTRESPerUser=gres/gpu=4 never hold more than 4
    GPUs, and neither is left pending for the limit longer than a cycle (a plan Slurm
    refused, planned again, would be); an admin drains a pool node under them: it is
    DRAINED within 60 s and both complete."""
    pool = lsite.pool
    sacctmgr(pool, "modify", "qos", "normal", "set", "MaxTRESPerUser=gres/gpu=4")
    node = "gpu-a002"
    try:
        with PendingWatch(pool) as watch:
            ctl.start()
            jobs = {lsite.submit_id(ALICE, 1, 8, work=30) for _ in range(2)}
            wait_for("one trains", lambda: any(ctl.training(j) for j in jobs), 120, ctl.log)
            pool.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=repair")
            wait_for(f"{node} drained", lambda: drained(pool, node), 60, ctl.log)
            finish(ctl, watch, jobs)
        ((gpus, _),) = watch.peak(jobs).values()
        assert 1 <= gpus <= 4
        assert "Traceback" not in ctl.log.read_text()
    finally:
        pool.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def drained(pool: Pool, node: str) -> bool:
    """``node`` is DRAINED (no job left on it), as sinfo says."""
    return pool.run("sinfo", "-h", "-N", "-n", node, "-o", "%t").stdout.strip() == "drain"
