"""Running a real controller against the test pool, and reading what happened."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcorch.controller.store import JobRecord, Store
from tests.conftest import REPO, Pool

ELASTIC = REPO / "examples" / "train_elastic.py"
FAST = ("--interval", "1", "--round", "2", "--min-run", "4", "--grace", "60")
"""Controller settings that keep the tests short."""


class ControllerProc:
    """``hpcorch controller`` as a subprocess with its own state directory."""

    def __init__(self, pool: Pool, state: Path, reservation: str, *args: str) -> None:
        self.pool = pool
        self.state = state
        self.reservation = reservation
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.log = state / "controller.log"

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hpcorch",
                "controller",
                "--reservation",
                self.reservation,
                "--state-dir",
                str(self.state),
                *self.args,
            ],
            env=self.pool.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "a"),  # noqa: SIM115
            text=True,
        )
        proc = self.proc
        wait_for(
            "the controller to hold its reservation",
            lambda: "reservation" in self.log.read_text() or proc.poll() is not None,
            60,
        )
        assert proc.poll() is None, self.log.read_text()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def store(self) -> Store:
        return Store(self.state / "state.db", readonly=True)

    def decisions(self) -> list[Any]:
        if not (self.state / "state.db").exists():
            return []
        s = self.store()
        try:
            return s.decisions()
        finally:
            s.close()

    def phase(self, job_id: int) -> str:
        rec = self.record(job_id)
        return rec.phase if rec else "?"

    def training(self, job_id: int) -> bool:
        """The job's current launch reported that training started."""
        rec = self.record(job_id)
        return rec is not None and rec.phase == "running" and rec.ready == 1

    def record(self, job_id: int) -> JobRecord | None:
        if not (self.state / "state.db").exists():
            return None
        s = self.store()
        try:
            return s.job(job_id)
        finally:
            s.close()


def submit(pool: Pool, reservation: str, name: str, lo: int, hi: int, *script_args: str) -> int:
    out = pool.hpcorch(
        "submit",
        "--pool",
        reservation,
        "--name",
        name,
        "--min-gpus",
        str(lo),
        "--max-gpus",
        str(hi),
        "--batch-size",
        "64",
        "--max-per-gpu-batch",
        "64",
        "--parsable",
        str(ELASTIC),
        "--global-batch",
        "64",
        "--samples",
        "2048",
        *script_args,
    )
    return int(out.stdout.strip())


def wait_for(what: str, cond: Callable[[], bool], timeout: float, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")
        time.sleep(0.5)


def wait_for_phase(ctl: ControllerProc, job: int, phase: str, timeout: float) -> None:
    """Wait for the controller to record ``job`` in ``phase``; when it does not, the failure's
    first line (all a CI summary keeps) says where the job stands, in the controller's record
    and in Slurm, and the lines after it give the record, Slurm's view and the log's tail."""
    try:
        wait_for(f"job {job} {phase}", lambda: ctl.phase(job) == phase, timeout)
        return
    except AssertionError:
        pass
    rec = ctl.record(job)
    where = f"{rec.phase}: {rec.reason} (since {rec.phase_since:.0f})" if rec else "none"
    shown = ctl.pool.run("scontrol", "-o", "show", "job", str(job), check=False).stdout.strip()
    state = re.search(r"\bJobState=(\S+)", shown)
    reason = re.search(r"\bReason=(\S+)", shown)
    brief = f"{state.group(1)} ({reason.group(1)})" if state and reason else "not known"
    tail = ctl.log.read_text()[-3000:] if ctl.log.exists() else ""
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for job {job} {phase}: the controller has it "
        f"{where[:160]}; Slurm {brief}\nSlurm: {shown[:1500]}\n{tail}"
    )


def job_dir(pool: Pool, job_id: int) -> Path:
    for spec in pool.home.glob("jobs/*/job.json"):
        if json.loads(spec.read_text())["slurm_id"] == job_id:
            return spec.parent
    raise AssertionError(f"no job directory for job {job_id}")


def metrics_lines(pool: Pool, job_id: int) -> list[dict[str, Any]]:
    path = job_dir(pool, job_id) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(pool: Pool, job_id: int) -> list[float]:
    return [
        m["loss"]
        for m in metrics_lines(pool, job_id)
        if m.get("event") == "steps" and m.get("loss") is not None
    ]
