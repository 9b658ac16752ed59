"""The first end-to-end slice on a real local Slurm pool: submit -> Slurm -> DDP -> status."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from hpcorch.slurm.parse import SlurmJob, parse_squeue
from tests.conftest import EXAMPLE, REPO, Pool

pytestmark = [pytest.mark.slurm, pytest.mark.releases]

NASTY_TAG = 'two words; it\'s "quoted" $HOME `date` & done'


def job_dir_of(pool: Pool, job_id: int) -> Path:
    for spec in pool.home.glob("jobs/*/job.json"):
        if json.loads(spec.read_text())["slurm_id"] == job_id:
            return spec.parent
    raise AssertionError(f"no job directory for job {job_id}")


def test_ddp_job_trains_and_status_lists_it(slurm_pool: Pool) -> None:
    out = slurm_pool.hpcorch(
        "submit",
        "--min-gpus",
        "2",
        "--max-gpus",
        "4",
        "--batch-size",
        "64",
        "--parsable",
        str(EXAMPLE),
        "--epochs",
        "3",
        "--tag",
        NASTY_TAG,
    )
    job_id = int(out.stdout.strip())
    slurm_pool.wait_state(job_id, {"RUNNING", "COMPLETED"}, timeout=60)

    status = json.loads(slurm_pool.hpcorch("status", "--json").stdout)
    row = next(j for j in status["jobs"] if j["job_id"] == job_id)
    assert (row["gpus"], row["min_gpus"], row["max_gpus"], row["global_batch"]) == (2, 2, 4, 64)
    assert sum(p["gpus"] for p in status["pool"]) == 16

    assert slurm_pool.wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=120) == "COMPLETED"
    jdir = job_dir_of(slurm_pool, job_id)
    result = json.loads((jdir / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["losses"][-1] < 0.9 * result["losses"][0], result["losses"]
    assert result["tag"] == NASTY_TAG  # reached the script unchanged, never shell-parsed
    log = (jdir / f"slurm-{job_id}.out").read_text()
    assert "launch 1: 2 tasks on 1 node(s) x 2" in log and "training finished" in log

    text = slurm_pool.hpcorch("status").stdout
    line = next(ln for ln in text.splitlines() if ln.startswith(str(job_id)))
    assert "COMPLETED" in line and "2-4" in line and "64" in line


def test_cancel_stops_a_running_job(slurm_pool: Pool) -> None:
    out = slurm_pool.hpcorch(
        "submit",
        "--min-gpus",
        "1",
        "--parsable",
        str(EXAMPLE),
        "--epochs",
        "100000",
    )
    job_id = int(out.stdout.strip())
    slurm_pool.wait_state(job_id, {"RUNNING"}, timeout=60)
    res = slurm_pool.hpcorch("cancel", str(job_id))
    assert res.stdout.strip() == f"cancelled job {job_id}"
    assert slurm_pool.wait_state(job_id, {"CANCELLED"}, timeout=30) == "CANCELLED"
    again = slurm_pool.hpcorch("cancel", str(job_id), check=False)
    assert again.returncode == 1 and "already ended (CANCELLED)" in again.stderr


def test_cancel_refuses_jobs_hpcorch_did_not_submit(slurm_pool: Pool) -> None:
    out = slurm_pool.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60")
    job_id = int(out.stdout.strip().split(";")[0])
    try:
        res = slurm_pool.hpcorch("cancel", str(job_id), check=False)
        assert res.returncode == 1
        assert res.stderr.strip().endswith(f"job {job_id} was not submitted by hpcorch")
        assert slurm_pool.state(job_id) in {"PENDING", "RUNNING"}
    finally:
        slurm_pool.run("scancel", str(job_id))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--min-gpus", "17"],
            "--min-gpus 17 exceeds the 16 GPUs of partition 'gpu' (4 nodes x 4)",
        ),
        (["--min-gpus", "1", "--partition", "nope"], "unknown partition 'nope' (valid: gpu)"),
    ],
)
def test_requests_the_pool_cannot_meet(slurm_pool: Pool, args: list[str], needle: str) -> None:
    before = slurm_pool.squeue().keys()
    res = slurm_pool.hpcorch("submit", *args, str(EXAMPLE), check=False)
    assert res.returncode == 1
    assert res.stderr.strip() == f"Error: {needle}"
    assert slurm_pool.squeue().keys() == before
    assert not list(slurm_pool.home.glob("jobs/*/job.sbatch")) or all(
        json.loads((p.parent / "job.json").read_text())["slurm_id"]
        for p in slurm_pool.home.glob("jobs/*/job.sbatch")
    )


def test_wrapper_standalone_forwards_the_checkpoint_signal(
    slurm_pool: Pool, tmp_path: Path
) -> None:
    """sbatch the wrapper directly; USR2 to the batch shell reaches every task, which exit 75."""
    script = tmp_path / "waits.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR2, lambda *a: sys.exit(75))\n"
        "open(os.path.join(os.environ['HPCORCH_JOB_DIR'], 'ready-' + os.environ['RANK']), 'w')\n"
        "time.sleep(120)\n"
    )
    # under a controller, but with no spool to read a plan from (so no plan is required)
    env = {k: v for k, v in slurm_pool.env.items() if k != "HPCORCH_SPOOL"}
    env_pool = Pool(slurm_pool.dir, {**env, "HPCORCH_CONTROLLED": "1"}, 4, 4)
    out = env_pool.run(
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--gres=gpu:2",
        f"--chdir={tmp_path}",
        "-o",
        str(tmp_path / "out.log"),
        str(REPO / "jobscripts" / "hpcorch-run.sbatch"),
        str(script),
    )
    job_id = int(out.stdout.strip())
    jdir = tmp_path / f"hpcorch-{job_id}"
    slurm_pool.wait_state(job_id, {"RUNNING"}, timeout=60)
    deadline = time.time() + 60
    while len(list(jdir.glob("ready-*"))) < 4 and time.time() < deadline:
        time.sleep(0.2)
    assert sorted(p.name for p in jdir.glob("ready-*")) == [f"ready-{r}" for r in range(4)]
    slurm_pool.run("scancel", "--signal=USR2", "--batch", str(job_id))

    def requeued() -> SlurmJob | None:
        doc = json.loads(slurm_pool.run("squeue", "--json", "--states=all").stdout)
        (job,) = [j for j in parse_squeue(doc) if j.job_id == job_id]
        return job if job.special_exit and job.state == "PENDING" else None

    # exit 75 of the tasks: the wrapper requeues the job held in SPECIAL_EXIT for the
    # controller's relaunch, and ends with that requeue (exit 0): no failure in accounting
    deadline = time.time() + 60
    while (job := requeued()) is None and time.time() < deadline:
        time.sleep(0.5)
    try:
        assert job is not None, slurm_pool.run("scontrol", "show", "job", str(job_id)).stdout
        assert job.held and job.restarts == 1
        log = (tmp_path / "out.log").read_text()
        assert "4 tasks on 2 node(s) x 2" in log
        assert "training checkpointed: requeued held for the controller's relaunch" in log
    finally:
        slurm_pool.run("scancel", str(job_id), check=False)


def test_pool_up_is_idempotent(slurm_pool: Pool) -> None:
    res = slurm_pool.run(str(REPO / "slurm" / "pool"), "up")
    assert "4 nodes x 4 GPUs" in res.stderr
    assert "starting" not in res.stderr  # nothing restarted
    status = slurm_pool.run(str(REPO / "slurm" / "pool"), "status").stdout
    assert status.count("idle") + status.count("mixed") + status.count("allocated") >= 4


def test_submit_wait_exits_with_the_jobs_code_and_status_errs_as_squeue(
    slurm_pool: Pool, tmp_path: Path
) -> None:
    """`submit --wait` returns when the job has ended, with its exit code (0: COMPLETED),
    as sbatch --wait; `status -j` of a job Slurm does not know and `-u` of a user the
    system does not know are errors, as in squeue."""
    script = tmp_path / "exit.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    ok = slurm_pool.hpcorch("submit", "--min-gpus", "1", "--wait", str(script), "0")
    assert ok.returncode == 0 and "ended: COMPLETED (exit code 0)" in ok.stderr, ok.stderr
    bad = slurm_pool.hpcorch("submit", "--min-gpus", "1", "--wait", str(script), "3", check=False)
    assert bad.returncode != 0 and "ended: FAILED" in bad.stderr, bad.stderr
    gone = slurm_pool.hpcorch("status", "-j", "4000000", check=False)
    assert gone.returncode == 1 and "invalid job id(s): 4000000" in gone.stderr
    nobody = slurm_pool.hpcorch("status", "-u", "nosuchuser-hpc", check=False)
    assert nobody.returncode == 2 and "invalid user: nosuchuser-hpc" in nobody.stderr


def test_straight_to_slurm_a_job_runs_on_the_gpus_it_asked_for(slurm_pool: Pool) -> None:
    """``--gpus 3`` within 1..4: Slurm holds 3 GPUs on one node, DDP runs 3 ranks, and the
    comment carries the request (``req=3``) for a pool's controller."""
    out = slurm_pool.hpcorch(
        "submit", "--min-gpus", "1", "--max-gpus", "4", "--gpus", "3", "--batch-size", "48",
        "--parsable", str(EXAMPLE), "--epochs", "1",
    )  # fmt: skip
    job_id = int(out.stdout.strip())
    assert slurm_pool.wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=120) == "COMPLETED"
    shown = slurm_pool.run("scontrol", "show", "job", str(job_id)).stdout
    assert "NumNodes=1 " in shown and "NumCPUs=6 " in shown, shown  # 2 CPUs per GPU here
    assert re.search(r"TresPerNode=gres[:/]gpu:3\b", shown), shown  # 25.11: gres/gpu:3
    assert "req=3" in shown
    result = json.loads((job_dir_of(slurm_pool, job_id) / "result.json").read_text())
    assert result["world_size"] == 3
