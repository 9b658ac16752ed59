"""A Lightning ``Trainer`` as a managed, elastic pool job: one callback.

    import hpcorch.integrations.lightning as hpl        # first: holds the signal
    ...
    trainer = L.Trainer(..., callbacks=[hpl.Elastic()])
    trainer.fit(model, train_loader)

:class:`Elastic` replaces the training data loader's batching with hpcorch's (the dataset,
collate function and workers stay the script's; its batch size becomes the most a device
takes, ``max_micro_batch``), so each launch trains at the global batch of the controller's
plan: per-device batch and ``accumulate_grad_batches`` from hpcorch's planner. It reports
the start, steps, throughput and gradient noise scale as the runtime does. On the checkpoint
signal it saves ``hpc_ckpt_N.ckpt`` in ``default_root_dir`` with Lightning's own
``trainer.save_checkpoint`` at the next step boundary (hpcorch's state is the callback's
state in it) and exits 75; under Slurm Lightning resumes from the newest ``hpc_ckpt`` by
itself, at the sample where the job stopped, at any size. A new global batch at the same
GPUs is taken while the job trains, from the first step the data loader has not started.

Exactness: each epoch is a seeded permutation independent of the world size; the steps of
an epoch take its next global-batch samples, the last step of the epoch what is left. A
resume at another world size or batch continues at the exact sample: none is skipped or
repeated, except in a step with fewer samples than ranks (only an epoch's last can be one:
W ranks, at most W - 1 of its samples are trained twice; with a per-device batch of 1,
also when they are no multiple of W).

Lightning's machinery this relies on: the fit loop's training data source and its count of
accumulated batches (``fit_loop._data_source``, ``epoch_loop._accumulated_batches_reached``)
are taken over for the run; tested with Lightning 2.6.
"""

from __future__ import annotations

import hpcorch.runtime  # noqa: F401  (first: holds the checkpoint signal while torch loads)

# isort: split
import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from hpcorch.integrations.core import ElasticRun, joined_group, settle
from hpcorch.protocol import ENV_GLOBAL_BATCH, EXIT_RELAUNCH
from hpcorch.runtime import checkpoint as ckpt

__all__ = ["Elastic"]

HPC_CKPT = re.compile(r"^hpc_ckpt_(\d+)\.ckpt$")
"""Lightning's name for the checkpoints it resumes from under Slurm."""
KEEP = 2
"""hpc_ckpt files kept (the newest); older ones are deleted once a new one is in place."""


class _Split(DistributedSampler):  # type: ignore[type-arg]
    """Says to Lightning that the loader is already split between the ranks (it would put a
    DistributedSampler in otherwise); draws nothing itself."""

    def __init__(self) -> None:  # no DistributedSampler.__init__: nothing to shard
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def set_epoch(self, epoch: int) -> None:
        pass


class _EpochSampler(Sampler[list[int]]):
    """This rank's micro-batches of one epoch, from where the job stands in it. No length:
    an epoch's count of micro-batches changes with the batch."""

    def __init__(self, run: ElasticRun) -> None:
        self.run = run
        self.epoch = run.position[0]  # Lightning draws the first batch before set_epoch
        self.sampler = self  # Lightning sets the epoch of a batch sampler's ``sampler``

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        run, e = self.run, self.epoch
        done_epoch, offset = run.position
        if e < done_epoch:
            return  # an epoch the job finished before it stopped
        yield from run.micro_batches((e, offset if e == done_epoch else 0), epoch_end=True)


class _Source:
    """Lightning's source of the training data loader, with hpcorch's batching."""

    def __init__(self, inner: Any, callback: Elastic) -> None:
        self.inner = inner
        self.callback = callback

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def dataloader(self) -> Any:
        loader = self.inner.dataloader()
        if not isinstance(loader, DataLoader):
            raise TypeError("hpcorch.integrations.lightning needs one training DataLoader")
        return self.callback._loader(loader)


class Elastic(pl.Callback):
    """Lightning's hooks into the launch (see the module)."""

    def __init__(
        self,
        *,
        max_micro_batch: int | None = None,
        global_batch: int | None = None,
        lr_scaling: str = "none",
        warmup_steps: int = 0,
        seed: int = 0,
    ) -> None:
        """``max_micro_batch``: the most samples a device takes in one pass (default: the
        training loader's ``batch_size``); ``global_batch``: the script's global batch
        (default: that batch size x ``accumulate_grad_batches`` x the ranks of the first
        launch); the plan and ``hpcorch submit`` override both. ``lr_scaling``: none
        (default), linear, sqrt or adascale, ramped over ``warmup_steps`` after every change
        of the global batch. ``seed``: of the data order."""
        self.max_micro_batch = max_micro_batch
        self.global_batch = global_batch
        self.lr_scaling = lr_scaling
        self.warmup_steps = warmup_steps
        self.seed = seed
        self.run: ElasticRun | None = None
        self._trainer: pl.Trainer | None = None
        self._saved: dict[str, Any] | None = None
        self._rngs: list[Any] = []
        self._loss = 0.0
        self._reported = False

    @property
    def state_key(self) -> str:
        return "hpcorch"

    # -- set-up ----------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
        loop = trainer.fit_loop
        if not isinstance(loop._data_source, _Source):
            loop._data_source = _Source(loop._data_source, self)  # type: ignore[assignment]
        epoch_loop = loop.epoch_loop
        epoch_loop._accumulated_batches_reached = self._step_complete  # type: ignore[method-assign]

    def _loader(self, user: DataLoader[Any]) -> DataLoader[Any]:
        """The script's loader batched by hpcorch (the first call creates the run)."""
        trainer = self._trainer
        assert trainer is not None
        if self.run is None:
            self.run = self._start(trainer, user)
        run = self.run
        loader: DataLoader[Any] = DataLoader(
            user.dataset,
            batch_sampler=_EpochSampler(run),
            num_workers=user.num_workers,
            collate_fn=user.collate_fn,
            pin_memory=user.pin_memory,
            timeout=user.timeout,
            worker_init_fn=user.worker_init_fn,
            multiprocessing_context=user.multiprocessing_context,
            generator=user.generator,
            prefetch_factor=user.prefetch_factor,
            persistent_workers=user.persistent_workers,
        )
        object.__setattr__(loader, "sampler", _Split())  # DataLoader refuses a plain setattr
        return loader

    def _start(self, trainer: pl.Trainer, user: DataLoader[Any]) -> ElasticRun:
        n = len(user.dataset)  # type: ignore[arg-type]
        world = max(1, trainer.world_size)
        micro = self.max_micro_batch or user.batch_size or 1
        accum = trainer.accumulate_grad_batches
        script = self.global_batch or micro * accum * world
        script = int(os.environ.get(ENV_GLOBAL_BATCH) or 0) or script
        info = joined_group(trainer.strategy.root_device, "lightning")
        settings = settle(
            info, global_batch=script, max_micro_batch=micro, lr_scaling=self.lr_scaling
        )
        shuffle = isinstance(user.sampler, RandomSampler) or bool(
            getattr(user.sampler, "shuffle", False)
        )
        run = ElasticRun(
            info,
            settings,
            framework="lightning",
            dataset_size=n,
            seed=self.seed,
            shuffle=shuffle,
            base_batch=script,
            warmup_steps=self.warmup_steps,
        )
        if self._saved is not None:
            run.load_state_dict(self._saved, "the Lightning checkpoint")
            rngs = self._saved.get("rng") or []
            if run.rank < len(rngs):  # a rank the job had: its random streams go on
                ckpt.set_rng_state(rngs[run.rank])
            self._saved = None
            epoch, offset = run.position
            run.log(f"resuming at step {run.global_step} (epoch {epoch}, sample {offset})")
        return run

    # -- the loop --------------------------------------------------------------------------
    def _step_complete(self) -> bool:
        """Lightning's question "is this micro-batch the last of its optimizer step?",
        answered from hpcorch's layout of the step."""
        run = self.run
        if run is None or run.current is None:
            return True
        return run.micro_done >= len(run.current.micro)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self.run
        assert run is not None, "the training data loader was not made through hpcorch"
        run.attach(trainer.strategy.model, trainer.optimizers[0] if trainer.optimizers else None)
        if not self._reported:
            self._reported = True
            run.report_begin(pl_module, self._epochs(trainer, run))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        run = self.run
        assert run is not None
        if run.current is None:
            span = run.step_begin()
            trainer.accumulate_grad_batches = len(span.micro)  # Lightning divides the loss by it
            self._loss = 0.0
        run.micro_done += 1

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        run = self.run
        assert run is not None and run.current is not None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._loss += float(loss.detach())  # already divided by the step's micro-batches
        if not self._step_complete():
            return
        agreed = run.step_end(loss=self._loss / run.world_size, last=self._last(trainer, run))
        if agreed.stop:
            self._save(trainer, "signal")
            run.exit(EXIT_RELAUNCH, run.global_step)
        if agreed.batch is not None:
            run.switch_at(agreed.batch)
        if agreed.save:
            self._save(trainer, "periodic")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.run is not None:
            self.run.restart_clock()  # a validation is no training step's time

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self.run
        if run is None:
            return
        self._save(trainer, "done")  # a relaunch of a finished job trains no more
        run.done(run.global_step)

    def _last(self, trainer: pl.Trainer, run: ElasticRun) -> bool:
        if trainer.max_steps is not None and 0 < trainer.max_steps <= run.global_step:
            return True
        epochs = trainer.max_epochs
        return epochs is not None and epochs > 0 and run.position[0] >= epochs

    def _epochs(self, trainer: pl.Trainer, run: ElasticRun) -> int:
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            return trainer.max_epochs
        return max(1, math.ceil(trainer.max_steps * run.global_batch / run.dataset_size))

    # -- checkpoints -----------------------------------------------------------------------
    def _save(self, trainer: pl.Trainer, reason: str) -> None:
        """Collective: ``hpc_ckpt_N.ckpt`` through Lightning (written under another name and
        renamed once complete, so the newest name is always a whole file)."""
        run = self.run
        assert run is not None
        t0 = time.perf_counter()
        root = Path(trainer.default_root_dir)
        number = max([int(m[1]) for p in _listing(root) if (m := HPC_CKPT.match(p))], default=0) + 1
        final = root / f"hpc_ckpt_{number}.ckpt"
        tmp = root / f".hpcorch-{number}.ckpt.tmp"
        self._rngs = [None] * run.world_size  # every rank's random streams, in rank 0's file
        dist.all_gather_object(self._rngs, ckpt.rng_state())
        trainer.save_checkpoint(tmp)  # every rank; rank 0 writes
        size = [0]
        if run.is_main:

            def commit() -> None:
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                size[0] = tmp.stat().st_size
                os.replace(tmp, final)
                fd = os.open(root, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                for p in _listing(root):
                    m = HPC_CKPT.match(p)
                    if m and int(m[1]) <= number - KEEP:
                        (root / p).unlink(missing_ok=True)

            run.gate.write(final, commit)
        run.stop_on_failure()
        run.checkpointed(reason, run.global_step, final, size[0], time.perf_counter() - t0)
        run.restart_clock()

    def state_dict(self) -> dict[str, Any]:
        if self.run is None:
            return {}
        return {**self.run.state_dict(), "rng": self._rngs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = dict(state_dict) if state_dict else None


def _listing(root: Path) -> list[str]:
    try:
        return os.listdir(root)
    except OSError:
        return []
