"""The runtime when its job directory fails it (issue 13, item 5) or a newer launch of the
job takes the directory over (item 4): one clear line, an exit code of its own, no
traceback; a damaged newest checkpoint is skipped for the newest one that loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcorch.protocol import (
    CHECKPOINT_DIR,
    EXIT_DONE,
    EXIT_LAUNCH_LOST,
    EXIT_RELAUNCH,
    EXIT_STORAGE,
    LAUNCH_FILE,
)
from hpcorch.runtime import checkpoint as ckpt
from hpcorch.runtime.fence import Fence, Gate, Superseded
from tests.runtime.harness import events, launch, signal_at, wait_for

ARGS = ["--epochs", "1", "--samples", "768", "--global-batch", "48", "--max-micro-batch", "8",
        "--step-delay", "0.1"]  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if "hpcorch: error: " in ln]


# --- the fence, alone -----------------------------------------------------------------


def test_fence_lets_only_the_owner_write(tmp_path: Path) -> None:
    (tmp_path / LAUNCH_FILE).write_text("42 1\n")
    old, new = Fence(tmp_path, "42", 0), Fence(tmp_path, "42", 1)
    new.check()
    with pytest.raises(Superseded, match="launch 2 of job 42 took over"):
        old.check()
    gate = Gate(old)
    assert not gate.write(tmp_path / "x", lambda: (tmp_path / "x").write_text("x"))
    assert gate.failure is not None and gate.failure[0] == EXIT_LAUNCH_LOST
    assert not (tmp_path / "x").exists()
    # another job took the directory over; no record at all; not fenced (started by hand)
    (tmp_path / LAUNCH_FILE).write_text("43 0\n")
    with pytest.raises(Superseded, match="job 43"):
        new.check()
    (tmp_path / LAUNCH_FILE).unlink()
    new.check()
    Fence(tmp_path, None, None).check()


def test_fence_refuses_a_symlinked_record(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("42 0\n")
    (tmp_path / LAUNCH_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Superseded):
        Fence(tmp_path, "42", 0).check()


def test_gate_turns_a_failing_disk_into_one_reason(tmp_path: Path) -> None:
    gate = Gate()
    target = tmp_path / "missing" / "file"
    assert not gate.write(target, lambda: target.write_text("x"))
    assert gate.failure is not None
    code, message = gate.failure
    assert code == EXIT_STORAGE
    assert message.startswith(f"cannot write {target}: No such file or directory")
    assert not gate.write(tmp_path / "y", lambda: (tmp_path / "y").write_text("y"))
    assert not (tmp_path / "y").exists()  # nothing more after the first failure


# --- a launch that a newer one supersedes -------------------------------------------------


def test_superseded_launch_stops_without_writing(tmp_path: Path) -> None:
    jd = tmp_path / "job"
    jd.mkdir()
    (jd / LAUNCH_FILE).write_text("77 0\n")
    run = launch(2, jd, [*ARGS, "--epochs", "3"], SLURM_JOB_ID="77", HPCORCH_LAUNCH="0")
    wait_for(lambda: any(e.get("event") == "steps" for e in events(jd)), 120)
    assert all(e.get("launch") == 0 for e in events(jd))
    (jd / LAUNCH_FILE).write_text("77 1\n")  # what the wrapper of launch 1 does
    seen = len(events(jd))
    assert run.wait() == [EXIT_LAUNCH_LOST, EXIT_LAUNCH_LOST]
    lines = error_lines(run.stderr())
    assert len(lines) == 1 and "launch 2 of job 77 took over" in lines[0], lines
    assert len(events(jd)) <= seen + 1  # at most the line written before it looked
    assert all(e.get("launch") == 0 for e in events(jd))
    heartbeat = json.loads((jd / "heartbeat").read_text())
    assert heartbeat["launch"] == 0 and heartbeat["state"] != "done"


# --- a job directory that cannot be written --------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only), else skip."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_read_only_job_directory_is_one_line_and_exit_74(small_fs: Path) -> None:
    jd = small_fs / "job"
    jd.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    run = launch(2, jd, ARGS)
    assert run.wait() == [EXIT_STORAGE, EXIT_STORAGE]
    lines = error_lines(run.stderr())
    assert len(lines) == 1 and "Read-only file system" in lines[0], lines
    assert "on a read-only filesystem" in lines[0]
    assert list(jd.iterdir()) == []


@pytest.mark.slow
def test_full_filesystem_is_one_line_and_exit_74(small_fs: Path) -> None:
    jd = small_fs / "job"
    jd.mkdir()
    # fill the filesystem but for 16 KiB: the heartbeat fits, a checkpoint does not
    ballast = small_fs / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(ballast, max(0, ballast.stat().st_size - 16384))
    run = launch(2, jd, [*ARGS, "--hidden", "512"], HPCORCH_CKPT_INTERVAL="0.3")
    assert run.wait() == [EXIT_STORAGE, EXIT_STORAGE]
    lines = error_lines(run.stderr())
    assert len(lines) == 1 and "No space left on device" in lines[0], lines
    assert "filesystem of the job directory is full" in lines[0]


# --- a damaged newest checkpoint ---------------------------------------------------------


def test_truncated_newest_checkpoint_resumes_from_the_previous(tmp_path: Path) -> None:
    jd = tmp_path / "job"
    jd.mkdir()
    run = launch(1, jd, ARGS, HPCORCH_CKPT_INTERVAL="0.3")
    wait_for(lambda: len(events(jd, "checkpoint")) >= 2, 120)
    signal_at(run, jd, 0, ranks=[0])
    assert run.wait() == [EXIT_RELAUNCH]
    complete, _ = ckpt.scan(jd / CHECKPOINT_DIR)
    (older_step, older), (newest_step, newest) = complete[-2:]
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated by a failing disk
    resumed = launch(1, jd, ARGS)
    codes = resumed.finished(jd)
    err = resumed.stderr()
    assert codes == [EXIT_DONE], err
    assert "Traceback" not in err
    assert f"{newest.name} is truncated or corrupt" in err and "skipped" in err, err
    assert f"resuming from the newest checkpoint that loads, {older}" in err, err
    start = events(jd, "start")[-1]
    assert start["resumed"] and start["step"] == older_step < newest_step
    assert (newest.parent / (newest.name + ckpt.CORRUPT_SUFFIX)).exists()


def test_only_damaged_checkpoints_stop_the_job(tmp_path: Path) -> None:
    jd = tmp_path / "job"
    (jd / CHECKPOINT_DIR).mkdir(parents=True)
    for step in (3, 5):
        ckpt.checkpoint_path(jd / CHECKPOINT_DIR, step).write_bytes(b"not a checkpoint")
    before = sorted(p.name for p in (jd / CHECKPOINT_DIR).iterdir())
    run = launch(1, jd, ARGS)
    assert run.wait() == [78]
    lines = error_lines(run.stderr())
    assert len(lines) == 1 and "no checkpoint of" in lines[0] and "loads" in lines[0], lines
    assert sorted(p.name for p in (jd / CHECKPOINT_DIR).iterdir()) == before
