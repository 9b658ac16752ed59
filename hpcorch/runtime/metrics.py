"""Reports for the controller: metrics as JSON lines at a bounded rate, and a heartbeat."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.protocol import TMP_SUFFIX


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
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, allow_nan=False, default=_plain) + "\n")


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

    def __init__(self, path: Path | None, interval: float = 10.0) -> None:
        self.path = path
        self.interval = interval
        self._last = -float("inf")
        self._host = socket.gethostname()

    def beat(self, step: int, state: str = "running", force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self._last < self.interval):
            return
        self._last = now
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        body = {"time": time.time(), "step": step, "state": state, "pid": os.getpid()}
        tmp.write_text(json.dumps({**body, "host": self._host}) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
