"""One launch of a managed job as the controller sees it: the protocol it speaks.

A launch writes its reports (``metrics.jsonl``, ``heartbeat``) only while it owns the job
directory (the fence), takes the checkpoint signal, agrees with every rank at each step
boundary whether to stop, checkpoint or change its batch, and leaves with the protocol's
exit codes. :class:`hpcorch.runtime.job.ElasticJob` builds its DDP loop on it; the
training-library integrations (hpcorch/integrations/) build theirs on it too.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from hpcorch import logsetup
from hpcorch.planner import BatchPlan, PlanWatcher, batch_from_plan
from hpcorch.protocol import (
    ENV_CPUS_PER_GPU,
    ENV_LAUNCH,
    ENV_QUIET_RELAUNCH,
    EXIT_CONFIG,
    EXIT_DONE,
    EXIT_RELAUNCH,
    HEARTBEAT_FILE,
    METRICS_FILE,
)
from hpcorch.runtime.config import EARLY_SIGNAL, Settings
from hpcorch.runtime.dist import DistInfo
from hpcorch.runtime.fence import Fence, Gate
from hpcorch.runtime.metrics import Heartbeat, MetricsWriter, process_age


@dataclass(frozen=True)
class Agreement:
    """What every rank agreed at a step boundary (one all-reduce)."""

    stop: bool
    """A rank got the checkpoint signal: checkpoint and exit 75."""
    save: bool
    """A periodic checkpoint is due."""
    local_sq: float
    """The mean over ranks of the local squared gradient norms (the noise scale's input)."""
    loss_sum: float
    """The sum over ranks of the losses they contributed."""
    failed: int
    """Rank 0's failure to write (an exit code), 0 when none."""
    batch: BatchPlan | None
    """A new split of the global batch from the rewritten plan, None when unchanged."""


class Launch:
    """The protocol state of this launch: fence, reports, signal, plan and exit."""

    def __init__(self, dist_info: DistInfo, settings: Settings, *, fast_exit: bool) -> None:
        self.dist = dist_info
        self.settings = settings
        self.rank, self.world_size = dist_info.rank, dist_info.world_size
        self.device = dist_info.device
        self.fast_exit = fast_exit
        self._signalled: float | None = None
        self._last_ckpt = time.monotonic()
        main = self.rank == 0
        jd = settings.job_dir
        launch = os.environ.get(ENV_LAUNCH, "")
        self.launch = int(launch) if launch.isascii() and launch.isdigit() else None
        """This launch's generation (SLURM_RESTART_COUNT, from the wrapper)."""
        # rank 0 writes, only while this launch owns the job directory (see fence.py)
        fence = Fence(jd, os.environ.get("SLURM_JOB_ID") or None, self.launch)
        self.gate = Gate(fence if main else None)
        self._fence_checked = time.monotonic()
        self.metrics = MetricsWriter(
            jd / METRICS_FILE if main else None,
            settings.metrics_interval,
            gate=self.gate,
            launch=self.launch,
        )
        self.heartbeat = Heartbeat(
            jd / HEARTBEAT_FILE if main else None, gate=self.gate, launch=self.launch
        )
        for sig in settings.signals:
            signal.signal(sig, self._on_signal)
        self._signalled = EARLY_SIGNAL.pop("time", None)
        if settings.plan_gpus is not None and settings.plan_gpus != self.world_size:
            self.log(
                f"warning: the plan is for {settings.plan_gpus} GPUs but {self.world_size} "
                f"ranks run; planning the batch for {self.world_size}"
            )
        self._batch = settings.batch
        self._plan_watch = PlanWatcher(settings.plan_path if main else None)
        self._first_step_reported = False

    # -- what the launch is ---------------------------------------------------------------
    @property
    def batch(self) -> BatchPlan:
        """Per-GPU micro-batch and accumulation now (a rewritten plan changes them)."""
        return self._batch

    @property
    def global_batch(self) -> int:
        return self._batch.global_batch

    @property
    def cpus_per_gpu(self) -> int:
        """CPUs this rank has (HPCORCH_CPUS_PER_GPU from the wrapper, else its affinity)."""
        value = os.environ.get(ENV_CPUS_PER_GPU, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
        return max(1, len(os.sched_getaffinity(0)))

    @property
    def data_workers(self) -> int:
        """Data-loader workers that use this rank's CPUs: pass as ``num_workers``."""
        return max(0, self.cpus_per_gpu - 1)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def signalled(self) -> float | None:
        """When this rank got the checkpoint signal (None: not yet)."""
        return self._signalled

    def log(self, msg: str) -> None:
        """One line on stderr from rank 0."""
        if self.is_main:
            logsetup.ensure("hpcorch").info("%s", msg)

    def fail(self, msg: str, code: int = EXIT_CONFIG) -> NoReturn:
        """One clear error line (rank 0) and exit; nothing is written."""
        if self.is_main:
            logsetup.ensure("hpcorch").error("%s", msg)
        raise SystemExit(code)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signalled is None:
            self._signalled = time.time()

    def starting(self, step: int) -> None:
        """The launch's first writes (after a bad plan or checkpoint could still stop it
        with nothing written): the job directory and the ``starting`` heartbeat."""
        if self.is_main:
            jd = self.settings.job_dir
            self.gate.write(jd, lambda: jd.mkdir(parents=True, exist_ok=True))
            self.heartbeat.beat(step, state="starting", force=True)
        self.stop_on_failure()  # a full or read-only disk: every rank stops, one line

    # -- the step boundary ---------------------------------------------------------------
    def periodic_due(self) -> bool:
        """Rank 0: a periodic checkpoint (HPCORCH_CKPT_INTERVAL) is due."""
        interval = self.settings.checkpoint_interval
        return self.is_main and interval > 0 and time.monotonic() - self._last_ckpt >= interval

    def checkpointed(self, reason: str, step: int, path: Path, size: int, seconds: float) -> None:
        """A checkpoint was written (every rank knows): the ``checkpoint`` line; the periodic
        interval counts from now."""
        self._last_ckpt = time.monotonic()
        self.metrics.event(
            "checkpoint",
            reason=reason,
            step=step,
            path=str(path),
            bytes=size,
            seconds=seconds,
            signal_time=self._signalled,
            written_time=time.time(),
        )

    def propose_batch(self) -> BatchPlan | None:
        """Rank 0: the split of a rewritten plan's global batch, None when unchanged."""
        plan = self._plan_watch.changed()
        if plan is None:
            if self._plan_watch.error:
                self.log(f"ignoring the rewritten plan: {self._plan_watch.error}")
                self._plan_watch.error = ""
            return None
        s = self.settings
        new = batch_from_plan(
            plan,
            world_size=self.world_size,
            job_id=s.job_id,
            launch=s.plan_launch,
            lower=s.min_global_batch,
            upper=s.max_global_batch,
        )
        return None if new is None or new == self.batch else new

    def agree(
        self, *, local_sq: float | None, loss: float, periodic: bool | None = None
    ) -> Agreement:
        """Collective, at every step boundary: one all-reduce of [signal seen, periodic
        checkpoint due, local squared gradient norm, loss, rank 0's write failure, rank 0's
        proposal of a new batch split]. One rank that got the signal stops them all."""
        if self.is_main and time.monotonic() - self._fence_checked >= 1.0:
            self._fence_checked = time.monotonic()
            self.gate.check()  # a newer launch took over: stop before the next write
        due = self.periodic_due() if periodic is None else periodic
        new = self.propose_batch() if self.is_main else None
        flags = torch.tensor(
            [
                1.0 if self._signalled is not None else 0.0,
                1.0 if due else 0.0,
                float(local_sq) if local_sq is not None else 0.0,
                float(loss),
                float(self.gate.failure[0]) if self.gate.failure else 0.0,
                float(new.micro_batch) if new else 0.0,  # 0 from every rank but 0
                float(new.accum_steps) if new else 0.0,
            ],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(flags)
        stop, save, sum_local_sq, loss_sum, failed, micro, accum = flags.tolist()
        agreed = BatchPlan(self.world_size, int(micro), int(accum)) if micro > 0 else None
        return Agreement(
            stop=stop > 0,
            save=save > 0,
            local_sq=sum_local_sq / self.world_size,
            loss_sum=loss_sum,
            failed=int(failed),
            batch=agreed if agreed != self.batch else None,
        )

    def rebatch(self, new: BatchPlan, step: int) -> BatchPlan:
        """Every rank: take the agreed split from the next step (a ``rebatch`` line and one
        line on stderr); returns the split it replaced."""
        old, self._batch = self._batch, new
        self.metrics.event(
            "rebatch",
            step=step,
            from_batch=old.global_batch,
            global_batch=new.global_batch,
            per_gpu_batch=new.micro_batch,
            accum_steps=new.accum_steps,
        )
        self.log(f"global batch {old.describe()} -> {new.describe()} from step {step}")
        return old

    # -- reports ---------------------------------------------------------------------------
    def report_start(
        self,
        *,
        model: torch.nn.Module | None,
        dataset_size: int,
        epochs: int,
        step: int,
        epoch: int,
        offset: int,
        resumed: bool,
        **extra: Any,
    ) -> None:
        """The ``start`` line: training starts (or resumes) at this position, at this batch.
        ``model`` identifies the job's model and sizes its all-reduce (a prior)."""
        trained = [p for p in model.parameters() if p.requires_grad] if model is not None else []
        self.metrics.event(
            "start",
            dataset_size=dataset_size,
            epochs=epochs,
            model=type(model).__name__ if model is not None else None,
            params=sum(p.numel() for p in trained),
            model_bytes=sum(p.numel() * p.element_size() for p in trained),
            step=step,
            epoch=epoch,
            offset=offset,
            resumed=resumed,
            launcher=self.dist.launcher,
            backend=self.dist.backend,
            master=f"{self.dist.master_addr}:{self.dist.master_port}",
            gpus=self.world_size,
            global_batch=self.global_batch,
            requested_batch=self.settings.requested_batch,
            per_gpu_batch=self.batch.micro_batch,
            accum_steps=self.batch.accum_steps,
            pid=os.getpid(),
            **extra,
        )

    def report_step(
        self,
        *,
        step: int,
        seconds: float,
        samples: int,
        loss: float | None,
        force: bool,
        epoch: int,
        data_wait: float = 0.0,
        **extra: Any,
    ) -> None:
        """Account one optimizer step (a ``steps`` line at the metrics interval, the first
        step's event, the heartbeat). ``step``: the global step after it; ``samples``: the
        samples it consumed over all ranks."""
        self.metrics.step(
            step=step,
            seconds=seconds,
            samples=samples,
            loss=loss if loss is not None and math.isfinite(loss) else None,
            force=force,
            epoch=epoch,
            global_batch=self.global_batch,
            per_gpu_batch=self.batch.micro_batch,
            accum_steps=self.batch.accum_steps,
            gpus=self.world_size,
            cpus_per_gpu=self.cpus_per_gpu,
            data_wait=data_wait,
            **extra,
            **self._memory(),
        )
        if not self._first_step_reported:
            self._first_step_reported = True
            self.metrics.event("first_step", step=step, since_start=process_age())
        self.heartbeat.beat(step)

    def _memory(self) -> dict[str, int | None]:
        """Peak device memory of this rank so far (bytes; None on CPUs)."""
        if self.device.type != "cuda":
            return {"max_memory_allocated": None, "max_memory_reserved": None}
        return {
            "max_memory_allocated": torch.cuda.max_memory_allocated(self.device),
            "max_memory_reserved": torch.cuda.max_memory_reserved(self.device),
        }

    # -- leaving -------------------------------------------------------------------------
    def stop_on_failure(self) -> None:
        """Collective: stop every rank when rank 0 could not write (or was superseded)."""
        code = float(self.gate.failure[0]) if self.gate.failure else 0.0
        flag = torch.tensor([code], dtype=torch.float64, device=self.device)
        dist.broadcast(flag, src=0)
        if flag.item() > 0:
            self.abort(int(flag.item()))

    def abort(self, code: int) -> NoReturn:
        """Stop this launch without writing anything more: one line from rank 0."""
        if self.is_main and self.gate.failure is not None:
            logsetup.ensure("hpcorch").error("%s", self.gate.failure[1])
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        if self.fast_exit:
            os._exit(code)
        raise SystemExit(code)

    def done(self, step: int) -> None:
        """Collective, after the last step and the final checkpoint: every rank at a
        barrier, then the ``done`` report the job wrapper counts a launch finished by."""
        if self.world_size > 1:
            dist.barrier()  # no rank leaves while another is still in a collective
        self.metrics.event("done", step=step)
        self.heartbeat.beat(step, state="done", force=True)
        self.stop_on_failure()  # superseded or unwritten: the script writes no result

    def exit(self, code: int, step: int) -> NoReturn:
        """Leave the launch with ``code`` (after a checkpoint on request: EXIT_RELAUNCH)."""
        self.metrics.event("exit", code=code, step=step)
        said = self.heartbeat.beat(step, state=f"exit {code}", force=True)
        if code == EXIT_RELAUNCH and said and os.environ.get(ENV_QUIET_RELAUNCH) == "1":
            # hpcorch's wrapper reads the relaunch from the heartbeat ("exit 75" of this
            # launch): the step ends as completed, not as a failure in Slurm's accounting
            code = EXIT_DONE
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.fast_exit:
            # the checkpoint is durable: skip the interpreter's teardown of torch (1-2 s)
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        raise SystemExit(code)
