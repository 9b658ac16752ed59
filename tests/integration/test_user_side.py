"""A user's side on the real local pool: Slurm options that reach Slurm and survive every
resize and relaunch, `logs -f` across a resize, the time budget and the relaunch cap,
status and cancel of many, and the Python API end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import (
    ELASTIC,
    FAST,
    ControllerProc,
    job_dir,
    metrics_lines,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.releases]
NO_ACCOUNTING = "(null)"
"""What scontrol shows for a job's QOS when Slurm runs without slurmdbd."""


def show_job(pool: Pool, job: int) -> dict[str, str]:
    out = pool.run("scontrol", "-o", "show", "job", str(job)).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def started(pool: Pool, job: int) -> bool:
    """The runtime reported its start in the current launch: it can checkpoint now."""
    launch = int(show_job(pool, job).get("Restarts", "0"))
    starts = sum(1 for m in metrics_lines(pool, job) if m.get("event") == "start")
    return starts > launch


@pytest.fixture
def ctl(env_pool: Pool, tmp_path: Path) -> Iterator[ControllerProc]:
    res = f"t-user-{os.getpid()}"
    c = ControllerProc(env_pool, tmp_path / "ctl", res, "--nodes", "n3,n4", *FAST)
    c.start()
    yield c
    c.stop()
    env_pool.run("scancel", f"--reservation={res}", check=False)
    time.sleep(1)
    env_pool.run("scontrol", "delete", "reservation", res, check=False)


def test_slurm_options_reach_slurm(env_pool: Pool) -> None:
    first = env_pool.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 30")
    dep = int(first.stdout.strip().split(";")[0])
    env = {**env_pool.env, "SBATCH_ACCOUNT": "proj-env", "SBATCH_GRES": "gpu:4"}
    pool = Pool(env_pool.dir, env, env_pool.nodes, env_pool.gpus_per_node, env_pool.home)
    try:
        out = pool.hpcorch(
            "submit", "--min-gpus", "1", "--qos", "normal", "--mem", "100M",
            "--mail-type", "END", "--mail-user", "ada", "--dependency", f"afterany:{dep}",
            "--sbatch-arg=--nice=5", "--parsable", "--name", "opts", str(ELASTIC), "--epochs", "1",
        )  # fmt: skip
        job = int(out.stdout.strip())
        info = show_job(env_pool, job)
        assert info["Account"] == "proj-env"  # SBATCH_ACCOUNT taken knowingly, as a default
        # without slurmdbd slurmctld keeps no QOS ("(null)"): then the script shows it
        assert info["QOS"] in ("normal", NO_ACCOUNTING) and info["MinMemoryNode"] == "100M"
        assert "#SBATCH --qos=normal\n" in (job_dir(env_pool, job) / "job.sbatch").read_text()
        assert info["MailType"] == "END" and info["MailUser"] == "ada"
        assert info["Dependency"].startswith(f"afterany:{dep}") and info["Nice"] == "5"
        # SBATCH_GRES did not override hpcorch's (22.05 writes gres:gpu, 23.02+ gres/gpu)
        assert info["TresPerNode"] in ("gres:gpu:1", "gres/gpu:1")
        assert "--account=proj-env" in (job_dir(env_pool, job) / "job.sbatch").read_text()
    finally:
        env_pool.run("scancel", str(dep), check=False)
    assert env_pool.wait_state(job, {"COMPLETED", "FAILED"}, timeout=180) == "COMPLETED"
    rows = json.loads(env_pool.hpcorch("status", "--json", "-j", str(job)).stdout)
    assert rows["version"] == 1 and [r["account"] for r in rows["jobs"]] == ["proj-env"]


def test_options_slurm_refuses_are_one_error_and_nothing_is_left(env_pool: Pool) -> None:
    before = set(env_pool.squeue())
    dirs = set(env_pool.home.glob("jobs/*"))
    res = env_pool.hpcorch(
        "submit", "--min-gpus", "1", "--constraint", "nosuchfeature", str(ELASTIC), check=False
    )
    assert res.returncode == 1
    assert res.stderr.strip() == (
        "Error: sbatch failed: sbatch: error: Batch job submission failed: "
        "Invalid feature specification"
    )
    res = env_pool.hpcorch(
        "submit", "--min-gpus", "1", "--sbatch-arg=--ntasks=3", str(ELASTIC), check=False
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        "Error: --sbatch-arg '--ntasks=3': hpcorch sets --ntasks itself "
        "(hpcorch starts one task per GPU)"
    )
    assert set(env_pool.squeue()) == before and set(env_pool.home.glob("jobs/*")) == dirs


def test_account_survives_resizes_and_logs_follow_them(env_pool: Pool, ctl: ControllerProc) -> None:
    """A pool job with an account and a QOS is grown 1 -> 2 and shrunk 2 -> 1 by the
    controller: both stay; `hpcorch logs -f` started at launch 1 prints every launch and
    exits by itself when the job is done."""
    out = env_pool.hpcorch(
        "submit", "--pool", ctl.reservation, "--min-gpus", "1", "--max-gpus", "2",
        "--account", "proj-a", "--qos", "normal", "--batch-size", "64",
        "--max-per-gpu-batch", "64", "--parsable", "--name", "follow",
        str(ELASTIC), "--global-batch", "64", "--samples", "2048", "--epochs", "40",
        "--sample-delay", "0.002",
    )  # fmt: skip
    job = int(out.stdout.strip())
    follower = subprocess.Popen(
        [sys.executable, "-m", "hpcorch", "logs", "-f", "--interval", "0.5", str(job)],
        env=env_pool.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen: list[tuple[str, str]] = []
        for gpus in (1, 2, 1):
            env_pool.hpcorch("resize", str(job), "--gpus", str(gpus))
            wait_for(
                f"the job running on {gpus} GPU(s)",
                lambda g=gpus: (  # type: ignore[misc]
                    ctl.phase(job) == "running"
                    and env_pool.state(job) == "RUNNING"
                    # 22.05 writes gres:gpu:N, 23.02+ gres/gpu:N
                    and show_job(env_pool, job).get("TresPerNode", "").replace("/", ":")
                    == f"gres:gpu:{g}"
                    and started(env_pool, job)
                ),
                150,
                ctl.log,
            )
            info = show_job(env_pool, job)
            seen.append((info["Account"], info["QOS"]))
        env_pool.hpcorch("resize", str(job), "--auto")
        assert seen[0][0] == "proj-a" and seen[0][1] in ("normal", NO_ACCOUNTING)
        assert seen == [seen[0]] * 3
        assert int(show_job(env_pool, job)["Restarts"]) >= 2
        env_pool.hpcorch("cancel", str(job))
        text, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    launches = [int(n) for n in re.findall(r"hpcorch-run\[\d+\]: launch (\d+):", text)]
    assert launches[:3] == [1, 2, 3], text[-2000:]
    assert f"job {job} ended (CANCELLED)" in err
    whole = env_pool.hpcorch("logs", str(job)).stdout
    assert whole.startswith(text[:200])
    # the launch on 2 GPUs: launch 2, or 3 when the controller had started the job on 2
    # before the first pin (1 GPU) reached it (a loaded machine): read it from the output
    two = re.search(rf"hpcorch-run\[{job}\]: launch (\d+): 2 tasks", text)
    assert two is not None, text[-2000:]
    n = int(two.group(1))
    second = env_pool.hpcorch("logs", "--launch", str(n), str(job)).stdout
    assert second.startswith(f"hpcorch-run[{job}]: launch {n}: 2 tasks")
    assert f"launch {n + 1}:" not in second


def test_the_controller_ends_a_job_past_its_budget(env_pool: Pool, ctl: ControllerProc) -> None:
    out = env_pool.hpcorch(
        "submit", "--pool", ctl.reservation, "--min-gpus", "1", "--time", "UNLIMITED",
        "--time-total", "0:25",
        "--parsable", str(ELASTIC), "--epochs", "1000", "--sample-delay", "0.002",
    )  # fmt: skip
    job = int(out.stdout.strip())
    wait_for("the job timed out", lambda: ctl.phase(job) == "timeout", 180, ctl.log)
    status = env_pool.hpcorch(
        "status", "-j", str(job), "-o", "jobid,state,phase", "--state-dir", str(ctl.state)
    ).stdout
    assert status.splitlines()[-1].split() == [str(job), "CANCELLED", "TIMEOUT"]
    described = env_pool.hpcorch("describe", str(job), "--state-dir", str(ctl.state)).stdout
    assert "time budget spent: ran 0:" in described
    assert any(m.get("event") == "checkpoint" for m in metrics_lines(env_pool, job))
    # checkpointed and requeued itself held for a relaunch, which the controller cancelled
    assert env_pool.state(job) == "CANCELLED"


def test_a_standalone_job_stops_requeueing_at_its_cap(env_pool: Pool) -> None:
    """Without a controller: the job requeues itself after a checkpoint of its own (as at
    its time limit) once; the second time --max-relaunches 1 stops it."""
    out = env_pool.hpcorch(
        "submit", "--min-gpus", "1", "--max-relaunches", "1", "--time-total", "1-00:00:00",
        "--parsable", str(ELASTIC), "--epochs", "1000", "--sample-delay", "0.002",
    )  # fmt: skip
    job = int(out.stdout.strip())
    try:
        for n in (1, 2):
            wait_for(f"launch {n - 1} ready", lambda: started(env_pool, job), 120)
            env_pool.run("scancel", "--signal=USR2", "--batch", str(job))
            if n == 1:
                wait_for(
                    "the job requeued and running again",
                    lambda: (
                        show_job(env_pool, job).get("Restarts") == "1"
                        and env_pool.state(job) == "RUNNING"
                    ),
                    120,
                )
        env_pool.wait_state(job, {"FAILED", "COMPLETED"}, timeout=120)
        log = env_pool.hpcorch("logs", str(job)).stdout
        assert "training checkpointed: requeueing job" in log
        assert "not requeued: 1 relaunches allowed (HPCORCH_MAX_RELAUNCHES)" in log
        assert "time budget: " in log and "this launch's time limit is 1440 min" in log
        assert (job_dir(env_pool, job) / "time-used").read_text().split()[0] == "2"
        assert show_job(env_pool, job).get("Restarts") == "1"
    finally:
        env_pool.run("scancel", str(job), check=False)


def test_cancel_many_by_name(env_pool: Pool) -> None:
    name = f"many{os.getpid()}"
    ids = [
        int(
            env_pool.hpcorch(
                "submit", "--min-gpus", "1", "--name", name, "--parsable",
                str(ELASTIC), "--epochs", "1000",
            ).stdout.strip()
        )
        for _ in range(3)
    ]  # fmt: skip
    listed = env_pool.hpcorch("status", "-n", name, "-t", "PD,R", "-h", "-o", "%i").stdout
    assert listed.split() == [str(i) for i in ids]
    res = env_pool.hpcorch("cancel", "--name", name)
    assert res.stdout.splitlines() == [f"cancelled job {i}" for i in ids]
    for i in ids:
        env_pool.wait_state(i, {"CANCELLED"}, timeout=30)


def square_sum(n: int) -> int:
    import os as _os

    return sum(i * i for i in range(n)) + int(_os.environ.get("WORLD_SIZE", "0")) * 1000


def test_python_api_end_to_end(env_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in env_pool.env.items():
        monkeypatch.setenv(key, value)
    from hpcorch.api import Executor, JobError

    ex = Executor(min_gpus=2, name="api")
    job = ex.submit(square_sum, 10)
    assert job.result(timeout=180, poll=1) == 285 + 2000  # rank 0's, on 2 GPUs
    assert job.state == "COMPLETED" and job.done()

    offset = 7
    closure = ex.submit(lambda: offset * 6)  # by value: needs cloudpickle
    assert closure.result(timeout=180, poll=1) == 42

    failing = ex.submit(divmod, 1, 0)
    with pytest.raises(JobError, match="ZeroDivisionError"):
        failing.result(timeout=180, poll=1)

    ex.update(min_gpus=1, max_gpus=1)
    script = ex.submit_script(str(ELASTIC), "--epochs", "1000", "--batch-size", "48")
    wait_for("the script running", lambda: script.state == "RUNNING" and script.gpus == 1, 120)
    wait_for("its batch reported", lambda: script.batch_size == 48, 60)
    wait_for("its first output", lambda: "launch 1:" in script.logs(), 60)
    assert "launch 1: 1 tasks on 1 node(s) x 1" in script.logs(launch=1)
    script.cancel()
    assert script.wait(timeout=60, poll=1) == "CANCELLED"
