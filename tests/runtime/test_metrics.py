"""Metrics lines at a bounded rate; heartbeat rewritten atomically."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpcorch.runtime.metrics import Heartbeat, MetricsWriter, process_age


def test_fast_steps_are_summarised_not_logged_one_by_one(tmp_path: Path) -> None:
    m = MetricsWriter(tmp_path / "m.jsonl", interval=0.2)
    end = time.monotonic() + 0.5
    step = 0
    while time.monotonic() < end:
        step += 1
        m.step(step=step, seconds=0.001, samples=64, loss=2.0, global_batch=64)
        time.sleep(0.001)
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert step > 50 and 1 <= len(lines) <= 4  # ~0.5 s / 0.2 s, however many steps
    assert sum(x["steps"] for x in lines) <= step
    assert abs(lines[0]["samples_per_s"] - 64_000) < 1e-6 and lines[0]["loss"] == 2.0


def test_heartbeat(tmp_path: Path) -> None:
    hb = Heartbeat(tmp_path / "heartbeat", interval=3600)
    hb.beat(1)
    hb.beat(2)  # within the interval: not rewritten
    assert json.loads((tmp_path / "heartbeat").read_text())["step"] == 1
    hb.beat(3, state="done", force=True)
    body = json.loads((tmp_path / "heartbeat").read_text())
    assert (body["step"], body["state"]) == (3, "done")
    assert not list(tmp_path.glob("*.tmp"))
    assert process_age() > 0


def test_process_age_is_the_age_of_the_process() -> None:
    """A new process is no older than the time it took to run (this test's own process may
    be hours old under CI; a loaded CI took 32 s to start the child and import torch)."""
    code = "from hpcorch.runtime.metrics import process_age; print(process_age())"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    took = time.monotonic() - t0
    assert 0 < float(out.stdout) <= took + 0.5  # (/proc counts in 10 ms ticks)
