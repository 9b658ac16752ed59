"""What every integration shares: one launch speaking the runtime's protocol
(:class:`hpcorch.runtime.launch.Launch`), driven by a training library's hooks.

The integration hands the library a sampler of this rank's micro-batches
(:meth:`ElasticRun.micro_batches`, laid out by :mod:`hpcorch.integrations.layout`); every
step it lays out waits in ``pending`` until the library trained it. At each optimizer step
the library's hooks call :meth:`ElasticRun.step_begin` (the LR factor of the step) and
:meth:`ElasticRun.step_end` (the step-boundary agreement of every rank: the checkpoint
signal, a periodic checkpoint, a rewritten plan; the data position, the noise scale and the
``steps`` report). What to do with the agreement (checkpoint through the library, exit 75,
a new batch) is the integration's.
"""

from __future__ import annotations

import atexit
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hpcorch.integrations.layout import Position, StepSpan, spans
from hpcorch.planner import BatchPlan, BatchPlanError, plan_batch
from hpcorch.ports import free_port
from hpcorch.protocol import ENV_GLOBAL_BATCH
from hpcorch.runtime.config import Settings, settings_or_exit
from hpcorch.runtime.dist import DistInfo, destroy_process_group
from hpcorch.runtime.gns import NoiseScale
from hpcorch.runtime.launch import Agreement, Launch
from hpcorch.runtime.lr import LrFactor
from hpcorch.runtime.metrics import process_age
from hpcorch.runtime.sampler import ElasticSampler

STATE_FORMAT = "hpcorch-integration"
STATE_VERSION = 1


def joined_group(device: torch.device, launcher: str) -> DistInfo:
    """The process group a library formed, as the runtime describes its own. A library on
    one device forms none: then a group of this one process (the launch's collectives)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        port = free_port("127.0.0.1")
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
        atexit.register(destroy_process_group)
    return DistInfo(
        launcher=launcher,
        backend=str(dist.get_backend()),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
        master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(os.environ.get("MASTER_PORT", "0") or 0),
        device=device,
        init_seconds=0.0,
    )


def settle(
    info: DistInfo,
    *,
    global_batch: int,
    max_micro_batch: int,
    lr_scaling: str,
    min_global_batch: int | None = None,
    max_global_batch: int | None = None,
) -> Settings:
    """This launch's settings (plan > environment > the script's own batch); a bad plan or
    setting ends the launch with one line and exit code 78, as the runtime does."""
    return settings_or_exit(
        info.rank,
        world_size=info.world_size,
        global_batch=global_batch,
        max_micro_batch=max_micro_batch,
        lr_scaling=lr_scaling,
        min_global_batch=min_global_batch,
        max_global_batch=max_global_batch,
        job_dir=None,
        checkpoint_signal=None,
        checkpoint_interval=None,
        metrics_interval=None,
    )


class ElasticRun(Launch):
    """One launch of a library's training under hpcorch: position, steps, LR, noise scale."""

    def __init__(
        self,
        dist_info: DistInfo,
        settings: Settings,
        *,
        framework: str,
        dataset_size: int,
        seed: int,
        shuffle: bool,
        base_batch: int,
        warmup_steps: int,
    ) -> None:
        super().__init__(dist_info, settings, fast_exit=True)
        self.framework = framework
        self.order = ElasticSampler(dataset_size, seed, shuffle)
        self.position: Position = (0, 0)
        """The data position after the last step trained: (epoch, samples of it consumed)."""
        self.global_step = 0
        self.lr = LrFactor(settings.lr_scaling, base_batch, warmup_steps)
        self.noise = NoiseScale()
        self.resumed = False
        self.pending: deque[StepSpan] = deque()
        """Steps laid out for the library and not yet trained, oldest first."""
        self.layout_plan = settings.batch
        """The split new steps are laid out at (until ``switch``)."""
        self.switch: tuple[int, BatchPlan] | None = None
        """(first step, split): a new split agreed while steps at the old one were laid out."""
        self._laid_next = 0
        self._current: StepSpan | None = None
        self._trained_plan: BatchPlan | None = None
        self.micro_done = 0
        self._t_step = time.perf_counter()
        self._hooked: set[int] = set()
        self._attached: set[int] = set()
        self.timings: dict[str, float] = {"since_start_at_init": round(process_age(), 3)}
        self.starting(0)

    # -- the data order --------------------------------------------------------------------
    @property
    def dataset_size(self) -> int:
        return self.order.dataset_size

    @property
    def samples_done(self) -> int:
        return self.position[0] * self.dataset_size + self.position[1]

    def plan_at(self, index: int) -> BatchPlan:
        if self.switch is not None and index >= self.switch[0]:
            return self.switch[1]
        return self.layout_plan

    def micro_batches(
        self, start: Position, *, total: int | None = None, epoch_end: bool = False
    ) -> Iterator[list[int]]:
        """This rank's micro-batches (dataset indices) of the steps from ``start`` (see
        :func:`hpcorch.integrations.layout.spans`), laid out lazily: a split agreed for a
        later step (``switch``) applies to the steps not laid out yet."""
        self.pending.clear()
        pos, index = start, self.global_step
        self._laid_next = index
        while True:
            plan = self.plan_at(index)
            for span in spans(
                self.order,
                pos,
                plan,
                self.rank,
                first_index=index,
                total=total,
                epoch_end=epoch_end,
            ):
                if self.plan_at(span.index) != plan:
                    break  # a switch became known: lay this step out again at the new split
                self.pending.append(span)
                self._laid_next = span.index + 1
                yield from (list(mb) for mb in span.micro)
                pos, index = span.end, span.index + 1
            else:
                return

    # -- one optimizer step ----------------------------------------------------------------
    def step_begin(self) -> StepSpan:
        """The step the library starts now: its split is the one reported; the LR factor
        of its optimizer step (ramped after a change of the global batch)."""
        span = self.pending[0]
        if (
            self._trained_plan is not None
            and span.plan.global_batch != self._trained_plan.global_batch
        ):
            self.lr.batch_changed()
        self._trained_plan = self._batch = span.plan
        if self.switch is not None and span.index >= self.switch[0]:
            self.layout_plan, self.switch = self.switch[1], None
        self.lr.update(span.plan.global_batch, self.noise.value)
        self._current, self.micro_done = span, 0
        return span

    @property
    def current(self) -> StepSpan | None:
        """The step being trained (None between steps)."""
        return self._current

    def step_end(self, *, loss: float | None, last: bool = False) -> Agreement:
        """Collective, after the step's optimizer step: the boundary agreement of every
        rank, the new position, the noise scale and the ``steps`` report. ``loss``: this
        rank's share of the step's loss (their sum over the ranks is the step's mean loss;
        None: unknown). ``last``: the last step of training (the report is written now)."""
        span = self.pending.popleft()
        self._current = None
        local_sq, global_sq = self.noise.take()
        agreed = self.agree(
            local_sq=float(local_sq) if local_sq is not None else None,
            loss=float("nan") if loss is None else loss,
        )
        if agreed.failed > 0:  # only rank 0 writes: its exit code (storage, superseded) for all
            self.abort(agreed.failed)
        seconds = time.perf_counter() - self._t_step
        full = span.size == span.plan.global_batch
        if full and global_sq is not None and self.world_size > 1:
            self.noise.update(agreed.local_sq, float(global_sq), span.local, span.size)
        self.lr.stepped()
        self.global_step, self.position = span.index + 1, span.end
        self.report_step(
            step=self.global_step,
            seconds=seconds,
            samples=span.size,
            loss=agreed.loss_sum,
            force=last or agreed.stop,
            epoch=self.position[0],
            lr_factor=self.lr.factor,
            noise_scale=self.noise.value,
            progress=self.lr.progress,
        )
        self._t_step = time.perf_counter()
        return agreed

    def restart_clock(self) -> None:
        """The next step's time starts now (after a checkpoint, a rebatch, an evaluation)."""
        self._t_step = time.perf_counter()

    def switch_at(self, new: BatchPlan) -> int:
        """Collective: take ``new`` from the first step no rank has laid out yet (a library
        that keeps its data loader while it trains); returns that step."""
        t = torch.tensor([float(self._laid_next)], dtype=torch.float64, device=self.device)
        laid = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(laid, t)  # every rank's next step; the furthest is where all switch
        at = int(max(x.item() for x in laid))
        self.switch = (at, new)
        self.rebatch(new, at)
        return at

    # -- the library's model and optimizer -------------------------------------------------
    def attach(self, model: Any, optimizer: Any) -> None:
        """Scale ``optimizer``'s LR by the factor; estimate the noise scale from ``model``'s
        gradients when it is DDP over several ranks. Once per object."""
        opt = optimizer
        while isinstance(getattr(opt, "optimizer", None), torch.optim.Optimizer):
            opt = opt.optimizer  # accelerate's wrapper: the optimizer that steps
        if opt is not None and id(opt) not in self._attached:
            self._attached.add(id(opt))
            self.lr.attach(opt)
        if (
            self.world_size > 1
            and isinstance(model, DistributedDataParallel)
            and id(model) not in self._hooked
        ):
            self._hooked.add(id(model))
            # a lambda: DDP rejects hooks whose annotations are strings (postponed evaluation)
            model.register_comm_hook(None, lambda state, bucket: self.noise.hook(state, bucket))

    # -- reports and checkpoints -----------------------------------------------------------
    def report_begin(self, model: torch.nn.Module | None, epochs: int) -> None:
        """The ``start`` line of this launch's training."""
        self.report_start(
            model=model,
            dataset_size=self.dataset_size,
            epochs=epochs,
            step=self.global_step,
            epoch=self.position[0],
            offset=self.position[1],
            resumed=self.resumed,
            lr_scaling=self.settings.lr_scaling,
            framework=self.framework,
            **self.timings,
        )
        self.restart_clock()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of hpcorch's (plain values: JSON or the library's file)."""
        b = self._trained_plan or self.batch
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "framework": self.framework,
            "job": self.settings.job_id,
            "written_at": time.time(),
            "world_size": self.world_size,
            "global_step": self.global_step,
            "epoch": self.position[0],
            "offset": self.position[1],
            "dataset_size": self.dataset_size,
            "seed": self.order.seed,
            "plan": {
                "global_batch": b.global_batch,
                "gpus": b.gpus,
                "micro_batch": b.micro_batch,
                "accum_steps": b.accum_steps,
            },
            "lr": self.lr.state_dict(),
            "gns": self.noise.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], where: str) -> None:
        """Resume from ``state`` (read from ``where``); a state of another job, format or
        dataset ends the launch with one line (exit code 78)."""
        problem = state_problem(state, self.settings.job_id, self.dataset_size)
        if problem:
            self.fail(f"{where}: {problem}")
        try:
            self.global_step = int(state["global_step"])
            self.position = (int(state["epoch"]), int(state["offset"]))
            self.order = ElasticSampler(self.dataset_size, int(state["seed"]), self.order.shuffle)
            self.lr.load_state_dict(state["lr"], state["plan"]["global_batch"] == self.global_batch)
            self.noise.load_state_dict(state["gns"])
            saved = int(state["plan"]["global_batch"])
        except (KeyError, TypeError, ValueError) as e:
            self.fail(f"{where}: hpcorch's state lacks the field {e}")
        self.resumed = True
        if self.settings.plan_path is None and not os.environ.get(ENV_GLOBAL_BATCH):
            # no plan and no submitted batch: the global batch of the launch before, not
            # the script's per-device batch times this launch's ranks
            try:
                kept = plan_batch(saved, self.world_size, self.batch.micro_batch)
            except BatchPlanError:
                return
            if kept.micro_batch <= self.batch.micro_batch:
                self.layout_plan = self._batch = kept


def state_problem(state: Any, job_id: str | None, dataset_size: int) -> str:
    """Why ``state`` cannot be resumed from ('' when it can)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        return "no hpcorch state in it"
    if state.get("version") != STATE_VERSION:
        return f"hpcorch state version {state.get('version')!r}; this hpcorch reads {STATE_VERSION}"
    owner = state.get("job")
    if job_id is not None and owner is not None and owner != job_id:
        return f"it belongs to job {owner!r}, not to {job_id!r}"
    if state.get("dataset_size") != dataset_size:
        return (
            f"it was taken on a dataset of {state.get('dataset_size')} samples, "
            f"this one has {dataset_size}"
        )
    return ""
