"""A job's metrics file has a cap: rotated to ``metrics.jsonl.1`` past it, and the
controller, reading by byte offset, neither loses nor repeats a line across a rotation."""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
from pathlib import Path

from hpcorch.metrics_file import append_line, rotated
from hpcorch.runtime.metrics import MetricsWriter
from hpcorch.slurm.files import read_lines

CAP = 4096


def _seqs(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(x)["seq"] for x in path.read_text().splitlines()]


def test_the_runtime_rotates_its_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    m = MetricsWriter(path, interval=0.0, max_bytes=CAP)
    for i in range(3000):
        if i % 3:
            m.step(step=i, seconds=0.01, samples=64, loss=1.0, seq=i)
        else:
            m.event("checkpoint", seq=i)
    assert path.stat().st_size <= CAP and rotated(path).stat().st_size <= CAP
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.jsonl.1"]
    kept = _seqs(rotated(path)) + _seqs(path)
    assert kept == list(range(3000 - len(kept), 3000))  # the newest, whole lines, in order
    print(f"\n3000 lines ({3000 * 85 // 1024} KiB) written: {path.stat().st_size} + "
          f"{rotated(path).stat().st_size} bytes kept (cap {CAP})")  # fmt: skip


def test_the_controller_reads_across_rotations(tmp_path: Path) -> None:
    """Reads at random moments, less than a file's worth of lines apart (the runtime
    writes a line per interval, the controller reads every cycle): every line exactly
    once, in order, through 100+ rotations; a truncated file is read again from its start."""
    rng = random.Random(6)
    path = tmp_path / "metrics.jsonl"
    m = MetricsWriter(path, interval=0.0, max_bytes=CAP)
    offset, seen, due = 0, [], 0
    for i in range(6000):
        m.event("steps", step_time=0.1, seq=i)
        if i == due or i == 5999:
            due = i + rng.randint(1, 40)  # 40 lines: about 2400 bytes
            lines, offset = read_lines(str(path), offset, os.getuid())
            seen += [x["seq"] for x in lines]
    assert seen == list(range(6000))
    # truncated by hand: read again from its start (where a .1 longer than the offset is
    # left from an earlier rotation, its rest would be taken for the lines after the offset)
    rotated(path).unlink()
    path.write_text('{"seq": -1}\n')
    lines, offset = read_lines(str(path), offset, os.getuid())
    assert [x["seq"] for x in lines] == [-1] and offset == path.stat().st_size


def test_a_rotated_file_that_is_not_the_one_read_is_ignored(tmp_path: Path) -> None:
    """A ``.1`` shorter than where the reader stopped is not the file it read: ignored."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"seq": i}) + "\n" for i in range(100)))
    rotated(path).write_text('{"seq": -5}\n')
    _, offset = read_lines(str(path), 0, os.getuid())
    path.write_text('{"seq": 100}\n')
    lines, _ = read_lines(str(path), offset, os.getuid())
    assert [x["seq"] for x in lines] == [100]


def test_two_writers_share_a_rotating_file(tmp_path: Path) -> None:
    """The runtime and the sidecar append to one file: no line torn or lost to a race,
    each writer's lines in order, the file never past the cap."""
    path = tmp_path / "metrics.jsonl"
    got: list[dict[str, int]] = []
    sizes: list[int] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def write(who: int) -> None:
        for i in range(3000):
            append_line(path, (json.dumps({"who": who, "seq": i}) + "\n").encode(), CAP)

    def read() -> None:
        offset = 0
        try:
            while True:
                last = done.is_set()
                lines, offset = read_lines(str(path), offset, os.getuid())
                got.extend(lines)
                with contextlib.suppress(FileNotFoundError):  # between a rotation and a write
                    sizes.append(path.stat().st_size)
                if last:
                    return
        except BaseException as exc:
            failed.append(exc)
            raise

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(w,)) for w in (1, 2)]
    reader.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    reader.join()
    assert not failed and max(sizes) <= CAP
    for who in (1, 2):
        seqs = [x["seq"] for x in got if x["who"] == who]
        assert seqs == sorted(set(seqs))  # in order, none twice
    on_disk = [json.loads(x) for p in (rotated(path), path) for x in p.read_text().splitlines()]
    assert all(set(x) == {"who", "seq"} for x in on_disk)
