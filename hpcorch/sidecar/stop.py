"""Stopping the script the sidecar runs: its stop signal or command, Slurm's requeue when the
script asked for one, the kill after the grace period.

Signals reach the training tasks through srun (SIGUSR1 and SIGUSR2, which srun relays) or
through ``scancel --signal`` on the job's tasks (any other signal would end srun's step).
The kill after the grace targets the training step(s), never the job: SIGKILL for the whole
job would cancel it.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

from hpcorch.protocol import REQUEUE_REQUEST_FILE
from hpcorch.sidecar.config import SidecarConfig, signal_number

KILL_WAIT_S = 15.0
"""How long the sidecar waits for srun after it killed the training step."""


class ScriptStop:
    """The state of one launch's stop: when it began, whether it became a kill."""

    def __init__(
        self,
        cfg: SidecarConfig,
        env: dict[str, str],
        job_id: str,
        log: Callable[..., None],
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.job_id = job_id
        self.log = log
        self.started: float | None = None
        """When the stop began (the signal, the command or the requeue's SIGTERM)."""
        self.killed = False
        self.requeue_stopped = False

    def install_requeue_shim(self) -> None:
        """Under the controller a script's own ``scontrol requeue`` of its job (Lightning's
        convention on its checkpoint signal) becomes a relaunch request to the sidecar: a
        small ``scontrol`` in front of Slurm's on the tasks' PATH."""
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

    def deliver(self, proc: subprocess.Popen[bytes], name: str) -> None:
        """Signal ``name`` to the script's tasks."""
        num = signal_number(name)
        if num in (signal.SIGUSR1, signal.SIGUSR2) or not self.job_id:
            proc.send_signal(num)  # srun relays these to every task (or no srun at all)
            return
        # srun would end the step on any other signal: deliver it to the tasks themselves
        scancel(f"--signal={num}", self.job_id)

    def begin(self, proc: subprocess.Popen[bytes], managed: bool) -> None:
        """The checkpoint signal came: a script that uses the runtime gets it relayed (it
        checkpoints itself); any other script its stop signal or stop command."""
        self.started = time.time()
        if managed:
            sig = self.cfg.ckpt_signals[0]
            self.log(f"SIG{sig} received: relaying it to the runtime to checkpoint")
            self.deliver(proc, sig)
            return
        if self.cfg.stop_command:
            self.log(f"stop requested: running the stop command {self.cfg.stop_command!r}")
            subprocess.Popen(["bash", "-c", self.cfg.stop_command], env=self.env)
        else:
            self.log(f"stop requested: SIG{self.cfg.stop_signal} to the script")
            self.deliver(proc, self.cfg.stop_signal)

    def requeue_requested(self, managed: bool) -> bool:
        """The script asked (through the scontrol shim) to be requeued, not yet acted on."""
        if managed or self.requeue_stopped:
            return False
        return (self.cfg.job_dir / REQUEUE_REQUEST_FILE).exists()

    def stop_requeued(self, proc: subprocess.Popen[bytes]) -> None:
        """Do what Slurm's requeue does to a running job: SIGTERM to its tasks (then SIGKILL
        after the grace). A Lightning script saves its checkpoint and asks for the requeue on
        its signal, then trains on until Slurm stops it."""
        self.requeue_stopped = True
        if self.started is None:
            self.started = time.time()
        self.log(
            "the script checkpointed and asked to be requeued: SIGTERM to stop it, as Slurm would"
        )
        self.deliver(proc, "TERM")

    def grace_over(self, now: float, managed: bool) -> bool:
        started = self.started
        if started is None or managed or self.killed:
            return False
        return now - started > self.cfg.grace_s

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.killed = True
        self.log(
            f"the script did not exit within {self.cfg.grace_s:.0f} s of the stop: killing it",
            logging.WARNING,
        )
        if not self.job_id:
            proc.kill()
            proc.wait()
            return
        # SIGKILL for the whole job would cancel it: kill the training step(s) only
        for step in self._steps():
            scancel("--signal=KILL", step)
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


def scancel(*args: str) -> None:
    """Signal job steps; a step that has ended meanwhile is not an error."""
    subprocess.run(
        ["scancel", *args], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
