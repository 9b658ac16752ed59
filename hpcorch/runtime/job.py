"""The elastic job: safe points, checkpoints, LR scaling and exact resume around a DDP loop."""

from __future__ import annotations

import atexit
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hpcorch import logsetup
from hpcorch.planner import BatchPlan, lr_scale, warmup_factor
from hpcorch.protocol import (
    CHECKPOINT_DIR,
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    ENV_CPUS_PER_GPU,
    ENV_LAUNCH,
    ENV_QUIET_RELAUNCH,
    EXIT_CONFIG,
    EXIT_DONE,
    EXIT_RELAUNCH,
    HEARTBEAT_FILE,
    METRICS_FILE,
)
from hpcorch.runtime import checkpoint as ckpt
from hpcorch.runtime import rebatch
from hpcorch.runtime.config import EARLY_SIGNAL, Settings
from hpcorch.runtime.dist import DistInfo
from hpcorch.runtime.fence import Fence, Gate
from hpcorch.runtime.gns import NoiseScale
from hpcorch.runtime.metrics import Heartbeat, MetricsWriter, process_age
from hpcorch.runtime.resume import restore
from hpcorch.runtime.sampler import ElasticSampler, StepLayout
from hpcorch.runtime.step import Step


class ElasticJob:
    """State of one launch of an elastic training job. Create it with ``hpcorch.runtime.init``."""

    def __init__(
        self,
        dist_info: DistInfo,
        settings: Settings,
        *,
        base_batch: int,
        warmup_steps: int,
        seed: int,
        keep_checkpoints: int,
        final_checkpoint: bool,
        fast_exit: bool,
        timings: dict[str, float],
    ) -> None:
        self.dist = dist_info
        self.settings = settings
        self.rank, self.world_size = dist_info.rank, dist_info.world_size
        self.device = dist_info.device
        self.state: dict[str, Any] = {}
        """User state saved in every checkpoint (plain values and tensors)."""
        self.global_step = 0
        self.epoch = 0
        self.offset = 0
        self.seed = seed
        self.base_batch = base_batch
        self.warmup_steps = warmup_steps
        self.keep_checkpoints = keep_checkpoints
        self.final_checkpoint = final_checkpoint
        self.fast_exit = fast_exit
        self.noise = NoiseScale()
        self.progress = 0.0
        """Scale-invariant progress: sum of the LR gains applied (AdaScale's 'iterations')."""
        self._prev_factor = 1.0
        self._since_change = 0
        self.lr_factor = 1.0
        self._ddp: DistributedDataParallel | None = None
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._scheduler: Any = None
        self._saved_lrs: list[float] = []
        self._signalled: float | None = None
        self._last_ckpt = time.monotonic()
        self._resume: dict[str, Any] | None = None
        self._resumed_rng = False
        self.timings = timings
        self._first_step_logged = False
        self._dataset_size = 0
        main = self.rank == 0
        jd = settings.job_dir
        launch = os.environ.get(ENV_LAUNCH, "")
        self.launch = int(launch) if launch.isascii() and launch.isdigit() else None
        """This launch's generation (SLURM_RESTART_COUNT, from the wrapper)."""
        # rank 0 writes, only while this launch owns the job directory (see fence.py)
        fence = Fence(jd, os.environ.get("SLURM_JOB_ID") or None, self.launch)
        self.gate = Gate(fence if main else None)
        self._fence_checked = time.monotonic()
        self.checkpoint_dir = jd / CHECKPOINT_DIR
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
        self._plan_watch = rebatch.PlanWatcher(settings.plan_path if main else None)
        self._rebatched = False
        restore(self)  # from the newest checkpoint that loads, if any (reads only)
        if main:  # the first writes: a bad plan or checkpoint above left the directory as it was
            self.gate.write(jd, lambda: jd.mkdir(parents=True, exist_ok=True))
            self.heartbeat.beat(self.global_step, state="starting", force=True)
        self._stop_on_failure()  # a full or read-only disk: every rank stops, one line

    # -- set-up -------------------------------------------------------------------------
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
    def noise_scale(self) -> float | None:
        return self.noise.value

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

    def _stop_on_failure(self) -> None:
        """Collective: stop every rank when rank 0 could not write (or was superseded)."""
        code = float(self.gate.failure[0]) if self.gate.failure else 0.0
        flag = torch.tensor([code], dtype=torch.float64, device=self.device)
        dist.broadcast(flag, src=0)
        if flag.item() > 0:
            self._abort(int(flag.item()))

    def _abort(self, code: int) -> NoReturn:
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

    def wrap(self, module: torch.nn.Module, **ddp_kwargs: Any) -> DistributedDataParallel:
        """Move ``module`` to this rank's device and wrap it in DDP (with the noise hook when
        there are several ranks)."""
        t0 = time.perf_counter()
        module = module.to(self.device)
        if self.device.type == "cuda":
            ddp_kwargs.setdefault("device_ids", [self.device])
        self._ddp = DistributedDataParallel(module, **ddp_kwargs)
        if self.world_size > 1:  # the noise scale compares two batch sizes: one rank has one
            # a lambda: DDP rejects hooks whose annotations are strings (postponed evaluation)
            self._ddp.register_comm_hook(None, lambda state, bucket: self.noise.hook(state, bucket))
        self.timings["ddp_wrap_seconds"] = round(time.perf_counter() - t0, 3)
        return self._ddp

    def track(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
    ) -> None:
        """Checkpoint these (restoring them now when resuming); scale the optimizer's LR."""
        self._model = model.module if isinstance(model, DistributedDataParallel) else model
        self._optimizer, self._scheduler = optimizer, scheduler
        optimizer.register_step_pre_hook(self._scale_lr)
        optimizer.register_step_post_hook(self._unscale_lr)
        r = self._resume
        if r is None:
            return
        try:
            self._model.load_state_dict(r["model"])
            optimizer.load_state_dict(r["optimizer"])
            if scheduler is not None and r.get("scheduler") is not None:
                scheduler.load_state_dict(r["scheduler"])
        except (RuntimeError, KeyError, ValueError) as e:
            self.fail(f"checkpoint does not fit this model or optimizer: {str(e).splitlines()[0]}")

    def _scale_lr(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._saved_lrs = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] * self.lr_factor

    def _unscale_lr(self, opt: Any, args: Any, kwargs: Any) -> None:
        for g, lr in zip(opt.param_groups, self._saved_lrs, strict=True):
            g["lr"] = lr

    def _update_lr_factor(self) -> None:
        target = lr_scale(
            self.settings.lr_scaling, self.global_batch, self.base_batch, self.noise.value
        )
        self.lr_factor = warmup_factor(
            self._prev_factor, target, self._since_change, self.warmup_steps
        )
        if self._since_change >= self.warmup_steps:
            self._prev_factor = target

    # -- the loop --------------------------------------------------------------------------
    def steps(
        self,
        dataset: Any,
        epochs: int,
        *,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        max_steps: int | None = None,
    ) -> Iterator[Step]:
        """The optimizer steps left of ``epochs`` epochs over ``dataset``, from where it stopped.

        At each step boundary all ranks agree whether a checkpoint was requested; if so the
        checkpoint is written and the process exits with EXIT_RELAUNCH (75). ``max_steps``
        ends training at that global step (counted over all launches) instead.
        """
        if self._model is None:
            raise RuntimeError("call job.track(model, optimizer) before job.steps(...)")
        n = len(dataset)
        if self._resume is not None and self._resume["dataset_size"] != n:
            self.fail(
                f"the checkpoint was taken on a dataset of {self._resume['dataset_size']} "
                f"samples, this one has {n}"
            )
        sampler = ElasticSampler(n, self.seed, shuffle)
        if self._resume is not None and not self._resumed_rng:
            rngs = self._resume["rng"]
            if self.rank < len(rngs):
                ckpt.set_rng_state(rngs[self.rank])
            else:  # a rank that did not exist: fresh but deterministic streams
                ckpt.seed_all(self.seed * 1_000_003 + self.global_step * 1009 + self.rank)
            self._resumed_rng = True
        self._event_start(n, epochs)
        t_last = time.perf_counter()
        while self.epoch < epochs and (max_steps is None or self.global_step < max_steps):
            self._rebatched = False  # (re)plan the rest of the epoch at the current batch
            layouts = list(sampler.steps(self.epoch, self.offset, self.batch, self.rank))
            loader = DataLoader(
                dataset,
                batch_sampler=[list(mb.indices) for lay in layouts for mb in lay.micro],
                collate_fn=collate_fn,
                num_workers=num_workers,
                pin_memory=pin_memory,
                generator=torch.Generator().manual_seed(self.seed * 7919 + self.epoch),
            )
            batches = iter(loader)
            for layout in layouts:
                self._update_lr_factor()
                step = Step(self, layout, batches)
                try:
                    yield step
                except GeneratorExit:  # the loop was left with `break`
                    if step._done == len(layout.micro):
                        self._advance(layout)  # its update happened: do not repeat its samples
                    raise
                if step._done != len(layout.micro):
                    raise RuntimeError(
                        f"step {self.global_step}: {step._done} of {len(layout.micro)} "
                        "micro-batches were processed; iterate the whole step"
                    )
                self._boundary(step, layout, epochs, max_steps, t_last)
                t_last = time.perf_counter()
                if self.global_step == max_steps or self._rebatched:
                    break
        self._finish()

    def _boundary(
        self, step: Step, layout: StepLayout, epochs: int, max_steps: int | None, t_start: float
    ) -> None:
        """Book-keeping after a step; the safe point where checkpoints happen.

        The step's time runs from ``t_start`` to the end of this boundary's all-reduce: on a
        GPU the training loop only queues its kernels, and the all-reduce (whose result is
        read back here) is where this rank waits for them to finish."""
        local_sq, global_sq = self.noise.take()
        if self.is_main and time.monotonic() - self._fence_checked >= 1.0:
            self._fence_checked = time.monotonic()
            self.gate.check()  # a newer launch took over: stop before the next write
        periodic = (
            self.is_main
            and self.settings.checkpoint_interval > 0
            and time.monotonic() - self._last_ckpt >= self.settings.checkpoint_interval
        )
        micro, accum = rebatch.propose(self) if self.is_main else (0, 0)
        flags = torch.tensor(
            [
                1.0 if self._signalled is not None else 0.0,
                1.0 if periodic else 0.0,
                float(local_sq) if local_sq is not None else 0.0,
                float(step._loss),
                float(self.gate.failure[0]) if self.gate.failure else 0.0,
                float(micro),  # rank 0's proposal of a new split; 0 from the others
                float(accum),
            ],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(flags)
        stop, save, sum_local_sq, loss_sum, failed, micro_f, accum_f = flags.tolist()
        if failed > 0:  # only rank 0 writes: its exit code (storage, superseded) for all
            self._abort(int(failed))
        seconds = time.perf_counter() - t_start
        if layout.full and global_sq is not None and self.world_size > 1:
            self.noise.update(
                sum_local_sq / self.world_size,
                float(global_sq),
                layout.local_samples,
                layout.size,
            )
        self._advance(layout)
        finished = self.epoch >= epochs or self.global_step == max_steps
        loss = loss_sum / layout.size if layout.size else None
        self.metrics.step(
            step=self.global_step,
            seconds=seconds,
            samples=layout.size,
            loss=loss if loss is not None and math.isfinite(loss) else None,
            force=finished or stop > 0,
            epoch=self.epoch,
            global_batch=self.global_batch,
            per_gpu_batch=self.batch.micro_batch,
            accum_steps=self.batch.accum_steps,
            gpus=self.world_size,
            cpus_per_gpu=self.cpus_per_gpu,
            data_wait=step.data_wait,
            lr_factor=self.lr_factor,
            noise_scale=self.noise.value,
            progress=self.progress,
            **self._memory(),
        )
        if not self._first_step_logged:
            self._first_step_logged = True
            self.metrics.event("first_step", step=self.global_step, since_start=process_age())
        self.heartbeat.beat(self.global_step)
        if micro_f > 0 and not finished:
            self._rebatched = rebatch.apply(self, int(micro_f), int(accum_f))
        if stop > 0 and not finished:
            self.checkpoint(reason="signal")
            self._exit(EXIT_RELAUNCH)
        if save > 0 and not finished:
            self.checkpoint(reason="periodic")

    def _memory(self) -> dict[str, int | None]:
        """Peak device memory of this rank so far (bytes; None on CPUs)."""
        if self.device.type != "cuda":
            return {"max_memory_allocated": None, "max_memory_reserved": None}
        return {
            "max_memory_allocated": torch.cuda.max_memory_allocated(self.device),
            "max_memory_reserved": torch.cuda.max_memory_reserved(self.device),
        }

    def _advance(self, layout: StepLayout) -> None:
        """Count a finished step: global step, data position, LR bookkeeping."""
        self.progress += self.lr_factor
        self.global_step += 1
        self._since_change += 1
        self.offset = layout.offset + layout.size
        if self.offset >= self._dataset_size:
            self.epoch, self.offset = self.epoch + 1, 0

    def finish(self) -> None:
        """End training after leaving :meth:`steps` with ``break`` (a target reached, early
        stopping) as the loop's own end does: the final checkpoint (``final_checkpoint``),
        every rank at a barrier, the ``done`` report. Collective: every rank calls it."""
        self._finish()

    def _finish(self) -> None:
        if self.final_checkpoint:
            self.checkpoint(reason="done")
        if self.world_size > 1:
            dist.barrier()  # no rank leaves while another is still in a collective
        self.metrics.event("done", step=self.global_step)
        self.heartbeat.beat(self.global_step, state="done", force=True)
        self._stop_on_failure()  # superseded or unwritten: the script writes no result

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint(self, reason: str = "request") -> None:
        """Write a checkpoint now (collective: every rank must call it)."""
        t0 = time.perf_counter()
        rngs: list[Any] = [None] * self.world_size
        dist.all_gather_object(rngs, ckpt.rng_state())
        size, path = [0], ckpt.checkpoint_path(self.checkpoint_dir, self.global_step)
        if self.is_main:

            def write() -> None:  # under the fence: a newer launch waits for it to end
                size[0] = ckpt.save_atomic(self._payload(rngs), path)
                ckpt.prune(self.checkpoint_dir, self.keep_checkpoints, path)

            self.gate.write(path, write)
        self._stop_on_failure()  # only rank 0 writes: its outcome is every rank's
        self._last_ckpt = time.monotonic()
        written = time.time()
        self.metrics.event(
            "checkpoint",
            reason=reason,
            step=self.global_step,
            path=str(path),
            bytes=size[0],
            seconds=time.perf_counter() - t0,
            signal_time=self._signalled,
            written_time=written,
        )

    def _payload(self, rngs: list[Any]) -> dict[str, Any]:
        assert self._model is not None and self._optimizer is not None
        b = self.batch
        return {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "job": self.settings.job_id,
            "written_at": time.time(),
            "world_size": self.world_size,
            "global_step": self.global_step,
            "epoch": self.epoch,
            "offset": self.offset,
            "dataset_size": self._dataset_size,
            "seed": self.seed,
            "plan": {
                "global_batch": b.global_batch,
                "gpus": b.gpus,
                "micro_batch": b.micro_batch,
                "accum_steps": b.accum_steps,
            },
            "lr": {
                "rule": self.settings.lr_scaling,
                "base_batch": self.base_batch,
                "factor": self.lr_factor,
                "prev_factor": self._prev_factor,
                "since_change": self._since_change,
                "progress": self.progress,
            },
            "gns": self.noise.state_dict(),
            "model": self._model.state_dict(),
            "optimizer": self._optimizer.state_dict(),
            "scheduler": self._scheduler.state_dict() if self._scheduler is not None else None,
            "user": self.state,
            "rng": rngs,
        }

    def _exit(self, code: int) -> NoReturn:
        self.metrics.event("exit", code=code, step=self.global_step)
        said = self.heartbeat.beat(self.global_step, state=f"exit {code}", force=True)
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

    def _event_start(self, dataset_size: int, epochs: int) -> None:
        self._dataset_size = dataset_size
        model = self._model
        trained = [p for p in model.parameters() if p.requires_grad] if model is not None else []
        self.metrics.event(
            "start",
            dataset_size=dataset_size,
            epochs=epochs,
            # what identifies the model and sizes its all-reduce (the scheduler's prior)
            model=type(model).__name__ if model is not None else None,
            params=sum(p.numel() for p in trained),
            model_bytes=sum(p.numel() * p.element_size() for p in trained),
            step=self.global_step,
            epoch=self.epoch,
            offset=self.offset,
            resumed=self._resume is not None,
            launcher=self.dist.launcher,
            backend=self.dist.backend,
            master=f"{self.dist.master_addr}:{self.dist.master_port}",
            gpus=self.world_size,
            global_batch=self.global_batch,
            requested_batch=self.settings.requested_batch,
            per_gpu_batch=self.batch.micro_batch,
            accum_steps=self.batch.accum_steps,
            lr_scaling=self.settings.lr_scaling,
            pid=os.getpid(),
            **self.timings,
        )
