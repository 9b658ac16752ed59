"""The pool's contract against jobs and people that break it (issue 34), on the real pool,
with the controller as its own service account (the shipped systemd unit) and jobs of real
second Unix users: every preemption completes within its bound, nothing unrequeueable or
interactive gets in or holds GPUs for good, a job that never checkpoints is not relaunched
for ever, two controllers on one reservation leave one acting, and the smaller findings.

One site pool (2 nodes x 4 GPUs) serves the module; its reservation ``closed`` is kept
closed by slurm/job_submit.lua, ``open`` is not. The jobs are shell scripts that speak the
runtime's protocol (a start report, steps lines, exit codes), each breaking it its own way:
the users' interpreter has no torch. The same paths on the fake cluster:
tests/test_contract.py and tests/test_lease.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Pool, slurm_release
from tests.integration.controller_util import wait_for
from tests.integration.site_jobs import (
    Host,
    make_reservation,
    pool_of,
    shared_spool,
    show,
    submit,
)
from tests.integration.test_trust import drop_reservation
from tests.integration.users import ALICE, BOB, PYTHON, Site, site_beside

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


@pytest.fixture(scope="module")
def site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 70, closed="^closed$") as s:
        yield s


# --- finding 1: Requeue=0 -------------------------------------------------------------------
def test_a_closed_pool_refuses_what_cannot_keep_the_contract(site: Site) -> None:
    """Findings 1, 2 and 8, as Slurm enforces them in a closed pool: an owner cannot make
    a pool job unrequeueable, nor submit one with --no-requeue, nor an interactive
    allocation (salloc, srun; held and tagged); her `scontrol release` is refused with a
    reason, not Slurm's "Unspecified error"."""
    make_reservation(site, "closed")
    try:
        tag = "--comment=hpcorch:id=c1,min=1,max=1,batch=32"
        held = site.as_user(ALICE, "sbatch", "--parsable", "--hold", "--reservation=closed",
                            tag, "--output=/dev/null", "--wrap", "sleep 60")  # fmt: skip
        job = int(held.stdout.strip())
        r = site.as_user(ALICE, "scontrol", "update", f"jobid={job}", "Requeue=0", check=False)
        assert r.returncode != 0, r.stdout
        assert "Requeue=1" in show(site, job)
        r = site.as_user(ALICE, "scontrol", "release", str(job), check=False)
        assert r.returncode != 0 and "Unspecified error" not in r.stderr, r.stderr
        if slurm_release() != "22.05":  # 22.05's scontrol prints no line from job_submit
            assert "hpcorch pool" in r.stderr, r.stderr
        refused = {
            "no-requeue": ["sbatch", "--hold", "--no-requeue", "--reservation=closed", tag,
                           "--output=/dev/null", "--wrap", "sleep 60"],
            "salloc": ["salloc", "--hold", "--no-shell", "--reservation=closed", tag],
            "srun": ["srun", "--hold", "--reservation=closed", tag, "true"],
        }  # fmt: skip
        for what, argv in refused.items():
            r = site.as_user(ALICE, *argv, check=False, timeout=60)
            assert r.returncode != 0, (what, r.stdout)
            expect = "requeueable" if what == "no-requeue" else "batch jobs only"
            assert expect in r.stderr, (what, r.stderr)
    finally:
        drop_reservation(site, "closed")


def test_requeue_0_in_an_open_pool_no_longer_blocks_a_preemption(site: Site) -> None:
    """Finding 1: the owner of a pool job sets Requeue=0 (an open pool lets her); the
    controller preempts it, it does not checkpoint, and the forced requeue failed every
    60 s for ever while the newcomer waited with GPUs idle. Now the controller sets
    Requeue=1 back; the preemption completes within its bound (grace + margin)."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-requeue", "open", spool, "--nodes", "n1,n2", "--grace", "10")
    host.start()
    try:
        stubborn = submit(site, ALICE, "open", 1, 8, "stubborn", spool=spool)
        wait_for("alice's job training", lambda: getattr(host.record(stubborn), "ready", 0) == 1,
                 120, host.log)  # fmt: skip
        site.as_user(ALICE, "scontrol", "update", f"jobid={stubborn}", "Requeue=0")
        assert "Requeue=0" in show(site, stubborn)
        arrived = time.time()
        newcomer = submit(site, BOB, "open", 4, 4, "short", "60", spool=spool)
        wait_for("bob's job running", lambda: host.phase(newcomer) == "running", 180, host.log)
        waited = time.time() - arrived
        log = host.text()
        assert "Requeue=0 set on it" in log, log[-3000:]
        assert "requeued by force" in log, log[-3000:]
        print(f"Requeue=0: the newcomer ran {waited:.0f} s after it arrived (grace 10 s)")
        assert waited < 10 + 60 + 30
        assert "Requeue=1" in show(site, stubborn)
        assert "Traceback" not in log
    finally:
        site.slurm("scancel", "--reservation=open")
        host.stop()


# --- finding 2: interactive allocations ------------------------------------------------------
def test_an_interactive_allocation_in_an_open_pool_is_refused_never_started(site: Site) -> None:
    """Finding 2: `salloc --hold --reservation=POOL --comment=hpcorch:...` was started by
    the controller as a pool job, which could then be neither signalled nor requeued."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-salloc", "open", spool, "--nodes", "n1,n2")
    host.start()
    salloc = subprocess.Popen(
        ["setpriv", "--reuid", ALICE, "--regid", ALICE, "--init-groups", "salloc", "--hold",
         "--no-shell", "--reservation=open", "--comment=hpcorch:id=inter,min=1,max=4,batch=32",
         "--gres=gpu:1"],
        env=site.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        cwd=site.root,
    )  # fmt: skip
    try:

        def its_id() -> int:
            jobs = pool_of(site).squeue()
            ids = [j for j, v in jobs.items() if v.comment.startswith("hpcorch:id=inter")]
            return ids[0] if ids else 0

        wait_for("the salloc job listed", lambda: its_id() > 0, 60, host.log)
        job = its_id()
        wait_for("the controller's verdict", lambda: host.phase(job) != "?", 60, host.log)
        time.sleep(5)  # cycles enough to have started it, had it been taken in
        assert host.phase(job) == "refused", host.reason(job)
        assert "salloc" in host.reason(job)
        assert pool_of(site).state(job) == "PENDING" and "start" not in host.decisions(job)
    finally:
        salloc.kill()
        site.slurm("scancel", "--reservation=open")
        host.stop()


# --- finding 3: a job that never says it started ---------------------------------------------
def test_the_jobs_waiting_behind_a_silent_launch_are_told_why(site: Site) -> None:
    """Finding 3: a launch that never reports its start keeps its GPUs for the start-up
    allowance, and the job waiting for them said only "waiting for GPUs"."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-silent", "open", spool, "--nodes", "n1,n2", "--startup", "100")
    host.start()
    try:
        silent = submit(site, ALICE, "open", 8, 8, "silent", spool=spool)
        wait_for("alice's launch running", lambda: host.phase(silent) == "running", 120, host.log)
        waiting = submit(site, BOB, "open", 8, 8, "short", spool=spool)
        env = site.user_env(BOB, HPCORCH_CONTROLLER_DIR=str(host.var_lib))

        def bobs_reason() -> str:
            out = site.as_user(BOB, PYTHON, "-m", "hpcorch", "status", "-j", str(waiting), "-o",
                               "jobid,reason", env=env, check=False)  # fmt: skip
            return out.stdout

        wait_for("bob told why he waits", lambda: f"job {silent}" in bobs_reason(), 90, host.log)
        out = bobs_reason()
        assert "has not reported its start" in out and "100 s" in out, out
        assert "not reported its start" in host.reason(silent)
    finally:
        site.slurm("scancel", "--reservation=open")
        host.stop()


# --- finding 4: a job that never checkpoints ---------------------------------------------------
def test_a_job_that_cannot_checkpoint_fails_after_k_launches_and_says_it_restarted(
    site: Site,
) -> None:
    """Finding 4: each launch trained, failed its checkpoint (exit 74), and the next
    trained from step 0 again, silently and for ever: the retry count reset at every launch
    that reported its start. Now every restart from step 0 is said, and the third launch
    in a row that kept nothing fails the job with the reason."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-nockpt", "open", spool, "--nodes", "n1,n2")
    host.start()
    try:
        job = submit(site, ALICE, "open", 1, 1, "nockpt", spool=spool)
        wait_for("the job failed", lambda: host.phase(job) in ("failed", "done"), 240, host.log)
        rec = host.record(job)
        assert rec is not None and rec.phase == "failed", rec
        assert "3 launches in a row" in rec.reason and "checkpoint" in rec.reason, rec.reason
        assert rec.launches == 3 and rec.lost_steps == 100, rec
        log = host.text()
        assert log.count("started from step 0") == 2, log[-3000:]
    finally:
        site.slurm("scancel", "--reservation=open")
        host.stop()


# --- finding 5: two controllers ----------------------------------------------------------------
def test_two_controllers_on_one_pool_leave_exactly_one_acting(site: Site) -> None:
    """Finding 5: a second controller with another state directory (another login node),
    started with --adopt on an empty one, ran beside the first: both acted on the pool. Now
    it stands by while the first holds the pool's lease; when the first one's host hangs
    (SIGSTOP) it takes over once the lease expires; the first, back, stops acting."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    ttl = ("--lease-ttl", "10")
    a = Host(site, "host-a", "open", spool, "--nodes", "n1,n2", *ttl)
    b = Host(site, "host-b", "open", spool, "--adopt", *ttl)
    a.start()
    try:
        first = submit(site, ALICE, "open", 1, 4, "short", "600", spool=spool)
        wait_for("alice's job running", lambda: a.phase(first) == "running", 120, a.log)
        b.start()
        wait_for("b standing by", lambda: "standing by" in b.text(), 60, b.log)
        time.sleep(5)
        assert "start" in a.decisions(first) and not b.decisions(first), b.text()[-2000:]
        assert b.phase(first) == "?"  # b has not even adopted it: it does nothing
        os.kill(a.pid(), signal.SIGSTOP)  # a's host hangs
        stopped = time.time()
        wait_for("b taking over", lambda: "after standing by" in b.text(), 60, b.log)
        took = time.time() - stopped
        second = submit(site, BOB, "open", 1, 4, "short", "600", spool=spool)
        wait_for("bob's job started by b", lambda: b.phase(second) == "running", 120, b.log)
        os.kill(a.pid(), signal.SIGCONT)
        assert a.proc is not None
        try:  # its next cycle that reaches Slurm finds the lease taken: it stops
            a.proc.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a still runs:\n{a.text()[-3000:]}") from None
        assert a.proc.returncode != 0
        assert "took over the pool's lease" in a.text(), a.text()[-2000:]
        assert not a.decisions(second)
        print(f"lease: the standby took over {took:.0f} s after the holder hung (ttl 10 s)")
        assert took < 10 + 15
        assert "Traceback" not in a.text() + b.text()
    finally:
        with_a = a.proc is not None and a.proc.poll() is None
        if with_a:
            os.kill(a.pid(), signal.SIGCONT)
        site.slurm("scancel", "--reservation=open")
        b.stop()
        a.stop()


# --- findings 6 and 7 ------------------------------------------------------------------------
def test_an_impossible_minimum_and_a_job_moved_out_are_said_as_such(site: Site) -> None:
    """Finding 6: a held, tagged sbatch whose minimum exceeds the pool queued for ever as
    "waiting for GPUs". Finding 7: a job its owner moved out of the reservation was called
    lost, "vanished from Slurm", though Slurm still listed it."""
    make_reservation(site, "open")
    spool = shared_spool(site)
    host = Host(site, "host-misc", "open", spool, "--nodes", "n1,n2")
    host.start()
    try:
        big = int(
            site.as_user(
                ALICE, "sbatch", "--parsable", "--hold", "--reservation=open",
                "--comment=hpcorch:id=big,min=16,max=16,batch=32", "--output=/dev/null",
                "--wrap", "sleep 60",
            ).stdout.strip()
        )  # fmt: skip
        wait_for("the verdict", lambda: "never start" in host.reason(big), 60, host.log)
        assert "16" in host.reason(big) and "8 GPUs" in host.reason(big)
        full = submit(site, BOB, "open", 8, 8, "short", "600", spool=spool)
        wait_for("bob's job running", lambda: host.phase(full) == "running", 120, host.log)
        moved = submit(site, ALICE, "open", 8, 8, "short", spool=spool)
        wait_for("alice's job queued", lambda: host.phase(moved) == "queued", 60, host.log)
        site.as_user(ALICE, "scontrol", "update", f"jobid={moved}", "ReservationName=")
        wait_for("the verdict", lambda: host.phase(moved) != "queued", 60, host.log)
        assert host.phase(moved) == "left", host.reason(moved)
        assert "moved out of the pool" in host.reason(moved)
        assert pool_of(site).state(moved) == "PENDING"
    finally:
        site.slurm("scancel", "--reservation=open")
        site.slurm("scancel", "-u", ALICE)
        host.stop()
