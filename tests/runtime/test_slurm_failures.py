"""Failure paths on the real pool: torn checkpoint, bad plan/checkpoint files, MPI launch."""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from hpcorch.protocol import CHECKPOINT_FORMAT, EXIT_CONFIG, EXIT_DONE, LAUNCH_FILE
from tests.runtime.harness import EXAMPLE, events, free_port, sbatch, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SMALL = ["--epochs", "1", "--samples", "256", "--global-batch", "32"]


def snapshot(d: Path) -> dict[str, bytes]:
    """The files of a job directory, but for the wrapper's record of the launch that owns it
    (written before any task starts)."""
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and p.relative_to(d) != Path(LAUNCH_FILE)
    }


def test_kill_9_during_checkpoint_write_resumes_from_previous_good(
    runtime_pool: dict[str, str], tmp_path: Path
) -> None:
    jd = tmp_path / "torn"
    ck = jd / "checkpoints"
    # ~36 MB checkpoints (parameters + momentum), one at every step boundary
    args = ["--epochs", "1", "--samples", "2048", "--global-batch", "64", "--hidden", "1500",
            "--layers", "3", "--step-delay", "0.05"]  # fmt: skip
    for _attempt in range(3):  # the write window is short; try again if the kill missed it
        job = sbatch(runtime_pool, jd, args, gpus_per_node=1, HPCORCH_CKPT_INTERVAL="0.001")
        wait_for(lambda: any(ck.glob("ckpt-*.pt")) and any(ck.glob("*.tmp")), 120, 0.002)
        pid = int(__import__("json").loads((jd / "heartbeat").read_text())["pid"])
        os.kill(pid, signal.SIGKILL)
        job.wait()
        if any(ck.glob("*.tmp")):
            break
    torn = sorted(ck.glob("*.tmp"))
    good = sorted(ck.glob("ckpt-*.pt"))
    assert torn and good, "no torn checkpoint produced"
    good_step = int(good[-1].name[5:14])
    assert int(torn[-1].name[5:14]) > good_step
    job = sbatch(runtime_pool, jd, [*args], gpus_per_node=1)
    assert job.wait() == EXIT_DONE, job.output()
    assert (
        f"checkpoint {torn[-1].name} is incomplete (its writer was killed); "
        f"resuming from the previous good one, {good[-1].name}"
    ) in job.output()
    assert events(jd, "start")[-1]["step"] == good_step


def fake_checkpoint(version: int = 1, job: str | None = None, truncate: bool = False) -> bytes:
    buf = io.BytesIO()
    torch.save(
        {"format": CHECKPOINT_FORMAT, "version": version, "job": job, "x": torch.ones(9)}, buf
    )
    data = buf.getvalue()
    return data[: len(data) // 2] if truncate else data


BAD_FILES = [
    ("plan-json", {"plan.json": b'{"version": 1, "global_batch": '}, {}, "is not valid JSON"),
    ("plan-version", {"plan.json": b'{"version": 7, "global_batch": 32, "gpus": 1, '
                      b'"max_micro_batch": 8}'}, {}, "has plan version 7"),
    ("plan-other-job", {"plan.json": b'{"version": 1, "global_batch": 32, "gpus": 1, '
                        b'"max_micro_batch": 8, "job": "other"}'}, {"HPCORCH_JOB_ID": "mine"},
     "is for job 'other', not for 'mine'"),
    ("ckpt-truncated", {"checkpoints/ckpt-000000004.pt": fake_checkpoint(truncate=True)}, {},
     "is truncated or corrupt"),
    ("ckpt-version", {"checkpoints/ckpt-000000004.pt": fake_checkpoint(version=3)}, {},
     "has version 3; this hpcorch reads version 1"),
    ("ckpt-other-job", {"checkpoints/ckpt-000000004.pt": fake_checkpoint(job="other")},
     {"HPCORCH_JOB_ID": "mine"}, "belongs to job 'other', not to 'mine'"),
]  # fmt: skip


def test_bad_plan_or_checkpoint_one_error_nothing_overwritten(
    runtime_pool: dict[str, str], tmp_path: Path
) -> None:
    """Each case: exit 78, exactly one error line naming the problem, no file touched."""
    cases = []
    for name, files, env, message in BAD_FILES:  # submitted together, checked one by one
        jd = tmp_path / name
        for rel, data in files.items():
            (jd / rel).parent.mkdir(parents=True, exist_ok=True)
            (jd / rel).write_bytes(data)
        cases.append(
            (
                name,
                jd,
                snapshot(jd),
                message,
                sbatch(runtime_pool, jd, SMALL, gpus_per_node=1, **env),
            )
        )
    for name, jd, before, message, job in cases:
        assert job.wait() == EXIT_CONFIG, (name, job.output())
        out = job.output()
        errors = [line for line in out.splitlines() if " hpcorch: error: " in line]
        assert len(errors) == 1 and message in errors[0], (name, out)
        assert "Traceback" not in out, name
        # nothing of the job's written or overwritten (the wrapper notes the task started)
        after = snapshot(jd)
        assert after.pop("task-started", None) == b"0\n", name
        assert after == before, name


def test_launch_paths_under_srun_on_two_nodes(runtime_pool: dict[str, str], tmp_path: Path) -> None:
    """MPI through the wrapper, MPI under a bare `srun --mpi=pmix` (rank 0's address and a
    free port found and broadcast over MPI), and a bare `srun` read from SLURM_* only."""
    py, ex, args = sys.executable, str(EXAMPLE), " ".join(SMALL)
    mpi_env = {"OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "lo"}
    jobs = {
        "wrapper-mpi": sbatch(runtime_pool, tmp_path / "wrapper-mpi", SMALL, nodes=2,
                              gpus_per_node=1, HPCORCH_LAUNCHER="mpi"),
        "srun-pmix": sbatch(runtime_pool, tmp_path / "srun-pmix", [], nodes=2, gpus_per_node=1,
                            sbatch_args=["--ntasks-per-node=1"],
                            script=["--wrap", f"srun --mpi=pmix {py} {ex} {args}"], **mpi_env),
        "srun": sbatch(runtime_pool, tmp_path / "srun", [], nodes=2, gpus_per_node=1,
                       sbatch_args=["--ntasks-per-node=1"],
                       script=["--wrap", f"srun {py} {ex} {args}"],
                       MASTER_PORT=str(free_port())),
    }  # fmt: skip
    launcher = {"wrapper-mpi": "mpi", "srun-pmix": "mpi", "srun": "slurm"}
    for name, job in jobs.items():
        assert job.finished(tmp_path / name) == EXIT_DONE, (name, job.output())
        start = events(tmp_path / name, "start")[0]
        assert (start["launcher"], start["gpus"]) == (launcher[name], 2), name
        assert events(tmp_path / name, "done"), name
    assert "<over MPI>" in jobs["wrapper-mpi"].output()  # the port came from the rendezvous
