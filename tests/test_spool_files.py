"""The controller's files: plans only in its spool, metrics read from a user's directory
without following links, blocking or reading without bound (hpcorch/slurm/files.py)."""

from __future__ import annotations

import json
import os
import stat
import struct
import threading
from pathlib import Path

import pytest

from hpcorch.errors import HpcorchError
from hpcorch.planner import LaunchPlan, read_plan
from hpcorch.slurm.files import MAX_READ, Spool, UnsafeFile, posix_acl, read_lines

ME = os.geteuid()
PLAN = LaunchPlan(global_batch=64, gpus=2, max_micro_batch=32, job="j", launch=1)


def metrics(path: Path, *docs: object) -> None:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))


def test_the_plan_is_written_in_the_spool_only(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.ensure()
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o711
    spool.write_plan(42, PLAN, ME)
    assert read_plan(spool.path(42)) == PLAN
    assert sorted(p.name for p in (tmp_path / "spool" / "42").iterdir()) == ["plan.json"]
    spool.write_plan(42, PLAN, ME)  # again: replaced atomically
    assert read_plan(spool.path(42)) == PLAN
    assert spool.discard_except([7]) == [42] and not (tmp_path / "spool" / "42").exists()
    (tmp_path / "spool").rmdir()  # removed under the controller: made again
    spool.write_plan(43, PLAN, ME)
    assert read_plan(spool.path(43)) == PLAN


def test_the_plan_is_readable_by_the_jobs_owner_only(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.ensure()
    spool.write_plan(5, PLAN, 4321)
    job_dir, plan = tmp_path / "spool" / "5", spool.path(5)
    if not spool.acls:
        pytest.skip("this file system has no POSIX ACLs: plans are world-readable there")
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE(plan.stat().st_mode) == 0o640
    acl = os.getxattr(plan, "system.posix_acl_access")
    assert acl == posix_acl(0o6, 0o4, 4321, 0o4, 0)
    entries = [struct.unpack("<HHI", acl[i : i + 8]) for i in range(4, len(acl), 8)]
    assert (0x02, 0o4, 4321) in entries  # user 4321: read
    assert (0x20, 0, 0xFFFFFFFF) in entries  # others: nothing


def test_a_spool_others_can_write_to_is_refused(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir(mode=0o777)
    (tmp_path / "spool").chmod(0o777)
    with pytest.raises(HpcorchError, match="writable by others"):
        Spool(tmp_path / "spool").ensure()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(HpcorchError, match="not a directory"):
        Spool(tmp_path / "link").ensure()


def test_metrics_are_read_in_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    metrics(path, {"event": "start"}, [1, 2], {"event": "steps"})
    with open(path, "a") as fh:
        fh.write('{"event": "half')
    lines, offset = read_lines(str(path), 0, ME)
    assert lines == [{"event": "start"}, {"event": "steps"}]
    assert read_lines(str(path), offset, ME) == ([], offset)
    path.write_text('{"event": "new"}\n')  # truncated and rewritten: read from the start
    assert read_lines(str(path), offset, ME) == ([{"event": "new"}], 17)
    assert read_lines(str(tmp_path / "missing.jsonl"), 5, ME) == ([], 5)


def test_a_symlink_anywhere_on_the_path_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    metrics(secret / "metrics.jsonl", {"event": "steps", "secret": 1})
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "metrics.jsonl").symlink_to(secret / "metrics.jsonl")
    (tmp_path / "jobdir").symlink_to(secret, target_is_directory=True)
    for path in (tmp_path / "job" / "metrics.jsonl", tmp_path / "jobdir" / "metrics.jsonl"):
        with pytest.raises(UnsafeFile, match=r"symbolic link|not a regular file"):
            read_lines(str(path), 0, ME)
    with pytest.raises(UnsafeFile, match="absolute plain path"):
        read_lines(str(tmp_path / "job" / ".." / "secret" / "metrics.jsonl"), 0, ME)


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    if ME != 0:
        pytest.skip("needs root to give a file to another user")
    path = tmp_path / "metrics.jsonl"
    metrics(path, {"event": "steps"})
    os.chown(path, 4321, 4321)
    assert read_lines(str(path), 0, 4321)[0] == [{"event": "steps"}]
    with pytest.raises(UnsafeFile, match="belongs to uid 4321, not to the job's owner"):
        read_lines(str(path), 0, 1234)
    with pytest.raises(UnsafeFile):
        read_lines(str(path), 0, -1)  # an owner not known: nothing is read


def test_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    result: list[object] = []

    def read() -> None:
        try:
            result.append(read_lines(str(fifo), 0, ME))
        except UnsafeFile as exc:
            result.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], UnsafeFile) and "not a regular file" in str(result[0])


def test_reads_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as fh:
        fh.write('{"event": "a"}\n')
        fh.write('{"pad": "' + "x" * (MAX_READ * 3) + '"}\n')
        fh.write('{"event": "b"}\n')
        fh.write("[" * 100_000 + "\n")  # nesting bomb
        fh.write('{"event": "c"}\n')
    seen, offset = [], 0
    for _ in range(10):
        lines, offset = read_lines(str(path), offset, ME)
        seen += lines
    assert seen == [{"event": "a"}, {"event": "b"}, {"event": "c"}]
    assert offset == path.stat().st_size
