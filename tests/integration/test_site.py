"""A pool as a real site runs it: nodes named gpu-a001 .. gpu-a004, slurmdbd on MariaDB
with associations enforced (tests/conftest.py ``accounting_pool``). Every command works on
it, Slurm itself checks accounts and QOS, the controller keeps its reservation open, and
status/describe fall back to sacct once squeue has forgotten a job."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import FAST, ControllerProc, submit, wait_for, wait_for_phase

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


def test_slurm_checks_accounts_and_qos(accounting_pool: Pool) -> None:
    pool = accounting_pool
    base = ["sbatch", "--parsable", "--gres=gpu:1", "--wrap", "true", "-o", "/dev/null"]
    bad = pool.run(*base, "--account=nosuch", check=False)
    assert bad.returncode != 0 and "Invalid account" in bad.stderr
    bad = pool.run(*base, "--qos=bogus", check=False)
    assert bad.returncode != 0 and "Invalid qos" in bad.stderr
    job = int(pool.run(*base, "--account=physics", "--qos=high").stdout.strip())
    pool.wait_state(job, {"COMPLETED"}, 60)
    seen = pool.squeue()[job]
    assert (seen.account, seen.qos) == ("physics", "high")
    # slurmctld sends the job's end to slurmdbd on its own time: under load sacct can
    # still say PENDING for a moment after squeue says COMPLETED
    want = r"physics\|COMPLETED\|gpu-a00[1-4]"
    deadline = time.time() + 60
    while True:
        out = pool.run("sacct", "-j", str(job), "-X", "-P", "-n", "-o", "Account,State,NodeList")
        if re.fullmatch(want, out.stdout.strip()) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert re.fullmatch(want, out.stdout.strip()), out.stdout


def test_every_command_on_gpu_a_nodes(accounting_pool: Pool, tmp_path: Path) -> None:
    pool = accounting_pool
    res = "t-site"
    # an admin's reservation that ends in 10 days: the controller extends it
    pool.run(
        "scontrol", "create", "reservation", f"ReservationName={res}",
        "Nodes=gpu-a[001-002]", "Users=root", "StartTime=now", "Duration=10-00:00:00",
        "Flags=IGNORE_JOBS",
    )  # fmt: skip
    ctl = ControllerProc(pool, tmp_path / "ctl", res, "--policy", "share", *FAST)
    try:
        status = pool.hpcorch("status").stdout
        assert all(f"gpu-a00{i}" in status for i in range(1, 5)), status
        ctl.start()
        line = pool.run("scontrol", "-o", "show", "reservation", res).stdout
        end = time.mktime(time.strptime(re.search(r"EndTime=(\S+)", line)[1], "%Y-%m-%dT%H:%M:%S"))  # type: ignore[index]
        assert end - time.time() > 3000 * 86400, line  # extended to ten years
        job = submit(pool, res, "site", 1, 2, "--epochs", "1")
        wait_for_phase(ctl, job, "done", 300)
        store = ctl.store()
        rec = store.job(job)
        store.close()
        assert rec is not None and rec.node_list.startswith("gpu-a00"), rec
        state = str(tmp_path / "ctl")
        described = pool.hpcorch("describe", str(job), "--state-dir", state).stdout
        assert "Slurm: COMPLETED" in described and "gpu-a00" in described, described
        metrics = pool.hpcorch("metrics", "--state-dir", state).stdout
        m = re.search(r"^hpcorch_reservation_end_timestamp_seconds (\S+)$", metrics, re.M)
        assert m and abs(float(m[1]) - end) < 120, metrics
        # squeue forgets the job (MinJobAge=5; slurmctld purges about once a minute) ...
        wait_for("squeue to forget the job", lambda: job not in pool.squeue(), 150)
        # ... and status and describe still show it, from sacct
        doc = json.loads(pool.hpcorch("status", "--json", "--state-dir", state).stdout)
        row = next(r for r in doc["jobs"] if r["job_id"] == job)
        assert row["state"] == "COMPLETED" and row["nodes"].startswith("gpu-a00"), row
        assert [u["user"] for u in doc["usage"]] == ["root"] and doc["usage"][0]["gpu_seconds"] > 0
        text = pool.hpcorch("status", "--state-dir", state).stdout
        assert "USAGE by user" in text and "GPU-HOURS" in text, text
        described = pool.hpcorch("describe", str(job), "--state-dir", state).stdout
        assert "Slurm: COMPLETED" in described, described
        assert ctl.stop() == 0
    finally:
        ctl.stop()
        subprocess.run(["scancel", f"--reservation={res}"], env=pool.env, check=False)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", res], env=pool.env, check=False)


def test_the_site_files_reservation_command_works_as_written(accounting_pool: Pool) -> None:
    """slurm/site/slurm.conf.fragment's `scontrol create reservation` (the admin guide's),
    on this pool's nodes and an existing group: accepted, ten years, no FLEX."""
    import shlex

    from tests.integration.users import ALICE, ensure_user

    text = Path(__file__).resolve().parents[2] / "slurm" / "site" / "slurm.conf.fragment"
    lines = [ln.lstrip("# ").rstrip("\\ ").strip() for ln in text.read_text().splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("scontrol create reservation"))
    argv = shlex.split(lines[start] + " " + lines[start + 1])
    ensure_user(ALICE)  # a group with a member: Slurm wants "at least 1 user or 1 account"
    group = ALICE
    swap = {"ReservationName": "t-fragment", "Nodes": "gpu-a004", "Groups": group}
    argv = [f"{k}={swap[k]}" if (k := a.split("=", 1)[0]) in swap and "=" in a else a for a in argv]
    assert "Duration=3650-00:00:00" in argv and not any("FLEX" in a for a in argv)
    try:
        accounting_pool.run(*argv)
        shown = accounting_pool.run("scontrol", "show", "reservation", "t-fragment").stdout
        assert "Flags=IGNORE_JOBS" in shown and f"Groups={group}" in shown, shown
        assert "FLEX" not in shown
    finally:
        subprocess.run(
            ["scontrol", "delete", "reservation=t-fragment"], env=accounting_pool.env,
            capture_output=True,
        )  # fmt: skip
