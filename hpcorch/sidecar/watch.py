"""What the sidecar reads of the script it runs: progress from its output or its progress
file, the runtime's start line in the job's metrics (a script that uses the runtime after
all), and the newest file in its checkpoint directory."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import IO

from hpcorch.sidecar.config import (
    Checkpoint,
    Progress,
    SidecarConfig,
    latest_checkpoint,
    parse_json_line,
    parse_output_line,
)
from hpcorch.sidecar.lost import node_failure_line

POLL_BYTES = 1 << 20
"""Most bytes of the metrics file read per poll for the runtime's start line."""
PUMP_BYTES = 1 << 16
"""Most bytes of the script's output read at once (and the longest line parsed)."""
LINE_END = re.compile(rb"\r\n?|\n")


class ScriptWatch:
    """Offsets into the files it reads, and the progress read but not yet taken."""

    def __init__(self, cfg: SidecarConfig, metrics: Path) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.progress: SimpleQueue[tuple[float, Progress]] = SimpleQueue()
        self.runtime_offset = 0
        self.progress_offset = 0
        self.last_ckpt: Checkpoint | None = None
        self.node_failure = False
        """srun reported a lost node during this launch."""

    def start(self) -> None:
        """Read only what is written from now on (this launch's lines)."""
        self.runtime_offset = _size(self.metrics)
        if self.cfg.progress_file is not None:
            self.progress_offset = _size(self.cfg.progress_file)

    def pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        """Copy the script's output (a thread per stream) as it comes, parsing each line on
        the way. A line ends at a newline or a carriage return: a progress bar (tqdm) moves
        by rewriting one line with ``\\r`` and ends it only when it closes."""
        read = getattr(src, "read1", src.read)
        pending = b""
        while chunk := read(PUMP_BYTES):
            try:
                dst.write(chunk)
                dst.flush()
            except (OSError, ValueError):
                pass
            *lines, pending = LINE_END.split(pending + chunk)
            for line in lines:
                self._parse(line)
            if len(pending) > PUMP_BYTES:  # no line end for that long: not a progress line
                pending = b""
        if pending:
            self._parse(pending)

    def _parse(self, line: bytes) -> None:
        if line.startswith(b"srun: ") and node_failure_line(line):
            self.node_failure = True
        rx = self.cfg.progress_regex
        if rx is None:
            return
        p = parse_output_line(rx, line.decode("utf-8", "replace"))
        if p is not None:
            self.progress.put((time.time(), p))

    def poll_progress_file(self) -> None:
        path = self.cfg.progress_file
        if path is None:
            return
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.progress_offset:
                    self.progress_offset = 0  # rewritten from the start
                fh.seek(self.progress_offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.progress_offset += end
        now = time.time()
        for line in data[:end].splitlines():
            p = parse_json_line(line.decode("utf-8", "replace"))
            if p is not None:
                self.progress.put((now, p))

    def taken(self) -> Iterator[tuple[float, Progress]]:
        """The progress read so far, oldest first (each once)."""
        while True:
            try:
                yield self.progress.get_nowait()
            except Empty:
                return

    def runtime_started(self) -> bool:
        """The runtime's start line appeared in the metrics file since :meth:`start`."""
        try:
            with open(self.metrics, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self.runtime_offset:
                    self.runtime_offset = 0  # rotated or truncated: a new file
                fh.seek(self.runtime_offset)
                data = fh.read(POLL_BYTES)
        except OSError:
            return False
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == POLL_BYTES:
            end = len(data)  # one line longer than a whole read: skipped
        self.runtime_offset += end
        return any(
            b'"event": "start"' in line or b'"event":"start"' in line
            for line in data[:end].splitlines()
        )

    def new_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint of the script when it is not the one seen last."""
        ckpt = latest_checkpoint(self.cfg.ckpt_dir)
        if ckpt is None or ckpt == self.last_ckpt:
            return None
        self.last_ckpt = ckpt
        return ckpt


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
