"""The runtime on a real Slurm pool: signal, checkpoint, exit 75, resume at 2 and at 4 ranks.

CPU gloo, 2 virtual nodes x 2 fake GPUs, through jobscripts/hpcorch-run.sbatch.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from hpcorch.protocol import EXIT_DONE, EXIT_LAUNCH_LOST, EXIT_RELAUNCH
from tests.runtime.harness import events, sbatch, signal_job_at

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SAMPLES = 1024
ARGS = ["--epochs", "2", "--samples", str(SAMPLES), "--global-batch", "64",
        "--max-micro-batch", "16", "--step-delay", "0.15", "--lr-scaling", "adascale"]  # fmt: skip
RESIZE_ATOL = 1e-5
"""Max abs difference of any parameter after resuming 2 -> 4 ranks (float32, ~30 steps)."""


def params(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def seen(job_dir: Path) -> dict[int, Counter[int]]:
    """Samples processed per epoch, over all ranks and launches."""
    out: dict[int, Counter[int]] = {}
    for f in job_dir.glob("seen.*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["epoch"], Counter()).update(rec["idx"])
    return out


def interrupted_then_reference(pool: dict[str, str], base: Path, extra: list[str]) -> Path:
    """Run the reference and a signalled run side by side; return the signalled job dir."""
    ref = sbatch(pool, base / "ref", [*ARGS, *extra, "--save-params", str(base / "ref.pt")])
    cut = sbatch(pool, base / "cut", [*ARGS, *extra, "--record", str(base / "cut" / "seen")])
    signal_job_at(cut, base / "cut", 4)
    assert cut.wait() == EXIT_RELAUNCH, cut.output()
    assert ref.wait() == EXIT_DONE, ref.output()
    assert "training checkpointed: requeued held for the controller's relaunch" in cut.output()
    ckpt = events(base / "cut", "checkpoint")
    assert [e["reason"] for e in ckpt] == ["signal"]
    assert 4 <= int(ckpt[0]["step"]) < 32  # type: ignore[call-overload]
    return base / "cut"


def test_exact_resume_same_size_is_bitwise(runtime_pool: dict[str, str], tmp_path: Path) -> None:
    cut = interrupted_then_reference(runtime_pool, tmp_path, [])  # dropout on: RNG matters
    job = sbatch(runtime_pool, cut, [*ARGS, "--record", str(cut / "seen"),
                                     "--save-params", str(tmp_path / "resumed.pt")])  # fmt: skip
    assert job.wait() == EXIT_DONE, job.output()
    assert "resuming from" in job.output()
    ref, got = params(tmp_path / "ref.pt"), params(tmp_path / "resumed.pt")
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    assert seen(cut) == {0: Counter(range(SAMPLES)), 1: Counter(range(SAMPLES))}


def test_resize_2_to_4_same_global_batch(runtime_pool: dict[str, str], tmp_path: Path) -> None:
    cut = interrupted_then_reference(runtime_pool, tmp_path, ["--dropout", "0"])
    job = sbatch(runtime_pool, cut, [*ARGS, "--dropout", "0", "--record", str(cut / "seen"),
                                     "--save-params", str(tmp_path / "resumed.pt")],
                 nodes=2)  # fmt: skip
    assert job.wait() == EXIT_DONE, job.output()
    start = events(cut, "start")[-1]
    assert (start["gpus"], start["global_batch"], start["resumed"]) == (4, 64, True)
    assert "64 = 16 x 1 x 4" in job.output()
    # every sample of both epochs exactly once, over the 2-rank and the 4-rank launches
    assert seen(cut) == {0: Counter(range(SAMPLES)), 1: Counter(range(SAMPLES))}
    ref, got = params(tmp_path / "ref.pt"), params(tmp_path / "resumed.pt")
    worst = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    print(f"resize 2->4: largest parameter difference {worst:.2e} (bound {RESIZE_ATOL:.0e})")
    assert worst <= RESIZE_ATOL
    assert any(not torch.equal(ref[k], got[k]) for k in ref) or worst == 0.0


def test_standalone_job_requeues_itself(runtime_pool: dict[str, str], tmp_path: Path) -> None:
    """Without a controller the wrapper requeues its own job on exit code 75. Here the job
    also takes SIGTERM as a checkpoint request (the wrapper traps every signal named)."""
    jd = tmp_path / "solo"
    job = sbatch(runtime_pool, jd, ARGS, HPCORCH_CONTROLLED="", HPCORCH_CKPT_SIGNAL="USR2,TERM")
    signal_job_at(job, jd, 4, sig="TERM")
    assert job.wait(timeout=240) == EXIT_DONE, job.output()
    out = job.output()
    assert "SIGTERM received" in out and "requeueing job" in out
    assert "launch 2:" in out and "training finished" in out
    starts = events(jd, "start")
    assert [s["resumed"] for s in starts] == [False, True]
    shutil.rmtree(jd)


def test_a_launch_whose_tasks_never_started_is_no_result(
    runtime_pool: dict[str, str], tmp_path: Path
) -> None:
    """srun can exit 0 with no task run (here ``--test-only``, an option a user may pass in
    HPCORCH_SRUN_ARGS; at site scale, a step Slurm never started): that is not training
    finished. The wrapper says so and exits 79, a launch without a result."""
    jd = tmp_path / "none"
    job = sbatch(runtime_pool, jd, ARGS, HPCORCH_SRUN_ARGS="--test-only")
    assert job.wait(timeout=240) == EXIT_LAUNCH_LOST, job.output()
    out = job.output()
    assert "no task of launch 1 started" in out and "training finished" not in out
    assert not events(jd, "start")
