"""The pool is the controller's alone (issue 23), on the real local pool: a stranger's job
in the reservation, a job released by its owner or started by an admin, a launch Slurm
keeps pending, a node that comes back, an empty or a full state directory. With real second
Unix users (tests/integration/users.py) where it matters: Slurm itself, through
slurm/job_submit.lua, keeps them out of the pool."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Pool
from tests.integration.controller_util import (
    FAST,
    ControllerProc,
    job_dir,
    metrics_lines,
    submit,
    wait_for,
    wait_for_phase,
)
from tests.integration.test_trust import fill_up, mount_small, reservation, run_unit, stop_unit
from tests.integration.users import (
    ALICE,
    BOB,
    Site,
    sbatch_as,
    site_beside,
)

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


def cleanup(pool: Pool, res: str) -> None:
    pool.run("scancel", f"--reservation={res}", check=False)
    time.sleep(1)
    pool.run("scontrol", "delete", "reservation", res, check=False)


def show(pool: Pool, job: int) -> str:
    return pool.run("scontrol", "-o", "show", "job", str(job), check=False).stdout


def test_a_strangers_job_in_the_pool_is_counted_shown_and_never_planned(
    env_pool: Pool, tmp_path: Path
) -> None:
    """Finding 3: plain `sbatch --reservation=POOL --gres=gpu:4` runs at once in an open
    pool; the controller counts its GPUs as taken (the newcomer runs beside it at once, on
    the other node), shows it in `status` with its owner, and never plans around it."""
    res = f"t-stranger-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n1,n2", "--policy", "share", *FAST
    )
    ctl.start()
    try:
        stranger = int(
            env_pool.run(
                "sbatch", "--parsable", f"--reservation={res}", "-w", "n1", "--gres=gpu:4",
                "--output=/dev/null", "--job-name=stranger", "--wrap", "sleep 600",
            ).stdout.strip()
        )  # fmt: skip
        env_pool.wait_state(stranger, {"RUNNING"}, 60)
        job = submit(env_pool, res, "newcomer", 2, 8, "--epochs", "2")
        submitted = time.time()
        wait_for("the newcomer running", lambda: env_pool.state(job) == "RUNNING", 120, ctl.log)
        assert time.time() - submitted <= 120
        seen = env_pool.squeue()[job]
        assert seen.gpus <= 4 and "n1" not in seen.nodes, show(env_pool, job)
        # never planned onto the stranger's GPUs: no start asked for more than n2 has
        assert all(d.to_gpus <= 4 for d in ctl.decisions() if d.action == "start")
        out = env_pool.hpcorch("status", "--state-dir", str(ctl.state)).stdout
        block = out.split("NOT PLACED BY THE CONTROLLER", 1)[-1]
        assert str(stranger) in block and "root" in block and "n1:4" in block, out
        assert "without the controller" in ctl.log.read_text()
        wait_for_phase(ctl, job, "done", 300)
    finally:
        ctl.stop()
        cleanup(env_pool, res)


def test_a_launch_without_the_controllers_plan_runs_nothing(env_pool: Pool) -> None:
    """Finding 4's last line of defence: a pool job released by someone else (here root,
    who may release any hold) finds no plan of the controller's: the wrapper runs nothing
    and exits 77."""
    res = f"t-unplanned-{os.getpid()}"
    env_pool.run(
        "scontrol", "create", "reservation", f"ReservationName={res}", "Nodes=n4",
        "Users=root", "StartTime=now", "Duration=60", "Flags=IGNORE_JOBS",
    )  # fmt: skip
    try:
        job = submit(env_pool, res, "unplanned", 1, 1, "--epochs", "1")
        env_pool.run("scontrol", "release", str(job))
        wait_for("the launch to end", lambda: env_pool.state(job) in ("FAILED", "COMPLETED"), 120)
        assert env_pool.squeue()[job].exit_code == 77, show(env_pool, job)
        d = job_dir(env_pool, job)
        assert not metrics_lines(env_pool, job), "the training script ran"
        out = (d / f"slurm-{job}.out").read_text() if d.exists() else ""
        assert "not started by the hpcorch controller" in out, out
    finally:
        cleanup(env_pool, res)


def test_a_launch_slurm_keeps_pending_is_planned_again(env_pool: Pool, tmp_path: Path) -> None:
    """A launch the controller released that Slurm keeps pending (here: an admin took the
    partition down) shows Slurm's reason in `status`, and past --launch-pending is held and
    planned again; it runs once Slurm lets it."""
    res = f"t-pending-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n3", "--policy", "share",
        "--launch-pending", "15", *FAST,
    )  # fmt: skip
    ctl.start()
    env_pool.run("scontrol", "update", "PartitionName=gpu", "State=DOWN")
    try:
        job = submit(env_pool, res, "pending", 1, 4, "--epochs", "1")
        state = str(ctl.state)

        def reason() -> str:
            return env_pool.hpcorch("status", "--state-dir", state, "-o", "jobid,reason").stdout

        wait_for("Slurm's reason shown", lambda: "PartitionDown" in reason(), 60, ctl.log)
        wait_for(
            "the launch planned again",
            lambda: "replan: Slurm kept the launch pending" in ctl.log.read_text(),
            60,
            ctl.log,
        )
        assert "(PartitionDown)" in ctl.log.read_text()
        env_pool.run("scontrol", "update", "PartitionName=gpu", "State=UP")
        wait_for_phase(ctl, job, "done", 300)
    finally:
        env_pool.run("scontrol", "update", "PartitionName=gpu", "State=UP", check=False)
        ctl.stop()
        cleanup(env_pool, res)


def test_an_empty_state_beside_a_pool_with_jobs_needs_adopt(env_pool: Pool, tmp_path: Path) -> None:
    """Finding 8: a zero-length state.db beside a reservation with jobs refuses to start
    (one line naming --adopt) and changes nothing; --adopt takes the jobs over."""
    res = f"t-empty-{os.getpid()}"
    ctl = ControllerProc(env_pool, tmp_path / "ctl", res, "--nodes", "n4", *FAST)
    ctl.start()
    try:
        job = submit(env_pool, res, "kept", 1, 2, "--epochs", "6", "--sample-delay", "0.002")
        wait_for("the job running", lambda: ctl.phase(job) == "running", 120, ctl.log)
        ctl.stop()
        db = ctl.state / "state.db"
        for extra in ("state.db-wal", "state.db-shm"):
            (ctl.state / extra).unlink(missing_ok=True)
        db.write_bytes(b"")
        again = env_pool.hpcorch(
            "controller", "--reservation", res, "--state-dir", str(ctl.state), "--once",
            check=False,
        )  # fmt: skip
        err = again.stderr.strip()
        assert again.returncode != 0 and "Traceback" not in err, err
        last = err.splitlines()[-1]  # warnings may come before it; the error is one line
        assert "is empty" in last and "--adopt" in last and str(job) in last, err
        assert env_pool.state(job) == "RUNNING"  # nothing touched
        adopted = ControllerProc(env_pool, ctl.state, res, "--adopt", *FAST)
        adopted.start()
        try:
            wait_for_phase(adopted, job, "done", 300)
        finally:
            adopted.stop()
    finally:
        ctl.stop()
        cleanup(env_pool, res)


def test_a_full_state_directory_keeps_jobs_running_and_says_so_once(
    env_pool: Pool, tmp_path: Path
) -> None:
    """Finding 8: the state directory fills up under a running job: the job keeps running,
    the log says so once, and once there is space again the job finishes."""
    res = f"t-full-{os.getpid()}"
    state = tmp_path / "small"
    mount_small(state)
    (state / "fill").unlink()  # room for the state to start with
    ctl = ControllerProc(env_pool, state, res, "--nodes", "n4", *FAST)  # the tests' spool
    try:
        subprocess.run(["mount", "-o", "remount,size=4m", str(state)], check=True)
        ctl.start()
        job = submit(env_pool, res, "full", 1, 2, "--epochs", "15", "--sample-delay", "0.004")
        wait_for("the job running", lambda: ctl.phase(job) == "running", 120, ctl.log)
        fill_up(state)
        time.sleep(20)
        assert env_pool.state(job) == "RUNNING", show(env_pool, job)
        log = ctl.log.read_text()
        assert log.count("cannot be written") == 1, log[-3000:]
        assert ctl.proc is not None and ctl.proc.poll() is None
        (state / "fill").unlink()
        wait_for_phase(ctl, job, "done", 300)
        assert "writable again" in ctl.log.read_text()
    finally:
        ctl.stop()
        cleanup(env_pool, res)
        subprocess.run(["umount", "-l", str(state)], check=False)


def node_responds(pool: Pool, node: str) -> bool:
    """Whether slurmctld has ``node`` registered and in service (not DOWN, not '*')."""
    state = pool.run("sinfo", "-h", "-N", "-n", node, "-o", "%t").stdout.strip()
    return bool(state) and "*" not in state and not state.startswith(("down", "drain", "fail"))


def _undo_duplicate_drain(pool: Pool, node: str) -> bool:
    """Resume ``node`` where Slurm itself drained it for a "Duplicate jobid" (the returning
    node's slurmd still held the job's last launch, under a loaded machine, when the job was
    started there again), as the site's admin would: the flaps are the test's, that drain is
    Slurm's. Always False (a condition that never ends a wait)."""
    reason = pool.run("sinfo", "-h", "-N", "-n", node, "-o", "%t %E", check=False).stdout
    if reason.startswith("drain") and "Duplicate jobid" in reason:
        print(f"{node} drained by Slurm ({reason.strip()}): resumed")
        pool.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    return False


@pytest.mark.slow
def test_a_node_that_comes_back_costs_no_retry(env_pool: Pool, tmp_path: Path) -> None:
    """Finding 5: the job's node loses its slurmd past SlurmdTimeout three times; each time
    Slurm requeues the job and the node comes back. No flap counts as a try of the job
    (--max-retries 2 would fail it at the third): it finishes, its failures 0."""
    res = f"t-flap-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n3", "--policy", "share",
        "--max-retries", "2", *FAST,
    )  # fmt: skip
    ctl.start()
    try:
        # it trains until the three flaps are over (a file tells it), however fast it runs
        stop = tmp_path / "flaps-done"
        job = submit(env_pool, res, "flap", 4, 4, "--epochs", "100000", "--sample-delay",
                     "0.004", "--until-file", str(stop))  # fmt: skip
        for flap in range(1, 4):
            # Each flap starts from a settled pool: the job RUNNING in Slurm (and training in
            # the controller's view: a slurmd killed while srun launches the step fails the
            # launch, exit 233, before Slurm sees a node failure) on n3, whose slurmd is
            # registered. Slurm may requeue the job more than once per flap (a returning
            # node that does not know the job): the count is read before each kill, not
            # assumed.
            wait_for(
                f"launch {flap} running",
                lambda: (
                    ctl.phase(job) == "failed"
                    or (
                        ctl.training(job)  # its step is up: the kill is a node failure
                        and env_pool.state(job) == "RUNNING"
                        and node_responds(env_pool, "n3")
                    )
                ),
                240,
                ctl.log,
            )
            assert ctl.phase(job) == "running", ctl.log.read_text()[-3000:]
            before = env_pool.squeue()[job].restarts
            pid = int((env_pool.dir / "run" / "slurmd-n3.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            wait_for(
                f"Slurm's requeue after flap {flap}",
                lambda b=before: env_pool.squeue()[job].restarts > b,  # type: ignore[misc]
                180,
                ctl.log,
            )
            up = [str(REPO / "slurm" / "pool"), "up"]
            subprocess.run(up, env=env_pool.env, check=True, capture_output=True)
            wait_for(f"n3 back after flap {flap}", lambda: node_responds(env_pool, "n3"), 120)
        stop.touch()
        wait_for(
            "the job ended",
            lambda: ctl.phase(job) in ("done", "failed") or _undo_duplicate_drain(env_pool, "n3"),
            900,
            ctl.log,
        )
        store = ctl.store()
        rec = store.job(job)
        store.close()
        log = ctl.log.read_text()
        refused = log.count("restart after a node failure ended at once")
        print(f"3 node flaps: {refused} launch(es) refused by the returning node, not counted")
        assert rec is not None and rec.phase == "done" and rec.failures == 0, rec
        assert "retry 1/2" not in log
    finally:
        ctl.stop()
        subprocess.run(
            [str(REPO / "slurm" / "pool"), "up"], env=env_pool.env, check=False, capture_output=True
        )
        cleanup(env_pool, res)


# --- a closed pool, with real second users ------------------------------------------------
@pytest.fixture(scope="module")
def closed_site(slurm_pool: Pool) -> Iterator[Site]:
    with site_beside(slurm_pool, 60, closed=".") as s:
        yield s


def test_only_the_controller_places_jobs_in_a_closed_pool(
    closed_site: Site, tmp_path: Path
) -> None:
    """Findings 2, 3 and 4 as Slurm enforces them: in a pool closed by job_submit.lua, a
    pool user's plain sbatch/srun (any spelling) is refused with one line, a job cannot be
    moved in, the controller's holds are admin holds, and its owner cannot release a queued
    job; it runs when the controller starts it."""
    s = closed_site
    reservation(s, "hpcorch", f"{ALICE},{BOB}")
    var_lib = s.root / "var-lib-closed"
    log = s.root / "closed.log"
    proc = run_unit(s, var_lib, log, "--nodes", "n1,n2", *FAST)
    try:
        wait_for("the controller up", lambda: "adopted reservation" in log.read_text(), 60, log)
        quiet = ["--output=/dev/null", "--wrap", "sleep 60"]
        attacks = [
            ["sbatch", "--reservation=hpcorch", "--gres=gpu:4", *quiet],
            ["sbatch", "--reserv=hpcorch", "--gres=gpu:4", *quiet],  # sbatch's prefix rule
            ["sbatch", "--hold", "--reservation=hpcorch", *quiet],  # held, but not hpcorch's
            ["srun", "--reservation=hpcorch", "--gres=gpu:1", "true"],
        ]
        for argv in attacks:
            r = s.as_user(ALICE, *argv, check=False)
            assert r.returncode != 0, (argv, r.stdout)
            assert "only its controller places jobs there" in r.stderr, r.stderr
        outside = int(
            s.as_user(
                ALICE, "sbatch", "--parsable", "--hold", "--output=/dev/null", "--wrap", "sleep 60"
            ).stdout.strip()
        )
        moved = s.as_user(
            ALICE, "scontrol", "update", f"jobid={outside}", "ReservationName=hpcorch", check=False
        )
        assert moved.returncode != 0
        s.slurm("scancel", str(outside))
        # bob's job fills the pool (8 GPUs); alice's waits, queued
        big = sbatch_as(s, BOB, "hpcorch:id=big,min=8,max=8,batch=64", "hpcorch")
        pool = Pool(s.pool_dir, s.env, 2, 4, s.root)
        wait_for("bob's job running", lambda: pool.state(big) == "RUNNING", 120, log)
        mine = sbatch_as(s, ALICE, "hpcorch:id=mine,min=1,max=2,batch=64", "hpcorch")
        wait_for(
            "alice's job under the controller's hold",
            lambda: "JobHeldAdmin" in show(pool, mine),
            60,
            log,
        )
        r = s.as_user(ALICE, "scontrol", "release", str(mine), check=False)
        assert r.returncode != 0, r.stdout
        time.sleep(10)
        assert pool.state(mine) == "PENDING" and "JobHeldAdmin" in show(pool, mine)
        s.slurm("scancel", str(big))
        wait_for("alice's job started", lambda: pool.state(mine) == "RUNNING", 120, log)
        assert "Traceback" not in log.read_text()
    finally:
        stop_unit(proc, s)
