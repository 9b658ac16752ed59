"""Accounts and QOS through hpcorch on the accounting pool (slurmdbd, associations
enforced; tests/conftest.py ``accounting_pool``): ``submit --account`` charges that account,
a wrong one is refused by Slurm with one error line and leaves nothing behind, and the
account and QOS stay with a job across the controller's resizes (same Slurm job, requeued)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import ELASTIC, FAST, ControllerProc, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


def _submit(
    pool: Pool, res: str, lo: int, hi: int, *opts: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return pool.hpcorch(
        "submit", "--pool", res, "--min-gpus", str(lo), "--max-gpus", str(hi),
        "--batch-size", "64", "--max-per-gpu-batch", "64", "--parsable", *opts,
        str(ELASTIC), "--global-batch", "64", "--samples", "2048",
        "--epochs", "40", "--sample-delay", "0.002", check=check,
    )  # fmt: skip


def _running(pool: Pool, ctl: ControllerProc, job: int) -> bool:
    return pool.state(job) == "RUNNING" and ctl.phase(job) == "running"


def _restarts(pool: Pool, job: int) -> int:
    shown = pool.run("scontrol", "-o", "show", "job", str(job), check=False).stdout
    found = re.search(r"\bRestarts=(\d+)", shown)
    return int(found.group(1)) if found else 0


def _resized(ctl: ControllerProc, job: int) -> bool:
    return any(
        d.slurm_id == job and d.action == "signal" and d.detail.startswith("resize")
        for d in ctl.decisions()
    )


def test_account_and_qos_through_submit_and_resize(accounting_pool: Pool, tmp_path: Path) -> None:
    pool = accounting_pool
    res = f"t-acct-{os.getpid()}"
    pool.run(
        "scontrol", "create", "reservation", f"ReservationName={res}", "Nodes=gpu-a003",
        "Users=root", "StartTime=now", "Duration=1-00:00:00", "Flags=IGNORE_JOBS",
    )  # fmt: skip
    jobs = pool.home / "jobs"
    before = sorted(p.name for p in jobs.iterdir()) if jobs.exists() else []
    ctl = ControllerProc(
        pool, tmp_path / "ctl", res, "--nodes", "gpu-a003", "--policy", "share", *FAST
    )
    try:
        # a wrong account: Slurm's refusal as one line, non-zero, no job directory left
        bad = _submit(pool, res, 1, 4, "--account", "nosuch", check=False)
        assert bad.returncode != 0 and bad.stdout == "", bad
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and "account" in lines[-1].lower(), bad.stderr
        assert "Traceback" not in bad.stderr
        after = sorted(p.name for p in jobs.iterdir()) if jobs.exists() else []
        assert after == before
        ctl.start()
        a = int(_submit(pool, res, 1, 4, "--account", "ml", "--qos", "high").stdout.strip())
        wait_for("A running", lambda: _running(pool, ctl, a), 120, ctl.log)
        b = int(_submit(pool, res, 2, 2, "--account", "physics").stdout.strip())
        wait_for("A resized for B", lambda: _resized(ctl, a), 120, ctl.log)
        wait_for(
            "A running again after its requeue",
            lambda: _running(pool, ctl, a) and _restarts(pool, a) >= 1,
            120,
            ctl.log,
        )
        seen = pool.squeue()
        assert (seen[a].account, seen[a].qos) == ("ml", "high"), seen[a]
        assert seen[b].account == "physics", seen[b]

        def accounted() -> str:  # slurmdbd records the job a moment after slurmctld
            sacct = ("sacct", "-j", str(a), "-X", "-P", "-n", "-o", "Account,QOS")
            return pool.run(*sacct, check=False).stdout.strip()

        # (a busy slurmdbd first shows the QOS as Unknown, then its name)
        wait_for(
            "sacct to record A with its QOS",
            lambda: set(accounted().splitlines()) == {"ml|high"},
            90,
            ctl.log,
        )

        # the resize is a requeue in accounting, not a failure: no FAILED row for the
        # launch it ended, and the step is named after the training script, not bash
        def rows() -> list[str]:
            sacct = ("sacct", "-j", str(a), "-D", "-P", "-n", "-o", "JobID,JobName,State,ExitCode")
            return pool.run(*sacct, check=False).stdout.strip().splitlines()

        wait_for(
            "sacct to record A's resized launch and its steps",
            lambda: (
                any(r.startswith(f"{a}.0|") for r in rows())
                and any(r.startswith(f"{a}|") and "REQUEUED" in r for r in rows())
            ),
            90,
            ctl.log,
        )
        print(f"sacct -D -j {a} after its resize:\n" + "\n".join(rows()))
        assert not [r for r in rows() if "FAILED" in r], rows()
        assert not [r for r in rows() if r.split("|")[1] == "bash"], rows()
        described = pool.hpcorch("describe", str(a), "--state-dir", str(tmp_path / "ctl")).stdout
        assert "account ml" in described and "qos high" in described.lower(), described
    finally:
        ctl.stop()
        subprocess.run(["scancel", f"--reservation={res}"], env=pool.env, check=False)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", res], env=pool.env, check=False)
