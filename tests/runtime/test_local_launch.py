"""torchrun-style launch (RANK/WORLD_SIZE/MASTER_* env, gloo), no Slurm involved.

Only one rank receives the signal: the all-reduced flag must still stop every rank at the
same step boundary. Then the job resumes on a single process (2 -> 1) and finishes.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from hpcorch.protocol import CHECKPOINT_DIR, EXIT_DONE, EXIT_RELAUNCH, EXIT_STORAGE
from tests.runtime.harness import events, launch, signal_at, wait_for

pytestmark = pytest.mark.slow

ARGS = ["--epochs", "1", "--samples", "768", "--global-batch", "48", "--max-micro-batch", "8",
        "--step-delay", "0.1"]  # fmt: skip


def test_signal_to_one_rank_stops_all_then_resume_on_one(tmp_path: Path) -> None:
    jd = tmp_path / "job"
    rec = ["--record", str(jd / "seen")]
    jd.mkdir()
    run = launch(2, jd, [*ARGS, *rec])
    signal_at(run, jd, 3, ranks=[1])
    assert run.wait() == [EXIT_RELAUNCH, EXIT_RELAUNCH], run.stderr()
    steps = events(jd, "steps")
    assert {"step_time", "samples_per_s", "global_batch", "per_gpu_batch", "noise_scale",
            "loss"} <= set(steps[-1])  # fmt: skip
    assert (steps[-1]["global_batch"], steps[-1]["per_gpu_batch"]) == (48, 8)
    noise = [e["noise_scale"] for e in steps if e["noise_scale"] is not None]
    assert noise and all(n > 0 for n in noise)  # estimated from the two ranks' gradients
    (stop,) = events(jd, "checkpoint")
    assert stop["reason"] == "signal" and events(jd, "exit")[0]["code"] == EXIT_RELAUNCH
    one = launch(1, jd, [*ARGS, *rec])
    assert one.finished(jd) == [EXIT_DONE], one.stderr()
    start = events(jd, "start")[-1]
    assert (start["step"], start["gpus"], start["resumed"]) == (stop["step"], 1, True)
    assert start["global_batch"] == 48 and start["accum_steps"] == 6
    # what the scheduler keys and sizes the model by: fp32 gradients of every parameter
    assert start["params"] > 0 and start["model_bytes"] == 4 * start["params"]
    assert isinstance(start["model"], str) and start["model"]
    seen: Counter[int] = Counter()
    for f in jd.glob("seen.*.jsonl"):
        for line in f.read_text().splitlines():
            seen.update(json.loads(line)["idx"])
    assert seen == Counter(range(768))
    hb = json.loads((jd / "heartbeat").read_text())
    assert hb["state"] == "done" and hb["step"] == 16


def test_configured_checkpoint_signal_is_honoured(tmp_path: Path) -> None:
    jd = tmp_path / "early"
    run = launch(1, jd, ARGS, HPCORCH_CKPT_SIGNAL="USR1")
    # waits for the job to be running its loop, then asks with the configured signal
    signal_at(run, jd, 1, ranks=[0], sig=signal.SIGUSR1)
    assert run.wait() == [EXIT_RELAUNCH], run.stderr()
    assert events(jd, "checkpoint")[0]["step"] >= 1


def test_signal_while_torch_is_still_loading(tmp_path: Path) -> None:
    """A resize can be requested the moment a job starts: the signal must not kill it."""
    jd = tmp_path / "loading"
    run = launch(1, jd, ARGS)
    maps = Path(f"/proc/{run.procs[0].pid}/maps")
    # hpcorch.runtime is imported before torch; torch's library mapped = torch is loading
    wait_for(lambda: "libtorch" in maps.read_text(), timeout=60, every=0.005)
    assert not events(jd, "start")
    run.signal(signal.SIGUSR2, [0])
    assert run.wait() == [EXIT_RELAUNCH], run.stderr()
    (ck,) = events(jd, "checkpoint")
    start = events(jd, "start")[0]
    assert ck["step"] == 1 and float(ck["signal_time"]) < float(start["time"])


def test_process_group_is_left_before_interpreter_teardown(tmp_path: Path) -> None:
    """A gloo group left to Python's finalization can abort a finished rank
    ("terminate called without an active exception", about one run in fifteen with
    4 ranks here): hpcorch leaves it from an atexit handler while Python is alive."""
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(
        "import atexit, torch.distributed as dist\n"
        "from hpcorch.runtime.dist import init_process_group, free_port\n"
        # registered first, so it runs last: after hpcorch's own handler
        "atexit.register(lambda: print('initialized at exit:', dist.is_initialized()))\n"
        "import os\n"
        "os.environ.update(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', LOCAL_WORLD_SIZE='1',\n"
        "                  MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port('127.0.0.1')))\n"
        "init_process_group(launcher='env')\n"
        "print('initialized:', dist.is_initialized())\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.split("\n")[:2] == ["initialized: True", "initialized at exit: False"], out


def test_checkpoint_that_rank_0_cannot_write_fails_every_rank(tmp_path: Path) -> None:
    jd = tmp_path / "job"
    jd.mkdir()
    (jd / CHECKPOINT_DIR).write_text("a file where the checkpoint directory should be\n")
    run = launch(2, jd, ARGS)
    signal_at(run, jd, 3, ranks=[1])
    assert run.wait() == [EXIT_STORAGE, EXIT_STORAGE]
    assert "hpcorch: error: cannot write " in run.stderr()
    assert not events(jd, "checkpoint")
