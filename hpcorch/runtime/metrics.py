"""Reports for the controller: metrics as JSON lines at a bounded rate in a file of bounded
size (rotated past ``MAX_BYTES``: hpcorch/metrics_file.py), and a heartbeat."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.metrics_file import MAX_BYTES, append_line
from hpcorch.protocol import TMP_SUFFIX
from hpcorch.runtime.fence import Gate


@dataclass
class _Window:
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    loss_sum: float = 0.0
    loss_n: int = 0
    wait: float = 0.0


@dataclass
class MetricsWriter:
    """Appends one JSON line per ``interval`` seconds summarising the steps since the last."""

    path: Path | None
    interval: float = 5.0
    gate: Gate = field(default_factory=Gate)
    """Writes go through it: fenced, and a failing disk becomes one reason."""
    launch: int | None = None
    """This launch's generation, in every line (an older launch's lines can be told apart)."""
    max_bytes: int = MAX_BYTES
    """The file is rotated (to ``metrics.jsonl.1``) before it grows past this."""
    _window: _Window = field(default_factory=_Window)
    _last: float = field(default_factory=time.monotonic)
    lines: int = 0

    def event(self, kind: str, **fields: Any) -> None:
        """Write a one-off event line (start, resume, checkpoint, exit) right away."""
        self._append({"time": round(time.time(), 3), "event": kind, **fields})

    def step(
        self,
        *,
        step: int,
        seconds: float,
        samples: int,
        loss: float | None,
        force: bool = False,
        data_wait: float = 0.0,
        **fields: Any,
    ) -> bool:
        """Account one optimizer step; write a line when the interval has passed."""
        w = self._window
        w.steps += 1
        w.samples += samples
        w.seconds += seconds
        w.wait += data_wait
        if loss is not None:
            w.loss_sum += loss
            w.loss_n += 1
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return False
        self._last = now
        line = {
            "time": round(time.time(), 3),
            "event": "steps",
            "step": step,
            "steps": w.steps,
            "step_time": w.seconds / w.steps,
            "samples_per_s": w.samples / w.seconds if w.seconds > 0 else None,
            "loss": w.loss_sum / w.loss_n if w.loss_n else None,
            "data_wait": w.wait / w.steps,
            **fields,
        }
        self._window = _Window()
        self._append(line)
        return True

    def _append(self, line: dict[str, Any]) -> None:
        self.lines += 1
        path = self.path
        if path is None:
            return
        if self.launch is not None:
            line["launch"] = self.launch
        data = (json.dumps(line, allow_nan=False, default=_plain) + "\n").encode()

        def append() -> None:
            append_line(path, data, self.max_bytes)

        self.gate.write(path, append)


def process_age() -> float:
    """Seconds since this process started (from /proc, 10 ms resolution; 0 elsewhere)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _plain(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    return str(x)


class Heartbeat:
    """Rewrites a small JSON file (atomically) at most every ``interval`` seconds."""

    def __init__(
        self,
        path: Path | None,
        interval: float = 10.0,
        gate: Gate | None = None,
        launch: int | None = None,
    ) -> None:
        self.path = path
        self.interval = interval
        self.gate = gate or Gate()
        self.launch = launch
        self._last = -float("inf")
        self._host = socket.gethostname()

    def beat(self, step: int, state: str = "running", force: bool = False) -> bool:
        """Write the heartbeat (when due); False when the write failed (see the gate)."""
        now = time.monotonic()
        path = self.path
        if path is None or (not force and now - self._last < self.interval):
            return True
        self._last = now
        tmp = path.with_name(path.name + TMP_SUFFIX)
        body: dict[str, Any] = {"time": time.time(), "step": step, "state": state}
        body.update(pid=os.getpid(), host=self._host)
        if self.launch is not None:
            body["launch"] = self.launch

        def replace() -> None:
            tmp.write_text(json.dumps(body) + "\n", encoding="utf-8")
            os.replace(tmp, path)

        return self.gate.write(path, replace)
