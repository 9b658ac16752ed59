"""What a resize costs a job, part by part, as measured on the real pool.

The simulated Slurm side (:mod:`hpcorch.sim.slurm_side`) charges each part where it
happens, and the production controller that drives it adds its own waits (the cycle it
notices an exit in), so a simulated resize costs what a real one does:

    signal -> checkpoint written -> processes exit -> (controller: exit seen, relaunch
    delay, requeue, reshape, release) -> batch script, Python, torch, process group ->
    first step at the new size

The defaults are the figures of ``benchmarks/resize_overhead.py`` (a real 4-rank DDP job
resized by the controller on the local pool; docs/controller.md, "Measured"): update them
here when the real pool is measured again.

The replay of a workload on the real pool (``benchmarks/replay.py``, 40 emulated jobs that
load no data and build no model, on an otherwise idle 2-core machine) measured, on Slurm
22.05: checkpoint 0.38 s (median; 0.17-1.55), exit to requeue 0.46 s, a start-up of
2.87 s + 1.11 s per GPU (least squares over 52 launches of 1-15 GPUs; 1.8-21.3 s), and a
job's end 1.92 s after its last step (mean; 0-6.4 s). The start-up's per-GPU part is the
two cores every rank imports torch on; the defaults stay those of real training jobs on a
loaded machine, and a replay gives its pool's own figures to the simulator
(``--startup-s``, ``--startup-per-gpu-s``, ``--finish-s``).
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINT_S = 0.2
"""signal -> checkpoint written: 0.02-0.18 s measured (the next step boundary, all ranks
agree, rank 0 writes)."""
EXIT_S = 0.0
"""checkpoint written -> the job's processes, srun and batch script ended: 0.00 s measured."""
REQUEUE_S = 2.0
"""exit -> released at the new shape: 1.5-2.0 s measured, almost all of it the controller's
``relaunch_delay_s`` (2 s: slurmd refuses a relaunch while it revokes the last run's
credential); the cycle in which the controller notices the exit comes on top."""
STARTUP_S = 22.3
"""released -> first training step: Slurm starts the batch script, Python and torch import in
every rank, the process group forms, the checkpoint is read (released->start 18.3-25.9 s
plus start->step 0.2-0.3 s measured; their mean)."""


STARTUP_PER_GPU_S = 0.0
"""What each GPU's rank adds to a launch's start-up: 0 in the published runs (a cluster's
nodes start their ranks in parallel). On the 2-core local pool every rank imports Python
and torch on the same two cores: the replay there (benchmarks/replay.py) measures it."""
FINISH_S = 0.0
"""A job's last step -> its end in Slurm (final checkpoint, the ranks leave, srun and the
batch script end), holding its GPUs: 0 in the published runs; measured by the replay."""


@dataclass(frozen=True)
class ResizeCost:
    """Seconds each part of a resize takes (see the module's docstring)."""

    checkpoint_s: float = CHECKPOINT_S
    exit_s: float = EXIT_S
    requeue_s: float = REQUEUE_S
    startup_s: float = STARTUP_S
    startup_per_gpu_s: float = STARTUP_PER_GPU_S
    finish_s: float = FINISH_S

    def startup(self, gpus: int) -> float:
        """Released -> first training step of a launch on ``gpus`` GPUs."""
        return self.startup_s + self.startup_per_gpu_s * gpus

    @property
    def stop_s(self) -> float:
        """Signal -> exit: the job holds its GPUs and makes no progress."""
        return self.checkpoint_s + self.exit_s

    @property
    def total(self) -> float:
        """A resize without the controller's cycle wait: what the policy is told it costs."""
        return self.checkpoint_s + self.exit_s + self.requeue_s + self.startup_s

    def describe(self) -> str:
        per_gpu = f" (+ {self.startup_per_gpu_s:g} s per GPU)" if self.startup_per_gpu_s else ""
        finish = f"; a job's end {self.finish_s:g} s after its last step" if self.finish_s else ""
        return (
            f"checkpoint {self.checkpoint_s:g} s + exit {self.exit_s:g} s + requeue "
            f"{self.requeue_s:g} s + start-up {self.startup_s:g} s{per_gpu} = {self.total:g} s"
            f"{finish}"
        )
