"""The sidecar process: runs a training script that does not use hpcorch's runtime, reports
its progress, and stops it for a relaunch at a new size.

The job wrapper (jobscripts/hpcorch-run.sbatch) execs ``python -m hpcorch.sidecar N
LAUNCHER[N] CMD...``: LAUNCHER is the srun command line, CMD the script's. On the
checkpoint signal (the controller's resize, or Slurm's time-limit warning) the sidecar
sends the script its stop signal (or runs its stop command), waits up to the grace
period, kills it if it is still running, and exits 75 so the job is relaunched; the
script resumes from its own checkpoint with its resume arguments.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from queue import Empty, SimpleQueue
from types import FrameType
from typing import IO, Any

from hpcorch import logsetup
from hpcorch.metrics_file import append_line
from hpcorch.planner import BatchPlanError, PlanFileError, plan_batch, read_plan
from hpcorch.protocol import (
    BATCH_FILE,
    ENV_ACCUM_STEPS,
    ENV_BATCH_FILE,
    ENV_CPUS_PER_GPU,
    ENV_GLOBAL_BATCH,
    ENV_JOB_ID,
    ENV_LAUNCH,
    ENV_PER_GPU_BATCH,
    ENV_PLAN,
    EXIT_CONFIG,
    EXIT_DONE,
    EXIT_LAUNCH_LOST,
    EXIT_RELAUNCH,
    LAUNCH_FILE,
    METRICS_FILE,
    REQUEUE_REQUEST_FILE,
    SIDECAR_STATE_FILE,
)
from hpcorch.sidecar.batch import LiveBatch
from hpcorch.sidecar.config import (
    Checkpoint,
    Progress,
    ProgressTracker,
    SidecarConfig,
    SidecarError,
    config_from_env,
    latest_checkpoint,
    launch_command,
    parse_json_line,
    parse_output_line,
    signal_number,
)
from hpcorch.sidecar.lost import lost_reason, node_failure_line, read_launch_record
from hpcorch.sidecar.requeue import relaunch

KILL_WAIT_S = 15.0
POLL_S = 0.2
POLL_BYTES = 1 << 20
"""Most bytes of the metrics file read per poll for the runtime's start line."""


_logger = logging.getLogger("hpcorch.sidecar")


def log(msg: str, level: int = logging.INFO) -> None:
    """One line in the job's output (hpcorch.logsetup: time, and the level if not info)."""
    logsetup.ensure(f"hpcorch-sidecar[{os.environ.get('SLURM_JOB_ID', '?')}]")
    _logger.log(level, "%s", msg)


class Sidecar:
    def __init__(self, cfg: SidecarConfig, launcher: Sequence[str], cmd: Sequence[str]) -> None:
        self.cfg = cfg
        self.started = time.time()
        self.launcher = list(launcher)
        self.cmd = list(cmd)
        self.launch = int(os.environ.get(ENV_LAUNCH) or 0)
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.gpus = max(1, int(os.environ.get("WORLD_SIZE") or 1))
        self.env = dict(os.environ)
        self.plan_launch: int | None = None
        self.global_batch, self.per_gpu = self._batch()
        self.live = LiveBatch(
            cfg.job_dir / BATCH_FILE,
            self.env.get(ENV_PLAN),
            self.gpus,
            self.launch,
            self.env.get(ENV_JOB_ID) or None,
            self.plan_launch,
        )
        self.live.global_batch, self.live.per_gpu_batch = self.global_batch, self.per_gpu
        self.live.accum_steps = int(self.env.get(ENV_ACCUM_STEPS) or 1)
        self.env[ENV_BATCH_FILE] = str(self.live.path)
        self.metrics = cfg.job_dir / METRICS_FILE
        self.tracker = ProgressTracker(self.gpus, self.global_batch, self.per_gpu)
        self.tracker.interval_s = cfg.metrics_interval_s
        cpus = os.environ.get(ENV_CPUS_PER_GPU, "")
        self.tracker.cpus_per_gpu = int(cpus) if cpus.isdigit() else 0
        self.progress: SimpleQueue[tuple[float, Progress]] = SimpleQueue()
        self.stop_requested: float | None = None
        self.stop_started: float | None = None
        self.killed = False
        self.requeue_stopped = False
        self.runtime_offset = 0
        self.progress_offset = 0
        self.last_ckpt: Checkpoint | None = None
        self.prior = self._read_state()
        # the script uses the runtime (found at this or an earlier launch): relay only
        self.managed = bool(self.prior.get("managed"))
        self.resumed_reported = False
        self.node_failure = False
        """srun reported a lost node during this launch."""

    # --- set-up ---------------------------------------------------------------------------
    def _batch(self) -> tuple[int, int]:
        """The global and per-GPU batch of this launch (the controller's plan, if any),
        exported for scripts that want to follow it."""
        global_batch, max_micro = int(self.env.get(ENV_GLOBAL_BATCH) or 0), 0
        plan_path = self.env.get(ENV_PLAN)
        if plan_path:
            try:
                plan = read_plan(plan_path)
                global_batch, max_micro = plan.global_batch, plan.max_micro_batch
                self.plan_launch = plan.launch
            except PlanFileError as exc:
                log(f"ignoring the plan: {exc}", logging.WARNING)
        if not global_batch:
            return 0, 0
        try:
            split = plan_batch(max(global_batch, self.gpus), self.gpus, max_micro or global_batch)
            per_gpu, accum = split.micro_batch, split.accum_steps
            global_batch = split.global_batch
        except BatchPlanError:
            per_gpu, accum = max(1, global_batch // self.gpus), 1
        self.env[ENV_GLOBAL_BATCH] = str(global_batch)
        self.env[ENV_PER_GPU_BATCH] = str(per_gpu)
        self.env[ENV_ACCUM_STEPS] = str(accum)
        return global_batch, per_gpu

    def _poll_plan(self) -> None:
        """A new global batch at the same GPUs (the controller rewrote the plan): passed on
        in the batch file (a script that uses the runtime reads the plan itself)."""
        line = None if self.managed else self.live.poll()
        if line is None:
            return
        self.global_batch, self.per_gpu = self.live.global_batch, self.live.per_gpu_batch
        self.tracker.global_batch, self.tracker.per_gpu_batch = self.global_batch, self.per_gpu
        self.emit({**line, "step": self.tracker.last_step})
        log(f"global batch {line['from_batch']} -> {self.global_batch}: in {self.live.path}")

    def _read_state(self) -> dict[str, Any]:
        try:
            doc = json.loads((self.cfg.job_dir / SIDECAR_STATE_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _write_state(self, outcome: str) -> None:
        state = {
            "launch": self.launch,
            "last_step": self.tracker.last_step,
            "time": time.time(),
            "outcome": outcome,
            "managed": self.managed,
        }
        path = self.cfg.job_dir / SIDECAR_STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state) + "\n")
        os.replace(tmp, path)

    def _requeue_shim(self) -> None:
        """Under the controller a script's own ``scontrol requeue`` of its job (Lightning's
        convention on its checkpoint signal) becomes a relaunch request to the sidecar."""
        if not self.cfg.controlled:
            return
        real = shutil.which("scontrol", path=self.env.get("PATH"))
        # without Slurm's own scontrol (a node without Slurm), other calls fail as bash would
        other = (
            f'exec {shlex.quote(real)} "$@"\n'
            if real
            else 'echo "scontrol: command not found" >&2\nexit 127\n'
        )
        bindir = self.cfg.job_dir / ".bin"
        bindir.mkdir(exist_ok=True)
        shim = bindir / "scontrol"
        shim.write_text(
            "#!/bin/bash\n"
            "# hpcorch: a job's request to requeue itself goes to the controller\n"
            'if [[ ${1-} == requeue && ${2-} == "$SLURM_JOB_ID" ]]; then\n'
            f"  touch {shlex.quote(str(self.cfg.job_dir / REQUEUE_REQUEST_FILE))}\n"
            "  exit 0\n"
            "fi\n" + other
        )
        shim.chmod(0o755)
        self.env["PATH"] = f"{bindir}:{self.env.get('PATH', '')}"

    def emit(self, line: dict[str, Any]) -> None:
        line.setdefault("time", time.time())
        line.setdefault("launch", self.launch)
        append_line(self.metrics, (json.dumps(line) + "\n").encode())  # rotated past its cap

    # --- running --------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_requested is None:
            self.stop_requested = time.time()

    def run(self) -> int:
        self.cfg.job_dir.mkdir(parents=True, exist_ok=True)
        for name in self.cfg.ckpt_signals:
            signal.signal(signal_number(name), self._on_signal)
        self._requeue_shim()
        (self.cfg.job_dir / REQUEUE_REQUEST_FILE).unlink(missing_ok=True)
        try:
            self.runtime_offset = self.metrics.stat().st_size
        except OSError:
            self.runtime_offset = 0
        if self.cfg.progress_file is not None:
            try:
                self.progress_offset = self.cfg.progress_file.stat().st_size
            except OSError:
                self.progress_offset = 0
        self.live.write()
        ckpt = latest_checkpoint(self.cfg.ckpt_dir)
        python = self.env.get("HPCORCH_PYTHON") or "python3"
        command, resuming = launch_command(self.cmd, self.cfg, ckpt, self.launch, python)
        self.emit(
            {
                "event": "launch",
                "mode": "sidecar",
                "gpus": self.gpus,
                "global_batch": self.global_batch,
                "resumable": self.cfg.resumable,
                "predictable": self.cfg.predictable,
                "watches_checkpoints": self.cfg.ckpt_dir is not None,
                "resumed": resuming,
                "checkpoint": str(ckpt.path) if ckpt else None,
            }
        )
        if ckpt is not None:
            self._checkpoint_seen(ckpt)
        how = f"resuming from {ckpt.path.name}" if ckpt and resuming else "fresh start"
        log(f"launch {self.launch + 1}: {shlex.join(command)} ({how})")
        proc = subprocess.Popen(
            [*self.launcher, *command],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [
            threading.Thread(target=self._pump, args=(proc.stdout, sys.stdout.buffer), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, sys.stderr.buffer), daemon=True),
        ]
        for t in pumps:
            t.start()
        next_ckpt_scan = 0.0
        while proc.poll() is None:
            now = time.time()
            if self.stop_requested is not None and self.stop_started is None:
                self._begin_stop(proc)
            elif self._requeue_requested():
                self._stop_requeued(proc)
            elif self._grace_over(now):
                self._kill(proc)
            self._poll_runtime()
            self._poll_plan()
            self._poll_progress_file()
            self._drain_progress()
            if now >= next_ckpt_scan:
                self._scan_checkpoints()
                next_ckpt_scan = now + 1.0
            time.sleep(POLL_S)
        for t in pumps:
            t.join(5)
        self._poll_progress_file()
        self._drain_progress()
        self._scan_checkpoints()
        return self._finish(proc.returncode)

    def _pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        rx = self.cfg.progress_regex
        for raw in iter(src.readline, b""):
            try:
                dst.write(raw)
                dst.flush()
            except (OSError, ValueError):
                pass
            if raw.startswith(b"srun: ") and node_failure_line(raw):
                self.node_failure = True
            if rx is None:
                continue
            now = time.time()
            for part in raw.split(b"\r"):
                p = parse_output_line(rx, part.decode("utf-8", "replace"))
                if p is not None:
                    self.progress.put((now, p))

    def _poll_progress_file(self) -> None:
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

    def _drain_progress(self) -> None:
        while True:
            try:
                when, p = self.progress.get_nowait()
            except Empty:
                break
            self.tracker.update(p, when)
            if not self.resumed_reported:
                self._report_resume(p)
        if not self.managed:
            line = self.tracker.due(time.time())
            if line is not None:
                self.emit(line)

    def _report_resume(self, p: Progress) -> None:
        self.resumed_reported = True
        before = self.prior.get("last_step")
        if self.launch == 0 or not isinstance(before, int):
            return
        lost = max(0, before - p.step)
        self.emit({"event": "resumed", "step": p.step, "previous_step": before, "lost_steps": lost})
        if lost:
            log(f"resumed at step {p.step}: {lost} steps since step {before} are done again")
        else:
            log(f"resumed at step {p.step}: no progress lost")

    def _poll_runtime(self) -> None:
        """A script that uses the runtime after all: from then on the sidecar only relays."""
        if self.managed:
            return
        try:
            with open(self.metrics, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self.runtime_offset:
                    self.runtime_offset = 0  # rotated or truncated: a new file
                fh.seek(self.runtime_offset)
                data = fh.read(POLL_BYTES)
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == POLL_BYTES:
            end = len(data)  # one line longer than a whole read: skipped
        self.runtime_offset += end
        for line in data[:end].splitlines():
            if b'"event": "start"' in line or b'"event":"start"' in line:
                self.managed = True
                self.emit({"event": "mode", "mode": "managed", "detected": True})
                log("the script uses hpcorch's runtime: it checkpoints itself on the signal")
                return

    def _checkpoint_seen(self, ckpt: Checkpoint) -> None:
        self.last_ckpt = ckpt
        self.emit(
            {
                "event": "checkpoint",
                "source": "sidecar",
                "path": str(ckpt.path),
                "saved_at": ckpt.mtime,
                "step": self.tracker.step_at(ckpt.mtime),
            }
        )

    def _scan_checkpoints(self) -> None:
        ckpt = latest_checkpoint(self.cfg.ckpt_dir)
        if ckpt is not None and ckpt != self.last_ckpt:
            self._checkpoint_seen(ckpt)

    # --- stopping ---------------------------------------------------------------------------
    def _deliver(self, proc: subprocess.Popen[bytes], name: str) -> None:
        num = signal_number(name)
        if num in (signal.SIGUSR1, signal.SIGUSR2) or not self.job_id:
            proc.send_signal(num)  # srun relays these to every task (or no srun at all)
            return
        # srun would end the step on any other signal: deliver it to the tasks themselves
        _scancel(f"--signal={num}", self.job_id)

    def _begin_stop(self, proc: subprocess.Popen[bytes]) -> None:
        self.stop_started = time.time()
        if self.managed:
            sig = self.cfg.ckpt_signals[0]
            log(f"SIG{sig} received: relaying it to the runtime to checkpoint")
            self._deliver(proc, sig)
            return
        if self.cfg.stop_command:
            log(f"stop requested: running the stop command {self.cfg.stop_command!r}")
            subprocess.Popen(["bash", "-c", self.cfg.stop_command], env=self.env)
        else:
            log(f"stop requested: SIG{self.cfg.stop_signal} to the script")
            self._deliver(proc, self.cfg.stop_signal)

    def _requeue_requested(self) -> bool:
        """The script asked (through the scontrol shim) to be requeued, not yet acted on."""
        if self.managed or self.requeue_stopped:
            return False
        return (self.cfg.job_dir / REQUEUE_REQUEST_FILE).exists()

    def _stop_requeued(self, proc: subprocess.Popen[bytes]) -> None:
        """Do what Slurm's requeue does to a running job: SIGTERM to its tasks (then SIGKILL
        after the grace). A Lightning script saves its checkpoint and asks for the requeue on
        its signal, then trains on until Slurm stops it."""
        self.requeue_stopped = True
        if self.stop_started is None:
            self.stop_started = time.time()
        log("the script checkpointed and asked to be requeued: SIGTERM to stop it, as Slurm would")
        self._deliver(proc, "TERM")

    def _grace_over(self, now: float) -> bool:
        started = self.stop_started
        if started is None or self.managed or self.killed:
            return False
        return now - started > self.cfg.grace_s

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.killed = True
        log(
            f"the script did not exit within {self.cfg.grace_s:.0f} s of the stop: killing it",
            logging.WARNING,
        )
        if not self.job_id:
            proc.kill()
            proc.wait()
            return
        # SIGKILL for the whole job would cancel it: kill the training step(s) only
        for step in self._steps():
            _scancel("--signal=KILL", step)
        try:
            proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()

    def _steps(self) -> list[str]:
        """The job's running steps other than the batch and extern steps (``J.0`` ...)."""
        found = subprocess.run(
            ["squeue", "--steps", f"--jobs={self.job_id}", "--noheader", "--format=%i"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.split()
        return [
            s
            for s in found
            if s.startswith(self.job_id + ".") and s.split(".", 1)[1] not in ("batch", "extern")
        ]

    def _finish(self, rc: int) -> int:
        requeue = (self.cfg.job_dir / REQUEUE_REQUEST_FILE).exists()
        stopping = self.stop_started is not None and not self.managed
        if stopping or requeue or rc in (EXIT_DONE, EXIT_RELAUNCH):
            why = self._launch_lost()
            if why is not None:  # no result, no requeue (Slurm did), no write: not the owner
                log(f"launch {self.launch + 1} lost a node or a rank ({why}): not a result")
                return EXIT_LAUNCH_LOST
        if stopping or (requeue and not self.managed):
            self._report_stop()
            self._write_state("stopped")
            return self._relaunch()
        self._write_state("exited")
        if rc == EXIT_RELAUNCH:
            return self._relaunch()
        if rc == EXIT_DONE:
            log("training finished")
        else:
            log(f"training failed with exit code {rc}", logging.ERROR)
        return rc

    def _launch_lost(self) -> str | None:
        """Why this launch is not a result (hpcorch.sidecar.lost), None when it is one."""
        owner, info = read_launch_record(self.cfg.job_dir / LAUNCH_FILE, self.job_id, self.env)
        return lost_reason(self.job_id, self.launch, owner, info, self.node_failure)

    def _report_stop(self) -> None:
        now = time.time()
        ckpt = latest_checkpoint(self.cfg.ckpt_dir)
        last = self.tracker.last_step
        waited = now - (self.stop_started or now)
        line: dict[str, Any] = {
            "event": "stop",
            "graceful": not self.killed,
            "waited_s": round(waited, 3),
            "last_step": last,
        }
        what = "killed after the grace period" if self.killed else f"exited in {waited:.1f} s"
        if ckpt is not None:
            at = self.tracker.step_at(ckpt.mtime)
            age = max(0.0, now - ckpt.mtime)
            line.update(checkpoint=str(ckpt.path), checkpoint_age_s=round(age, 3))
            redo = ""
            if at is not None and last is not None:
                line["lost_steps_estimate"] = max(0, last - at)
                redo = f" (~{max(0, last - at)} steps to redo)"
            log(f"script {what}; last checkpoint {ckpt.path.name}, {age:.1f} s old{redo}")
        elif self.cfg.ckpt_dir is not None:
            line["lost_steps_estimate"] = last or 0
            log(f"script {what}; no checkpoint in {self.cfg.ckpt_dir}: it restarts from scratch")
        else:
            log(f"script {what}")
        self.emit(line)

    def _relaunch(self) -> int:
        if not self.job_id:
            log("stopped")
            return EXIT_RELAUNCH
        return relaunch(self.job_id, self.cfg.controlled, self.cfg.job_dir, self.started, log)


def _scancel(*args: str) -> None:
    """Signal job steps; a step that has ended meanwhile is not an error."""
    subprocess.run(
        ["scancel", *args], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        n = int(args[0])
        launcher, cmd = args[1 : 1 + n], args[1 + n :]
        if len(launcher) != n or not cmd:
            raise ValueError("no command")
        cfg = config_from_env(os.environ, Path.cwd())
    except SidecarError as exc:
        log(str(exc), logging.ERROR)
        return EXIT_CONFIG
    except (IndexError, ValueError):
        log("usage: python -m hpcorch.sidecar N LAUNCHER-ARGS[N] COMMAND [ARGS...]", logging.ERROR)
        return 2
    return Sidecar(cfg, launcher, cmd).run()
