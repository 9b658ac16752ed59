"""Launching local multi-process DDP runs of the example script (torchrun-style env, gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcorch.ports import free_port
from hpcorch.protocol import EXIT_RELAUNCH

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_elastic.py"


def base_env(job_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_", "PMIX"))}
    env.update(
        PYTHONPATH=str(REPO),
        HPCORCH_JOB_DIR=str(job_dir),
        HPCORCH_METRICS_INTERVAL="0",
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


@dataclass
class Run:
    procs: list[subprocess.Popen[str]]

    def wait(self, timeout: float = 300) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]

    def finished(self, job_dir: Path, timeout: float = 300) -> list[int]:
        """The ranks' exit codes as the job wrapper counts them: once the job's ``done``
        event says training finished, a rank that then died in C++ teardown (SIGABRT:
        gloo's threads at exit, "terminate called without an active exception") counts as
        finished (0), as ``jobscripts/hpcorch-run.sbatch`` counts it."""
        return counted(self.wait(timeout), job_dir)

    def stderr(self) -> str:
        return "".join(p.stderr.read() if p.stderr else "" for p in self.procs)

    def signal(self, sig: int, ranks: Sequence[int] = (0,)) -> None:
        for r in ranks:
            self.procs[r].send_signal(sig)

    def kill(self) -> None:
        for p in self.procs:
            p.kill()


def launch(
    world: int, job_dir: Path, args: Sequence[str], script: Path = EXAMPLE, **env: str
) -> Run:
    """Start ``world`` ranks of ``script`` the way torchrun would."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = base_env(
            job_dir,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **env,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=e,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return Run(procs)


def counted(codes: list[int], job_dir: Path) -> list[int]:
    """Exit codes as the job wrapper counts them: after the job's ``done`` event, a SIGABRT
    (-6 from Python's view of a process, 134 from a shell's or srun's) counts as 0."""
    if not events(job_dir, "done"):
        return codes
    aborted = (-signal.SIGABRT, 128 + signal.SIGABRT)
    return [0 if c in aborted else c for c in codes]


def events(job_dir: Path, kind: str | None = None) -> list[dict[str, object]]:
    path = job_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if kind is None or e.get("event") == kind]


def wait_for(cond: Callable[[], bool], timeout: float = 60, every: float = 0.02) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(every)


def last_step(job_dir: Path) -> int:
    steps = events(job_dir, "steps")
    return int(steps[-1]["step"]) if steps else 0  # type: ignore[call-overload]


def signal_at(
    run: Run,
    job_dir: Path,
    step: int,
    ranks: Sequence[int] = (1,),
    sig: int = signal.SIGUSR2,
    timeout: float = 300.0,
) -> None:
    """Send the checkpoint signal to ``ranks`` once the job reports ``step`` (its ranks'
    start, torch's import and the process group, took over 60 s in a loaded CI)."""
    wait_for(lambda: last_step(job_dir) >= step, timeout)
    run.signal(sig, ranks)


# --- the local Slurm pool -------------------------------------------------------------------

WRAPPER = REPO / "jobscripts" / "hpcorch-run.sbatch"


@dataclass
class Job:
    """A submitted batch job; ``wait()`` polls Slurm and gives the job's exit code."""

    job_id: str
    out: Path
    env: dict[str, str]

    def state(self) -> tuple[str, int | None]:
        """(JobState, exit code once finished)."""
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", self.job_id],
            env=self.env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        state = fields.get("JobState", "UNKNOWN")
        code = int(fields.get("ExitCode", "0:0").split(":")[0])
        return state, code if state in FINAL_STATES else None

    def wait(self, timeout: float = 180) -> int:
        end = time.monotonic() + timeout
        while True:
            state, code = self.state()
            if code is not None:
                return code
            if state == "SPECIAL_EXIT":  # exit 75: requeued itself held for the controller
                self.scancel()
                return EXIT_RELAUNCH
            if time.monotonic() > end:
                self.scancel()
                raise TimeoutError(f"job {self.job_id} still running after {timeout} s")
            time.sleep(0.2)

    def finished(self, job_dir: Path, timeout: float = 180) -> int:
        """The job's exit code as the job wrapper counts a launch (see
        :meth:`Run.finished`): a task that died by SIGABRT in C++ teardown (srun's exit
        code 134) after the job's ``done`` event counts as finished (0). For the jobs run
        without the wrapper (a bare srun), which have no such rule of their own."""
        return counted([self.wait(timeout)], job_dir)[0]

    def output(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def scancel(self, *args: str) -> None:
        subprocess.run(["scancel", *args, self.job_id], env=self.env, check=True)


FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def sbatch(
    pool_env: dict[str, str],
    job_dir: Path,
    args: Sequence[str],
    *,
    nodes: int = 1,
    gpus_per_node: int = 2,
    sbatch_args: Sequence[str] = (),
    script: Sequence[str] | None = None,
    **env: str,
) -> Job:
    """Submit the example through the job wrapper (or ``script``) on the pool."""
    e = base_env(job_dir, **pool_env)
    e.update(HPCORCH_PYTHON=sys.executable, HPCORCH_CONTROLLED="1")
    e.update(env)
    e = {k: v for k, v in e.items() if v != ""}  # "" unsets
    job_dir.mkdir(parents=True, exist_ok=True)
    out = job_dir.parent / f"{job_dir.name}.out"
    cmd = [
        "sbatch", "--parsable", f"--nodes={nodes}", f"--gres=gpu:{gpus_per_node}",
        f"--output={out}", "--open-mode=append", *sbatch_args,
        *(script or [str(WRAPPER), str(EXAMPLE)]), *args,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=e, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch failed: {done.stderr.strip()}")
    return Job(done.stdout.strip().split(";")[0], out, e)


def signal_job_at(job: Job, job_dir: Path, step: int, sig: str = "USR2") -> None:
    """Ask the job for a checkpoint the way a site does: signal its batch shell."""
    wait_for(lambda: last_step(job_dir) >= step, timeout=300)
    job.scancel("--batch", f"--signal={sig}")
