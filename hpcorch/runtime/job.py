"""The elastic job: safe points, checkpoints, LR scaling and exact resume around a DDP loop."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hpcorch.protocol import CHECKPOINT_DIR, EXIT_RELAUNCH
from hpcorch.runtime import checkpoint as ckpt
from hpcorch.runtime.config import Settings
from hpcorch.runtime.dist import DistInfo
from hpcorch.runtime.gns import NoiseScale
from hpcorch.runtime.launch import Launch
from hpcorch.runtime.lr import LrFactor
from hpcorch.runtime.resume import Resumed, find_resume
from hpcorch.runtime.sampler import ElasticSampler, StepLayout
from hpcorch.runtime.step import Step


class ElasticJob(Launch):
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
        super().__init__(dist_info, settings, fast_exit=fast_exit)
        self.state: dict[str, Any] = {}
        """User state saved in every checkpoint (plain values and tensors)."""
        self.global_step = 0
        self.epoch = 0
        self.offset = 0
        self.seed = seed
        self.keep_checkpoints = keep_checkpoints
        self.final_checkpoint = final_checkpoint
        self.noise = NoiseScale()
        self.lr = LrFactor(settings.lr_scaling, base_batch, warmup_steps)
        self._ddp: DistributedDataParallel | None = None
        self._model: torch.nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._scheduler: Any = None
        self._resume: dict[str, Any] | None = None
        self._resumed_rng = False
        self.timings = timings
        self._dataset_size = 0
        self.checkpoint_dir = settings.job_dir / CHECKPOINT_DIR
        self._rebatched = False
        resumed = find_resume(self, self.checkpoint_dir)  # the newest that loads (reads only)
        if resumed is not None:
            self._resume_from(resumed)
        elif settings.trained_step > 0:
            self.log(
                f"warning: this launch starts from step 0, but earlier launches of this job "
                f"trained to step {settings.trained_step}: no checkpoint in "
                f"{self.checkpoint_dir} could be read, their work is lost"
            )
        self.starting(self.global_step)  # the first writes: a bad plan or checkpoint wrote none

    def _resume_from(self, resumed: Resumed) -> None:
        """Take position, LR state and user state from the checkpoint; model and optimizer
        follow in :meth:`track`."""
        r = self._resume = resumed.payload
        self.timings["checkpoint_load_seconds"] = resumed.seconds
        try:
            self.global_step, self.epoch, self.offset = r["global_step"], r["epoch"], r["offset"]
            self.seed = r["seed"]
            self.state = dict(r["user"])
            self.noise.load_state_dict(r["gns"])
            # the same batch continues its warm-up; a new one ramps from the factor in effect
            self.lr.load_state_dict(r["lr"], r["plan"]["global_batch"] == self.global_batch)
            missing = [k for k in ("model", "optimizer", "rng", "dataset_size") if k not in r]
            if missing:
                raise KeyError(missing[0])
        except (KeyError, TypeError) as e:
            self.fail(f"checkpoint {resumed.path} lacks the field {e}")
        self.log(resumed.note)

    # -- set-up -------------------------------------------------------------------------
    @property
    def base_batch(self) -> int:
        """The global batch the optimizer's LR was tuned for."""
        return self.lr.base_batch

    @property
    def lr_factor(self) -> float:
        """The factor on the optimizer's LR in the current step."""
        return self.lr.factor

    @property
    def progress(self) -> float:
        """Scale-invariant progress: sum of the LR gains applied (AdaScale's 'iterations')."""
        return self.lr.progress

    @property
    def noise_scale(self) -> float | None:
        return self.noise.value

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
        self.lr.attach(optimizer)
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
                self.lr.update(self.global_batch, self.noise.value)
                step = Step(
                    layout,
                    batches,
                    index=self.global_step,
                    lr_factor=self.lr.factor,
                    ddp=self._ddp,
                    device=self.device,
                )
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
        agreed = self.agree(
            local_sq=float(local_sq) if local_sq is not None else None, loss=float(step._loss)
        )
        if agreed.failed > 0:  # only rank 0 writes: its exit code (storage, superseded) for all
            self.abort(agreed.failed)
        seconds = time.perf_counter() - t_start
        if layout.full and global_sq is not None and self.world_size > 1:
            self.noise.update(
                agreed.local_sq,
                float(global_sq),
                layout.local_samples,
                layout.size,
            )
        self._advance(layout)
        finished = self.epoch >= epochs or self.global_step == max_steps
        self.report_step(
            step=self.global_step,
            seconds=seconds,
            samples=layout.size,
            loss=agreed.loss_sum / layout.size if layout.size else None,
            # a new batch from the next step: this line closes the old one's measurement
            force=finished or agreed.stop or agreed.batch is not None,
            epoch=self.epoch,
            data_wait=step.data_wait,
            lr_factor=self.lr_factor,
            noise_scale=self.noise.value,
            progress=self.progress,
        )
        if agreed.batch is not None and not finished:
            self.rebatch(agreed.batch, self.global_step)
            self.lr.batch_changed()  # ramps from the factor in effect to the new batch's
            self._rebatched = True
        if agreed.stop and not finished:
            self.checkpoint(reason="signal")
            self.exit(EXIT_RELAUNCH, self.global_step)
        if agreed.save and not finished:
            self.checkpoint(reason="periodic")

    def _advance(self, layout: StepLayout) -> None:
        """Count a finished step: global step, data position, LR bookkeeping."""
        self.lr.stepped()
        self.global_step += 1
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
        self.done(self.global_step)

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
        self.stop_on_failure()  # only rank 0 writes: its outcome is every rank's
        self.checkpointed(reason, self.global_step, path, size[0], time.perf_counter() - t0)

    def _payload(self, rngs: list[Any]) -> dict[str, Any]:
        assert self._model is not None and self._optimizer is not None
        scheduler = self._scheduler
        return ckpt.payload(
            job=self.settings.job_id,
            world_size=self.world_size,
            position=(self.global_step, self.epoch, self.offset, self._dataset_size),
            seed=self.seed,
            plan=self.batch,
            lr=self.lr.state_dict(),
            gns=self.noise.state_dict(),
            model=self._model.state_dict(),
            optimizer=self._optimizer.state_dict(),
            scheduler=scheduler.state_dict() if scheduler is not None else None,
            user=self.state,
            rng=rngs,
        )

    def _event_start(self, dataset_size: int, epochs: int) -> None:
        self._dataset_size = dataset_size
        self.report_start(
            model=self._model,
            dataset_size=dataset_size,
            epochs=epochs,
            step=self.global_step,
            epoch=self.epoch,
            offset=self.offset,
            resumed=self._resume is not None,
            lr_scaling=self.settings.lr_scaling,
            **self.timings,
        )
