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
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

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
    ENV_TASK_START_TIMEOUT,
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
    signal_number,
)
from hpcorch.sidecar.lost import lost_reason, read_launch_record
from hpcorch.sidecar.requeue import relaunch
from hpcorch.sidecar.started import TaskStart, TaskStartError, task_start_timeout
from hpcorch.sidecar.stop import ScriptStop
from hpcorch.sidecar.watch import ScriptWatch

POLL_S = 0.2


_logger = logging.getLogger("hpcorch.sidecar")


def log(msg: str, level: int = logging.INFO) -> None:
    """One line in the job's output (hpcorch.logsetup: time, and the level if not info)."""
    logsetup.ensure(f"hpcorch-sidecar[{os.environ.get('SLURM_JOB_ID', '?')}]")
    _logger.log(level, "%s", msg)


class Sidecar:
    def __init__(
        self,
        cfg: SidecarConfig,
        launcher: Sequence[str],
        cmd: Sequence[str],
        task_start_s: float | None = None,
    ) -> None:
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
        self.stop_requested: float | None = None
        self.stop = ScriptStop(cfg, self.env, self.job_id, log)
        self.watch = ScriptWatch(cfg, self.metrics)
        self.prior = self._read_state()
        # under the wrapper (task_start_s set): a step that never starts is no result
        self.task_start = TaskStart(cfg.job_dir, self.launch, task_start_s)
        # the script uses the runtime (found at this or an earlier launch): relay only
        self.managed = bool(self.prior.get("managed"))
        self.resumed_reported = False

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
        del self.tracker.points[:-1]  # step times from here on are the new batch's
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
        self.stop.install_requeue_shim()
        (self.cfg.job_dir / REQUEUE_REQUEST_FILE).unlink(missing_ok=True)
        self.watch.start()
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
            self.watch.last_ckpt = ckpt
            self._checkpoint_seen(ckpt)
        how = f"resuming from {ckpt.path.name}" if ckpt and resuming else "fresh start"
        log(f"launch {self.launch + 1}: {shlex.join(command)} ({how})")
        self.task_start.clear(time.time())
        proc = subprocess.Popen(
            [*self.launcher, *command],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        pump = self.watch.pump
        pumps = [
            threading.Thread(target=pump, args=(proc.stdout, sys.stdout.buffer), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, sys.stderr.buffer), daemon=True),
        ]
        for t in pumps:
            t.start()
        next_ckpt_scan = 0.0
        while proc.poll() is None:
            now = time.time()
            if self.stop_requested is not None and self.stop.started is None:
                self.stop.begin(proc, self.managed)
            elif self.stop.requeue_requested(self.managed):
                self.stop.stop_requeued(proc)
            elif self.stop.grace_over(now, self.managed):
                self.stop.kill(proc)
            self._watch_task_start(proc, now)
            self._poll_runtime()
            self._poll_plan()
            self.watch.poll_progress_file()
            self._drain_progress()
            if now >= next_ckpt_scan:
                self._scan_checkpoints()
                next_ckpt_scan = now + 1.0
            time.sleep(POLL_S)
        for t in pumps:
            t.join(5)
        self.watch.poll_progress_file()
        self._drain_progress()
        self._scan_checkpoints()
        return self._finish(proc.returncode)

    def _watch_task_start(self, proc: subprocess.Popen[bytes], now: float) -> None:
        due = self.task_start.due(now)
        if due == "stop":
            log(
                f"no task of launch {self.launch + 1} started within "
                f"{self.task_start.timeout_s:.0f} s ({ENV_TASK_START_TIMEOUT}): stopping srun",
                logging.WARNING,
            )
            proc.terminate()
        elif due == "kill":
            proc.kill()

    def _drain_progress(self) -> None:
        for when, p in self.watch.taken():
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
        if not self.managed and self.watch.runtime_started():
            self.managed = True
            self.emit({"event": "mode", "mode": "managed", "detected": True})
            log("the script uses hpcorch's runtime: it checkpoints itself on the signal")

    def _checkpoint_seen(self, ckpt: Checkpoint) -> None:
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
        ckpt = self.watch.new_checkpoint()
        if ckpt is not None:
            self._checkpoint_seen(ckpt)

    def _finish(self, rc: int) -> int:
        no_task = self.task_start.no_result(rc)
        if no_task is not None:
            log(f"{no_task}: not a result")
            return EXIT_LAUNCH_LOST
        requeue = (self.cfg.job_dir / REQUEUE_REQUEST_FILE).exists()
        stopping = self.stop.started is not None and not self.managed
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
        return lost_reason(self.job_id, self.launch, owner, info, self.watch.node_failure)

    def _report_stop(self) -> None:
        now = time.time()
        ckpt = latest_checkpoint(self.cfg.ckpt_dir)
        last = self.tracker.last_step
        waited = now - (self.stop.started or now)
        line: dict[str, Any] = {
            "event": "stop",
            "graceful": not self.stop.killed,
            "waited_s": round(waited, 3),
            "last_step": last,
        }
        what = "killed after the grace period" if self.stop.killed else f"exited in {waited:.1f} s"
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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        n = int(args[0])
        launcher, cmd = args[1 : 1 + n], args[1 + n :]
        if len(launcher) != n or not cmd:
            raise ValueError("no command")
        cfg = config_from_env(os.environ, Path.cwd())
        task_start_s = task_start_timeout(os.environ)
    except (SidecarError, TaskStartError) as exc:
        log(str(exc), logging.ERROR)
        return EXIT_CONFIG
    except (IndexError, ValueError):
        log("usage: python -m hpcorch.sidecar N LAUNCHER-ARGS[N] COMMAND [ARGS...]", logging.ERROR)
        return 2
    return Sidecar(cfg, launcher, cmd, task_start_s).run()
